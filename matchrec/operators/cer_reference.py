"""Complex event recognition: the pattern model and the reference semantics.

This module owns what a CER pattern *means*. The pattern nodes themselves (``Element``, ``Seq``,
``And``, ``Or``) are the matchers' pattern form, in ``operators.pattern_ir``; this module holds what the
mechanisms evaluate around them: ``Pattern`` (the nodes with a window, a strategy, and filters and
conditions compiled to functions and masks), ``Condition`` and ``Events``. Every evaluation mechanism (eager NFA, lazy chain
and tree NFAs, recomputation for Kleene closure) must return exactly what ``reference_matches``
returns; it enumerates bindings by brute force and is meant for small inputs only.

Patterns
    ``Element(type, var)``: one event of ``type`` bound to ``var`` (type None: any event; its
    filter decides, as for a MATCH_RECOGNIZE variable);
    ``Element(..., kleene=(lo, hi))``: ``T+ v`` - one or more events (``hi`` None: unbounded);
    ``Element(..., negated=True)``: ``~T v`` - no such event (see negation below);
    ``Seq(items)``, ``And(items)``, ``Or(items)`` nest freely.

Events are rows sorted by (partition, key, input position); ``key`` is the ORDER BY key as an
integer (epoch microseconds for times). A match binds every positive variable of one
alternative to a row (Kleene: a tuple of rows in key order), all in one partition.

The rules
    * Order (tie rule): SEQ(x, y) needs every event of x to have a key strictly below every
      event of y; events with equal keys are never in sequence with each other. Kleene events
      have strictly increasing keys too.
    * AND(x, y, ...) matches the items in any order: it is OR over the permutations of its items
      as SEQ (so two items with equal keys are not matched together either). The mechanisms may
      evaluate it without the permutations; see "Conjunction without permutations" below.
    * OR(x, y) is the union of the alternatives' matches. A pattern is first rewritten into its
      alternatives: linear chains of elements (``alternatives``).
    * Window (inclusive): last.key - first.key <= W over the positive events of the match.
    * Negation between positive neighbours p and n of a chain: no event of the negated type
      with p.key < key < n.key satisfying the negated element's conditions (its own filter and
      the conditions linking it to bound variables). A leading negated element looks at
      [last.key - W, first.key), a trailing one at (last.key, first.key + W].
    * Conditions: ``filters[var]`` test one event (for a Kleene variable: every event of it);
      ``conditions`` test a binding (variables they name must be bound; Kleene variables appear
      as tuples, for aggregates and for ``IterationCondition``, which tests consecutive events
      of one Kleene variable, ``b[i]`` against ``b[i-1]``, in key order). NULL (None) counts as
      false.
    * Selection strategies, on the positive events of a chain in stream order x1 < x2 < ...:
      - ``any`` (skip-till-any-match): every binding that satisfies the rules above;
      - ``next`` (skip-till-next-match): additionally, no event strictly between consecutive
        xj, xj+1 was relevant at that point: it could neither start the element xj+1 belongs
        to (type, filter, and the conditions whose variables are all bound by then), nor be
        taken by the Kleene element xj belongs to while that element can still grow;
      - ``strict`` (strict contiguity): consecutive positive events are adjacent rows of the
        partition (no row between them at all).

Conjunction without permutations (``orders``)
    The same matches can be stated without expanding AND: an alternative is then a partial order
    (``Order``) - its elements, the pairs ``before`` (every event of one element has a key below
    every event of the other: SEQ relates every element of an item to every element of a later
    item, transitively so) and, per AND, ``apart``: its items' element sets, whose key spans
    [first key, last key] must be pairwise disjoint. That is exactly the OR of the permutations
    under skip-till-any-match: a permutation chain asks that consecutive items' events be in
    order, and spans that are pairwise disjoint can be put in order in exactly one way (the
    permutation is decided by the binding, so the union of the permutations holds no binding
    twice). For items of one single event each, "disjoint spans" is "distinct keys"; for an item
    of several events it is stronger: AND(SEQ(a, b), c) has no match with c between a and b, and
    AND(a+, c) none with c between two events of a. Nested ANDs keep their own spans:
    AND(AND(a, b), c) never puts c between a and b, AND(a, b, c) may.
    A negated element outside every such AND has a range that does not depend on the
    permutation: its neighbours in a chain are the latest positive element before it (the
    largest last key among the elements ``before`` it) and the earliest after it (the smallest
    first key among those after it); with none before (after) it is leading (trailing), as in a
    chain. A negated element inside an AND has neighbours from the other items that change with
    the permutation, and skip-till-next-match / strict contiguity relate each event to the next
    one in the permutation chain. So an AND is kept as one partial order (``linear``) when the
    strategy is skip-till-any-match and no element inside it is negated; every other AND is
    expanded into its permutations as before (an AND inside a kept one may be expanded, an AND
    inside an expanded one may be kept).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from matchrec import budget
from matchrec.errors import OperationalError
# the pattern nodes (operators.pattern_ir); importable from here too, as before
from matchrec.operators.pattern_ir import And, Element, Or, Seq
from matchrec.operators.pattern_ir import CerNode as Node
from matchrec.parser.cer_tree import STRATEGIES


@dataclass
class Condition:
    """A predicate over several variables (or an aggregate over a Kleene variable)."""
    vars: frozenset
    fn: Callable[[dict], object]  # binding var -> row (Kleene: tuple of rows) -> truth value
    text: str = ""


class IterationCondition(Condition):
    """A condition over the iteration of Kleene variable ``var`` (``b[i].price > b[i-1].price``,
    ``b[i].price > a.price``): it holds for a binding when ``step(binding, prev, cur)`` holds for
    every event ``cur`` of ``var`` (``prev``: the event before it, None for the first), except the
    first one when it reads the previous event (``uses_prev``). ``step`` reads ``var``'s events
    only through ``prev`` and ``cur`` and the other variables of ``vars`` from the binding, so a
    mechanism may check it event by event while it builds the closure, in key order: a sequence
    that fails it at one event fails it whatever follows."""

    def __init__(self, vars, var: str, step: Callable, uses_prev: bool, text: str = ""):
        def fn(binding: dict) -> bool:
            rows = binding[var]
            rows = rows if isinstance(rows, tuple) else (rows,)
            prev = None
            for k, r in enumerate(rows):
                if (k or not uses_prev) and not _truth(step(binding, prev, r)):
                    return False
                prev = r
            return True
        super().__init__(frozenset(vars), fn, text)
        self.var, self.step, self.uses_prev = var, step, uses_prev
        self.others = self.vars - {var}

    def first_ok(self, binding: dict, row) -> bool:
        """Whether ``row`` may be the first event of the iteration."""
        return self.uses_prev or _truth(self.step(binding, None, row))

    def next_ok(self, binding: dict, prev, row) -> bool:
        """Whether ``row`` may follow ``prev`` in the iteration."""
        return _truth(self.step(binding, prev, row))


@dataclass
class Pattern:
    root: Node
    window: int
    strategy: str = "any"
    # var -> row -> truth value, or var -> numpy bool array over the rows (computed in bulk)
    filters: dict[str, Callable[[int], object] | np.ndarray] = field(default_factory=dict)
    conditions: list[Condition] = field(default_factory=list)


@dataclass
class Events:
    key: np.ndarray  # int64, sorted within each partition
    type: list  # event type per row
    partition: np.ndarray | None = None  # int64 partition id per row (rows grouped by it)

    def __len__(self) -> int:
        return len(self.key)


def alternatives(node: Node) -> list[tuple[Element, ...]]:
    """The pattern as OR of linear chains (AND expanded into permutations of its items)."""
    check_expansion(count_alternatives(node, None), len(leaves(node)))
    return _alternatives(node)


def _alternatives(node: Node) -> list[tuple[Element, ...]]:
    if isinstance(node, Element):
        return [(node,)]
    if isinstance(node, Or):
        return [c for item in node.items for c in _alternatives(item)]
    if isinstance(node, Seq):
        out = [()]
        for item in node.items:
            out = [a + b for a in out for b in _alternatives(item)]
        return out
    if isinstance(node, And):
        out = []
        for perm in itertools.permutations(node.items):
            out += _alternatives(Seq(tuple(perm)))
        return out
    raise TypeError(f"not a pattern node: {node!r}")


def element_sets(node: Node) -> list[tuple[Element, ...]]:
    """The elements of each alternative, in the order written: ``alternatives`` without the
    permutations of an AND (they all hold the same elements)."""
    return alternatives(as_sequence(node))


def as_sequence(node: Node) -> Node:
    """``node`` with every AND read as a SEQ of its items."""
    if isinstance(node, Element):
        return node
    items = tuple(as_sequence(item) for item in node.items)
    return Or(items) if isinstance(node, Or) else Seq(items)


def count_alternatives(node: Node, strategy: str | None) -> int:
    """How many alternatives ``alternatives`` (strategy None) or ``orders`` builds, computed
    without building them."""
    if isinstance(node, Element):
        return 1
    counts = [count_alternatives(item, strategy) for item in node.items]
    if isinstance(node, Or):
        return sum(counts)
    product = math.prod(counts)
    if isinstance(node, And) and not (strategy is not None and linear(node, strategy)):
        product *= math.factorial(len(node.items))
    return product


def check_expansion(count: int, elements: int) -> None:
    """Refuse to build ``count`` alternatives of ``elements`` elements when they alone would
    take more memory than the statement's budget allows."""
    need = count * (64 + 16 * elements + 8 * elements * elements)  # tuples, and an order's pairs
    limit = budget.current().max_memory_mb
    if need > limit << 20:
        raise OperationalError(
            f"The pattern expands into {count:,} alternatives (an AND of k items into k! orders), which would "
            f"need about {need >> 20:,} MB before matching starts; write fewer items in AND, or raise the limit "
            f"with SET matchrec_max_memory_mb = <n>")


@dataclass(frozen=True)
class Order:
    """One alternative as a partial order (see "Conjunction without permutations" above).

    ``elements`` are in pattern order, which is consistent with ``before``; ``before`` holds the
    pairs (i, j) of element indices, transitively closed, negated elements included; ``apart``
    holds, per AND kept linear, its items as frozensets of element indices (positive elements
    only: such an AND holds no negated element). Without ``apart`` the order is a chain: every
    pair of elements is ordered and ``elements`` is that chain."""
    elements: tuple
    before: frozenset
    apart: tuple = ()

    @property
    def is_chain(self) -> bool:
        return not self.apart


def linear(node: And, strategy: str) -> bool:
    """Whether ``orders`` keeps the AND ``node`` as one partial order instead of permutations."""
    return strategy == "any" and not any(e.negated for e in leaves(node))


def leaves(node: Node) -> list[Element]:
    if isinstance(node, Element):
        return [node]
    return [e for item in node.items for e in leaves(item)]


def orders(node: Node, strategy: str = "any") -> list[Order]:
    """The pattern as OR of partial orders: the ANDs that ``linear`` accepts stay one order, the
    others are expanded into permutations. With no AND kept, these are ``alternatives``' chains."""
    check_expansion(count_alternatives(node, strategy), len(leaves(node)))
    return [Order(el, frozenset(bf), tuple(ap)) for el, bf, ap in _orders(node, strategy)]


def _orders(node: Node, strategy: str) -> list[tuple]:
    if isinstance(node, Element):
        return [((node,), (), ())]
    if isinstance(node, Or):
        return [o for item in node.items for o in _orders(item, strategy)]
    if isinstance(node, Seq):
        out = [((), (), ())]
        for item in node.items:
            parts = _orders(item, strategy)
            nxt = []
            for el, bf, ap in out:
                n = len(el)
                for el2, bf2, ap2 in parts:
                    m = len(el2)
                    order = tuple((i, n + j) for i in range(n) for j in range(m))
                    nxt.append((el + el2, bf + _shift(bf2, n) + order, ap + _shift_groups(ap2, n)))
            out = nxt
        return out
    if isinstance(node, And):
        if not linear(node, strategy):
            return [o for perm in itertools.permutations(node.items) for o in _orders(Seq(tuple(perm)), strategy)]
        out = [((), (), (), ())]  # elements, before, apart, the items' element sets
        for item in node.items:
            parts = _orders(item, strategy)
            nxt = []
            for el, bf, ap, items in out:
                n = len(el)
                for el2, bf2, ap2 in parts:
                    nxt.append((el + el2, bf + _shift(bf2, n), ap + _shift_groups(ap2, n),
                                items + (frozenset(range(n, n + len(el2))),)))
            out = nxt
        return [(el, bf, ap + (items,)) for el, bf, ap, items in out]
    raise TypeError(f"not a pattern node: {node!r}")


def _shift(pairs: tuple, n: int) -> tuple:
    return tuple((i + n, j + n) for i, j in pairs)


def _shift_groups(groups: tuple, n: int) -> tuple:
    return tuple(tuple(frozenset(i + n for i in item) for item in g) for g in groups)


def _truth(value) -> bool:
    return value is not None and bool(value)


def _ok_filter(p: Pattern, var: str, row: int) -> bool:
    f = p.filters.get(var)
    if f is None:
        return True
    if isinstance(f, np.ndarray):
        return bool(f[row])
    return _truth(f(row))


def is_type(ev: "Events", row: int, e: Element) -> bool:
    return e.type is None or ev.type[row] == e.type


def _conditions_hold(p: Pattern, binding: dict, among: set | None = None) -> bool:
    for c in p.conditions:
        if among is not None and not c.vars <= among:
            continue
        if not c.vars <= binding.keys():
            continue
        if not _truth(c.fn(binding)):
            return False
    return True


def _keys(binding_value, key) -> list[int]:
    rows = binding_value if isinstance(binding_value, tuple) else (binding_value,)
    return [int(key[r]) for r in rows]


def reference_matches(p: Pattern, ev: Events) -> list[tuple]:
    """Every match, canonical and sorted: a tuple of (var, row or tuple of rows) sorted by var."""
    if p.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {p.strategy}")
    parts = np.zeros(len(ev), np.int64) if ev.partition is None else ev.partition
    found: set[tuple] = set()
    for chain in alternatives(p.root):
        for part in np.unique(parts):
            rows = np.flatnonzero(parts == part)
            for m in _chain_matches(p, chain, ev, rows):
                found.add(tuple(sorted(m.items())))
    return sorted(found)


def _chain_matches(p: Pattern, chain: tuple[Element, ...], ev: Events, rows: np.ndarray):
    positive = [i for i, e in enumerate(chain) if not e.negated]
    if not positive:
        return
    key = ev.key
    pos_in_part = {int(r): i for i, r in enumerate(rows)}

    def candidates(e: Element):
        return [int(r) for r in rows if is_type(ev, int(r), e) and _ok_filter(p, e.var, int(r))]

    cands = {i: candidates(chain[i]) for i in positive}

    def extend(k: int, binding: dict, last_key: int | None, first_key: int | None):
        if k == len(positive):
            yield dict(binding)
            return
        e = chain[positive[k]]
        pool = [r for r in cands[positive[k]] if last_key is None or key[r] > last_key]
        if first_key is not None:
            pool = [r for r in pool if key[r] - first_key <= p.window]
        if e.kleene is None:
            for r in pool:
                binding[e.var] = r
                yield from extend(k + 1, binding, int(key[r]), first_key if first_key is not None else int(key[r]))
                del binding[e.var]
            return
        lo, hi = e.kleene
        # subsets of the pool with strictly increasing keys, of size within the bounds
        for size in range(max(1, lo), (len(pool) if hi is None else min(hi, len(pool))) + 1):
            for combo in itertools.combinations(pool, size):
                if any(key[combo[i]] >= key[combo[i + 1]] for i in range(size - 1)):
                    continue
                binding[e.var] = tuple(combo)
                fk = first_key if first_key is not None else int(key[combo[0]])
                if key[combo[-1]] - fk <= p.window:
                    yield from extend(k + 1, binding, int(key[combo[-1]]), fk)
                del binding[e.var]

    for binding in extend(0, {}, None, None):
        if not _conditions_hold(p, binding):
            continue
        allkeys = [k for e in chain if not e.negated for k in _keys(binding[e.var], key)]
        first, last = min(allkeys), max(allkeys)
        if last - first > p.window:
            continue
        if not _negations_hold(p, chain, binding, ev, rows, first, last):
            continue
        if p.strategy == "strict" and not _contiguous(chain, binding, pos_in_part):
            continue
        if p.strategy == "next" and not _next_match(p, chain, binding, ev, rows):
            continue
        yield binding


def _negations_hold(p, chain, binding, ev, rows, first, last) -> bool:
    key = ev.key
    for i, e in enumerate(chain):
        if not e.negated:
            continue
        before = [j for j in range(i - 1, -1, -1) if not chain[j].negated]
        after = [j for j in range(i + 1, len(chain)) if not chain[j].negated]
        lo = max(_keys(binding[chain[before[0]].var], key)) if before else last - p.window
        hi = min(_keys(binding[chain[after[0]].var], key)) if after else first + p.window
        lo_open = bool(before)  # a leading negation's range includes last - W
        hi_open = bool(after)
        for r in rows:
            k = int(key[r])
            inside = (k > lo if lo_open else k >= lo) and (k < hi if hi_open else k <= hi)
            if not inside or not is_type(ev, int(r), e) or not _ok_filter(p, e.var, int(r)):
                continue
            trial = dict(binding)
            trial[e.var] = int(r)
            if _linked_conditions_hold(p, e.var, trial):
                return False
    return True


def _linked_conditions_hold(p: Pattern, var: str, binding: dict) -> bool:
    """The conditions that name ``var`` hold for ``binding`` (a negated event's own test)."""
    for c in p.conditions:
        if var in c.vars and c.vars <= binding.keys() and not _truth(c.fn(binding)):
            return False
    return True


def _stream(chain, binding, key):
    """Positive events of a binding in stream order: (row, element index)."""
    out = []
    for i, e in enumerate(chain):
        if e.negated:
            continue
        v = binding[e.var]
        for r in (v if isinstance(v, tuple) else (v,)):
            out.append((r, i))
    out.sort(key=lambda x: (key[x[0]], x[0]))
    return out


def _contiguous(chain, binding, pos_in_part) -> bool:
    positions = sorted(pos_in_part[r] for r, _ in _stream(chain, binding, _Position(pos_in_part)))
    return all(b - a == 1 for a, b in zip(positions, positions[1:]))


class _Position:
    """Row -> position within its partition, where ``_stream`` expects a key array."""

    def __init__(self, pos):
        self.pos = pos

    def __getitem__(self, r):
        return self.pos[r]


def _next_match(p: Pattern, chain, binding, ev, rows) -> bool:
    key = ev.key
    seq = _stream(chain, binding, key)
    part_pos = {int(r): i for i, r in enumerate(rows)}
    positive = [i for i, e in enumerate(chain) if not e.negated]
    taken_by: dict[int, int] = {}  # element -> events taken so far
    bound: dict = {}  # variables whose elements are complete
    for j in range(len(seq) - 1):
        r_j, i_j = seq[j]
        r_n = seq[j + 1][0]
        taken_by[i_j] = taken_by.get(i_j, 0) + 1
        e_j = chain[i_j]
        v = binding[e_j.var]
        if not isinstance(v, tuple) or taken_by[i_j] == len(v):
            bound[e_j.var] = v
        # the edges open after x_j: the Kleene element of x_j taking more, and the next element beginning
        grows = e_j.kleene is not None and (e_j.kleene[1] is None or taken_by[i_j] < e_j.kleene[1])
        later = [i for i in positive if i > i_j]
        nxt = chain[later[0]] if later else None
        for pos in range(part_pos[r_j] + 1, part_pos[r_n]):
            r = int(rows[pos])
            if not key[r_j] < key[r] < key[r_n]:
                continue  # an event sharing a key with a bound event cannot be in sequence with it
            if grows and is_type(ev, r, e_j) and _ok_filter(p, e_j.var, r):
                return False  # the Kleene element would have taken it
            if nxt is not None and is_type(ev, r, nxt) and _ok_filter(p, nxt.var, r):
                trial = dict(bound)
                trial[nxt.var] = r if nxt.kleene is None else (r,)
                if _conditions_hold_single(p, trial, nxt.var):
                    return False  # it would have begun the next element
    return True


def _conditions_hold_single(p: Pattern, binding: dict, var: str) -> bool:
    """Whether ``binding`` (complete elements plus ``var``'s first event) passes the conditions
    that name ``var`` and only bound variables; an aggregate over a Kleene ``var`` is decided
    only when its element completes, so it does not count here."""
    for c in p.conditions:
        if var not in c.vars or not c.vars <= binding.keys():
            continue
        if isinstance(binding[var], tuple):
            continue
        if not _truth(c.fn(binding)):
            return False
    return True
