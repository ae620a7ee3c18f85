"""Parse SASE-style CER statements (``PATTERN ... FROM ... RETURN ...``) into a CerQuery.

This module owns the syntax of the CER language (grammar in ``sase.lark``) and what the text
alone decides: the pattern, the selection strategy, the window as written, the RETURN form, and
the split of WHERE into predicates over one variable (filters, evaluated by DuckDB) and
predicates over several variables, over aggregates of a Kleene variable or over consecutive
events of its iteration, ``b[i].price > b[i-1].price`` (conditions, evaluated on bindings).
What it builds is the tree of ``parser.cer_tree``, whose names are importable from here too.
Columns are resolved later against the source's schema by ``planner.cer``.

It also parses the simple form of MATCH_RECOGNIZE that carries ``STRATEGY ...`` after PATTERN
into the same query object, so both run through one engine.
"""
from __future__ import annotations

import datetime
import decimal
import functools
import importlib.resources
import math
import re

import lark
from lark import Token, Tree

from matchrec.errors import NotSupportedError, ProgrammingError, check_parameter, positioned
from matchrec.parser.cer_tree import (AGGREGATES, STRATEGIES, STRATEGY_NAMES, And, Between, Binary, Call, Cast,
                                      CerQuery, Col, Element, Expr, InList, IsNull, Lit, Logic, Node, Or, Projection,
                                      Seq, Unary, Var, Within, children, has_aggregate, iterated, reads_previous,
                                      variables, walk)

# the tree's names are the parser's vocabulary: ``sase.Col``, ``sase.CerQuery``, ... as before
__all__ = ["AGGREGATES", "MAX_BOUND", "STRATEGIES", "STRATEGY_NAMES", "STRATEGY_WORDS", "And", "Between", "Binary",
           "Call", "Cast", "CerQuery", "Col", "Element", "Expr", "InList", "IsNull", "Lit", "Logic", "Node", "Or",
           "Projection", "Seq", "Unary", "Var", "Within", "children", "describe", "has_aggregate",
           "has_strategy_clause", "is_cer_statement", "parse", "variables", "walk"]

STRATEGY_WORDS = {"strictcontiguity": "strict", "skiptillnextmatch": "next", "skiptillanymatch": "any"}
MAX_BOUND = 100_000
_NAVIGATION = ("prev", "next", "classifier", "match_number", "running", "final")

_CER_START = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(?:EXPLAIN\s+(?:ANALYZE\s+)?)?PATTERN\b(?!\s*\()",
                        re.I | re.S)
_MR_STRATEGY = re.compile(r"\bSTRATEGY\s+(strict[-_]contiguity|skip[-_]till[-_](?:next|any)[-_]match)\b", re.I)
_MR_FORM = ("MATCH_RECOGNIZE with STRATEGY supports the form SELECT * FROM <table> MATCH_RECOGNIZE ("
            "[PARTITION BY <column>] ORDER BY <column> [MEASURES <expr> AS <name>, ...] [ONE ROW PER MATCH] "
            "PATTERN (<variables, each optionally with + or {n,m}>) [WITHIN <n> [unit]] "
            "STRATEGY <strict-contiguity | skip-till-next-match | skip-till-any-match> "
            "[DEFINE <variable> AS <condition>, ...])")


def is_cer_statement(sql: str) -> bool:
    """A SASE-style statement: ``[EXPLAIN [ANALYZE]] PATTERN ...`` (not MATCH_RECOGNIZE's PATTERN ( ... ))."""
    return _CER_START.match(sql) is not None


def has_strategy_clause(sql: str) -> bool:
    """A MATCH_RECOGNIZE statement that asks for a CER selection strategy."""
    return "match_recognize" in sql.lower() and _MR_STRATEGY.search(sql) is not None


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    grammar = importlib.resources.files("matchrec.parser").joinpath("sase.lark").read_text()
    from matchrec.parser.grammar_cache import cache_file
    return lark.Lark(grammar, start="statement", parser="lalr", lexer="contextual", propagate_positions=True,
                     maybe_placeholders=False, cache=cache_file("sase.lark"))


_NAMES = {"NAME": "a name", "QNAME": "a quoted name", "STRING": "a string", "INT": "an integer",
          "NUMBER": "a number", "COMP_OP": "a comparison", "ADD_OP": "'+'", "MUL_OP": "'*'",
          "STRATEGY_NAME": "a strategy", "OP_NAME": "SEQ/AND/OR", "UNIT": "a time unit", "LPAR": "'('",
          "RPAR": "')'", "COMMA": "','", "$END": "end of statement", "NEG": "'~'", "PLUS": "'+'",
          "LBRACE": "'{'", "RBRACE": "'}'", "DOT": "'.'", "STAR": "'*'", "SEMICOLON": "';'",
          "COUNT_STAR": "COUNT(*)", "MINUS": "'-'", "LSQB": "'['", "RSQB": "']'"}


def _expected(expected) -> str:
    names = set()
    for term in expected:
        if term.startswith("__ANON"):
            continue
        names.add(_NAMES.get(term, term.lstrip("_").upper()))
    names = sorted(names)
    if not names:
        return ""
    if len(names) > 10:
        names = names[:10] + ["..."]
    return "; expected " + ", ".join(names)


def parse(text: str, parameters=None) -> CerQuery:
    """Parse a SASE-style statement or a MATCH_RECOGNIZE with STRATEGY into a CerQuery, with
    ``parameters`` (a sequence for ``?`` and ``$1``, a mapping for ``$name``) bound to its
    placeholders (see ``_Builder.bind``)."""
    mr = has_strategy_clause(text) and not is_cer_statement(text)
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedToken as err:
        tok = err.token
        if tok.type == "$END":
            at, end, what = len(text.rstrip()), None, "Unexpected end of statement"
        else:
            at, end, what = tok.start_pos or 0, (tok.start_pos or 0) + max(1, len(str(tok))), f"Unexpected {str(tok)!r}"
        if mr:
            raise positioned(NotSupportedError, f"{_MR_FORM}; {what[0].lower() + what[1:]}", text, at, end) from None
        raise positioned(ProgrammingError, what + _expected(err.expected), text, at, end) from None
    except lark.exceptions.UnexpectedCharacters as err:
        cls = NotSupportedError if mr else ProgrammingError
        prefix = _MR_FORM + "; u" if mr else "U"
        raise positioned(cls, f"{prefix}nexpected character {text[err.pos_in_stream]!r}", text,
                         err.pos_in_stream) from None
    except lark.exceptions.UnexpectedEOF:
        raise positioned(ProgrammingError, "Unexpected end of statement", text, len(text)) from None
    return _Builder(text, parameters).build(tree)


def _number(text: str) -> int | float:
    """A window length as written: integers exactly (a float would round 9007199254740993)."""
    text = text.strip()
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    value = float(text)
    return int(value) if math.isfinite(value) and value == int(value) and abs(value) < 2 ** 53 else value


def _span(node) -> tuple[int, int]:
    if isinstance(node, Token):
        return (node.start_pos, node.end_pos)
    return (node.meta.start_pos, node.meta.end_pos)


def _name(tok: Token) -> str:
    text = str(tok)
    if text.startswith('"'):
        return text[1:-1].replace('""', '"')
    if text.startswith("'"):
        return text[1:-1].replace("''", "'")
    return text


_PARAMETER_TYPES = (type(None), bool, int, float, decimal.Decimal, str, datetime.date, datetime.time)


class _Builder:
    def __init__(self, text: str, parameters=None):
        self.text = text
        self.parameters = parameters
        self.bound: dict[int, object] = {}  # start of a placeholder -> its value
        self.kleene: set[str] = set()
        self.negated: set[str] = set()
        self.declared: dict[str, Element] = {}
        self.mr_define_var: str | None = None  # inside DEFINE v: bare names are columns of v
        self.mr = False

    def error(self, message: str, node, cls=ProgrammingError):
        start, end = node if isinstance(node, tuple) else _span(node)
        return positioned(cls, message, self.text, start, end)

    def build(self, tree: Tree) -> CerQuery:
        self.bind(tree)
        explain = None
        kids = tree.children
        if isinstance(kids[0], Tree) and kids[0].data == "explain":
            explain = "analyze" if len(kids[0].children) > 1 else "explain"
            kids = kids[1:]
        body = kids[0]
        q = self.sase(body) if body.data == "sase_query" else self.match_recognize(body)
        q.explain = explain
        return q

    # ------------------------------------------------------------ parameters
    def bind(self, tree: Tree) -> None:
        """Give every placeholder its value, as the statements with MATCH_RECOGNIZE do: ``?`` takes
        the next value of a sequence (all of them must be used), ``$1`` the first, ``$name`` the
        value of a mapping. A bound value is what the literal written in its place would be: it
        joins the expression tree as a value, never as text the grammar reads."""
        marks = sorted((t for t in tree.scan_values(lambda v: isinstance(v, Token) and v.type == "PARAM")),
                       key=lambda t: t.start_pos)
        params = self.parameters
        if not marks:
            if params and not isinstance(params, dict):
                raise ProgrammingError(f"The query has 0 '?' placeholders but {len(params)} parameters were given")
            return
        if params is None:
            raise self.error("The statement has parameter placeholders but no parameters were given", marks[0])
        named = isinstance(params, dict)
        positional = 0
        for tok in marks:
            text = str(tok)
            if text == "?":
                if named:
                    raise self.error("The query uses '?' placeholders but parameters were given as a mapping", tok)
                if positional >= len(params):
                    raise self.error(f"Not enough parameters: the query needs more than {len(params)}", tok)
                value = params[positional]
                positional += 1
            else:
                name = text[1:]
                if name.isdigit() and not named:
                    if not 0 < int(name) <= len(params):
                        raise self.error(f"Parameter {text} is not given", tok)
                    value = params[int(name) - 1]
                elif named and name in params:
                    value = params[name]
                else:
                    raise self.error(f"Parameter {text} is not given", tok)
            if not isinstance(value, _PARAMETER_TYPES):
                raise self.error(f"Cannot use a parameter of type {type(value).__name__} in a CER statement; use "
                                 "None, bool, int, float, Decimal, str, date, time or datetime", tok)
            check_parameter(value, f"Parameter {text}")  # the DB-API checks too; parse() may be called alone
            self.bound[tok.start_pos] = value
        if not named and positional and positional != len(params):
            raise ProgrammingError(f"The query has {positional} '?' placeholders but {len(params)} parameters "
                                   "were given")

    # ------------------------------------------------------------ SASE
    def sase(self, tree: Tree) -> CerQuery:
        root = self.node(tree.children[1])
        if not any(not e.negated for e in self.declared.values()):
            raise self.error("A pattern needs at least one element that is not negated", tree.children[1])
        seen: dict[str, Tree] = {}
        for clause in tree.children[2:]:
            if clause.data in seen:
                word = clause.data.replace("_clause", "").upper().replace("_", " ")
                raise self.error(f"{word} is given twice", clause)
            seen[clause.data] = clause
        if "from_clause" not in seen:
            raise positioned(ProgrammingError, "A PATTERN statement needs FROM <table>", self.text,
                             len(self.text.rstrip().rstrip(";").rstrip()))
        src = seen["from_clause"].children[0]
        q = CerQuery(self.text, root, dict(self.declared), self.source(src), _span(src))
        if "type_clause" in seen:
            q.type_column = self.column(seen["type_clause"].children[0])
        if "partition_clause" in seen:
            q.partition_column = self.column(seen["partition_clause"].children[0])
        if "order_clause" in seen:
            q.key_column = self.column(seen["order_clause"].children[0])
        if "use_clause" in seen:
            q.strategy = self.strategy(seen["use_clause"].children[0])
        if "where_clause" in seen:
            self.classify(q, self.expr(seen["where_clause"].children[0]))
        if "within_clause" in seen:
            q.within = self.within(seen["within_clause"].children[0])
        if "return_clause" in seen:
            self.returns(q, seen["return_clause"].children[0])
        return q

    def source(self, tree: Tree) -> str:
        return ".".join(str(t) for t in tree.children)

    def column(self, tree: Tree) -> tuple[str, tuple[int, int]]:
        return _name(tree.children[0]), _span(tree)

    def strategy(self, tok: Token) -> str:
        return STRATEGY_WORDS[re.sub(r"[-_]", "", str(tok)).lower()]

    def node(self, tree: Tree):
        if tree.data == "operator":
            op, *items = tree.children
            nodes = tuple(self.node(i) for i in items)
            return {"SEQ": Seq, "AND": And, "OR": Or}[str(op).upper()](nodes)
        return self.element(tree)

    def element(self, tree: Tree) -> Element:
        kids = list(tree.children)
        negated = isinstance(kids[0], Token) and kids[0].type == "NEG"
        if negated:
            kids = kids[1:]
        type_tok = kids[0].children[0]
        var_tok = kids[-1]
        kleene = None
        if len(kids) == 3:
            kleene = self.bounds(kids[1].children[0] if kids[1].children else None, kids[1])
            if negated:
                raise self.error("A negated element cannot be a Kleene closure", kids[1])
        type_name = _name(type_tok)
        return self.declare(Element(type_name, str(var_tok), kleene, negated), var_tok)

    def bounds(self, tree: Tree | None, where) -> tuple[int, int | None]:
        if tree is None:
            return (1, None)
        ints = [t for t in tree.children if isinstance(t, Token) and t.type == "INT"]
        lo = int(ints[0])
        hi = lo if tree.data == "bounds_exact" else (int(ints[1]) if len(ints) > 1 else None)
        if lo < 1:
            raise self.error("A Kleene closure takes at least one event: the lower bound must be 1 or more", tree)
        if hi is not None and hi < lo:
            raise self.error(f"Kleene bounds {{{lo},{hi}}}: the upper bound is below the lower bound", tree)
        if lo > MAX_BOUND or (hi is not None and hi > MAX_BOUND):
            raise self.error(f"Kleene bounds above {MAX_BOUND} are not supported", tree)
        return (lo, hi)

    def declare(self, e: Element, tok: Token) -> Element:
        if e.var in self.declared:
            raise self.error(f"Variable {e.var} is bound twice in the pattern", tok)
        self.declared[e.var] = e
        if e.kleene is not None:
            self.kleene.add(e.var)
        if e.negated:
            self.negated.add(e.var)
        return e

    def within(self, tree: Tree) -> Within:
        if tree.data == "within_number":
            amount = _number(str(tree.children[0]))
        elif tree.data == "within_param":
            amount = self.bound[tree.children[0].start_pos]
            if isinstance(amount, bool) or not isinstance(amount, (int, float, decimal.Decimal)):
                raise self.error(f"A window length must be a number, not {type(amount).__name__}", tree)
            amount = amount if isinstance(amount, int) else _number(str(amount))
        else:
            raw = _name(tree.children[0]).strip()
            parts = raw.split()
            try:
                amount = _number(parts[0])
            except (ValueError, IndexError):
                raise self.error(f"Cannot read {raw!r} as a window length", tree) from None
            if len(parts) == 2 and len(tree.children) == 1:
                return self.within_unit(amount, parts[1], tree)
        unit = str(tree.children[1]) if len(tree.children) > 1 else None
        return self.within_unit(amount, unit, tree)

    def within_unit(self, amount: float, unit: str | None, tree) -> Within:
        if isinstance(amount, float) and not math.isfinite(amount):
            raise self.error("A window must be a finite length", tree)
        if amount < 0:
            raise self.error("A window cannot be negative", tree)
        return Within(amount, unit.lower() if unit else None, _span(tree))

    def returns(self, q: CerQuery, tree: Tree) -> None:
        if tree.data == "return_count":
            q.returns = "count"
        elif tree.data == "return_events":
            q.returns = "events"
        else:
            q.returns = "project"
            q.projections = [self.projection(p) for p in tree.children]

    def projection(self, tree: Tree) -> Projection:
        e = self.expr(tree.children[0])
        if len(tree.children) > 1:
            name = str(tree.children[1])
        else:
            s, t = _span(tree.children[0])
            name = self.text[s:t]
        self.check_output(e)
        return Projection(e, name)

    # ------------------------------------------------------------ checks on expressions
    def check_vars(self, e: Expr) -> None:
        for n in walk(e):
            if isinstance(n, (Col, Var)) and n.var not in self.declared:
                known = ", ".join(self.declared)
                raise self.error(f"Unknown pattern variable {n.var} (the pattern binds {known})", n.span)

    def check_aggregates(self, e: Expr, inside: bool = False) -> None:
        if isinstance(e, Call) and e.name in AGGREGATES:
            if inside:
                raise self.error("Aggregates cannot be nested", e.span)
            if len(e.args) != 1:
                raise self.error(f"{e.name}() takes one argument: a variable's column (or the variable, for count)",
                                 e.span)
            vs = variables(e.args[0])
            if len(vs) != 1:
                raise self.error(f"The argument of {e.name}() must name exactly one pattern variable", e.span)
            (v,) = vs
            if v in self.negated:
                raise self.error(f"{v} is negated: it binds no events to aggregate", e.span)
            if e.name != "count" and isinstance(e.args[0], Var):
                raise self.error(f"{e.name}() needs a column, e.g. {e.name}({v}.price)", e.span)
            for n in walk(e.args[0]):
                if isinstance(n, Col) and n.index is not None:
                    raise self.error(f"{n.var}[{n.index}] names one event of the iteration: aggregate the "
                                     f"variable's events instead ({e.name}({n.var}.{n.name}))", n.span)
            for c in children(e):
                self.check_aggregates(c, True)
            return
        if isinstance(e, Var) and not inside:
            raise self.error(f"{e.var} is a pattern variable: name one of its columns ({e.var}.col), "
                             f"or count its events with count({e.var})", e.span)
        for c in children(e):
            self.check_aggregates(c, inside)

    def kleene_outside_aggregate(self, e: Expr, inside: bool = False):
        """The first column of a Kleene variable used outside an aggregate, if any."""
        if isinstance(e, Call) and e.name in AGGREGATES:
            inside = True
        if isinstance(e, Col) and not inside and e.var in self.kleene and e.index is None:
            return e
        for c in children(e):
            found = self.kleene_outside_aggregate(c, inside)
            if found is not None:
                return found
        return None

    def check_output(self, e: Expr) -> None:
        self.check_vars(e)
        for n in walk(e):
            if isinstance(n, Col) and n.index is not None:
                raise self.error(f"{n.var}[{n.index}] names one iteration of {n.var}: it is available in WHERE; "
                                 f"return an aggregate over {n.var} (e.g. last({n.var}.{n.name}))", n.span)
        self.check_aggregates(e)
        for n in walk(e):
            if isinstance(n, (Col, Var)) and n.var in self.negated:
                raise self.error(f"{n.var} is negated: a match binds no event to it", n.span)
        bad = self.kleene_outside_aggregate(e)
        if bad is not None and bad is not e:
            raise self.error(f"{bad.var} is a Kleene variable: use an aggregate (avg, sum, min, max, count, "
                             f"first, last) over it, or return {bad.var}.{bad.name} alone as a list", bad.span)

    def classify(self, q: CerQuery, where: Expr) -> None:
        conjuncts = list(where.items) if isinstance(where, Logic) and where.op == "and" else [where]
        for c in conjuncts:
            self.check_vars(c)
            self.check_aggregates(c)
            vs = variables(c)
            if iterated(c):
                self.check_iteration(q, c)
            if not vs:
                q.constants.append(c)
            elif len(vs) == 1 and not has_aggregate(c) and not reads_previous(c):
                # b[i].price > 10 for every iteration is b.price > 10 for every event of b: a filter
                q.filters.setdefault(next(iter(vs)), []).append(c)
            else:
                bad = self.kleene_outside_aggregate(c)
                if bad is not None:
                    raise self.error(f"{bad.var} is a Kleene variable: a predicate naming other variables (or an "
                                     f"aggregate) must use an aggregate over it (avg, sum, min, max, count, first, "
                                     f"last), e.g. last({bad.var}.{bad.name})", bad.span)
                q.conditions.append(c)

    # ------------------------------------------------------------ expressions
    def expr(self, t) -> Expr:
        sp = _span(t)
        if isinstance(t, Token):
            raise self.error(f"Unexpected {str(t)!r}", t)
        d = t.data
        k = t.children
        if d == "number":
            text = str(k[0])
            return Lit(sp, float(text) if any(ch in text for ch in ".eE") else int(text))
        if d == "string":
            return Lit(sp, _name(k[0]))
        if d in ("true", "false", "null"):
            return Lit(sp, {"true": True, "false": False, "null": None}[d])
        if d == "param":
            return Lit(sp, self.bound[k[0].start_pos])
        if d == "column":
            return Col(sp, str(k[0]), str(k[1]))
        if d == "indexed_column":
            return self.indexed_column(t)
        if d == "var_star":
            return Var(sp, str(k[0]))
        if d == "var_ref":
            name = str(k[0])
            if self.mr:
                if self.mr_define_var is None:
                    raise self.error(f"Qualify {name} with a pattern variable (A.{name}) in MEASURES", t)
                if name.upper() not in self.declared:
                    return Col(sp, self.mr_define_var, name)
            return Var(sp, name)
        if d == "call":
            name = str(k[0]).lower()
            if name in _NAVIGATION:
                raise self.error(f"{name.upper()}() is not available in CER predicates: they compare the events a "
                                 "match binds, by variable (e.g. B.price > A.price)", t, NotSupportedError)
            return Call(sp, name, tuple(self.expr(a) for a in k[1:]))
        if d == "cast":
            type_text = self.text[_span(k[1])[0]:_span(k[1])[1]]
            return Cast(sp, self.expr(k[0]), type_text)
        if d == "neg":
            return Unary(sp, "-", self.expr(k[0]))
        if d == "not_":
            return Unary(sp, "not", self.expr(k[1]))
        if d in ("and_expr", "or_expr"):
            op = "and" if d == "and_expr" else "or"
            items = []
            for c in k:
                e = self.expr(c)
                items += list(e.items) if isinstance(e, Logic) and e.op == op else [e]
            return Logic(sp, op, tuple(items))
        if d in ("sum", "product"):
            left = self.expr(k[0])
            for i in range(1, len(k), 2):
                right = self.expr(k[i + 1])
                left = Binary((sp[0], _span(k[i + 1])[1]), str(k[i]), left, right)
            return left
        if d == "comparison":
            operands = [self.expr(c) for c in k[0::2]]
            ops = [{"==": "=", "!=": "<>"}.get(str(o), str(o)) for o in k[1::2]]
            parts = [Binary((operands[i].span[0], operands[i + 1].span[1]), op, operands[i], operands[i + 1])
                     for i, op in enumerate(ops)]
            return parts[0] if len(parts) == 1 else Logic(sp, "and", tuple(parts))
        if d == "between":
            negated = isinstance(k[1], Token) and k[1].type == "NOT"
            rest = [c for c in k if not (isinstance(c, Token) and c.type == "NOT")]
            return Between(sp, self.expr(rest[0]), self.expr(rest[1]), self.expr(rest[2]), negated)
        if d == "is_null":
            return IsNull(sp, self.expr(k[0]), len(k) > 1)
        if d == "in_list":
            negated = isinstance(k[1], Token) and k[1].type == "NOT"
            rest = [c for c in k if not (isinstance(c, Token) and c.type == "NOT")]
            return InList(sp, self.expr(rest[0]), tuple(self.expr(c) for c in rest[1:]), negated)
        if len(k) == 1:
            return self.expr(k[0])
        raise self.error(f"Unsupported expression ({d})", t)

    def indexed_column(self, t: Tree) -> Expr:
        """``b[i].col`` (the current event of Kleene variable b's iteration), ``b[i-1].col`` (the
        previous one) or ``b[1].col`` (the first event: ``first(b.col)``)."""
        var_tok, index, name_tok = t.children
        var = str(var_tok)
        if var in self.declared and var not in self.kleene:
            what = "negated: a match binds no event to it" if var in self.negated else \
                f"a single event (write {var}.{name_tok})"
            raise self.error(f"{var}[...] indexes the events of a Kleene variable; {var} is {what}", t)
        col_span = _span(t)
        if isinstance(index, Tree) and index.data == "number" and str(index.children[0]) == "1":
            return Call(col_span, "first", (Col(col_span, var, str(name_tok)),))
        which = None
        if isinstance(index, Tree) and index.data == "var_ref" and str(index.children[0]) == "i":
            which = "i"
        elif isinstance(index, Tree) and index.data == "sum" and len(index.children) == 3:
            left, op, right = index.children
            if isinstance(left, Tree) and left.data == "var_ref" and str(left.children[0]) == "i" \
                    and str(op) == "-" and isinstance(right, Tree) and right.data == "number" \
                    and str(right.children[0]) == "1":
                which = "i-1"
        if which is None:
            raise self.error(f"A Kleene iteration is indexed by i (the current event, {var}[i]), i-1 (the previous "
                             f"one, {var}[i-1]) or 1 (the first, {var}[1])", index)
        return Col(col_span, var, str(name_tok), which)

    def check_iteration(self, q: CerQuery, c: Expr) -> None:
        """A WHERE conjunct reading ``b[i]`` / ``b[i-1]``: one Kleene variable's iteration, not
        mixed with an aggregate over that variable, under a strategy that evaluates it."""
        cols = [n for n in walk(c) if isinstance(n, Col) and n.index is not None]
        var = cols[0].var
        for n in cols:
            if n.var != var:
                raise self.error(f"One condition follows the iteration of one Kleene variable: this one reads "
                                 f"{var}[i] and {n.var}[i] (write one condition per variable)", n.span)
        for n in walk(c):
            if isinstance(n, Call) and n.name in AGGREGATES and var in variables(n):
                raise self.error(f"A condition over {var}'s iteration ({var}[i]) cannot also use an aggregate "
                                 f"over {var} ({n.name}(), or {var}[1]): write them as two conditions joined "
                                 f"by AND", n.span)
        if q.strategy == "next":
            raise self.error(f"Conditions over a Kleene iteration ({var}[i]) are evaluated under "
                             f"skip-till-any-match and strict contiguity, not skip-till-next-match", cols[0].span,
                             NotSupportedError)

    # ------------------------------------------------------------ MATCH_RECOGNIZE ... STRATEGY
    def match_recognize(self, tree: Tree) -> CerQuery:
        self.mr = True
        src = tree.children[0]
        clauses = [c for c in tree.children[1:] if isinstance(c, Tree)]
        seen: dict[str, Tree] = {}
        for c in clauses:
            if c.data in seen:
                raise self.error(f"{c.data.replace('mr_', '').replace('_clause', '').upper()} is given twice", c,
                                 NotSupportedError)
            seen[c.data] = c
        for need, what in (("mr_pattern", "PATTERN"), ("mr_strategy", "STRATEGY"), ("mr_order", "ORDER BY")):
            if need not in seen:
                raise positioned(NotSupportedError, f"{_MR_FORM}; {what} is missing", self.text, _span(tree)[0])
        items = []
        for item in seen["mr_pattern"].children[1:]:
            var_tok = item.children[0]
            kleene = None
            if len(item.children) > 1:
                q = item.children[1]
                kleene = (1, None) if q.data == "mr_plus" else self.bounds(q.children[0], q)
            var = str(var_tok).upper()
            if var in self.declared:
                raise self.error(f"Variable {var} appears twice in PATTERN: the CER form binds each variable once",
                                 var_tok, NotSupportedError)
            items.append(self.declare(Element(None, var, kleene), var_tok))
        root = items[0] if len(items) == 1 else Seq(tuple(items))
        q = CerQuery(self.text, root, dict(self.declared), self.source(src), _span(src), form="match_recognize",
                     typed=False)
        q.key_column = self.column(seen["mr_order"].children[0])
        if "mr_partition" in seen:
            q.partition_column = self.column(seen["mr_partition"].children[0])
        q.strategy = self.strategy(seen["mr_strategy"].children[0])
        if "within_clause" in seen:
            q.within = self.within(seen["within_clause"].children[0])
        if "mr_define" in seen:
            defined = set()
            for d in seen["mr_define"].children:
                var = str(d.children[0]).upper()
                if var not in self.declared:
                    raise self.error(f"DEFINE names {var}, which is not in PATTERN", d.children[0])
                if var in defined:
                    raise self.error(f"{var} is defined twice", d.children[0])
                defined.add(var)
                self.mr_define_var = var
                self.classify(q, self._upper_vars(self.expr(d.children[1])))
            self.mr_define_var = None
        if "mr_measures" in seen:
            q.returns = "project"
            q.projections = []
            for p in seen["mr_measures"].children:
                e = self._upper_vars(self.expr(p.children[0]))
                self.check_output(e)
                s, t = _span(p.children[0])
                q.projections.append(Projection(e, str(p.children[1]) if len(p.children) > 1 else self.text[s:t]))
        return q

    def _upper_vars(self, e: Expr) -> Expr:
        """MATCH_RECOGNIZE variable names are case-insensitive: bring them to the declared upper case."""
        if isinstance(e, Col):
            return Col(e.span, e.var.upper(), e.name, e.index)
        if isinstance(e, Var):
            return Var(e.span, e.var.upper())
        if isinstance(e, Call):
            return Call(e.span, e.name, tuple(self._upper_vars(a) for a in e.args))
        if isinstance(e, Unary):
            return Unary(e.span, e.op, self._upper_vars(e.arg))
        if isinstance(e, Cast):
            return Cast(e.span, self._upper_vars(e.arg), e.type)
        if isinstance(e, Binary):
            return Binary(e.span, e.op, self._upper_vars(e.left), self._upper_vars(e.right))
        if isinstance(e, Logic):
            return Logic(e.span, e.op, tuple(self._upper_vars(i) for i in e.items))
        if isinstance(e, Between):
            return Between(e.span, self._upper_vars(e.arg), self._upper_vars(e.lo), self._upper_vars(e.hi), e.negated)
        if isinstance(e, IsNull):
            return IsNull(e.span, self._upper_vars(e.arg), e.negated)
        if isinstance(e, InList):
            return InList(e.span, self._upper_vars(e.arg), tuple(self._upper_vars(i) for i in e.items), e.negated)
        return e


def describe(node) -> str:
    """The pattern in the language's syntax (for EXPLAIN)."""
    if isinstance(node, Element):
        k = ""
        if node.kleene is not None:
            lo, hi = node.kleene
            k = "+" if (lo, hi) == (1, None) else f"+{{{lo},{'' if hi is None else hi}}}"
        neg = "~" if node.negated else ""
        if node.type is None:  # a MATCH_RECOGNIZE variable: its DEFINE decides
            return f"{neg}{node.var}{k}"
        return f"{neg}{node.type}{k} {node.var}"
    name = {Seq: "SEQ", And: "AND", Or: "OR"}[type(node)]
    return f"{name}({', '.join(describe(i) for i in node.items)})"
