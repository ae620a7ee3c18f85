"""The fixed cost of a statement: planner answers kept across statements, probes skipped.

A repeated MATCH_RECOGNIZE asks DuckDB again only for what may have changed: the columns of a
stored table and the types of expressions are kept while DuckDB's catalog version stands (moved
by DDL, SET and registrations, but not by matchrec's own result registrations). These tests hold
the kept answers to DuckDB's own: after DDL, SET, a re-registered object and a rewritten file
the results follow the new input, and the types taken without a probe are the probe's.
"""
from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import matchrec
from matchrec.connectors import duckdb_source as D
from matchrec.engine import reading

SUM = ("SELECT * FROM {t} MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n, sum(A.v) AS s ONE ROW PER MATCH "
       "PATTERN (A+) DEFINE A AS sum(A.v) < 1e12)")


def run(cur, sql):
    cur.execute(sql)
    return cur.fetchall(), [d[1] for d in cur.description]


def test_fixed_arrow_types_are_duckdbs():
    con = duckdb.connect()
    for duck_type, arrow in D._FIXED_ARROW.items():
        assert con.sql(f"SELECT CAST(NULL AS {duck_type}) AS x").to_arrow_table().schema.field(0).type == arrow


def test_repeated_statement_asks_no_describe(monkeypatch):
    con = matchrec.connect()
    cur = con.cursor()
    cur.execute("CREATE TABLE s AS SELECT i AS id, i % 7 AS v FROM range(100) r(i)")
    first = run(cur, SUM.format(t="s"))
    calls = []
    real = D.describe
    monkeypatch.setattr(D, "describe", lambda c, sql: calls.append(sql) or real(c, sql))
    assert run(cur, SUM.format(t="s")) == first
    assert calls == []  # the stored table's columns were kept
    # a view may read anything: asked every time
    cur.execute("CREATE VIEW sv AS SELECT * FROM s")
    run(cur, SUM.format(t="sv"))
    run(cur, SUM.format(t="sv"))
    assert len(calls) == 2


def test_ddl_drops_kept_answers():
    con = matchrec.connect()
    cur = con.cursor()
    cur.execute("CREATE TABLE s AS SELECT i AS id, i % 7 AS v FROM range(100) r(i)")
    rows, _ = run(cur, SUM.format(t="s"))
    assert rows == [(100, sum(i % 7 for i in range(100)))]
    cur.execute("CREATE OR REPLACE TABLE s AS SELECT i AS id, (i % 7) / 2 AS v FROM range(10) r(i)")
    rows, _ = run(cur, SUM.format(t="s"))
    assert rows == [(10, sum((i % 7) / 2 for i in range(10)))]
    assert isinstance(rows[0][1], float)
    cur.execute("ALTER TABLE s ADD COLUMN w INTEGER")
    cur.execute("UPDATE s SET w = 1")
    rows, _ = run(cur, SUM.format(t="s").replace("sum(A.v) AS s", "sum(A.w) AS s"))
    assert rows == [(10, 10)]


def test_set_drops_kept_types():
    con = matchrec.connect()
    cur = con.cursor()
    cur.execute("CREATE TABLE s AS SELECT i AS id, i AS v FROM range(5) r(i)")
    sql = ("SELECT * FROM s MATCH_RECOGNIZE (ORDER BY id MEASURES last(A.v) / 2 AS h ONE ROW PER MATCH "
           "PATTERN (A+) DEFINE A AS A.v / 2 < 100)")
    assert run(cur, sql)[0] == [(2.0,)]
    cur.execute("SET integer_division = true")  # `/` of integers is now an integer
    assert run(cur, sql)[0] == [(2,)]
    assert isinstance(run(cur, sql)[0][0][0], int)


def test_reregistered_object_and_rewritten_file(tmp_path):
    con = matchrec.connect()
    cur = con.cursor()
    con.register("t", pa.table({"id": [1, 2, 3], "v": [1, 2, 3]}))
    assert run(cur, SUM.format(t="t"))[0] == [(3, 6)]
    con.register("t", pa.table({"id": [1, 2], "v": [0.5, 0.25]}))
    assert run(cur, SUM.format(t="t"))[0] == [(2, 0.75)]
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "v": [1, 2, 3]}), path)
    sql = SUM.format(t=f"'{path.as_posix()}'")
    assert run(cur, sql)[0] == [(3, 6)]
    pq.write_table(pa.table({"id": [1, 2], "x": [7, 8], "v": [1.5, 2.5]}), path)
    assert run(cur, sql)[0] == [(2, 4.0)]


@pytest.mark.parametrize("duck_type", ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UBIGINT", "FLOAT",
                                       "DOUBLE", "DECIMAL(10,2)", "DECIMAL(38,3)", "DATE", "TIMESTAMP",
                                       "TIMESTAMPTZ", "INTERVAL", "VARCHAR", "BOOLEAN", "UHUGEINT", "BIGNUM"])
def test_input_column_types_are_the_probes(duck_type):
    """The types probe_types takes from the plan without a query equal the probe query's."""
    con = duckdb.connect()
    con.execute(f'CREATE TABLE t AS SELECT CAST(NULL AS {duck_type}) AS "Val", 1 AS id')
    oracle = D.DuckDBOracle(con)

    class P:  # the only part of a plan the shortcut reads
        input_columns = oracle.columns("SELECT * FROM t")
    for sql in ('"Val"', '("Val")', '"val"', "val", "(Val)", "1e12", "(2.5)", "7"):
        got = reading._input_column_type(P, sql, oracle)
        probe = con.sql(f"SELECT ({sql}) AS x FROM t LIMIT 0").to_arrow_table().schema.field(0).type
        if duck_type in D.TEXT_CARRIED and "al" in sql.lower():
            assert got is None  # carried as text: the probe answers
        else:
            assert got == probe, (sql, got, probe)
    for sql in ("Val + 1", '"Val" || 1', "true", "current_date", "(Val) + (id)"):
        assert reading._input_column_type(P, sql, oracle) is None
