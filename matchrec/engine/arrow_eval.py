"""Evaluate simple row conditions over a chunk with Arrow compute instead of a DuckDB query.

The compiled matcher's chunk conditions (those reading PREV/NEXT columns) are DuckDB SQL. For
the common shapes - comparisons, AND/OR/NOT, IS [NOT] NULL, + - * on numbers, over columns,
shifted columns and literals - Arrow compute gives the same values with SQL's three-valued
logic and saves a query per chunk. Anything else (casts, functions, division, strings against
numbers, intervals) is refused at plan time and stays with DuckDB, so the two never disagree
on what a condition means. The differential suite checks the fast path, which uses this, against
the reference matcher.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

Evaluator = Callable[[dict], pa.Array]

_COMPARE = {exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge"}
_IEEE = {"eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal, "gt": pc.greater,
         "ge": pc.greater_equal}


def _floating(value) -> bool:
    return pa.types.is_floating(value.type)


def _is_nan(value):
    """Whether each value is NaN; NULL stays NULL (so it cannot decide a comparison)."""
    if _floating(value):
        return pc.is_nan(value)
    if isinstance(value, pa.Scalar):
        return pa.scalar(False if value.is_valid else None, pa.bool_())
    return pc.if_else(pc.is_valid(value), pa.scalar(False), pa.scalar(None, pa.bool_()))


def duck_compare(op: str, a, b):
    """Arrow comparison ``op`` ('eq', 'ne', 'lt', 'le', 'gt', 'ge') with DuckDB's meaning: for
    floating-point values NaN equals NaN and sorts above every other number, where IEEE (and
    Arrow) make every comparison with NaN false. NULL in, NULL out."""
    if not (_floating(a) or _floating(b)):
        return _IEEE[op](a, b)
    if op in ("gt", "ge"):
        return duck_compare("lt" if op == "gt" else "le", b, a)
    a_nan, b_nan = _is_nan(a), _is_nan(b)
    both = pc.and_kleene(a_nan, b_nan)
    if op in ("eq", "ne"):
        eq = pc.or_kleene(pc.equal(a, b), both)
        return eq if op == "eq" else pc.invert(eq)
    number_below_nan = pc.and_kleene(pc.invert(a_nan), b_nan)
    if op == "lt":
        return pc.or_kleene(pc.less(a, b), number_below_nan)
    return pc.or_kleene(pc.or_kleene(pc.less_equal(a, b), number_below_nan), both)
# checked variants: DuckDB raises on integer overflow, so must we (the caller then falls back)
_ARITH = {exp.Add: pc.add_checked, exp.Sub: pc.subtract_checked, exp.Mul: pc.multiply_checked}


class _Refused(Exception):
    pass


def compile_condition(sql: str, types: dict[str, pa.DataType]) -> Evaluator | None:
    """An evaluator of the DuckDB condition ``sql`` over columns of the given Arrow types, or None
    when the condition is outside what this module reproduces exactly."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
        fn, kind = _build(tree, types)
    except (_Refused, sqlglot.errors.SqlglotError):
        return None
    if kind != "bool":
        return None
    return fn


# Kinds of values: 'bool', 'str', 'time:<type>'; numbers are 'int' (64-bit integers and integer
# literals), 'narrow' (narrower integers), 'float' (doubles, literals with an exponent or too long for
# DECIMAL), 'decimal' (literals like 0.1, which DuckDB types DECIMAL), 'float32'.
# Comparisons between numbers go through doubles in both engines, except an integer column
# against a decimal literal, which DuckDB compares exactly: refused. Arithmetic only on 'int'
# and 'float', where both engines compute in the same type (DuckDB keeps narrow integers narrow).
_NUMBERS = {"int", "narrow", "float", "float32", "decimal"}


def _column_kind(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int" if t.bit_width == 64 and pa.types.is_signed_integer(t) else "narrow"
    if pa.types.is_float64(t):
        return "float"
    if pa.types.is_float32(t):
        return "float32"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return f"time:{t}"  # only compared with the very same type
    raise _Refused


def _comparable(lk: str, rk: str, left: exp.Expression, right: exp.Expression) -> bool:
    if "float32" in (lk, rk):  # DuckDB compares a float with a double literal in single precision
        return lk == rk
    if lk in _NUMBERS and rk in _NUMBERS:
        for kind, other, other_node in ((lk, rk, right), (rk, lk, left)):
            if kind in ("int", "narrow") and other in ("float", "decimal") \
                    and isinstance(_strip(other_node), exp.Literal):
                return False
        if lk == rk == "decimal":
            return False
        return True
    return lk == rk


def _strip(node: exp.Expression) -> exp.Expression:
    while isinstance(node, (exp.Paren, exp.Neg)):
        node = node.this
    return node


def _build(node: exp.Expression, types: dict) -> tuple[Callable, str]:
    """(function of the column dict, kind of its values)."""
    if isinstance(node, exp.Paren):
        return _build(node.this, types)
    if isinstance(node, exp.Column):
        name = node.name
        if node.table or name not in types:
            raise _Refused
        return (lambda cols, name=name: cols[name]), _column_kind(types[name])
    if isinstance(node, exp.Literal):
        if node.is_string:
            value = pa.scalar(node.this, pa.string())
            return (lambda cols, v=value: v), "str"
        text = node.this
        try:
            if text.isdigit():
                value, kind = pa.scalar(int(text), pa.int64()), "int"
            elif re.fullmatch(r"\d*\.\d*", text) and len(text.replace(".", "").lstrip("0")) <= 38:
                # DuckDB types 0.1 as DECIMAL: exact with integers, a DOUBLE only next to a DOUBLE
                value, kind = pa.scalar(float(text), pa.float64()), "decimal"
            else:  # 1e5, and decimals too long for DECIMAL: DOUBLE in DuckDB too
                value, kind = pa.scalar(float(text), pa.float64()), "float"
        except (ValueError, OverflowError, pa.ArrowInvalid):
            raise _Refused from None
        return (lambda cols, v=value: v), kind
    if isinstance(node, exp.Boolean):
        value = pa.scalar(bool(node.this), pa.bool_())
        return (lambda cols, v=value: v), "bool"
    if isinstance(node, exp.Neg):
        inner, kind = _build(node.this, types)
        if kind not in ("int", "float", "decimal"):
            raise _Refused
        return (lambda cols: pc.negate_checked(inner(cols))), kind
    if isinstance(node, exp.Not):
        inner, kind = _build(node.this, types)
        if kind != "bool":
            raise _Refused
        return (lambda cols: pc.invert(inner(cols))), "bool"
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise _Refused
        inner, _ = _build(node.this, types)
        return (lambda cols: pc.is_null(inner(cols))), "bool"
    if isinstance(node, (exp.And, exp.Or)):
        left, lk = _build(node.this, types)
        right, rk = _build(node.expression, types)
        if lk != "bool" or rk != "bool":
            raise _Refused
        op = pc.and_kleene if isinstance(node, exp.And) else pc.or_kleene
        return (lambda cols: op(left(cols), right(cols))), "bool"
    for cls, op in _COMPARE.items():
        if type(node) is cls:
            left, lk = _build(node.this, types)
            right, rk = _build(node.expression, types)
            if not _comparable(lk, rk, node.this, node.expression) or lk == "bool" and cls not in (exp.EQ, exp.NEQ):
                raise _Refused
            return (lambda cols: duck_compare(op, left(cols), right(cols))), "bool"
    for cls, op in _ARITH.items():
        if type(node) is cls:
            left, lk = _build(node.this, types)
            right, rk = _build(node.expression, types)
            if "decimal" in (lk, rk) and {lk, rk} != {"decimal", "float"}:
                raise _Refused  # DuckDB computes in DECIMAL, exactly, where Arrow would use doubles
            if lk not in ("int", "float", "decimal") or rk not in ("int", "float", "decimal"):
                raise _Refused
            kind = "int" if lk == rk == "int" else "float"
            return (lambda cols: op(left(cols), right(cols))), kind
    raise _Refused


def evaluate_masks(evaluators: list[tuple[int, Evaluator]], columns: dict, n: int, constant: int):
    """Per row, the OR of ``1 << label`` over labels whose condition is TRUE (NULL counts as
    FALSE), plus ``constant``; None when Arrow refuses (an overflow), for the caller to use DuckDB."""
    out = np.full(n, constant, np.int64)
    try:
        for label, fn in evaluators:
            value = fn(columns)
            if isinstance(value, pa.Scalar):
                if value.is_valid and value.as_py():
                    out |= 1 << label
                continue
            hit = pc.fill_null(value, False).to_numpy(zero_copy_only=False)
            out |= hit.astype(np.int64) << label
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return out
