"""Run a workload of statements together: ``matchrec.run_many(con, [sql, ...])``.

This module owns the entry point of multi-statement evaluation and its result type. Every
statement's result is exactly what ``con.cursor().execute(sql).fetch_arrow_table()`` returns
for it alone; evaluating several pattern queries in one pass is an optimisation behind this
contract, never a change of results.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import pyarrow as pa

__all__ = ["ManyResult", "run_many"]


@dataclass
class ManyResult:
    """The results of ``run_many``: ``tables[i]`` belongs to ``statements[i]``; ``report`` says how
    the workload was evaluated (which statements shared a pass, the plan, the optimiser's time)."""
    tables: list[pa.Table]
    report: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.tables)

    def __getitem__(self, i: int) -> pa.Table:
        return self.tables[i]

    def __iter__(self):
        return iter(self.tables)


def run_many(con, statements: list[str], *, share: bool = True, reorder: bool = True,
             budget: float = 1.0) -> ManyResult:
    """Evaluate ``statements`` on the matchrec connection ``con`` and return one table each.

    ``share`` lets pattern queries over the same source share sub-patterns in one pass,
    ``reorder`` lets the planner choose each pattern's evaluation order, ``budget`` bounds the
    plan search in seconds. Statements are evaluated one by one, in the given order.
    """
    t0 = time.perf_counter()
    tables = []
    for sql in statements:
        cur = con.cursor()
        try:
            tables.append(cur.execute(sql).fetch_arrow_table())
        finally:
            cur.close()
    report = [f"{len(statements)} statement(s) evaluated one by one"]
    return ManyResult(tables, report, time.perf_counter() - t0)
