"""Bad queries raise a clear matchrec error naming the problem, with line, column and a caret."""
from __future__ import annotations

import re

import pytest

import matchrec

SRC = "(VALUES (1, 10), (2, 8), (3, 12)) t(id, v)"


def mr(body: str, select: str = "*") -> str:
    return f"SELECT {select} FROM {SRC} MATCH_RECOGNIZE (\n  ORDER BY id\n  {body}\n) AS m"


def fails(con, sql, cls=matchrec.ProgrammingError, dialect=None):
    if dialect:
        con = matchrec.connect(dialect=dialect)
    with pytest.raises(matchrec.Error) as info:
        con.cursor().execute(sql)
    assert isinstance(info.value, cls), f"{type(info.value).__name__}: {info.value}"
    return str(info.value)


def caret_under(message: str, sql: str, text: str) -> None:
    """The message's position points at ``text`` in ``sql``."""
    m = re.search(r"Line (\d+), Col (\d+)\.", message)
    assert m, message
    line, col = int(m.group(1)), int(m.group(2))
    src_line = sql.split("\n")[line - 1]
    assert src_line[col - 1:].startswith(text), f"points at {src_line[col - 1:col + 20]!r}, wanted {text!r}\n{message}"
    lines = message.split("\n")
    assert lines[-1].strip().startswith("^"), message


CASES = [
    # (body, fragment of the message, text the caret must point at)
    ("PATTERN (A B+ C DEFINE B AS true", "Unexpected", "DEFINE"),
    ("PATTERN (A B{3,2}) DEFINE A AS true", "lower bound 3 is greater than upper bound 2", "{3,2}"),
    ("PATTERN (A{,0}) DEFINE A AS true", "upper bound must be greater than or equal to 1", "{,0}"),
    ("PATTERN (A B) DEFINE C AS true", "does not appear in PATTERN", "C AS"),
    ("PATTERN (A B) DEFINE B AS X.v > 1", "'X' is not a pattern variable", "X.v"),
    ("MEASURES Z.v AS z PATTERN (A B) DEFINE B AS true", "'Z' is not a pattern variable", "Z.v"),
    ("MEASURES nope AS z PATTERN (A) DEFINE A AS true", "Column 'nope' does not exist", "nope"),
    ("PATTERN (A B) DEFINE B AS FINAL LAST(A.v) > 1", "FINAL semantics is not allowed in DEFINE", "FINAL"),
    ("MEASURES FIRST(PREV(v)) AS x PATTERN (A) DEFINE A AS true", "cannot be nested inside a navigation", "PREV"),
    ("MEASURES PREV(sum(v)) AS x PATTERN (A) DEFINE A AS true", "aggregate cannot be nested inside a navigation",
     "sum"),
    ("MEASURES sum(LAST(v)) AS x PATTERN (A) DEFINE A AS true", "cannot be used inside an aggregate", "LAST"),
    ("MEASURES sum(A.v + B.v) AS x PATTERN (A B) DEFINE A AS true", "same pattern variable", "A.v + B.v"),
    ("MEASURES PREV(A.v + B.v) AS x PATTERN (A B) DEFINE A AS true", "same pattern variable", "A.v + B.v"),
    ("MEASURES LAST(v, -1) AS x PATTERN (A) DEFINE A AS true", "must not be negative", "1)"),
    ("MEASURES LAST(v, id) AS x PATTERN (A) DEFINE A AS true", "non-negative integer literal", "id"),
    ("AFTER MATCH SKIP TO Q PATTERN (A) DEFINE A AS true", "SKIP TO refers to 'Q'", "Q"),
    ("PATTERN (A) DEFINE A AS v + 1", "must be a boolean condition", "v + 1"),
    ("MEASURES RUNNING v AS x PATTERN (A) DEFINE A AS true", "RUNNING must be followed by", "RUNNING"),
    ("MEASURES sum(v) OVER () AS x PATTERN (A) DEFINE A AS true", "Window functions are not allowed", "sum"),
    ("MEASURES v AS x, v AS x PATTERN (A) DEFINE A AS true", "defined more than once", "x"),
    ("PATTERN (A) SUBSET A = (A) DEFINE A AS true", "already a primary pattern variable", "A ="),
    ("PATTERN (A) SUBSET U = (B) DEFINE A AS true", "'B' in SUBSET U is not a pattern variable", "B)"),
    ("PATTERN (A) DEFINE A AS v > 1 + 'x'", "Cannot evaluate this expression", "v > 1 + 'x'"),
    ("MEASURES 1 + AS x PATTERN (A) DEFINE A AS true", "Syntax error in expression", ""),
    ("PATTERN (A) WITHIN 10 DEFINE A AS true", None, None),  # valid: ORDER BY id is numeric
    ("ORDER BY nope PATTERN (A) DEFINE A AS true", "Unexpected 'ORDER'", "ORDER BY nope"),
    ("PATTERN (A) DEFINE A AS true, A AS false", "defined more than once", "A AS false"),
    ("PATTERN (A {- B -}) DEFINE A AS true", None, None),
    ("ALL ROWS PER MATCH WITH UNMATCHED ROWS PATTERN (A {- B -}) DEFINE A AS true", "exclusion", "A {- B -}"),
    ("PATTERN (A) DEFINE A AS CLASSIFIER(Q) = 'A'", "'Q' is not a pattern variable", "Q"),
]


@pytest.mark.parametrize("body,message,at", CASES)
def test_error_messages(con, body, message, at):
    sql = mr(body)
    if message is None:
        con.cursor().execute(sql).fetchall()
        return
    text = fails(con, sql)
    assert message in text, text
    assert "Traceback" not in text
    if at:
        caret_under(text, sql, at)


def test_unknown_partition_column(con):
    sql = f"SELECT * FROM {SRC} MATCH_RECOGNIZE (PARTITION BY nope PATTERN (A) DEFINE A AS true)"
    text = fails(con, sql)
    assert "PARTITION BY column 'nope' does not exist" in text
    caret_under(text, sql, "nope")


def test_conversion_error_at_run_time(con):
    text = fails(con, mr("PATTERN (A) DEFINE A AS v > 'x'"), matchrec.DataError)
    assert "Could not convert string 'x'" in text


def test_outer_syntax_error_duckdb(con):
    sql = "SELECT * FORM t"
    text = fails(con, sql)
    assert "syntax error" in text.lower()
    assert "^" in text


def test_outer_syntax_error_other_dialect(con):
    sql = "SELECT * FROM (VALUES 1) t(x) MATCH_RECOGNIZE (PATTERN (A) DEFINE A AS true) m WHERE AND"
    text = fails(con, sql, dialect="trino")
    assert "Line 1" in text


def test_error_in_outer_query_after_matching(con):
    sql = mr("MEASURES count(*) AS n PATTERN (A) DEFINE A AS true", select="m.missing")
    text = fails(con, sql)
    assert "missing" in text


def test_unterminated_string(con):
    text = fails(con, "SELECT * FROM t MATCH_RECOGNIZE (PATTERN (A) DEFINE A AS x = 'oops)")
    assert "Line 1" in text


def test_missing_table_reference(con):
    text = fails(con, "SELECT * MATCH_RECOGNIZE (PATTERN (A) DEFINE A AS true)")
    assert "must follow a table reference" in text


def test_unknown_table(con):
    text = fails(con, "SELECT * FROM nowhere MATCH_RECOGNIZE (PATTERN (A) DEFINE A AS true)", matchrec.Error)
    assert "nowhere" in text


def test_skip_runtime_errors(con):
    text = fails(con, mr("AFTER MATCH SKIP TO FIRST A PATTERN (A B) DEFINE A AS true"), matchrec.DataError)
    assert "cannot skip to first row of match" in text
    text = fails(con, mr("AFTER MATCH SKIP TO LAST B PATTERN (A B?) DEFINE A AS true, B AS false"),
                 matchrec.DataError)
    assert "not present in match" in text


def test_bad_dialect_and_parameters(con):
    with pytest.raises(matchrec.ProgrammingError):
        matchrec.connect(dialect="klingon")
    with pytest.raises(matchrec.ProgrammingError):
        con.cursor().execute(mr("PATTERN (A) DEFINE A AS v > ?"), [])
    with pytest.raises(matchrec.Error):
        con.cursor().execute(mr("PATTERN (A) DEFINE A AS v > ?"), [1, 2])


def test_limit_error_names_the_setting(con):
    cur = con.cursor()
    cur.execute("SET matchrec_max_threads = 4")
    with pytest.raises(matchrec.OperationalError) as info:
        cur.execute("""SELECT * FROM range(12) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                       PATTERN ((A | B)+ C) DEFINE C AS count(A.*) = 99)""")
    assert "matchrec_max_threads" in str(info.value)
    cur.execute("RESET matchrec_max_threads")
    cur.execute("""SELECT * FROM range(12) t(x) MATCH_RECOGNIZE (ORDER BY x MEASURES count(*) AS n
                   PATTERN ((A | B)+ C) DEFINE C AS count(A.*) = 99)""")
    assert cur.fetchall() == []


def test_partition_memory_limit_names_the_setting(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE wide AS SELECT range AS t, repeat('x', 200) AS s FROM range(20000)")
    cur.execute("SET matchrec_max_partition_mb = 1")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_partition_mb"):
        cur.execute("SELECT * FROM wide MATCH_RECOGNIZE (ORDER BY t MEASURES LAST(s) AS s2 "
                    "PATTERN (A B) DEFINE B AS s = PREV(s))")
    cur.execute("RESET matchrec_max_partition_mb")
    cur.execute("SELECT count(*) FROM wide MATCH_RECOGNIZE (ORDER BY t MEASURES LAST(s) AS s2 "
                "PATTERN (A B) DEFINE B AS s = PREV(s))")
    assert cur.fetchall() == [(10000,)]
