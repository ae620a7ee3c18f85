"""Malformed and mutated queries: only matchrec.Error may escape, and nothing hangs.

Seeds are valid MATCH_RECOGNIZE queries; hypothesis deletes, inserts and swaps pieces of them
(and builds token soup from the clause's vocabulary). Every statement either runs or raises a
matchrec.Error; a statement running longer than a few seconds fails the test as a hang.
"""
from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import matchrec

SEEDS = [
    """SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES FIRST(ts) AS s, LAST(B.v) AS lb,
       count(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW PATTERN (A B+ C?) SUBSET U = (A, B)
       DEFINE B AS B.v < PREV(B.v), C AS C.v > A.v) AS m""",
    """SELECT m.ts, m.cls FROM t MATCH_RECOGNIZE (ORDER BY ts DESC MEASURES CLASSIFIER() AS cls,
       MATCH_NUMBER() AS mn ALL ROWS PER MATCH WITH UNMATCHED ROWS AFTER MATCH SKIP TO NEXT ROW
       PATTERN (^ (A | B){1,3}? $) DEFINE A AS v > 2) AS m WHERE m.ts > 1""",
    """WITH c AS (SELECT * FROM t) SELECT * FROM c MATCH_RECOGNIZE (MEASURES RUNNING sum(v) AS s,
       FINAL max(v) AS mx ALL ROWS PER MATCH OMIT EMPTY MATCHES PATTERN (A {- B* -} PERMUTE(C, D))
       WITHIN 10 DEFINE A AS true, B AS v % 2 = 0, C AS C.v > PREV(C.v, 2), D AS NEXT(v) IS NULL)""",
    """SELECT * FROM (SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k MEASURES LAST(v) AS lv
       PATTERN (X+) DEFINE X AS X.v >= FIRST(X.v))) MATCH_RECOGNIZE (ORDER BY lv MEASURES
       string_agg(k, ',') AS ks AFTER MATCH SKIP TO LAST Y PATTERN (Y Z*) DEFINE Z AS lv > LAST(Y.lv))""",
]

VOCAB = ["MATCH_RECOGNIZE", "(", ")", ",", "PATTERN", "DEFINE", "MEASURES", "AS", "A", "B", "C", "*", "+",
         "?", "{", "}", "{-", "-}", "|", "^", "$", "PERMUTE", "SUBSET", "=", "PARTITION BY", "ORDER BY",
         "ONE ROW PER MATCH", "ALL ROWS PER MATCH", "AFTER MATCH SKIP", "TO", "FIRST", "LAST", "PREV",
         "NEXT", "RUNNING", "FINAL", "CLASSIFIER()", "MATCH_NUMBER()", "count(*)", "v", "ts", "k", "'x'",
         "1", "0", "-1", "2147483648", "WITHIN", "INTERVAL '1' HOUR", "SELECT", "FROM", "t", "WHERE",
         "AND", "OR", "NOT", "NULL", ";", "\"", "'", "--", "/*", "*/", ".", "A.*", "::", "[", "]"]

SETUP = "CREATE TABLE t AS SELECT range AS ts, range % 5 AS v, range % 2 AS k FROM range(12)"


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    def alarm(signum, frame):
        raise Hang(f"statement ran longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


_con = None


def connection():
    global _con
    if _con is None:
        _con = matchrec.connect()
        _con.cursor().execute(SETUP)
    return _con


def check(sql: str) -> None:
    cur = connection().cursor()
    try:
        with time_limit(10):
            cur.execute(sql)
            cur.fetchall()
    except matchrec.Error as err:
        assert "Traceback" not in str(err)
    except Hang:
        pytest.fail(f"hang on: {sql!r}")
    except Exception as err:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{type(err).__name__} escaped: {err}\nquery: {sql!r}")
    finally:
        cur.close()


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "swap", "duplicate"]))
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        j = draw(st.integers(i, min(len(text), i + 12)))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + " " + draw(st.sampled_from(VOCAB)) + " " + text[i:]
        elif kind == "swap":
            k = draw(st.integers(0, len(text) - 1))
            text = text[:i] + text[k:k + (j - i)] + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


soup = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=30).map(
    lambda words: "SELECT * FROM t MATCH_RECOGNIZE (" + " ".join(words) + ")")

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@settings(max_examples=400, **COMMON)
@given(mutated())
def test_mutated_queries(sql):
    check(sql)


@settings(max_examples=300, **COMMON)
@given(soup)
def test_token_soup(sql):
    check(sql)


@settings(max_examples=200, **COMMON)
@given(st.text(max_size=80))
def test_arbitrary_text_in_body(text):
    check("SELECT * FROM t MATCH_RECOGNIZE (" + text + ")")


@pytest.mark.slow
@settings(max_examples=20_000, **{**COMMON, "derandomize": False})
@given(st.one_of(mutated(), soup))
def test_many_mutations(sql):
    check(sql)
