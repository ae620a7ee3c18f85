"""CER lazy NFAs: the lazy chain NFA and the tree NFA (lazy instantiation with run-time order).

This module owns both lazy mechanisms. Events are buffered per element (the candidate rows of
each element, in key order, per partition); nothing happens on an event of a frequent type. A
match is built only from the events of the element first in the evaluation order - by default
the rarest - by binding the other elements one at a time in that order, each by binary search
in its buffer: the keys allowed for an element are bounded by its nearest bound neighbours in
the sequence (strict order) and by the window around everything bound so far, so the search
never looks at events that cannot be in a match with what is bound.

* chain: one order per alternative, from ``order`` (variable names) or from the elements'
  candidate counts, Kleene elements last (their subsets are enumerated only once the rest is
  bound and their range is narrow).
* tree: the order is planned again per instance: per candidate of the alternative's anchor (its
  rarest single-event element), from the counts of each element's candidates within that
  instance's window, so a drift in the rates - or a burst of one type - changes the order where
  it happens. The plan of an instance is a left-deep tree of joins rooted at its anchor.

An alternative may be a partial order (an AND kept whole, see ``cer_mechanisms``): then an
element's range is bounded by the latest bound element that must precede it and the earliest
bound one that must follow it, and by the AND's other items: once its own item has a bound
element it stays on that side of each other item's span, else its events avoid those spans
(the buffer range is cut around them; a Kleene element's events lie in one piece). Items of
single events thus only need distinct keys.

Conditions are checked as soon as their variables are bound. Negation is checked at first
chance (as soon as both neighbours and the variables its conditions read are bound) or, with
``negation="post"``, on complete matches. Skip-till-next-match and strict contiguity prune the
search where the decision does not depend on unbound variables and are checked exactly on
complete matches.
"""
from __future__ import annotations

import random
from bisect import bisect_left, bisect_right

import numpy as np

from matchrec.budget import PYTHON_STEP_COST
from matchrec.operators.cer_common import (AttributeEquality, ChainPlan, Partition, Prepared, Sink,
                                          conditions_hold, is_null, negation_holds, next_holds, strict_holds)

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
VECTOR_MIN = 8  # buffer ranges at least this long are filtered by attribute equalities in one numpy pass


def evaluate_chain(prep: Prepared, sink: Sink, order=None, negation: str = "first",
                   vector_min: int = VECTOR_MIN) -> None:
    for chain in prep.chains:
        if chain.empty():
            continue
        counts = {i: int(prep.mask(chain.elements[i]).sum()) for i in chain.positive}
        plan = chain_order(chain, counts, order)
        for part in prep.parts:
            Search(prep, sink, chain, part, plan, negation, vector_min).run()


def evaluate_tree(prep: Prepared, sink: Sink, order=None, negation: str = "first", seed: int | None = None) -> None:
    """``order`` is ignored: each instance plans its own. An alternative's instances are the
    candidates of its anchor - the single-event element with the fewest candidates overall, which
    every match binds exactly once - and each instance binds its anchor first, then the other
    elements greedily by their candidates in its window (``instance_counts``): a rare element
    where the instance lies is searched early even if it is frequent elsewhere. Consecutive
    instances with the same order are searched as one range of anchors. ``seed`` (tests): a random
    order after the anchor per instance, to show the result does not depend on the orders."""
    rng = None if seed is None else random.Random(seed)
    for chain in prep.chains:
        if chain.empty():
            continue
        singles = [i for i in chain.positive if i not in chain.bounds]
        if not singles:
            # every positive element is a Kleene closure: one instance per partition
            for part in prep.parts:
                counts = {i: part.cands(chain.elements[i]).n for i in chain.positive}
                Search(prep, sink, chain, part, chain_order(chain, counts, None), negation).run()
            continue
        totals = {i: int(prep.mask(chain.elements[i]).sum()) for i in singles}
        anchor = min(singles, key=lambda i: (totals[i], i))
        for part in prep.parts:
            anchors = part.cands(chain.elements[anchor])
            if not anchors.n:
                continue
            counts = instance_counts(prep, chain, part, anchor, anchors.keys)
            others = [i for i in chain.positive if i != anchor]
            searches: dict = {}
            memo: dict = {}
            start, current = 0, None
            for j in range(anchors.n + 1):
                if j < anchors.n:
                    local = tuple(int(counts[i][j]) for i in others)
                    if rng is not None:
                        plan = (anchor,) + tuple(rng.sample(others, len(others)))
                    else:
                        plan = memo.get(local)
                        if plan is None:
                            plan = memo[local] = tuple(instance_order(chain, anchor, dict(zip(others, local))))
                    if plan == current:
                        continue
                if current is not None:
                    s = searches.get(current)
                    if s is None:
                        s = searches[current] = Search(prep, sink, chain, part, list(current), negation)
                    s.run(only=(start, j))
                if j < anchors.n:
                    start, current = j, plan


def instance_counts(prep: Prepared, chain: ChainPlan, part: Partition, anchor: int, keys: np.ndarray) -> dict:
    """Per positive element other than the anchor, for every anchor candidate (key in ``keys``), its
    candidates in reach of that instance: within the window before the anchor's key when it must
    precede the anchor, after it when it must follow, on both sides when an AND leaves them unordered."""
    w = prep.window
    with np.errstate(over="ignore"):  # saturated: a window without WITHIN reaches every key
        low = np.where(keys < I64_MIN + w, I64_MIN, keys - w)
        high = np.where(keys > I64_MAX - w, I64_MAX, keys + w)
    out = {}
    for i in chain.positive:
        if i == anchor:
            continue
        ck = part.cands(chain.elements[i]).keys
        if i in chain.preds[anchor]:
            lo, hi = np.searchsorted(ck, low, "left"), np.searchsorted(ck, keys, "left")
        elif i in chain.succs[anchor]:
            lo, hi = np.searchsorted(ck, keys, "right"), np.searchsorted(ck, high, "right")
        else:
            lo, hi = np.searchsorted(ck, low, "left"), np.searchsorted(ck, high, "right")
        out[i] = hi - lo
    return out


def instance_order(chain: ChainPlan, anchor: int, counts: dict) -> list[int]:
    """The anchor, then the others as ``chain_order`` would bind them after it."""
    return [anchor] + _greedy(chain, counts, [i for i in chain.positive if i != anchor], {chain.vars[anchor]})


def chain_order(chain: ChainPlan, counts: dict, order) -> list[int]:
    """Positive elements in evaluation order, single events before Kleene elements. With ``order``
    (variable names) as it says; else greedily the element with the fewest expected candidates:
    its count, scaled down by each condition linking it to what is bound (0.1 for an attribute
    equality, 0.5 for any other), so a selective join is searched before an unrelated element."""
    if order:
        rank = {v: n for n, v in enumerate(order)}
        big = len(rank) + 1
        return sorted(chain.positive, key=lambda i: (i in chain.bounds, rank.get(chain.vars[i], big),
                                                counts.get(i, 0), i))
    return _greedy(chain, counts, list(chain.positive), set())


def _greedy(chain: ChainPlan, counts: dict, left: list, bound: set) -> list[int]:
    out: list[int] = []
    while left:
        def cost(i):
            v = chain.vars[i]
            c = float(counts.get(i, 0))
            for cd in chain.conditions:
                rest = cd.vars - {v}
                if v in cd.vars and rest and rest <= bound:
                    c *= 0.1 if isinstance(cd, AttributeEquality) else 0.5
            return (i in chain.bounds, c, i)
        i = min(left, key=cost)
        out.append(i)
        left.remove(i)
        bound.add(chain.vars[i])
    return out


class Search:
    """The lazy search of one alternative in one partition for one evaluation order."""

    def __init__(self, prep: Prepared, sink: Sink, chain: ChainPlan, part: Partition, order: list[int],
                 negation: str = "first", vector_min: int = VECTOR_MIN):
        self.prep, self.sink, self.chain, self.part = prep, sink, chain, part
        self.spend = sink.spend
        self.order = order
        self.w = prep.window
        self.strategy = prep.strategy
        self.cands = [part.cands(chain.elements[i]) for i in order]
        conds, negs, rest = chain.schedule(order)
        if negation == "post":
            negs, rest = [[] for _ in order], list(chain.negations)
        self.conds, self.negs, self.rest = conds, negs, rest
        self.vars = [chain.vars[i] for i in order]
        self.kle = [chain.bounds.get(i) for i in order]
        # the bound elements each step's element must follow / precede are known from the order alone:
        # the latest of those before it and the earliest of those after it (a chain: its bound neighbours)
        self.lower, self.upper = [], []
        for s, i in enumerate(order):
            lo = {j for j in order[:s] if j in chain.preds[i]}
            hi = {j for j in order[:s] if j in chain.succs[i]}
            self.lower.append(sorted(order.index(j) for j in lo if not chain.succs[j] & lo))
            self.upper.append(sorted(order.index(j) for j in hi if not chain.preds[j] & hi))
        # per step the spans of an AND's items to keep apart (empty for a chain)
        self.apart = chain.apart_steps(order)
        self.pred = [lo[0] if chain.total and lo else None for lo in self.lower]
        self.succ = [hi[0] if chain.total and hi else None for hi in self.upper]
        # whether a bound neighbour is adjacent in the sequence (no positive element between)
        self.pred_adj = [p is not None and chain.prev_positive.get(i) == order[p] for i, p in zip(order, self.pred)]
        self.succ_adj = [p is not None and chain.next_positive.get(i) == order[p] for i, p in zip(order, self.succ)]
        # skip-till-next-match: an event could begin the element without looking at bindings
        self.static_start = [i in chain.bounds or not chain.start_conditions[i] for i in order]
        m = len(order)
        self.first = [0] * m  # per step: first / last key and first / last position of its events
        self.last = [0] * m
        self.fpos = [0] * m
        self.lpos = [0] * m
        self.binding: dict = {}
        # an equality between a single-event element and a bound variable selects its candidates
        # by value in one pass over the buffer range, instead of one condition call per candidate
        self.vector_min = vector_min
        kleene_vars = {chain.vars[i] for i in chain.bounds}
        self.equal_to = []
        self.conds_filtered = []  # a step's conditions left to call after the numpy pass
        for st, i in enumerate(order):
            eqs = []
            if i not in chain.bounds:
                for c in self.conds[st]:
                    if isinstance(c, AttributeEquality) and len(c.column) == prep.n:
                        other = sorted(v for v in c.vars if v != self.vars[st])
                        if other:
                            # exact when it names one other single-event variable: no need to call it
                            exact = len(other) == 1 and other[0] not in kleene_vars
                            eqs.append((c.column, c.column[self.cands[st].rows], other[0], c if exact else None))
            self.equal_to.append(eqs)
            done = {id(e[3]) for e in eqs if e[3] is not None}
            self.conds_filtered.append([c for c in self.conds[st] if id(c) not in done])

    def run(self, only: tuple | None = None) -> None:
        """Every match; with ``only`` (a, b), those whose first element in the order binds one of
        its candidates a to b - 1 (a tree instance's anchors)."""
        self.only = only
        if not all(c.n for c in self.cands):
            return
        self.step(0, None, None)

    # ---------------------------------------------------------------- binding one element
    def bounds(self, s: int, lo_all, hi_all) -> tuple[int, int, int | None, int | None, list | None]:
        """Index range [a, b) in step s's buffer, the key limits of its first / last event, and the
        key ranges [h0, h1] its events must avoid (the spans of other items of an AND)."""
        c = self.cands[s]
        keyl = c.keyl
        a, b = 0, c.n
        if s == 0 and self.only is not None:
            a, b = self.only
        p, q = self.pred[s], self.succ[s]
        for t in self.lower[s]:
            a = max(a, bisect_right(keyl, self.last[t]))
        for t in self.upper[s]:
            b = min(b, bisect_left(keyl, self.first[t]))
        holes = None
        for own, other in self.apart[s]:
            h0 = min(self.first[t] for t in other)
            h1 = max(self.last[t] for t in other)
            if own:
                # the item is already on one side of the other one: all its events stay there
                if h1 < min(self.first[t] for t in own):
                    a = max(a, bisect_right(keyl, h1))
                else:
                    b = min(b, bisect_left(keyl, h0))
            elif holes is None:
                holes = [(h0, h1)]
            else:
                holes.append((h0, h1))
        if lo_all is not None:
            a = max(a, bisect_left(keyl, hi_all - self.w))
            b = min(b, bisect_right(keyl, lo_all + self.w))
        first_max = last_min = None
        if self.strategy == "next":
            if self.pred_adj[s]:
                # the first event comes no later than the first event relevant after the predecessor
                lim = None
                if self.static_start[s]:
                    a0 = bisect_right(keyl, self.last[p])
                    if a0 < c.n:
                        lim = keyl[a0]
                pb = self.kle[p]
                if pb is not None and (pb[1] is None or self.count(p) < pb[1]):
                    pc = self.cands[p]
                    j = bisect_right(pc.keyl, self.last[p])
                    if j < pc.n:
                        lim = pc.keyl[j] if lim is None else min(lim, pc.keyl[j])
                first_max = lim
            if self.succ_adj[s] and self.static_start[q]:
                # no event that could begin the successor lies between this element and it
                qc = self.cands[q]
                j = bisect_left(qc.keyl, self.first[q])
                if j > 0:
                    last_min = qc.keyl[j - 1] if last_min is None else max(last_min, qc.keyl[j - 1])
        return a, b, first_max, last_min, holes

    def count(self, s: int) -> int:
        v = self.binding[self.vars[s]]
        return len(v) if isinstance(v, tuple) else 1

    def step(self, s: int, lo_all, hi_all) -> None:
        if s == len(self.order):
            self.finish(lo_all, hi_all)
            return
        a, b, first_max, last_min, holes = self.bounds(s, lo_all, hi_all)
        if a >= b:
            return
        if holes is None:
            self.scan(s, a, b, first_max, last_min, lo_all, hi_all)
            return
        # an event set inside one gap between the holes (a Kleene element never straddles a hole)
        keyl = self.cands[s].keyl
        for h0, h1 in sorted(holes):
            x = bisect_left(keyl, h0, a, b)
            if x > a:
                self.scan(s, a, x, first_max, last_min, lo_all, hi_all)
            a = max(a, bisect_right(keyl, h1, a, b))
        if a < b:
            self.scan(s, a, b, first_max, last_min, lo_all, hi_all)

    def scan(self, s: int, a: int, b: int, first_max, last_min, lo_all, hi_all) -> None:
        """Bind step s's element to the candidates (Kleene: event sets) in buffer range [a, b)."""
        c = self.cands[s]
        if first_max is not None:
            b_first = min(b, bisect_right(c.keyl, first_max))
        else:
            b_first = b
        if self.kle[s] is None:
            if last_min is not None:
                a = max(a, bisect_left(c.keyl, last_min))
            b = min(b, b_first)
            if self.strategy == "strict":
                a, b = self.strict_single(s, c, a, b)
            if self.equal_to[s] and b - a >= self.vector_min:
                sel = np.ones(b - a, bool)
                for column, values, var, _ in self.equal_to[s]:
                    v = self.binding[var]
                    x = column[v[0] if isinstance(v, tuple) else v]
                    if is_null(x):
                        return
                    sel &= values[a:b] == x
                js = (np.flatnonzero(sel) + a).tolist()
                conds = self.conds_filtered[s]
            else:
                js = range(a, b)
                conds = self.conds[s]
            for j in js:
                self.bind(s, c.rowl[j], c.keyl[j], c.keyl[j], c.posl[j], c.posl[j], lo_all, hi_all, conds)
            return
        for rows, k0, k1, p0, p1 in self.subsets(s, c, a, b, b_first, last_min, lo_all, hi_all):
            self.bind(s, rows, k0, k1, p0, p1, lo_all, hi_all)

    def strict_single(self, s: int, c, a: int, b: int) -> tuple[int, int]:
        """Strict contiguity: the one candidate next to an adjacent bound neighbour."""
        want = None
        if self.pred_adj[s]:
            want = self.lpos[self.pred[s]] + 1
        if self.succ_adj[s]:
            w2 = self.fpos[self.succ[s]] - 1
            if want is not None and want != w2:
                return a, a
            want = w2
        if want is None:
            return a, b
        j = bisect_left(c.posl, want)
        if j < c.n and c.posl[j] == want and a <= j < b:
            return j, j + 1
        return a, a

    def subsets(self, s, c, a, b, b_first, last_min, lo_all, hi_all):
        """Event sets of a Kleene element in buffer range [a, b): strictly increasing keys, size
        within the bounds, inside the window; under skip-till-next-match each event is the next
        candidate by key, under strict contiguity the next row."""
        lo, hi = self.kle[s]
        w = self.w
        keyl, posl, rowl = c.keyl, c.posl, c.rowl
        strategy = self.strategy
        want_first = want_last = None
        if strategy == "strict":
            if self.pred_adj[s]:
                want_first = self.lpos[self.pred[s]] + 1
            if self.succ_adj[s]:
                want_last = self.fpos[self.succ[s]] - 1
        out = []
        picked: list = []

        def grow(j):
            k = keyl[j]
            t = len(picked)
            if t >= lo and (last_min is None or k >= last_min) and (want_last is None or posl[j] == want_last):
                out.append((tuple(rowl[x] for x in picked), keyl[picked[0]], k, posl[picked[0]], posl[j]))
            if hi is not None and t >= hi:
                return
            kmin = keyl[picked[0]] if lo_all is None else min(lo_all, keyl[picked[0]])
            if strategy == "strict":
                nj = j + 1
                if nj < b and posl[nj] == posl[j] + 1 and keyl[nj] > k and keyl[nj] - kmin <= w:
                    picked.append(nj)
                    grow(nj)
                    picked.pop()
                return
            nj = bisect_right(keyl, k, j + 1, b)
            if strategy == "next":
                end = bisect_right(keyl, keyl[nj], nj, b) if nj < b else nj
            else:
                end = b
            for x in range(nj, end):
                if keyl[x] - kmin > w:
                    break
                picked.append(x)
                grow(x)
                picked.pop()

        for j in range(a, b_first):
            if want_first is not None and posl[j] != want_first:
                continue
            picked.append(j)
            grow(j)
            picked.pop()
        return out

    def bind(self, s: int, value, k0: int, k1: int, p0: int, p1: int, lo_all, hi_all, conds=None) -> None:
        self.spend(PYTHON_STEP_COST)
        binding = self.binding
        binding[self.vars[s]] = value
        self.first[s], self.last[s], self.fpos[s], self.lpos[s] = k0, k1, p0, p1
        try:
            lo2 = k0 if lo_all is None else min(lo_all, k0)
            hi2 = k1 if hi_all is None else max(hi_all, k1)
            if hi2 - lo2 > self.w:
                return
            if conds is None:
                conds = self.conds[s]
            if conds and not conditions_hold(conds, binding):
                return
            for g in self.negs[s]:
                if not negation_holds(self.prep, self.part, self.chain, g, binding):
                    return
            self.step(s + 1, lo2, hi2)
        finally:
            del binding[self.vars[s]]

    def finish(self, lo_all: int, hi_all: int) -> None:
        binding = self.binding
        for g in self.rest:
            if not negation_holds(self.prep, self.part, self.chain, g, binding, lo_all, hi_all):
                return
        if self.strategy == "strict" and not strict_holds(self.prep, self.chain, binding):
            return
        if self.strategy == "next" and not next_holds(self.prep, self.part, self.chain, binding):
            return
        self.sink.add(self.chain, binding)
