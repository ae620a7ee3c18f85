"""The PEP 249 surface: module globals, connections, cursors, fetching and exceptions."""
from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import matchrec

MR = """SELECT * FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES FIRST(x) AS s, LAST(x) AS e
        ONE ROW PER MATCH PATTERN (A B) DEFINE A AS x % 2 = 0, B AS true)"""


def test_module_globals():
    assert matchrec.apilevel == "2.0"
    assert matchrec.threadsafety == 2
    assert matchrec.paramstyle == "qmark"
    for name in ["Warning", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
                 "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError"]:
        assert issubclass(getattr(matchrec, name), Exception)
    assert issubclass(matchrec.ProgrammingError, matchrec.DatabaseError)
    assert issubclass(matchrec.DatabaseError, matchrec.Error)
    assert issubclass(matchrec.InterfaceError, matchrec.Error)
    assert matchrec.NUMBER == "INTEGER" and matchrec.STRING == "VARCHAR" and matchrec.DATETIME == "TIMESTAMP"


def test_fetch_methods(con):
    cur = con.cursor()
    assert cur.arraysize == 1
    cur.execute(MR)
    assert [d[0] for d in cur.description] == ["s", "e"]
    assert len(cur.description[0]) == 7
    assert cur.fetchone() == (0, 1)
    assert cur.fetchmany() == [(2, 3)]
    cur.arraysize = 2
    assert cur.fetchmany() == [(4, 5), (6, 7)]
    assert cur.fetchall() == [(8, 9)]
    assert cur.fetchone() is None
    assert cur.fetchall() == []
    cur.execute(MR)
    assert list(cur) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def test_fetch_arrow_table(con):
    cur = con.cursor()
    cur.execute(MR)
    cur.fetchone()
    table = cur.fetch_arrow_table()
    assert isinstance(table, pa.Table)
    assert table.column_names == ["s", "e"]
    assert table.num_rows == 4
    assert table.schema.field("s").type == pa.int64()


def test_rowcount_and_dml(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE t(a INTEGER)")
    cur.executemany("INSERT INTO t VALUES (?)", [[1], [2], [3]])
    cur.execute("SELECT count(*) FROM t")
    assert cur.fetchone() == (3,)
    cur.execute("CREATE TABLE r AS SELECT * FROM t MATCH_RECOGNIZE (ORDER BY a MEASURES count(*) AS n "
                "PATTERN (X+) DEFINE X AS true)")
    cur.execute("SELECT n FROM r")
    assert cur.fetchall() == [(3,)]


def test_two_cursors_interleave(con):
    a, b = con.cursor(), con.cursor()
    a.execute(MR)
    assert a.fetchone() == (0, 1)
    b.execute("SELECT 42")
    assert b.fetchone() == (42,)
    # the first cursor's result is still readable after the second executed
    assert a.fetchall() == [(2, 3), (4, 5), (6, 7), (8, 9)]


def test_closed_objects(con):
    cur = con.cursor()
    cur.close()
    with pytest.raises(matchrec.InterfaceError):
        cur.execute("SELECT 1")
    con.close()
    with pytest.raises(matchrec.InterfaceError):
        con.cursor()
    con.close()  # closing twice is harmless


def test_fetch_before_execute(con):
    with pytest.raises(matchrec.ProgrammingError):
        con.cursor().fetchone()


def test_context_managers():
    with matchrec.connect() as con:
        with con.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchall() == [(1,)]
    assert con.closed


def test_existing_duckdb_connection_is_borrowed():
    duck = duckdb.connect()
    duck.execute("CREATE TABLE e AS SELECT range AS t FROM range(3)")
    con = matchrec.connect(duck)
    cur = con.cursor()
    cur.execute("SELECT n FROM e MATCH_RECOGNIZE (ORDER BY t MEASURES count(*) AS n PATTERN (A+) DEFINE A AS true)")
    assert cur.fetchall() == [(3,)]
    con.close()
    assert duck.execute("SELECT count(*) FROM e").fetchone() == (3,)  # still open


def test_commit_and_rollback(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE t(a INTEGER)")
    con.commit()
    con.rollback()  # no transaction open: nothing happens
    cur.execute("BEGIN TRANSACTION")
    cur.execute("INSERT INTO t VALUES (1)")
    con.rollback()
    cur.execute("SELECT count(*) FROM t")
    assert cur.fetchone() == (0,)
    cur.execute("BEGIN TRANSACTION")
    cur.execute("INSERT INTO t VALUES (1)")
    con.commit()
    cur.execute("SELECT count(*) FROM t")
    assert cur.fetchone() == (1,)


def test_duckdb_errors_are_mapped(con):
    cur = con.cursor()
    with pytest.raises(matchrec.ProgrammingError):
        cur.execute("SELECT * FROM missing_table")
    with pytest.raises(matchrec.DataError):
        cur.execute("SELECT 'abc'::INTEGER")
    cur.execute("CREATE TABLE u(a INTEGER PRIMARY KEY)")
    cur.execute("INSERT INTO u VALUES (1)")
    with pytest.raises(matchrec.IntegrityError):
        cur.execute("INSERT INTO u VALUES (1)")
    with pytest.raises(matchrec.NotSupportedError):
        cur.callproc("p")
    # the cursor stays usable after errors
    cur.execute("SELECT 1")
    assert cur.fetchone() == (1,)


def test_named_parameters(con):
    cur = con.cursor()
    cur.execute("SELECT n FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n "
                "PATTERN (A+) DEFINE A AS x < $lim)", {"lim": 4})
    assert cur.fetchall() == [(4,)]


def test_parameter_types_inlined(con):
    import datetime
    import decimal
    cur = con.cursor()
    values = [1, 2.5, decimal.Decimal("3.25"), "it's", True, None, datetime.date(2024, 1, 2),
              datetime.datetime(2024, 1, 2, 3, 4, 5), datetime.timedelta(hours=1), b"\x00\x01"]
    placeholders = ", ".join("CAST(? AS VARCHAR)" for _ in values)
    cur.execute(f"SELECT * FROM (SELECT 1 AS o) MATCH_RECOGNIZE (MEASURES [{placeholders}] AS v "
                "PATTERN (A) DEFINE A AS true)", values)
    (row,) = cur.fetchall()
    assert row[0] == ["1", "2.5", "3.25", "it's", "true", None, "2024-01-02", "2024-01-02 03:04:05",
                      "01:00:00", "\\x00\\x01"]


def test_multiple_statements(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE s AS SELECT range AS t FROM range(4); SELECT n FROM s MATCH_RECOGNIZE "
                "(ORDER BY t MEASURES count(*) AS n PATTERN (A+) DEFINE A AS true)")
    assert cur.fetchall() == [(4,)]


def test_explain_and_analyze(con):
    cur = con.cursor()
    cur.execute("EXPLAIN " + MR)
    rows = cur.fetchall()
    assert rows[0][0] == "matchrec"
    assert "pattern: A B" in rows[0][1] and "program:" in rows[0][1]
    assert len(rows) > 1  # DuckDB's plan of the rest of the query
    cur.execute("EXPLAIN ANALYZE " + MR)
    text = cur.fetchall()[0][1]
    assert "rows in 10" in text and "matches 5" in text
    assert cur.stats and cur.stats[0][1].matches == 5


def test_settings(con):
    cur = con.cursor()
    cur.execute("SET matchrec_max_matches_per_partition = 2")
    with pytest.raises(matchrec.OperationalError) as info:
        cur.execute(MR)
    assert "matchrec_max_matches_per_partition" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError):
        cur.execute("SET matchrec_nonsense = 1")
    with pytest.raises(matchrec.ProgrammingError):
        cur.execute("SET matchrec_max_threads = -1")
