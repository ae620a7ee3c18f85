"""Conjunction as one partial order (cer_reference.orders) against the permutation semantics.

Random patterns with AND at several nesting levels - AND of up to five items, AND of SEQs
(partial sequences), SEQ around AND, AND inside AND, OR and Kleene closure inside AND, negation
next to and inside AND - with filters, conditions and windows, under the three strategies.
Every mechanism, in each of its variants, with AND kept as one partial order and with AND
expanded into permutations, must return exactly ``reference_matches`` (which expands AND into
permutations by definition), and ``count`` their number. A brute force over the partial orders
themselves checks the equivalence the mechanisms rely on, independently of them.
"""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from test_cer_mechanisms import VARIANTS, random_conditions, random_events

from matchrec.operators import cer_mechanisms as M
from matchrec.operators.cer_reference import (And, Condition, Element, Events, Or, Pattern, Seq, alternatives,
                                              leaves, orders, reference_matches)

KLEENE = [(1, None), (2, None), (1, 2), (1, 1)]


class _Gen:
    """Pattern trees rich in AND, with at most ``budget`` positive elements."""

    def __init__(self, rng: random.Random, types: str, budget: int, kleene: float, negation: float):
        self.rng, self.types, self.budget = rng, types, budget
        self.kleene, self.negation = kleene, negation
        self.n = 0
        self.positive = 0
        self.elements: list[Element] = []

    def element(self, negated: bool = False) -> Element:
        rng = self.rng
        self.n += 1
        self.positive += not negated
        t = None if rng.random() < 0.05 else rng.choice(self.types)
        k = rng.choice(KLEENE) if not negated and rng.random() < self.kleene else None
        e = Element(t, f"v{self.n}", k, negated)
        self.elements.append(e)
        return e

    def left(self) -> int:
        return self.budget - self.positive

    def node(self, depth: int, kinds=("and", "and", "seq", "seq", "or")):
        rng = self.rng
        if depth <= 0 or self.left() < 2 or rng.random() < 0.25:
            return self.element()
        kind = rng.choice(kinds)
        if kind == "and":
            size = rng.randint(2, max(2, min(5, self.left())))
            return And(tuple(self.node(depth - 1) for _ in range(size)))
        if kind == "or":
            return Or(tuple(self.node(depth - 1) for _ in range(2)))
        items = [self.node(depth - 1) for _ in range(rng.randint(2, 3))]
        if rng.random() < self.negation:  # a negation at the start, in the middle or at the end
            items.insert(rng.randint(0, len(items)), self.element(negated=True))
        return Seq(tuple(items))


MAX_CHAINS = 240


def random_tree(rng: random.Random, types: str):
    g = _Gen(rng, types, budget=rng.choice([3, 4, 4, 5, 6]), kleene=rng.choice([0.0, 0.1, 0.25]),
             negation=rng.choice([0.0, 0.3, 0.6]))
    if rng.random() < 0.25:  # a flat AND of up to five items
        root = And(tuple(g.element() for _ in range(rng.randint(2, 5))))
    else:
        root = g.node(rng.choice([2, 2, 3]), kinds=("and", "seq"))
        if not isinstance(root, And) and rng.random() < 0.5:
            root = And((root, g.node(1)))
    if rng.random() < 0.25:  # an AND with neighbours in a sequence, negations next to it
        items = [root, g.element()] if rng.random() < 0.5 else [g.element(), root]
        if rng.random() < 0.6:
            items.insert(rng.randint(0, 2), g.element(negated=True))
        root = Seq(tuple(items))
    return g, root


def has_and(node) -> bool:
    return isinstance(node, And) or not isinstance(node, Element) and any(has_and(i) for i in node.items)


def chain_count(node) -> int:
    """len(alternatives(node)) without building them."""
    if isinstance(node, Element):
        return 1
    if isinstance(node, Or):
        return sum(chain_count(i) for i in node.items)
    n = math.factorial(len(node.items)) if isinstance(node, And) else 1
    for i in node.items:
        n *= chain_count(i)
    return n


def conjunction_case(seed: int, n_max: int = 12):
    rng = random.Random(seed)
    types = rng.choice(["ab", "ab", "abc", "abcd"])
    ev, val, grp = random_events(rng, rng.choice([0, 3] + [n_max] * 3 + list(range(6, n_max))), types)
    while True:  # at most MAX_CHAINS permutation chains, so that the reference stays quick
        g, root = random_tree(rng, types)
        if has_and(root) and chain_count(root) <= MAX_CHAINS:
            break
    filters, conditions = random_conditions(rng, g.elements, ev, val, grp) if rng.random() < 0.6 else ({}, [])
    window = rng.choice([3, 5, 8, 12, 100, 100])
    strategy = rng.choice(["any", "any", "any", "any", "next", "strict"])
    return Pattern(root, window, strategy, filters, conditions), ev


def check(pattern: Pattern, ev: Events, want, label) -> int:
    checked = 0
    for name, options in VARIANTS:
        if M.supports(name, pattern):
            continue
        order = None
        if options == "reversed":
            order, options = sorted((e.var for e in leaves(pattern.root)), reverse=True), None
        got = M.run(name, pattern, ev, options=options, order=order)
        assert got == want, f"{label}: {name} {options} differs\n{pattern}\n{ev}\nwant {want}\ngot  {got}"
        n = M.count(name, pattern, ev, options=options, order=order)
        assert n == len(want), f"{label}: {name} {options} count {n}, want {len(want)}\n{pattern}\n{ev}"
        if options is None:
            got = M.run(name, pattern, ev, conjunction="permutations")
            assert got == want, f"{label}: {name} with permutations differs\n{pattern}\n{ev}"
        checked += 1
    return checked


def check_case(seed: int, brute: bool = True) -> int:
    pattern, ev = conjunction_case(seed)
    want = reference_matches(pattern, ev)
    if brute:
        got = order_matches(pattern, ev)
        assert got is None or got == want, f"seed {seed}: the partial orders differ\n{pattern}\n{ev}"
    return check(pattern, ev, want, f"seed {seed}")


def kleene_case(seed: int):
    """Kleene closure inside and around AND under skip-till-any-match: the recomputation's
    collapsed closures (counted, not enumerated) inside an AND item, closures as AND items,
    negations next to the AND and inside it, aggregates and attribute equalities over them."""
    rng = random.Random(seed)
    ev, val, grp = random_events(rng, rng.randint(6, 12), "ab")
    names = iter(f"v{j}" for j in range(20))

    def e(kleene=False, negated=False):
        k = rng.choice([(1, None), (1, None), (2, None), (1, 2), (2, 3)]) if kleene else None
        return Element(rng.choice("ab"), next(names), k, negated)

    shape = rng.randrange(9)
    if shape == 0:
        root = And((Seq((e(), e(True), e())), e()))
    elif shape == 1:
        root = And((e(True), e()))
    elif shape == 2:
        root = And((e(True), e(True)))
    elif shape == 3:
        root = Seq((e(), And((e(True), e())), e()))
    elif shape == 4:
        root = Seq((And((e(), e())), e(True), e()))
    elif shape == 5:
        root = And((Seq((e(), e(True), e())), Seq((e(), e(True)))))
    elif shape == 6:
        root = Seq((e(), e(True), And((e(), e()))))
    elif shape == 7:
        root = And((Seq((e(), e(negated=True), e(True), e())), e()))
    else:
        root = Seq((e(negated=True), And((e(True), e()))))
    elements = leaves(root)
    conditions = []
    kvars = [x.var for x in elements if x.kleene]
    if kvars and rng.random() < 0.3:
        v = rng.choice(kvars)
        conditions.append(Condition(frozenset({v}), lambda b, v=v: sum(val[r] for r in b[v]) <= 4))
    if rng.random() < 0.3:
        conditions.append(M.AttributeEquality([x.var for x in elements if not x.negated], grp))
    return Pattern(root, rng.choice([4, 8, 100, 100]), "any", {}, conditions), ev


# ---------------------------------------------------------------- the partial orders by brute force
def order_matches(p: Pattern, ev: Events, limit: int = 20_000) -> list[tuple] | None:
    """The matches of ``orders(p.root, p.strategy)`` under skip-till-any-match, stated directly:
    every combination of candidates that keeps ``before``, ``apart``, the window, the conditions
    and the negations (ranges between the latest positive element before and the earliest after).
    Other strategies are the reference's (their orders are its chains). None when some partial
    order has more than ``limit`` combinations in a partition."""
    if p.strategy != "any":
        return reference_matches(p, ev)
    from matchrec.operators.cer_reference import _conditions_hold, _linked_conditions_hold, _ok_filter, is_type
    key = ev.key
    parts = np.zeros(len(ev), np.int64) if ev.partition is None else ev.partition
    found = set()
    for alt in orders(p.root, p.strategy):
        els = alt.elements
        pos = [i for i, e in enumerate(els) if not e.negated]
        for part in np.unique(parts):
            rows = [int(r) for r in np.flatnonzero(parts == part)]

            def ok(e, r):
                return is_type(ev, r, e) and _ok_filter(p, e.var, r)

            options = []
            for i in pos:
                e = els[i]
                cands = [r for r in rows if ok(e, r)]
                if e.kleene is None:
                    options.append([(r,) for r in cands])
                    continue
                lo, hi = max(1, e.kleene[0]), e.kleene[1]
                sets = []
                for size in range(lo, len(cands) + 1 if hi is None else min(hi, len(cands)) + 1):
                    sets += [c for c in itertools.combinations(cands, size)
                             if all(key[x] < key[y] for x, y in zip(c, c[1:]))]
                options.append(sets)
            if math.prod(len(o) for o in options) > limit:
                return None
            for combo in itertools.product(*options):
                span = {i: (int(key[c[0]]), int(key[c[-1]])) for i, c in zip(pos, combo)}
                if any(span[i][1] >= span[j][0] for i, j in alt.before if i in span and j in span):
                    continue
                if any(not (span_of(a, span)[1] < span_of(b, span)[0] or span_of(b, span)[1] < span_of(a, span)[0])
                       for g in alt.apart for a, b in itertools.combinations(g, 2)):
                    continue
                first = min(s[0] for s in span.values())
                last = max(s[1] for s in span.values())
                if last - first > p.window:
                    continue
                binding = {els[i].var: (c if els[i].kleene else c[0]) for i, c in zip(pos, combo)}
                if not _conditions_hold(p, binding):
                    continue
                blocked = False
                for n, e in enumerate(els):
                    if not e.negated:
                        continue
                    before = [span[i][1] for i in pos if (i, n) in alt.before]
                    after = [span[i][0] for i in pos if (n, i) in alt.before]
                    for r in rows:
                        k = int(key[r])
                        inside = ((k > max(before)) if before else k >= last - p.window) and \
                            ((k < min(after)) if after else k <= first + p.window)
                        if inside and ok(e, r) and _linked_conditions_hold(p, e.var, {**binding, e.var: r}):
                            blocked = True
                    if blocked:
                        break
                if not blocked:
                    found.add(tuple(sorted(binding.items())))
    return sorted(found)


def span_of(item, span) -> tuple[int, int]:
    return min(span[i][0] for i in item), max(span[i][1] for i in item)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("block", range(2))
def test_random_conjunctions_match_the_reference(block):
    checked = 0
    for seed in range(block * 30, block * 30 + 30):
        checked += check_case(seed)
    assert checked > 0


def test_kleene_inside_and_around_conjunctions():
    for seed in range(60):
        pattern, ev = kleene_case(seed)
        check(pattern, ev, reference_matches(pattern, ev), f"kleene seed {seed}")


@pytest.mark.slow
def test_random_conjunctions_exhaustive():
    checked = 0
    for seed in range(200_000, 204_000):
        checked += check_case(seed, brute=seed % 4 == 0)
    for seed in range(200_000, 201_000):
        pattern, ev = kleene_case(seed)
        checked += check(pattern, ev, reference_matches(pattern, ev), f"kleene seed {seed}")
    assert checked > 5_000


def test_orders_keep_and_as_one_partial_order():
    a, b, c, d, e = (Element(t, t) for t in "abcde")
    flat = And((a, b, c, d, e))
    assert len(alternatives(flat)) == 120 and len(orders(flat, "next")) == 120
    (o,) = orders(flat, "any")
    assert o.elements == (a, b, c, d, e) and not o.before and len(o.apart) == 1
    # partial sequence: a before b, c apart from the span of (a, b)
    (o,) = orders(And((Seq((a, b)), c)), "any")
    assert o.before == {(0, 1)} and o.apart == ((frozenset({0, 1}), frozenset({2})),)
    # a negation inside an AND keeps the permutations; one next to it does not need them
    n = Element("x", "n", negated=True)
    assert len(orders(And((Seq((a, n, b)), c)), "any")) == 2
    (o,) = orders(Seq((And((a, b)), n, c)), "any")
    assert {(0, 2), (1, 2), (2, 3), (0, 3), (1, 3)} == o.before
    # with no AND kept the orders are alternatives' chains, in the same order
    for root in (flat, And((Seq((a, n, b)), c)), Seq((a, Or((b, And((c, d))))))):
        for strategy in ("next", "strict"):
            assert [o.elements for o in orders(root, strategy)] == alternatives(root)
    p = M.Prepared(Pattern(flat, 10, "any"), Events(np.arange(3), list("abc")), partial=True)
    assert len(p.chains) == 1 and not p.chains[0].total
    assert len(M.Prepared(Pattern(flat, 10, "next"), Events(np.arange(3), list("abc")), partial=True).chains) == 120


def test_partial_sequences_never_interleave():
    """AND(SEQ(a, b), c): c lies outside [a, b]; AND(a+, c): c never between two a's."""
    ev = Events(np.arange(1, 6, dtype=np.int64), list("acbac"))
    a, b, c = Element("a", "x"), Element("b", "y"), Element("c", "z")
    p = Pattern(And((Seq((a, b)), c)), 10, "any")
    want = [dict(m) for m in reference_matches(p, ev)]
    assert want == [{"x": 0, "y": 2, "z": 4}]  # not (0, 2, 1): c at key 2 lies inside a..b
    plus = Pattern(And((Element("a", "x", (1, None)), c)), 10, "any")
    got = [dict(m) for m in reference_matches(plus, ev)]
    assert {"x": (0, 3), "z": 1} not in got and {"x": (0,), "z": 1} in got
    for pat in (p, plus):
        for name in M.MECHANISMS:
            assert M.run(name, pat, ev) == reference_matches(pat, ev)


def test_conjunction_with_ties_needs_distinct_keys():
    ev = Events(np.array([1, 1, 2, 2], np.int64), list("abab"))
    p = Pattern(And((Element("a", "x"), Element("b", "y"))), 5, "any")
    want = reference_matches(p, ev)
    assert [dict(m) for m in want] == [{"x": 0, "y": 3}, {"x": 2, "y": 1}]
    for name in M.MECHANISMS:
        assert M.run(name, p, ev) == want and M.count(name, p, ev) == 2
