"""Code generation: predicates over several variables, aggregates over Kleene variables, conditions
over a Kleene iteration (``IterationCondition``: ``b[i]`` against ``b[i-1]``) and RETURN projections
compiled to Python callables over numpy columns (``planner.cer_vector`` compiles the
same conditions to whole-array evaluators), with the integer bounds that keep arithmetic exact."""
from __future__ import annotations

import datetime
import decimal
import math
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.errors import DataError, ProgrammingError, positioned
from matchrec.operators.cer_reference import Condition, IterationCondition
from matchrec.parser import sase as S
from matchrec.planner.cer.plan import CerPlan
from matchrec.planner.cer.resolve import _Resolver


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
            if isinstance(e.value, (float, decimal.Decimal)):
                return "float"
            return (e.value, e.value) if isinstance(e.value, int) else None
        if isinstance(e, S.Col):
            name = self.res.col(e)
            values, nullable = self.converted_column(name)
            if values.dtype.kind == "f":
                return "float"
            if nullable or e.var in self.kleene:
                return None
            key = ("bounds", name)  # one pass over the column for every condition of the workload reading it
            if key not in self.converted:
                self.converted[key] = int_bounds(values)
            return self.converted[key]
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
            if isinstance(e.value, decimal.Decimal):  # DECIMAL columns are read as DOUBLE here too
                return self.gen(S.Lit(e.span, float(e.value)), rows)
            if isinstance(e.value, (datetime.date, datetime.time)):  # a bound parameter: compared as read
                ident = f"lit_{len(self.ns)}"
                self.ns[ident] = e.value
                return ident, False
            return repr(e.value), e.value is None
        if isinstance(e, S.Col):
            ident, nullable = self.column(self.res.col(e))
            if e.index is not None:  # one event of a Kleene iteration (see step_function)
                return f"{ident}[{'_cur' if e.index == 'i' else '_prev'}]", nullable
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
        if S.iterated(e):
            return self.iteration(e).fn
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

    def iteration(self, e: S.Expr) -> IterationCondition:
        """A condition reading ``b[i]`` / ``b[i-1]`` as an ``IterationCondition``: its step is a
        function of (binding, previous row, current row) of the Kleene variable."""
        (var,) = S.iterated(e)
        code, _ = self.gen(e, {})
        fn = eval(f"lambda b, _prev, _cur: {code}", self.ns)  # noqa: S307 - generated from the parsed query
        text = self.res.q.text[e.span[0]:e.span[1]]

        def step(b, prev, cur, fn=fn, text=text):
            try:
                return fn(b, prev, cur)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError) as err:
                raise DataError(f"Cannot evaluate {text}: {err}") from None
        cond = IterationCondition(S.variables(e), var, step, S.reads_previous(e), text)
        cond.fn.text = text
        return cond


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
        if S.iterated(c):
            out.append(comp.iteration(c))
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


def compile_projections(plan: CerPlan, table: pa.Table, wanted=None) -> list:
    """(projection, variables it reads, compiled function) per RETURN item; with ``wanted`` (a set
    of positions) the others get None instead of a function: compiling converts the columns an
    expression reads to Python values, a pass over the whole read per column."""
    q = plan.query
    comp = PyCompiler(table, _Resolver(q, plan.columns), {v for v, e in q.elements.items() if e.kleene})
    out = []
    for i, p in enumerate(q.projections):
        needs = frozenset(S.variables(p.expr))
        fn = comp.function(p.expr) if wanted is None or i in wanted else None
        out.append((p, needs, fn))
    return out
