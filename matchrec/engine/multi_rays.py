"""Conditions read as intervals of one variable's column (``run_many``'s counted extensions).

A condition such as ``b.x - a.x > 4`` holds, for fixed bindings of its other variables, for every
value of ``b.x`` from some threshold on: its truth is monotone in ``b.x``. This module finds such
forms in a condition's tree and compiles each as *rays*: compiled comparisons whose truth, for a
fixed binding of the other variables, is false then true (an up-ray) or true then false (a
down-ray) along the sorted values of one column of one variable. The shared operator
(``operators.cer_shared``) then counts a leaf's extensions per partial match by a binary search
over the candidates' distinct values and a count over ranks, instead of evaluating the condition
on every candidate.

What is read as rays, for a variable ``v`` whose column is referenced exactly once in the
condition (no other column of ``v`` either):
  * a comparison ``< <= > >=`` of two sides built with ``+``, ``-``, unary minus, and ``*`` or
    ``/`` by a non-zero numeric literal (each monotone, so is their composition: integer
    arithmetic the compiled form accepts stays exact, floating-point rounding is monotone);
    ``=`` as ``>=`` and ``<=``;
  * ``abs(E) < c`` (``<=``, or ``c > abs(E)``) as ``E < c`` and ``-E < c``, which is exact;
  * ``BETWEEN`` (not negated) and ``AND`` of those, and of comparisons not reading ``v`` (their
    truth does not depend on ``v``: a ray either way).
NULL and NaN make every comparison false in the compiled form: a candidate whose value is NULL or
NaN takes no rank and is never counted, and a binding of the other variables whose side is NULL
or NaN finds an empty interval. Each ray is the compiled form (``planner.cer_vector``) of a
comparison, so the count equals the number of candidates on which the compiled condition holds.

Each ray also carries a *guess* of where it flips: the comparison solved for the column (``x op
T``, ``T`` an expression of the other variables, moved across by the inverse of each step that
built the side) and computed in floating point. The search checks the guess at its rank and the
rank below with the compiled comparison, which decides; only the bindings where the guess misses
(rounding, integer division, a NULL) are searched by halving. A guess can cost time, never a
wrong count.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from matchrec.parser import sase as S
from matchrec.planner.cer_vector import VectorColumns, compile_condition
from matchrec.planner.sharing import render

__all__ = ["Rays", "RayForms", "rays_of"]

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass
class Rays:
    """A condition as rays of variable ``var``'s column ``column`` (``values``, NULL mask ``nulls``):
    ``rays`` holds (compiled comparison, True for an up-ray)."""
    var: str
    column: str
    values: object
    nulls: object
    rays: list
    # per ray: (binding -> float64 threshold per binding, searchsorted side) where the comparison
    # solves for the column, else None
    guesses: list = None


class RayForms:
    """A condition's ``Rays`` per variable, found and compiled when first asked for (most
    conditions never decide a counted leaf): ``get(var)`` is the ``Rays`` or None.

    ``shared`` (one dict for a workload's statements over one table) holds them by the
    condition's ``template`` (``planner.sharing.condition_template``: resolved columns, variables
    as placeholders) with its variables numbered in order of appearance: a workload's statements
    repeat a few conditions under other variable names (a hundred statements of ``bench.multi``
    hold 220-400 conditions read as rays but 12 forms), so each form is found and compiled once and
    the others call it with their bindings renamed."""

    def __init__(self, expr: S.Expr, resolve, columns: VectorColumns, kleene: set, template: tuple | None = None,
                 shared: dict | None = None):
        self.args = (expr, resolve, columns, kleene)
        self.found: dict = {}
        self.template, self.shared = template, shared

    def get(self, var: str):
        if var not in self.found:
            self.found[var] = self._shared(var) if self.shared is not None and self.template is not None \
                else self._find(var)
        return self.found[var]

    def _find(self, var: str):
        expr, resolve, columns, kleene = self.args
        if var in kleene:
            return None
        try:
            return _for_var(expr, var, resolve, columns, kleene)
        except _No:
            return None

    def _shared(self, var: str):
        names = list(dict.fromkeys(p[1] for p in self.template if not isinstance(p, str)))
        if var not in names:
            return self._find(var)
        kleene = self.args[3]
        number = {v: i for i, v in enumerate(names)}
        key = (render(self.template, number), tuple(v in kleene for v in names), number[var])
        hit = self.shared.get(key)
        if hit is None:
            hit = self.shared[key] = (self._find(var), names)
        found, first = hit
        if found is None or first == names:
            return found
        return _renamed(found, var, [(o, n) for o, n in zip(first, names)])


def _renamed(r: Rays, var: str, pairs: list) -> Rays:
    """``r`` (found for another statement's condition of the same form) for this one: its
    functions take this statement's bindings, renamed to the first one's variables."""
    def call(fn):
        def renamed(b, fn=fn):
            return fn({old: b[new] for old, new in pairs if new in b} or b)
        return renamed
    return Rays(var, r.column, r.values, r.nulls, [(call(vec), up) for vec, up in r.rays],
                None if r.guesses is None else [None if g is None else (call(g[0]), g[1]) for g in r.guesses])


def rays_of(expr: S.Expr, resolve, columns: VectorColumns, kleene: set) -> dict:
    """var -> ``Rays`` for every variable of ``expr`` whose column the condition reads as rays."""
    out = {}
    for var in sorted(S.variables(expr) - kleene):
        try:
            got = _for_var(expr, var, resolve, columns, kleene)
        except _No:
            continue
        if got is not None:
            out[var] = got
    return out


class _No(Exception):
    pass


def _for_var(expr, var, resolve, columns, kleene):
    refs = [n for n in S.walk(expr) if isinstance(n, (S.Col, S.Var)) and n.var == var]
    if len(refs) != 1 or not isinstance(refs[0], S.Col) or refs[0].index is not None:
        raise _No
    column = resolve(refs[0])
    values = columns.get(column)
    if values is None:
        raise _No
    comparisons = []  # (comparison expression, up) or (expression not reading var, None)
    _split(expr, var, comparisons)
    rays, guesses = [], []
    for e, up in comparisons:
        vec = compile_condition(e, resolve, columns, kleene)
        if vec is None:
            raise _No
        rays.append((vec, True if up is None else up))
        guesses.append(None if up is None else _guess(e, var, resolve, columns, kleene))
    if not rays:
        raise _No
    return Rays(var, column, values, columns.nulls(column), rays, guesses)


_SIDE = {">": "right", ">=": "left", "<": "left", "<=": "right"}  # the first rank flipped of x op T


def _guess(e: S.Binary, var: str, resolve, columns, kleene):
    """(threshold function, side) of the comparison ``e`` (its left side reads ``var``) solved for
    the column, or None."""
    op, side, other = e.op, e.left, e.right
    while not isinstance(side, S.Col):
        if isinstance(side, S.Unary) and side.op == "-":
            side, other, op = side.arg, S.Unary(e.span, "-", other), _FLIP[op]
        elif isinstance(side, S.Binary) and side.op in ("+", "-") and _reads(side.left, var):
            inv = "-" if side.op == "+" else "+"
            side, other = side.left, S.Binary(e.span, inv, other, side.right)
        elif isinstance(side, S.Binary) and side.op == "+":
            side, other = side.right, S.Binary(e.span, "-", other, side.left)
        elif isinstance(side, S.Binary) and side.op == "-":  # c - x op T: x flipped-op c - T
            side, other, op = side.right, S.Binary(e.span, "-", side.left, other), _FLIP[op]
        elif isinstance(side, S.Binary) and side.op in ("*", "/"):
            left = _reads(side.left, var)
            if side.op == "/" and not left:  # k / x is not monotone over the column's sign change
                return None
            k = side.right if left else side.left
            other = S.Binary(e.span, "/" if side.op == "*" else "*", other, k)
            if _literal(k) < 0:
                op = _FLIP[op]
            side = side.left if left else side.right
        else:
            return None
    fn = _float_value(other, resolve, columns, kleene)
    return None if fn is None else (fn, _SIDE[op])


def _float_value(e, resolve, columns, kleene):
    """``e`` (no reference to a Kleene variable) as a function of a binding giving float64 values
    per binding, NaN where NULL; None outside ``+ - * /``, numeric literals and columns."""
    if isinstance(e, S.Lit):
        if isinstance(e.value, bool) or not isinstance(e.value, (int, float)):
            return None
        v = float(e.value)
        return lambda b: v
    if isinstance(e, S.Col):
        if e.var in kleene or e.index is not None:
            return None
        name = resolve(e)
        values = columns.floats(name)
        if values is None:
            return None
        return lambda b, var=e.var: values[b[var]]
    if isinstance(e, S.Unary) and e.op == "-":
        f = _float_value(e.arg, resolve, columns, kleene)
        return None if f is None else (lambda b: -f(b))
    if isinstance(e, S.Binary) and e.op in _ARITH:
        f, g = _float_value(e.left, resolve, columns, kleene), _float_value(e.right, resolve, columns, kleene)
        if f is None or g is None:
            return None
        fn = _ARITH[e.op]
        return lambda b: fn(f(b), g(b))
    return None


_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


def _reads(e, var) -> bool:
    return any(isinstance(n, (S.Col, S.Var)) and n.var == var for n in S.walk(e))


def _split(e, var, out: list) -> None:
    if not _reads(e, var):
        out.append((e, None))
        return
    if isinstance(e, S.Logic) and e.op == "and":
        for item in e.items:
            _split(item, var, out)
        return
    if isinstance(e, S.Between) and not e.negated:
        _split(S.Binary(e.span, ">=", e.arg, e.lo), var, out)
        _split(S.Binary(e.span, "<=", e.arg, e.hi), var, out)
        return
    if not isinstance(e, S.Binary) or e.op not in ("<", "<=", ">", ">=", "="):
        raise _No
    if e.op == "=":
        _split(S.Binary(e.span, ">=", e.left, e.right), var, out)
        _split(S.Binary(e.span, "<=", e.left, e.right), var, out)
        return
    op, left, right = e.op, e.left, e.right
    if _reads(right, var):  # the variable on the left
        op, left, right = _FLIP[op], right, left
    if isinstance(left, S.Call) and left.name == "abs" and len(left.args) == 1 and op in ("<", "<="):
        inner = left.args[0]  # |E| < c exactly when E < c and -E < c
        _split(S.Binary(e.span, op, inner, right), var, out)
        _split(S.Binary(e.span, op, S.Unary(e.span, "-", inner), right), var, out)
        return
    sign = _sign(left, var)
    out.append((S.Binary(e.span, op, left, right), (sign > 0) == (op in (">", ">="))))


def _sign(e, var) -> int:
    """+1 / -1: ``e`` grows / shrinks with the variable's one column; 0: does not read it."""
    if not _reads(e, var):
        return 0
    if isinstance(e, S.Col):
        return 1
    if isinstance(e, S.Unary) and e.op == "-":
        return -_sign(e.arg, var)
    if isinstance(e, S.Binary) and e.op in ("+", "-"):
        a, b = _sign(e.left, var), _sign(e.right, var)
        return a if a else (b if e.op == "+" else -b)
    if isinstance(e, S.Binary) and e.op in ("*", "/"):
        if _reads(e.left, var):
            k = _literal(e.right)
            return _sign(e.left, var) * k
        if e.op == "*":
            return _sign(e.right, var) * _literal(e.left)
    raise _No


def _literal(e) -> int:
    """The sign of a non-zero numeric literal (maybe negated); else not a ray."""
    neg = 1
    while isinstance(e, S.Unary) and e.op == "-":
        neg, e = -neg, e.arg
    if isinstance(e, S.Lit) and isinstance(e.value, (int, float)) and not isinstance(e.value, bool) and e.value:
        if e.value != e.value:  # NaN
            raise _No
        return neg if e.value > 0 else -neg
    raise _No
