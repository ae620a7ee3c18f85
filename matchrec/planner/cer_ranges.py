"""Conditions decided by the value ranges of the events their variables can bind.

A condition between variables - ``abs(e1.distance - e2.distance) < 726`` - holds for every binding
when interval arithmetic over the ranges of the columns it reads, taken over each variable's
candidates, says so: flights to one airport fly about one distance, a sensor's readings stay within
its range. Such a condition filters nothing, and dropping it lets a statement be counted by the
cheaper means reserved for plain sequences (``engine.multi_eval``'s closed forms, counted Kleene
closures). ``decide`` answers True (every binding), False (none) or None (not known); the caller
drops only conditions decided True.

Soundness: the ranges are over a superset of each variable's candidates (its type's events), a
column with a NULL or NaN among them has no range (NULL compares to nothing, so only the other
parts of an AND / OR may decide), and arithmetic on integers is exact as the engine's is
(``planner.cer_vector``: unbounded where 64 bits might not hold). Where a float takes part, a
comparison is decided only with a margin of 1e-9 of the largest magnitude computed on the way,
far beyond what rounding in any order of evaluation can move a value.
"""
from __future__ import annotations

import math
from decimal import Decimal
from typing import Callable

from matchrec.parser import sase as S

# (lo, hi, exact, scale): the values an expression takes lie in [lo, hi]; exact: integers only;
# scale: the largest magnitude of any value computed on the way (the margin of float comparisons)
Interval = tuple

MARGIN = 1e-9

_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>", "!=": "<>"}


def decide(e: S.Expr, range_of: Callable[[S.Col], tuple | None]) -> bool | None:
    """Whether ``e`` holds for every binding (True), for none (False), or either may happen (None).
    ``range_of(col)``: (min, max, exact) of the column over the variable's candidates, or None when
    unknown (not numeric, NULLs or NaN among them, a Kleene variable's)."""
    try:
        return _truth(e, range_of)
    except (OverflowError, ValueError, ArithmeticError):
        return None


def _truth(e: S.Expr, range_of) -> bool | None:
    if isinstance(e, S.Logic):
        parts = [_truth(x, range_of) for x in e.items]
        if e.op == "and":
            return False if False in parts else (True if all(p is True for p in parts) else None)
        return True if True in parts else (False if all(p is False for p in parts) else None)
    if isinstance(e, S.Unary) and e.op == "not":
        t = _truth(e.arg, range_of)
        return None if t is None else not t
    if isinstance(e, S.Between):
        a, lo, hi = (_interval(x, range_of) for x in (e.arg, e.lo, e.hi))
        if a is None or lo is None or hi is None:
            return None
        inside = _and(_compare(">=", a, lo), _compare("<=", a, hi))
        return None if inside is None else inside != e.negated
    if isinstance(e, S.Binary) and e.op in _FLIPPED:
        a, b = _interval(e.left, range_of), _interval(e.right, range_of)
        if a is None or b is None:
            return None
        return _compare(e.op, a, b)
    return None


def _and(x, y):
    if x is False or y is False:
        return False
    return True if x is True and y is True else None


def _compare(op: str, a: Interval, b: Interval) -> bool | None:
    if op in (">", ">="):
        return _compare(_FLIPPED[op], b, a)
    (alo, ahi, aex, asc), (blo, bhi, bex, bsc) = a, b
    tol = 0 if aex and bex else MARGIN * max(asc, bsc)
    if op == "<":
        return True if ahi < blo - tol else (False if alo >= bhi + tol else None)
    if op == "<=":
        return True if ahi <= blo - tol else (False if alo > bhi + tol else None)
    apart = ahi < blo - tol or bhi < alo - tol
    same = aex and bex and alo == ahi == blo == bhi
    if op == "=":
        return True if same else (False if apart else None)
    return False if same else (True if apart else None)  # <> and !=


def _interval(e: S.Expr, range_of) -> Interval | None:
    if isinstance(e, S.Lit):
        v = e.value
        if isinstance(v, bool) or v is None:
            return None
        if isinstance(v, int):
            return (v, v, True, abs(v))
        if isinstance(v, (float, Decimal)):
            f = float(v)
            return (f, f, False, abs(f)) if math.isfinite(f) else None
        return None
    if isinstance(e, S.Col):
        got = range_of(e)
        if got is None:
            return None
        lo, hi, exact = got
        return (lo, hi, exact, max(abs(lo), abs(hi)))
    if isinstance(e, S.Unary) and e.op == "-":
        a = _interval(e.arg, range_of)
        return None if a is None else (-a[1], -a[0], a[2], a[3])
    if isinstance(e, S.Call) and e.name == "abs" and len(e.args) == 1:
        a = _interval(e.args[0], range_of)
        if a is None:
            return None
        lo, hi, exact, scale = a
        if lo >= 0:
            return a
        if hi <= 0:
            return (-hi, -lo, exact, scale)
        return (0, max(-lo, hi), exact, scale)
    if isinstance(e, S.Binary) and e.op in ("+", "-", "*"):
        a, b = _interval(e.left, range_of), _interval(e.right, range_of)
        if a is None or b is None:
            return None
        if e.op == "+":
            lo, hi = a[0] + b[0], a[1] + b[1]
        elif e.op == "-":
            lo, hi = a[0] - b[1], a[1] - b[0]
        else:
            corners = [x * y for x in a[:2] for y in b[:2]]
            lo, hi = min(corners), max(corners)
        exact = a[2] and b[2]
        if not exact and not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        return (lo, hi, exact, max(a[3], b[3], abs(lo), abs(hi)))
    return None
