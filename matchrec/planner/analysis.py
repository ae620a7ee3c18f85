"""Semantic analysis of MEASURES and DEFINE expressions.

Each sqlglot expression tree is split in three kinds of parts:

* **row-local and pure** (columns of one row and constants: ``A.price * 1.05``): pushed into
  the DuckDB query that reads the input, as an extra column, so DuckDB evaluates it with its
  own semantics for every row; the matcher only looks the value up at the right row;
* **row-local with CLASSIFIER or MATCH_NUMBER** (``value || CLASSIFIER()``): evaluated per row
  in the IR of operators.expr;
* **match-level** (navigation, aggregates over matched rows, and operators combining parts of
  different rows): IR nodes evaluated against the labels of the (partial) match.

Rules checked here, each reported at the offending place: unknown variables and columns,
FINAL in DEFINE, navigation nested in the wrong order, aggregates inside navigation or other
aggregates, arguments of one navigation/aggregate referring to different variables, offsets
that are not non-negative integer literals, window functions, non-boolean DEFINE conditions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlglot
from sqlglot import exp

from matchrec.parser.translate import LAMBDA_AGGREGATES, expand_aggregates, is_trino
from matchrec.errors import ProgrammingError, positioned
from matchrec.operators import expr as ir
from matchrec.parser import hidden as H
from matchrec.parser.expressions import MR_PREFIX, node_span
from matchrec.parser.spec import Expression


class Oracle(Protocol):
    """What the analysis asks DuckDB (the engine supplies it)."""

    def type_of(self, sql: str) -> str: ...

    def constant(self, sql: str) -> tuple[Any, str]: ...

    def is_aggregate(self, name: str) -> bool: ...


class OracleError(Exception):
    """Raised by an Oracle with DuckDB's message when an expression does not bind."""


ANY = "any"  # context of a constant: combines with every row context

INT_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
             "UBIGINT", "UHUGEINT"}
FLOAT_TYPES = {"FLOAT", "DOUBLE"}
NULL_TYPE = '"NULL"'


def family(t: str) -> str:
    if t in INT_TYPES:
        return "int"
    if t in FLOAT_TYPES:
        return "float"
    if t.startswith("DECIMAL"):
        return "decimal"
    if t == NULL_TYPE:
        return "null"
    return t


def comparable(a: str, b: str) -> bool:
    fa, fb = family(a), family(b)
    if "null" in (fa, fb):
        return True
    numeric = {"int", "float", "decimal"}
    if fa in numeric and fb in numeric:
        return True
    return fa == fb and fa in ("VARCHAR", "BOOLEAN", "DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE",
                               "TIME", "INTERVAL", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S")


def arithmetic_ok(a: str, b: str, op: str) -> bool:
    fa, fb = family(a), family(b)
    if op == "div":
        return fa in ("int", "float") and fb in ("int", "float")
    pair = {fa, fb}
    return pair <= {"int", "float"} or pair <= {"int", "decimal"}


@dataclass
class Part:
    """Result of analysing one sqlglot subtree."""
    kind: str  # "pure" | "row" | "value"
    ctx: Any  # ANY, None (universal) or frozenset of label ids
    tree: exp.Expression | None = None  # pure: the subtree, columns resolved, qualifiers removed
    node: ir.Node | None = None  # row/value: the IR
    ttree: str = ""  # DuckDB SQL with the type of this part (columns replaced by typed NULLs)
    type: str = ""
    has_nav: bool = False
    has_agg: bool = False
    source: exp.Expression | None = field(default=None, repr=False)


@dataclass
class Scope:
    """What expressions may refer to."""
    labels: list[str]  # primary pattern variables, by id
    subsets: dict[str, frozenset[int]]
    columns: list[tuple[str, str]]  # input (name, DuckDB type)
    oracle: Oracle
    pushed: list[tuple[str, str]] = field(default_factory=list)  # (DuckDB SQL, type) of pushed columns
    _pushed_index: dict[str, int] = field(default_factory=dict)
    dialect: str = "duckdb"  # the query's: a few operators are typed as that dialect types them

    def variable(self, name: str) -> frozenset[int] | None:
        if name in self.labels:
            return frozenset([self.labels.index(name)])
        if name in self.subsets:
            return self.subsets[name]
        return None

    def column(self, name: str, quoted: bool) -> tuple[int, str, str] | None:
        for i, (col, typ) in enumerate(self.columns):
            if col == name:
                return i, col, typ
        if not quoted:
            hits = [(i, col, typ) for i, (col, typ) in enumerate(self.columns) if col.lower() == name.lower()]
            if len(hits) == 1:
                return hits[0]
        return None

    def push(self, sql: str, typ: str) -> int:
        """Index (after the input columns) of a pushed row expression."""
        if sql not in self._pushed_index:
            self._pushed_index[sql] = len(self.pushed)
            self.pushed.append((sql, typ))
        return len(self.columns) + self._pushed_index[sql]


_MARK = H.TYPE_MARK


class _Typer:
    """Builds DuckDB SQL text whose type is the type of a part: children become typed NULLs."""

    def __init__(self):
        self.subs: dict[str, str] = {}

    def marker(self, sql_type_expr: str) -> exp.Expression:
        name = f"{_MARK}{len(self.subs)}"
        self.subs[name] = sql_type_expr
        return exp.column(name)

    def render(self, tree: exp.Expression) -> str:
        sql = tree.sql("duckdb")
        # substitute longest names first so __mr_t_1 does not clobber __mr_t_10
        for name in sorted(self.subs, key=len, reverse=True):
            sql = sql.replace(name, "(" + self.subs[name] + ")")
        return sql


class ExpressionAnalyzer:
    def __init__(self, scope: Scope, expression: Expression, mode: str, defined: int | None = None):
        self.scope = scope
        self.expression = expression
        self.origin = expression.origin
        self.source = None
        self.mode = mode  # "define" | "measure"
        self.defined = defined

    # -------------------------------------------------------------- errors
    def error(self, message: str, node: exp.Expression) -> ProgrammingError:
        start, end = node_span(node, self.origin)
        return positioned(ProgrammingError, message, self._source(), start, end)

    def _source(self) -> str:
        return self.source

    # -------------------------------------------------------------- entry point
    def analyze_root(self, source: str) -> tuple[ir.Node, str]:
        """The IR of the whole expression (evaluated at the current row) and its DuckDB type."""
        self.source = source
        try:
            part = self.analyze(self.expression.tree, running=True)
            node = self.materialize(part, self.expression.tree)
            return node, self._type(part)
        except sqlglot.errors.SqlglotError:
            # sqlglot cannot write the expression as DuckDB SQL (``DATE()`` without its argument)
            raise self.error("Cannot evaluate this expression: a function is missing an argument or "
                             "is not available in DuckDB", self.expression.tree) from None

    # -------------------------------------------------------------- typing
    def type_of(self, ttree: str, node: exp.Expression) -> str:
        try:
            return self.scope.oracle.type_of(ttree)
        except OracleError as err:
            raise self.error(f"Cannot evaluate this expression: {err}", node) from None

    def typed_null(self, typ: str) -> str:
        return f"CAST(NULL AS {typ})"

    # -------------------------------------------------------------- dispatch
    def analyze(self, node: exp.Expression, running: bool) -> Part:
        if isinstance(node, exp.Paren):
            part = self.analyze(node.this, running)
            if part.kind == "pure":  # keep the parentheses: the tree is rendered as SQL again
                part.tree = exp.Paren(this=part.tree)
            return part
        if isinstance(node, exp.Window):
            raise self.error("Window functions are not allowed in MEASURES or DEFINE", node)
        if isinstance(node, exp.Column):
            return self.column(node)
        if isinstance(node, exp.Anonymous) and str(node.this).lower().startswith(MR_PREFIX):
            return self.mr_function(node, running)
        if self.is_aggregate(node):
            return self.aggregate(node, running, None)
        if isinstance(node, (exp.Subquery, exp.Exists, exp.Query, exp.Literal, exp.Boolean, exp.Null)):
            return self.constant_part(node)
        if isinstance(node, exp.Star):
            raise self.error("'*' is only allowed in COUNT(*) or COUNT(var.*)", node)
        return self.generic(node, running)

    def is_aggregate(self, node: exp.Expression) -> bool:
        if isinstance(node, exp.Filter):
            return self.is_aggregate(node.this)
        if isinstance(node, (exp.IgnoreNulls, exp.RespectNulls)):
            return self.is_aggregate(node.this)
        if isinstance(node, exp.AggFunc):
            return True
        if isinstance(node, exp.Anonymous):
            name = str(node.this).lower()
            return name in LAMBDA_AGGREGATES or self.scope.oracle.is_aggregate(name)
        return False

    # -------------------------------------------------------------- leaves
    def column(self, node: exp.Column) -> Part:
        if isinstance(node.this, exp.Star):
            raise self.error("'var.*' is only allowed in COUNT(var.*)", node)
        if node.args.get("db") or node.args.get("catalog"):
            raise self.error(f"Invalid column reference {node.sql()!r}: use var.column or column", node)
        ctx = None
        qualifier = node.args.get("table")
        if qualifier is not None:
            name = qualifier.name if qualifier.args.get("quoted") else qualifier.name.upper()
            ctx = self.scope.variable(name)
            if ctx is None:
                raise self.error(f"{qualifier.name!r} is not a pattern variable or SUBSET "
                                 f"(known: {', '.join(self.scope.labels + list(self.scope.subsets))})", qualifier)
        ident = node.this
        found = self.scope.column(ident.name, bool(ident.args.get("quoted")))
        if found is None:
            names = ", ".join(c for c, _ in self.scope.columns)
            raise self.error(f"Column {ident.name!r} does not exist in the input of MATCH_RECOGNIZE "
                             f"(columns: {names})", ident)
        _, name, typ = found
        tree = exp.column(exp.to_identifier(name, quoted=True))
        return Part("pure", ctx, tree=tree, ttree=self.typed_null(typ), type=typ, source=node)

    def constant_part(self, node: exp.Expression) -> Part:
        sql = node.sql("duckdb")
        return Part("pure", ANY, tree=node.copy(), ttree=sql, type="", source=node)

    # -------------------------------------------------------------- row pattern functions
    def mr_function(self, node: exp.Anonymous, running: bool) -> Part:
        name = str(node.this).lower()[len(MR_PREFIX):]
        args = list(node.expressions)
        if name in ("running", "final"):
            inner = args[0]
            if name == "final" and self.mode == "define":
                raise self.error("FINAL semantics is not allowed in DEFINE", node)
            ok = (isinstance(inner, exp.Anonymous) and str(inner.this).lower()[len(MR_PREFIX):]
                  in ("first", "last", "prev", "next")) or self.is_aggregate(inner)
            if not ok:
                raise self.error(f"{name.upper()} can only be applied to FIRST, LAST, PREV, NEXT or an aggregate",
                                 node)
            if self.is_aggregate(inner):
                return self.aggregate(inner, name == "running", node)
            return self.mr_function(inner, name == "running")
        if name == "match_number":
            if args:
                raise self.error("MATCH_NUMBER() takes no arguments", node)
            return Part("row", ANY, node=ir.MatchNumber(), ttree="CAST(NULL AS BIGINT)", type="BIGINT",
                        source=node)
        if name == "classifier":
            ctx = None
            if len(args) > 1:
                raise self.error("CLASSIFIER takes at most one pattern variable", node)
            if args:
                arg = args[0]
                if not isinstance(arg, exp.Column) or arg.args.get("table") is not None:
                    raise self.error("The argument of CLASSIFIER must be a pattern variable", arg)
                var = arg.this.name if arg.this.args.get("quoted") else arg.this.name.upper()
                ctx = self.scope.variable(var)
                if ctx is None:
                    raise self.error(f"{arg.this.name!r} is not a pattern variable or SUBSET", arg)
            return Part("row", ctx, node=ir.Classifier(), ttree="CAST(NULL AS VARCHAR)", type="VARCHAR",
                        source=node)
        if name in ("first", "last"):
            return self.logical_nav(node, name == "last", running, physical=0)
        if name in ("prev", "next"):
            if not args or len(args) > 2:
                raise self.error(f"{name.upper()} takes an expression and an optional offset", node)
            offset = self.offset(args[1]) if len(args) == 2 else 1
            physical = -offset if name == "prev" else offset
            target = args[0]
            while isinstance(target, exp.Paren):
                target = target.this
            inner_name = str(target.this).lower() if isinstance(target, exp.Anonymous) else ""
            inner_running = running
            if inner_name in (MR_PREFIX + "running", MR_PREFIX + "final"):
                if inner_name.endswith("final") and self.mode == "define":
                    raise self.error("FINAL semantics is not allowed in DEFINE", target)
                inner_running = inner_name.endswith("running")
                target = target.expressions[0]
                inner_name = str(target.this).lower() if isinstance(target, exp.Anonymous) else ""
            if inner_name in (MR_PREFIX + "first", MR_PREFIX + "last"):
                return self.logical_nav(target, inner_name.endswith("last"), inner_running, physical)
            if inner_name in (MR_PREFIX + "prev", MR_PREFIX + "next"):
                raise self.error("PREV/NEXT cannot be nested inside PREV/NEXT", target)
            return self.nav_over(args[0], ir.Nav(None, True, 0, running, physical), node, physical_only=True)
        raise self.error(f"Unknown row pattern function {name}", node)  # pragma: no cover

    def offset(self, node: exp.Expression) -> int:
        value = node
        negative = False
        if isinstance(value, exp.Neg):
            negative, value = True, value.this
        if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
            raise self.error("Navigation offset must be a non-negative integer literal", node)
        if negative and int(value.this) != 0:
            raise self.error("Navigation offset must not be negative", node)
        return int(value.this)

    def logical_nav(self, node: exp.Anonymous, last: bool, running: bool, physical: int) -> Part:
        args = list(node.expressions)
        fname = "LAST" if last else "FIRST"
        if not args or len(args) > 2:
            raise self.error(f"{fname} takes an expression and an optional offset", node)
        offset = self.offset(args[1]) if len(args) == 2 else 0
        return self.nav_over(args[0], ir.Nav(None, last, offset, running, physical), node)

    def nav_over(self, arg: exp.Expression, nav: ir.Nav, node: exp.Expression, physical_only=False) -> Part:
        part = self.analyze(arg, nav.running)
        if part.kind == "value" and not part.has_nav and not part.has_agg:
            raise self.error("All column references in a navigation function must refer to the same pattern "
                             "variable", arg)
        if part.kind == "value":
            what = "aggregate" if part.has_agg and not part.has_nav else "navigation function"
            if physical_only and part.has_nav and not part.has_agg:
                raise self.error("Only FIRST or LAST may be nested inside PREV/NEXT, and only directly", arg)
            raise self.error(f"A {what} cannot be nested inside a navigation function", arg)
        if part.ctx == ANY and not self._mentions_classifier(part):
            raise self.error("A navigation function needs a column reference or CLASSIFIER() in its argument", node)
        labels = None if part.ctx == ANY else part.ctx
        nav = ir.Nav(labels, nav.last, nav.logical_offset, nav.running, nav.physical_offset)
        return Part("value", None, node=ir.At(nav, self.row_node(part)), ttree=part.ttree, type=self._type(part),
                    has_nav=True, source=node)

    @staticmethod
    def _mentions_classifier(part: Part) -> bool:
        def walk(n):
            if isinstance(n, ir.Classifier):
                return True
            return any(walk(c) for c in getattr(n, "args", ()) or ()) or (
                isinstance(n, ir.At) and walk(n.expr))
        return part.kind == "row" and walk(part.node)

    # -------------------------------------------------------------- aggregates
    def aggregate(self, node: exp.Expression, running: bool, wrapper: exp.Expression | None) -> Part:
        if self.mode == "define" and not running:
            raise self.error("FINAL semantics is not allowed in DEFINE", wrapper or node)
        filter_cond = None
        agg = node
        if isinstance(agg, exp.Filter):
            filter_cond = agg.expression.this if isinstance(agg.expression, exp.Where) else agg.expression
            agg = agg.this
        core = agg.this if isinstance(agg, (exp.IgnoreNulls, exp.RespectNulls)) else agg
        # count(*), count(), count(A.*)
        if isinstance(core, exp.Count):
            star = core.this
            if star is None or isinstance(star, exp.Star):
                return self.count_star(None, running, filter_cond, node)
            if isinstance(star, exp.Column) and isinstance(star.this, exp.Star):
                qualifier = star.args.get("table")
                name = qualifier.name if qualifier.args.get("quoted") else qualifier.name.upper()
                ctx = self.scope.variable(name)
                if ctx is None:
                    raise self.error(f"{qualifier.name!r} is not a pattern variable or SUBSET", qualifier)
                return self.count_star(ctx, running, filter_cond, node)
        # arguments: every maximal subtree below DISTINCT/ORDER wrappers
        slots: list[tuple[exp.Expression, Part]] = []
        ctx = ANY

        def collect(n: exp.Expression) -> None:
            nonlocal ctx
            for key, child in list(n.args.items()):
                for c in (child if isinstance(child, list) else [child]):
                    if not isinstance(c, exp.Expression) or isinstance(c, (exp.DataType, exp.Var, exp.Identifier)):
                        continue
                    if isinstance(c, (exp.Distinct, exp.Order, exp.Ordered)):
                        collect(c)
                        continue
                    part = self.analyze(c, running)
                    if part.kind == "value" and not part.has_nav and not part.has_agg:
                        raise self.error("All arguments of an aggregate must refer to the same pattern variable", c)
                    if part.kind == "value":
                        what = "navigation function" if part.has_nav else "aggregate"
                        raise self.error(f"A {what} cannot be used inside an aggregate", c)
                    ctx = self.merge(ctx, part.ctx, c, "All arguments of an aggregate must refer to the same "
                                                       "pattern variable")
                    slots.append((c, part))

        collect(core)
        filter_part = None
        if filter_cond is not None:
            filter_part = self.analyze(filter_cond, running)
            if filter_part.kind == "value":
                raise self.error("FILTER of an aggregate must be a condition on the aggregated row", filter_cond)
            ctx = self.merge(ctx, filter_part.ctx, filter_cond, "All arguments of an aggregate must refer to the "
                                                                "same pattern variable")
        labels = None if ctx == ANY else ctx
        # typing: the aggregate over typed NULLs
        typer = _Typer()
        copy = node.copy() if isinstance(node, exp.Filter) else agg.copy()
        mapping = {}
        for original, part in slots:
            mapping[id(original)] = part
        self._replace_slots(copy, node if isinstance(node, exp.Filter) else agg, slots, filter_cond, filter_part,
                            lambda part, _i: typer.marker(part.ttree if part.kind != "pure" or part.ctx != ANY
                                                          else part.ttree))
        ttree = typer.render(expand_aggregates(copy))
        typ = self.type_of(ttree, node)
        native = self.native_aggregate(core, slots, filter_cond)
        if native is not None:
            func, arg_part, distinct, extra = native
            filt = self.row_node(filter_part) if filter_part is not None else None
            agg_node = ir.Agg(func, labels, (self.row_node(arg_part),), running, distinct, False, filt, None, extra)
        else:
            agg_node = self.fallback_aggregate(node, agg, slots, filter_cond, filter_part, labels, running)
        return Part("value", None, node=agg_node, ttree=ttree, type=typ, has_agg=True, source=node)

    def count_star(self, ctx, running: bool, filter_cond, node) -> Part:
        filt = None
        if filter_cond is not None:
            fpart = self.analyze(filter_cond, running)
            if fpart.kind == "value":
                raise self.error("FILTER of an aggregate must be a condition on the aggregated row", filter_cond)
            if ctx is None and fpart.ctx != ANY:
                ctx = fpart.ctx
            filt = self.row_node(fpart)
        return Part("value", None, node=ir.Agg("count", ctx, (), running, False, True, filt),
                    ttree="CAST(NULL AS BIGINT)", type="BIGINT", has_agg=True, source=node)

    _NATIVE = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Count: "count",
               exp.LogicalAnd: "bool_and", exp.LogicalOr: "bool_or", exp.ArrayAgg: "list", exp.AnyValue: "any_value"}

    def native_aggregate(self, core, slots, filter_cond):
        """(func, argument part, distinct, extra) when Python can compute the aggregate exactly."""
        func = self._NATIVE.get(type(core))
        if isinstance(core, exp.GroupConcat):
            sep = core.args.get("separator")
            if len(slots) == 2 and sep is not None and slots[1][1].ctx == ANY and slots[1][0] is sep:
                value, _ = self.fold(slots[1][1], sep)
                if isinstance(value, str) and family(slots[0][1].type or "VARCHAR") == "VARCHAR":
                    return "string_agg", slots[0][1], isinstance(core.this, exp.Distinct), (value,)
            return None
        if func is None or len(slots) != 1:
            return None
        if isinstance(core, (exp.Min, exp.Max)) and (core.expressions or core.args.get("count")):
            return None
        this = core.this
        distinct = isinstance(this, exp.Distinct)
        if isinstance(this, exp.Order) or (distinct and len(this.expressions) != 1):
            return None
        part = slots[0][1]
        fam = family(part.type) if part.type else ""
        if func in ("sum", "avg") and fam not in ("int", "float", "decimal"):
            return None
        if func == "avg" and fam == "decimal":
            return None
        if func in ("min", "max") and fam not in ("int", "float", "decimal", "VARCHAR", "DATE", "TIMESTAMP",
                                                   "BOOLEAN"):
            return None
        if func in ("bool_and", "bool_or") and fam != "BOOLEAN":
            return None
        return func, part, distinct, ()

    def fallback_aggregate(self, node, agg, slots, filter_cond, filter_part, labels, running) -> ir.Agg:
        """Aggregate computed by DuckDB over the argument values of the matched rows."""
        typer = _Typer()
        args: list[ir.Node] = []
        types: list[str] = []
        cols: list[str] = []
        base = node if isinstance(node, exp.Filter) else agg

        def slot_marker(part: Part, i: int) -> exp.Expression:
            if part.kind == "pure" and part.ctx == ANY:
                return part.tree.copy()
            k = len(args)
            args.append(self.row_node(part))
            types.append(self._type(part) + "[]")
            cols.append(f"UNNEST({H.arg(k)}) AS {H.unnested(k)}")
            return exp.column(H.unnested(k))

        copy = base.copy()
        self._replace_slots(copy, base, slots, filter_cond, filter_part, slot_marker)
        select = typer.render(expand_aggregates(copy))
        if not cols:  # only constant arguments: one row per matched row still matters (count(1))
            args.append(ir.Const(1))
            types.append("INTEGER[]")
            cols.append(f"UNNEST({H.arg(0)}) AS {H.unnested(0)}")
        template = f"SELECT {select} FROM (SELECT {', '.join(cols)} FROM {H.ARGS})"
        return ir.Agg("fallback", labels, tuple(args), running, False, False, None, template, (), tuple(types))

    def _replace_slots(self, copy, original, slots, filter_cond, filter_part, make):
        """Replace, in ``copy`` (a deep copy of ``original``), every argument subtree by ``make(part)``."""
        pairs = list(zip(original.walk(), copy.walk()))
        targets = {id(o): p for o, p in slots}
        if filter_cond is not None:
            targets[id(filter_cond)] = filter_part
        index = 0
        for o, c in pairs:
            if id(o) in targets and c.parent is not None:
                c.replace(make(targets[id(o)], index))
                index += 1

    # -------------------------------------------------------------- generic operators
    def generic(self, node: exp.Expression, running: bool) -> Part:
        operands = [(c, self.analyze(c, running)) for c in _operands(node)]
        node = self._typed_division(node, operands)
        node = self._date_difference(node, operands)
        parts = [p for _, p in operands]
        ctx = ANY
        for c, p in operands:
            ctx = self.merge(ctx, p.ctx, c, None)
            if ctx is _MIXED:
                break
        ttree = self._rebuild_sql(node, operands, lambda p, t: p.tree.copy() if _is_literal(p) else t.marker(p.ttree))
        if ctx is not _MIXED and all(p.kind == "pure" for p in parts):
            tree = _rebuild(node, {id(c): p.tree for c, p in operands})
            return Part("pure", ctx, tree=tree, ttree=ttree, type="", source=node)
        kind = "row" if ctx is not _MIXED and all(p.kind in ("pure", "row") for p in parts) else "value"
        typ = self.type_of(ttree, node)
        return Part(kind, ctx if kind == "row" else None, node=self.combine(node, operands, kind), ttree=ttree,
                    type=typ, has_nav=any(p.has_nav for p in parts), has_agg=any(p.has_agg for p in parts),
                    source=node)

    def _typed_division(self, node, operands):
        """Integer division of dialects like Trino (``typed`` Div) becomes DuckDB's ``//`` on integers."""
        if isinstance(node, exp.Div) and node.args.get("typed") and len(operands) == 2:
            if all(family(self._type(p)) == "int" for _, p in operands):
                return exp.IntDiv(this=node.this, expression=node.expression)
        return node

    def _date_difference(self, node, operands):
        """In Trino ``date - date`` is an INTERVAL DAY TO SECOND, not DuckDB's number of days."""
        if isinstance(node, exp.Sub) and len(operands) == 2 and is_trino(self.scope.dialect) \
                and all(self._type(p) == "DATE" for _, p in operands):
            days = exp.Cast(this=node, to=exp.DataType.build("INTEGER"))
            return exp.Anonymous(this="TO_DAYS", expressions=[days])
        return node

    def _rebuild_sql(self, node, operands, make) -> str:
        typer = _Typer()
        return typer.render(_rebuild(node, {id(c): make(p, typer) for c, p in operands}))

    def combine(self, node: exp.Expression, operands, kind: str) -> ir.Node:
        """IR for an operator over analysed operands: a Python operator when exact, else DuckDB."""
        types = [self._type(p) for _, p in operands]
        args = [self.materialize(p, c) if kind == "value" else self.row_node(p) for c, p in operands]
        n = len(args)
        if isinstance(node, (exp.And, exp.Or)) and n == 2 and all(family(t) in ("BOOLEAN", "null") for t in types):
            return ir.Op("and" if isinstance(node, exp.And) else "or", tuple(args))
        if isinstance(node, exp.Not) and n == 1 and family(types[0]) in ("BOOLEAN", "null"):
            return ir.Op("not", tuple(args))
        if type(node) in _COMPARISONS and n == 2 and comparable(*types):
            return ir.Op(_COMPARISONS[type(node)], tuple(args))
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and n == 2:
            return ir.Op("is_null", (args[0],))
        if type(node) in _ARITHMETIC and n == 2 and not node.args.get("typed") \
                and arithmetic_ok(types[0], types[1], _ARITHMETIC[type(node)]):
            return ir.Op(_ARITHMETIC[type(node)], tuple(args))
        if isinstance(node, exp.Neg) and n == 1 and family(types[0]) in ("int", "float", "decimal"):
            return ir.Op("neg", tuple(args))
        if isinstance(node, exp.DPipe) and n == 2 and all(family(t) in ("VARCHAR", "null") for t in types):
            return ir.Op("concat", tuple(args))
        if isinstance(node, exp.Coalesce) and len(set(types)) == 1:
            return ir.Op("coalesce", tuple(args))
        if isinstance(node, exp.In) and not node.args.get("query") and n == 1 + len(node.expressions) \
                and all(comparable(types[0], t) for t in types[1:]):
            return ir.Op("in", tuple(args))
        if isinstance(node, exp.Between) and n == 3 and all(comparable(types[0], t) for t in types):
            return ir.Op("between", tuple(args))
        if isinstance(node, exp.If) and n in (2, 3):
            return ir.Op("case", tuple(args) if n == 3 else tuple(args) + (ir.Const(None),))
        if isinstance(node, exp.Case) and node.this is None:
            # operands are cond1, value1, cond2, value2, ..., [default]
            return ir.Op("case", tuple(args))
        return self.fallback(node, operands, kind)

    def fallback(self, node, operands, kind) -> ir.Node:
        args: list[ir.Node] = []
        types: list[str] = []

        def make(part: Part, typer: _Typer):
            if part.kind == "pure" and part.ctx == ANY:
                return part.tree.copy()
            args.append(self.materialize(part, part.source) if kind == "value" else self.row_node(part))
            types.append(self._type(part))
            return exp.column(H.arg(len(args) - 1))

        template = "SELECT " + self._rebuild_sql(node, operands, make) + " FROM " + H.ARGS
        return ir.Fallback(template, tuple(args), tuple(types))

    # -------------------------------------------------------------- helpers
    def merge(self, a, b, node, message):
        if a == ANY:
            return b
        if b == ANY or a == b:
            return a
        if message is None:
            return _MIXED
        raise self.error(message, node)

    def _type(self, part: Part) -> str:
        if not part.type:
            part.type = self.type_of(part.ttree, part.source if part.source is not None else self.expression.tree)
        return part.type

    def fold(self, part: Part, node) -> tuple[Any, str]:
        sql = part.tree.sql("duckdb")
        try:
            return self.scope.oracle.constant(sql)
        except OracleError as err:
            raise self.error(f"Cannot evaluate this expression: {err}", node) from None

    def row_node(self, part: Part) -> ir.Node:
        """IR evaluating a row-local part at the row-local position."""
        if part.kind in ("row", "value"):
            return part.node
        if part.ctx == ANY:
            try:
                value, typ = self.fold(part, part.source)
            except ProgrammingError:
                # e.g. 0 / 0 in a branch that is never taken: fail only if it is evaluated
                return ir.Fallback("SELECT " + part.tree.sql("duckdb"), (), ())
            part.type = part.type or typ
            return ir.Const(value, typ)
        typ = self._type(part)
        return ir.Col(self.scope.push(part.tree.sql("duckdb"), typ))

    def materialize(self, part: Part, node) -> ir.Node:
        """IR of a part at match level: row-local parts are read at their variable's last row."""
        if part.kind == "value":
            return part.node
        if part.kind == "pure" and part.ctx == ANY:
            return self.row_node(part)
        labels = None if part.ctx == ANY else part.ctx
        return ir.At(ir.Nav(labels), self.row_node(part))


_MIXED = object()


def _is_literal(part: Part) -> bool:
    return part.kind == "pure" and isinstance(part.tree, (exp.Literal, exp.Boolean, exp.Null))

_COMPARISONS = {exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge",
                exp.NullSafeEQ: "not_distinct", exp.NullSafeNEQ: "distinct"}
_ARITHMETIC = {exp.Add: "add", exp.Sub: "sub", exp.Mul: "mul", exp.Div: "div"}


_NOT_OPERANDS = (exp.DataType, exp.Var, exp.Identifier, exp.DataTypeParam)


def _operands(node: exp.Expression) -> list[exp.Expression]:
    """The sub-expressions an operator computes on, in order (CASE branches flattened)."""
    if isinstance(node, exp.Case):
        out = [node.this] if node.this is not None else []
        for branch in node.args.get("ifs") or []:
            out += [branch.this, branch.args.get("true")]
        if node.args.get("default") is not None:
            out.append(node.args["default"])
        return out
    out = []
    for child in node.args.values():
        for c in (child if isinstance(child, list) else [child]):
            if isinstance(c, (exp.PropertyEQ, exp.Kwarg)):  # struct fields, named arguments
                c = c.expression
            if isinstance(c, exp.Expression) and not isinstance(c, _NOT_OPERANDS):
                out.append(c)
    return out


def _rebuild(node: exp.Expression, replacements: dict) -> exp.Expression:
    """A copy of ``node`` in which the subtrees whose id is in ``replacements`` are replaced."""
    copy = node.copy()
    pairs = list(zip(node.walk(), copy.walk()))
    if id(node) in replacements:
        return replacements[id(node)].copy() if isinstance(replacements[id(node)], exp.Expression) \
            else replacements[id(node)]
    for original, twin in pairs:
        if id(original) in replacements:
            new = replacements[id(original)]
            twin.replace(new.copy() if new.parent is not None else new)
    return copy


def history_dependent(node: ir.Node, defined: int) -> bool:
    """Whether a DEFINE condition of label ``defined`` can read the labels of earlier rows."""
    if isinstance(node, (ir.Const, ir.Col, ir.MatchNumber)):
        return False
    if isinstance(node, ir.Classifier):
        return True
    if isinstance(node, ir.At):
        nav = node.nav
        if nav.labels is None:
            target_free = True
        else:
            target_free = nav.last and nav.logical_offset == 0 and defined in nav.labels
        return not target_free or history_dependent(node.expr, defined)
    if isinstance(node, ir.Agg):
        if node.labels is not None:
            return True
        inner = list(node.args) + ([node.filter] if node.filter is not None else [])
        return any(history_dependent(a, defined) for a in inner)
    if isinstance(node, (ir.Op, ir.Fallback)):
        return any(history_dependent(a, defined) for a in node.args)
    return True  # pragma: no cover - unknown nodes are treated conservatively
