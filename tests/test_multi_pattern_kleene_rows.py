"""Kleene closures in statements that return a row per match but read no closure in RETURN: the
shared operator repeats each skeleton match's row once per set of the closure's candidates
(``cer_shared.Evaluator.kleene_repeats``), and the tables - rows and their order - equal the
statement's run alone by the NFA mechanisms."""
from __future__ import annotations

import random

import pytest

import matchrec
from tests.test_multi_pattern import alone, make_table

SHARED = [
    "PATTERN SEQ(A a, B+ k, C c) FROM ev ORDER BY ts WITHIN 6 RETURN a.ts AS s, c.ts AS e",
    "PATTERN SEQ(A a, C c, B+{2,3} k) FROM ev ORDER BY ts WITHIN 7 RETURN a.ts, c.price - a.price AS gain",
    "PATTERN SEQ(A a, D+{2,} k, C c) FROM ev ORDER BY ts WHERE c.price > a.price WITHIN 6 RETURN a.ts, c.ts",
    "PATTERN SEQ(A a, ~D n, B+ k, C c) FROM ev ORDER BY ts WITHIN 6 RETURN a.ts, c.ts",  # a gate beside it
    "PATTERN SEQ(A a, B+ k, ~D n, C c) FROM ev ORDER BY ts WITHIN 6 RETURN c.ts, a.ts",
    "PATTERN SEQ(B b, A+ k, C c, D+ m) FROM ev PARTITION BY p ORDER BY ts WITHIN 8 RETURN b.ts, c.price",
]
ALONE = [  # why each is left to the single-statement mechanisms
    ("PATTERN SEQ(A a, B+ b, C c) FROM ev ORDER BY ts WITHIN 6 RETURN a.ts, c.ts", "in an order only its sets give"),
    ("PATTERN SEQ(B+ k, C c, A a) FROM ev ORDER BY ts WITHIN 6 RETURN c.ts, a.ts", "in an order only its sets give"),
    ("PATTERN SEQ(A a, B+ k, C c) FROM ev ORDER BY ts WITHIN 6 RETURN a.ts, count(k) AS n", "read by RETURN"),
    ("PATTERN SEQ(A a, B+ k, C c) FROM ev ORDER BY ts WITHIN 6", "its events returned"),
]


@pytest.mark.parametrize("seed", range(12))
def test_rows_repeated_per_set_equal_the_statements_alone(seed):
    rng = random.Random(seed)
    con = matchrec.connect()
    make_table(con, rng)  # keys with ties in about half of the seeds
    stmts = SHARED + [s for s, _ in ALONE]
    want = [alone(con, s) for s in stmts]
    for share, reorder in ((False, False), (True, True)):
        r = matchrec.run_many(con, stmts, share=share, reorder=reorder)
        for t, w, s in zip(r.tables, want, stmts):
            assert t.equals(w), s
    text = "\n".join(r.report)
    alone_line = next((line for line in text.splitlines() if "evaluated one by one" in line), "")
    for i in range(len(SHARED)):
        assert f" {i} (" not in alone_line, (i, text)
    for j, (_, why) in enumerate(ALONE):
        assert f" {len(SHARED) + j} (" in alone_line and why in alone_line, (why, text)


def test_too_many_rows_raise_as_alone():
    con = matchrec.connect()
    con.cursor().execute("""CREATE TABLE ev AS SELECT i AS ts, CASE WHEN i % 10 = 0 THEN 'A' WHEN i % 10 = 9
                            THEN 'C' ELSE 'B' END AS type, 0 AS p, 1 AS price FROM range(300) t(i)""")
    stmt = "PATTERN SEQ(A a, B+ k, C c) FROM ev ORDER BY ts WITHIN 10 RETURN a.ts, c.ts"
    cur = con.cursor()
    assert len(cur.execute(stmt).fetchall()) == 30 * 255  # 2^8 - 1 sets of the eight B between
    cur.execute("SET matchrec_cer_max_matches = 5000")
    with pytest.raises(matchrec.OperationalError, match="more than 5000 matches"):
        cur.execute(stmt).fetchall()
    with pytest.raises(matchrec.OperationalError, match="more than 5000 matches"):
        matchrec.run_many(con, [stmt])


END_NEGATIONS = [  # a negation reaching from the match's other end, which the closure decides set by set
    "PATTERN SEQ(~A n, A a, B+ k) FROM ev ORDER BY ts WITHIN 5 RETURN {}",
    "PATTERN SEQ(B+ k, A a, ~C n) FROM ev ORDER BY ts WITHIN 5 RETURN {}",
    "PATTERN SEQ(~D n, A a, C c, B+{1,2} k) FROM ev PARTITION BY p ORDER BY ts WITHIN 6 RETURN {}",
]


@pytest.mark.parametrize("seed", range(12))
def test_a_negation_at_the_far_end_of_a_closure_is_left_to_rcep(seed):
    """``SEQ(~A n, A a, B+ k)``: the negation's range ends at the match's first event but starts a
    window before its last, which each set of the closure moves; counting the skeleton's matches
    against one range gave too few (both through a cursor and in ``run_many``). Such chains go to
    rcep, counted or with rows."""
    rng = random.Random(seed)
    con = matchrec.connect()
    make_table(con, rng)
    stmts = [s.replace("{}", r) for s in END_NEGATIONS for r in ("COUNT(*)", "a.ts")]
    want = [alone(con, s) for s in stmts]
    got = matchrec.run_many(con, stmts)
    cur = con.cursor()
    for s, w, g in zip(stmts, want, got.tables):
        assert g.equals(w), s
        assert cur.execute(s).fetch_arrow_table().equals(w), s
