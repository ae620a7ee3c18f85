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

An alternative may be a partial order (an AND kept whole, see ``cer_mechanisms``): the elements
are then bound backwards through an order consistent with it, each bounded by the earliest bound
element that must follow it, by the window around every key bound so far (the first one bound
need not hold the match's largest key), and by the AND's other items as in ``cer_lazy``. A
Kleene element collapses only between two single events that every AND item holding it holds
too, so its subsets never change an item's span.

A Kleene element with iteration conditions (``IterationCondition``: ``b[i]`` against ``b[i-1]``,
skip-till-any-match: every subsequence of its candidates with strictly increasing keys that
satisfies them) is never enumerated as subsets. In a sequence, when its conditions read an element
before it, it is bound last, between its bound neighbours. Its sequences are then built event by
event over the buffered candidates, each extension checked against the event taken before (the
successor lists of the conditions that read no other variable are kept per partition, for the
candidates within a window of the current trigger); a sequence that fails at one event is never
extended. When nothing reads the closure after it is bound, it is bound by its first event (and its
last, when no bound element follows it) with the number of valid sequences as weight, counted by
dynamic programming from the last candidate backwards (paths[j] = 1 + the sum over j's
successors); the sequences are listed only when a match is emitted, so ``count`` never lists them.

Listing costs per match only the match's own tuple: a candidate's sequences are listed once per
trigger (a sequence from j is j followed by one from a successor: one concatenation each) and
shared by every match that holds them; when the last step binds a single event that nothing
checks once bound, its candidates in the window are not bound one by one but spread: the sink
builds the binding's matches as one product of those candidates and the closure's sequences
(``Sink.add_product``). When that single event is bound right after a counted closure (SEQ(a, b+,
c): the trigger c, the closure b, then a), a trigger's matches are listed without a binding per
first event of the closure: its bounds are computed for every first event at once, and a compiled
loop (``cer_kleene_kernels``) lists the closure's sequences as flat rows plus offsets and the
matches as arrays of rows and sequence ids (``Sink.add_block``); ``ARRAY_LISTING`` off keeps the
row tuples. Likewise a free trigger closure followed by that single event (SEQ(a, b+)): its
single events and the pairs of its first and last events with a few candidates of distinct keys
between them (their subsets taken from bit masks) are bound for a whole partition at once and
their matches handed over as one block; only pairs with more candidates or ties between are
bound one by one.

When one ``AttributeEquality`` covers every positive variable of an alternative, candidates
are grouped by that attribute and each group is searched on its own (the condition then holds
by construction); negations still look at the whole partition.
"""
from __future__ import annotations

import copy
import itertools
import math
from bisect import bisect_left, bisect_right
from functools import partial

import numpy as np

from matchrec.budget import PYTHON_STEP_COST
from matchrec.operators.cer_common import (AttributeEquality, Cands, ChainPlan, Partition, Prepared, Sink,
                                          conditions_hold, negation_holds, too_many, truth)
from matchrec.operators.cer_reference import IterationCondition


def evaluate(prep: Prepared, sink: Sink, order=None) -> None:
    for chain in prep.chains:
        if chain.empty():
            continue
        column, used = _cover(chain, prep.n)
        conds = [c for c in chain.conditions if id(c) not in used]
        # what depends on the chain alone is worked out once, not per partition (a statement
        # partitioned by a key with many values has hundreds of small partitions)
        shape = None
        every = {i: prep.all_cands(chain.elements[i]) for i in chain.positive}
        for k, part in enumerate(prep.parts):
            full = {i: every[i][k] for i in chain.positive}
            for group in ([full] if column is None else _groups(full, column)):
                if not all(c.n for c in group.values()):
                    continue
                if shape is None:
                    shape = _Recompute(prep, sink, chain, part, group, conds)
                    shape.run()
                else:
                    shape.for_partition(part, group).run()


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
        self.spend = sink.spend
        self.cands = cands
        self.w = prep.window
        self.keep = sink.keeps(chain)
        P = chain.positive
        read = {v for c in conds for v in c.vars} | {v for g in chain.negations for v in g.needs}
        self.explicit = {i for i in chain.bounds if chain.vars[i] in read}
        # a Kleene element collapses when only its neighbours' keys decide its subsets: the single
        # events right before and after it in a sequence, which every AND item holding it also holds
        self.collapsed = set()
        self.hollow: dict = {}  # the element before a collapsed one -> (collapsed element, the one after)
        for i in P:
            if i not in chain.bounds or i in self.explicit:
                continue
            before, after = chain.preds[i], chain.succs[i]
            p = [j for j in before if not chain.succs[j] & before]
            q = [j for j in after if not chain.preds[j] & after]
            if len(p) != 1 or len(q) != 1 or p[0] != i - 1 or q[0] != i + 1:
                continue
            p, q = p[0], q[0]
            if p in chain.bounds or q in chain.bounds or p in self.collapsed:
                continue
            if any(i in item and not (p in item and q in item) for g in chain.groups for item in g):
                continue
            self.collapsed.add(i)
            self.hollow[p] = (i, q)
        # backwards through an order consistent with the sequence: what follows an element is bound first
        self.steps = [i for i in reversed(P) if i not in self.collapsed]
        if chain.total:
            # a closure whose iteration conditions read an element bound after it (b[i].price >
            # a.price in SEQ(a, b+, c)) is bound last instead, between its bound neighbours, so that
            # its sequences are built with every condition checked event by event
            late = []
            for s, i in enumerate(self.steps):
                before = {chain.vars[j] for j in self.steps[:s]}
                if i in chain.bounds and any(isinstance(c, IterationCondition) and c.var == chain.vars[i]
                                             and not c.others <= before for c in conds):
                    late.append(i)
            self.steps = [i for i in self.steps if i not in late] + late
        # conditions over a Kleene iteration whose other variables are bound before the closure: its
        # event sequences are built (or counted) event by event, each checked against the one before
        self.iteration: dict = {}
        for s, i in enumerate(self.steps):
            if i in chain.bounds:
                before = {chain.vars[j] for j in self.steps[:s]}
                local = [c for c in conds if isinstance(c, IterationCondition) and c.var == chain.vars[i]
                         and c.others <= before]
                if local:
                    self.iteration[i] = local
        # per closure, its conditions that read no other variable (decided once per pair of events)
        # and those that do (decided for the current binding)
        self._pure = {i: [c for c in cs if not c.others] for i, cs in self.iteration.items()}
        self._mixed = {i: [c for c in cs if c.others] for i, cs in self.iteration.items()}
        stepwise = {id(c) for cs in self.iteration.values() for c in cs}
        conds = [c for c in conds if id(c) not in stepwise]
        # a closure nothing reads after it is bound (no condition, no negation's range ends at its
        # last event) is bound by its first event (its last too, when it holds the trigger) with
        # the number of its valid sequences as weight: counted by dynamic programming, listed only
        # when the match is emitted
        read = {v for c in conds for v in c.vars} | {v for g in chain.negations for v in g.needs}
        self.counted = {i for i in self.iteration if chain.vars[i] not in read and chain.bounds[i] == (1, None)
                        and chain.total and not any(i in g.prevs for g in chain.negations)}
        self._succ: dict = {}  # element -> candidate -> the candidates that may follow it (no other variable read)
        self._succ_kept = 0  # entries kept at the last eviction (the lists hold only the window's candidates)
        self._each: dict = {}  # element -> candidate -> whether it passes the conditions on one event (binding)
        self.conds, self.negs, self.rest = chain.schedule(self.steps, conds)
        self.vars = [chain.vars[i] for i in self.steps]
        # the last step binds a single event that nothing checks once bound (no condition, no
        # negation, not before a collapsed closure): every candidate in its range makes a match with
        # the same other events, so they go to the sink together ("spread") instead of one by one
        last = len(self.steps) - 1
        i = self.steps[last]
        self.spread = last if (last > 0 and i not in chain.bounds and not self.conds[last] and not self.negs[last]
                               and not self.rest and i not in self.hollow) else -1
        # per step the earliest elements that follow it (bound already), and the AND spans to keep apart
        # per step the earliest bound elements that follow it, and the latest bound ones before it
        self.upper, self.lower = [], []
        for s, i in enumerate(self.steps):
            bound = set(self.steps[:s])
            after = chain.succs[i] & bound
            self.upper.append([j for j in after if not chain.preds[j] & after])
            before = chain.preds[i] & bound
            self.lower.append([j for j in before if not chain.succs[j] & before])
        self.apart = chain.apart_steps(self.steps)
        # a counted closure bound right before the spread step, with nothing checked in between:
        # one trigger's matches through it are listed as arrays (``_list_block``), not one binding
        # and one product per first event of the closure
        s = last - 1
        self.block = s if (self.spread == s + 1 and self.steps[s] in self.counted and self.upper[s]
                           and not self.conds[s] and not self.negs[s] and self.steps[s] not in self.hollow
                           and not self.apart[s + 1] and not chain.shared and self.keep
                           and ARRAY_LISTING and abs(prep.window) < _SAFE) else -1
        # a trigger closure nothing checks (SEQ(a, b+) with b+ last and free), then the spread step: the
        # closure's first and last events whose subsets between are only the empty one (most pairs
        # in a sparse partition) are listed for every pair at once as one block (``_list_pairs``)
        i = self.steps[0]
        self.pairs = 0 if (self.spread == 1 and i in chain.bounds and i not in self.counted
                           and i not in self.iteration and i not in self.explicit and not self.conds[0]
                           and not self.negs[0] and not self.apart[0] and not self.apart[1]
                           and set(self.upper[1]) | set(self.lower[1]) <= {i} and not chain.shared
                           and self.keep and ARRAY_LISTING and abs(prep.window) < _SAFE) else -1
        self._arrays = (self.block, self.pairs)  # the array paths the chain allows, whatever the keys
        self._reset(part, cands)

    def for_partition(self, part: Partition, cands: dict) -> "_Recompute":
        """The same chain's evaluation over another partition's (or group's) candidates."""
        other = copy.copy(self)
        other._reset(part, cands)
        return other

    def _reset(self, part: Partition, cands: dict) -> None:
        self.part, self.cands = part, cands
        self.block, self.pairs = self._arrays if self._arrays == (-1, -1) or self._keys_safe() else (-1, -1)
        self._succ = {}
        self._succ_kept = 0
        self._each = {}
        self.first: dict = {}
        self.last: dict = {}
        self.binding: dict = {}
        self.expand: list = []  # (var, cands, a, b, first row, last row, min size, max size) of unbound events

    def _keys_safe(self) -> bool:
        """Whether key arithmetic (a key plus or minus the window) stays well within int64."""
        keys = [c.keys for c in self.cands.values() if c.n]
        return all(int(k[0]) > -_SAFE and int(k[-1]) < _SAFE for k in keys)

    def run(self) -> None:
        if not all(c.n for c in self.cands.values()):
            return
        self.step(0, None, None, 1)

    def step(self, s: int, lo_all: int | None, hi_all: int | None, weight: int) -> None:
        """Bind step s's element; ``lo_all`` / ``hi_all``: the smallest / largest key bound so far
        (in a chain ``hi_all`` is the trigger's key, the match's largest)."""
        if s == len(self.steps):
            self.finish(lo_all, hi_all, weight)
            return
        i = self.steps[s]
        c = self.cands[i]
        keyl = c.keyl
        w = self.w
        b = c.n
        for j in self.upper[s]:
            b = min(b, bisect_left(keyl, self.first[j]))
        a = 0
        if hi_all is not None:
            # within the window of every key bound so far, on both sides: an element no bound one
            # precedes (an AND's item) is bounded above by the window alone
            a = bisect_left(keyl, hi_all - w)
            b = min(b, bisect_right(keyl, lo_all + w))
        for j in self.lower[s]:
            a = max(a, bisect_right(keyl, self.last[j]))
        holes = None
        for own, other in self.apart[s]:
            h0 = min(self.first[self.steps[t]] for t in other)
            h1 = max(self.last[self.steps[t]] for t in other)
            if own:  # the item is on one side of the other one already
                if h1 < min(self.first[self.steps[t]] for t in own):
                    a = max(a, bisect_right(keyl, h1))
                else:
                    b = min(b, bisect_left(keyl, h0))
            else:
                holes = (holes or []) + [(h0, h1)]
        if a >= b:
            return
        if holes is None:
            if s == self.spread:
                # a single event within the window of every key bound so far (the bounds above keep
                # it after the events before it in the order and before those after it)
                a = bisect_left(keyl, hi_all - w, a, b)
                b = bisect_right(keyl, lo_all + w, a, b)
                if a < b:
                    self.spend(PYTHON_STEP_COST)
                    self.finish(min(lo_all, keyl[a]), max(hi_all, keyl[b - 1]), weight,
                                (self.vars[s], c.rowl[a:b]))
                return
            self.scan(s, i, c, a, b, lo_all, hi_all, weight)
            return
        for h0, h1 in sorted(holes):  # the element's events lie in one gap between the other items
            x = bisect_left(keyl, h0, a, b)
            if x > a:
                self.scan(s, i, c, a, x, lo_all, hi_all, weight)
            a = max(a, bisect_right(keyl, h1, a, b))
        if a < b:
            self.scan(s, i, c, a, b, lo_all, hi_all, weight)

    def scan(self, s: int, i: int, c: Cands, a: int, b: int, lo_all, hi_all, weight: int) -> None:
        keyl = c.keyl
        kb = self.chain.bounds.get(i)
        if kb is None:
            for j in range(a, b):
                self.bind(s, i, c.rowl[j], keyl[j], keyl[j], lo_all, hi_all, weight)
        elif i in self.counted:
            self._each[i] = {}
            self.scan_counted(s, i, c, a, b, lo_all, hi_all, weight)
        elif i in self.iteration:
            self._each[i] = {}
            for rows in self.iteration_sets(i, c, a, b, kb):
                self.bind(s, i, rows, self.prep.keyl[rows[0]], self.prep.keyl[rows[-1]], lo_all, hi_all, weight)
        elif i in self.explicit:
            # a trigger, or a range wider than the window: every set within the window of its last event
            trigger = hi_all is None or keyl[b - 1] - keyl[a] > self.w
            for rows in self.kleene_sets(c, a, b, kb, trigger):
                self.bind(s, i, rows, self.prep.keyl[rows[0]], self.prep.keyl[rows[-1]], lo_all, hi_all, weight)
        else:
            lo, hi = kb
            if s == self.pairs and hi_all is None and b - a >= _PAIRS_AT_LEAST:
                rest = self._list_pairs(s, i, c, a, b, lo, hi)
                if rest is not None:
                    for j0, j1 in rest:
                        self._pair(s, i, c, j0, j1, lo, hi, lo_all, hi_all, weight)
                    return
            for j1 in range(a, b):
                t = keyl[j1] if hi_all is None else max(hi_all, keyl[j1])
                j0_lo = bisect_left(keyl, t - self.w, a, j1 + 1)
                if lo <= 1:
                    self.bind(s, i, (c.rowl[j1],), keyl[j1], keyl[j1], lo_all, hi_all, weight)
                if hi is not None and hi < 2:
                    continue
                for j0 in range(j0_lo, j1):
                    if keyl[j0] == keyl[j1]:
                        break
                    self._pair(s, i, c, j0, j1, lo, hi, lo_all, hi_all, weight)

    def _pair(self, s: int, i: int, c: Cands, j0: int, j1: int, lo: int, hi: int | None, lo_all, hi_all,
              weight: int) -> None:
        """Bind a closure by its first and last candidates j0 < j1 (distinct keys), the subsets of
        the candidates between them listed when a match is emitted."""
        keyl = c.keyl
        ia, ib = bisect_right(keyl, keyl[j0], j0, j1), bisect_left(keyl, keyl[j1], j0, j1)
        smin, smax = max(0, lo - 2), (None if hi is None else hi - 2)
        n = subset_count(c, ia, ib, smin, smax)
        if n:
            self.expand.append((self.chain.vars[i], n, partial(_framed, c, ia, ib, smin, smax, (c.rowl[j0],),
                                                               (c.rowl[j1],))))
            try:
                self.bind(s, i, (c.rowl[j0], c.rowl[j1]), keyl[j0], keyl[j1], lo_all, hi_all, weight * n)
            finally:
                self.expand.pop()

    def _list_pairs(self, s: int, i: int, c: Cands, a: int, b: int, lo: int, hi: int | None):
        """The trigger closure at step s (the first) and the spread step after it, vectorized over
        the closure's candidates in [a, b): every single event and every (first, last) pair within
        the window with at most ``_BETWEEN_AT_MOST`` candidates of distinct keys between them is
        bound, its subsets between listed from bit masks, and the matches handed to the sink as
        one block. The other pairs, as (first, last), are left to ``_pair``; None (nothing done)
        when the pairs are too many to hold at once."""
        w = self.w
        keys = c.keys[a:b]
        m = b - a
        # per last event j1: first events at [start, equal) (keys within the window, below its own)
        start = np.searchsorted(keys, keys - w, "left")
        equal = np.searchsorted(keys, keys, "left")
        width = np.maximum(equal - start, 0) if (hi is None or hi >= 2) else np.zeros(m, np.int64)
        total = int(width.sum())
        if total > _LISTED_AT_ONCE:
            return None
        last = np.repeat(np.arange(m), width)
        first = np.arange(total) - np.repeat(np.cumsum(width) - width, width) + np.repeat(start, width)
        # the candidates strictly between a pair's keys are [lower, upper); a tie among them (two
        # rows of one key, of which a subset takes one) leaves the pair to ``_pair``
        lower, upper = np.searchsorted(keys, keys[first], "right"), equal[last]
        between = upper - lower
        ties = np.cumsum(np.r_[0, keys[1:] == keys[:-1]])  # ties[k]: rows before k+1 equal to the one before
        many = between >= 2
        tied = np.zeros(total, bool)
        tied[many] = ties[upper[many] - 1] > ties[lower[many]]
        listed = (between <= _BETWEEN_AT_MOST) & ~tied
        rest = [(x + a, y + a) for x, y in zip(first[~listed].tolist(), last[~listed].tolist())]
        first, last, lower, between = first[listed], last[listed], lower[listed], between[listed]
        if lo <= 1:  # the single events, as pairs of one event with nothing between
            first, last = np.concatenate([np.arange(m), first]), np.concatenate([np.arange(m), last])
            lower = np.concatenate([np.zeros(m, np.int64), lower])
            between = np.concatenate([np.full(m, -1, np.int64), between])
        self.spend(PYTHON_STEP_COST * len(first))
        # the spread step's range for each binding (``step``'s bounds with the closure bound)
        spread = self.cands[self.steps[s + 1]]
        ek = spread.keys
        k0, k1 = keys[first], keys[last]
        top = np.minimum(np.searchsorted(ek, k0 + w, "right"), spread.n)
        if i in self.upper[s + 1]:
            top = np.minimum(top, np.searchsorted(ek, k0, "left"))
        bottom = np.searchsorted(ek, k1 - w, "left")
        if i in self.lower[s + 1]:
            bottom = np.maximum(bottom, np.searchsorted(ek, k1, "right"))
        count = np.maximum(top - bottom, 0)
        keep = count > 0
        if not keep.any():
            return rest
        first, last, lower, between, bottom, count = (x[keep] for x in (first, last, lower, between, bottom, count))
        # the closure's sequences, grouped by the candidates between (-1: a single event): first,
        # then the subset a mask picks among those between, then last
        rows = c.rows[a:b]
        smin, smax = max(0, lo - 2), (_BETWEEN_AT_MOST if hi is None else hi - 2)
        n_seq = np.zeros(len(first), np.int64)
        base = np.zeros(len(first), np.int64)
        flats, lengths = [], []
        made = 0
        for g in np.unique(between).tolist():
            idx = np.flatnonzero(between == g)
            if g < 0:
                grid, picked = rows[first[idx]][:, None, None], np.ones((1, 1), bool)
            else:
                masks = (np.arange(1 << g)[:, None] >> np.arange(g)) & 1 == 1
                masks = masks[(masks.sum(1) >= smin) & (masks.sum(1) <= smax)]
                if not len(masks):
                    continue
                inner = rows[np.minimum(lower[idx][:, None] + np.arange(g), m - 1)]
                grid = np.concatenate([rows[first[idx]][:, None], inner, rows[last[idx]][:, None]], 1)[:, None, :]
                picked = np.concatenate([np.ones((len(masks), 1), bool), masks, np.ones((len(masks), 1), bool)], 1)
            k = len(picked)
            grid = np.broadcast_to(grid, (len(idx), k, grid.shape[2]))
            flats.append(grid[np.broadcast_to(picked, grid.shape)])
            lengths.append(np.tile(picked.sum(1), len(idx)))
            n_seq[idx] = k
            base[idx] = made + np.arange(len(idx)) * k
            made += len(idx) * k
        per = count * n_seq  # matches per binding: its spread events times its sequences
        size = int(per.sum())
        if not size:
            return rest
        self.spend(PYTHON_STEP_COST * (made + size))
        if self.sink.max is not None and self.sink.n + size > self.sink.max:
            raise too_many(self.sink.max)
        owner = np.repeat(np.arange(len(per)), per)
        local = np.arange(size) - np.repeat(np.cumsum(per) - per, per)
        own_seq = n_seq[owner]
        ids = base[owner] + local % own_seq
        at = bottom[owner] + local // own_seq
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
        self.sink.add_block(self.chain, self.binding, self.vars[s + 1], spread.rows[at], self.vars[s], ids,
                            np.concatenate(flats).astype(np.int64, copy=False), offsets)
        return rest

    # ------------------------------------------------------------ closures with iteration conditions
    def _first_ok(self, i: int, row) -> bool:
        return all(cd.first_ok(self.binding, row) for cd in self.iteration[i])

    def successors(self, i: int, c: Cands, j: int, b: int) -> list:
        """The candidates at [j+1, b) that may follow candidate j in element i's sequence: a key
        above j's, within the window of it, and the iteration conditions holding for the pair.
        What the conditions without another variable allow is kept for the whole partition
        (within the window); those reading other variables are checked for the current binding."""
        keyl, rowl = c.keyl, c.rowl
        cache = self._succ.setdefault(i, {})
        out = cache.get(j)
        if out is None:
            top = bisect_right(keyl, keyl[j] + self.w)
            r = rowl[j]
            pure = self._pure[i]
            self.spend(PYTHON_STEP_COST * (top - j))
            later = range(bisect_right(keyl, keyl[j], j, top), top)
            if len(pure) == 1:  # the usual case, without a generator per pair
                step = pure[0].step
                out = [k for k in later if truth(step(None, r, rowl[k]))]
            else:
                out = [k for k in later if all(cd.next_ok(None, r, rowl[k]) for cd in pure)]
            cache[j] = out
        if out and out[-1] >= b:
            out = out[:bisect_left(out, b)]
        mixed = self._mixed[i]
        if not mixed:
            return out
        each = self._each[i]  # conditions on the current event alone: decided once per event and binding
        kept = each.get((j, b))
        if kept is not None:
            return kept
        binding, r = self.binding, rowl[j]
        pairs = [cd for cd in mixed if cd.uses_prev]
        single = [cd for cd in mixed if not cd.uses_prev]
        kept = []
        for k in out:
            if single:
                ok = each.get(k)
                if ok is None:
                    ok = each[k] = all(cd.next_ok(binding, None, rowl[k]) for cd in single)
                if not ok:
                    continue
            if pairs and not all(cd.next_ok(binding, r, rowl[k]) for cd in pairs):
                continue
            kept.append(k)
        each[(j, b)] = kept
        return kept

    def _evict(self, trigger: int) -> None:
        """Drop the successor lists of candidates more than a window before ``trigger``: triggers
        come in key order, so no later match can hold them. Amortized: a pass when the lists have
        doubled since the last one."""
        size = sum(len(m) for m in self._succ.values())
        if size <= 2 * self._succ_kept + 64:
            return
        cut = trigger - self.w
        for i, cache in self._succ.items():
            keyl = self.cands[i].keyl
            self._succ[i] = {j: v for j, v in cache.items() if keyl[j] >= cut}
        self._succ_kept = sum(len(m) for m in self._succ.values())

    def iteration_sets(self, i: int, c: Cands, a: int, b: int, kb):
        """Every event sequence of element i in [a, b) whose events satisfy its iteration
        conditions, within the window of its first event, of a size within the bounds."""
        lo, hi = kb
        rowl = c.rowl
        for j0 in range(a, b):
            if not self._first_ok(i, rowl[j0]):
                continue
            stack = [(j0,)]
            while stack:
                path = stack.pop()
                self.spend(PYTHON_STEP_COST)
                if len(path) >= lo:
                    yield tuple(rowl[j] for j in path)
                if hi is not None and len(path) >= hi:
                    continue
                for k in reversed(self.successors(i, c, path[-1], b)):
                    stack.append(path + (k,))

    def scan_counted(self, s: int, i: int, c: Cands, a: int, b: int, lo_all, hi_all, weight: int) -> None:
        """Bind element i (unbounded, nothing reads it afterwards) by the first event of its valid
        sequences in [a, b) - and by the last too when it holds the trigger - with the number of
        sequences as weight (dynamic programming over the candidates, from the last backwards)."""
        keyl, rowl = c.keyl, c.rowl
        var = self.vars[s]
        if self.upper[s]:
            # the element is followed by elements bound already: its sequences end before them, so
            # only their first event matters; paths[j]: the valid sequences that begin with j
            block = s == self.block and not self.expand
            if block and self._out_of_reach(s, i, c, b, hi_all):
                return
            succ = [self.successors(i, c, j, b) for j in range(a, b)]
            if block and self._list_block(s, i, c, a, b, succ, lo_all, hi_all):
                return
            paths = {}
            for j in range(b - 1, a - 1, -1):
                paths[j] = 1 + sum(paths[k] for k in succ[j - a])
            listed: dict = {}  # candidate -> its sequences, listed once for every match that holds them
            for j in range(a, b):
                if self._first_ok(i, rowl[j]):
                    self.expand.append((var, paths[j], partial(self._listing, i, c, j, b, None, listed)))
                    try:
                        self.bind(s, i, (rowl[j],), keyl[j], keyl[j], lo_all, hi_all, weight * paths[j])
                    finally:
                        self.expand.pop()
            return
        for j1 in range(a, b):  # the trigger: each sequence ends at one candidate, its window before it
            j0 = bisect_left(keyl, keyl[j1] - self.w, a, j1)
            to_end = {j1: 1}  # the valid sequences from j to j1
            for j in range(j1 - 1, j0 - 1, -1):
                n = sum(to_end.get(k, 0) for k in self.successors(i, c, j, j1 + 1))
                if n:
                    to_end[j] = n
            listed = {}
            for j in sorted(to_end):
                if not self._first_ok(i, rowl[j]):
                    continue
                value = (rowl[j],) if j == j1 else (rowl[j], rowl[j1])
                self.expand.append((var, to_end[j], partial(self._listing, i, c, j, j1 + 1, j1, listed)))
                try:
                    self.bind(s, i, value, keyl[j], keyl[j1], lo_all, hi_all, weight * to_end[j])
                finally:
                    self.expand.pop()

    def _out_of_reach(self, s: int, i: int, c: Cands, b: int, hi_all) -> bool:
        """Whether no candidate of the spread step after step s is in reach of any first event of
        the closure below b (by bisection: most triggers of a sparse partition have none, and
        then no array need be built)."""
        t = s + 1
        keyl = self.cands[self.steps[t]].keyl
        top = len(keyl)
        for j in self.upper[t]:
            top = min(top, bisect_left(keyl, c.keyl[b - 1] if j == i else self.first[j]))
        return hi_all is not None and bisect_left(keyl, hi_all - self.w) >= top

    def _list_block(self, s: int, i: int, c: Cands, a: int, b: int, succ: list, lo_all, hi_all) -> bool:
        """List the matches of the current binding through the counted closure at step s and
        the spread step after it, for every first event in [a, b) at once: the closure's
        sequences as flat rows plus offsets and the matches as arrays (a compiled loop), handed
        to the sink as one block. The bounds are those ``bind`` and ``step`` apply to one first
        event, vectorized. False (nothing done) when the sizes are past counting exactly."""
        t = s + 1
        spread = self.cands[self.steps[t]]
        m = b - a
        keys = c.keys[a:b]
        lo2 = keys if lo_all is None else np.minimum(keys, lo_all)
        hi2 = keys if hi_all is None else np.maximum(keys, hi_all)
        w = self.w
        valid = hi2 - lo2 <= w
        if not all(cd.uses_prev for cd in self.iteration[i]):  # a condition on the first event too
            rowl = c.rowl
            valid &= np.fromiter((self._first_ok(i, rowl[j]) for j in range(a, b)), bool, m)
        ek = spread.keys
        hi = spread.n
        for j in self.upper[t]:
            hi = np.minimum(hi, np.searchsorted(ek, keys if j == i else self.first[j], "left"))
        lo = np.searchsorted(ek, hi2 - w, "left")
        hi = np.minimum(hi, np.searchsorted(ek, lo2 + w, "right"))
        for j in self.lower[t]:
            lo = np.maximum(lo, np.searchsorted(ek, keys if j == i else self.last[j], "right"))
        valid &= lo < hi
        if not valid.any():
            return True
        from matchrec.operators.cer_kleene_kernels import list_block
        off = np.fromiter(itertools.accumulate(map(len, succ), initial=0), np.int64, m + 1)
        idx = np.fromiter(itertools.chain.from_iterable(succ), np.int64, int(off[-1])) - a
        lo, hi = lo.astype(np.int64, copy=False), hi.astype(np.int64, copy=False)
        args = (off, idx, c.rows[a:b], valid, lo, hi, spread.rows)
        flat, offsets, rows, ids, size = list_block(*args, _LISTED_AT_ONCE)
        if size > _LISTED_AT_ONCE:  # charged (and checked against the limit) before it is listed
            if size >= _EXACT:
                return False
            self.spend(PYTHON_STEP_COST * (m + int(size)))
            if self.sink.max is not None and self.sink.n + int(size) > self.sink.max:
                raise too_many(self.sink.max)
            flat, offsets, rows, ids, size = list_block(*args, _EXACT)
        else:
            self.spend(PYTHON_STEP_COST * (m + int(size)))
        self.sink.add_block(self.chain, self.binding, self.vars[t], rows, self.vars[s], ids, flat, offsets)
        return True

    def _listing(self, i: int, c: Cands, j: int, b: int, end: int | None, listed: dict) -> list:
        """The valid sequences of element i that begin with candidate j, stay below b and (``end``
        not None) end at candidate ``end``, as row tuples. ``listed`` keeps each candidate's
        sequences (for one b and end): a sequence from j is j followed by one from a successor,
        so each is built once by one tuple concatenation, and matches that share a candidate
        (every a before the same first event of b) share its list."""
        out = listed.get(j)
        if out is not None:
            return out
        rowl = c.rowl
        stack = [j]
        while stack:  # post-order over the successors not listed yet
            x = stack[-1]
            if x in listed:
                stack.pop()
                continue
            nxt = self.successors(i, c, x, b)
            todo = [k for k in nxt if k not in listed]
            if todo:
                stack += todo
                continue
            stack.pop()
            head = (rowl[x],)
            if x == end:
                listed[x] = [head]
                continue
            seqs = [] if end is not None else [head]
            for k in nxt:
                tails = listed[k]
                if tails:
                    seqs += [head + t for t in tails]
            listed[x] = seqs
        return listed[j]

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

    def bind(self, s: int, i: int, value, k0: int, k1: int, lo_all, hi_all, weight: int) -> None:
        self.spend(PYTHON_STEP_COST)
        if s == 0 and self._succ:
            self._evict(k1)
        chain = self.chain
        lo2 = k0 if lo_all is None else min(lo_all, k0)
        hi2 = k1 if hi_all is None else max(hi_all, k1)
        if hi2 - lo2 > self.w:
            return
        var = self.vars[s]
        self.binding[var] = value
        self.first[i], self.last[i] = k0, k1
        pushed = False
        try:
            hollow = self.hollow.get(i)
            if hollow is not None:
                e, nn = hollow
                c = self.cands[e]
                ia, ib = bisect_right(c.keyl, k1), bisect_left(c.keyl, self.first[nn])
                lo, hi = chain.bounds[e]
                n = subset_count(c, ia, ib, lo, hi)
                if not n:
                    return
                weight *= n
                self.expand.append((chain.vars[e], n, partial(_framed, c, ia, ib, lo, hi, (), ())))
                pushed = True
            conds = self.conds[s]
            if conds and not conditions_hold(conds, self.binding):
                return
            for g in self.negs[s]:
                if not negation_holds(self.prep, self.part, chain, g, self.binding):
                    return
            self.step(s + 1, lo2, hi2, weight)
        finally:
            if pushed:
                self.expand.pop()
            del self.binding[var]

    def _polled(self, items):
        """``items``, asking the budget every 1,024 whether the statement must stop (the steps
        were charged before; a stop for memory must not wait for the whole listing)."""
        for k, item in enumerate(items):
            if not k & 1023:
                self.spend(0)
            yield item

    def finish(self, lo_all: int, hi_all: int, weight: int, spread: tuple | None = None) -> None:
        """Emit the matches of the current binding. ``spread``: (variable, rows) of the last step's
        single event, bound to each row in turn (then ``self.rest`` is empty)."""
        binding = self.binding
        for g in self.rest:
            if not negation_holds(self.prep, self.part, self.chain, g, binding, lo_all, hi_all):
                return
        if not self.keep:
            self.sink.add_count(self.chain, weight * (1 if spread is None else len(spread[1])))
            return
        if not self.expand and spread is None:
            self.sink.add(self.chain, binding)
            return
        # the event sets are listed below and every combination is a match: size them first
        counts = [n for _, n, _ in self.expand] + ([] if spread is None else [len(spread[1])])
        if self.sink.max is not None and math.prod(counts) > self.sink.max:
            raise too_many(self.sink.max)
        self.spend(PYTHON_STEP_COST * sum(counts))
        choices = [] if spread is None else [spread]
        for var, _, listing in self.expand:
            rows = listing()
            choices.append((var, rows if isinstance(rows, list) else list(self._polled(rows))))
        self.sink.add_product(self.chain, binding, choices)


ARRAY_LISTING = True  # False: every first event bound and listed as row tuples (the bench times both ways)
_SAFE = 1 << 61  # keys, windows and sizes below this keep int64 arithmetic exact
_LISTED_AT_ONCE = 1 << 20  # matches or rows of one trigger listed before the budget is asked
_EXACT = 1 << 52  # sizes counted in floating point are exact below this
_PAIRS_AT_LEAST = 16  # candidates of a trigger closure below which binding pair by pair costs less than numpy's calls
_BETWEEN_AT_MOST = 4  # candidates between a pair's first and last events whose subsets come from bit masks


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


def _framed(c: Cands, a: int, b: int, smin: int, smax: int | None, head: tuple, tail: tuple):
    """The subsets of [a, b) between ``head`` and ``tail`` rows."""
    for mid in subsets(c, a, b, smin, smax):
        yield head + mid + tail


def subsets(c: Cands, a: int, b: int, smin: int, smax: int | None):
    """Subsets of [a, b) with distinct keys, smallest first (the Banker's sequence), as row tuples."""
    groups = _key_groups(c, a, b)
    top = len(groups) if smax is None else min(smax, len(groups))
    for size in range(max(0, smin), top + 1):
        for combo in itertools.combinations(groups, size):
            yield from itertools.product(*combo)
