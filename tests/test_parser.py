"""Golden tests of the parser: MATCH_RECOGNIZE bodies and patterns to MatchSpec text."""
from __future__ import annotations

import pytest

from matchrec.parser import spec as S
from matchrec.parser.query import split
from matchrec.operators.program import compile_pattern
from matchrec.planner.pattern import lower


def spec_of(body: str, dialect: str = "duckdb") -> S.MatchSpec:
    query = split(f"SELECT * FROM t MATCH_RECOGNIZE ({body}) AS m", dialect)
    assert len(query.clauses) == 1
    return query.clauses[0].spec


PATTERNS = [
    ("A B C", "A B C"),
    ("A | B | C", "A | B | C"),
    ("(A | B) C", "(A | B) C"),
    ("A* B+ C? D{2} E{2,} F{,3} G{1,4}", "A* B+ C? D{2} E{2,} F{0,3} G{1,4}"),
    ("A*? B+? C?? D{2}? E{2,}? F{,3}? G{1,4}?", "A*? B+? C?? D{2}? E{2,}? F{0,3}? G{1,4}?"),
    ("^ A $", "^ A $"),
    ("A {- B+ -} C", "A {- B+ -} C"),
    ("PERMUTE(A, B | C, D E)", "PERMUTE(A, B | C, D E)"),
    ("()", "()"),
    ("", "()"),
    ("(A B)+ ((C))", "(A B)+ C"),
    ("((A+)+)*", "((A+)+)*"),
    ('"!" a "Mixed"', '"!" A "Mixed"'),
    ("^* $+ ()*", "^* $+ ()*"),
    ("LAST FIRST", "LAST FIRST"),
]


@pytest.mark.parametrize("text,canonical", PATTERNS)
def test_pattern_round_trip(text, canonical):
    spec = spec_of(f"PATTERN ({text})")
    assert S.pattern_to_text(spec.pattern) == canonical
    again = spec_of(f"PATTERN ({canonical})")
    assert again.pattern == spec.pattern


def test_full_body_golden():
    spec = spec_of("""
        PARTITION BY sym, "Ex" ORDER BY ts DESC NULLS FIRST, seq
        MEASURES FIRST(ts) AS s, RUNNING LAST(U.p) AS lp, FINAL count(*) AS n
        ALL ROWS PER MATCH WITH UNMATCHED ROWS
        AFTER MATCH SKIP TO LAST u
        INITIAL
        PATTERN (A B+? (C | D){1,3})  -- a comment
        WITHIN INTERVAL '30' MINUTE
        SUBSET U = (a, b), V = (C)
        DEFINE B AS B.p < PREV(B.p), /* block */ C AS C.p > A.p * 1.05""")
    assert spec.describe() == "\n".join([
        "MatchSpec",
        "  partition by: sym, Ex",
        "  order by: ts DESC NULLS FIRST, seq",
        "  measure s := FIRST(ts)",
        "  measure lp := RUNNING LAST(U.p)",
        "  measure n := FINAL count(*)",
        "  rows: ALL ROWS PER MATCH WITH UNMATCHED ROWS",
        "  after match skip: TO LAST U",
        "  pattern: A B+? (C | D){1,3}",
        "  within: INTERVAL '30' MINUTE",
        "  subset U = (A, B)",
        "  subset V = (C)",
        "  define B := B.p < PREV(B.p)",
        "  define C := C.p > A.p * 1.05",
    ])


@pytest.mark.parametrize("clause,kind,var", [
    ("AFTER MATCH SKIP PAST LAST ROW", "past_last", None),
    ("AFTER MATCH SKIP TO NEXT ROW", "next_row", None),
    ("AFTER MATCH SKIP TO FIRST b", "to_first", "B"),
    ("AFTER MATCH SKIP TO LAST B", "to_last", "B"),
    ("AFTER MATCH SKIP TO B", "to_last", "B"),
    ("", "past_last", None),
])
def test_skip_modes(clause, kind, var):
    spec = spec_of(f"{clause} PATTERN (A B)")
    assert (spec.skip.kind, spec.skip.variable) == (kind, var)


@pytest.mark.parametrize("clause,rows,empty", [
    ("", "one", "show"),
    ("ONE ROW PER MATCH", "one", "show"),
    ("ALL ROWS PER MATCH", "all", "show"),
    ("ALL ROWS PER MATCH SHOW EMPTY MATCHES", "all", "show"),
    ("ALL ROWS PER MATCH OMIT EMPTY MATCHES", "all", "omit"),
    ("ALL ROWS PER MATCH WITH UNMATCHED ROWS", "all", "unmatched"),
])
def test_rows_per_match(clause, rows, empty):
    spec = spec_of(f"{clause} PATTERN (A)")
    assert (spec.rows_per_match, spec.empty_matches) == (rows, empty)


@pytest.mark.parametrize("within,sql", [
    ("WITHIN 1000", "1000"),
    ("WITHIN INTERVAL '30' MINUTE", "INTERVAL '30' MINUTE"),
    ("WITHIN INTERVAL 2 HOURS", "INTERVAL 2 HOURS"),
    ("WITHIN '1 day'", "INTERVAL '1 day'"),
])
def test_within(within, sql):
    assert spec_of(f"ORDER BY ts PATTERN (A B) {within}").within.sql == sql


@pytest.mark.parametrize("dialect", ["duckdb", "trino", "snowflake", "oracle"])
def test_dialects_parse_the_same_spec(dialect):
    body = "PARTITION BY k ORDER BY ts MEASURES LAST(B.x) AS lx PATTERN (A B*) DEFINE B AS B.x > PREV(B.x)"
    spec = spec_of(body, dialect)
    assert spec.describe() == spec_of(body).describe()


def test_spans_point_into_the_query():
    sql = "SELECT *\nFROM t MATCH_RECOGNIZE (\n  PATTERN (A B)\n  DEFINE B AS B.x > 1\n) AS m"
    spec = split(sql).clauses[0].spec
    d = spec.definitions[0]
    assert sql[d.expression.span.start:d.expression.span.end] == "B.x > 1"
    assert sql[d.variable_span.start:d.variable_span.end] == "B"
    assert sql[spec.span.start:spec.span.end].startswith("MATCH_RECOGNIZE")


def test_split_keeps_outer_sql_and_alias():
    q = split("WITH x AS (SELECT 1) SELECT m.a FROM x MATCH_RECOGNIZE (PATTERN (A)) AS m JOIN y ON TRUE")
    c = q.clauses[0]
    assert c.input_text == "x" and c.alias == "m"
    assert q.text == f"WITH x AS (SELECT 1) SELECT m.a FROM {c.placeholder} AS m JOIN y ON TRUE"


def test_split_nested_innermost_first():
    q = split("SELECT * FROM (SELECT * FROM t MATCH_RECOGNIZE (PATTERN (A)) i) MATCH_RECOGNIZE (PATTERN (B)) o")
    inner, outer = q.clauses
    assert inner.spec.pattern == S.Label(span=S.Span(0, 0), name="A")
    assert inner.placeholder in outer.input_text


def test_program_dump_golden():
    spec = spec_of("PATTERN (A B*? {- C -} $)")
    labels = S.pattern_labels(spec.pattern)
    program = compile_pattern(lower(spec.pattern, {n: i for i, n in enumerate(labels)}), labels)
    assert program.dump() == "\n".join([
        "   0: MATCH 0  (A)",
        "   1: SPLIT 4, 2",
        "   2: MATCH 1  (B)",
        "   3: SPLIT 4, 2",
        "   4: SAVE",
        "   5: MATCH 2  (C)",
        "   6: SAVE",
        "   7: END",
        "   8: DONE",
    ])
