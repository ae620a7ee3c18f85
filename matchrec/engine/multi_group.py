"""A group of CER statements over one source, evaluated together (``run_many``), and the batch
operator for one statement (``evaluate_read``).

A group reads its events once (``engine.multi_read``), gives its statements' elements shared
classes and compiles their conditions (``engine.multi_classes``), evaluates the statements the
shared operator takes in one pass and the others one by one (``engine.multi_eval``), and adds
its lines to the run's report (``engine.multi_report``). The group only needs of its run the
options (``share``, ``reorder``, ``slice_events``), the counters (``stats``, ``report``,
``table_of``) and ``duck_and_settings()``; it imports neither ``engine.multi`` nor ``engine.cer``,
so ``engine.cer`` can use it for its batch mechanism.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from matchrec import budget as work
from matchrec.engine.multi_classes import ElementClasses, prepare
from matchrec.engine.multi_eval import SLICE_EVENTS, evaluate_alone, evaluate_shared, threads_of
from matchrec.engine.multi_read import read_group
from matchrec.engine.multi_report import listed
from matchrec.operators import cer_shared as O
from matchrec.parser import sase as S
from matchrec.planner import cer as P

__all__ = ["SLICE_EVENTS", "Statement", "evaluate_read"]


@dataclass
class Statement:
    """One statement of a group: its query and plan, how it is evaluated and what it found."""
    index: int
    sql: str
    query: S.CerQuery
    plan: P.CerPlan
    shared: bool = False
    why: str = ""
    count: int = 0
    matches: list | None = None
    units: list = field(default_factory=list)  # indexes of its units in the group
    never: list = field(default_factory=list)  # variables of conditions false for every binding (``prepare``)


class _Group:
    """Statements over one source: one read, the shared operator for the patterns it evaluates,
    the usual mechanisms for the others."""

    def __init__(self, run, items: list, budget: float):
        self.run_, self.items, self.budget = run, items, budget
        self.duck, self.settings = run.duck_and_settings()
        self.lines: list = []

    def run(self) -> None:
        # the group's statements' steps together (each statement's as the connection's settings
        # say), one statement's memory
        with work.statement(getattr(self.run_.con, "settings", None), statements=len(self.items)):
            self._run()

    def _run(self) -> None:
        r = self.run_
        r.stats["groups"] += 1
        t0 = time.perf_counter()
        table, filter_cols, filtering = read_group(self.duck, self.settings, [i.plan for i in self.items])
        r.stats["read_seconds"] += time.perf_counter() - t0
        r.stats["events_read"] += len(table)
        for item in self.items:
            r.table_of[id(item)] = table
        p0 = self.items[0].plan
        src = f"source {p0.query.source}: key {p0.key_column}"
        if p0.type_column:
            src += f", type {p0.type_column}"
        if p0.partition_column:
            src += f", partition by {p0.partition_column}"
        head = (f"group {r.stats['groups']}: {src}; statements {listed(i.index for i in self.items)}; "
                f"{len(table):,} events read once in {time.perf_counter() - t0:.3f} s (filtering before matching: "
                f"{filtering})")
        self.lines.append(head)
        t1 = time.perf_counter()
        classes = ElementClasses(table, filter_cols, bool(p0.partition_column))
        prepare(self.items, classes, self.lines)
        evaluate_alone(self.items, classes, self.settings, self.lines)
        threads = threads_of(self.duck) if len(table) >= O.THREAD_ROWS else 1  # no query for a short read
        evaluate_shared(r, self.items, classes, self.settings, self.budget, self.lines, threads)
        r.stats["match_seconds"] += time.perf_counter() - t1
        r.report.extend(self.lines)


class _OneStatement:
    """The run ``evaluate_read`` evaluates in: no sharing, each unit in its best order, counters kept
    for the call only."""
    share, reorder, slice_events = False, True, SLICE_EVENTS

    def __init__(self):
        self.stats: Counter = Counter()


def evaluate_read(duck, settings: P.CerSettings, plan: P.CerPlan, table: pa.Table,
                  budget: float = 1.0) -> tuple[int, object, list[str]]:
    """One skip-till-any-match statement over the table the single-statement path read
    (``engine.cer_read.read_events``: filters as ``__f_<var>`` columns): the shared operator with one
    unit per alternative, without sharing, each unit in its best order alone (the batch mechanism).
    Returns (number of matches, the matches - ``MatchColumns``, None when counting - and the
    report's lines)."""
    item = Statement(0, plan.query.text, plan.query, plan)
    items, lines = [item], []
    classes = ElementClasses(table, {sql: f"__f_{var}" for var, sql in plan.filter_sql.items()},
                             bool(plan.partition_column))
    prepare(items, classes, lines)
    evaluate_alone(items, classes, settings, lines)
    threads = threads_of(duck) if table.num_rows >= O.THREAD_ROWS else 1  # no query for a short read
    evaluate_shared(_OneStatement(), items, classes, settings, budget, lines, threads)
    return item.count, item.matches, lines
