"""One measurement, run in a fresh process: ``python -m bench.measure '<json spec>'``.

The spec names an engine (matchrec, reference, flinkshape, floor, duckdb), a query and
the DuckDB file. The statement runs ``runs`` times in this process: the first run pays
for imports, plan caches and JIT compilation, the second shows the warm time. The result
is one JSON line after RESULT_MARK on stdout, with this process's peak RSS.
"""
from __future__ import annotations

import json
import sys
import time

RESULT_MARK = "@@BENCH_RESULT@@ "


def _run_matchrec(spec: dict, sql: str, fast_path: int) -> dict:
    import matchrec

    con = matchrec.connect(spec["db"], read_only=True)
    cur = con.cursor()
    cur.execute("SET enable_progress_bar = false")
    cur.execute(f"SET matchrec_fast_path = {fast_path}")
    times, count, stats = [], None, None
    for i in range(spec["runs"]):
        started = time.perf_counter()
        cur.execute(f"SELECT count(*) FROM ({sql}) AS q")
        count = cur.fetchall()[0][0]
        times.append(time.perf_counter() - started)
        stats = cur.stats[0][1] if cur.stats else None
        if times[-1] > spec["warm_skip"]:
            break
    con.close()
    extra = {}
    if stats is not None:
        extra = {"match_s": round(stats.seconds, 4), "rows_in": stats.rows_in, "mr_matches": stats.matches,
                 "matcher": getattr(stats, "matcher", "")}
    return {"times": times, "count": count, "extra": extra}


def _run_duckdb(spec: dict, sql: str) -> dict:
    import duckdb

    con = duckdb.connect(spec["db"], read_only=True)
    con.execute("SET enable_progress_bar = false")
    times, row = [], None
    for i in range(spec["runs"]):
        started = time.perf_counter()
        row = con.execute(sql).fetchall()[0]
        times.append(time.perf_counter() - started)
        if times[-1] > spec["warm_skip"]:
            break
    con.close()
    # The floor's single row is a checksum of the scan, not a match count.
    return {"times": times, "count": None if spec["engine"] == "floor" else row[0]}


def run(spec: dict) -> dict:
    from bench.queries import QUERIES

    query = QUERIES[spec["query"]]
    engine = spec["engine"]
    if engine == "matchrec":
        return _run_matchrec(spec, query.matchrec, 1)
    if engine == "reference":
        return _run_matchrec(spec, query.matchrec, 0)
    if engine == "flinkshape":
        return _run_matchrec(spec, query.flink_matchrec, 1)
    if engine == "floor":
        return _run_duckdb(spec, query.floor)
    if engine == "duckdb":
        return _run_duckdb(spec, query.duckdb)
    raise SystemExit(f"unknown engine {engine}")


if __name__ == "__main__":
    from bench.peers.rss import peak_rss_kb

    result = run(json.loads(sys.argv[1]))
    result["rss_kb"] = peak_rss_kb()
    print(RESULT_MARK + json.dumps(result), flush=True)
