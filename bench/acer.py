"""ACER index benchmark: candidate and pull requests on one storage node's shard, with and
without the range-bitmap index, on the same generated events.

    python -m bench.acer [--rows 2000000] [--append]

The crimes-like dataset of bench.datasets (skewed event types, districts, timestamps) gets a
numeric attribute ``severity`` (0-999). Two shards hold the same rows; one is indexed
(``build_index`` on district and severity). Each request is answered by the shard service the
storage node runs (no network: this measures the node's work), three times; the table shows the
median, the rows returned (which must be equal) and the speed-up. Requests with a time filter
use a time interval set of 200 random 30-minute intervals, as a dual-filtering round sends.
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

from bench import RESULTS, publish
from bench import datasets
from matchrec.connectors.shard import ShardService
from matchrec.operators.intervals import IntervalSet

KEY = 'epoch_us("ts")'
CONDITIONS = [
    ("rare type", "type = 'HOMICIDE'"),
    ("type and attribute", "type = 'ROBBERY' AND severity < 50"),
    ("attribute range", "severity BETWEEN 990 AND 999"),
    ("two attributes", "district = 7 AND severity >= 900"),
    ("type and UDF", "type = 'BATTERY' AND lower(type) = 'battery'"),
]


def _shard(rows: int, seed: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE ev AS SELECT *, CAST(hash(id * 31 + {seed}) % 1000 AS INTEGER) AS severity "
                f"FROM ({datasets.crimes_sql(rows, seed)})")
    return con


def _timed(service: ShardService, req: dict, blobs: list[bytes]) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(3):
        t0 = time.perf_counter()
        n = service.answer(dict(req), blobs).num_rows
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--append", action="store_true", help="append the output to bench/RESULTS.md")
    args = parser.parse_args()
    lines = [f"## ACER index: `python -m bench.acer --rows {args.rows}`", ""]
    lines.append(f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; DuckDB "
                 f"{duckdb.__version__}; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    t0 = time.perf_counter()
    plain, indexed = _shard(args.rows, args.seed), _shard(args.rows, args.seed)
    generated = time.perf_counter() - t0
    a, b = ShardService(plain, 1 << 28), ShardService(indexed, 1 << 28)
    t0 = time.perf_counter()
    summary = b.answer({"op": "build_index", "table": "ev", "attributes": ["district", "severity"],
                        "type_column": "type", "time_column": "ts", "block_size": 65536}, []).to_pylist()[0]
    built = time.perf_counter() - t0
    lines.append(f"- {args.rows:,} events generated in {generated:.1f} s (twice); index built in {built:.2f} s: "
                 f"{summary['blocks']} blocks, {summary['clusters']} clusters")
    kmin, kmax = plain.execute(f"SELECT min({KEY}), max({KEY}) FROM ev").fetchall()[0]
    rng = np.random.default_rng(args.seed)
    width = 30 * 60 * 1_000_000
    starts = np.sort(rng.integers(kmin, kmax - width, 200))
    tis = IntervalSet._merged(np.zeros(len(starts), np.int64), starts, starts + width)
    exact = np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes()
    cover = np.concatenate([tis.lo, tis.hi]).astype(np.int64).tobytes()
    share = tis.total_length() / (kmax - kmin + 1)
    lines += [f"- time filter: {len(tis)} intervals covering {share:.1%} of the time line", "",
              "| request | condition | rows | no index ms | index ms | speed-up |", "|---|---|---|---|---|---|"]
    for label, cond in CONDITIONS:
        reqs = [("candidates", {"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY}, []),
                ("candidates + time filter", {"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY,
                                              "filter": {"kind": "exact", "blob": 0}, "cover": 1}, [exact, cover]),
                ("pull", {"op": "pull", "table": "ev", "where": cond}, []),
                ("pull + time filter", {"op": "pull", "table": "ev", "where": cond, "key_sql": KEY,
                                        "filter": {"kind": "exact", "blob": 0}, "cover": 1,
                                        "range": [int(tis.lo.min()), int(tis.hi.max())]}, [exact, cover])]
        for name, req, blobs in reqs:
            b.answer(dict(req), blobs)  # the first request of a table loads its index
            ta, na = _timed(a, req, blobs)
            tb, nb = _timed(b, req, blobs)
            if na != nb:
                raise SystemExit(f"the index changed the answer: {name} {cond}: {na} vs {nb} rows")
            lines.append(f"| {name} | {label}: `{cond}` | {na:,} | {ta * 1000:.1f} | {tb * 1000:.1f} | "
                         f"{ta / tb:.2f}x |")
    lines.append("")
    publish("\n".join(lines), RESULTS if args.append else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
