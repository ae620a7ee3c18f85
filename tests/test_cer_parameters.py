"""Query parameters in CER statements: ``?``, ``$1`` and ``$name`` bound through the DB-API.

A bound value must behave exactly as the literal written in its place: random statements with
every integer of their WHERE and WITHIN turned into a placeholder return what the written
statement returns, locally and over storage nodes. A string that looks like SQL stays a value.
Counting, naming and typing mistakes are ProgrammingErrors that point at the placeholder.
"""
from __future__ import annotations

import datetime
import decimal
import random
import re

import pytest

import matchrec
from test_cer_language import _Case, _load

_INTEGER = re.compile(r"(?<![\w.$])\d+(?![\w.])")


@pytest.fixture
def con():
    c = matchrec.connect()
    c.cursor().execute("""CREATE TABLE ev AS SELECT * FROM (VALUES
        (1, 1, 'a', 5, DECIMAL '1.50', DATE '2024-01-01', 'x''y'),
        (2, 2, 'b', 7, DECIMAL '2.25', DATE '2024-01-02', 'OR 1=1'),
        (3, 3, 'a', NULL, DECIMAL '0.75', DATE '2024-01-03', 'z'),
        (4, 4, 'b', 2, DECIMAL '3.00', DATE '2024-01-04', 'x''y'),
        (5, 9, 'b', 9, DECIMAL '1.50', DATE '2024-01-05', 'q')) t(id, ts, kind, v, price, day, label)""")
    yield c
    c.close()


def _rows(con, sql, params=None):
    cur = con.cursor()
    cur.execute(sql, params) if params is not None else cur.execute(sql)
    return sorted(cur.fetchall(), key=repr)


def _parameterized(text: str) -> tuple[str, list]:
    """``text`` with every integer after WHERE (its conditions and the WITHIN length) as ``?``."""
    at = text.index(" WHERE ") if " WHERE " in text else text.index(" WITHIN ") if " WITHIN " in text else -1
    if at < 0:
        return text, []
    head, tail = text[:at], text[at:]
    end = tail.index(" RETURN ")
    values = [int(m) for m in _INTEGER.findall(tail[:end])]
    return head + _INTEGER.sub("?", tail[:end]) + tail[end:], values


def test_random_statements_with_placeholders_return_what_the_written_statements_return():
    rng = random.Random(20261129)
    compared = 0
    con = matchrec.connect()
    try:
        for _ in range(60):
            case = _Case(rng)
            _load(con, case)
            text = case.text(", ".join(f"{v}.id" for v in case.positive()))
            marked, values = _parameterized(text)
            if not values:
                continue
            assert marked.count("?") == len(values)
            assert _rows(con, marked, values) == _rows(con, text), (marked, values)
            numbered = marked
            for k in range(len(values)):
                numbered = numbered.replace("?", f"${k + 1}", 1)
            assert _rows(con, numbered, values) == _rows(con, text), numbered
            compared += 1
    finally:
        con.close()
    assert compared >= 20


@pytest.mark.parametrize("text, params, literal", [
    ("WHERE a.v > ? AND b.v > ?", [4, 6], "WHERE a.v > 4 AND b.v > 6"),
    ("WHERE a.price = ?", [decimal.Decimal("1.50")], "WHERE a.price = 1.50"),
    ("WHERE b.price > a.price + ?", [decimal.Decimal("0.5")], "WHERE b.price > a.price + 0.5"),
    ("WHERE a.day >= ? AND b.v > 1", [datetime.date(2024, 1, 2)],
     "WHERE a.day >= CAST('2024-01-02' AS DATE) AND b.v > 1"),
    # a date across two variables is compared in Python, where no CAST to DATE can be written
    ("WHERE (a.day < ?) = (b.day < ?)", [datetime.date(2024, 1, 3)] * 2, [(1, 2), (3, 4), (3, 5)]),
    ("WHERE a.label = ?", ["x'y"], "WHERE a.label = 'x''y'"),
    ("WHERE a.label = ? OR b.label = ?", ["' OR TRUE --", "OR 1=1"], "WHERE a.label = ''' OR TRUE --' OR b.label = 'OR 1=1'"),
    ("WHERE a.v IS NOT DISTINCT FROM ?", [None], None),
    ("WHERE (a.v > ?) = ?", [4, True], "WHERE (a.v > 4) = TRUE"),
    ("WHERE a.v < $2 AND b.v > $1", [3, 8], "WHERE a.v < 8 AND b.v > 3"),
    ("WHERE a.v < $hi AND b.v > $lo", {"lo": 3, "hi": 8}, "WHERE a.v < 8 AND b.v > 3"),
    ("WHERE b.v - a.v > ?", [1.5], "WHERE b.v - a.v > 1.5"),
])
def test_a_bound_value_is_the_literal_in_its_place(con, text, params, literal):
    base = "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts {} RETURN a.id, b.id"
    if literal is None:  # IS NOT DISTINCT FROM is not in the language: the error must point at it
        with pytest.raises(matchrec.ProgrammingError):
            _rows(con, base.format(text), params)
        return
    want = literal if isinstance(literal, list) else _rows(con, base.format(literal))
    assert _rows(con, base.format(text), params) == want
    assert want  # every case above matches something: a test of an empty result proves little


def test_a_window_length_and_a_match_recognize_definition_take_parameters(con):
    sase = "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts WITHIN {} RETURN a.id, b.id"
    for n in (1, 2, 6):
        assert _rows(con, sase.format("?"), [n]) == _rows(con, sase.format(n))
    mr = ("SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.id AS aid, B.id AS bid "
          "PATTERN (A B) WITHIN {} STRATEGY skip-till-any-match DEFINE A AS kind = {}, B AS v > {})")
    assert _rows(con, mr.format("?", "?", "?"), [5, "a", 1]) == _rows(con, mr.format(5, "'a'", 1))
    assert _rows(con, mr.format(5, "'a'", 1))


def test_parameter_mistakes_are_programming_errors_at_the_placeholder(con):
    base = "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts\nWHERE a.v > ? RETURN COUNT(*)"
    with pytest.raises(matchrec.ProgrammingError, match=r"no parameters were given.*Line 2, Col 13") as info:
        _rows(con, base)
    assert "^" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError, match="1 '\\?' placeholders but 2 parameters"):
        _rows(con, base, [1, 2])
    with pytest.raises(matchrec.ProgrammingError, match="0 '\\?' placeholders but 1 parameters"):
        _rows(con, base.replace("?", "1"), [1])
    with pytest.raises(matchrec.ProgrammingError, match="given as a mapping"):
        _rows(con, base, {"x": 1})
    with pytest.raises(matchrec.ProgrammingError, match=r"Parameter \$2 is not given.*Line 2, Col 13"):
        _rows(con, base.replace("?", "$2"), [1])
    with pytest.raises(matchrec.ProgrammingError, match=r"Parameter \$hi is not given"):
        _rows(con, base.replace("?", "$hi"), {"lo": 1})
    with pytest.raises(matchrec.ProgrammingError, match="type bytes in a CER statement.*Line 2, Col 13"):
        _rows(con, base, [b"\x00"])
    with pytest.raises(matchrec.ProgrammingError, match="window length must be a number, not str"):
        _rows(con, "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts WITHIN ? RETURN COUNT(*)", ["5"])
    with pytest.raises(matchrec.ProgrammingError, match="window cannot be negative"):
        _rows(con, "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts WITHIN ? RETURN COUNT(*)", [-1])
    # the connection is still usable, and a literal '?' inside a string is no placeholder
    assert _rows(con, "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts WHERE a.label <> '?' "
                      "RETURN COUNT(*)") == [(5,)]


def test_parameters_over_storage_nodes_with_every_pull_strategy(con, tmp_path):
    """The values take part in the pull's row filter and rounds as the literals would."""
    import duckdb
    from matchrec.connectors.loader import load
    from nodes import TOKEN, Cluster
    cluster = Cluster(tmp_path, 2)
    try:
        src = duckdb.connect()
        src.register("t", con.cursor().execute("SELECT * FROM ev").fetch_arrow_table())
        load(cluster.uris, "ev", "SELECT * FROM t", src, "random", token=TOKEN)
        remote = matchrec.connect(storage_nodes=cluster.uris, token=TOKEN)
        text = ("PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts WHERE a.label = ? AND b.v > ? AND "
                "b.price >= a.price WITHIN ? RETURN a.id, b.id")
        params = ["x'y", 1, 3]
        want = _rows(con, text, params)
        assert want == [(1, 2), (1, 4)]
        for strategy in ("pull_all", "push_down", "naive_dfs", "dfs", "dfs_stateful", "push_pull", "auto"):
            remote.cursor().execute(f"SET pull_strategy = {strategy}")
            remote.cursor().execute("SET matchrec_round_trips = always")
            assert _rows(remote, text, params) == want, strategy
        remote.close()
    finally:
        cluster.close()


def test_a_string_that_is_not_unicode_text_is_a_data_error(con):
    with pytest.raises(matchrec.DataError, match="not valid Unicode"):
        _rows(con, "PATTERN SEQ(a a, b b) FROM ev TYPE kind ORDER BY ts WHERE a.label = ? RETURN COUNT(*)",
              ["\ud800"])
