"""End-to-end SQL through the DB-API: where MATCH_RECOGNIZE may stand, inputs, ordering,
partitions, types of the output, and the WITHIN extension."""
from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

import matchrec

V_SHAPE = """
SELECT * FROM {src} MATCH_RECOGNIZE (
  PARTITION BY k ORDER BY ts
  MEASURES FIRST(ts) AS s, LAST(DOWN.ts) AS bottom, LAST(ts) AS e
  ONE ROW PER MATCH
  PATTERN (STRT DOWN+ UP+)
  DEFINE DOWN AS DOWN.v < PREV(DOWN.v), UP AS UP.v > PREV(UP.v)
) AS m ORDER BY k, s"""


@pytest.fixture
def ticks(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE ticks(k VARCHAR, ts INTEGER, v DOUBLE)")
    cur.execute("INSERT INTO ticks VALUES ('a',1,10),('a',2,9),('a',3,8),('a',4,9),('a',5,10),('a',6,9),"
                "('b',1,5),('b',2,4),('b',3,6),('b',4,7)")
    return con


def test_v_shape_partitioned(ticks, q):
    assert q(V_SHAPE.format(src="ticks")) == [("a", 1, 3, 5), ("b", 1, 2, 4)]


def test_one_row_output_columns_are_partition_then_measures(ticks):
    cur = ticks.cursor()
    cur.execute(V_SHAPE.format(src="ticks"))
    assert [d[0] for d in cur.description] == ["k", "s", "bottom", "e"]
    assert [str(d[1]) for d in cur.description] == ["VARCHAR", "INTEGER", "INTEGER", "INTEGER"]


def test_all_rows_layout_partition_order_measures_rest(ticks):
    cur = ticks.cursor()
    cur.execute("""SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts
        MEASURES CLASSIFIER() AS c ALL ROWS PER MATCH PATTERN (A) DEFINE A AS v > 9)""")
    assert [d[0] for d in cur.description] == ["k", "ts", "c", "v"]
    assert sorted(cur.fetchall()) == [("a", 1, "A", 10.0), ("a", 5, "A", 10.0)]


def test_subquery_cte_join_and_nesting(ticks, q):
    inner = V_SHAPE.format(src="ticks").replace("ORDER BY k, s", "")
    # in a CTE, joined with a table, filtered and aggregated by DuckDB
    rows = q(f"""WITH m AS ({inner}), names(k, name) AS (VALUES ('a', 'alpha'), ('b', 'beta'))
                 SELECT name, count(*) AS n FROM m JOIN names USING (k) GROUP BY name ORDER BY name""")
    assert rows == [("alpha", 1), ("beta", 1)]
    # the input is a CTE
    rows = q("""WITH t AS (SELECT * FROM ticks WHERE k = 'a')
                SELECT s, e FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES FIRST(ts) AS s, LAST(ts) AS e
                PATTERN (A B+) DEFINE B AS B.v < PREV(B.v))""")
    assert rows == [(1, 3), (5, 6)]
    # MATCH_RECOGNIZE over MATCH_RECOGNIZE
    rows = q(f"""SELECT k, n FROM ({inner}) x MATCH_RECOGNIZE (ORDER BY k MEASURES count(*) AS n
                 ALL ROWS PER MATCH PATTERN (A+) DEFINE A AS true) y ORDER BY k""")
    assert rows == [("a", 1), ("b", 2)]
    # two in one FROM, one in a scalar subquery of the select list
    rows = q("""SELECT (SELECT count(*) FROM ticks MATCH_RECOGNIZE (PATTERN (A) DEFINE A AS v > 9)) AS big,
                       x.n FROM (SELECT 1) d, ticks MATCH_RECOGNIZE (PARTITION BY k MEASURES count(*) AS n
                       PATTERN (A+) DEFINE A AS true) x ORDER BY x.k""")
    assert rows == [(2, 6), (2, 4)]


def test_join_with_match_recognize_on_both_sides(ticks, q):
    rows = q("""SELECT a.k, a.n, b.n FROM
                ticks MATCH_RECOGNIZE (PARTITION BY k MEASURES count(*) AS n PATTERN (X+) DEFINE X AS v >= 9) a
                JOIN ticks MATCH_RECOGNIZE (PARTITION BY k MEASURES count(*) AS n PATTERN (X+) DEFINE X AS v < 9) b
                ON a.k = b.k ORDER BY a.k, a.n, b.n""")
    # 'a' has X runs [10, 9] and [9, 10, 9] and one Y run [8]; 'b' has no X run
    assert rows == [("a", 2, 1), ("a", 3, 1)]


def test_thousands_of_partitions(con, q):
    con.cursor().execute("CREATE TABLE big AS SELECT i % 3000 AS p, i // 3000 AS t, (i * 7919) % 11 AS v "
                         "FROM range(30000) r(i)")
    rows = q("""SELECT p, count(*) FROM big MATCH_RECOGNIZE (PARTITION BY p ORDER BY t
                MEASURES MATCH_NUMBER() AS mn ALL ROWS PER MATCH PATTERN (U D) DEFINE U AS v > 5,
                D AS D.v < PREV(D.v)) GROUP BY p ORDER BY p""")
    # the same pattern written as a self-join on consecutive rows
    expected = q("""WITH b AS (SELECT *, lead(v) OVER (PARTITION BY p ORDER BY t) AS nv FROM big)
                    SELECT p, 2 * count(*) FROM (
                      SELECT p, t, v, nv, lag(v > 5 AND nv < v, 1, false) OVER (PARTITION BY p ORDER BY t) AS prev_hit
                      FROM b) WHERE v > 5 AND nv < v AND NOT prev_hit GROUP BY p ORDER BY p""")
    assert rows == expected and len(rows) > 1000


def test_nulls_in_partition_and_order_keys(con, q):
    con.cursor().execute("CREATE TABLE n AS SELECT * FROM (VALUES (NULL, 1, 'x'), (NULL, 2, 'y'), ('p', NULL, 'z'),"
                         " ('p', 1, 'w')) t(p, o, c)")
    rows = q("""SELECT p, o, cls, mn FROM n MATCH_RECOGNIZE (PARTITION BY p ORDER BY o
                MEASURES CLASSIFIER() AS cls, MATCH_NUMBER() AS mn ALL ROWS PER MATCH
                PATTERN (A B) DEFINE A AS true, B AS true)""")
    # NULL partition keys form one partition; NULL order keys sort last by default
    assert sorted(rows, key=str) == sorted([(None, 1, "A", 1), (None, 2, "B", 1), ("p", 1, "A", 1),
                                            ("p", None, "B", 1)], key=str)
    rows = q("""SELECT o FROM n MATCH_RECOGNIZE (PARTITION BY p ORDER BY o NULLS FIRST
                MEASURES FIRST(o) AS f ALL ROWS PER MATCH PATTERN (A) DEFINE A AS p = 'p')""")
    assert rows == [(None,), (1,)]


def test_desc_order_and_ties(q):
    rows = q("""SELECT id, cls FROM (VALUES (1, 5), (2, 4), (3, 3)) t(id, v) MATCH_RECOGNIZE (ORDER BY id DESC
                MEASURES CLASSIFIER() AS cls ALL ROWS PER MATCH PATTERN (A B+) DEFINE B AS B.v > PREV(B.v))""")
    assert rows == [(3, "A"), (2, "B"), (1, "B")]
    # ties in the order key: rows of one peer group still form a sequence, in some order
    rows = q("""SELECT n FROM (VALUES (1, 'a'), (1, 'b'), (1, 'c')) t(o, x) MATCH_RECOGNIZE (ORDER BY o
                MEASURES count(*) AS n PATTERN (A+) DEFINE A AS true)""")
    assert rows == [(3,)]


def test_empty_input_and_no_match(q):
    assert q("""SELECT * FROM (SELECT 1 AS x WHERE false) MATCH_RECOGNIZE (MEASURES count(*) AS n
                PATTERN (A) DEFINE A AS true)""") == []
    assert q("""SELECT * FROM range(5) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                PATTERN (A) DEFINE A AS x > 10)""") == []


def test_quoted_identifiers_and_literals(con, q):
    con.cursor().execute("""CREATE TABLE "we""ird"("select" INTEGER, "a'b" VARCHAR, "Mixed Case" INTEGER)""")
    con.cursor().execute("""INSERT INTO "we""ird" VALUES (1, 'x''y', 10), (2, 'z', 20)""")
    rows = q("""SELECT * FROM "we""ird" MATCH_RECOGNIZE (ORDER BY "select"
                MEASURES LAST("a'b") AS "it's", count("Mixed Case") AS "select"
                ONE ROW PER MATCH PATTERN (A+) DEFINE A AS "a'b" <> 'q''q')""")
    assert rows == [("z", 2)]
    cur = con.cursor()
    cur.execute("""SELECT "it's" FROM "we""ird" MATCH_RECOGNIZE (ORDER BY "select"
                   MEASURES FIRST("a'b") AS "it's" PATTERN (A+) DEFINE A AS true)""")
    assert cur.fetchall() == [("x'y",)]


def test_parquet_csv_and_registered_objects(con, q, tmp_path):
    import pandas as pd
    path = tmp_path / "ev.parquet"
    con.cursor().execute(f"COPY (SELECT range AS t, range % 3 AS v FROM range(9)) TO '{path}' (FORMAT PARQUET)")
    rows = q(f"""SELECT count(*) FROM read_parquet('{path}') MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n
                 PATTERN (A B C) DEFINE A AS v = 0, B AS v = 1, C AS v = 2)""")
    assert rows == [(3,)]
    csv = tmp_path / "ev.csv"
    csv.write_text("t,v\n1,0\n2,1\n3,2\n")
    rows = q(f"""SELECT n FROM '{csv}' MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n
                 PATTERN (A+) DEFINE A AS true)""")
    assert rows == [(3,)]
    con.register("df", pd.DataFrame({"t": [1, 2, 3], "v": [3, 2, 1]}))
    con.register("arrow_t", pa.table({"t": [1, 2, 3], "v": [1, 2, 3]}))
    assert q("SELECT n FROM df MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n PATTERN (A B+) "
             "DEFINE B AS v < PREV(v))") == [(3,)]
    assert q("SELECT n FROM arrow_t MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n PATTERN (A B+) "
             "DEFINE B AS v > PREV(v))") == [(3,)]


def test_database_file_is_not_written(tmp_path):
    path = str(tmp_path / "ev.duckdb")
    con = matchrec.connect(path)
    con.cursor().execute("CREATE TABLE e AS SELECT range AS t FROM range(5)")
    con.close()
    con = matchrec.connect(path, read_only=True)
    cur = con.cursor()
    cur.execute("SELECT n FROM e MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n PATTERN (A+) DEFINE A AS true)")
    assert cur.fetchall() == [(5,)]
    cur.execute("SELECT table_name FROM information_schema.tables")
    assert cur.fetchall() == [("e",)]
    con.close()


def test_output_types_follow_duckdb(q, con):
    cur = con.cursor()
    cur.execute("""SELECT * FROM (VALUES (1::INTEGER, 1.5::DECIMAL(4,1), 'x', DATE '2024-01-02'),
                                   (2, 2.5, 'y', DATE '2024-01-03')) t(i, d, s, dt)
        MATCH_RECOGNIZE (ORDER BY i MEASURES sum(i) AS si, avg(i) AS ai, sum(d) AS sd, count(*) AS c,
           max(s) AS ms, list(s) AS ls, string_agg(s, '-') AS sa, min(dt) AS md, bool_and(i > 0) AS ba,
           CLASSIFIER() AS cl, MATCH_NUMBER() AS mn, LAST(d) * 2 AS d2
        ONE ROW PER MATCH PATTERN (A+) DEFINE A AS true)""")
    types = [str(d[1]) for d in cur.description]
    assert types == ["HUGEINT", "DOUBLE", "DECIMAL(38,1)", "BIGINT", "VARCHAR", "VARCHAR[]", "VARCHAR", "DATE",
                     "BOOLEAN", "VARCHAR", "BIGINT", "DECIMAL(14,1)"]
    assert cur.fetchall() == [(3, 1.5, decimal.Decimal("4.0"), 2, "y", ["x", "y"], "x-y",
                               datetime.date(2024, 1, 2), True, "A", 1, decimal.Decimal("5.0"))]


def test_within_interval_and_number(q):
    data = "(VALUES (TIMESTAMP '2024-01-01 00:00', 'R'), (TIMESTAMP '2024-01-01 00:10', 'X'), " \
           "(TIMESTAMP '2024-01-01 00:20', 'B'), (TIMESTAMP '2024-01-01 01:00', 'R'), " \
           "(TIMESTAMP '2024-01-01 01:40', 'B')) t(ts, ty)"
    sql = f"""SELECT r, b FROM {data} MATCH_RECOGNIZE (ORDER BY ts MEASURES R.ts AS r, B.ts AS b
              PATTERN (R {{- N* -}} B) WITHIN {{w}} DEFINE R AS ty = 'R', B AS ty = 'B', N AS ty NOT IN ('R', 'B'))"""
    got = q(sql.replace("{w}", "INTERVAL '30' MINUTE"))
    assert got == [(datetime.datetime(2024, 1, 1, 0, 0), datetime.datetime(2024, 1, 1, 0, 20))]
    # the bound is inclusive
    assert len(q(sql.replace("{w}", "INTERVAL '20' MINUTE"))) == 1
    assert q(sql.replace("{w}", "INTERVAL '19' MINUTE")) == []
    assert len(q(sql.replace("{w}", "INTERVAL '1' HOUR"))) == 2
    nums = q("""SELECT a, b FROM (VALUES (1, 'A'), (5, 'B'), (10, 'A'), (30, 'B')) t(o, c) MATCH_RECOGNIZE (
                ORDER BY o MEASURES A.o AS a, B.o AS b PATTERN (A B) WITHIN 10 DEFINE A AS c = 'A', B AS c = 'B')""")
    assert nums == [(1, 5)]


def test_within_with_desc_order(q):
    rows = q("""SELECT a, b FROM (VALUES (1, 'B'), (5, 'A'), (30, 'B'), (35, 'A')) t(o, c) MATCH_RECOGNIZE (
                ORDER BY o DESC MEASURES A.o AS a, B.o AS b PATTERN (A B) WITHIN 4
                DEFINE A AS c = 'A', B AS c = 'B')""")
    assert rows == [(5, 1)]


def test_parameters_inside_match_recognize(q):
    rows = q("""SELECT n FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                PATTERN (A+) DEFINE A AS x >= ? AND x < ?) WHERE n > ?""", [2, 6, 1])
    assert rows == [(4,)]
    rows = q("""SELECT n FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                PATTERN (A+) DEFINE A AS x >= $1 AND x < $2)""", [2, 6])
    assert rows == [(4,)]


def test_plain_sql_goes_straight_to_duckdb(q):
    assert q("SELECT 40 + ?", [2]) == [(42,)]
    assert q("SELECT 'match_recognize' AS s") == [("match_recognize",)]


@pytest.mark.parametrize("dialect", ["trino", "snowflake", "oracle"])
def test_dialects(dialect):
    con = matchrec.connect(dialect=dialect)
    cur = con.cursor()
    cur.execute("""SELECT m.s, m.e FROM (SELECT 1 AS id, 5 AS v UNION ALL SELECT 2, 4 UNION ALL SELECT 3, 6) t
        MATCH_RECOGNIZE (ORDER BY id MEASURES FIRST(id) AS s, LAST(id) AS e ONE ROW PER MATCH
        AFTER MATCH SKIP PAST LAST ROW PATTERN (A B C) SUBSET U = (A, B)
        DEFINE B AS B.v < PREV(B.v), C AS C.v > PREV(C.v)) m""")
    assert cur.fetchall() == [(1, 3)]


def test_trino_integer_division_is_integer(q):
    con = matchrec.connect(dialect="trino")
    cur = con.cursor()
    cur.execute("""SELECT m.r FROM (VALUES (7, 2)) t(a, b) MATCH_RECOGNIZE (MEASURES A.a / A.b AS r
                   PATTERN (A) DEFINE A AS true) m""")
    assert cur.fetchall() == [(3,)]
    assert q("""SELECT r FROM (VALUES (7, 2)) t(a, b) MATCH_RECOGNIZE (MEASURES A.a / A.b AS r
                PATTERN (A) DEFINE A AS true)""") == [(3.5,)]


def test_navigation_and_aggregates_across_variables(q):
    rows = q("""SELECT * FROM (VALUES (1, 10), (2, 12), (3, 9), (4, 15), (5, 16)) t(id, price)
        MATCH_RECOGNIZE (ORDER BY id
          MEASURES A.price AS a, LAST(B.price) AS last_b, FIRST(B.price) AS first_b, avg(B.price) AS avg_b,
                   NEXT(A.price, 2) AS a_next2, PREV(FIRST(B.price), 2) AS before_b, count(B.*) AS nb,
                   FINAL LAST(B.id) - RUNNING LAST(B.id) AS zero
          ONE ROW PER MATCH
          PATTERN (A B{2,} C)
          DEFINE B AS B.price > A.price * 0.85 AND B.price <> PREV(B.price), C AS C.price > 1.5 * A.price)""")
    assert rows == [(10, 15, 12, 12.0, 9, None, 3, 0)]


def test_running_and_final_in_all_rows(q):
    rows = q("""SELECT id, r, f, rc, fc FROM range(1, 5) t(id) MATCH_RECOGNIZE (ORDER BY id
                MEASURES RUNNING LAST(id) AS r, FINAL LAST(id) AS f, RUNNING count(*) AS rc, FINAL count(*) AS fc
                ALL ROWS PER MATCH PATTERN (A+) DEFINE A AS true)""")
    assert rows == [(1, 1, 4, 1, 4), (2, 2, 4, 2, 4), (3, 3, 4, 3, 4), (4, 4, 4, 4, 4)]


def test_outer_query_runs_in_duckdb_with_window_functions(ticks, q):
    rows = q("""SELECT k, ts, cls, row_number() OVER (PARTITION BY k ORDER BY ts) AS rn
                FROM ticks MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES CLASSIFIER() AS cls
                ALL ROWS PER MATCH PATTERN (D+) DEFINE D AS D.v < PREV(D.v))
                WHERE k = 'a' ORDER BY ts""")
    assert rows == [("a", 2, "D", 1), ("a", 3, "D", 2), ("a", 6, "D", 3)]


def test_long_partition_reference_matcher(con, q):
    con.cursor().execute("CREATE TABLE walk AS SELECT range AS t, (hash(range) % 100)::INT AS v FROM range(20000)")
    got = q("""SELECT count(*), sum(n) FROM walk MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n
               PATTERN (U{2,} D+) DEFINE U AS U.v > PREV(U.v), D AS D.v < PREV(D.v))""")
    assert got[0][0] > 1000


def test_views_over_match_recognize_are_refused_tables_work(ticks, q):
    with pytest.raises(matchrec.NotSupportedError):
        q("CREATE VIEW v AS " + V_SHAPE.format(src="ticks"))
    q("CREATE TABLE vt AS " + V_SHAPE.format(src="ticks"))
    assert q("SELECT count(*) FROM vt") == [(2,)]
    q("INSERT INTO vt " + V_SHAPE.format(src="ticks"))
    assert q("SELECT count(*) FROM vt") == [(4,)]


def test_parentheses_survive_pushdown(q):
    rows = q("""SELECT id FROM (VALUES (1, 'A'), (2, 'B'), (3, 'AB')) t(id, c) MATCH_RECOGNIZE (ORDER BY id
                MEASURES FIRST(id) AS f ALL ROWS PER MATCH PATTERN (A) DEFINE A AS id > 1 AND (id = 1 OR id = 1))""")
    assert rows == []


def test_variable_without_rows_reads_as_null(q):
    # D has no row yet when A is tested: D.id is NULL, so IS NULL and coalesce see a NULL
    rows = q("""SELECT id, cls FROM (VALUES (1), (2)) t(id) MATCH_RECOGNIZE (ORDER BY id
                MEASURES CLASSIFIER() AS cls ALL ROWS PER MATCH PATTERN (A D)
                DEFINE A AS D.id IS NULL AND coalesce(D.id, -1) = -1, D AS true)""")
    assert rows == [(1, "A"), (2, "D")]


def test_empty_loop_iteration_can_exit_as_in_trino(q):
    rows = q("""SELECT id, mn, cls FROM (VALUES (1, 'ABD'), (2, 'ACD'), (3, 'ACD'), (4, 'BC')) t(id, c)
                MATCH_RECOGNIZE (ORDER BY id MEASURES MATCH_NUMBER() AS mn, CLASSIFIER() AS cls
                ALL ROWS PER MATCH PATTERN ((D*?)+) DEFINE D AS contains(c, 'D'))""")
    assert rows == [(1, 1, None), (2, 2, None), (3, 3, None), (4, 4, None)]


def test_a_kept_exception_does_not_block_the_connection(con):
    # the error happens while DuckDB still has input batches to stream
    sql = ("SELECT * FROM (SELECT x % 7 AS p, x FROM range(200000) t(x)) MATCH_RECOGNIZE (PARTITION BY p "
           "ORDER BY x MEASURES count(*) AS n AFTER MATCH SKIP TO FIRST A PATTERN (A B) DEFINE A AS x > 10)")
    kept = []
    for _ in range(2):
        with pytest.raises(matchrec.DataError) as info:
            con.cursor().execute(sql)
        kept.append(info)  # holding the traceback (as pytest and notebooks do) is the point
        cur = con.cursor()
        cur.execute("SELECT 1")
        assert cur.fetchall() == [(1,)]


@pytest.mark.parametrize("fast", [0, 1])
def test_revisited_instruction_keeps_trinos_priority(con, fast):
    # Trino drops a thread that reaches an instruction already reached at the same row, even
    # when the second visit comes from a higher-priority path (the loop's next iteration):
    # iteration 2 taking the reluctant D is dropped, so match 1 is just row 1.
    cur = con.cursor()
    cur.execute(f"SET matchrec_fast_path = {fast}")
    cur.execute("""SELECT id, mn, cls FROM (VALUES (1, 'ABCD'), (2, 'ACD')) t(id, c) MATCH_RECOGNIZE (
        ORDER BY id MEASURES MATCH_NUMBER() AS mn, CLASSIFIER() AS cls ALL ROWS PER MATCH
        AFTER MATCH SKIP TO NEXT ROW PATTERN ((A? D??)+) DEFINE A AS PREV(CLASSIFIER()) IS NULL)""")
    assert cur.fetchall() == [(1, 1, "A"), (2, 2, "A")]


# ---------------------------------------------------------------- Trino's SQL where DuckDB's differs
@pytest.fixture
def trino_q():
    con = matchrec.connect(":memory:", dialect="trino")

    def run(sql):
        cur = con.cursor()
        cur.execute(sql)
        return cur.fetchall(), [d[0] for d in cur.description]
    yield run
    con.close()


def test_same_column_twice_in_order_by(trino_q):
    got, names = trino_q("SELECT * FROM (VALUES (1, 90), (2, 80), (3, 70)) t(id, value) MATCH_RECOGNIZE ("
                         "ORDER BY id ASC, id DESC MEASURES CLASSIFIER() AS c ALL ROWS PER MATCH "
                         "PATTERN (A B*) DEFINE B AS B.value < PREV(B.value))")
    assert names == ["id", "c", "value"]
    assert sorted(got) == [(1, "A", 90), (2, "B", 80), (3, "B", 70)]


def test_multimap_agg_in_measures_and_around(trino_q):
    src = "(VALUES (1, 'a', 90), (2, 'b', 80), (3, 'a', 70)) t(id, k, value)"
    got, _ = trino_q(f"SELECT m FROM {src} MATCH_RECOGNIZE (ORDER BY id MEASURES multimap_agg(k, value) AS m "
                     f"PATTERN (A+) DEFINE A AS true)")
    assert got == [({"a": [90, 70], "b": [80]},)]
    got, _ = trino_q(f"SELECT multimap_agg(k, value), every(value > 60), set_union(ARRAY[k]) FROM {src}")
    m, every, union = got[0]
    assert m == {"a": [90, 70], "b": [80]} and every is True and sorted(union) == ["a", "b"]


def test_date_minus_date_is_an_interval_in_trino(trino_q):
    got, _ = trino_q("SELECT DATE '2024-03-05' - DATE '2024-03-01'")
    assert got == [(datetime.timedelta(days=4),)]
    got, _ = trino_q("SELECT span FROM (VALUES (1, DATE '2024-03-01'), (2, DATE '2024-03-04')) t(id, d) "
                     "MATCH_RECOGNIZE (ORDER BY id MEASURES LAST(d) - FIRST(d) AS span PATTERN (A+) "
                     "DEFINE A AS A.d - FIRST(A.d) < INTERVAL '5' DAY)")
    assert got == [(datetime.timedelta(days=3),)]


def test_date_minus_date_stays_days_in_duckdb(q):
    assert q("SELECT DATE '2024-03-05' - DATE '2024-03-01'") == [(4,)]
