"""Smoke run of ``python -m bench.multi --quick`` on tiny streams.

A correctness check, not a timing one: the run must finish, every mode must return the same
tables as the statements run one by one (the benchmark exits with an error otherwise), and the
report must hold the ratio table. No assertion looks at a time.
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
