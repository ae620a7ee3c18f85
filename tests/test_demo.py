"""Tests of ``matchrec demo``: the generated tables, both queries, and the --db file handling."""
from __future__ import annotations

import datetime
import os

import duckdb
import pytest

import matchrec
from matchrec import demo
from matchrec.cli import main

ROWS = 5_000


@pytest.fixture(scope="module")
def database():
    con = matchrec.connect()
    demo.build_database(con, ROWS, demo.DEFAULT_SEED)
    yield con
    con.close()


def query(con, sql):
    cur = con.cursor()
    cur.execute(sql)
    return [d[0] for d in cur.description], cur.fetchall()


def test_tables_have_the_documented_shape(database):
    duck = database.duckdb_connection
    for table, schema in demo.SCHEMAS.items():
        described = [(name, kind) for name, kind, *_ in duck.execute(f"DESCRIBE {table}").fetchall()]
        assert described == [tuple(col.split(" ", 1)) for col in schema.split(", ")]
        assert duck.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == ROWS
    tickers, minutes = duck.execute("SELECT count(DISTINCT ticker), max(ts) - min(ts) FROM stocks").fetchone()
    assert tickers == 20 and minutes == datetime.timedelta(minutes=ROWS // 20 - 1)
    assert duck.execute("SELECT min(price) > 0 FROM stocks").fetchone()[0]
    types = dict(duck.execute("SELECT type, count(*) FROM crimes GROUP BY type").fetchall())
    assert set(types) == set(demo.CRIME_TYPES) and types["BATTERY"] > types["ROBBERY"]
    districts, gap = duck.execute("SELECT count(DISTINCT district), "
                                  "epoch(max(ts) - min(ts)) / (count(*) - 1) FROM crimes").fetchone()
    assert districts == demo.DISTRICTS and 45 < gap < 75  # mean gap of about a minute


def test_generation_is_deterministic():
    a, b, c = demo.generate(500, 7), demo.generate(500, 7), demo.generate(500, 8)
    assert a["stocks"].equals(b["stocks"]) and a["crimes"].equals(b["crimes"])
    assert not a["stocks"].equals(c["stocks"])


def test_vshape_query_finds_v_shapes(database):
    names, rows = query(database, demo.VSHAPE_SQL)
    assert names[:4] == ["ticker", "start_ts", "bottom_ts", "end_ts"] and len(rows) >= 10
    for ticker, start, bottom, end, start_price, bottom_price, end_price in rows:
        assert bottom - start >= datetime.timedelta(minutes=3) and end - bottom >= datetime.timedelta(minutes=3)
        assert bottom_price < start_price and end_price > bottom_price


def test_crime_query_finds_sequences(database):
    names, rows = query(database, demo.CRIMES_SQL)
    assert names == ["district", "robbery_id", "battery_id", "theft_id", "robbery_ts", "elapsed"]
    assert rows
    crimes = {r[0]: r[1:] for r in database.duckdb_connection.execute("SELECT id, ts, type, district FROM crimes")
              .fetchall()}
    for district, robbery, battery, theft, robbery_ts, elapsed in rows:
        assert robbery < battery < theft
        assert [crimes[i][1] for i in (robbery, battery, theft)] == ["ROBBERY", "BATTERY", "MOTOR_VEHICLE_THEFT"]
        assert {crimes[i][2] for i in (robbery, battery, theft)} == {district}
        assert crimes[robbery][0] == robbery_ts and elapsed <= datetime.timedelta(minutes=30)


def test_demo_command_writes_a_database_file(tmp_path, capsys):
    path = str(tmp_path / "demo.duckdb")
    assert main(["demo", "--rows", str(ROWS), "--db", path]) == 0
    out = capsys.readouterr().out
    assert "PATTERN (STRT DOWN{3,} UP{3,})" in out and "PATTERN (R {- N* -} B {- N* -} M)" in out
    assert out.count(" matches") == 2 and "Timings (s): generation" in out
    assert f"matchrec shell {path}" in out
    con = duckdb.connect(path, read_only=True)
    assert con.execute("SELECT (SELECT count(*) FROM stocks), (SELECT count(*) FROM crimes)").fetchone() == (ROWS,
                                                                                                              ROWS)
    con.close()

    size = os.path.getsize(path)
    assert main(["demo", "--rows", "100", "--db", path]) == 1
    assert "already exists" in capsys.readouterr().err
    assert os.path.getsize(path) == size
    assert main(["demo", "--rows", "100", "--db", path, "--force"]) == 0
    con = duckdb.connect(path, read_only=True)
    assert con.execute("SELECT count(*) FROM crimes").fetchone() == (100,)
    con.close()


def test_demo_command_in_memory(capsys):
    assert main(["demo", "--rows", "1000", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "in-memory" in out and "matchrec shell" not in out


def test_demo_rejects_bad_rows(capsys):
    assert main(["demo", "--rows", "0"]) == 1
    assert "--rows" in capsys.readouterr().err
