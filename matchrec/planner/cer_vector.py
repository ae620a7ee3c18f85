"""Compile CER conditions over several variables into numpy functions over arrays of bindings.

``planner.cer.PyCompiler`` compiles a condition into a Python function of one binding (var ->
row). The multi-pattern operator evaluates a condition on many partial matches at once: a
binding there maps each variable to an array of rows. This module compiles the subset of the
expression language whose numpy evaluation gives exactly the Python function's truth value:

  * columns of integer or floating type, read as ``PyCompiler`` reads them (integers as int64,
    DECIMAL as DOUBLE; a DECIMAL of scale 0 such as HUGEINT is exact Python ints: refused), with
    their NULLs as a mask that SQL's three-valued logic carries through the expression;
  * int (within int64), float and boolean literals;
  * ``+ - *`` where the operands' ranges (the columns' minimum and maximum) prove the integer
    result stays within int64 - numpy would wrap around where ``PyCompiler`` computes exactly -,
    ``/`` (NULL when the divisor is 0), unary minus, comparisons, AND / OR / NOT with
    SQL's three-valued logic, BETWEEN, IN (...), IS [NOT] NULL and ``abs``.

Anything else (strings, casts, other functions, ``%``, aggregates, Kleene variables, NULL
literals) returns None and the caller calls the Python function per binding instead. A
compiled function raising at run time (numpy refusing an operation on booleans, say) is also
the caller's cue to fall back to the Python function for that batch, which raises the same
error the single-statement path would.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from matchrec.parser import sase as S
from matchrec.planner.cer.codegen import arithmetic_bounds, fits_int64, int_bounds, python_column

__all__ = ["VectorColumns", "compile_condition"]

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# a compiled expression: binding (var -> rows) -> (values, NULL mask or None when never NULL)
Vec = Callable[[dict], tuple]


class VectorColumns:
    """The columns of one read table as numpy arrays, converted once and shared by every condition."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.cache: dict[str, np.ndarray | None] = {}

    def get(self, name: str) -> np.ndarray | None:
        """The column as ``PyCompiler`` reads a NULL-free numeric column (NULLs read as 0, see
        ``nulls``), or None when it is not a numeric one."""
        if name not in self.cache:
            arr = self.table.column(name)
            mask = None
            t = arr.type
            if arr.null_count > 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)
                                       or (pa.types.is_decimal(t) and t.scale > 0)) and not pa.types.is_uint64(t):
                # the same numbers as the Python function reads, NULL marked apart (three-valued logic);
                # never through python_column, whose object array of such a column is not needed here
                arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
                mask = arr.is_null().to_numpy(zero_copy_only=False)
                kind = pa.int64() if pa.types.is_integer(arr.type) else pa.float64()
                values = arr.cast(kind).fill_null(0).to_numpy()
            else:
                values, _ = python_column(arr)
            ok = values.dtype.kind in "if"
            # the mask first: a column present means its mask is (threads of the shared operator
            # read the cache while another fills it)
            self.cache[("nulls", name)] = mask if ok else None
            self.cache[name] = values if ok else None
        return self.cache[name]

    def nulls(self, name: str) -> np.ndarray | None:
        """Where the column is NULL, or None when it never is."""
        self.get(name)
        return self.cache[("nulls", name)]

    def floats(self, name: str) -> np.ndarray | None:
        """The column as float64, NaN where NULL (None: not a numeric one)."""
        key = ("floats", name)
        if key not in self.cache:
            values = self.get(name)
            if values is not None:
                values = values.astype(np.float64)
                nulls = self.nulls(name)
                if nulls is not None:
                    values = np.where(nulls, np.nan, values)
            self.cache[key] = values
        return self.cache[key]

    def bounds(self, name: str):
        """(min, max) of an integer column, "float" for a floating-point one."""
        key = ("bounds", name)
        if key not in self.cache:
            values = self.get(name)
            self.cache[key] = "float" if values is not None and values.dtype.kind == "f" else \
                (int_bounds(values) if values is not None else None)
        return self.cache[key]


def compile_condition(e: S.Expr, resolve: Callable[[S.Col], str], columns: VectorColumns,
                      kleene: set) -> Callable[[dict], np.ndarray] | None:
    """A function of a binding of arrays (var -> int64 rows, all of one length) returning the
    condition's truth per element (NULL is false), or None when ``e`` is outside the subset."""
    try:
        fn = _Compiler(resolve, columns, kleene).gen(e)
    except _Unsupported:
        return None

    def truth(b: dict, fn=fn) -> np.ndarray:
        n = len(next(iter(b.values())))
        with np.errstate(all="ignore"):
            v, null = fn(b)
            if isinstance(v, np.ndarray) and v.dtype == bool and v.shape == (n,):
                if null is None:
                    return v  # a fresh comparison result: no copy needed
                if isinstance(null, np.ndarray) and null.dtype == bool and null.shape == (n,):
                    return v & ~null  # a nullable column read per element: no broadcast, one array made
            out = np.broadcast_to(np.asarray(v).astype(bool), (n,))
            if null is not None:
                out = out & ~np.broadcast_to(null, (n,))
        return np.array(out, dtype=bool)
    return truth


class _Unsupported(Exception):
    pass


def _arithmetic(e: S.Expr) -> bool:
    return (isinstance(e, S.Binary) and e.op in ("+", "-", "*")) or (isinstance(e, S.Unary) and e.op == "-") \
        or (isinstance(e, S.Call) and e.name == "abs")


def _or_null(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a | b


class _Compiler:
    def __init__(self, resolve, columns: VectorColumns, kleene: set):
        self.resolve, self.columns, self.kleene = resolve, columns, kleene

    def range_of(self, e: S.Expr):
        """As ``PyCompiler.bounds``: an int64-safe integer range, "float", or None (unknown)."""
        if isinstance(e, S.Lit):
            if isinstance(e.value, bool) or not isinstance(e.value, (int, float)):
                return None
            return "float" if isinstance(e.value, float) else (e.value, e.value)
        if isinstance(e, S.Col):
            return None if e.var in self.kleene else self.columns.bounds(self.resolve(e))
        if (isinstance(e, S.Binary) and e.op in ("+", "-", "*", "/")) or (isinstance(e, S.Unary) and e.op == "-"):
            return arithmetic_bounds(e, self.range_of)
        if isinstance(e, S.Call) and e.name == "abs" and len(e.args) == 1:
            a = self.range_of(e.args[0])
            if a == "float" or a is None:
                return a
            top = max(abs(a[0]), abs(a[1]))
            return (0, top) if fits_int64((0, top)) else None
        return None

    def gen(self, e: S.Expr) -> Vec:
        if isinstance(e, (S.Binary, S.Unary, S.Call)) and self.range_of(e) is None and _arithmetic(e):
            raise _Unsupported  # integer arithmetic that may leave int64: exact in Python instead
        if isinstance(e, S.Lit):
            v = e.value
            if isinstance(v, bool) or isinstance(v, float) or (isinstance(v, int) and INT64_MIN <= v <= INT64_MAX):
                return lambda b, v=v: (v, None)
            raise _Unsupported
        if isinstance(e, S.Col):
            if e.var in self.kleene:
                raise _Unsupported
            name = self.resolve(e)
            col, null = self.columns.get(name), self.columns.nulls(name)
            if col is None:
                raise _Unsupported
            if null is not None:
                return lambda b, col=col, null=null, var=e.var: (col[b[var]], null[b[var]])
            return lambda b, col=col, var=e.var: (col[b[var]], None)
        if isinstance(e, S.Call):
            if e.name == "abs" and len(e.args) == 1:
                x = self.gen(e.args[0])

                def f(b, x=x):
                    v, n = x(b)
                    return np.abs(v), n
                return f
            raise _Unsupported
        if isinstance(e, S.Unary):
            x = self.gen(e.arg)
            if e.op == "-":
                def f(b, x=x):
                    v, n = x(b)
                    return np.negative(v), n
                return f

            def g(b, x=x):
                v, n = x(b)
                return ~np.asarray(v).astype(bool), n
            return g
        if isinstance(e, S.Binary):
            return self.binary(e.op, self.gen(e.left), self.gen(e.right))
        if isinstance(e, S.Logic):
            items = [self.gen(i) for i in e.items]
            return self.logic(e.op, items)
        if isinstance(e, S.Between):
            x, lo, hi = self.gen(e.arg), self.gen(e.lo), self.gen(e.hi)
            f = self.logic("and", [self.binary(">=", x, lo), self.binary("<=", x, hi)])
            return self.negate(f) if e.negated else f
        if isinstance(e, S.IsNull):
            x = self.gen(e.arg)

            def f(b, x=x, negated=e.negated):
                _, n = x(b)
                if n is None:
                    return negated, None
                return (~n if negated else n), None
            return f
        if isinstance(e, S.InList):
            x = self.gen(e.arg)
            items = [self.gen(i) for i in e.items]
            eqs = [self.binary("=", x, i) for i in items]

            def f(b, x=x, eqs=eqs):
                # _in: NULL when x is NULL; else true when some item equals it; else NULL when an item is NULL
                _, xn = x(b)
                hit, item_null = False, None
                for eq, item in zip(eqs, items):
                    v, _ = eq(b)
                    _, n = item(b)
                    v = np.asarray(v).astype(bool)
                    if n is not None:
                        v = v & ~n
                        item_null = _or_null(item_null, n)
                    hit = hit | v
                null = None
                if item_null is not None:
                    null = ~hit & item_null
                null = _or_null(null, xn)
                return hit, null
            return self.negate(f) if e.negated else f
        raise _Unsupported

    @staticmethod
    def negate(f: Vec) -> Vec:
        def g(b, f=f):
            v, n = f(b)
            return ~np.asarray(v).astype(bool), n
        return g

    @staticmethod
    def binary(op: str, left: Vec, right: Vec) -> Vec:
        if op in ("%", "||"):
            raise _Unsupported
        if op == "/":
            def div(b):
                a, na = left(b)
                c, nc = right(b)
                zero = np.asarray(c) == 0
                return np.true_divide(a, c), _or_null(_or_null(na, nc), zero if zero.any() else None)
            return div
        fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "=": np.equal, "<>": np.not_equal, "<": np.less,
              "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}[op]

        def f(b):
            a, na = left(b)
            c, nc = right(b)
            return fn(a, c), _or_null(na, nc)
        return f

    @staticmethod
    def logic(op: str, items: list) -> Vec:
        def f(b):
            vals, nulls = [], []
            for item in items:
                v, n = item(b)
                vals.append(np.asarray(v).astype(bool))
                nulls.append(n)
            if all(n is None for n in nulls):
                out = vals[0]
                for v in vals[1:]:
                    out = (out & v) if op == "and" else (out | v)
                return out, None
            decided = False  # and: some operand false; or: some operand true
            unknown = False
            for v, n in zip(vals, nulls):
                known = v if op == "or" else ~v
                if n is not None:
                    known = known & ~n
                    unknown = unknown | n
                decided = decided | known
            null = ~decided & unknown
            return (decided if op == "or" else ~decided), null
        return f
