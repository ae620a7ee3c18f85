"""Plan a CER query: resolve it against the source, compile its predicates, choose how to evaluate it.

This module owns
  * name resolution of a ``parser.sase.CerQuery`` against the source's schema (type, key and
    partition columns, the columns predicates and RETURN name) and the window in key units;
  * compilation of predicates over one variable to DuckDB SQL (evaluated in bulk as boolean
    masks) and of predicates over several variables, aggregates over Kleene variables and
    RETURN projections to Python callables over numpy columns;
  * the statistics the choice rests on: per-type counts (and their change between the two
    halves of the key range) from DuckDB, predicate selectivity from a sample of events;
  * the choice of evaluation mechanism and order, and of the anchors used to read only the
    events that can be in a match (filtering before matching). ``engine.cer`` executes the plan.
"""
from __future__ import annotations

import math
import random
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.errors import DataError, NotSupportedError, ProgrammingError, positioned
from matchrec.operators.cer_reference import And, Condition, Element, element_sets
from matchrec.parser import sase as S

SAMPLE_ROWS = 5000
SAMPLE_TRIALS = 400  # random bindings tried per condition to estimate its selectivity
RATE_CHANGE = 2.0  # a type whose count differs this much between the halves makes rates "vary"
MECHANISMS = ("batch", "eager", "chain", "tree", "rcep")
UNIT_SECONDS = {"microsecond": 1e-6, "microseconds": 1e-6, "us": 1e-6, "millisecond": 1e-3, "milliseconds": 1e-3,
                "ms": 1e-3, "second": 1, "seconds": 1, "sec": 1, "secs": 1, "s": 1, "minute": 60, "minutes": 60,
                "min": 60, "mins": 60, "m": 60, "hour": 3600, "hours": 3600, "h": 3600, "day": 86400,
                "days": 86400, "d": 86400, "week": 604800, "weeks": 604800}
NO_WINDOW = 1 << 62
WINDOW_BEYOND_KEYS = 1 << 64  # more than the distance between any two BIGINT keys (or microseconds)
FILTER_COVER = 0.5  # filtering before matching pays while the intervals cover at most this share


@dataclass
class CerSettings:
    """Session settings of CER statements (``SET matchrec_cer_...``)."""
    type_column: str = "type"
    key_column: str = "ts"
    mechanism: str = "auto"  # auto | batch | eager | chain | tree | rcep
    max_matches: int = 10_000_000
    # partial matches the eager NFA may hold at once (some 200 bytes each); lazy mechanisms hold none
    max_partial_matches: int = 5_000_000
    filtering: str = "auto"  # auto | always | never: read only events near the rarest element's candidates


CER_CHOICES = {"mechanism": ("auto",) + MECHANISMS, "filtering": ("auto", "always", "never")}


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and not math.isfinite(value):  # 1e400 is read as infinity, as DuckDB does
        return f"CAST('{value}' AS DOUBLE)"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


@dataclass
class Stats:
    total: int = 0  # events with a key
    types: dict = field(default_factory=dict)  # type -> (count, first half, second half)
    key_span: int = 0  # largest minus smallest key
    sample_rows: int = 0
    filter_selectivity: dict = field(default_factory=dict)  # var -> fraction of its type passing its filter
    condition_selectivity: list = field(default_factory=list)  # per condition, None when not estimable
    estimates: dict = field(default_factory=dict)  # var -> expected candidate events


@dataclass
class CerPlan:
    query: S.CerQuery
    columns: dict  # lower-case name -> (name, DuckDB type)
    type_column: str | None
    key_column: str
    partition_column: str | None
    key_sql: str
    key_kind: str  # integer | time
    window: int  # in key units (microseconds for times); NO_WINDOW without WITHIN
    filter_sql: dict  # var -> SQL of its predicates (without the type test)
    type_sql: str | None  # the type column as VARCHAR
    stats: Stats
    mechanism: str
    order: list | None
    reason: str
    anchors: list  # variables whose candidates bound the events read (filtering before matching)
    filtering: bool
    filtering_reason: str
    rowid: bool  # the source has DuckDB's rowid (a stable tie order for equal keys)
    mechanism_source: str = ""

    def element_test(self, var: str) -> str:
        """SQL: the row is a candidate of ``var`` (type and its own predicates)."""
        e = self.query.elements[var]
        parts = []
        if e.type is not None:
            parts.append(f"{self.type_sql} = {sql_literal(e.type)}")
        if var in self.filter_sql:
            parts.append(self.filter_sql[var])
        return " AND ".join(parts) if parts else "TRUE"

    def row_test(self) -> str | None:
        """SQL keeping the rows any element could take or be blocked by; None: every row counts
        (strict contiguity looks at all rows, and an element without type or filter takes any)."""
        return rows_test([self])


def rows_test(plans: list) -> str | None:
    """SQL keeping the rows some element of some of ``plans`` (one type column) could take or be
    blocked by; None: every row counts. The types of elements without a filter go into one IN list:
    DuckDB scans it about ten times faster than the same equalities joined by OR (a workload of a
    hundred statements has hundreds of them)."""
    types: dict = {}
    others: dict = {}
    for plan in plans:
        if plan.query.strategy == "strict":
            return None
        for v, e in plan.query.elements.items():
            if v in plan.filter_sql:
                others[plan.element_test(v)] = None
            elif e.type is None:
                return None
            else:
                types[e.type] = None
    parts = []
    if types:
        parts.append(f"{plans[0].type_sql} IN ({', '.join(sql_literal(t) for t in types)})")
    parts += [f"({t})" for t in others]
    return " OR ".join(parts) if parts else None


# ---------------------------------------------------------------- resolution
class _Resolver:
    def __init__(self, q: S.CerQuery, columns: dict):
        self.q, self.columns = q, columns

    def column(self, name: str, span, what: str) -> str:
        hit = self.columns.get(name.lower())
        if hit is None:
            known = ", ".join(c for c, _ in self.columns.values())
            if span is None:
                raise ProgrammingError(f"{what} {name} is not a column of {self.q.source} (columns: {known})")
            raise positioned(ProgrammingError, f"{what} {name} is not a column of {self.q.source} (columns: {known})",
                             self.q.text, span[0], span[1])
        return hit[0]

    def col(self, e: S.Col) -> str:
        return self.column(e.name, e.span, "Column")


def describe_source(duck: duckdb.DuckDBPyConnection, q: S.CerQuery) -> dict:
    try:
        rows = duck.execute(f"DESCRIBE SELECT * FROM {q.source}").fetchall()
    except duckdb.Error as err:
        first = str(err).split("\n")[0]
        raise positioned(ProgrammingError, f"Cannot read {q.source}: {first}", q.text, *q.source_span) from None
    return {r[0].lower(): (r[0], r[1]) for r in rows}


def to_sql(e: S.Expr, res: _Resolver) -> str:
    if isinstance(e, S.Lit):
        return sql_literal(e.value)
    if isinstance(e, S.Col):
        return quote(res.col(e))
    if isinstance(e, S.Var):
        raise positioned(ProgrammingError, f"{e.var} is a pattern variable, not a value", res.q.text, *e.span)
    if isinstance(e, S.Call):
        return f"{e.name}({', '.join(to_sql(a, res) for a in e.args)})"
    if isinstance(e, S.Unary):
        return f"(-{to_sql(e.arg, res)})" if e.op == "-" else f"(NOT {to_sql(e.arg, res)})"
    if isinstance(e, S.Cast):
        return f"CAST({to_sql(e.arg, res)} AS {e.type})"
    if isinstance(e, S.Binary):
        return f"({to_sql(e.left, res)} {e.op} {to_sql(e.right, res)})"
    if isinstance(e, S.Logic):
        return "(" + f" {e.op.upper()} ".join(to_sql(i, res) for i in e.items) + ")"
    if isinstance(e, S.Between):
        neg = "NOT " if e.negated else ""
        return f"({to_sql(e.arg, res)} {neg}BETWEEN {to_sql(e.lo, res)} AND {to_sql(e.hi, res)})"
    if isinstance(e, S.IsNull):
        return f"({to_sql(e.arg, res)} IS {'NOT ' if e.negated else ''}NULL)"
    if isinstance(e, S.InList):
        items = ", ".join(to_sql(i, res) for i in e.items)
        return f"({to_sql(e.arg, res)} {'NOT ' if e.negated else ''}IN ({items}))"
    raise TypeError(e)


# ---------------------------------------------------------------- Python compilation (conditions, RETURN)
def _rows(x):
    return x if isinstance(x, tuple) else (x,)


def _nn(values):
    return [v for v in values if v is not None]


def _avg(values):
    v = _nn(values)
    return sum(map(_exact, v)) / len(v) if v else None


def _exact(x):
    """numpy integers as Python ints, whose arithmetic never wraps around."""
    return int(x) if isinstance(x, np.integer) else x


def _sum(values):
    v = _nn(values)
    return sum(map(_exact, v)) if v else None


def _min(values):
    v = _nn(values)
    return min(v) if v else None


def _max(values):
    v = _nn(values)
    return max(v) if v else None


def _count(values):
    return len(_nn(values))


def _div(a, b):
    if a is None or b is None or b == 0:
        return None  # DuckDB: division by zero is NULL
    return a / b


def _mod(a, b):
    if a is None or b is None or b == 0:
        return None
    r = math.fmod(a, b)  # the sign of the dividend, as in SQL
    return int(r) if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) else r


def _cat(a, b):
    return None if a is None or b is None else f"{a}{b}"


def _null2(fn):
    return lambda a, b: None if a is None or b is None else fn(a, b)


def _and(*xs):
    if any(x is not None and not x for x in xs):
        return False
    return None if any(x is None for x in xs) else True


def _or(*xs):
    if any(x is not None and x for x in xs):
        return True
    return None if any(x is None for x in xs) else False


def _not(x):
    return None if x is None else not x


def _in(x, items):
    if x is None:
        return None
    if any(i is not None and x == i for i in items):
        return True
    return None if any(i is None for i in items) else False


def _between(x, lo, hi):
    return _and(_null2(lambda a, b: a >= b)(x, lo), _null2(lambda a, b: a <= b)(x, hi))


def _scalar(fn):
    return lambda *a: None if any(v is None for v in a) else fn(*a)


def _exact_op(fn):
    """``fn`` on exact values, NULL in NULL out: used where int64 arithmetic could wrap."""
    return lambda a, b: None if a is None or b is None else fn(_exact(a), _exact(b))


_HELPERS = {
    "_xadd": _exact_op(lambda a, b: a + b), "_xsub": _exact_op(lambda a, b: a - b),
    "_xmul": _exact_op(lambda a, b: a * b), "_xneg": lambda a: None if a is None else -_exact(a),
    "_rows": _rows, "_avg": _avg, "_sum": _sum, "_min": _min, "_max": _max, "_count": _count, "_div": _div,
    "_mod": _mod, "_cat": _cat, "_and": _and, "_or": _or, "_not": _not, "_in": _in, "_between": _between,
    "_add": _null2(lambda a, b: a + b), "_sub": _null2(lambda a, b: a - b), "_mul": _null2(lambda a, b: a * b),
    "_eq": _null2(lambda a, b: a == b), "_ne": _null2(lambda a, b: a != b), "_lt": _null2(lambda a, b: a < b),
    "_le": _null2(lambda a, b: a <= b), "_gt": _null2(lambda a, b: a > b), "_ge": _null2(lambda a, b: a >= b),
    "_neg": lambda a: None if a is None else -a,
}
def _cast_kind(type_text: str) -> str | None:
    t = type_text.upper().split("(")[0].strip()
    if t in ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "INT2", "INT4", "INT8", "LONG"):
        return "int"
    if t in ("DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8", "DECIMAL", "NUMERIC"):
        return "float"
    if t in ("VARCHAR", "TEXT", "STRING", "CHAR"):
        return "str"
    if t in ("BOOLEAN", "BOOL"):
        return "bool"
    return None


def _to_int(x):
    if isinstance(x, str):
        x = float(x)
    return int(round(x))  # DuckDB rounds when casting a fraction to an integer


def _to_str(x):
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    return str(x.item() if isinstance(x, np.generic) else x)


_HELPERS.update({"_cast_int": _scalar(_to_int), "_cast_float": _scalar(float), "_cast_str": _scalar(_to_str),
                 "_cast_bool": _scalar(lambda x: x.lower() in ("true", "t", "1") if isinstance(x, str) else bool(x))})
_FUNCTIONS = {
    "round": lambda x, n=0: round(float(x), int(n)), "floor": math.floor, "ceil": math.ceil,
    "ceiling": math.ceil, "sqrt": math.sqrt, "ln": math.log, "log10": math.log10, "log2": math.log2,
    "exp": math.exp, "power": math.pow, "pow": math.pow, "sign": lambda x: (x > 0) - (x < 0),
    "abs": lambda x: abs(_exact(x)),
    "lower": lambda s: str(s).lower(), "upper": lambda s: str(s).upper(), "length": lambda s: len(str(s)),
    "least": lambda *a: min(a), "greatest": lambda *a: max(a),
}
_PY_OPS = {"+": ("+", "_add"), "-": ("-", "_sub"), "*": ("*", "_mul"), "=": ("==", "_eq"), "<>": ("!=", "_ne"),
           "<": ("<", "_lt"), "<=": ("<=", "_le"), ">": (">", "_gt"), ">=": (">=", "_ge")}


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def python_column(arr) -> tuple[np.ndarray, bool]:
    """A column as the compiled conditions read it: numpy for numbers without NULLs (integers as
    int64, so that narrow types do not wrap at their own width), else objects. Integers beyond
    int64 (HUGEINT, large UBIGINT) are Python ints, exact; other DECIMALs are read as DOUBLE."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_decimal(t) and t.scale == 0:
        values = np.empty(len(arr), dtype=object)
        values[:] = [None if v is None else int(v) for v in arr.to_pylist()]
        return values, arr.null_count > 0
    if pa.types.is_decimal(t):
        arr = arr.cast(pa.float64())
        t = arr.type
    nullable = arr.null_count > 0
    if not nullable and pa.types.is_integer(t) and t != pa.int64():
        if t == pa.uint64() and len(arr) and pc.max(arr).as_py() > INT64_MAX:
            values = np.empty(len(arr), dtype=object)
            values[:] = arr.to_pylist()
            return values, False
        return arr.cast(pa.int64()).to_numpy(), False
    if not nullable and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return arr.to_numpy(), False
    values = np.empty(len(arr), dtype=object)
    values[:] = arr.to_pylist()
    return values, nullable


def int_bounds(values: np.ndarray) -> tuple[int, int] | None:
    """(min, max) of an int64 column (None for other columns): what arithmetic on it can reach."""
    if values.dtype != np.int64:
        return None
    if len(values) == 0:
        return (0, 0)
    return int(values.min()), int(values.max())


def fits_int64(bounds) -> bool:
    return bounds is not None and INT64_MIN <= bounds[0] and bounds[1] <= INT64_MAX


def arithmetic_bounds(e, bounds_of: Callable):
    """Bounds of ``+ - * /`` and unary minus from their operands' ``bounds_of``: an integer
    range ``(lo, hi)`` that fits 64 bits, ``"float"``, or None (unknown, or past 64 bits: then
    the expression is evaluated exactly); None as well for any other expression."""
    if isinstance(e, S.Binary) and e.op in ("+", "-", "*"):
        a, b = bounds_of(e.left), bounds_of(e.right)
        if "float" in (a, b):
            return "float" if a is not None and b is not None else None
        out = combine_bounds(e.op, a, b)
        return out if fits_int64(out) else None
    if isinstance(e, S.Binary) and e.op == "/":
        return "float"
    if isinstance(e, S.Unary) and e.op == "-":
        a = bounds_of(e.arg)
        if a == "float" or a is None:
            return a
        return (-a[1], -a[0]) if fits_int64((-a[1], -a[0])) else None
    return None


def combine_bounds(op: str, a, b):
    """The range of ``a op b`` for integer ranges ``a`` and ``b`` (exact Python ints)."""
    if a is None or b is None:
        return None
    if op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if op == "-":
        return (a[0] - b[1], a[1] - b[0])
    products = [x * y for x in a for y in b]
    return (min(products), max(products))


class PyCompiler:
    """Compiles expressions over a binding (var -> row, Kleene var -> tuple of rows) into Python
    functions reading numpy columns of ``table``. Columns without NULLs compile to plain operators;
    a nullable operand switches that operation to SQL's three-valued helpers."""

    def __init__(self, table: pa.Table, res: _Resolver, kleene: set, converted: dict | None = None):
        self.table, self.res, self.kleene = table, res, kleene
        self.ns: dict = dict(_HELPERS)
        self.cols: dict[str, tuple[str, bool]] = {}
        # name -> (values, nullable): shared by the compilers of many statements over one table,
        # which would otherwise each convert the same columns
        self.converted = {} if converted is None else converted

    def column(self, name: str) -> tuple[str, bool]:
        if name not in self.cols:
            values, nullable = self.converted_column(name)
            ident = f"c{len(self.cols)}"
            self.ns[ident] = values
            self.cols[name] = (ident, nullable)
        return self.cols[name]

    def bounds(self, e: S.Expr):
        """The range of an integer-valued expression when it is known to stay in int64 arithmetic
        (numpy columns, integer literals and + - * of them); "float" for floating-point values;
        None when unknown. Where a range is unknown or leaves int64, arithmetic is made exact."""
        if isinstance(e, S.Lit):
            if isinstance(e.value, bool) or e.value is None:
                return None
            if isinstance(e.value, float):
                return "float"
            return (e.value, e.value) if isinstance(e.value, int) else None
        if isinstance(e, S.Col):
            values, nullable = self.converted_column(self.res.col(e))
            if values.dtype.kind == "f":
                return "float"
            return None if nullable or e.var in self.kleene else int_bounds(values)
        if isinstance(e, S.Call) and e.name in ("min", "max", "first", "last") and len(e.args) == 1:
            return self.bounds(e.args[0]) if not isinstance(e.args[0], S.Var) else None
        if isinstance(e, S.Call) and e.name == "avg":
            return "float"
        return arithmetic_bounds(e, self.bounds)

    def converted_column(self, name: str):
        if name not in self.converted:
            self.converted[name] = python_column(self.table.column(name))
        return self.converted[name]

    def gen(self, e: S.Expr, rows: dict) -> tuple[str, bool]:
        """(Python source, may be NULL). ``rows`` maps a variable to the source of its current row
        inside an aggregate's comprehension."""
        if isinstance(e, S.Lit):
            if isinstance(e.value, float) and not math.isfinite(e.value):
                return f"float({str(e.value)!r})", False  # repr() of infinity is no Python literal
            return repr(e.value), e.value is None
        if isinstance(e, S.Col):
            ident, nullable = self.column(self.res.col(e))
            if e.var in rows:
                return f"{ident}[{rows[e.var]}]", nullable
            if e.var in self.kleene:  # RETURN b.price alone: the list of values
                return f"[{ident}[_r] for _r in b[{e.var!r}]]", False
            return f"{ident}[b[{e.var!r}]]", nullable
        if isinstance(e, S.Call) and e.name in S.AGGREGATES:
            arg = e.args[0]
            (var,) = S.variables(arg)
            rows_src = f"_rows(b[{var!r}])"
            if e.name == "count" and isinstance(arg, S.Var):
                return f"len({rows_src})", False
            if e.name in ("first", "last"):
                inner = self.gen(arg, {**rows, var: f"{rows_src}[{0 if e.name == 'first' else -1}]"})
                return inner
            inner, _ = self.gen(arg, {**rows, var: "_r"})
            return f"_{e.name}([{inner} for _r in {rows_src}])", e.name != "count"
        if isinstance(e, S.Call):
            fn = _FUNCTIONS.get(e.name)
            if fn is None:
                raise positioned(ProgrammingError, f"Function {e.name}() is available only in predicates over one "
                                 f"variable (evaluated by DuckDB); here use one of {', '.join(sorted(_FUNCTIONS))}",
                                 self.res.q.text, *e.span)
            ident = f"f_{e.name}"
            self.ns[ident] = _scalar(fn)
            args = [self.gen(a, rows)[0] for a in e.args]
            return f"{ident}({', '.join(args)})", True
        if isinstance(e, S.Var):
            raise positioned(ProgrammingError, f"{e.var} is a pattern variable, not a value", self.res.q.text, *e.span)
        if isinstance(e, S.Cast):
            kind = _cast_kind(e.type)
            if kind is None:
                raise positioned(ProgrammingError, f"CAST to {e.type} is available only in predicates over one "
                                 "variable (evaluated by DuckDB); here cast to an integer, floating point, "
                                 "VARCHAR or BOOLEAN type", self.res.q.text, *e.span)
            x, _ = self.gen(e.arg, rows)
            return f"_cast_{kind}({x})", True
        if isinstance(e, S.Unary):
            x, n = self.gen(e.arg, rows)
            if e.op == "-":
                if self.bounds(e) is None:  # could leave int64: exact
                    return f"_xneg({x})", n
                return (f"_neg({x})", True) if n else (f"(-{x})", False)
            return (f"_not({x})", True) if n else (f"(not {x})", False)
        if isinstance(e, S.Binary):
            a, na = self.gen(e.left, rows)
            b, nb = self.gen(e.right, rows)
            if e.op == "/":
                return f"_div({a}, {b})", True
            if e.op == "%":
                return f"_mod({a}, {b})", True
            if e.op == "||":
                return f"_cat({a}, {b})", True
            plain, helper = _PY_OPS[e.op]
            if e.op in ("+", "-", "*") and self.bounds(e) is None:  # could leave int64: exact
                return f"_x{helper[1:]}({a}, {b})", na or nb
            if na or nb:
                return f"{helper}({a}, {b})", True
            return f"({a} {plain} {b})", False
        if isinstance(e, S.Logic):
            parts = [self.gen(i, rows) for i in e.items]
            if any(n for _, n in parts):
                return f"_{e.op}({', '.join(p for p, _ in parts)})", True
            return "(" + f" {e.op} ".join(f"bool({p})" for p, _ in parts) + ")", False
        if isinstance(e, S.Between):
            x, lo, hi = (self.gen(i, rows)[0] for i in (e.arg, e.lo, e.hi))
            out = f"_between({x}, {lo}, {hi})"
            return (f"_not({out})" if e.negated else out), True
        if isinstance(e, S.IsNull):
            x, _ = self.gen(e.arg, rows)
            return f"({x} is {'not ' if e.negated else ''}None)", False
        if isinstance(e, S.InList):
            x, _ = self.gen(e.arg, rows)
            items = ", ".join(self.gen(i, rows)[0] for i in e.items)
            out = f"_in({x}, ({items},))"
            return (f"_not({out})" if e.negated else out), True
        raise TypeError(e)

    def function(self, e: S.Expr) -> Callable[[dict], object]:
        code, _ = self.gen(e, {})
        fn = eval(f"lambda b: {code}", self.ns)  # noqa: S307 - source generated from the parsed query
        text = self.res.q.text[e.span[0]:e.span[1]]

        def guarded(b, fn=fn, text=text):
            try:
                return fn(b)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError) as err:
                raise DataError(f"Cannot evaluate {text}: {err}") from None
        guarded.text = text
        return guarded


def compile_conditions(plan: CerPlan, table: pa.Table, converted: dict | None = None) -> list[Condition]:
    """The query's conditions as functions of a binding. ``converted``: a cache of converted
    columns of ``table`` to share between the statements of a workload."""
    q = plan.query
    comp = PyCompiler(table, _Resolver(q, plan.columns), {v for v, e in q.elements.items() if e.kleene},
                      converted)
    out = []
    for c in q.conditions:
        same = _same_column_equality(c, q, comp)
        if same is not None:
            out.append(same)
            continue
        fn = comp.function(c)
        out.append(Condition(frozenset(S.variables(c)), fn, fn.text))
    return out


def _same_column_equality(c: S.Expr, q: S.CerQuery, comp: "PyCompiler"):
    """``a.x = b.x`` as the mechanisms' AttributeEquality, so they can group candidates by value."""
    if not (isinstance(c, S.Binary) and c.op == "=" and isinstance(c.left, S.Col) and isinstance(c.right, S.Col)):
        return None
    a, b = c.left, c.right
    if a.var == b.var or q.elements[a.var].kleene or q.elements[b.var].kleene:
        return None
    column = comp.res.col(a)
    if comp.res.col(b) != column:
        return None
    try:
        from matchrec.operators.cer_mechanisms import AttributeEquality
    except ImportError:
        return None
    ident, _ = comp.column(column)
    return AttributeEquality({a.var, b.var}, comp.ns[ident], q.text[c.span[0]:c.span[1]])


def compile_projections(plan: CerPlan, table: pa.Table) -> list:
    q = plan.query
    comp = PyCompiler(table, _Resolver(q, plan.columns), {v for v, e in q.elements.items() if e.kleene})
    out = []
    for p in q.projections:
        needs = frozenset(S.variables(p.expr))
        fn = comp.function(p.expr)
        out.append((p, needs, fn))
    return out


# ---------------------------------------------------------------- planning
def window_of(q: S.CerQuery, key_kind: str) -> int:
    w = q.within
    if w is None:
        return NO_WINDOW
    if key_kind == "time":
        if w.unit is None:
            raise positioned(ProgrammingError, "The ORDER BY key is a time: give WITHIN a unit (e.g. WITHIN 10 "
                             "minutes)", q.text, *w.span)
        # exact for integer amounts (a float product would round large windows)
        micros = UNIT_SECONDS[w.unit] * 1_000_000
        window = w.amount * int(micros) if isinstance(w.amount, int) and micros >= 1 else \
            int(round(Fraction(w.amount) * Fraction(micros).limit_denominator(1_000_000)))
    else:
        if w.unit is not None:
            raise positioned(ProgrammingError, "The ORDER BY key is a number: WITHIN takes a plain number of key "
                             "units", q.text, *w.span)
        if w.amount != int(w.amount):
            raise positioned(ProgrammingError, "The ORDER BY key is an integer: WITHIN takes an integer", q.text,
                             *w.span)
        window = int(w.amount)
    if window >= WINDOW_BEYOND_KEYS:
        return NO_WINDOW  # longer than the distance between any two keys: no bound at all
    if window >= NO_WINDOW:
        raise positioned(NotSupportedError, f"A window of 2**62 key units or more is not supported below "
                         f"2**64 (the widest distance of two keys); leave WITHIN out to match without a window",
                         q.text, *w.span)
    return window


def _key_sql(name: str, duck_type: str, q: S.CerQuery, span) -> tuple[str, str]:
    t = duck_type.upper()
    col = quote(name)
    if t.startswith("TIMESTAMP"):
        return f"epoch_us({col})", "time"
    if t == "DATE":
        return f"epoch_us(CAST({col} AS TIMESTAMP))", "time"
    if t in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT"):
        return f"CAST({col} AS BIGINT)", "integer"
    message = f"The ORDER BY key {name} is {duck_type}: CER needs an integer, DATE or TIMESTAMP key"
    if span is None:
        raise ProgrammingError(message + " (set the key column with ORDER BY <column> or SET matchrec_cer_key_column)")
    raise positioned(ProgrammingError, message, q.text, *span)


def plan_query(duck: duckdb.DuckDBPyConnection, q: S.CerQuery, settings: CerSettings, mechanisms) -> CerPlan:
    plan = resolve_query(duck, q, settings)
    gather_stats(duck, plan)
    choose_mechanism(plan, settings, mechanisms)
    choose_filtering(plan, settings, duck)
    return plan


def resolve_query(duck: duckdb.DuckDBPyConnection, q: S.CerQuery, settings: CerSettings,
                  columns: dict | None = None, rowid: bool | None = None) -> CerPlan:
    """The plan's resolution only: columns, key, window and the SQL of the filters, without statistics
    or a mechanism (``columns`` and ``rowid``: the source's schema and rowid, when already known)."""
    if columns is None:
        columns = describe_source(duck, q)
    res = _Resolver(q, columns)
    type_col = None
    if q.typed:
        if q.type_column is not None:
            type_col = res.column(q.type_column[0], q.type_column[1], "TYPE")
        else:
            type_col = res.column(settings.type_column, None, "The type column (SET matchrec_cer_type_column)")
    if q.key_column is not None:
        key_col = res.column(q.key_column[0], q.key_column[1], "ORDER BY")
        key_span = q.key_column[1]
    else:
        key_col = res.column(settings.key_column, None, "The key column (SET matchrec_cer_key_column)")
        key_span = None
    part_col = None
    if q.partition_column is not None:
        part_col = res.column(q.partition_column[0], q.partition_column[1], "PARTITION BY")
    key_sql, key_kind = _key_sql(key_col, columns[key_col.lower()][1], q, key_span)
    window = window_of(q, key_kind)
    filter_sql = {}
    constants = [to_sql(c, res) for c in q.constants]
    for var in q.elements:
        preds = [to_sql(p, res) for p in q.filters.get(var, [])] + constants
        if preds:
            filter_sql[var] = "coalesce(" + " AND ".join(preds) + ", FALSE)"
    # the Python side resolves the same names: fail here, at planning, on an unknown column
    for e in list(q.conditions) + [p.expr for p in q.projections]:
        for n in S.walk(e):
            if isinstance(n, S.Col):
                res.col(n)
    if rowid is None:
        rowid = has_rowid(duck, q.source)
    return CerPlan(q, columns, type_col, key_col, part_col, key_sql, key_kind, window, filter_sql,
                   f"CAST({quote(type_col)} AS VARCHAR)" if type_col else None, Stats(), "", None, "", [], False, "",
                   rowid)


def has_rowid(duck: duckdb.DuckDBPyConnection, source: str) -> bool:
    """Whether ``source`` has DuckDB's rowid (a stable tie order for equal keys)."""
    try:
        duck.execute(f"SELECT rowid FROM {source} LIMIT 0")
        return True
    except duckdb.Error:
        return False


def gather_stats(duck: duckdb.DuckDBPyConnection, plan: CerPlan) -> None:
    q, st = plan.query, plan.stats
    src = q.source
    type_expr = plan.type_sql or "NULL"
    rows = duck.execute(
        f"WITH s AS (SELECT {type_expr} AS t, {plan.key_sql} AS k FROM {src} WHERE {plan.key_sql} IS NOT NULL), "
        f"m AS (SELECT min(k) AS lo, max(k) AS hi FROM s) "
        f"SELECT t, count(*), count(*) FILTER (WHERE k <= (SELECT lo + (hi - lo) // 2 FROM m)), "
        f"any_value((SELECT hi - lo FROM m)) FROM s GROUP BY t").fetchall()
    for t, n, first, span in rows:
        st.types[t] = (n, first, n - first)
        st.key_span = int(span or 0)
    st.total = sum(n for n, _, _ in st.types.values())
    # a sample of events for the predicates' selectivity
    res = _Resolver(q, plan.columns)
    needed = {res.col(n) for e in q.conditions for n in S.walk(e) if isinstance(n, S.Col)}
    cols = [quote(c) for c in sorted(needed)]
    for var, e in q.elements.items():
        cols.append(f"{plan.element_test(var)} AS {quote('__t_' + var)}")
        type_test = "TRUE" if e.type is None else f"{plan.type_sql} = {sql_literal(e.type)}"
        cols.append(f"{type_test} AS {quote('__y_' + var)}")
    sample = duck.sql(
        f"SELECT {', '.join(cols)} FROM (SELECT * FROM {src} WHERE {plan.key_sql} IS NOT NULL) "
        f"USING SAMPLE reservoir({SAMPLE_ROWS} ROWS) REPEATABLE (7)").to_arrow_table()
    st.sample_rows = len(sample)
    for var, e in q.elements.items():
        hits = np.asarray(sample.column("__t_" + var).to_numpy(zero_copy_only=False), bool)
        of_type = np.asarray(sample.column("__y_" + var).to_numpy(zero_copy_only=False), bool)
        base = st.total if e.type is None else st.types.get(e.type, (0, 0, 0))[0]
        sel = float(hits[of_type].mean()) if of_type.any() else 1.0
        st.filter_selectivity[var] = sel
        st.estimates[var] = base * sel
    st.condition_selectivity = estimate_conditions(plan, sample)


def estimate_conditions(plan: CerPlan, sample: pa.Table) -> list:
    q = plan.query
    if not q.conditions or len(sample) == 0:
        return [None] * len(q.conditions)
    cands = {v: np.flatnonzero(np.asarray(sample.column("__t_" + v).to_numpy(zero_copy_only=False), bool))
             for v in q.elements}
    comp = PyCompiler(sample, _Resolver(q, plan.columns), {v for v, e in q.elements.items() if e.kleene})
    rng = random.Random(11)
    out = []
    for c in q.conditions:
        vs = sorted(S.variables(c))
        if any(len(cands[v]) == 0 for v in vs):
            out.append(None)
            continue
        fn = comp.function(c)
        hits = 0
        for _ in range(SAMPLE_TRIALS):
            b = {}
            for v in vs:
                e = q.elements[v]
                if e.kleene:
                    size = min(len(cands[v]), max(e.kleene[0], rng.randint(1, 3)))
                    b[v] = tuple(sorted(rng.sample(list(cands[v]), size)))
                else:
                    b[v] = int(rng.choice(cands[v]))
            try:
                value = fn(b)
            except DataError:
                value = None
            hits += value is not None and bool(value)
        out.append(hits / SAMPLE_TRIALS)
    return out


def choose_mechanism(plan: CerPlan, settings: CerSettings, mechanisms) -> None:
    q, st = plan.query, plan.stats
    pattern = pattern_shape(plan)
    by_estimate = sorted(q.positive, key=lambda v: (st.estimates.get(v, 0), q.positive.index(v)))
    forced = settings.mechanism
    kleene = any(q.elements[v].kleene for v in q.positive)
    if forced == "batch":
        if q.strategy != "any":
            raise NotSupportedError(f"SET matchrec_cer_mechanism = batch: the batch operator evaluates "
                                    f"skip-till-any-match only, not {S.STRATEGY_NAMES[q.strategy]}")
        plan.mechanism, plan.reason = forced, "forced by SET matchrec_cer_mechanism" + (
            "; a Kleene closure it cannot count goes to recomputation (rcep)" if kleene else "")
    elif forced != "auto":
        why = mechanisms.supports(forced, pattern)
        if why:
            raise NotSupportedError(f"SET matchrec_cer_mechanism = {forced}: {why}")
        plan.mechanism, plan.reason = forced, "forced by SET matchrec_cer_mechanism"
    else:
        if q.strategy == "any" and kleene:
            plan.mechanism = "rcep"
            plan.reason = ("skip-till-any-match with Kleene closure: recomputation shares the closure's "
                           "partial matches instead of enumerating them per run")
        elif q.strategy == "any" and not _holds_and(q.root):
            # The lazy order, evaluated over whole arrays at once: each alternative's elements bound
            # in the order of least estimated work, the candidates of each step found by binary search
            # and extended in blocks. The chain and tree NFAs make the same searches one partial match
            # at a time in Python (10 to 100 times slower on benchmark patterns); they stay available
            # through SET matchrec_cer_mechanism, and take AND, which they search as one partial order
            # while the batch operator would expand it into its permutations.
            varying = rate_changes(plan)
            plan.mechanism = "batch"
            plan.reason = ("skip-till-any-match: batch operator, each alternative's elements bound in the order of "
                           "least estimated work (dynamic programming over the sets of bound elements), candidates "
                           "found by binary search and extended in blocks"
                           + ("; event rates vary over time (" + "; ".join(varying) + "): the order is chosen again "
                              "for a stretch of the stream whose rates drift" if varying else ""))
        elif q.strategy == "any":
            varying = rate_changes(plan)
            if varying:
                plan.mechanism = "tree"
                plan.reason = "AND, event rates vary over time (" + "; ".join(varying) + "): tree NFA"
            else:
                plan.mechanism = "chain"
                plan.reason = "AND, stable event rates: lazy chain NFA, rarest element first"
        else:
            plan.mechanism = "eager"
            plan.reason = f"{S.STRATEGY_NAMES[q.strategy]} decides each event as it arrives: eager NFA"
        why = mechanisms.supports(plan.mechanism, pattern) if plan.mechanism != "batch" else ""
        if why:
            plan.reason = f"{plan.mechanism} would fit, but it does not support this pattern ({why}); eager NFA"
            plan.mechanism = "eager"
            why = mechanisms.supports("eager", pattern)
            if why:
                raise NotSupportedError(f"No evaluation mechanism supports this pattern: {why}")
    plan.order = by_estimate if plan.mechanism in ("chain", "tree") else None


def _holds_and(node) -> bool:
    if isinstance(node, Element):
        return False
    return isinstance(node, And) or any(_holds_and(x) for x in node.items)


def rate_changes(plan: CerPlan) -> list[str]:
    out = []
    types = {plan.query.elements[v].type for v in plan.query.positive}
    for t in sorted(x for x in types if x is not None):
        n, first, second = plan.stats.types.get(t, (0, 0, 0))
        if n < 20:
            continue  # too few events to speak of a rate
        lo, hi = sorted((first, second))
        if hi > RATE_CHANGE * max(lo, 1):
            out.append(f"{t}: {first} then {second}")
    return out


def choose_filtering(plan: CerPlan, settings: CerSettings, duck: duckdb.DuckDBPyConnection | None = None) -> None:
    q, st = plan.query, plan.stats
    if plan.window == NO_WINDOW:
        plan.filtering, plan.filtering_reason = False, "no WITHIN: every event may be in a match"
        return
    if settings.filtering == "never":
        plan.filtering, plan.filtering_reason = False, "off (SET matchrec_cer_filtering = never)"
        return
    plan.anchors = anchors_of(q, lambda v: st.estimates.get(v, 0))
    candidates = sum(st.estimates.get(v, 0) for v in plan.anchors)
    if settings.filtering == "always":
        plan.filtering, plan.filtering_reason = True, "forced (SET matchrec_cer_filtering = always)"
        return
    test = " OR ".join(f"({plan.element_test(v)})" for v in plan.anchors)
    cover, what = anchor_cover(duck, plan.query.source, plan.key_sql, plan.partition_column, [(test, plan.window)],
                               interval_cover(candidates, plan.window, st.key_span))
    if cover > FILTER_COVER:
        plan.filtering = False
        plan.filtering_reason = f"the anchors' intervals would cover about {cover:.0%} of the {what}"
    else:
        plan.filtering = True
        plan.filtering_reason = f"the anchors' intervals cover at most about {cover:.1%} of the {what}"


def anchors_of(q: S.CerQuery, candidates) -> list[str]:
    """Per alternative of the pattern, its positive element with the fewest ``candidates(var)``
    (the first in the sequence on a tie): every match binds one of them, so reading only the
    events within the window of their candidates keeps every match."""
    anchors = []
    for chain in element_sets(q.root):  # an AND's k! orders hold the same elements: not expanded
        pos = [e.var for e in chain if not e.negated]
        if pos:
            anchors.append(min(pos, key=lambda v: (candidates(v), pos.index(v))))
    return list(dict.fromkeys(anchors))


def interval_cover(candidates: float, window: int, span: int) -> float:
    """The share of a key range of length ``span`` that intervals ``[t - window, t + window]``
    around ``candidates`` points could cover (at most)."""
    return 1.0 if span <= 0 else min(1.0, candidates * (2 * window + 1) / span)


def anchor_cover(duck: duckdb.DuckDBPyConnection | None, source: str, key_sql: str, partition_column: str | None,
                 anchors: list[tuple[str, int]], flat: float) -> tuple[float, str]:
    """(The share the intervals around the anchors' candidates could cover, of what), from ``flat``,
    their cover of the whole key range. With PARTITION BY, when ``flat`` is too large to filter,
    it is counted again per partition (``partitioned_cover``): over the whole key range a few
    candidates in each of many partitions seem to cover everything, although each covers only its
    own partition's rows."""
    if partition_column and duck is not None and flat > FILTER_COVER:
        return min(1.0, partitioned_cover(duck, source, key_sql, partition_column, anchors)), "rows (per partition)"
    return flat, "key range"


def partitioned_cover(duck: duckdb.DuckDBPyConnection, source: str, key_sql: str, partition_column: str,
                      anchors: list[tuple[str, int]]) -> float:
    """The share of the rows the intervals of each (anchor test, window) could cover, summed over
    the anchors: per partition, ``interval_cover`` over the partition's own key range, weighted by
    its rows."""
    if not anchors:
        return 0.0
    inner = ", ".join(f"count(*) FILTER (WHERE {t}) AS c{i}" for i, (t, _) in enumerate(anchors))
    outer = " + ".join(f"sum(least(n, CAST(c{i} AS DOUBLE) * {2 * int(w) + 1} * n / (hi - lo + 1)))"
                       for i, (_, w) in enumerate(anchors))
    n, covered = duck.execute(
        f"SELECT sum(n), {outer} FROM (SELECT count(*) AS n, min({key_sql}) AS lo, max({key_sql}) AS hi, {inner} "
        f"FROM {source} WHERE {key_sql} IS NOT NULL GROUP BY {quote(partition_column)})").fetchall()[0]
    return float(covered or 0.0) / float(n) if n else 0.0



def pattern_shape(plan: CerPlan):
    """The pattern model without data (for ``supports``)."""
    from matchrec.operators.cer_reference import Pattern
    return Pattern(plan.query.root, plan.window, plan.query.strategy, {}, [
        Condition(frozenset(S.variables(c)), lambda b: True, "") for c in plan.query.conditions])
