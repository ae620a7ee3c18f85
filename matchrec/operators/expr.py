"""Compiled MEASURES/DEFINE expressions and their evaluation inside a (partial) match.

The planner turns each expression into this small IR. Everything that reads a single row
(``price * 1.05``, ``lower(name)``) has already been pushed into DuckDB as an extra input
column, so the IR only holds what depends on the match: navigation (``At``), aggregates
over matched rows (``Agg``), CLASSIFIER, MATCH_NUMBER and the operators that combine them.
Operators run in Python with SQL semantics (three-valued logic, NULL propagation) when the
operand types allow it; anything else is a ``Fallback`` evaluated by DuckDB itself.

Every compiled node is a function ``f(ctx, p)``: ``p`` is the row at which row-local parts
(columns, CLASSIFIER) are read; ``At`` moves ``p`` to the row its navigation selects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable


@dataclass(frozen=True)
class Nav:
    """Logical navigation (FIRST/LAST over rows of ``labels``) plus a physical offset (PREV/NEXT)."""
    labels: frozenset[int] | None  # None: the universal variable (every row)
    last: bool = True
    logical_offset: int = 0
    running: bool = True
    physical_offset: int = 0


class Node:
    pass


@dataclass(frozen=True)
class Const(Node):
    value: Any
    type: str = ""  # DuckDB's type of the value ("" when it goes without saying: NULL, 1)


@dataclass(frozen=True)
class Col(Node):
    index: int  # input column (or pushed expression) read at the row-local position


@dataclass(frozen=True)
class Classifier(Node):
    pass  # label of the row-local position, NULL outside the match


@dataclass(frozen=True)
class MatchNumber(Node):
    pass


@dataclass(frozen=True)
class At(Node):
    nav: Nav
    expr: Node


@dataclass(frozen=True)
class Agg(Node):
    func: str  # a Python-implemented aggregate name, or "fallback"
    labels: frozenset[int] | None
    args: tuple[Node, ...]
    running: bool = True
    distinct: bool = False
    star: bool = False  # count(*)
    filter: Node | None = None
    template: str | None = None  # DuckDB SQL for func == "fallback" (see Fallback)
    extra: tuple = ()  # constant parameters (string_agg separator)
    types: tuple[str, ...] = ()  # DuckDB types of the argument lists (fallback)


@dataclass(frozen=True)
class Op(Node):
    op: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Fallback(Node):
    """An expression DuckDB evaluates: ``template`` is a SELECT reading the argument values as
    columns ``__mr_a0 .. __mr_a{n-1}`` of a one-row relation ``__mr_args`` (``parser.hidden.arg``/``ARGS``)."""
    template: str
    args: tuple[Node, ...]
    types: tuple[str, ...]


class Context:
    """The state an expression is evaluated in; fields are reset per partition / match / row."""

    __slots__ = ("cols", "null_row", "n", "start", "view", "cur", "match_number", "label_names",
                 "fallback", "classifier_visible")

    def __init__(self, label_names: list[str], fallback: Callable):
        self.label_names = label_names
        self.fallback = fallback
        self.cols: list[list] = []
        self.null_row: list = []
        self.n = 0
        self.start = 0
        self.view = None
        self.cur = -1
        self.match_number = 0
        self.classifier_visible = 0  # rows of the match whose label CLASSIFIER may report


# ------------------------------------------------------------------ navigation
def resolve(nav: Nav, ctx: Context) -> int:
    """Absolute row selected by ``nav`` in the current match, or -1."""
    limit = ctx.cur - ctx.start if nav.running else len(ctx.view) - 1
    if limit < 0:
        return -1
    if nav.last:
        if nav.labels is None:
            rel = limit - nav.logical_offset
        else:
            rel = ctx.view.last_index(nav.labels, limit, nav.logical_offset)
    else:
        rel = first_index(ctx.view, nav.labels, limit, nav.logical_offset)
    if rel < 0:
        return -1
    pos = ctx.start + rel + nav.physical_offset
    return pos if 0 <= pos < ctx.n else -1


def first_index(view, labels, limit: int, k: int) -> int:
    if labels is None:
        return k if k <= limit else -1
    found = 0
    for i, label in enumerate(view.as_list()[: limit + 1]):
        if label in labels:
            if found == k:
                return i
            found += 1
    return -1


def rows_of(labels, ctx: Context, running: bool) -> list[int]:
    limit = ctx.cur - ctx.start if running else len(ctx.view) - 1
    if limit < 0:
        return []
    if labels is None:
        return list(range(ctx.start, ctx.start + limit + 1))
    seq = ctx.view.as_list()
    return [ctx.start + i for i in range(limit + 1) if seq[i] in labels]


# ------------------------------------------------------------------ compilation
def compile_node(node: Node) -> Callable:
    if isinstance(node, Const):
        value = node.value
        return lambda ctx, p: value
    if isinstance(node, Col):
        i = node.index

        def col(ctx, p):
            return ctx.cols[i][p] if p >= 0 else ctx.null_row[i]
        return col
    if isinstance(node, Classifier):
        def classifier(ctx, p):
            rel = p - ctx.start
            if p < 0 or rel < 0 or rel >= ctx.classifier_visible:
                return None
            return ctx.label_names[_label_at(ctx.view, rel)]
        return classifier
    if isinstance(node, MatchNumber):
        return lambda ctx, p: ctx.match_number
    if isinstance(node, At):
        inner = compile_node(node.expr)
        nav = node.nav
        if nav.labels is None and nav.last and nav.running and nav.logical_offset == 0:
            off = nav.physical_offset

            def current(ctx, p):  # the common case: a column of the current row (or PREV/NEXT of it)
                if ctx.cur < ctx.start:
                    return inner(ctx, -1)
                q = ctx.cur + off
                return inner(ctx, q if 0 <= q < ctx.n else -1)
            return current
        return lambda ctx, p: inner(ctx, resolve(nav, ctx))
    if isinstance(node, Agg):
        return _compile_agg(node)
    if isinstance(node, Fallback):
        args = [compile_node(a) for a in node.args]
        template, types = node.template, node.types
        return lambda ctx, p: ctx.fallback(template, types, tuple(a(ctx, p) for a in args))
    if isinstance(node, Op):
        return _compile_op(node)
    raise TypeError(node)  # pragma: no cover


def _label_at(view, rel: int) -> int:
    if hasattr(view, "labels"):
        return view.labels[rel]
    node = view.node
    for _ in range(len(view) - 1 - rel):
        node = node.prev
    return node.label


def _compile_op(node: Op) -> Callable:
    args = [compile_node(a) for a in node.args]
    op = node.op
    if op in ("and", "or"):
        # SQL leaves the evaluation order open: a FALSE operand decides AND (TRUE decides OR)
        # even when the other operand fails, as Trino's optimiser makes it.
        a, b = args
        decisive = op == "or"

        def logic(ctx, p):
            try:
                x = a(ctx, p)
            except Exception:  # noqa: BLE001 - re-raised unless the other operand decides
                if b(ctx, p) is decisive:
                    return decisive
                raise
            if x is decisive:
                return decisive
            y = b(ctx, p)
            if y is decisive:
                return decisive
            return None if x is None or y is None else not decisive
        return logic
    if op == "case":  # args: cond1, value1, ..., [else]
        pairs = [(args[i], args[i + 1]) for i in range(0, len(args) - 1, 2)]
        default = args[-1] if len(args) % 2 else (lambda ctx, p: None)

        def case(ctx, p):
            for cond, value in pairs:
                if cond(ctx, p) is True:
                    return value(ctx, p)
            return default(ctx, p)
        return case
    if op == "coalesce":
        def coalesce(ctx, p):
            for a in args:
                v = a(ctx, p)
                if v is not None:
                    return v
            return None
        return coalesce
    if op == "in":
        x, items = args[0], args[1:]

        def in_(ctx, p):
            v = x(ctx, p)
            if v is None:
                return None
            saw_null = False
            for item in items:
                w = item(ctx, p)
                if w is None:
                    saw_null = True
                elif v == w:
                    return True
            return None if saw_null else False
        return in_
    fn = _SCALARS[op]
    if len(args) == 1:
        a = args[0]
        return lambda ctx, p: fn(a(ctx, p))
    if len(args) == 2:
        a, b = args
        return lambda ctx, p: fn(a(ctx, p), b(ctx, p))
    return lambda ctx, p: fn(*(a(ctx, p) for a in args))


def _strict(fn):
    def wrapped(*xs):
        for x in xs:
            if x is None:
                return None
        return fn(*xs)
    return wrapped


def _divide(a, b):
    if b == 0:
        if a == 0 or (isinstance(a, float) and math.isnan(a)):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _between(x, lo, hi):
    left = None if x is None or lo is None else lo <= x
    right = None if x is None or hi is None else x <= hi
    if left is False or right is False:
        return False
    return None if left is None or right is None else True


def _nan_aware(fn):
    """A comparison with DuckDB's floating-point order: NaN equals NaN and sorts above every
    other number (IEEE, and so Python, says every comparison with NaN is false)."""
    def compare(a, b):
        if a is None or b is None:
            return None
        if (type(a) is float and a != a) or (type(b) is float and b != b):
            a_nan, b_nan = a != a, b != b
            return fn((a_nan, 0.0 if a_nan else a), (b_nan, 0.0 if b_nan else b))
        return fn(a, b)
    return compare


_SCALARS: dict[str, Callable] = {
    "not": _strict(lambda a: not a),
    "eq": _nan_aware(lambda a, b: a == b),
    "ne": _nan_aware(lambda a, b: a != b),
    "lt": _nan_aware(lambda a, b: a < b),
    "le": _nan_aware(lambda a, b: a <= b),
    "gt": _nan_aware(lambda a, b: a > b),
    "ge": _nan_aware(lambda a, b: a >= b),
    "is_null": lambda a: a is None,
    "is_not_null": lambda a: a is not None,
    "distinct": lambda a, b: (a is None) != (b is None) or (a is not None and a != b),
    "not_distinct": lambda a, b: not ((a is None) != (b is None) or (a is not None and a != b)),
    "add": _strict(lambda a, b: a + b),
    "sub": _strict(lambda a, b: a - b),
    "mul": _strict(lambda a, b: a * b),
    "div": _strict(lambda a, b: _divide(float(a), float(b))),
    "neg": _strict(lambda a: -a),
    "concat": _strict(lambda a, b: a + b),
    "lower": _strict(lambda a: a.lower()),
    "upper": _strict(lambda a: a.upper()),
    "abs": _strict(abs),
    "between": _between,
}


# ------------------------------------------------------------------ aggregates
def _agg_sum(values):
    values = [v for v in values if v is not None]
    return sum(values[1:], values[0]) if values else None


def _agg_avg(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    total = sum(values[1:], values[0])
    if isinstance(total, Decimal):
        total = float(total)
    return total / len(values)


def _agg_minmax(pick):
    def agg(values):
        values = [v for v in values if v is not None]
        if not values:
            return None
        numbers = [v for v in values if not (type(v) is float and v != v)]
        if len(numbers) < len(values):  # NaN is the largest number, as DuckDB orders them
            return max(values, key=lambda v: type(v) is float and v != v) if pick is max or not numbers \
                else min(numbers)
        return pick(values)
    return agg


def _agg_bool(pick):
    def agg(values):
        values = [v for v in values if v is not None]
        return pick(values) if values else None
    return agg


def _agg_list(values):
    return list(values) if values else None


def _agg_any(values):
    for v in values:
        if v is not None:
            return v
    return None


AGGREGATES: dict[str, Callable] = {
    "count": lambda values: sum(1 for v in values if v is not None),
    "sum": _agg_sum,
    "avg": _agg_avg,
    "min": _agg_minmax(min),
    "max": _agg_minmax(max),
    "bool_and": _agg_bool(all),
    "bool_or": _agg_bool(any),
    "list": _agg_list,
    "any_value": _agg_any,
}


def _distinct(values):
    seen, out = set(), []
    for v in values:
        key = _hashable(v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _hashable(x)) for k, x in v.items())
    return v


def _compile_agg(node: Agg) -> Callable:
    args = [compile_node(a) for a in node.args]
    flt = compile_node(node.filter) if node.filter is not None else None
    labels, running = node.labels, node.running

    def rows(ctx):
        selected = rows_of(labels, ctx, running)
        if flt is not None:
            selected = [r for r in selected if flt(ctx, r) is True]
        return selected

    if node.star:
        return lambda ctx, p: len(rows(ctx))
    if node.func == "fallback":
        template, types = node.template, node.types

        def fallback(ctx, p):
            selected = rows(ctx)
            columns = tuple(tuple(a(ctx, r) for r in selected) for a in args)
            return ctx.fallback(template, types, columns)
        return fallback
    if node.func == "string_agg":
        sep = node.extra[0] if node.extra else ","
        arg = args[0]

        def string_agg(ctx, p):
            values = [arg(ctx, r) for r in rows(ctx)]
            if node.distinct:
                values = _distinct(values)
            values = [v for v in values if v is not None]
            return sep.join(values) if values else None
        return string_agg
    fn = AGGREGATES[node.func]
    arg = args[0]
    distinct = node.distinct

    def aggregate(ctx, p):
        values = [arg(ctx, r) for r in rows(ctx)]
        if distinct:
            values = _distinct(values)
        return fn(values)
    return aggregate


def columns_of(nodes) -> set[int]:
    """Column numbers the given expressions read."""
    used: set[int] = set()

    def walk(n):
        if isinstance(n, Col):
            used.add(n.index)
        for child in getattr(n, "args", ()) or ():
            walk(child)
        if isinstance(n, At):
            walk(n.expr)
        if isinstance(n, Agg) and n.filter is not None:
            walk(n.filter)
    for node in nodes:
        if node is not None:
            walk(node)
    return used


@dataclass
class Compiled:
    """A compiled expression and what the planner learnt about it."""
    node: Node
    fn: Callable = field(init=False)
    history_dependent: bool = False

    def __post_init__(self):
        self.fn = compile_node(self.node)
