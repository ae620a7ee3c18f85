"""Trino statements that DuckDB reads differently, under ``dialect="trino"``.

The same column twice in ORDER BY, Trino-only aggregates with a DuckDB equivalent
(``multimap_agg``), and Trino's type for ``date - date`` (an INTERVAL DAY TO SECOND, where
DuckDB gives a number of days): in plain SQL, MATCH_RECOGNIZE and pattern windows.
"""
from __future__ import annotations

import datetime

import pytest

import matchrec

EVENTS = "(VALUES (1, 'a', DATE '2020-03-01'), (2, 'b', DATE '2020-03-05'), (3, 'a', DATE '2020-03-08')) t(id, v, d)"
WINDOW = ("WINDOW w AS (ORDER BY id {order} MEASURES {measure} AS m ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING "
          "AFTER MATCH SKIP PAST LAST ROW PATTERN (A+) DEFINE A AS true)")
DAYS = datetime.timedelta


@pytest.fixture(scope="module")
def trino(trino):
    trino.cursor().execute(f"CREATE TABLE ev AS SELECT * FROM {EVENTS}")
    return trino


def run(con, sql):
    cur = con.cursor()
    try:
        cur.execute(sql)
        return cur.fetchall(), [d[1] for d in cur.description]
    finally:
        cur.close()


def test_the_same_column_twice_in_order_by(trino):
    assert run(trino, f"SELECT id FROM {EVENTS} ORDER BY id ASC, id DESC")[0] == [(1,), (2,), (3,)]
    got, _ = run(trino, f"SELECT * FROM {EVENTS} MATCH_RECOGNIZE (ORDER BY id ASC, id DESC MEASURES "
                        f"array_agg(id) AS ids ONE ROW PER MATCH PATTERN (A+) DEFINE A AS true)")
    assert got == [([1, 2, 3],)]
    got, _ = run(trino, f"SELECT id, m OVER w FROM {EVENTS} " + WINDOW.format(order=", id DESC",
                                                                              measure="array_agg(id)"))
    assert sorted(got) == [(1, [1, 2, 3]), (2, None), (3, None)]


def test_multimap_agg(trino):
    want = {"a": [1, 3], "b": [2]}
    got, _ = run(trino, f"SELECT multimap_agg(v, id) FROM {EVENTS}")
    assert {k: sorted(x) for k, x in got[0][0].items()} == want
    got, _ = run(trino, f"SELECT * FROM {EVENTS} MATCH_RECOGNIZE (ORDER BY id MEASURES multimap_agg(v, id) AS m "
                        f"PATTERN (A+) DEFINE A AS true)")
    assert got[0][0] == want
    got, _ = run(trino, f"SELECT id, m OVER w FROM {EVENTS} " + WINDOW.format(order="",
                                                                              measure="multimap_agg(v, id)"))
    assert sorted(got, key=lambda r: r[0]) == [(1, want), (2, None), (3, None)]


@pytest.mark.parametrize("sql, want", [
    ("SELECT DATE '2020-03-01' - DATE '2020-02-01'", [(DAYS(days=29),)]),
    (f"SELECT d - DATE '2020-02-29' FROM {EVENTS} WHERE id = 1", [(DAYS(days=1),)]),
    (f"SELECT max(d) - min(d) FROM {EVENTS}", [(DAYS(days=7),)]),
    ("SELECT max(d) - min(d), max(id) - min(id) FROM ev", [(DAYS(days=7), 2)]),
    ("SELECT a.d - b.d FROM ev a JOIN ev b ON a.id = 3 AND b.id = 1", [(DAYS(days=7),)]),
    (f"SELECT * FROM {EVENTS} MATCH_RECOGNIZE (ORDER BY id MEASURES LAST(d) - FIRST(d) AS span "
     f"PATTERN (A+) DEFINE A AS A.d - FIRST(A.d) <= INTERVAL '4' DAY)", [(DAYS(days=4),), (DAYS(days=0),)]),
    (f"SELECT id, m OVER w FROM {EVENTS} " + WINDOW.format(order="", measure="LAST(d) - FIRST(d)"),
     [(1, DAYS(days=7)), (2, None), (3, None)]),
    # around MATCH_RECOGNIZE and windows: their result columns are typed too
    (f"SELECT l - f FROM {EVENTS} MATCH_RECOGNIZE (ORDER BY id MEASURES FIRST(d) AS f, LAST(d) AS l "
     f"PATTERN (A+) DEFINE A AS true) WHERE l - f > INTERVAL '1' DAY", [(DAYS(days=7),)]),
    (f"SELECT id, m OVER w - DATE '2020-02-29' FROM {EVENTS} " + WINDOW.format(order="", measure="LAST(d)"),
     [(1, DAYS(days=8)), (2, None), (3, None)]),
])
def test_date_minus_date_is_an_interval(trino, sql, want):
    got, types = run(trino, sql)
    assert sorted(got, key=str) == sorted(want, key=str)
    assert "INTERVAL" in types


def test_date_minus_date_stays_a_number_in_duckdb():
    con = matchrec.connect(":memory:")
    try:
        assert run(con, "SELECT DATE '2020-03-01' - DATE '2020-02-01'")[0] == [(29,)]
    finally:
        con.close()


def test_map_agg_keeps_one_value_of_a_repeated_key(trino):
    got, _ = run(trino, f"SELECT map_agg(v, id) FROM {EVENTS}")
    assert set(got[0][0]) == {"a", "b"} and got[0][0]["b"] == 2 and got[0][0]["a"] in (1, 3)
    got, _ = run(trino, f"SELECT * FROM {EVENTS} MATCH_RECOGNIZE (ORDER BY id MEASURES map_agg(v, id) AS m "
                        f"PATTERN (A+) DEFINE A AS true)")
    assert set(got[0][0]) == {"a", "b"}


def test_approx_most_frequent(trino):
    src = "(VALUES (1, 'a'), (2, 'b'), (3, 'a'), (4, 'c'), (5, 'a'), (6, 'c'), (7, NULL)) t(id, v)"
    got, _ = run(trino, f"SELECT approx_most_frequent(2, v, 100) FROM {src}")
    assert got == [({"a": 3, "c": 2},)]
    got, _ = run(trino, f"SELECT * FROM {src} MATCH_RECOGNIZE (ORDER BY id MEASURES approx_most_frequent(1, v, 10) "
                        f"AS m PATTERN (A+) DEFINE A AS true)")
    assert got == [({"a": 3},)]


def test_translated_aggregates_as_window_functions(trino):
    got, _ = run(trino, f"SELECT id, multimap_agg(v, id) OVER (ORDER BY id), map_agg(v, id) OVER (ORDER BY id "
                        f"ROWS BETWEEN CURRENT ROW AND CURRENT ROW) FROM {EVENTS}")
    assert sorted(got, key=lambda r: r[0]) == [(1, {"a": [1]}, {"a": 1}), (2, {"a": [1], "b": [2]}, {"b": 2}),
                                               (3, {"a": [1, 3], "b": [2]}, {"a": 3})]
    got, _ = run(trino, f"SELECT id, multimap_agg(v, id) OVER w FROM {EVENTS} " + WINDOW.format(order="",
                                                                                                measure="count(*)"))
    assert sorted(got, key=lambda r: r[0]) == [(1, {"a": [1, 3], "b": [2]}), (2, None), (3, None)]
