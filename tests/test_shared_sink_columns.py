"""The shared operator's sink handing its matches over column-wise (``PatternSink.finish``, what
one statement's batch run gives the result builder) against matches listed one by one as they were
added: random blocks of matches over several sets of variables, some deduplicated, and a table
built from each through the same result builder."""
from __future__ import annotations

import random

import numpy as np
import pytest

from matchrec.errors import OperationalError
from matchrec.operators import cer_shared as O
from matchrec.operators.cer_columns import MatchColumns, _lex_order, from_tuples


def _sink(rng: random.Random, max_matches=None, counting=False) -> tuple[O.PatternSink, list]:
    """A sink with random blocks added, and the matches it should hold: a tuple of (variable, row)
    pairs per match, a varset bound by more than one unit listed once per distinct match."""
    varsets = [tuple(sorted(rng.sample("abcd", rng.randint(1, 3)))) for _ in range(rng.randint(1, 4))]
    shared = {frozenset(v) for v in varsets if rng.random() < 0.5}
    sink = O.PatternSink(counting, max_matches, shared)
    listed, seen = [], set()
    for _ in range(rng.randint(0, 8)):
        names = list(rng.choice(varsets))
        rng.shuffle(names)  # the units bind their variables in their own order
        m = rng.randint(0, 6)
        rows = [[rng.randint(0, 9) for _ in range(m)] for _ in names]
        sink.add(names, rows)
        for i in range(m):
            match = tuple(sorted(zip(names, (r[i] for r in rows))))
            if frozenset(names) in shared:
                if match in seen:
                    continue
                seen.add(match)
            listed.append(match)
    return sink, listed


def test_columns_equal_the_matches_added():
    for seed in range(400):
        sink, listed = _sink(random.Random(seed))
        n, cols = sink.finish()
        assert n == len(listed) == len(cols), f"seed {seed}"
        assert sorted(cols.tuples()) == sorted(listed), f"seed {seed}"
        a, b = cols.ordered(), from_tuples(listed).ordered()
        assert a.variables == b.variables and a.tuples() == b.tuples(), f"seed {seed}"
        counting, listed = _sink(random.Random(seed), counting=True)
        assert counting.finish() == (len(listed), None), f"seed {seed}"


def test_columns_keep_the_match_limit():
    sink = O.PatternSink(False, 3, set())
    sink.add(["a", "b"], [np.arange(2), np.arange(2)])
    with pytest.raises(OperationalError):  # 4 matches past the limit of 3
        sink.add(["b", "a"], [np.arange(2), np.arange(2, 4)])
    deduplicated = O.PatternSink(False, 3, {frozenset("ab")})  # counted once distinct, in finish
    deduplicated.add(["a", "b"], [np.arange(3), np.arange(3)])
    deduplicated.add(["b", "a"], [np.arange(3), np.arange(3)])  # the same 3 matches
    assert deduplicated.finish()[0] == 3
    deduplicated.add(["a", "b"], [np.array([7]), np.array([8])])
    with pytest.raises(OperationalError):
        deduplicated.finish()


def test_packed_match_order_equals_lexsort():
    """``cer_columns._lex_order`` (keys packed into 63-bit integers, one sort per pack) orders rows
    as ``np.lexsort`` does, whatever the keys' widths (one pack, several, ABSENT among them)."""
    rng = np.random.default_rng(0)
    for trial in range(400):
        n, k = int(rng.integers(1, 300)), int(rng.integers(1, 6))
        top = int(rng.choice([2, 50, 1 << 20, 1 << 40]))
        keys = [rng.integers(-1, top, n) for _ in range(k)]
        if trial % 7 == 0:
            keys = [np.sort(x) for x in keys]  # already in order: no sort at all
        got, want = _lex_order(keys), np.lexsort(tuple(reversed(keys)))
        if got is None:  # in order already
            assert all(np.array_equal(x, x[want]) for x in keys), trial
            continue
        for x in keys:
            assert np.array_equal(x[got], x[want]), trial


def test_sorting_the_packed_keys_orders_as_the_permutation_does():
    """``MatchColumns.arranged`` (the packed keys sorted and unpacked, no permutation left) gives
    the matches of ``ordered()`` in the same order, and sorts the keys themselves for every match
    set whose first variable binds each match's first event and whose rows fit 63 bits."""
    applied = 0
    for seed in range(400):
        rng = random.Random(seed)
        n, k = rng.randint(0, 300), rng.randint(1, 4)
        first = np.array([rng.randint(0, 50) for _ in range(n)], np.int64)
        rows = {"a": first}
        for v in "bcd"[:k - 1]:
            rows[v] = first + np.array([rng.randint(0, rng.choice([3, 1 << 20])) for _ in range(n)], np.int64)
        if seed % 5 == 0 and n:  # the first variable not the least somewhere: not applicable
            rows["a"] = rows["a"].copy()
            rows["a"][rng.randrange(n)] += 1 << 21
        cols = MatchColumns(n, rows, {}, {})
        got, order = cols.arranged()
        assert (got if order is None else got.take(order)).tuples() == cols.ordered().tuples(), seed
        width = sum(max(1, int(r.max(initial=0) + 1).bit_length()) for r in rows.values())
        if order is not None:  # a permutation: the keys were not sorted themselves
            assert n < 2 or seed % 5 == 0 and k > 1 or width > 63, seed
            continue
        assert got is cols or width <= 63, seed
        applied += n >= 2
    assert applied > 150
