"""The CER evaluation mechanisms against the reference semantics (cer_reference).

Random small streams (few types, unique or tied keys, optional partitions) and random patterns
(SEQ / AND / OR nesting, Kleene closure with bounds, negation at the start, middle and end,
filters as masks and callables, conditions between two variables, aggregates over a Kleene
variable, attribute equalities) under the three selection strategies: every mechanism that
supports a pattern must return exactly the reference's matches, and ``count`` their number.
"""
from __future__ import annotations

import random
import time

import numpy as np
import pytest

from matchrec.errors import NotSupportedError, OperationalError
from matchrec.operators import cer_mechanisms as M
from matchrec.operators.cer_reference import (And, Condition, Element, Events, Or, Pattern, Seq,
                                              reference_matches)

NAMES = tuple(M.MECHANISMS)
# variants beyond the defaults: post-processed negation, a tree NFA with a random order per instance, and a
# chain in a given order (variables in reverse order of appearance), a chain filtering every buffer
# range by attribute equalities in numpy
VARIANTS = [(name, None) for name in NAMES] + [("chain", {"negation": "post"}), ("tree", {"seed": 3}),
                                               ("chain", "reversed"), ("chain", {"vector_min": 0})]


# ---------------------------------------------------------------- random cases
def random_events(rng: random.Random, n: int, types: str) -> tuple[Events, np.ndarray, np.ndarray]:
    """Events plus two attribute columns: ``val`` (small ints) and ``grp`` (a few groups)."""
    parts = rng.random() < 0.3
    ties = rng.random() < 0.4
    rows = []
    for p in range(2 if parts else 1):
        m = n if not parts else rng.randint(n // 3, n)
        if ties:
            keys = sorted(rng.randint(0, max(1, m // 2 + 1)) for _ in range(m))
        else:
            keys, k = [], 0
            for _ in range(m):
                k += rng.randint(1, 3)
                keys.append(k)
        rows += [(p, k, rng.choice(types)) for k in keys]
    key = np.array([r[1] for r in rows], np.int64)
    typ = [r[2] for r in rows]
    part = np.array([r[0] for r in rows], np.int64) if parts else None
    val = np.array([rng.randint(0, 3) for _ in rows], np.int64)
    grp = np.array([rng.randint(0, 1) for _ in rows], np.int64)
    return Events(key, typ, part), val, grp


KLEENE = [(1, None), (1, None), (2, None), (0, None), (1, 2), (2, 3), (1, 1)]


class _Gen:
    def __init__(self, rng: random.Random, types: str):
        self.rng = rng
        self.types = types
        self.n = 0
        self.elements: list[Element] = []

    def element(self, negated=False, kleene_ok=True) -> Element:
        rng = self.rng
        self.n += 1
        t = None if rng.random() < 0.06 else rng.choice(self.types)
        k = rng.choice(KLEENE) if (kleene_ok and not negated and rng.random() < 0.3) else None
        e = Element(t, f"v{self.n}", k, negated)
        self.elements.append(e)
        return e

    def node(self, depth: int):
        rng = self.rng
        if depth <= 0 or rng.random() < 0.35:
            return self.element()
        kind = rng.choice(["seq", "seq", "seq", "and", "or"])
        size = rng.randint(2, 3 if kind == "seq" else 2)
        items = [self.node(depth - 1) for _ in range(size)]
        if kind == "seq":
            if rng.random() < 0.45:  # a negation at the start, in the middle or at the end
                items.insert(rng.randint(0, len(items)), self.element(negated=True))
            return Seq(tuple(items))
        if kind == "and":
            return And(tuple(items))
        return Or(tuple(items))


def random_case(seed: int, n_max: int = 11):
    rng = random.Random(seed)
    types = rng.choice(["ab", "ab", "abc"])
    ev, val, grp = random_events(rng, rng.choice([0, 2] + [n_max] * 4 + list(range(5, n_max))), types)
    g = _Gen(rng, types)
    root = g.node(rng.choice([1, 1, 2]))
    if isinstance(root, Element) or rng.random() < 0.3:
        items = [root, g.element()]
        if rng.random() < 0.5:
            items.insert(rng.randint(0, 2), g.element(negated=True))
        root = Seq(tuple(items))
    filters, conditions = random_conditions(rng, g.elements, ev, val, grp)
    window = rng.choice([2, 3, 5, 8, 12, 100])
    strategy = rng.choice(["strict", "next", "any"])
    return Pattern(root, window, strategy, filters, conditions), ev


def random_conditions(rng: random.Random, elements: list, ev: Events, val, grp) -> tuple[dict, list]:
    """Filters (masks, callables, NULL as false) and conditions (comparisons of two variables,
    an aggregate over a Kleene variable, an attribute equality) over the pattern's elements."""
    positive = [e for e in elements if not e.negated]
    filters = {}
    for e in elements:
        r = rng.random()
        if r < 0.1:
            filters[e.var] = np.array([rng.random() < 0.7 for _ in range(len(ev))], bool)
        elif r < 0.2:
            cut = rng.randint(0, 2)
            filters[e.var] = (lambda row, cut=cut: val[row] >= cut)
        elif r < 0.24:
            filters[e.var] = (lambda row: None if val[row] == 0 else True)  # NULL is false
    conditions = []
    vars_all = [e.var for e in elements]
    kleene = {e.var for e in elements if e.kleene}

    def agg(b, v):
        x = b[v]
        return max(val[r] for r in x) if isinstance(x, tuple) else val[x]

    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        if len(vars_all) < 2:
            break
        x, y = rng.sample(vars_all, 2)
        op = rng.choice(["<", "<=", "<=", "!=", "=="])
        fn = {"<": lambda b, x=x, y=y: agg(b, x) < agg(b, y),
              "<=": lambda b, x=x, y=y: agg(b, x) <= agg(b, y),
              "!=": lambda b, x=x, y=y: agg(b, x) != agg(b, y),
              "==": lambda b, x=x, y=y: agg(b, x) == agg(b, y)}[op]
        conditions.append(Condition(frozenset({x, y}), fn, f"{x} {op} {y}"))
    if kleene and rng.random() < 0.4:
        v = rng.choice(sorted(kleene))
        lim = rng.randint(2, 8)
        conditions.append(Condition(frozenset({v}), lambda b, v=v, lim=lim: sum(val[r] for r in b[v]) <= lim,
                                    f"sum({v}) <= {lim}"))
    if rng.random() < 0.2 and len(positive) >= 2:
        vs = rng.sample([e.var for e in positive], rng.randint(2, len(positive)))
        conditions.append(M.AttributeEquality(vs, grp))
    return filters, conditions


def check_case(seed: int, names=NAMES, n_max: int = 11) -> int:
    pattern, ev = random_case(seed, n_max)
    want = reference_matches(pattern, ev)
    checked = 0
    for name, options in VARIANTS:
        if name not in names or M.supports(name, pattern):
            continue
        order = None
        if options == "reversed":
            order, options = sorted({v for e in _elements(pattern.root) for v in [e.var]}, reverse=True), None
        got = M.run(name, pattern, ev, options=options, order=order)
        assert got == want, f"seed {seed}: {name} {options} differs\n{pattern}\n{ev}\nwant {want}\ngot  {got}"
        n = M.count(name, pattern, ev, options=options, order=order)
        assert n == len(want), f"seed {seed}: {name} {options} count {n}, want {len(want)}\n{pattern}\n{ev}"
        checked += 1
    return checked


def _elements(node):
    if isinstance(node, Element):
        return [node]
    return [e for item in node.items for e in _elements(item)]


def kleene_case(seed: int):
    """Skip-till-any-match sequences with one or two Kleene elements (bounded or not), ties,
    negations next to them and aggregates over them: the recomputation's batch paths."""
    rng = random.Random(seed)
    ev, val, grp = random_events(rng, rng.randint(4, 11), "ab")
    items, n = [], rng.randint(2, 4)
    for j in range(n):
        k = rng.choice([(1, None), (1, None), (2, None), (1, 2), (2, 3)]) if rng.random() < 0.5 else None
        items.append(Element(rng.choice("ab"), f"v{j}", k))
    if rng.random() < 0.3:
        items.insert(rng.randint(0, n), Element(rng.choice("ab"), "n", negated=True))
    conditions = []
    kvars = [e.var for e in items if e.kleene]
    if kvars and rng.random() < 0.3:
        v = rng.choice(kvars)
        conditions.append(Condition(frozenset({v}), lambda b, v=v: sum(val[r] for r in b[v]) <= 4))
    if rng.random() < 0.3:  # one equality over all variables, or a chain of pairwise ones
        vs = [e.var for e in items if not e.negated]
        if rng.random() < 0.5:
            conditions.append(M.AttributeEquality(vs, grp))
        else:
            conditions += [M.AttributeEquality([x, y], grp) for x, y in zip(vs, vs[1:])]
    return Pattern(Seq(tuple(items)), rng.choice([3, 6, 10, 100]), "any", {}, conditions), ev


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("block", range(8))
def test_random_cases_match_the_reference(block):
    checked = 0
    for seed in range(block * 150, block * 150 + 150):
        checked += check_case(seed)
    assert checked > 0


def test_kleene_cases_match_the_reference():
    for seed in range(300):
        pattern, ev = kleene_case(seed)
        want = reference_matches(pattern, ev)
        for name in NAMES:
            assert M.run(name, pattern, ev) == want, f"seed {seed}: {name}"
            assert M.count(name, pattern, ev) == len(want), f"seed {seed}: {name} count"


@pytest.mark.slow
def test_random_cases_exhaustive():
    checked = 0
    for seed in range(100_000, 130_000):
        checked += check_case(seed)
    for seed in range(100_000, 105_000):
        pattern, ev = kleene_case(seed)
        want = reference_matches(pattern, ev)
        for name in NAMES:
            assert M.run(name, pattern, ev) == want, f"seed {seed}: {name}"
            assert M.count(name, pattern, ev) == len(want), f"seed {seed}: {name} count"
    assert checked > 30_000


def test_hand_checked_sequence_and_strategies():
    ev = Events(np.array([1, 2, 3, 4, 5, 6]), list("abxabb"))
    a, b = Element("a", "x"), Element("b", "y")
    for name in NAMES:
        for strategy, n in (("strict", 2), ("next", 2), ("any", 5)):
            p = Pattern(Seq((a, b)), 10, strategy)
            if M.supports(name, p):
                continue
            assert len(M.run(name, p, ev)) == n == M.count(name, p, ev)


def test_max_matches_limit():
    ev = Events(np.arange(12, dtype=np.int64), list("ab" * 6))
    p = Pattern(Seq((Element("a", "x"), Element("b", "y"))), 100, "any")
    want = reference_matches(p, ev)
    assert len(want) == 21
    for name in NAMES:
        assert M.run(name, p, ev, max_matches=21) == want
        with pytest.raises(OperationalError, match="matchrec_cer_max_matches"):
            M.run(name, p, ev, max_matches=20)
        assert M.count(name, p, ev, max_matches=5) == 21  # counting keeps nothing


def test_max_partial_limit_bounds_the_eager_nfa_only():
    # every a waits for a later b within the window: the eager NFA holds six partial matches at the end
    ev = Events(np.arange(12, dtype=np.int64), list("ab" * 6))
    p = Pattern(Seq((Element("a", "x"), Element("b", "y"))), 100, "any")
    want = reference_matches(p, ev)
    assert M.run("eager", p, ev, max_partial=6) == want
    assert M.count("eager", p, ev, max_partial=6) == len(want)
    with pytest.raises(OperationalError, match="matchrec_cer_max_partial_matches"):
        M.run("eager", p, ev, max_partial=5)
    with pytest.raises(OperationalError, match="matchrec_cer_max_partial_matches"):
        M.count("eager", p, ev, max_partial=5)
    # expired instances are dropped when the next b arrives, so a narrow window holds at most two
    narrow = Pattern(p.root, 1, "any")
    assert M.run("eager", narrow, ev, max_partial=2) == reference_matches(narrow, ev)
    for name in ("chain", "tree", "rcep"):  # lazy mechanisms store no partial matches
        assert M.run(name, p, ev, max_partial=1) == want


def test_max_matches_counts_distinct_matches_of_overlapping_alternatives():
    ev = Events(np.arange(4, dtype=np.int64), list("abab"))
    x = Element("a", "x")
    p = Pattern(Or((x, x)), 10, "any")  # both alternatives yield the same two matches
    for name in NAMES:
        assert M.run(name, p, ev, max_matches=2) == reference_matches(p, ev)
        assert M.count(name, p, ev) == 2
        with pytest.raises(OperationalError):
            M.run(name, p, ev, max_matches=1)


def test_supports():
    p = Pattern(Seq((Element("a", "x"), Element("b", "y", (1, None)))), 5, "next")
    assert M.supports("eager", p) == "" and M.supports("chain", p) == "" and M.supports("tree", p) == ""
    assert "skip-till-any-match" in M.supports("rcep", p)
    assert "unknown mechanism" in M.supports("nope", p)
    dup = Pattern(Seq((Element("a", "x"), Element("b", "x"))), 5, "any")
    assert M.supports("eager", dup)
    with pytest.raises(NotSupportedError):
        M.run("rcep", p, Events(np.arange(2), list("ab")))


def test_kleene_count_is_combinatorial():
    """SEQ(a, b+, c): 2^n - 1 matches per (a, c) pair with n b's between; counted, not enumerated."""
    n = 60
    ev = Events(np.arange(n + 2, dtype=np.int64), ["a"] + ["b"] * n + ["c"])
    p = Pattern(Seq((Element("a", "x"), Element("b", "y", (1, None)), Element("c", "z"))), 10 ** 6, "any")
    started = time.process_time()
    assert M.count("rcep", p, ev) == 2 ** n - 1
    assert time.process_time() - started < 1.0  # CPU time: a loaded machine stretches wall time


def test_attribute_equality_is_a_condition():
    grp = np.array([0, 1, 0, 0])
    c = M.AttributeEquality(["x", "y"], grp)
    assert c.fn({"x": 0, "y": 2}) and not c.fn({"x": 0, "y": 1}) and c.fn({"x": 0, "y": (2, 3)})
    assert not M.AttributeEquality(["x", "y"], np.array([None, None], object)).fn({"x": 0, "y": 1})
