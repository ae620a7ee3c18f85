"""The engine session used directly, without the DB-API: MATCH_RECOGNIZE, CER, SET, EXPLAIN and
one parsed clause over an Arrow table, each compared with what a cursor returns for the same
statement; and the classification every entry point relies on."""
from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import matchrec
from matchrec.engine.session import Session
from matchrec.parser.body import parse_body
from matchrec.parser.classify import classify
from matchrec.parser.spec import Span

MR = """SELECT * FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts
        MEASURES FIRST(A.ts) AS s, LAST(B.ts) AS e ONE ROW PER MATCH
        PATTERN (A B+) DEFINE A AS v > 0, B AS v > PREV(v)) ORDER BY k, s"""
CER = "PATTERN SEQ(A a, B b) FROM cer WHERE b.v > a.v WITHIN 5 RETURN COUNT(*)"


@pytest.fixture
def duck():
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT i % 3 AS k, i AS ts, (i * 7) % 5 AS v FROM range(200) r(i)")
    con.execute("CREATE TABLE cer AS SELECT i AS ts, CASE WHEN i % 3 = 0 THEN 'A' ELSE 'B' END AS type, "
                "(i * 13) % 11 AS v FROM range(300) r(i)")
    yield con
    con.close()


def cursor_rows(duck, sql):
    con = matchrec.connect(duck)
    try:
        return con.cursor().execute(sql).fetchall()
    finally:
        con.close()


def test_match_recognize_without_the_dbapi(duck):
    session = Session(duck)
    table = session.table(MR)
    assert table.column_names == ["k", "s", "e"]
    assert [tuple(r.values()) for r in table.to_pylist()] == cursor_rows(duck, MR)
    assert table.num_rows > 10
    result = session.execute(MR)
    assert result.pending and result.stats and result.stats[0][1].matches == table.num_rows
    session.release(result)


def test_cer_statement_without_the_dbapi(duck):
    session = Session(duck)
    result = session.execute(CER)
    assert result.cer_run is not None and result.description[0][0] == "count"
    count = session.fetch_table(result).column(0).to_pylist()
    session.release(result)
    assert count == [r[0] for r in cursor_rows(duck, CER)] and count[0] > 0
    explained = session.execute("EXPLAIN " + CER)
    assert explained.rows and explained.rows[0][0] == "matchrec" and not explained.pending


def test_set_changes_what_the_session_runs(duck):
    session = Session(duck)
    assert session.table("SET matchrec_fast_path = 0").num_rows == 0
    assert session.settings.fast_path == 0
    result = session.execute(MR)
    assert result.stats[0][0].explain().count("matcher: reference (SET matchrec_fast_path = 0)") == 1
    session.release(result)
    session.execute("RESET matchrec_fast_path")
    assert session.settings.fast_path == 1
    session.execute("SET matchrec_cer_type_column = 'kind'")
    assert session.cer_settings.type_column == "kind"
    with pytest.raises(matchrec.ProgrammingError, match="needs an integer >= 1"):
        session.execute("SET matchrec_threads = 0")
    with pytest.raises(matchrec.ProgrammingError, match="Unknown setting matchrec_nope"):
        session.set("matchrec_nope", 1)
    session.set("matchrec_threads", 3)
    assert session.settings.threads == 3


def test_errors_leave_the_session_as_matchrec_errors(duck):
    session = Session(duck)
    with pytest.raises(matchrec.ProgrammingError) as err:
        session.execute(MR.replace("v > 0", "nope > 0"))
    assert err.value.position == MR.index("v > 0")
    with pytest.raises(matchrec.ProgrammingError):
        session.execute("SELECT * FROM missing_table")
    assert session.table("SELECT 1 AS x").to_pylist() == [{"x": 1}]  # still usable


def test_open_from_a_path_and_a_connection(tmp_path, duck):
    path = str(tmp_path / "db.duckdb")
    session = Session.open(path)
    session.execute("CREATE TABLE t AS SELECT 1 AS a")
    session.close()
    assert session.closed
    again = Session.open(path, dialect="trino")
    assert again.table("SELECT a FROM t").to_pylist() == [{"a": 1}]
    again.close()
    shared = Session.open(duck)
    shared.close()
    assert duck.execute("SELECT count(*) FROM ev").fetchone() == (200,)  # not closed: not the session's
    with pytest.raises(matchrec.ProgrammingError, match="Unknown SQL dialect"):
        Session.open(":memory:", dialect="nope")


def test_one_parsed_clause_over_an_arrow_table(duck):
    body = "PARTITION BY k ORDER BY ts MEASURES FIRST(A.ts) AS s, LAST(B.ts) AS e PATTERN (A B+) " \
           "DEFINE A AS v > 0, B AS v > PREV(v)"
    spec = parse_body(body, 0, body, "duckdb", Span(0, len(body)))
    table = duck.sql("SELECT * FROM ev").to_arrow_table()
    session = Session.open()
    ran = session.match(spec, table)
    want = cursor_rows(duck, f"SELECT * FROM ev MATCH_RECOGNIZE ({body})")
    assert sorted(tuple(r.values()) for r in ran.table.to_pylist()) == sorted(want)
    assert ran.explain.startswith("MATCH_RECOGNIZE #1") and ran.stats.matches == len(want)
    assert not any(name.startswith("__matchrec") for name in session.sources)  # the input is dropped again
    bad = body.replace("v > 0", "w > 0")
    with pytest.raises(matchrec.ProgrammingError) as err:
        session.match(parse_body(bad, 0, bad, "duckdb", Span(0, len(bad))), table)
    assert err.value.position == bad.index("w > 0")
    session.close()


def test_classified_once_into_one_object():
    s = classify("SET matchrec_threads TO 4", "duckdb")
    assert (s.kind, s.setting, s.value) == ("set", "matchrec_threads", "4")
    assert classify("RESET pull_strategy", "duckdb").kind == "reset"
    assert classify("SELECT 1; SELECT 2", "duckdb").kind == "sql"  # DuckDB runs plain scripts itself
    assert classify(CER, "duckdb").kind == "cer"
    assert classify(MR, "duckdb").kind == "match" and classify(MR, "duckdb").tokens
    e = classify("EXPLAIN ANALYZE " + MR, "duckdb")
    assert (e.kind, e.explain, e.explain_end) == ("explain", "analyze", len("EXPLAIN ANALYZE "))
    script = classify("CREATE TABLE x AS SELECT 1; " + MR + ";", "duckdb", [])
    assert script.kind == "script" and [p.kind for p in script.parts] == ["sql", "match"]
    assert script.parts[0].tokens is None  # only the first statement's tokens start at offset 0
    with pytest.raises(matchrec.ProgrammingError, match="sequence or a mapping"):
        classify("SELECT 1", "duckdb", 5)


def test_a_pattern_statement_reads_its_text_once(duck, monkeypatch):
    """The statement's own text is tokenised once, the text with the clause cut out once (it used to
    be five times: splitting the script, cutting, looking for WITH, and replacing placeholders)."""
    import sqlglot.tokens as T
    seen = []
    real = T.Tokenizer.tokenize

    def counting(self, sql, *args, **kwargs):
        seen.append(sql)
        return real(self, sql, *args, **kwargs)

    session = Session(duck)
    session.table(MR)  # warm caches
    monkeypatch.setattr(T.Tokenizer, "tokenize", counting)
    session.table(MR)
    assert seen.count(MR) == 1
    assert len([s for s in seen if s.startswith("SELECT * FROM __matchrec_")]) == 1
