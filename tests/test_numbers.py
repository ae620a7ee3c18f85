"""Exact numbers and clean errors: big literals keep DuckDB's typing (HUGEINT, UHUGEINT, BIGNUM,
DECIMAL, DOUBLE) wherever matchrec evaluates them, integer arithmetic of CER conditions never
wraps around, windows and partition keys of every size and type, and error messages that name
nothing the user did not write.

DuckDB alone is the oracle: each value is compared with what DuckDB computes for the same
expression over the same rows.
"""
from __future__ import annotations

import pytest

import matchrec

BIG_LITERALS = ["99999999999999999999", "170141183460469231731687303715884105727",
                "-170141183460469231731687303715884105728", "170141183460469231731687303715884105728",
                "340282366920938463463374607431768211455", "10000000000000000000000000000000000000000",
                "123456789012345678901234567890.5", "1.00000000000000000000000000000000000000001", "1e308",
                "1e400", "9223372036854775808"]


@pytest.fixture
def con():
    c = matchrec.connect()
    c.cursor().execute("CREATE TABLE t AS SELECT range AS ts, CAST(range % 5 AS INTEGER) AS v, "
                       "['A', 'B', 'C'][range % 3 + 1] AS type FROM range(12)")
    yield c
    c.close()


def rows(con, sql, params=None):
    return con.cursor().execute(sql, params).fetchall()


def duck(con, sql):
    return con.duckdb_connection.execute(sql).fetchall()


@pytest.mark.parametrize("literal", BIG_LITERALS)
@pytest.mark.parametrize("output", ["ONE ROW PER MATCH", "ALL ROWS PER MATCH"])
def test_big_literal_measures_are_duckdbs_values(con, literal, output):
    got = rows(con, f"SELECT x, typeof(x) FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES {literal} AS x {output} "
                    "PATTERN (A B) DEFINE B AS B.v > A.v)")
    assert got and set(got) == set(duck(con, f"SELECT {literal}, typeof({literal})"))


@pytest.mark.parametrize("measure", [
    "LAST(B.v) * 99999999999999999999", "A.v + 10000000000000000000000000000000000000000",
    "CASE WHEN A.v > 1 THEN 170141183460469231731687303715884105727 END",
    "A.v - 340282366920938463463374607431768211455 + 340282366920938463463374607431768211455",
    "sum(v) * 99999999999999999999", "A.v + 123456789012345678901234567890.5"])
def test_big_arithmetic_in_measures(con, measure):
    """The vectorised and row-by-row measure paths both give DuckDB's exact value."""
    mr = rows(con, f"SELECT s, x FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.ts AS s, {measure} AS x "
                   "AFTER MATCH SKIP TO NEXT ROW PATTERN (A B) DEFINE B AS B.v > A.v) ORDER BY s")
    pairs = duck(con, "SELECT a.ts, b.ts FROM t a JOIN t b ON b.ts = a.ts + 1 WHERE b.v > a.v ORDER BY a.ts")
    assert len(mr) == len(pairs) > 0
    # the same expression, computed by DuckDB over the two rows of each match
    sql_measure = measure.replace("LAST(B.v)", "b.v").replace("A.v", "a.v").replace("sum(v)", "(a.v + b.v)")
    expected = duck(con, f"SELECT a.ts, {sql_measure} FROM t a JOIN t b ON b.ts = a.ts + 1 WHERE b.v > a.v "
                         "ORDER BY a.ts")
    assert mr == expected


def test_bignum_columns_order_partition_and_output(con):
    con.cursor().execute("CREATE TABLE g AS SELECT range AS ts, CAST(CAST(range AS VARCHAR) || repeat('0', 40) "
                         "AS BIGNUM) AS big, CAST(range % 2 AS BIGNUM) AS part FROM range(1, 12)")
    got = rows(con, "SELECT part, x, lb, typeof(x) FROM g MATCH_RECOGNIZE (PARTITION BY part ORDER BY big DESC "
                    "MEASURES A.big AS x, LAST(B.big) AS lb PATTERN (A B) DEFINE B AS B.big < A.big) ORDER BY x")
    expected = duck(con, "WITH r AS (SELECT part, big, row_number() OVER (PARTITION BY part ORDER BY big DESC) AS n "
                         "FROM g) SELECT a.part, a.big, b.big, typeof(a.big) FROM r a JOIN r b ON a.part = b.part "
                         "AND b.n = a.n + 1 WHERE a.n % 2 = 1 ORDER BY a.big")
    assert got == expected and len(got) == 5


def test_hugeint_define_constants_compare_exactly(con):
    got = rows(con, "SELECT s FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.ts AS s AFTER MATCH SKIP TO NEXT ROW "
                    "PATTERN (A B) "
                    "DEFINE B AS B.v * 99999999999999999999 > A.v * 99999999999999999999 + 1)")
    expected = duck(con, "SELECT a.ts FROM t a JOIN t b ON b.ts = a.ts + 1 "
                         "WHERE b.v * 99999999999999999999 > a.v * 99999999999999999999 + 1 ORDER BY a.ts")
    assert sorted(got) == expected


def test_measure_beyond_its_type_is_a_data_error(con):
    with pytest.raises(matchrec.DataError, match="out of the range|does not fit") as err:
        rows(con, "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES LAST(A.v) * 4611686018427387904 AS x "
                  "PATTERN (A B) DEFINE B AS B.v > A.v)")
    assert "Python" not in str(err.value) and "C long" not in str(err.value)


# ---------------------------------------------------------------- CER: no silent wrap-around
EXACT_PAIRS = ("SELECT count(*) FROM t a JOIN t b ON b.ts > a.ts WHERE a.type = 'A' AND b.type = 'B' "
               "AND {cond}")


@pytest.mark.parametrize("mechanism", ["auto", "batch", "eager", "chain", "tree"])
@pytest.mark.parametrize("cond,sql_cond", [
    ("b.ts * 4611686018427387904 > a.ts", "CAST(b.ts AS HUGEINT) * 4611686018427387904 > a.ts"),
    ("a.ts * 9223372036854775807 < b.ts - a.ts", "CAST(a.ts AS HUGEINT) * 9223372036854775807 < b.ts - a.ts"),
    ("b.v * 1000000000 * 1000000000 * 100 > a.v", "CAST(b.v AS HUGEINT) * 1000000000 * 1000000000 * 100 > a.v"),
    ("-(a.ts - 9223372036854775807 - 1) > b.ts", "-(CAST(a.ts AS HUGEINT) - 9223372036854775807 - 1) > b.ts"),
    ("b.ts * 99999999999999999999 > a.ts * 2", "b.ts * 99999999999999999999 > a.ts * 2"),
])
def test_cer_integer_arithmetic_is_exact(con, mechanism, cond, sql_cond):
    if mechanism != "auto":
        con.cursor().execute(f"SET matchrec_cer_mechanism = {mechanism}")
    got = rows(con, f"PATTERN SEQ(A a, B b) FROM t WHERE {cond} RETURN COUNT(*)")
    assert got == duck(con, EXACT_PAIRS.format(cond=sql_cond))


def test_cer_sum_of_large_values_is_exact(con):
    con.cursor().execute("CREATE TABLE w AS SELECT range AS ts, CASE WHEN range % 3 = 0 THEN 'A' ELSE 'B' END "
                         "AS type, 4611686018427387904 + range AS x FROM range(9)")
    got = rows(con, "PATTERN SEQ(A a, B+ b) FROM w WHERE sum(b.x) > a.x * 2 WITHIN 3 RETURN COUNT(*)")
    # b takes one or both of the two B events after each A (within 3): sums of 1 or 2 values
    expected = 0
    for a in (0, 3, 6):
        xs = [4611686018427387904 + a + 1, 4611686018427387904 + a + 2]
        ax = 4611686018427387904 + a
        expected += sum(1 for subset in ([xs[0]], [xs[1]], xs) if sum(subset) > ax * 2)
    assert got == [(expected,)] and expected == 3


def test_cer_narrow_integer_columns_do_not_wrap(con):
    """An INTEGER column times an INTEGER literal passes 2**31 exactly (numpy would keep int32)."""
    got = rows(con, "PATTERN SEQ(A a, B b) FROM t WHERE b.v * 1000000000 > a.v * 1000000000 + 2000000000 "
                    "RETURN COUNT(*)")
    assert got == duck(con, EXACT_PAIRS.format(
        cond="CAST(b.v AS BIGINT) * 1000000000 > CAST(a.v AS BIGINT) * 1000000000 + 2000000000"))


# ---------------------------------------------------------------- windows
def test_cer_window_beyond_every_key_distance_is_no_window(con):
    unbounded = rows(con, "PATTERN SEQ(A a, B b) FROM t RETURN COUNT(*)")
    for within in ("1e308", "18446744073709551616", "99999999999999999999999"):
        assert rows(con, f"PATTERN SEQ(A a, B b) FROM t WITHIN {within} RETURN COUNT(*)") == unbounded
    con.cursor().execute("CREATE TABLE tt AS SELECT TIMESTAMP '2024-01-01' + INTERVAL (ts) MINUTE AS ts, type "
                         "FROM t")
    assert rows(con, "PATTERN SEQ(A a, B b) FROM tt WITHIN 1e308 seconds RETURN COUNT(*)") == unbounded
    assert rows(con, "PATTERN SEQ(A a, B b) FROM tt WITHIN 1.5 minutes RETURN COUNT(*)") == \
        rows(con, "PATTERN SEQ(A a, B b) FROM t WITHIN 1 RETURN COUNT(*)")


@pytest.mark.parametrize("within,cls", [("1e400", matchrec.ProgrammingError),
                                        ("INTERVAL 'nan minutes'", matchrec.ProgrammingError),
                                        ("4611686018427387904", matchrec.NotSupportedError)])
def test_cer_window_not_finite_or_unsupported(con, within, cls):
    key = "ORDER BY at " if "minutes" in within else ""
    if key:
        con.cursor().execute("CREATE TABLE tt AS SELECT TIMESTAMP '2024-01-01' + INTERVAL (ts) MINUTE AS at, type "
                             "FROM t")
    source = "tt" if key else "t"
    with pytest.raises(cls, match="Line 1, Col"):
        rows(con, f"PATTERN SEQ(A a, B b) FROM {source} {key}WITHIN {within} RETURN COUNT(*)")


def test_cer_window_integer_is_exact(con):
    """An integer window is not read through a float (2**53 + 1 stays odd)."""
    from matchrec.parser import sase
    assert sase.parse("PATTERN SEQ(A a, B b) FROM t WITHIN 9007199254740993").within.amount == 9007199254740993


# ---------------------------------------------------------------- partition keys of nested types
@pytest.mark.parametrize("key", ["[k, 1]", "{'a': k}", "MAP {'a': k}"])
def test_partition_by_nested_columns(con, key):
    con.cursor().execute(f"CREATE TABLE p AS SELECT ts, v, v % 2 AS k, {key} AS nested FROM t")
    body = ("ORDER BY ts MEASURES A.ts AS s, LAST(B.ts) AS e ALL ROWS PER MATCH PATTERN (A B+) "
            "DEFINE B AS B.v > PREV(B.v))")
    nested = rows(con, f"SELECT s, e, ts FROM p MATCH_RECOGNIZE (PARTITION BY nested {body} ORDER BY ts")
    plain = rows(con, f"SELECT s, e, ts FROM p MATCH_RECOGNIZE (PARTITION BY k {body} ORDER BY ts")
    assert nested == plain and len(plain) > 0


# ---------------------------------------------------------------- errors
def test_sqlglot_errors_become_positioned_programming_errors(con):
    with pytest.raises(matchrec.ProgrammingError, match="Line 1, Col 55") as err:
        rows(con, "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES DATE() AS x PATTERN (A B) "
                  "DEFINE B AS true)")
    assert "ParseError" not in str(err.value) and "sqlglot" not in str(err.value)


@pytest.mark.parametrize("sql,col", [
    ("SELECT '\ud800'", 9),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES '\udfff' AS x PATTERN (A B) DEFINE B AS true)", 56),
    ("PATTERN SEQ(A a, B b) FROM t WHERE a.type = '\ud800' RETURN COUNT(*)", 46),
])
def test_lone_surrogates_in_the_statement(con, sql, col):
    with pytest.raises(matchrec.ProgrammingError, match=f"surrogate U\\+D[89A-F]..,.*Line 1, Col {col}") as err:
        rows(con, sql)
    str(err.value).encode("utf-8")  # the message itself can be printed


def test_lone_surrogate_in_a_parameter(con):
    with pytest.raises(matchrec.DataError, match="Parameter 1 holds a lone surrogate"):
        rows(con, "SELECT ?", ["a\ud800"])
    with pytest.raises(matchrec.ProgrammingError):
        matchrec.run_many(con, ["PATTERN SEQ(A a, B b) FROM t WHERE a.type = '\ud800'"])


FORBIDDEN = ("sqlglot", "ParseError", "TokenError", "ufunc", "__matchrec_", "__mr_", "Traceback", "<class")

BAD_QUERIES = [
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v - AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A. AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES count( **) AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS <= B.v)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS AS NEXT(v))",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES nosuch(A.v) AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v + 'x' AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES LAST(B.type) + 1 AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS B.v > A.type)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS B.v / 0 > 'q')",
    "EXPLAIN SELECT nosuch FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS true)",
    "EXPLAIN * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT x + 'a' FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS B.v > PREV(B.nope))",
    "PATTERN SEQ(A a, B b) FROM t WHERE a.type * b.v > 1 RETURN COUNT(*)",
    "PATTERN SEQ(A a, B b) FROM t WHERE a.type - b.type > 1 RETURN COUNT(*)",
    "PATTERN SEQ(A a, B b) FROM t WHERE a.v > 'x' || b.v RETURN a.type * 2",
    "PATTERN SEQ(A a, B b) FROM t WHERE a.v > 1 RETURN a.type - b.v",
    "PATTERN SEQ(A a, B b) FROM t WHERE nosuch(a.v, b.v) RETURN COUNT(*)",
    "SELECT * FROM nosuch MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS true)",
    "SELECT CAST('x' AS INTEGER) FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A) DEFINE A AS true)",
]


@pytest.mark.parametrize("sql", BAD_QUERIES)
def test_error_messages_name_only_what_the_user_wrote(con, sql):
    with pytest.raises(matchrec.Error) as err:
        cur = con.cursor().execute(sql)
        cur.fetchall()
    message = str(err.value)
    assert not any(word in message for word in FORBIDDEN), message
    assert not isinstance(err.value, matchrec.InternalError), message


def test_clean_message_rewrites_library_words():
    from matchrec.errors import clean_message
    assert clean_message("Syntax error in expression: Required keyword: 'expression' missing for "
                         "<class 'sqlglot.expressions.core.Sub'>. Line 1") == \
        "Syntax error in expression: '-' is missing an operand. Line 1"
    assert clean_message('Referenced column "__mr_a0" not found') == \
        "Referenced column (a value matchrec computes) not found"
    assert "ufunc" not in clean_message("ufunc 'add' did not contain a loop with signature matching types")
    assert clean_message("sqlglot.errors.ParseError: Invalid expression") == "Invalid expression"


@pytest.mark.parametrize("value", ["99999999999999999999", "9223372036854775808", "-1"])
def test_integer_settings_stay_within_64_bits(con, value):
    query = "SELECT count(*) FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B) DEFINE B AS B.v > A.v)"
    before = rows(con, query)
    with pytest.raises(matchrec.ProgrammingError, match="needs an integer >= 1 \\(and at most"):
        con.cursor().execute(f"SET matchrec_max_matches_per_partition = {value}")
    assert rows(con, query) == before  # the compiled matcher still runs with the setting as it was


def test_decimal_literals_keep_duckdbs_decimal_arithmetic(con):
    """``v * 0.1 = 0.3`` is exact in DuckDB (DECIMAL); Arrow's doubles would make it false for v = 3."""
    import pyarrow as pa

    from matchrec.engine.arrow_eval import compile_condition
    assert compile_condition("(v * 0.1) = 0.3", {"v": pa.int64()}) is None
    assert compile_condition("(p * 0.1) > 0.3", {"p": pa.float64()}) is not None
    # one condition reading PREV: evaluated over chunks, where Arrow would take it
    got = rows(con, "SELECT s FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES B.ts AS s AFTER MATCH SKIP TO NEXT ROW "
                    "PATTERN (A B) DEFINE B AS (B.ts * 0.1 = 0.3 OR PREV(B.ts) = 99)) ORDER BY s")
    assert got == duck(con, "SELECT ts FROM t WHERE ts * 0.1 = 0.3 AND ts > 0 ORDER BY ts") == [(3,)]
