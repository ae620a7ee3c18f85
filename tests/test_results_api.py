"""Results as DuckDB's Python API gives them: df(), pl(), arrow(), to_arrow_reader(), fetch_record_batch()."""
from __future__ import annotations

import datetime

import duckdb
import pandas as pd
import polars
import pyarrow as pa
import pytest

import matchrec

MR = """SELECT * FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES FIRST(x) AS s, LAST(x) AS e,
        CLASSIFIER() AS c ONE ROW PER MATCH PATTERN (A B) DEFINE A AS x % 2 = 0, B AS true)"""
TYPED = """SELECT i, i::DOUBLE / 4 AS d, 'v' || i AS s, DATE '2024-01-01' + i::INTEGER AS day,
           TIMESTAMP '2024-01-01 10:00:00' + to_seconds(i) AS ts,
           CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS maybe
           FROM range(7) t(i) ORDER BY i"""


@pytest.fixture
def duck():
    con = duckdb.connect()
    yield con
    con.close()


def test_df_matches_duckdb_for_every_column_type(con, duck):
    expected = duck.sql(TYPED).df()
    got = con.execute(TYPED).df()
    pd.testing.assert_frame_equal(got, expected)
    assert con.execute(TYPED).df(date_as_object=True)["day"][1] == datetime.date(2024, 1, 2)


def test_df_of_match_recognize_and_cer(con):
    frame = con.execute(MR).df()
    assert list(frame.columns) == ["s", "e", "c"]
    assert frame["s"].tolist() == [0, 2, 4, 6, 8]
    assert frame["c"].tolist() == ["B"] * 5
    con.execute("CREATE TABLE ev AS SELECT i AS ts, CASE WHEN i % 2 = 0 THEN 'A' ELSE 'B' END AS type "
                "FROM range(6) t(i)")
    cer = con.execute("PATTERN SEQ(A a, B b) FROM ev USE strict-contiguity RETURN a.ts, b.ts").fetchdf()
    assert sorted(map(tuple, cer.to_numpy().tolist())) == [(0, 1), (2, 3), (4, 5)]


def test_df_takes_the_remaining_rows(con):
    cur = con.execute(MR)
    assert cur.fetchone() == (0, 1, "B")
    assert cur.fetch_df()["s"].tolist() == [2, 4, 6, 8]
    assert cur.fetchone() is None


def test_pl_matches_duckdb(con, duck):
    expected = duck.sql(TYPED).pl()
    got = con.execute(TYPED).pl()
    assert isinstance(got, polars.DataFrame)
    assert got.schema == expected.schema
    assert got.equals(expected)
    lazy = con.execute(MR).pl(lazy=True)
    assert isinstance(lazy, polars.LazyFrame)
    assert lazy.collect()["e"].to_list() == [1, 3, 5, 7, 9]


def test_arrow_is_a_reader_as_in_duckdb(con, duck):
    assert isinstance(duck.sql("SELECT 1").arrow(), pa.RecordBatchReader)  # the behaviour we follow
    reader = con.execute(MR).arrow()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.read_all().column("s").to_pylist() == [0, 2, 4, 6, 8]


def test_fetch_record_batch_streams_the_remaining_rows(con):
    cur = con.execute("SELECT range AS x FROM range(1000)")
    assert cur.fetchmany(10) == [(i,) for i in range(10)]
    reader = cur.fetch_record_batch(rows_per_batch=100)
    assert reader.schema.field("x").type == pa.int64()
    sizes, values = [], []
    for batch in reader:
        sizes.append(batch.num_rows)
        values += batch.column(0).to_pylist()
    assert values == list(range(10, 1000))
    assert max(sizes) <= 100 and len(sizes) >= 10
    assert cur.fetchone() is None  # the rows went to the reader


def test_reader_over_match_recognize_in_small_batches(con):
    reader = con.execute(MR).to_arrow_reader(batch_size=2)
    batches = list(reader)
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert pa.Table.from_batches(batches).column_names == ["s", "e", "c"]


def test_reader_stays_valid_when_the_connection_runs_other_statements(con):
    cur = con.execute("SELECT range AS x FROM range(5000)")
    reader = cur.fetch_record_batch(1000)
    first = reader.read_next_batch().column(0).to_pylist()
    other = con.cursor()
    other.execute(MR)  # DuckDB alone would refuse: the reader holds the connection's result
    assert other.fetchall()[0] == (0, 1, "B")
    rest = reader.read_all().column(0).to_pylist()
    assert first + rest == list(range(5000))
    cur.execute("SELECT 42")  # the cursor that handed out the reader runs again
    assert cur.fetchall() == [(42,)]


def test_reader_of_the_same_cursor_survives_its_next_statement(con):
    cur = con.execute("SELECT range AS x FROM range(300)")
    reader = cur.to_arrow_reader(100)
    cur.execute(MR)
    assert cur.fetchone() == (0, 1, "B")
    assert reader.read_all().num_rows == 300


def test_to_arrow_table_and_fetchnumpy(con):
    table = con.execute(MR).to_arrow_table()
    assert table.num_rows == 5
    arrays = con.execute(MR).fetchnumpy()
    assert arrays["e"].tolist() == [1, 3, 5, 7, 9]


def test_buffered_results_convert_too(con):
    cur = con.execute("EXPLAIN " + MR)
    frame = cur.df()
    assert list(frame.columns) == ["explain_key", "explain_value"]
    assert frame["explain_key"][0] == "matchrec"
    reader = con.execute("EXPLAIN " + MR).fetch_record_batch(1)
    assert all(b.num_rows == 1 for b in reader)


def test_bad_use_gives_matchrec_errors(con):
    cur = con.cursor()
    with pytest.raises(matchrec.ProgrammingError, match="No result to fetch"):
        cur.df()
    cur.execute(MR)
    for bad in (0, -5, "10", 2.5):
        with pytest.raises(matchrec.ProgrammingError, match="batch size must be a positive integer"):
            cur.fetch_record_batch(bad)
    cur.close()
    with pytest.raises(matchrec.InterfaceError):
        cur.arrow()


def test_polars_and_pandas_are_optional(con, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "polars", None)  # as if not installed: import raises ImportError
    cur = con.execute(MR)
    with pytest.raises(matchrec.NotSupportedError, match=r"pl\(\) needs polars"):
        cur.pl()
    assert cur.fetchone() == (0, 1, "B")  # the rows are still there
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(matchrec.NotSupportedError, match=r"df\(\) needs pandas"):
        cur.df()
    assert cur.arrow().read_all().num_rows == 4  # Arrow needs neither
