"""CER eager NFA (SASE-style baseline).

This module owns the eager evaluation mechanism: each alternative of the pattern is an NFA whose
states are its positive elements; events are read in stream order, one group of equal keys at a
time, and every partial match (instance) waiting in a state is extended by every event that the
state's element can take. A Kleene element has an open instance (it may take more events) and a
closed one (the element is complete) per number of events taken. Selection strategies act on the
instances: skip-till-any-match keeps an instance after it is extended, skip-till-next-match drops
it after the first group holding an event relevant to it, strict contiguity after the row that
follows its last event. Negations between two elements are checked when the later one completes,
leading and trailing ones when the match completes. A condition over a Kleene iteration
(``b[i]`` against ``b[i-1]``) whose other variables are bound before the closure is checked on
each event the closure takes, so instances that fail it are never created. An AND is evaluated as the permutations of
its items (an NFA over a partial order would need a state per subset of them).
"""
from __future__ import annotations

from matchrec.budget import PYTHON_STEP_COST
from matchrec.operators.cer_common import (ChainPlan, Partition, Prepared, Sink, conditions_hold,
                                          negation_holds, too_many_partial)
from matchrec.operators.cer_reference import IterationCondition

A, K = 0, 1  # instance kinds: waiting to begin element k / inside Kleene element k (open)


def evaluate(prep: Prepared, sink: Sink, order=None) -> None:
    for chain in prep.chains:
        if chain.empty():
            continue
        for part in prep.parts:
            _Run(prep, sink, chain, part).go()


class _Run:
    def __init__(self, prep: Prepared, sink: Sink, chain: ChainPlan, part: Partition):
        self.prep, self.sink, self.chain, self.part = prep, sink, chain, part
        P = chain.positive
        self.m = len(P)
        self.vars = [chain.vars[i] for i in P]
        self.masks = [prep.mask(chain.elements[i])[part.rows].tolist() for i in P]
        self.kle = [chain.bounds.get(i) for i in P]
        # conditions over a Kleene iteration whose other variables are bound before it: checked on
        # each event the closure takes (a sequence that fails one event fails whatever follows)
        self.iteration = [[] for _ in P]
        for k, i in enumerate(P):
            before = set(self.vars[:k])
            self.iteration[k] = [c for c in chain.conditions if isinstance(c, IterationCondition)
                                 and c.var == self.vars[k] and c.others <= before]
        stepwise = {id(c) for cs in self.iteration for c in cs}
        self.conds, self.negs, self.rest = chain.schedule(
            P, [c for c in chain.conditions if id(c) not in stepwise])
        self.start_conds = [chain.start_conditions[i] for i in P]
        self.window = prep.window
        self.strategy = prep.strategy
        # live instances per state: (vals, cur, first key, last key, last position)
        self.waiting = [[] for _ in range(self.m)]  # A: elements < k complete (index 0 unused)
        self.inside = [[] for _ in range(self.m)]  # K: open Kleene element k
        # partial matches held at once: what the eager NFA's memory grows with
        self.live = 0
        self.max_live = sink.max_partial
        self.spend = sink.spend

    def go(self) -> None:
        keyl = self.part.keyl
        n = len(keyl)
        q = 0
        any_mask = [any(col) for col in zip(*self.masks)] if self.strategy != "strict" else None
        while q < n:
            k0 = keyl[q]
            q1 = q + 1
            while q1 < n and keyl[q1] == k0:
                q1 += 1
            if any_mask is None or any(any_mask[q:q1]):
                self.group(k0, q, q1)
            q = q1

    # ---------------------------------------------------------------- one group of equal keys
    def group(self, key: int, q0: int, q1: int) -> None:
        created: list = []
        if self.strategy == "any":
            self._group_any(key, q0, q1, created)
        else:
            self._group_selective(key, q0, q1, created)
        for q in range(q0, q1):
            if self.masks[0][q]:
                self.begin(0, (), self.part.rowl[q], q, key, created)
        for kind, k, inst in created:
            (self.waiting if kind == A else self.inside)[k].append(inst)
        self.spend(PYTHON_STEP_COST * (q1 - q0 + len(created)))
        self.live += len(created)
        if self.max_live is not None and self.live > self.max_live:
            raise too_many_partial(self.max_live)

    def _group_any(self, key, q0, q1, created) -> None:
        w = self.window
        rowl = self.part.rowl
        for k in range(self.m):
            mk = self.masks[k]
            hits = [q for q in range(q0, q1) if mk[q]]
            if not hits:
                continue
            for lists, kind in ((self.waiting, A), (self.inside, K)):
                live = lists[k]
                if not live:
                    continue
                keep = [inst for inst in live if key - inst[2] <= w]
                lists[k] = keep
                self.live -= len(live) - len(keep)
                for inst in keep:
                    for q in hits:
                        if kind == A:
                            self.begin(k, inst[0], rowl[q], q, inst[2], created)
                        else:
                            self.grow(k, inst, rowl[q], q, created)

    def _group_selective(self, key, q0, q1, created) -> None:
        w = self.window
        rowl = self.part.rowl
        strict = self.strategy == "strict"
        masks = self.masks
        for lists, kind in ((self.waiting, A), (self.inside, K)):
            for k in range(self.m):
                live = lists[k]
                if not live:
                    continue
                keep = []
                for inst in live:
                    vals, cur, fk, lk, lp = inst
                    if key - fk > w:
                        continue
                    if strict:
                        target = lp + 1
                        if target < q1:
                            if target >= q0:
                                self._take(kind, k, inst, target, rowl[target], created)
                            continue  # the row after its last event is gone
                        keep.append(inst)
                        continue
                    relevant = False
                    for q in range(q0, q1):
                        if kind == A:
                            if masks[k][q]:
                                self.begin(k, vals, rowl[q], q, fk, created)
                            relevant = relevant or self._relevant_waiting(k, vals, q, rowl[q])
                        else:
                            if masks[k][q]:
                                self.grow(k, inst, rowl[q], q, created)
                                relevant = True
                            elif k + 1 < self.m and masks[k + 1][q] and self._could_begin(k + 1, vals, rowl[q]):
                                relevant = True
                    if not relevant:
                        keep.append(inst)
                lists[k] = keep
                self.live -= len(live) - len(keep)

    def _take(self, kind, k, inst, q, r, created) -> None:
        if not self.masks[k][q]:
            return
        if kind == A:
            self.begin(k, inst[0], r, q, inst[2], created)
        else:
            self.grow(k, inst, r, q, created)

    def _relevant_waiting(self, k: int, vals: tuple, q: int, r: int) -> bool:
        """Skip-till-next-match: could the event at q have grown the (closed) Kleene element
        before k, or begun element k?"""
        b = self.kle[k - 1]
        if b is not None and (b[1] is None or len(vals[k - 1]) < b[1]) and self.masks[k - 1][q]:
            return True
        return bool(self.masks[k][q]) and self._could_begin(k, vals, r)

    def _could_begin(self, k: int, vals: tuple, r: int) -> bool:
        if self.kle[k] is not None:
            return True
        var = self.vars[k]
        conds = self.start_conds[k]
        if not conds:
            return True
        trial = dict(zip(self.vars, vals))
        trial[var] = r
        conds = [c for c in conds if c.vars <= trial.keys()]
        return conditions_hold(conds, trial)

    # ---------------------------------------------------------------- transitions
    def begin(self, k: int, vals: tuple, r: int, q: int, fk: int | None, created) -> None:
        key = self.part.keyl[q]
        if not vals:
            fk = key
        b = self.kle[k]
        if b is None:
            self.complete(k, vals + (r,), fk, key, q, created)
            return
        lo, hi = b
        if self.iteration[k]:
            binding = dict(zip(self.vars, vals))
            if not all(c.first_ok(binding, r) for c in self.iteration[k]):
                return
        if hi is None or hi > 1:
            created.append((K, k, (vals, (r,), fk, key, q)))
        if lo <= 1:
            self.complete(k, vals + ((r,),), fk, key, q, created)

    def grow(self, k: int, inst, r: int, q: int, created) -> None:
        vals, cur, fk, _, _ = inst
        if self.iteration[k]:
            binding = dict(zip(self.vars, vals))
            if not all(c.next_ok(binding, cur[-1], r) for c in self.iteration[k]):
                return
        key = self.part.keyl[q]
        cur = cur + (r,)
        lo, hi = self.kle[k]
        t = len(cur)
        if hi is None or t < hi:
            created.append((K, k, (vals, cur, fk, key, q)))
        if t >= lo:
            self.complete(k, vals + (cur,), fk, key, q, created)

    def complete(self, k: int, vals: tuple, fk: int, lk: int, lp: int, created) -> None:
        last = k == self.m - 1
        conds, negs = self.conds[k], self.negs[k]
        if conds or negs or last:
            binding = dict(zip(self.vars, vals))
            if conds and not conditions_hold(conds, binding):
                return
            for g in negs:
                if not negation_holds(self.prep, self.part, self.chain, g, binding):
                    return
            if last:
                for g in self.rest:
                    if not negation_holds(self.prep, self.part, self.chain, g, binding, fk, lk):
                        return
                self.sink.add(self.chain, binding)
                return
        created.append((A, k + 1, (vals, None, fk, lk, lp)))
