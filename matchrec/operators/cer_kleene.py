"""CER recomputation for Kleene closure under skip-till-any-match (no partial matches).

This module owns the ``rcep`` mechanism. Events are kept per element; nothing is stored per
partial match. A match is built when its last event (a trigger: an event of the last element)
is reached, backwards through the sequence, each element searched by binary search between the
key of the element bound after it and the trigger's key minus the window (the trigger's key is
the match's largest, so that bounds the window exactly).

A Kleene element is bound by its first and last events only, unless a condition reads its
events; the events between are any subset of the candidates with keys strictly between, and
those subsets are enumerated in batch (by size, then as combinations: the Banker's sequence)
only when the match is emitted, or merely counted (binomial sums, 2^n - 1 without bounds). A
Kleene element between two single events with no negation next to it is not bound at all: its
matches are every subset of the candidates between its neighbours. So ``count`` of
SEQ(a, b+, c) is a sum of 2^n - 1 over the (a, c) pairs.

When one ``AttributeEquality`` covers every positive variable of an alternative, candidates
are grouped by that attribute and each group is searched on its own (the condition then holds
by construction); negations still look at the whole partition.
"""
from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right

import numpy as np

from matchrec.operators.cer_mechanisms import (AttributeEquality, Cands, ChainPlan, Partition, Prepared, Sink,
                                               conditions_hold, negation_holds)


def evaluate(prep: Prepared, sink: Sink, order=None) -> None:
    for chain in prep.chains:
        if chain.empty():
            continue
        column, used = _cover(chain, prep.n)
        conds = [c for c in chain.conditions if id(c) not in used]
        for part in prep.parts:
            full = {i: part.cands(chain.elements[i]) for i in chain.positive}
            if column is None:
                _Recompute(prep, sink, chain, part, full, conds).run()
                continue
            for group in _groups(full, column):
                _Recompute(prep, sink, chain, part, group, conds).run()


def _cover(chain: ChainPlan, n: int):
    """A column whose equalities (on that one column, chained by shared variables) tie every
    positive variable together, and the ids of those conditions; else (None, set())."""
    by_column: dict = {}
    for c in chain.conditions:
        if isinstance(c, AttributeEquality) and len(c.column) == n:
            by_column.setdefault(id(c.column), []).append(c)
    for eqs in by_column.values():
        parent = {v: v for v in chain.varset}

        def find(v):
            while parent[v] != v:
                v = parent[v]
            return v
        for c in eqs:
            vs = sorted(c.vars)
            for v in vs[1:]:
                parent[find(v)] = find(vs[0])
        if len({find(v) for v in chain.varset}) == 1:
            return eqs[0].column, {id(c) for c in eqs}
    return None, set()


def _groups(full: dict, column: np.ndarray):
    """The candidates split by the value of ``column`` (NULL values belong to no group)."""
    allrows = np.concatenate([c.rows for c in full.values()])
    values = column[allrows]
    ok = np.array([not _null(v) for v in values], bool) if values.dtype == object else \
        (~np.isnan(values) if values.dtype.kind == "f" else np.ones(len(values), bool))
    for v in np.unique(values[ok]) if len(values[ok]) else []:
        out = {}
        for i, c in full.items():
            sel = column[c.rows] == v
            out[i] = Cands(c.pos[sel], c.keys[sel], c.rows[sel])
        yield out


def _null(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


class _Recompute:
    def __init__(self, prep: Prepared, sink: Sink, chain: ChainPlan, part: Partition, cands: dict, conds: list):
        self.prep, self.sink, self.chain, self.part = prep, sink, chain, part
        self.cands = cands
        self.w = prep.window
        self.keep = sink.keeps(chain)
        P = chain.positive
        read = {v for c in conds for v in c.vars} | {v for g in chain.negations for v in g.needs}
        self.explicit = {i for i in chain.bounds if chain.vars[i] in read}
        # a Kleene element collapses when only its neighbours' keys decide its subsets
        self.collapsed = set()
        for n, i in enumerate(P):
            if (i in chain.bounds and i not in self.explicit and 0 < n < len(P) - 1
                    and P[n - 1] == i - 1 and P[n + 1] == i + 1
                    and P[n - 1] not in self.collapsed and P[n - 1] not in chain.bounds
                    and P[n + 1] not in chain.bounds):
                self.collapsed.add(i)
        self.steps = [i for i in reversed(P) if i not in self.collapsed]
        self.conds, self.negs, self.rest = _schedule(chain, self.steps, conds)
        self.vars = [chain.vars[i] for i in self.steps]
        self.first: dict = {}
        self.last: dict = {}
        self.binding: dict = {}
        self.expand: list = []  # (var, cands, a, b, first row, last row, min size, max size) of unbound events

    def run(self) -> None:
        if not all(c.n for c in self.cands.values()):
            return
        self.step(0, None, 1)

    def step(self, s: int, top: int | None, weight: int) -> None:
        if s == len(self.steps):
            self.finish(top, weight)
            return
        chain = self.chain
        i = self.steps[s]
        c = self.cands[i]
        keyl = c.keyl
        nxt = chain.next_positive.get(i)
        hollow = nxt in self.collapsed
        if hollow:
            nxt = chain.next_positive[nxt]
        b = c.n if nxt is None else bisect_left(keyl, self.first[nxt])
        a = 0 if top is None else bisect_left(keyl, top - self.w)
        if a >= b:
            return
        kb = chain.bounds.get(i)
        if kb is None:
            for j in range(a, b):
                self.bind(s, i, c.rowl[j], keyl[j], keyl[j], top, weight, hollow)
        elif i in self.explicit:
            for rows in self.kleene_sets(c, a, b, kb, top is None):
                self.bind(s, i, rows, self.prep.keyl[rows[0]], self.prep.keyl[rows[-1]], top, weight, hollow)
        else:
            lo, hi = kb
            for j1 in range(a, b):
                t = keyl[j1] if top is None else top
                j0_lo = bisect_left(keyl, t - self.w, a, j1 + 1)
                if lo <= 1:
                    self.bind(s, i, (c.rowl[j1],), keyl[j1], keyl[j1], top, weight, hollow)
                if hi is not None and hi < 2:
                    continue
                for j0 in range(j0_lo, j1):
                    if keyl[j0] == keyl[j1]:
                        break
                    ia, ib = bisect_right(keyl, keyl[j0], j0, j1), bisect_left(keyl, keyl[j1], j0, j1)
                    smin, smax = max(0, lo - 2), (None if hi is None else hi - 2)
                    n = subset_count(c, ia, ib, smin, smax)
                    if n:
                        self.expand.append((chain.vars[i], c, ia, ib, c.rowl[j0], c.rowl[j1], smin, smax))
                        self.bind(s, i, (c.rowl[j0], c.rowl[j1]), keyl[j0], keyl[j1], top, weight * n, hollow)
                        self.expand.pop()

    def kleene_sets(self, c: Cands, a: int, b: int, kb, trigger: bool):
        """Every event set of a Kleene element in [a, b) (a trigger: every set ending at each
        candidate, within the window of its last event)."""
        lo, hi = kb
        if not trigger:
            yield from subsets(c, a, b, lo, hi)
            return
        for j in range(a, b):
            k = c.keyl[j]
            ia = bisect_left(c.keyl, k - self.w, a, j)
            ib = bisect_left(c.keyl, k, ia, j)
            for rows in subsets(c, ia, ib, max(0, lo - 1), None if hi is None else hi - 1):
                yield rows + (c.rowl[j],)

    def bind(self, s: int, i: int, value, k0: int, k1: int, top, weight: int, hollow: bool) -> None:
        chain = self.chain
        if top is None:
            top = k1
        var = self.vars[s]
        self.binding[var] = value
        self.first[i], self.last[i] = k0, k1
        pushed = False
        try:
            if hollow:
                e = chain.next_positive[i]
                nn = chain.next_positive[e]
                c = self.cands[e]
                ia, ib = bisect_right(c.keyl, k1), bisect_left(c.keyl, self.first[nn])
                lo, hi = chain.bounds[e]
                n = subset_count(c, ia, ib, lo, hi)
                if not n:
                    return
                weight *= n
                self.expand.append((chain.vars[e], c, ia, ib, None, None, lo, hi))
                pushed = True
            conds = self.conds[s]
            if conds and not conditions_hold(conds, self.binding):
                return
            for g in self.negs[s]:
                if not negation_holds(self.prep, self.part, chain, g, self.binding):
                    return
            self.step(s + 1, top, weight)
        finally:
            if pushed:
                self.expand.pop()
            del self.binding[var]

    def finish(self, top: int, weight: int) -> None:
        binding = self.binding
        lo_key = self.first[self.chain.positive[0]]
        for g in self.rest:
            if not negation_holds(self.prep, self.part, self.chain, g, binding, lo_key, top):
                return
        if not self.keep:
            self.sink.add_count(self.chain, weight)
            return
        if not self.expand:
            self.sink.add(self.chain, binding)
            return
        choices = []
        for var, c, a, b, r0, r1, smin, smax in self.expand:
            head = () if r0 is None else (r0,)
            tail = () if r1 is None else (r1,)
            choices.append((var, [head + mid + tail for mid in subsets(c, a, b, smin, smax)]))
        saved = {var: binding[var] for var, _ in choices if var in binding}
        try:
            for combo in itertools.product(*(rows for _, rows in choices)):
                for (var, _), rows in zip(choices, combo):
                    binding[var] = rows
                self.sink.add(self.chain, binding)
        finally:
            for var, _ in choices:
                binding.pop(var, None)
            binding.update(saved)


def _schedule(chain: ChainPlan, steps: list[int], conds: list):
    """Conditions (from ``conds``) and negations decidable after each step of ``steps``."""
    bound: set = set()
    out_c, out_n = [], []
    done_c: set = set()
    done_n: set = set()
    for i in steps:
        bound.add(chain.vars[i])
        now = [c for c in conds if id(c) not in done_c and c.vars <= bound]
        done_c.update(id(c) for c in now)
        out_c.append(now)
        here = []
        for g in chain.negations:
            if g.index in done_n or g.prev is None or g.next is None:
                continue
            if chain.vars[g.prev] in bound and chain.vars[g.next] in bound and g.needs <= bound:
                here.append(g)
                done_n.add(g.index)
        out_n.append(here)
    return out_c, out_n, [g for g in chain.negations if g.index not in done_n]


# ---------------------------------------------------------------- subsets of a candidate range
def _key_groups(c: Cands, a: int, b: int) -> list[list[int]]:
    """Rows of [a, b) grouped by key (a subset takes at most one row per key)."""
    groups: list = []
    prev = None
    for j in range(a, b):
        k = c.keyl[j]
        if k != prev:
            groups.append([])
            prev = k
        groups[-1].append(c.rowl[j])
    return groups


def subset_count(c: Cands, a: int, b: int, smin: int, smax: int | None) -> int:
    """How many subsets of [a, b) with distinct keys have smin <= size <= smax."""
    if b <= a:
        return 1 if smin <= 0 else 0
    if smax is not None and smax < smin:
        return 0
    g = b - a
    if c.keyl[a] == c.keyl[b - 1] and g > 1 or _has_ties(c, a, b):
        sizes = [1]  # elementary symmetric polynomial of the key multiplicities
        for grp in _key_groups(c, a, b):
            m = len(grp)
            nxt = sizes + [0]
            for s in range(len(sizes)):
                nxt[s + 1] += sizes[s] * m
            sizes = nxt
        top = len(sizes) - 1 if smax is None else min(smax, len(sizes) - 1)
        return sum(sizes[max(0, smin):top + 1])
    if smax is None or smax >= g:
        if smin <= 0:
            return 1 << g
        return (1 << g) - sum(math.comb(g, s) for s in range(smin))
    return sum(math.comb(g, s) for s in range(max(0, smin), smax + 1))


def _has_ties(c: Cands, a: int, b: int) -> bool:
    if b - a < 2:
        return False
    k = c.keys[a:b]
    return bool((k[1:] == k[:-1]).any())


def subsets(c: Cands, a: int, b: int, smin: int, smax: int | None):
    """Subsets of [a, b) with distinct keys, smallest first (the Banker's sequence), as row tuples."""
    groups = _key_groups(c, a, b)
    top = len(groups) if smax is None else min(smax, len(groups))
    for size in range(max(0, smin), top + 1):
        for combo in itertools.combinations(groups, size):
            yield from itertools.product(*combo)
