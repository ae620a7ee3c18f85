"""Token mutations of valid statements: every failure is a matchrec.Error, and nothing hangs.

A corpus of valid statements (MATCH_RECOGNIZE in several shapes, CER statements, SET and
EXPLAIN) is cut into SQL tokens; each case deletes, duplicates, swaps or replaces a few of them
(with keywords, numbers from tiny to far beyond HUGEINT, strings with unicode and lone
surrogates, operators), or replaces only its literals so that it stays well-formed. An
InternalError (an engine exception wrapped on its way out) or a message naming generated SQL or
a library's internals counts as a failure too. The cases are drawn from a seeded generator, so a failure names a case
that runs again the same way. The data is small, so a mutated pattern cannot run long.

``pytest -s`` prints how many cases ended in each outcome.
"""
from __future__ import annotations

import collections
import random
import re
import warnings

import pytest

import matchrec
from test_fuzz import time_limit  # one statement's time guard, shared by both fuzzers

SETUP = [
    "CREATE TABLE t AS SELECT range AS ts, ['A', 'B', 'C', 'A', 'B'][range % 5 + 1] AS type, "
    "CAST(range % 7 AS INTEGER) AS v, range * 1.5 AS price, CAST(range * 2.25 AS DECIMAL(10, 2)) AS d, "
    "range % 2 AS k, 'p' || (range % 3) AS part, [range, range + 1] AS l, {'a': range} AS st, "
    "TIMESTAMP '2024-01-01' + INTERVAL (range) MINUTE AS at FROM range(16)",
]

CORPUS = [
    # MATCH_RECOGNIZE over the table
    """SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES FIRST(ts) AS s, LAST(B.v) AS lb,
       count(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW PATTERN (A B+ C?) SUBSET U = (A, B)
       DEFINE B AS B.v < PREV(B.v), C AS C.v > A.v) AS m""",
    """SELECT m.ts, m.cls FROM t MATCH_RECOGNIZE (ORDER BY ts DESC MEASURES CLASSIFIER() AS cls,
       MATCH_NUMBER() AS mn ALL ROWS PER MATCH WITH UNMATCHED ROWS AFTER MATCH SKIP TO NEXT ROW
       PATTERN (^ (A | B){1,3}? $) DEFINE A AS v > 2) AS m WHERE m.ts > 1""",
    """SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES RUNNING sum(v) AS s, FINAL max(price) AS mx,
       avg(d) AS ad ALL ROWS PER MATCH OMIT EMPTY MATCHES PATTERN (A {- B* -} PERMUTE(C, D)) WITHIN 10
       DEFINE A AS true, B AS v % 2 = 0, C AS C.v > PREV(C.v, 2), D AS NEXT(v) IS NULL)""",
    """SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY part ORDER BY at MEASURES A.price * 2 AS p2,
       LAST(B.price) - FIRST(A.price) AS gain, 99999999999999999999 AS big PATTERN (A B+)
       WITHIN INTERVAL '5' MINUTE DEFINE B AS B.price > PREV(B.price) AND B.ts - A.ts < 4)""",
    """SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES string_agg(type, ',') AS types,
       lower(CLASSIFIER()) AS c, CAST(A.d AS VARCHAR) AS txt PATTERN (A B* C) SUBSET U = (B, C)
       DEFINE B AS B.type = 'B', C AS count(U.*) >= 2 AND C.d > 1.5)""",
    """WITH w AS (SELECT * FROM t WHERE v > 0) SELECT k, count(*) FROM w MATCH_RECOGNIZE (PARTITION BY k
       ORDER BY ts MEASURES A.v AS av AFTER MATCH SKIP TO LAST B PATTERN (A B{2,}) DEFINE B AS B.v >= A.v)
       GROUP BY k ORDER BY k""",
    """SELECT m.id AS row_id, m.match, m.val, m.label FROM (VALUES (1, 90), (2, 80), (3, 70), (4, 70)) t(id, value)
       MATCH_RECOGNIZE (ORDER BY id MEASURES match_number() AS match, RUNNING LAST(value) AS val,
       classifier() AS label ALL ROWS PER MATCH AFTER MATCH SKIP PAST LAST ROW PATTERN (A B C)
       DEFINE B AS B.value < PREV (B.value), C AS C.value = PREV (C.value)) AS m""",
    """SELECT m.id, m.match, m.val, m.label FROM (VALUES (1, 90), (2, 80), (3, 70), (4, 80), (5, 70), (6, 80))
       t(id, value) MATCH_RECOGNIZE (ORDER BY id MEASURES match_number() AS match, RUNNING LAST(value) AS val,
       classifier() AS label ALL ROWS PER MATCH AFTER MATCH SKIP TO FIRST C PATTERN (A B+ C+ D?)
       SUBSET U = (C, D) DEFINE B AS B.value < PREV (B.value), C AS C.value > PREV (C.value), D AS false) AS m""",
    """SELECT m.id, m.classy, m.running_avg_B FROM (VALUES (1, 4), (2, 6), (3, 0)) t(id, value)
       MATCH_RECOGNIZE (ORDER BY id MEASURES RUNNING avg(B.value) AS running_avg_B, CLASSIFIER() AS classy
       ALL ROWS PER MATCH AFTER MATCH SKIP PAST LAST ROW PATTERN ((A | B)*) DEFINE A AS avg(B.value) = 5) AS m""",
    """SELECT m.val FROM (VALUES (1, 100), (2, 200), (3, 300), (4, 400)) t(id, value) MATCH_RECOGNIZE (
       ORDER BY id MEASURES (SELECT 'x') AS val ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW PATTERN (A+)
       DEFINE A AS (SELECT true)) AS m""",
    """SELECT m.id, m.measure_1, m.measure_2 FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')) t(id, value)
       MATCH_RECOGNIZE (ORDER BY id MEASURES count(C.*) AS measure_1, count(U.*) AS measure_2 ALL ROWS PER MATCH
       AFTER MATCH SKIP PAST LAST ROW PATTERN (A B C D) SUBSET U = (B, D) DEFINE A AS true) AS m""",
    # CER statements
    """PATTERN SEQ(A a, B b, C c) FROM t WHERE a.v < b.v AND c.price > a.price * 1.5 WITHIN 6
       RETURN a.ts, c.ts - a.ts AS span""",
    """PATTERN SEQ(A a, B+ b, ~C n, A c) FROM t PARTITION BY k USE skip-till-next-match
       WHERE avg(b.price) > a.price AND c.v >= 1 WITHIN 8 RETURN COUNT(*)""",
    """PATTERN AND(A a, OR(B b, C c)) FROM t TYPE type ORDER BY ts USE strict-contiguity WITHIN 4 RETURN *""",
    """EXPLAIN PATTERN SEQ(A a, B b) FROM t WHERE b.ts * 2 > a.ts AND a.v BETWEEN 1 AND 5 WITHIN 3 RETURN COUNT(*)""",
    """PATTERN SEQ(A a, B+{2,3} b) FROM t ORDER BY at WHERE a.type IN ('A', 'B') AND count(b) >= 2
       WITHIN 10 minutes RETURN a.at, last(b.price)""",
    """SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES A.ts AS s, B.ts AS e
       PATTERN (A B) WITHIN 5 STRATEGY skip-till-any-match DEFINE A AS v > 2, B AS B.v < A.v)""",
    # settings and EXPLAIN
    "SET matchrec_max_matches_per_partition = 1000",
    "SET matchrec_cer_mechanism = batch",
    "RESET matchrec_cer_mechanism",
    "SET matchrec_fast_path = 0",
    "RESET matchrec_fast_path",
    """EXPLAIN SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B*) DEFINE B AS v > A.v)""",
    """EXPLAIN ANALYZE SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A B)
       DEFINE B AS B.price > A.price)""",
    "SELECT ts, v * 3 AS w, type || '!' AS t2 FROM t WHERE v BETWEEN 1 AND 4 ORDER BY ts",
]

KEYWORDS = ["SELECT", "FROM", "WHERE", "MATCH_RECOGNIZE", "PATTERN", "DEFINE", "MEASURES", "PARTITION BY",
            "ORDER BY", "AS", "SEQ", "AND", "OR", "NOT", "WITHIN", "RETURN", "USE", "TYPE", "EXPLAIN", "ANALYZE",
            "SET", "RESET", "PREV", "NEXT", "FIRST", "LAST", "RUNNING", "FINAL", "COUNT", "CLASSIFIER",
            "MATCH_NUMBER", "SUBSET", "PERMUTE", "AFTER MATCH SKIP", "TO", "PAST LAST ROW", "ONE ROW PER MATCH",
            "ALL ROWS PER MATCH", "NULL", "TRUE", "CAST", "INTERVAL", "minutes", "seconds",
            "skip-till-any-match", "strict-contiguity", "STRATEGY", "DATE", "DATE()", "LIST", "STRUCT", "l",
            "st", "at", "d", "price", "type", "ts", "v", "k", "a", "b", "A", "B", "C", "matchrec_threads",
            "matchrec_cer_key_column", "count(*)", "sum", "avg"]
NUMBERS = ["0", "1", "-1", "2.5", "0.000001", "1e308", "1e400", "-1e400", "99999999999999999999",
           "10000000000000000000000000000000000000000", "4611686018427387904", "9223372036854775807",
           "-9223372036854775808", "9223372036854775808", "170141183460469231731687303715884105728",
           "123456789012345678901234567890.5", "1.00000000000000000000000000000000000000001", "2147483648"]
STRINGS = ["'x'", "''", "'\ud800'", "'\udfff x'", "'ü'", "'😀'", "'it''s'", "'\x00'", "'%'", "'1e400'"]
OPERATORS = ["+", "-", "*", "/", "%", "||", "=", "<>", "<", "<=", ">", ">=", "(", ")", ",", ".", ";", "{", "}",
             "{-", "-}", "|", "^", "$", "?", "::", "[", "]", "~", "'", '"', "--", "/*"]
UNICODE = ["ä", "𝔘", "\ud800", "\u00a0", "\u200b", "名前", "\x00"]
POOL = KEYWORDS + NUMBERS + STRINGS + OPERATORS + UNICODE

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[\w$]+|"
                    r"<=|>=|<>|!=|\|\||::|\{-|-\}|\S")


def tokens(sql: str) -> list[list[str]]:
    """``[space before, token]`` pairs: joined again they give back ``sql`` (trailing space aside)."""
    out, at = [], 0
    for m in _TOKEN.finditer(sql):
        out.append([sql[at:m.start()], m.group()])
        at = m.end()
    return out


def is_literal(tok: str) -> bool:
    return tok[:1] == "'" or tok[:1].isdigit()


def mutate(sql: str, rng: random.Random) -> str:
    toks = tokens(sql)
    literals = [t for t in toks if is_literal(t[1])]
    if literals and rng.random() < 0.35:
        # keep the statement well-formed, change its values: numbers and strings of every size
        for tok in rng.sample(literals, min(len(literals), rng.randint(1, 2))):
            tok[1] = rng.choice(NUMBERS + STRINGS)
        return "".join(space + tok for space, tok in toks)
    for _ in range(rng.randint(1, 3)):
        if not toks:
            break
        i = rng.randrange(len(toks))
        kind = rng.choice(["delete", "duplicate", "swap", "replace", "replace", "insert"])
        if kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, [" ", toks[i][1]])
        elif kind == "swap":
            j = rng.randrange(len(toks))
            toks[i][1], toks[j][1] = toks[j][1], toks[i][1]
        elif kind == "replace":
            toks[i][1] = rng.choice(POOL)
        else:
            toks.insert(i, [" ", rng.choice(POOL)])
    return "".join(space + tok for space, tok in toks)




def fresh_connection():
    con = matchrec.connect()
    for sql in SETUP:
        con.cursor().execute(sql)
    return con


# words that would mean an error leaked matchrec's or a library's internals
FORBIDDEN = ("sqlglot", "ParseError", "TokenError", "ufunc", "__matchrec_", "__mr_", "Traceback", "<class")


class Leak(Exception):
    """A matchrec.Error that is not what it should be: InternalError (an engine exception that
    escaped and was wrapped) or a message naming internals."""


def run_case(con, sql: str) -> str:
    """The outcome of one statement: 'ok' or the name of the matchrec.Error class it raised."""
    cur = con.cursor()
    try:
        # a numpy overflow warning would be arithmetic leaving its type unnoticed: an error here
        with time_limit(20), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            cur.execute(sql)
            if cur.description is not None:
                cur.fetchmany(50)
        return "ok"
    except matchrec.Error as err:
        message = str(err)
        if isinstance(err, matchrec.InternalError) or any(w in message for w in FORBIDDEN):
            raise Leak(f"{type(err).__name__}: {message}") from None
        return type(err).__name__
    finally:
        cur.close()


def fuzz(cases: int, seed: int) -> collections.Counter:
    rng = random.Random(seed)
    con = fresh_connection()
    outcomes: collections.Counter = collections.Counter()
    escaped = []
    try:
        for n in range(cases):
            sql = mutate(rng.choice(CORPUS), rng)
            try:
                outcomes[run_case(con, sql)] += 1
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # noqa: BLE001 - the point of the test
                outcomes[f"escaped {type(err).__name__}"] += 1
                escaped.append(f"case {n}: {type(err).__name__}: {str(err)[:200]}\n  {sql!r}")
                con.close()
                con = fresh_connection()
    finally:
        con.close()
    print(f"\n{cases} mutated statements (seed {seed}):",
          ", ".join(f"{name} {count:,}" for name, count in outcomes.most_common()))
    assert not escaped, f"{len(escaped)} statements raised something else than a clean matchrec.Error:\n" + \
        "\n".join(escaped[:20])
    return outcomes


def test_corpus_is_valid():
    """The unmutated statements all run, so mutations start from working queries."""
    con = fresh_connection()
    try:
        for sql in CORPUS:
            assert run_case(con, sql) == "ok", sql
    finally:
        con.close()


def test_token_mutations():
    outcomes = fuzz(1200, seed=20261125)
    assert outcomes["ok"] > 0 and sum(outcomes.values()) == 1200


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_token_mutations_many(seed):
    fuzz(10_000, seed=seed)
