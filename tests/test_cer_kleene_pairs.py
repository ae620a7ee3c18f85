"""Recomputation's pair listing (``cer_kleene._Recompute._list_pairs``): a trigger closure
bound by its first and last events (the subsets between them from bit masks), then a free single
event spread over its range, listed as one block per partition. Random streams and
SEQ(a, b+)-shaped patterns (bounds, ties, partitions, filters, equalities, a negation or a
condition that turns the path off) against the reference semantics on small streams and against
binding pair by pair on larger ones."""
from __future__ import annotations

import random

import numpy as np
import pytest

from matchrec.operators import cer_kleene
from matchrec.operators import cer_mechanisms as M
from matchrec.operators.cer_reference import Condition, Element, Events, Pattern, Seq, reference_matches


def _case(seed: int, n: int):
    rng = random.Random(seed)
    parts = rng.random() < 0.5
    ties = rng.random() < 0.4
    keys, part = [], []
    for p in range(rng.choice([1, 2, 3]) if parts else 1):
        k = 0
        for _ in range(rng.randint(n // 2, n)):
            k += rng.randint(0, 1) if ties else rng.randint(1, 4)
            keys.append(k)
            part.append(p)
    m = len(keys)
    types = [rng.choice("aabbc") for _ in range(m)]
    val = np.array([rng.randint(0, 3) for _ in range(m)], np.int64)
    grp = np.array([rng.randint(0, 1) for _ in range(m)], np.int64)
    ev = Events(np.array(keys, np.int64), types, np.array(part, np.int64) if parts else None)
    bounds = rng.choice([(1, None), (1, None), (2, None), (1, 1), (1, 2), (2, 3), (3, None), (0, None)])
    items = [Element("a", "x"), Element(rng.choice("bc"), "y", bounds)]
    r = rng.random()
    if r < 0.15:
        items.insert(0, Element("c", "w"))
    elif r < 0.25:
        items.insert(1, Element("c", "n", negated=True))
    filters, conditions = {}, []
    if rng.random() < 0.4:
        filters["x"] = val >= rng.randint(1, 2)
    if rng.random() < 0.2:
        conditions.append(M.AttributeEquality([e.var for e in items if not e.negated], grp))
    if rng.random() < 0.1:
        conditions.append(Condition(frozenset({"x"}), lambda b: val[b["x"]] != 1))
    return Pattern(Seq(tuple(items)), rng.choice([2, 4, 7, 12, 30]), "any", filters, conditions), ev


@pytest.fixture
def pairs_always(monkeypatch):
    monkeypatch.setattr(cer_kleene, "_PAIRS_AT_LEAST", 0)


def _columns(pattern, ev):
    return sorted(M.run_columns("rcep", pattern, ev).tuples())


def test_pair_listing_matches_the_reference(pairs_always, monkeypatch):
    for seed in range(250):
        pattern, ev = _case(seed, 14)
        monkeypatch.setattr(cer_kleene, "_BETWEEN_AT_MOST", (0, 1, 4)[seed % 3])
        want = reference_matches(pattern, ev)
        assert M.run("rcep", pattern, ev) == want, f"seed {seed}"
        assert _columns(pattern, ev) == sorted(want), f"seed {seed}: columns"
        assert M.count("rcep", pattern, ev) == len(want), f"seed {seed}: count"


def test_pair_listing_matches_binding_pair_by_pair(monkeypatch):
    for seed in range(1000, 1040):
        pattern, ev = _case(seed, 160)
        if pattern.window > 12:
            pattern = Pattern(pattern.root, 6, "any", pattern.filters, pattern.conditions)
        monkeypatch.setattr(cer_kleene, "ARRAY_LISTING", False)
        want = M.run("rcep", pattern, ev)
        monkeypatch.setattr(cer_kleene, "ARRAY_LISTING", True)
        monkeypatch.setattr(cer_kleene, "_PAIRS_AT_LEAST", seed % 3 * 8)
        monkeypatch.setattr(cer_kleene, "_BETWEEN_AT_MOST", seed % 5)
        assert M.run("rcep", pattern, ev) == want, f"seed {seed}"
        assert _columns(pattern, ev) == sorted(want), f"seed {seed}: columns"


@pytest.mark.slow
def test_pair_listing_exhaustive(pairs_always):
    for seed in range(10_000, 14_000):
        pattern, ev = _case(seed, 16)
        want = reference_matches(pattern, ev)
        assert M.run("rcep", pattern, ev) == want, f"seed {seed}"
        assert _columns(pattern, ev) == sorted(want), f"seed {seed}: columns"
