"""The SQLAlchemy dialect: create_engine("matchrec:///..."), pandas.read_sql, reflection, jupysql's %sql."""
from __future__ import annotations

import importlib
import os
import pathlib
import tomllib
import warnings

import pandas as pd
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import registry

import matchrec
from matchrec.sqlalchemy_dialect import MatchrecDialect

ROOT = pathlib.Path(__file__).resolve().parents[1]
MR = """SELECT * FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts
        MEASURES FIRST(ts) AS s, LAST(ts) AS e, MATCH_NUMBER() AS m ONE ROW PER MATCH
        PATTERN (A B) DEFINE A AS type = 'A', B AS type = 'B') ORDER BY k, s"""
CER = "PATTERN SEQ(A a, B b) FROM ev PARTITION BY k USE strict-contiguity RETURN a.ts AS a_ts, b.ts AS b_ts"
EVENTS = """CREATE TABLE ev AS SELECT i AS ts, i % 2 AS k, CASE WHEN i % 4 < 2 THEN 'A' ELSE 'B' END AS type,
            (i * 1.5)::DECIMAL(9, 2) AS price, 'x' || i AS note FROM range(16) t(i)"""


@pytest.fixture(autouse=True)
def _registered():
    # the entry point is only installed with the package; the tests register the same target by hand
    registry.register("matchrec", "matchrec.sqlalchemy_dialect", "MatchrecDialect")


@pytest.fixture
def engine(tmp_path):
    engine = sa.create_engine(f"matchrec:///{tmp_path / 'events.duckdb'}")
    with engine.begin() as connection:
        connection.execute(sa.text(EVENTS))
        connection.execute(sa.text("CREATE VIEW a_events AS SELECT * FROM ev WHERE type = 'A'"))
    yield engine
    engine.dispose()


def test_entry_point_names_the_dialect():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["sqlalchemy.dialects"]["matchrec"]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is MatchrecDialect


def test_read_sql_runs_match_recognize_and_cer_without_warnings(engine):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = pd.read_sql(sa.text(MR), engine)
        cer = pd.read_sql(sa.text(CER), engine)
    with matchrec.connect(engine.url.database) as direct:
        expected = direct.execute(MR).df()
    pd.testing.assert_frame_equal(frame, expected)
    assert frame["s"].tolist() == [0, 4, 8, 12, 1, 5, 9, 13]
    assert frame["m"].tolist() == [1, 2, 3, 4, 1, 2, 3, 4]
    assert sorted(zip(cer["a_ts"], cer["b_ts"])) == sorted(zip(frame["s"], frame["e"]))


def test_parameters_and_plain_sql(engine):
    frame = pd.read_sql(sa.text(MR.replace("type = 'A'", "type = :kind")), engine, params={"kind": "A"})
    assert len(frame) == 8
    assert pd.read_sql("SELECT count(*) AS n FROM ev WHERE ts > ?", engine, params=(9,))["n"][0] == 6
    table = sa.Table("ev", sa.MetaData(), autoload_with=engine)
    query = sa.select(table.c.ts).where(table.c.note.in_(["x3", "x4"])).order_by(table.c.ts)
    assert pd.read_sql(query, engine)["ts"].tolist() == [3, 4]


def test_memory_url_and_sql_dialect_argument():
    engine = sa.create_engine("matchrec:///:memory:?dialect=trino")
    with engine.connect() as connection:
        assert connection.connection.dbapi_connection.matchrec_connection.dialect == "trino"
        connection.execute(sa.text(EVENTS))
        rows = connection.execute(sa.text(MR)).fetchall()
    assert [tuple(r) for r in rows][:2] == [(0, 0, 2, 1), (0, 4, 6, 2)]
    engine.dispose()


def test_reflection_basics(engine):
    inspector = sa.inspect(engine)
    assert inspector.get_table_names() == ["ev"]
    assert inspector.get_view_names() == ["a_events"]
    assert inspector.has_table("ev") and inspector.has_table("a_events") and not inspector.has_table("nope")
    assert "main" in inspector.get_schema_names()
    columns = {c["name"]: c["type"] for c in inspector.get_columns("ev")}
    assert list(columns) == ["ts", "k", "type", "price", "note"]
    assert isinstance(columns["ts"], sa.BigInteger)
    assert isinstance(columns["type"], sa.String)
    assert isinstance(columns["price"], sa.Numeric) and (columns["price"].precision, columns["price"].scale) == (9, 2)
    with pytest.raises(sa.exc.NoSuchTableError):
        inspector.get_columns("nope")
    assert sa.Table("a_events", sa.MetaData(), autoload_with=engine).columns.keys() == list(columns)


def test_transactions_commit_and_roll_back(engine):
    with engine.connect() as connection:
        with connection.begin() as transaction:
            connection.execute(sa.text("DELETE FROM ev"))
            transaction.rollback()
        assert connection.execute(sa.text("SELECT count(*) FROM ev")).scalar() == 16
        connection.execute(sa.text("DELETE FROM ev WHERE ts > 11"))
        connection.commit()
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM ev")).scalar() == 12


def test_errors_come_through_as_matchrec_errors(engine):
    with engine.connect() as connection:
        with pytest.raises(sa.exc.ProgrammingError) as caught:
            connection.execute(sa.text(MR.replace("PATTERN (A B)", "PATTERN (A B")))
    assert isinstance(caught.value.orig, matchrec.ProgrammingError)
    assert "Line " in str(caught.value.orig) and "Col " in str(caught.value.orig)


def test_jupysql_magic_runs_match_recognize(tmp_path, monkeypatch):
    monkeypatch.setenv("PLOOMBER_STATS_ENABLED", "false")
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "sql")
        shell.run_line_magic("sql", f"matchrec:///{tmp_path / 'magic.duckdb'}")
        shell.run_cell_magic("sql", "", EVENTS)
        result = shell.run_cell_magic("sql", "", MR)
        frame = result.DataFrame()
        assert frame["s"].tolist() == [0, 4, 8, 12, 1, 5, 9, 13]
        cer = shell.run_line_magic("sql", CER).DataFrame()
        assert len(cer) == 8
    finally:
        shell.run_line_magic("sql", "--close " + f"matchrec:///{tmp_path / 'magic.duckdb'}")
        InteractiveShell.clear_instance()
    assert os.path.exists(tmp_path / "magic.duckdb")
