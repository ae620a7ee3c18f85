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

Prints a Markdown section; ``--append`` also adds it to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
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


def make_table(cur, name: str, rows: int, partitions: int) -> None:
    # a random walk per partition (steps -50..50), so that FIRST(A.v) - 60 bounds runs of varied length
    cur.execute(f"""CREATE OR REPLACE TABLE {name} AS
        SELECT p, id, (sum(step) OVER (PARTITION BY p ORDER BY id))::BIGINT AS v FROM (
            SELECT (i % {partitions})::INTEGER AS p, i AS id, (hash(i, 11) % 101)::BIGINT - 50 AS step
            FROM range({rows}) r(i))""")


def timed(cur, sql: str, fast: int) -> tuple[float, float, list]:
    """(first s, warm s, rows) of one statement."""
    cur.execute(f"SET matchrec_fast_path = {fast}")
    out = []
    rows = None
    for _ in range(2):
        started = time.perf_counter()
        cur.execute(sql)
        rows = cur.fetchall()
        out.append(time.perf_counter() - started)
    return out[0], out[1], rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--append", action="store_true", help="add the section to bench/RESULTS.md")
    args = ap.parse_args()
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
    sizes = [40_000, 160_000, 640_000, 2_560_000]
    for n in sizes:
        make_table(cur, "s", n, 1)
        first, warm, rows = timed(cur, SUM_SQL.format(t="s"), 1)
        assert rows == [(n,)], rows
        ref = "-"
        if n <= REFERENCE_CAP:
            ref_n = 10_000  # 40k rows take minutes on the reference: it recomputes the sum per row
            make_table(cur, "sr", ref_n, 1)
            _, rwarm, rrows = timed(cur, SUM_SQL.format(t="sr"), 0)
            assert rrows == [(ref_n,)], rrows
            ref = f"{rwarm:.2f} ({ref_n:,})"
        fl = floor_of("s")
        lines.append(f"| running sum | {n:,} | 1 | {first:.3f} | {warm:.3f} | {warm / n * 1e9:.0f} | {ref} | "
                     f"{fl:.3f} | {warm / fl:.1f}x | {rows[0][0]:,} rows in one match |")
        print(lines[-1], flush=True)
        if n == 640_000 and warm > 15:
            break
    for name, sql in (("FIRST", FIRST_SQL), ("count", COUNT_SQL)):
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
    total = time.perf_counter() - run_started
    header = [
        "## Aggregates and FIRST in DEFINE: `python -m bench.bench_aggregates`",
        "",
        f"- CPU: {platform.processor() or platform.machine()}; Python {platform.python_version()}, "
        f"DuckDB {duckdb.__version__}",
        f"- Date: {started_at}; total wall time {total:.0f} s; times are the second run in the process "
        "(the first compiles the kernels)",
        "- running sum: `PATTERN (A+) DEFINE A AS sum(A.v) < 1e12`, one partition, one match of every row;",
        "  FIRST: `PATTERN (A B+) DEFINE B AS B.v >= FIRST(A.v) - 60`; count: `PATTERN (A+ B) DEFINE A AS "
        "count(A.*) <= 20`; both over a random walk in 50 partitions",
        "- reference: `SET matchrec_fast_path = 0` on fewer rows (quadratic: it recomputes the aggregate "
        "per row per thread); DuckDB floor: a scan with `sum(v) OVER (PARTITION BY p ORDER BY id)`",
        "",
    ]
    section = "\n".join(header + lines) + "\n"
    print()
    print(section)
    if args.append:
        path = pathlib.Path(__file__).with_name("RESULTS.md")
        path.write_text(path.read_text().rstrip("\n") + "\n\n" + section)
    con.close()


if __name__ == "__main__":
    main()
