"""The fast path (compiled matcher, column-wise MEASURES) returns what the reference returns.

The brute-force differential suite covers tiny inputs on both matchers; here the inputs are
large enough to exercise what only shows at scale: chunks of many partitions, buffers that
must grow, the two worker threads, registers, WITHIN, the pre-filter for other conditions.
"""
from __future__ import annotations

import re

import pytest

import matchrec
import randgen


def both(con, sql: str):
    """(reference rows, fast rows, fast-path stats) of one query, rows sorted."""
    out = []
    stats = None
    for fast in (0, 1):
        cur = con.cursor()
        cur.execute(f"SET matchrec_fast_path = {fast}")
        try:
            cur.execute(sql)
            out.append(sorted(cur.fetchall(), key=repr))
        except matchrec.Error as err:
            out.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")
        if fast:
            stats = cur.stats[0][1] if cur.stats else None
    return out[0], out[1], stats


@pytest.fixture(scope="module")
def big():
    con = matchrec.connect()
    con.cursor().execute("""CREATE TABLE big AS SELECT (i % 37) AS p, i AS id,
        ['', 'A', 'B', 'C', 'D', 'AB'][1 + (hash(i, 1) % 6)::INT] || ['', 'C', 'D', 'AD'][1 + (hash(i, 2) % 4)::INT]
            AS c,
        (hash(i, 3) % 100)::INTEGER AS v, TIMESTAMP '2024-01-01' + to_seconds(i * 7) AS ts
        FROM range(4000) r(i)""")
    yield con
    con.close()


@pytest.mark.parametrize("seed", range(60))
def test_random_patterns_on_larger_input(big, seed):
    case = randgen.random_case(seed)
    sql = re.sub(r"FROM \(VALUES .*?\) t\([a-z, ]+\) MATCH_RECOGNIZE", "FROM big MATCH_RECOGNIZE", case.sql(),
                 flags=re.S)
    sql = re.sub(r"FROM \(SELECT \* FROM \(VALUES .*?\) v\([a-z, ]+\) WHERE false\) t MATCH_RECOGNIZE",
                 "FROM big MATCH_RECOGNIZE", sql, flags=re.S)
    assert "FROM big" in sql, sql
    if "PARTITION BY" not in sql:
        sql = sql.replace("MATCH_RECOGNIZE (\n  ORDER BY", "MATCH_RECOGNIZE (\n  PARTITION BY p\n  ORDER BY", 1)
    reference, fast, _ = both(big, sql)
    assert fast == reference, sql


def test_registers_and_exact_compiled_path(big):
    sql = """SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES A.id AS a, LAST(B.id) AS b, C.id AS c, count(B.*) AS nb, C.v - A.v AS dv
        ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
        PATTERN (A B+ C) DEFINE A AS v < 30, B AS B.v > A.v AND B.v < PREV(B.v) + 50,
                                C AS C.v = A.v + 1 OR C.ts > A.ts + INTERVAL 1 HOUR)"""
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 20
    assert stats.matcher == "compiled"  # the OR of register comparisons is a register program
    sql = sql.replace("C AS C.v = A.v + 1 OR C.ts > A.ts + INTERVAL 1 HOUR", "C AS sum(B.v) > C.v")
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 20
    assert stats.matcher == "compiled"  # a running aggregate is kept per thread
    sql = sql.replace("C AS sum(B.v) > C.v", "C AS sum(B.v) * 2 > C.v")
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 20
    assert stats.matcher == "compiled"  # arithmetic on an aggregate is a register program too
    sql = sql.replace("C AS sum(B.v) * 2 > C.v", "C AS count(DISTINCT B.v) > 2")
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 20
    assert stats.matcher == "compiled pre-filter + reference"  # DISTINCT stays with the reference
    sql = sql.replace("C AS count(DISTINCT B.v) > 2", "C AS C.v >= A.v AND C.ts > A.ts")
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 20
    assert stats.matcher == "compiled"


def test_within_numeric_and_timestamp_both_directions(big):
    for order, within in [("id", "400"), ("id DESC", "400"), ("ts", "INTERVAL '30' MINUTE"),
                          ("ts DESC", "INTERVAL '30' MINUTE")]:
        sql = f"""SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY {order}
            MEASURES FIRST(id) AS f, LAST(id) AS l, count(*) AS n ONE ROW PER MATCH
            PATTERN (A {{- X* -}} B) WITHIN {within}
            DEFINE A AS contains(c, 'A'), B AS contains(c, 'B') AND v > 50, X AS true)"""
        reference, fast, stats = both(big, sql)
        assert fast == reference and len(fast) > 10, (order, within)
        assert stats.matcher == "compiled"


def test_prefilter_with_aggregates_and_first(big):
    sql = """SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES FIRST(id) AS f, sum(v) AS s, CLASSIFIER() AS cl ALL ROWS PER MATCH
        PATTERN (A B+) DEFINE A AS contains(c, 'A'), B AS sum(B.v) * 2 < 300 AND v > FIRST(v)
                                                     AND count(DISTINCT B.v) < 50)"""
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 100
    assert stats.starts_pruned > stats.starts_tried  # most start rows never reach the reference matcher


def test_all_rows_measures_column_wise_equal_row_by_row(big):
    sql = """SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES MATCH_NUMBER() AS mn, CLASSIFIER() AS cl, FIRST(v) AS fv, LAST(v) AS lv, FINAL LAST(v) AS flv,
                 LAST(B.v) AS lb, FIRST(B.v) AS fb, FINAL LAST(B.id) AS flb, PREV(v, 2) AS p2, NEXT(v) AS n1,
                 count(*) AS n, count(B.*) AS nb, FINAL count(*) AS fn, LAST(v) - FIRST(v) AS dv,
                 lower(CLASSIFIER()) AS lc, NEXT(CLASSIFIER()) AS nc, v > 50 AND CLASSIFIER() = 'B' AS flag
        ALL ROWS PER MATCH WITH UNMATCHED ROWS AFTER MATCH SKIP TO NEXT ROW
        PATTERN (A B{1,3} C?) DEFINE A AS contains(c, 'A'), B AS v > PREV(v), C AS contains(c, 'C'))"""
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 1000
    assert stats.extra["measures computed column-wise"] > 0


def test_exclusions_and_empty_matches(big):
    sql = """SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES MATCH_NUMBER() AS mn, CLASSIFIER() AS cl, count(*) AS n ALL ROWS PER MATCH SHOW EMPTY MATCHES
        PATTERN (A? {- B* -} C??) DEFINE A AS contains(c, 'A'), B AS contains(c, 'B'), C AS contains(c, 'C'))"""
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 1000
    assert stats.empty_matches > 0


def test_skip_errors_and_thread_limit_on_the_fast_path(big):
    reference, fast, _ = both(big, """SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES count(*) AS n AFTER MATCH SKIP TO FIRST A PATTERN (A B) DEFINE A AS true)""")
    assert fast == reference and "cannot skip to first row" in fast
    cur = big.cursor()
    cur.execute("SET matchrec_max_threads = 3")
    try:
        with pytest.raises(matchrec.OperationalError, match="matchrec_max_threads"):
            cur.execute("""SELECT * FROM big MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n
                PATTERN ((A | B | C)+ D) DEFINE D AS contains(c, 'D') AND v = -1)""")
    finally:
        cur.execute("RESET matchrec_max_threads")


def test_many_partitions_two_threads_and_growing_buffers():
    con = matchrec.connect()
    # more rows than engine.fast.PARALLEL_MIN_ROWS: the partitions are split between two threads
    con.cursor().execute("""CREATE TABLE s AS SELECT i % 1700 AS k, i // 1700 AS t,
        (hash(i) % 1000)::DOUBLE AS price FROM range(210000) r(i)""")
    sql = """SELECT count(*), sum(b - s), sum(n) FROM s MATCH_RECOGNIZE (PARTITION BY k ORDER BY t
        MEASURES FIRST(t) AS s, LAST(DOWN.t) AS b, count(*) AS n ONE ROW PER MATCH
        AFTER MATCH SKIP TO NEXT ROW PATTERN (STRT DOWN+ UP+)
        DEFINE DOWN AS DOWN.price < PREV(DOWN.price), UP AS UP.price > PREV(UP.price))"""
    reference, fast, stats = both(con, sql)
    assert fast == reference and fast[0][0] > 10000
    assert stats.matcher == "compiled"


def test_explain_names_the_matcher(big):
    cur = big.cursor()
    cur.execute("""EXPLAIN ANALYZE SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES count(*) AS n PATTERN (A B) DEFINE A AS v > 10, B AS B.v < A.v)""")
    text = cur.fetchall()[0][1]
    assert "matcher: compiled (numba Pike VM)" in text
    assert "compare current" in text and "per-row condition in DuckDB" in text
    assert "matcher compiled:" in text


@pytest.mark.parametrize("offset", [-3, -1, 1, 2, 5])
def test_shift_within_partitions(offset):
    import numpy as np
    import pyarrow as pa
    from matchrec.engine.fast import shift_within_partitions
    values = pa.array([1, 2, None, 4, 5, 6, 7, 8], pa.int64())
    bounds = np.array([0, 3, 4, 8])
    got = shift_within_partitions(values, offset, bounds).to_pylist()
    want = []
    for p in range(3):
        lo, hi = bounds[p], bounds[p + 1]
        for r in range(lo, hi):
            src = r + offset
            want.append(values[src].as_py() if lo <= src < hi else None)
    assert got == want


@pytest.mark.parametrize("define", [
    # Flink's spelling of a V-shape: LAST(V.x, 1) in V's own condition is the register before this row
    "DOWN AS (LAST(DOWN.v, 1) IS NULL AND DOWN.v < STRT.v) OR DOWN.v < LAST(DOWN.v, 1), "
    "UP AS (LAST(UP.v, 1) IS NULL AND UP.v > LAST(DOWN.v)) OR UP.v > LAST(UP.v, 1)",
    "DOWN AS NOT (DOWN.v > STRT.v + 10 OR DOWN.v IS NULL) AND (PREV(STRT.v) IS NULL OR DOWN.v <> PREV(STRT.v)), "
    "UP AS UP.v < LAST(DOWN.v) OR STRT.v = UP.v",
    "DOWN AS DOWN.v > coalesce(STRT.v, 50) AND contains(c, 'A') = (STRT.v > 30), UP AS UP.ts > DOWN.ts",
])
def test_register_programs(big, define):
    sql = f"""SELECT * FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY id
        MEASURES FIRST(id) AS f, LAST(id) AS l, count(DOWN.*) AS nd ONE ROW PER MATCH
        PATTERN (STRT? DOWN+ UP+) DEFINE STRT AS v < 60, {define})"""
    reference, fast, stats = both(big, sql)
    assert fast == reference and len(fast) > 20
    assert stats.matcher == "compiled"
