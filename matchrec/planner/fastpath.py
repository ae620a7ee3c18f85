"""Decide how much of a MATCH_RECOGNIZE the compiled matcher (operators.vm) can run.

Each DEFINE condition is split into its top-level AND conjuncts, and each conjunct is
proven to be one of:

* **row**: reads only the current row and rows at fixed physical offsets from it (PREV/NEXT)
  - DuckDB evaluates it for every input row, over chunks of the sorted input in which the
  engine has shifted the columns PREV/NEXT read, into one bit of a per-row label mask;
* **register**: compares an expression of the current row with an expression of the last row
  of another variable (``M.district = B.district``, ``B.price > A.price * 1.05``), on numeric,
  temporal, DECIMAL (as scaled integers) or string values (as ranks) - the compiled matcher
  keeps that row per thread;
* **register program**: a boolean combination (comparisons, AND/OR/NOT, IS NULL) of values
  read at the current row, at a register's row, at the first row of a variable set (FIRST,
  kept per thread as the first row it labelled with the set) or of running aggregates
  (count, sum, avg, min, max over a variable, a subset or the whole match, kept per thread as
  a count and an accumulator, updated when the thread takes a row), combined by arithmetic
  (``+ - * /``, unary minus) where the reference computes it with Python's operators: integers
  and DECIMALs exactly (DECIMALs as scaled integers), floats as floats;
  MATCH_NUMBER() is a leaf the compiled matcher fills with the number of the match being tried,
  CLASSIFIER() of the current row compared with a string literal is the defined variable's
  name, a constant, and PREV(CLASSIFIER()) = 'X' compares the label of the thread's last row;
  bool_and/bool_or (every/any) are running aggregates too (min and max of the booleans);
  FIRST(V.x, n) and LAST(V.x, n) with logical offsets up to MAX_DEPTH keep, per thread, the
  set's row count and (n+1)-th row, or its last n+1 rows; PREV(CLASSIFIER(), n) keeps the labels
  of the thread's last n rows, and NEXT(CLASSIFIER(), n) in a DEFINE is NULL (rows after the
  current one have no label yet);
* **residual**: anything else (DISTINCT or FILTER aggregates, array_agg/string_agg/listagg,
  CLASSIFIER of other rows than these, typed division, DECIMAL mixed with floats ...).

With no residual conjunct the compiled matcher alone decides every match. Otherwise it runs
on the row and register parts only - a relaxed pattern that accepts a superset of the label
sequences - to find the start rows where a match is possible, and the reference matcher
decides there. Either way the result is the reference matcher's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from matchrec.operators import vm
from matchrec.parser import hidden as H
from matchrec.parser.expressions import MR_PREFIX
from matchrec.parser.spec import MatchSpec
from matchrec.planner.plan import Plan

MAX_LABELS = 62
_COMPARE = {exp.EQ: vm.CMP_EQ, exp.NEQ: vm.CMP_NE, exp.LT: vm.CMP_LT, exp.LTE: vm.CMP_LE, exp.GT: vm.CMP_GT,
            exp.GTE: vm.CMP_GE}
_ARITH = {exp.Add: vm.P_ADD, exp.Sub: vm.P_SUB, exp.Mul: vm.P_MUL, exp.Div: vm.P_DIV}
_MIRROR = {vm.CMP_EQ: vm.CMP_EQ, vm.CMP_NE: vm.CMP_NE, vm.CMP_LT: vm.CMP_GT, vm.CMP_LE: vm.CMP_GE,
           vm.CMP_GT: vm.CMP_LT, vm.CMP_GE: vm.CMP_LE}


def offset_arg(args: list, default: int) -> int | None:
    """The offset of a navigation call's arguments ``(expr[, k])``: ``default`` without one, k when
    it is a non-negative integer literal, None for anything else (another count of arguments, an
    expression as offset): the compiled matcher takes only literal offsets."""
    if len(args) == 1:
        return default
    if len(args) == 2 and isinstance(args[1], exp.Literal) and not args[1].is_string and args[1].this.isdigit():
        return int(args[1].this)
    return None


@dataclass
class RegisterCompare:
    label: int
    register: int  # index into FastPlan.registers
    op: int
    current_sql: str  # DuckDB SQL over the input columns, read at the current row
    other_sql: str  # read at the register's row (+ offset)
    offset: int = 0
    kind: str = "int"  # how both sides are compared: "int" (also times), "float", "decimal:<scale>" or "string"


AGG_FUNCS = ("count", "sum", "avg", "min", "max", "bool_and", "bool_or")
MAX_DEPTH = 16  # the largest logical offset (FIRST/LAST(V.x, n), PREV(CLASSIFIER(), n)) a thread keeps rows for


@dataclass
class AggSpec:
    """A running aggregate a register program reads, kept per thread."""
    func: str  # one of AGG_FUNCS; count(*) and count(A.*) are "count" over a constant argument; bool_and
    # (every) and bool_or run as min and max of the booleans as 0/1
    labels: frozenset[int] | None  # None: every row of the match
    text: str = ""


@dataclass
class RegisterLeaf:
    """A value a register program reads: DuckDB SQL over input columns, computed for every row
    and read at the current row (``register`` -1) or at a register's row plus ``offset``.

    ``source`` "first": ``register`` numbers FastPlan.firsts, the first row of a variable set
    (the current row when the set holds the current variable and has no row yet). ``source``
    "agg": the value is the running aggregate FastPlan.aggregates[``agg``] and ``sql`` its
    argument, computed for every row. ``source`` "match_number": MATCH_NUMBER(), the number the
    match gets if it succeeds (``sql`` is a BIGINT placeholder). ``source`` "prev_label":
    PREV(CLASSIFIER(), ``offset``), the label id of the thread's row that many rows back (NULL
    before the match's first row). ``source`` "nth": ``register`` numbers FastPlan.windows, a
    logical offset (FIRST(V.x, n) or LAST(V.x, n)) whose row the thread keeps, ``offset`` a
    physical one from there (PREV/NEXT around it)."""
    sql: str
    register: int
    offset: int = 0
    kind: str = "int"  # "int" (also times, booleans), "float" or "decimal:<scale>", from the column's type
    source: str = "row"  # "row" (current or LAST register), "first", "agg", "match_number", "prev_label", "nth"
    agg: int = -1


@dataclass
class RegisterProgram:
    """A condition mixing the current row and register rows, as a stack program over leaves:
    ("leaf", i), ("cmp", op), ("arith", op), ("neg",), ("isnull",), ("not",), ("and",), ("or",).
    Whether the arithmetic is exact for the leaves' types is decided once they are known
    (engine.fast.program_kinds)."""
    label: int
    code: list[tuple]
    leaves: list[RegisterLeaf]
    text: str = ""


@dataclass
class FastPlan:
    row_sql: list[str | None]  # per label: DuckDB condition of its row conjuncts (None: no row conjunct)
    # ... split by where DuckDB evaluates them: in the read query (no PREV/NEXT), or over chunks
    read_sql: list[str | None] = field(default_factory=list)
    chunk_sql: list[str | None] = field(default_factory=list)
    shifts: dict = field(default_factory=dict)  # (input column, row offset) -> chunk column name
    row_columns: set = field(default_factory=set)  # input columns the chunk conditions read
    registers: list[frozenset[int]] = field(default_factory=list)
    firsts: list[frozenset[int]] = field(default_factory=list)  # sets whose first row a thread keeps
    aggregates: list[AggSpec] = field(default_factory=list)  # running aggregates a thread keeps
    # logical offsets a thread keeps rows for: ("first", set, n) for FIRST(V.x, n), ("last", set, n) for LAST(V.x, n)
    windows: list[tuple[str, frozenset[int], int]] = field(default_factory=list)
    compares: list[RegisterCompare] = field(default_factory=list)
    programs: list[RegisterProgram] = field(default_factory=list)
    residual: list[str] = field(default_factory=list)  # why the relaxed pattern is needed, per conjunct
    prev_label: int = 0  # a thread keeps the labels of its last this many rows (PREV(CLASSIFIER(), n))

    @property
    def exact(self) -> bool:
        return not self.residual

    @property
    def may_hand_back(self) -> bool:
        """Whether a chunk may go to the reference matcher after all: an exact value (running sum,
        arithmetic, DECIMAL) can leave the range the compiled matcher keeps it in."""
        return bool(self.aggregates) or any(c.kind.startswith("decimal") for c in self.compares) or any(
            step[0] in ("arith", "neg") for p in self.programs for step in p.code) or any(
            leaf.kind.startswith("decimal") for p in self.programs for leaf in p.leaves)

    def describe(self, labels: list[str]) -> list[str]:
        lines = ["matcher: compiled (numba Pike VM)" + ("" if self.exact else
                 " as a pre-filter of start rows, then the reference matcher")]
        for i, sql in enumerate(self.row_sql):
            if sql is not None:
                lines.append(f"  {labels[i]}: per-row condition in DuckDB: {sql}")
        for c in self.compares:
            regs = "|".join(labels[i] for i in sorted(self.registers[c.register]))
            lines.append(f"  {labels[c.label]}: compare current {c.current_sql} with {c.other_sql} at last "
                         f"{regs}{f' {c.offset:+d}' if c.offset else ''}")
        for prog in self.programs:
            lines.append(f"  {labels[prog.label]}: register program ({len(prog.code)} steps) for {prog.text}")
        for vs in self.firsts:
            lines.append(f"  per-thread first row of {'|'.join(labels[i] for i in sorted(vs))} (FIRST)")
        for agg in self.aggregates:
            lines.append(f"  per-thread running aggregate {agg.text}, updated as the thread takes a row")
        for kind, vs, n in self.windows:
            what = f"the first {n + 1} rows" if kind == "first" else f"the last {n + 1} rows"
            lines.append(f"  per-thread {what} of {'|'.join(labels[i] for i in sorted(vs))} "
                         f"({kind.upper()} with logical offset {n})")
        if self.prev_label:
            lines.append(f"  per-thread labels of the last {self.prev_label} row(s) (PREV(CLASSIFIER(), n))")
        for why in self.residual:
            lines.append(f"  residual (reference matcher): {why}")
        return lines


def _strip(tree: exp.Expression) -> exp.Expression:
    """Copy of ``tree`` with column qualifiers removed (the variable was already resolved)."""
    copy = tree.copy()
    for col in list(copy.find_all(exp.Column)):
        if col.args.get("table") is not None:
            col.set("table", None)
    return copy


def _children(tree: exp.Expression) -> list[exp.Expression]:
    out = []
    for child in tree.args.values():
        for c in (child if isinstance(child, list) else [child]):
            if isinstance(c, exp.Expression) and not isinstance(c, (exp.DataType, exp.Var, exp.Identifier)):
                out.append(c)
    return out


def _strip_navigation(tree: exp.Expression) -> exp.Expression:
    """Copy of ``tree`` with FIRST/LAST/PREV/NEXT calls replaced by their argument."""
    copy = exp.Paren(this=tree.copy())
    names = (MR_PREFIX + "last", MR_PREFIX + "prev", MR_PREFIX + "next", MR_PREFIX + "first")
    while True:  # PREV(FIRST(A.v)): the inner call is only reached once the outer one is gone
        calls = [n for n in copy.walk() if isinstance(n, exp.Anonymous) and str(n.this).lower() in names]
        if not calls:
            return copy
        calls[0].replace(calls[0].expressions[0])


def _conjuncts(tree: exp.Expression) -> list[exp.Expression]:
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if isinstance(tree, exp.And):
        return _conjuncts(tree.this) + _conjuncts(tree.expression)
    return [tree]


class _Classifier:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.labels = plan.labels
        self.subsets = plan.subsets
        self.read: set[str] = set()  # input columns read by accepted row conditions
        self.firsts: list[frozenset[int]] = []  # FastPlan.firsts, as register programs add them
        self.aggs: list[AggSpec] = []  # FastPlan.aggregates
        self.windows: list = []  # FastPlan.windows

    def classifier_literals(self, tree: exp.Expression, label: int) -> exp.Expression:
        """``tree`` with CLASSIFIER() (or CLASSIFIER(V), V holding the current variable) that reads
        the current row and is compared with a string literal replaced by the variable's name: in a
        DEFINE the current row carries the variable being defined. Under navigation or in an
        aggregate it reads other rows and stays as it is."""
        targets = []
        for node in tree.walk():
            if self.mr_name(node) != "classifier":
                continue
            args = node.expressions
            if args and not (isinstance(args[0], exp.Column) and args[0].args.get("table") is None
                             and label in (self.var_set(args[0].this) or ())):
                continue
            parent, child = node.parent, node
            while isinstance(parent, exp.Paren):
                parent, child = parent.parent, parent
            if isinstance(parent, tuple(_COMPARE)):
                other = parent.expression if child is parent.this else parent.this
                if not (isinstance(other, exp.Literal) and other.is_string):
                    continue
            elif isinstance(parent, exp.In) and child is parent.this and not parent.args.get("query"):
                if not all(isinstance(e, exp.Literal) and e.is_string for e in parent.expressions):
                    continue
            else:
                continue
            up, inside = parent, False
            while up is not None:
                if isinstance(up, (exp.AggFunc, exp.Window)) or self.mr_name(up) is not None:
                    inside = True
                    break
                up = up.parent
            if not inside:
                targets.append(node)
        if not targets:
            return tree
        copy = tree.copy()
        pairs = dict(zip(map(id, tree.walk()), copy.walk()))
        for node in targets:
            pairs[id(node)].replace(exp.Literal.string(self.labels[label]))
        return copy

    def classifier_offset(self, node: exp.Expression) -> int | None:
        """k when ``node`` is PREV(CLASSIFIER(), k) (the label of the row k before the current one,
        in a match the thread's k-th last row), -k for NEXT(CLASSIFIER(), k) (NULL in a DEFINE: no
        later row has a label yet); None otherwise."""
        name = self.mr_name(node)
        if name not in ("prev", "next") or not node.expressions:
            return None
        args = node.expressions
        k = offset_arg(args, 1)
        if k is None:
            return None
        inner = args[0]
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if self.mr_name(inner) != "classifier" or inner.expressions or k < 1 or k > MAX_DEPTH:
            return None
        return k if name == "prev" else -k

    def var_set(self, qualifier: exp.Identifier | None) -> frozenset[int] | None:
        if qualifier is None:
            return None
        name = qualifier.name if qualifier.args.get("quoted") else qualifier.name.upper()
        if name in self.labels:
            return frozenset([self.labels.index(name)])
        return self.subsets.get(name)

    @staticmethod
    def mr_name(node: exp.Expression) -> str | None:
        if isinstance(node, exp.Anonymous) and str(node.this).lower().startswith(MR_PREFIX):
            return str(node.this).lower()[len(MR_PREFIX):]
        return None

    def has_mr_or_agg(self, tree: exp.Expression) -> bool:
        for node in tree.walk():
            if self.mr_name(node) is not None or isinstance(node, (exp.AggFunc, exp.Window)):
                return True
        return False

    def current_only(self, tree: exp.Expression, label: int) -> bool:
        """Every column reads the current row (unqualified, or a variable set holding ``label``)."""
        for col in tree.find_all(exp.Column):
            if isinstance(col.this, exp.Star):
                return False
            vs = self.var_set(col.args.get("table"))
            if vs is not None and label not in vs:
                return False
        return True

    def row_sql(self, tree: exp.Expression, label: int, shifts: dict) -> str | None:
        """DuckDB SQL of a conjunct that reads the current row and fixed offsets from it, else None.

        The SQL runs over a chunk of the sorted input: a column ``c`` read ``k`` rows away
        (PREV/NEXT) becomes the column ``shifts[(c, k)]``, which the engine fills with the
        value ``k`` rows away in the same partition, NULL beyond it - exactly what navigation
        outside the partition reads.
        """
        if any(isinstance(n, (exp.Subquery, exp.Exists, exp.Query)) for n in tree.walk()):
            return None  # evaluated against chunks, which subqueries cannot see through
        tree = tree.copy()
        for node in list(tree.walk()):
            name = self.mr_name(node)
            if name is None:
                if isinstance(node, (exp.AggFunc, exp.Window)):
                    return None
                continue
            if name not in ("prev", "next"):
                return None
            args = node.expressions
            inner = args[0]
            if self.has_mr_or_agg(inner) or not self.current_only(inner, label):
                return None
            k = offset_arg(args, 1)
            if k is None:
                return None
            offset = -k if name == "prev" else k
            shifted = exp.Paren(this=_strip(inner))  # a parent, so that even a bare column can be replaced
            for col in list(shifted.find_all(exp.Column)):
                key = (self.column_name(col), offset)
                if key[0] is None:
                    return None
                shifts.setdefault(key, H.shifted(len(shifts)))
                self.read.add(key[0])
                col.replace(exp.column(shifts[key]))
            node.replace(shifted)
        if not self.current_only(tree, label):
            return None
        for col in list(tree.find_all(exp.Column)):
            if not col.name.startswith(H.SHIFT_PREFIX):
                name = self.column_name(col)
                if name is None:
                    return None
                self.read.add(name)
                col.replace(exp.column(exp.to_identifier(name, quoted=True)))
        return tree.sql("duckdb")

    def column_name(self, col: exp.Column) -> str | None:
        ident = col.this
        for name, _ in self.plan.input_columns:
            if name == ident.name:
                return name
        if not ident.args.get("quoted"):
            hits = [n for n, _ in self.plan.input_columns if n.lower() == ident.name.lower()]
            if len(hits) == 1:
                return hits[0]
        return None

    def register_compare(self, tree: exp.Expression, label: int):
        """(op, current side, other side, variable set, offset) of ``cur OP LAST(V).x``, else None."""
        while isinstance(tree, exp.Paren):
            tree = tree.this
        op = _COMPARE.get(type(tree))
        if op is None:
            return None
        left, right = tree.this, tree.expression
        for a, b, o in ((left, right, op), (right, left, _MIRROR[op])):
            if self.has_mr_or_agg(a) or not self.current_only(a, label) or not list(a.find_all(exp.Column)):
                continue
            other = self.other_side(b, label)
            if other is not None:
                sql, vs, off = other
                return o, _strip(a).sql("duckdb"), sql, vs, off
        return None

    # ---------------------------------------------------------------- register programs
    def context(self, tree: exp.Expression, label: int):
        """Where a sub-expression reads: "const", "current", ("reg", set, logical, physical),
        or None when it mixes rows (or reads rows no register holds)."""
        if isinstance(tree, exp.Paren):
            return self.context(tree.this, label)
        if isinstance(tree, (exp.Literal, exp.Boolean, exp.Null)):
            return "const"
        if isinstance(tree, exp.Column):
            if isinstance(tree.this, exp.Star):
                return None
            vs = self.var_set(tree.args.get("table"))
            return "current" if vs is None or label in vs else ("reg", vs, 0, 0)
        if isinstance(tree, exp.AggFunc):
            return self.aggregate(tree)
        if isinstance(tree, (exp.Window, exp.Subquery, exp.Exists, exp.Query)):
            return None
        name = self.mr_name(tree)
        if name is not None:
            args = tree.expressions
            if name == "first":
                # the first row of a set: kept per thread once it labels a row of the set; the
                # (n+1)-th with a logical offset n
                n = offset_arg(args, 0)
                if n is None or self.has_mr_or_agg(args[0]) or n > MAX_DEPTH:
                    return None
                sets = {self.var_set(c.args.get("table")) for c in args[0].find_all(exp.Column)}
                if len(sets) != 1 or any(isinstance(c.this, exp.Star) for c in args[0].find_all(exp.Column)):
                    return None
                vs = sets.pop()
                vs = frozenset(range(len(self.labels))) if vs is None else vs
                return ("first", vs, 0, 0) if n == 0 else ("nth_first", vs, n, 0)
            if name in ("last", "prev", "next"):
                k = offset_arg(args, 0 if name == "last" else 1)
                if k is None:
                    return None
                if name == "last":
                    # a register holds the last row of its set before the current row is labelled:
                    # LAST(V.x) for a set without the current variable, LAST(V.x, 1) for one with it
                    if self.has_mr_or_agg(args[0]):
                        return None
                    sets = {self.var_set(c.args.get("table")) for c in args[0].find_all(exp.Column)}
                    if len(sets) != 1 or any(isinstance(c.this, exp.Star) for c in args[0].find_all(exp.Column)):
                        return None
                    vs = sets.pop()
                    vs = frozenset(range(len(self.labels))) if vs is None else vs
                    if k == (1 if label in vs else 0):
                        return ("reg", vs, k, 0)
                    return ("last_n", vs, k, 0) if k <= MAX_DEPTH else None
                inner = self.context(args[0], label)
                if isinstance(inner, tuple) and inner[0] != "agg":
                    return (inner[0], inner[1], inner[2], inner[3] + (-k if name == "prev" else k))
                return None
            return None
        contexts = {self.context(c, label) for c in _children(tree)}
        contexts.discard("const")
        if None in contexts or len(contexts) > 1 or any(isinstance(c, tuple) and c[0] == "agg" for c in contexts):
            return None  # an aggregate is a leaf of its own: no arithmetic on it
        return contexts.pop() if contexts else "const"

    def aggregate(self, tree: exp.AggFunc):
        """("agg", func, variable set, argument SQL) of a running aggregate a thread can keep, else None."""
        func = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
                exp.LogicalAnd: "bool_and", exp.LogicalOr: "bool_or"}.get(type(tree))
        arg = tree.this
        if func is None or arg is None or tree.expressions or any(
                isinstance(n, (exp.Distinct, exp.Filter, exp.Window, exp.Subquery, exp.Exists, exp.Query))
                for n in tree.walk()):
            return None
        if isinstance(arg, exp.Star):
            if func != "count":
                return None
            return ("agg", func, None, "1")
        if isinstance(arg, exp.Column) and isinstance(arg.this, exp.Star):
            vs = self.var_set(arg.args.get("table"))
            if func != "count" or vs is None:
                return None
            return ("agg", func, vs, "1")
        if self.has_mr_or_agg(arg):
            return None
        columns = list(arg.find_all(exp.Column))
        if any(isinstance(c.this, exp.Star) for c in columns):
            return None
        sets = {self.var_set(c.args.get("table")) for c in columns}
        if len(sets) > 1:
            return None
        vs = sets.pop() if sets else None
        sql = _strip(arg).sql("duckdb")
        if func == "count":  # only whether the argument is NULL matters, whatever its type
            sql = f"CASE WHEN ({sql}) IS NULL THEN NULL ELSE 1 END"
        return ("agg", func, vs, sql)

    def register_program(self, tree: exp.Expression, label: int, registers: list) -> RegisterProgram | None:
        code: list[tuple] = []
        leaves: list[RegisterLeaf] = []
        uses_register = False

        def leaf(node, ctx) -> bool:
            nonlocal uses_register
            sql_tree = _strip_navigation(node)
            if isinstance(ctx, tuple) and ctx[0] == "agg":
                _, func, vs, sql = ctx
                spec = AggSpec(func, vs, node.sql("duckdb"))
                aggs.append(spec)
                leaves.append(RegisterLeaf(sql, -1, 0, source="agg", agg=len(aggs) - 1))
                uses_register = True
            elif isinstance(ctx, tuple) and ctx[0] in ("nth_first", "last_n"):
                window = ("first" if ctx[0] == "nth_first" else "last", ctx[1], ctx[2])
                if window not in windows:
                    windows.append(window)
                leaves.append(RegisterLeaf(_strip(sql_tree).sql("duckdb"), windows.index(window), ctx[3], source="nth"))
                uses_register = True
            elif isinstance(ctx, tuple) and ctx[0] == "first":
                vs = ctx[1]
                if vs not in firsts:
                    firsts.append(vs)
                leaves.append(RegisterLeaf(_strip(sql_tree).sql("duckdb"), firsts.index(vs), ctx[3], source="first"))
                uses_register = True
            elif isinstance(ctx, tuple):
                vs = ctx[1]
                if vs not in registers:
                    registers.append(vs)
                leaves.append(RegisterLeaf(_strip(sql_tree).sql("duckdb"), registers.index(vs), ctx[3]))
                uses_register = True
            else:
                if not self.current_only(sql_tree, label):
                    return False
                leaves.append(RegisterLeaf(_strip(sql_tree).sql("duckdb"), -1, 0))
            code.append(("leaf", len(leaves) - 1))
            return True

        def emit(node) -> bool:
            nonlocal uses_register
            while isinstance(node, exp.Paren):
                node = node.this
            if isinstance(node, (exp.EQ, exp.NEQ)):
                sides = [node.this, node.expression]
                for nav, lit in (sides, sides[::-1]):
                    while isinstance(nav, exp.Paren):
                        nav = nav.this
                    k = self.classifier_offset(nav)
                    if k is not None and isinstance(lit, exp.Literal) and lit.is_string:
                        ident = self.labels.index(lit.this) if lit.this in self.labels else -2
                        if k > 0:
                            leaves.append(RegisterLeaf("CAST(0 AS BIGINT)", -1, k, source="prev_label"))
                        else:  # NEXT(CLASSIFIER()): no label yet, NULL
                            leaves.append(RegisterLeaf("CAST(NULL AS BIGINT)", -1, 0))
                        leaves.append(RegisterLeaf(f"CAST({ident} AS BIGINT)", -1, 0))
                        code.extend([("leaf", len(leaves) - 2), ("leaf", len(leaves) - 1),
                                     ("cmp", _COMPARE[type(node)])])
                        uses_register = True
                        return True
            if self.mr_name(node) == "match_number":
                leaves.append(RegisterLeaf("CAST(0 AS BIGINT)", -1, 0, source="match_number"))
                code.append(("leaf", len(leaves) - 1))
                uses_register = True
                return True
            ctx = self.context(node, label)
            if ctx is not None:
                return leaf(node, ctx)
            if isinstance(node, (exp.And, exp.Or)):
                ok = emit(node.this) and emit(node.expression)
                code.append(("and",) if isinstance(node, exp.And) else ("or",))
                return ok
            if isinstance(node, exp.Not):
                ok = emit(node.this)
                code.append(("not",))
                return ok
            if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
                ok = emit(node.this)
                code.append(("isnull",))
                return ok
            if type(node) in _COMPARE:
                ok = emit(node.this) and emit(node.expression)
                code.append(("cmp", _COMPARE[type(node)]))
                return ok
            if type(node) in _ARITH and not node.args.get("typed"):
                # typed division (Trino's integer division) is DuckDB's to compute, not Python's
                ok = emit(node.this) and emit(node.expression)
                code.append(("arith", _ARITH[type(node)]))
                return ok
            if isinstance(node, exp.Neg):
                ok = emit(node.this)
                code.append(("neg",))
                return ok
            return False

        firsts, aggs, windows = self.firsts, self.aggs, self.windows
        before = list(registers), list(firsts), list(aggs), list(windows)
        if not emit(tree) or not uses_register:
            registers[:], firsts[:], aggs[:], windows[:] = before
            return None
        return RegisterProgram(label, code, leaves, tree.sql("duckdb"))

    def other_side(self, tree: exp.Expression, label: int):
        """(SQL, variable set, physical offset) when ``tree`` reads the row a register holds."""
        offset = 0
        name = self.mr_name(tree)
        if name in ("prev", "next"):
            args = tree.expressions
            k = offset_arg(args, 1)
            if k is None:
                return None
            offset = -k if name == "prev" else k
            tree = args[0]
            name = self.mr_name(tree)
        logical = 0
        if name == "last":
            args = tree.expressions
            logical = offset_arg(args, 0)
            if logical is None:
                return None
            tree = args[0]
        elif name is not None:
            return None
        if self.has_mr_or_agg(tree):
            return None
        sets = {self.var_set(c.args.get("table")) for c in tree.find_all(exp.Column)}
        if len(sets) != 1:
            return None
        vs = sets.pop()
        if vs is None:
            return None
        # A register holds the last row of its set before the current row is labelled: that is
        # LAST(V.x) for a set without the current variable, and LAST(V.x, 1) for one with it.
        if logical != (1 if label in vs else 0):
            return None
        return _strip(tree).sql("duckdb"), vs, offset


def fast_plan(plan: Plan) -> FastPlan | None:
    """What the compiled matcher can take over, or None when it cannot run this clause."""
    spec: MatchSpec = plan.spec
    if len(plan.labels) > MAX_LABELS:
        return None
    cls = _Classifier(plan)
    fp = FastPlan(row_sql=[None] * len(plan.labels), read_sql=[None] * len(plan.labels),
                  chunk_sql=[None] * len(plan.labels))
    registers: list[frozenset[int]] = []
    chunk_columns: set[str] = set()
    for d in spec.definitions:
        label = plan.labels.index(d.variable)
        in_read: list[str] = []
        in_chunk: list[str] = []
        for conjunct in _conjuncts(d.expression.tree):
            conjunct = cls.classifier_literals(conjunct, label)
            read_before, shifts_before = set(cls.read), dict(fp.shifts)
            cls.read = set()
            sql = cls.row_sql(conjunct, label, fp.shifts)
            if sql is not None:
                if H.SHIFT_PREFIX in sql:  # reads other rows (PREV/NEXT): evaluated over chunks
                    in_chunk.append(f"({sql})")
                    chunk_columns |= cls.read
                else:
                    in_read.append(f"({sql})")
                cls.read = read_before
                continue
            cls.read, fp.shifts = read_before, shifts_before  # a rejected conjunct reads nothing
            reg = cls.register_compare(conjunct, label)
            if reg is not None:
                op, cur_sql, other_sql, vs, off = reg
                if vs not in registers:
                    registers.append(vs)
                fp.compares.append(RegisterCompare(label, registers.index(vs), op, cur_sql, other_sql, off))
                continue
            prog = cls.register_program(conjunct, label, registers)
            if prog is not None:
                fp.programs.append(prog)
                continue
            fp.residual.append(f"{d.variable}: {conjunct.sql('duckdb')}")
        if in_read:
            fp.read_sql[label] = " AND ".join(in_read)
        if in_chunk:
            fp.chunk_sql[label] = " AND ".join(in_chunk)
        if in_read or in_chunk:
            fp.row_sql[label] = " AND ".join(in_read + in_chunk)
    if fp.residual:
        # the relaxed pattern tries every row as a start, where no match number is known yet
        for prog in [p for p in fp.programs if any(leaf.source == "match_number" for leaf in p.leaves)]:
            fp.programs.remove(prog)
            fp.residual.append(f"{plan.labels[prog.label]}: {prog.text} (MATCH_NUMBER beside a residual condition)")
    fp.registers = registers
    fp.firsts, fp.aggregates, fp.windows = cls.firsts, cls.aggs, cls.windows
    fp.prev_label = max((leaf.offset for p in fp.programs for leaf in p.leaves if leaf.source == "prev_label"),
                        default=0)
    fp.row_columns = chunk_columns
    return fp
