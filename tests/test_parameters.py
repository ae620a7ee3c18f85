"""Query parameters: values round-trip exactly and never change a statement, in every dialect.

Statements with MATCH_RECOGNIZE cannot be bound by DuckDB directly, so matchrec puts the
values into the statement itself; these tests hold it to what DuckDB gives for a bound
parameter, with hostile strings, under every dialect ``connect()`` accepts.
"""
from __future__ import annotations

import datetime as dt
import decimal
import math
import threading
import uuid

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import matchrec
from matchrec.parser.query import SUPPORTED_DIALECTS

SECRET = "hunter2-secret"

HOSTILE = [
    "'",
    "\\",
    "\\\\",
    "x''y",
    "a' 'b",
    "\\'",
    "\\' UNION SELECT pw FROM secret -- ",
    "' UNION SELECT pw FROM secret -- ",
    "'; DROP TABLE keep; --",
    "\\'; DROP TABLE keep; --",
    "*/ UNION SELECT pw FROM secret /*",
    "/* comment */ -- line",
    "$$ UNION SELECT pw FROM secret $$",
    "$tag$ x $tag$",
    "\" OR 1=1 --",
    "`x` ``",
    "? $1 $name",
    "\\n\\t\\0\\Z\\%\\_\\x41\\u0041",
    "line1\nline2\r\n-- c\nend",
    "nul\x00byte",
    "\U0001F600 e\u0301 \u65e5\u672c \u202e \u2028 \ufeff",
    "MATCH_RECOGNIZE ( PATTERN (A) )",
    "{{ ref('secret') }}",
    "",
]

# the pair of the original report: '\' ends a string where backslashes escape, and the
# second value then runs as SQL
REPORT_PAIR = ["\\", " UNION SELECT pw FROM secret -- "]

MR_QUERY = """SELECT echo, sa FROM ev MATCH_RECOGNIZE (
    ORDER BY id MEASURES ? AS echo, A.sa AS sa ONE ROW PER MATCH
    PATTERN (A) DEFINE A AS A.sa = ?) m
  WHERE sa = ? AND sa = ?"""


@pytest.fixture(scope="module")
def duck():
    con = duckdb.connect()
    con.execute("CREATE TABLE secret(pw VARCHAR)")
    con.execute("INSERT INTO secret VALUES (?)", [SECRET])
    con.execute("CREATE TABLE keep(k INTEGER)")
    con.execute("INSERT INTO keep VALUES (1)")
    con.execute("CREATE TABLE ev(id INTEGER, sa VARCHAR)")
    con.executemany("INSERT INTO ev VALUES (?, ?)", [[i, s] for i, s in enumerate(HOSTILE)])
    yield con
    con.close()


def _untouched(duck) -> None:
    assert duck.execute("SELECT pw FROM secret").fetchall() == [(SECRET,)]
    assert duck.execute("SELECT k FROM keep").fetchall() == [(1,)]


@pytest.mark.parametrize("dialect", SUPPORTED_DIALECTS)
def test_hostile_strings_round_trip_in_every_dialect(duck, dialect):
    cur = matchrec.connect(duck, dialect=dialect).cursor()
    for payload in HOSTILE:
        cur.execute("SELECT ? AS a, ? AS b", [payload, "after"])
        assert cur.fetchall() == [(payload, "after")], (dialect, payload)
        cur.execute(MR_QUERY, [payload, payload, payload, payload])
        assert cur.fetchall() == [(payload, payload)], (dialect, payload)
    _untouched(duck)


@pytest.mark.parametrize("dialect", SUPPORTED_DIALECTS)
def test_report_pair_reads_no_other_table(duck, dialect):
    cur = matchrec.connect(duck, dialect=dialect).cursor()
    after_mr = """SELECT sa FROM ev MATCH_RECOGNIZE (ORDER BY id MEASURES A.sa AS sa ONE ROW PER MATCH
                  PATTERN (A) DEFINE A AS true) m WHERE sa = ? AND sa = ?"""
    cur.execute(after_mr, REPORT_PAIR)
    assert cur.fetchall() == []
    cur.execute("SELECT sa FROM ev WHERE sa = ? AND sa = ?", REPORT_PAIR)
    assert cur.fetchall() == []
    # the same values, one per row they match, in the input of MATCH_RECOGNIZE and in DEFINE
    cur.execute("""SELECT n FROM (SELECT * FROM ev WHERE sa = ? OR sa = ?) MATCH_RECOGNIZE (
                     ORDER BY id MEASURES count(*) AS n PATTERN (A+) DEFINE A AS sa IN (?, ?))""",
                REPORT_PAIR * 2)
    assert cur.fetchall() == [(1,)]  # only '\' is a row of ev
    _untouched(duck)


def test_named_and_numbered_parameters_with_hostile_values(duck):
    for dialect in ("duckdb", "spark", "mysql"):
        cur = matchrec.connect(duck, dialect=dialect).cursor()
        cur.execute("""SELECT echo FROM ev MATCH_RECOGNIZE (ORDER BY id MEASURES $v AS echo
                       PATTERN (A) DEFINE A AS sa = $v) m WHERE echo = $v""", {"v": REPORT_PAIR[0]})
        assert cur.fetchall() == [(REPORT_PAIR[0],)]
        cur.execute("""SELECT echo FROM ev MATCH_RECOGNIZE (ORDER BY id MEASURES $2 AS echo
                       PATTERN (A) DEFINE A AS sa = $1) m""", REPORT_PAIR)
        assert cur.fetchall() == [(REPORT_PAIR[1],)]
    _untouched(duck)


# the characters that end, escape or comment out SQL somewhere, plus any other text
_HOSTILE_TEXT = st.text(st.one_of(st.sampled_from(list("'\"`\\$?;-/*#\n\r\t\x00{}[]()@:eE0xXuUNZ% ")),
                                  st.characters(blacklist_categories=("Cs",))), max_size=24)


def _round_trip(duck, dialect: str, value: str) -> None:
    cur = matchrec.connect(duck, dialect=dialect).cursor()
    cur.execute("""SELECT echo FROM (SELECT 1 AS id) MATCH_RECOGNIZE (ORDER BY id MEASURES ? AS echo
                   PATTERN (A) DEFINE A AS ? = ?) m WHERE echo = ? AND length(echo) = ?""",
                [value, value, value, value, len(value)])
    assert cur.fetchall() == [(value,)], (dialect, value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dialect=st.sampled_from(SUPPORTED_DIALECTS), value=_HOSTILE_TEXT)
def test_random_hostile_strings_round_trip(duck, dialect, value):
    _round_trip(duck, dialect, value)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dialect=st.sampled_from(SUPPORTED_DIALECTS), value=_HOSTILE_TEXT)
def test_random_hostile_strings_round_trip_exhaustive(duck, dialect, value):
    _round_trip(duck, dialect, value)


TYPED = [
    0, 1, -1, 2 ** 31 - 1, -2 ** 31, 2 ** 31, -2 ** 31 - 1, 2 ** 63 - 1, -2 ** 63, 2 ** 63, 2 ** 64 - 1, 2 ** 64,
    2 ** 127 - 1, -2 ** 127, 2 ** 127, 2 ** 128 - 1,
    0.1, -0.0, 2.5, 1e300, 5e-324, float("inf"), float("-inf"), float("nan"),
    decimal.Decimal("3.25"), decimal.Decimal("-0.000"), decimal.Decimal("0.123"), decimal.Decimal("-12.5E-3"),
    decimal.Decimal("1E+30"), decimal.Decimal("1.5E-40"), decimal.Decimal("9" * 38), decimal.Decimal("9" * 39),
    decimal.Decimal("NaN"), decimal.Decimal("Infinity"), decimal.Decimal("-Infinity"),
    True, False, None, b"", b"\x00\x01\xff'\\", bytearray(b"ab"), memoryview(b"cd"),
    dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.time(3, 4, 5, 6), dt.time(0, 0),
    dt.time(3, 4, 5, tzinfo=dt.timezone.utc),
    dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.datetime(1, 1, 1),
    dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    dt.timedelta(days=-1, seconds=5, microseconds=7), dt.timedelta(0), dt.timedelta(days=40000, microseconds=1),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    [1, 2], ["a", "b'c\\"], [], [None], [[1], [2, 3]],
]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def test_every_type_comes_back_as_duckdb_binds_it(duck):
    """The value and its DuckDB type are those of a bound parameter, in the statement after
    MATCH_RECOGNIZE and in MEASURES (where Arrow can hold the value)."""
    cur = matchrec.connect(duck, dialect="spark").cursor()
    after = """SELECT ?, typeof(?) FROM (SELECT 1 AS id) MATCH_RECOGNIZE (ORDER BY id MEASURES 1 AS v
               PATTERN (A) DEFINE A AS true)"""
    inside = """SELECT v, t FROM (SELECT 1 AS id) MATCH_RECOGNIZE (ORDER BY id MEASURES ? AS v, typeof(?) AS t
                PATTERN (A) DEFINE A AS ? IS NOT DISTINCT FROM ?)"""
    for value in TYPED:
        expected = duck.execute("SELECT ?, typeof(?)", [value, value]).fetchall()[0]
        cur.execute(after, [value, value])
        got = cur.fetchall()[0]
        assert _same(got[0], expected[0]) and got[1] == expected[1], (value, got, expected)
        if isinstance(value, int) and not -2 ** 63 <= value < 2 ** 64:
            continue  # beyond 64 bits a MEASURES value must travel as Arrow decimal128(38): see below
        cur.execute(inside, [value, value, value, value])
        got = cur.fetchall()
        assert len(got) == 1 and _same(got[0][0], expected[0]) and got[0][1] == expected[1], (value, got, expected)


def test_values_that_cannot_be_represented_get_a_clear_error(con):
    cur = con.cursor()
    one = "SELECT * FROM (SELECT 1 AS id) MATCH_RECOGNIZE (ORDER BY id MEASURES ? AS v PATTERN (A) DEFINE A AS true)"
    with pytest.raises(matchrec.DataError, match="[Pp]arameter 1.*128 bits"):
        cur.execute(one, [2 ** 128])
    with pytest.raises(matchrec.DataError, match="NaN"):
        cur.execute(one, [decimal.Decimal("sNaN")])
    with pytest.raises(matchrec.DataError, match="[Pp]arameter 2.*(lone surrogate|not valid Unicode).*position 1"):
        cur.execute(one.replace("? AS v", "? AS v, ? AS w"), ["ok", "a\ud800b"])
    with pytest.raises(matchrec.ProgrammingError, match="type object"):
        cur.execute(one, [object()])
    cur.execute(one, [2 ** 127 - 1])  # beyond decimal128's 38 digits, still a HUGEINT: exact
    assert cur.fetchall() == [(2 ** 127 - 1,)]
    cur.execute("SELECT 1")
    assert cur.fetchall() == [(1,)]


def test_question_marks_in_pattern_are_quantifiers(q):
    rows = q("""SELECT n FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                PATTERN (A+? B?) DEFINE A AS x >= ?, B AS x > ?) WHERE n > ?""", [2, 100, 0])
    assert rows == [(1,)] * 8
    rows = q("""SELECT n FROM range(10) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                PATTERN (A+ $) DEFINE A AS x >= $lo)""", {"lo": 7})
    assert rows == [(3,)]


def test_within_takes_a_number_parameter(q):
    sql = """SELECT a, b FROM (VALUES (1, 'A'), (5, 'B'), (10, 'A'), (30, 'B')) t(o, c) MATCH_RECOGNIZE (
             ORDER BY o MEASURES A.o AS a, B.o AS b PATTERN (A B) WITHIN ? DEFINE A AS c = ?, B AS c = 'B')"""
    assert q(sql, [10, "A"]) == [(1, 5)]
    with pytest.raises(matchrec.ProgrammingError, match="WITHIN"):
        q(sql, ["10 DEFINE", "A"])


def test_errors_point_at_the_statement_as_written(con):
    cur = con.cursor()
    sql = "SELECT * FROM range(3) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES ? AS v PATTERN (A)\n" \
          "  DEFINE A AS nosuch = ?)"
    with pytest.raises(matchrec.ProgrammingError) as info:
        cur.execute(sql, ["a'b", 1])
    text = str(info.value)
    assert "__mr" not in text and "nosuch" in text
    assert "Line 2, Col 15" in text and "DEFINE A AS nosuch = ?)" in text
    with pytest.raises(matchrec.ProgrammingError) as info:
        cur.execute("EXPLAIN " + sql, ["a'b", 1])
    assert "__mr" not in str(info.value) and "Line 2, Col 15" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError, match="Not enough parameters") as info:
        cur.execute("EXPLAIN " + sql, ["a'b"])
    assert "Line 2, Col 24" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError, match="mapping") as info:
        cur.execute("EXPLAIN " + sql, {"v": 1})
    assert "Line 1, Col 74" in str(info.value) and "EXPLAIN SELECT" in str(info.value)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One real storage node whose database also holds a ``secret`` table."""
    from matchrec.connectors.storage_node import StorageNode
    path = str(tmp_path_factory.mktemp("param_node") / "node.duckdb")
    with duckdb.connect(path) as setup:
        setup.execute("CREATE TABLE secret(pw VARCHAR)")
        setup.execute("INSERT INTO secret VALUES (?)", [SECRET])
    server = StorageNode(path, token="tok")
    thread = threading.Thread(target=server.wait, daemon=True)
    thread.start()
    yield f"grpc://127.0.0.1:{server.port}"
    server.close()


def test_values_pushed_to_storage_nodes_stay_values(duck, node):
    """Conditions with parameters are pushed to the node as DuckDB SQL; hostile values must
    filter exactly as locally and never read the node's other tables."""
    from matchrec.connectors.loader import load
    load([node], "ev", "SELECT id, sa FROM ev", duck, "random", token="tok")
    remote = matchrec.connect(storage_nodes=[node], token="tok", dialect="spark")
    local = matchrec.connect(duck, dialect="spark")
    sql = """SELECT a, b FROM ev MATCH_RECOGNIZE (ORDER BY id MEASURES A.sa AS a, B.sa AS b
             PATTERN (A B) WITHIN 3 DEFINE A AS A.sa = ? AND A.sa = ?, B AS B.sa <> ?)"""
    cur, want_cur = remote.cursor(), local.cursor()
    for strategy in ("push_down", "dfs"):
        cur.execute(f"SET pull_strategy = {strategy}")
        for params in [REPORT_PAIR + [""], [REPORT_PAIR[0]] * 2 + [""], ["x''y", "x''y", "'"]]:
            want_cur.execute(sql, params)
            want = want_cur.fetchall()
            cur.execute(sql, params)
            assert cur.fetchall() == want, (strategy, params)
            assert SECRET not in repr(want) and len(want) == (0 if params[1] != params[0] else 1)
    remote.close()
    _untouched(duck)
