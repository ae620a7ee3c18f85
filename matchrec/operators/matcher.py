"""The reference matcher: SQL:2016 row pattern matching, simple and obviously correct.

For each candidate start row the program runs as a set of threads kept in priority order
(a Pike VM). All threads consume the same row together; a thread that reaches DONE ends
every thread of lower priority, and the last DONE reached by the highest-priority surviving
thread is the match. A thread that reaches an instruction already reached at the same row
by an *equivalent* thread is dropped: its future is identical and it has lower priority.
Two threads are equivalent when they share the instruction and, unless every DEFINE still
reachable from there ignores the match history, the whole sequence of labels so far.

This module is the oracle for every faster operator; keep it plain.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from matchrec.budget import REFERENCE_STEP_COST, Budget
from matchrec.operators.program import DONE, END, JUMP, MATCH, SAVE, SPLIT, START, Program


class MatchLimitExceeded(Exception):
    def __init__(self, setting: str, limit: int):
        super().__init__(setting, limit)
        self.setting, self.limit = setting, limit


class Labels:
    """Immutable cons list of label ids (the labels of a partial match, last row first)."""

    __slots__ = ("label", "prev", "length", "_hash")

    def __init__(self, label: int, prev: "Labels | None"):
        self.label = label
        self.prev = prev
        self.length = 1 if prev is None else prev.length + 1
        self._hash = hash((label, prev._hash if prev is not None else 0))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        a, b = self, other
        while a is not b:
            if a is None or b is None or a._hash != b._hash or a.label != b.label:
                return False
            a, b = a.prev, b.prev
        return True

    def to_list(self) -> list[int]:
        out = [0] * self.length
        node, i = self, self.length - 1
        while node is not None:
            out[i] = node.label
            node, i = node.prev, i - 1
        return out


class ConsView:
    """Label access for DEFINE evaluation on a partial match held as a ``Labels`` list."""

    __slots__ = ("node",)

    def __init__(self, node: Labels | None):
        self.node = node

    def __len__(self) -> int:
        return 0 if self.node is None else self.node.length

    def last_index(self, labels: frozenset[int] | None, upto: int, k: int) -> int:
        """Relative index of the (k+1)-th row at or before ``upto`` (backwards) in ``labels``; -1 if none."""
        node, i = self.node, len(self) - 1
        while node is not None and i > upto:
            node, i = node.prev, i - 1
        found = 0
        while node is not None:
            if labels is None or node.label in labels:
                if found == k:
                    return i
                found += 1
            node, i = node.prev, i - 1
        return -1

    def as_list(self) -> list[int]:
        return [] if self.node is None else self.node.to_list()


class ListView:
    """Label access on a complete match (a plain list of label ids)."""

    __slots__ = ("labels",)

    def __init__(self, labels: list[int]):
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def last_index(self, labels: frozenset[int] | None, upto: int, k: int) -> int:
        found = 0
        for i in range(min(upto, len(self.labels) - 1), -1, -1):
            if labels is None or self.labels[i] in labels:
                if found == k:
                    return i
                found += 1
        return -1

    def as_list(self) -> list[int]:
        return self.labels


@dataclass
class MatchResult:
    labels: list[int]  # label id per matched row, relative to the start row
    exclusions: list[tuple[int, int]]  # relative [start, end) ranges excluded from ALL ROWS output


# evaluate(label_id, labels_including_current: Labels, row) -> bool
Evaluate = Callable[[int, Labels, int], bool]


class Matcher:
    def __init__(self, program: Program, history_dependent: list[bool], max_threads: int = 1_000_000,
                 budget: Budget | None = None):
        self.code = program.code
        self.history_dependent = history_dependent
        self.budget = budget
        reach = program.reachable_labels()
        # a thread's future can depend on its labels only if some reachable DEFINE reads history
        self.keyed = [any(history_dependent[label] for label in reach[pc]) for pc in range(len(self.code))]
        self.max_threads = max_threads

    def find(self, start: int, n: int, evaluate: Evaluate,
             within_ok: Callable[[int, int], bool] | None = None) -> MatchResult | None:
        """The preferred match starting at row ``start`` of a partition of ``n`` rows, or None."""
        code = self.code
        current: list[tuple[int, Labels | None, tuple]] = []
        self._closure(0, None, (), start, n, start, current, {})
        result = None
        idx = start
        budget, history = self.budget, self.history_dependent
        while current:
            nxt: list = []
            visited: dict = {}
            # the budget's steps: each thread taking this row, plus the history rows a condition
            # may walk (a DEFINE that reads the match so far can cost its length)
            cost = REFERENCE_STEP_COST * len(current)
            for pc, labels, caps in current:
                op = code[pc].op
                if op == DONE:
                    result = (labels, caps)
                    break  # lower-priority threads die
                if idx >= n:
                    continue
                label = code[pc].a
                node = Labels(label, labels)
                if history[label]:
                    cost += node.length
                if within_ok is not None and not within_ok(start, idx):
                    continue
                if evaluate(label, node, idx):
                    self._closure(pc + 1, node, caps, idx + 1, n, start, nxt, visited)
            if len(nxt) > self.max_threads:
                raise MatchLimitExceeded("matchrec_max_threads", self.max_threads)
            if budget is not None:
                budget.spend(cost)
            current = nxt
            idx += 1
        if result is None:
            return None
        labels, caps = result
        label_list = labels.to_list() if labels is not None else []
        exclusions = [(caps[i] - start, caps[i + 1] - start) for i in range(0, len(caps) - 1, 2)]
        return MatchResult(label_list, exclusions)

    def _closure(self, pc: int, labels, caps: tuple, idx: int, n: int, start: int, out: list,
                 visited: dict) -> None:
        """Follow non-consuming instructions from ``pc`` in priority order; park threads at MATCH/DONE."""
        code, keyed = self.code, self.keyed
        stack = [(pc, caps)]
        while stack:
            pc, caps = stack.pop()
            key = labels if keyed[pc] else None
            seen = visited.get(pc)
            if seen is None:
                visited[pc] = {key}
            elif key in seen:
                continue
            else:
                seen.add(key)
            ins = code[pc]
            op = ins.op
            if op == MATCH or op == DONE:
                out.append((pc, labels, caps))
            elif op == SPLIT:
                stack.append((ins.b, caps))
                stack.append((ins.a, caps))
            elif op == JUMP:
                stack.append((ins.a, caps))
            elif op == SAVE:
                stack.append((pc + 1, caps + (idx,)))
            elif op == START:
                if idx == 0:
                    stack.append((pc + 1, caps))
            elif op == END:
                if idx == n:
                    stack.append((pc + 1, caps))
