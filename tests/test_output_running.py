"""Column-wise aggregate MEASURES (running reductions per match) equal the row-by-row evaluation.

Each seeded case builds random data (integers with NULLs, doubles with NaN, -0.0 and NULLs,
BIGINTs large enough to refuse int64 sums, a few partitions), a random pattern and random
count/sum/avg/min/max measures over random label sets, RUNNING or FINAL, in ONE ROW or ALL ROWS
PER MATCH (with unmatched rows, empty matches, exclusions), and runs the query twice: with the
column-wise forms and with every measure evaluated row by row (``output.ROW_BY_ROW``), which
defines the result. Rows are compared in output order, by ``repr`` (NaN equals NaN, -0.0 is not 0.0).

  pytest tests/test_output_running.py              40 cases
  pytest tests/test_output_running.py -m slow      400 more
"""
from __future__ import annotations

import random

import pytest

import matchrec
from matchrec.engine import output

FAST_CASES = 25
SLOW_CASES = 400

PATTERNS = ["A+ B", "A B* C?", "(A | B)+", "A* B", "A? {- B* -} C??", "(A B)+ C*", "A+", "B* A{1,3}"]
CONDITIONS = ["iv < {k}", "iv IS NULL OR iv > {k}", "fv > {k}", "fv IS NULL", "sv < 'm'",
              "big % 3 = 0", "PREV(iv) < iv", "true", "id % 4 <> 1"]
COLUMNS = ["iv", "fv", "big", "sv", "tiny"]
MODES = ["ONE ROW PER MATCH", "ALL ROWS PER MATCH", "ALL ROWS PER MATCH WITH UNMATCHED ROWS",
         "ALL ROWS PER MATCH SHOW EMPTY MATCHES", "ALL ROWS PER MATCH OMIT EMPTY MATCHES"]


def make_table(con, rng: random.Random, n: int) -> None:
    con.cursor().execute("CREATE OR REPLACE TABLE t (p INTEGER, id INTEGER, iv INTEGER, fv DOUBLE, "
                         "big BIGINT, sv VARCHAR, tiny SMALLINT)")
    rows = []
    huge = rng.random() < 0.3  # sums of such BIGINTs could overflow int64: the row path keeps them
    for i in range(n):
        iv = None if rng.random() < 0.15 else rng.randint(-50, 100)
        fv = rng.choice([None, float("nan"), -0.0, 0.0, rng.uniform(-1e3, 1e3), rng.random() * 1e-3,
                         rng.uniform(-10, 10), 1e16, 1.5])
        big = rng.choice([None, rng.randint(-10 ** 6, 10 ** 6),
                          rng.randint(2 ** 61, 2 ** 63 - 1) if huge else rng.randint(-9, 9)])
        sv = rng.choice([None, "a", "b", "z", "m", "mm"])
        tiny = None if rng.random() < 0.1 else rng.randint(-3, 3)
        rows.append((rng.randint(0, 3), i, iv, fv, big, sv, tiny))
    con.cursor().execute("INSERT INTO t VALUES " + ", ".join(
        "(" + ", ".join(literal(v) for v in row) + ")" for row in rows))


def literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"'{v!r}'::DOUBLE"
    if isinstance(v, str):
        return f"'{v}'"
    return str(v)


def random_measure(rng: random.Random, k: int) -> str:
    func = rng.choice(["count", "sum", "avg", "min", "max", "count", "sum", "array_agg", "string_agg"])
    col = rng.choice(COLUMNS)
    if func == "string_agg":
        col = "sv"
    if func in ("sum", "avg") and col == "sv":
        col = "iv"
    var = rng.choice(["", "A.", "B.", "U.", "C."])
    arg = f"{var}{col}" if var else col
    if func == "count" and rng.random() < 0.2:
        arg = f"{var}*" if var else "*"
    mode = rng.choice(["", "RUNNING ", "FINAL "])
    measure = f"{mode}{func}({arg})" if func != "string_agg" else f"{mode}string_agg({arg}, '|')"
    if rng.random() < 0.15 and func in ("count", "sum", "min", "max") and col != "sv":
        measure = f"{measure} + 1"
    if rng.random() < 0.1 and col in ("fv", "iv") and func not in ("array_agg", "string_agg"):
        measure = f"{measure} / 2"
    return f"{measure} AS m{k}"


def random_query(rng: random.Random) -> str:
    pattern = rng.choice(PATTERNS)
    defines = []
    for var in "ABC":
        if var in pattern:
            defines.append(f"{var} AS " + rng.choice(CONDITIONS).format(k=rng.randint(-20, 60)))
    measures = [random_measure(rng, k) for k in range(rng.randint(2, 5))]
    mode = rng.choice(MODES)
    if rng.random() < 0.3:
        mode = "ONE ROW PER MATCH"
    skip = rng.choice(["", "AFTER MATCH SKIP TO NEXT ROW", "AFTER MATCH SKIP PAST LAST ROW"])
    if "{-" in pattern and mode == "ONE ROW PER MATCH":
        mode = "ALL ROWS PER MATCH"
    return (f"SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY p ORDER BY id MEASURES {', '.join(measures)} "
            f"{mode} {skip} PATTERN ({pattern}) SUBSET U = (A, B) DEFINE {', '.join(defines)})")


def run(con, sql: str, row_by_row: bool):
    output.ROW_BY_ROW = row_by_row
    try:
        cur = con.cursor()
        try:
            cur.execute(sql)
            rows = cur.fetchall()
        except matchrec.Error as err:
            return f"{type(err).__name__}: {str(err).splitlines()[0]}", 0
        extra = cur.stats[0][1].extra if cur.stats else {}
        return [repr(r) for r in rows], extra.get("measures computed column-wise", 0)
    finally:
        output.ROW_BY_ROW = False


@pytest.fixture(scope="module")
def con():
    connection = matchrec.connect(":memory:")
    yield connection
    connection.close()


def check(con, seed: int) -> int:
    rng = random.Random(seed)
    make_table(con, rng, rng.randint(20, 300))
    fast = rng.random() < 0.7
    con.cursor().execute(f"SET matchrec_fast_path = {int(fast)}")
    column_wise = 0
    for _ in range(3):
        sql = random_query(rng)
        reference, _ = run(con, sql, True)
        got, column_wise_now = run(con, sql, False)
        assert got == reference, f"seed {seed}: {sql}"
        column_wise += column_wise_now
    return column_wise


def test_column_wise_aggregates_equal_row_by_row(con):
    column_wise = sum(check(con, seed) for seed in range(FAST_CASES))
    assert column_wise > FAST_CASES  # the cases do reach the column-wise forms


@pytest.mark.slow
def test_column_wise_aggregates_equal_row_by_row_more(con):
    for seed in range(10_000, 10_000 + SLOW_CASES):
        check(con, seed)


def test_sums_stay_exact_and_in_order(con):
    """Float sums fold left to right from the first value (-0.0 stays -0.0, 1e16 + 1 + 1 is
    1e16); integer sums come out as HUGEINT; BIGINT sums that could overflow int64 stay exact."""
    con.cursor().execute("""CREATE OR REPLACE TABLE s AS SELECT * FROM (VALUES
        (1, '-0.0'::DOUBLE, 9223372036854775000, 1), (2, 1e16::DOUBLE, 9223372036854775000, 2),
        (3, 1.0::DOUBLE, 1, 3), (4, 1.0::DOUBLE, 1, NULL), (5, -1e16::DOUBLE, 2, 5)) v(id, f, b, i)""")
    sql = """SELECT * FROM s MATCH_RECOGNIZE (ORDER BY id MEASURES RUNNING sum(f) AS sf, sum(b) AS sb,
        avg(i) AS ai, min(f) AS mf, FINAL max(A.f) AS xf, count(A.i) AS ci ALL ROWS PER MATCH
        PATTERN (A+) DEFINE A AS true)"""
    reference, _ = run(con, sql, True)
    got, column_wise = run(con, sql, False)
    assert got == reference
    assert column_wise >= 4
    cur = con.cursor()
    cur.execute(sql)
    rows = cur.fetchall()  # id, then the measures, then the other columns
    assert [repr(r[1]) for r in rows] == ["-0.0", "1e+16", "1e+16", "1e+16", "0.0"]  # ties round to even
    assert rows[-1][2] == 2 * 9223372036854775000 + 4
    assert [r[6] for r in rows] == [1, 2, 3, 3, 4]


def test_array_and_string_aggregates_are_column_wise(con):
    """array_agg keeps NULLs in match order, string_agg skips them; no row gives NULL; a label
    set's lists hold only its rows, RUNNING ones only the rows up to the current one."""
    con.cursor().execute("""CREATE OR REPLACE TABLE g AS SELECT * FROM (VALUES
        (1, 5, 'x'), (2, NULL, NULL), (3, 7, 'y'), (4, 1, 'z'), (5, 9, NULL)) v(id, v, s)""")
    sql = """SELECT * FROM g MATCH_RECOGNIZE (ORDER BY id MEASURES RUNNING array_agg(A.v) AS ra,
        FINAL array_agg(v) AS fa, RUNNING string_agg(B.s, '|') AS rs, FINAL string_agg(s, '+') AS fs
        ALL ROWS PER MATCH PATTERN (A B+) DEFINE A AS id % 2 = 1, B AS true)"""
    reference, _ = run(con, sql, True)
    got, column_wise = run(con, sql, False)
    assert got == reference and column_wise == 4
    cur = con.cursor()
    cur.execute(sql)
    rows = [r[1:5] for r in cur.fetchall()]
    assert rows[0] == ([5], [5, None, 7, 1, 9], None, "x+y+z")
    assert rows[1] == ([5], [5, None, 7, 1, 9], None, "x+y+z")
    assert rows[2] == ([5], [5, None, 7, 1, 9], "y", "x+y+z")
