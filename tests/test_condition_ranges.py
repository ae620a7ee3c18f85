"""Conditions decided by the value ranges of their variables' types (``planner.cer_ranges``).

``decide`` against every binding of small integer ranges (random expressions); statements whose
conditions are true for every binding, false for every binding, or either, over a table whose
attributes lie in ranges of their own per type (with NULLs and NaN in some), through ``run_many``
and a cursor, equal to the NFA mechanisms, which never leave a condition out.
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import matchrec
from matchrec.parser import sase as S
from matchrec.planner.cer_ranges import decide
from test_multi_pattern import alone

OPS = ["<", "<=", ">", ">=", "=", "<>"]


def random_expr(rng: random.Random, depth: int = 0) -> str:
    """A condition over variables a, b, c: comparisons of sums, differences, products and abs of
    columns and literals, under AND / OR / NOT / BETWEEN."""
    def term(d=0):
        r = rng.random()
        if d > 1 or r < 0.45:
            return rng.choice(["a.v", "b.v", "c.v", str(rng.randint(-6, 6)), f"{rng.randint(-6, 6)}.5"])
        if r < 0.6:
            return f"abs({term(d + 1)})"
        if r < 0.7:
            return f"-({term(d + 1)})"
        return f"({term(d + 1)} {rng.choice('+-*')} {term(d + 1)})"
    r = rng.random()
    if depth < 2 and r < 0.25:
        return f"({random_expr(rng, depth + 1)} {rng.choice(['AND', 'OR'])} {random_expr(rng, depth + 1)})"
    if depth < 2 and r < 0.32:
        return f"NOT ({random_expr(rng, depth + 1)})"
    if r < 0.42:
        return f"{term()} {'NOT ' if rng.random() < 0.3 else ''}BETWEEN {term()} AND {term()}"
    return f"{term()} {rng.choice(OPS)} {term()}"


def evaluate(e, values: dict):
    """``e`` on one binding (no NULLs): Python's exact arithmetic."""
    if isinstance(e, S.Lit):
        return e.value
    if isinstance(e, S.Col):
        return values[e.var]
    if isinstance(e, S.Call):
        return abs(evaluate(e.args[0], values))
    if isinstance(e, S.Unary):
        x = evaluate(e.arg, values)
        return (not x) if e.op == "not" else -x
    if isinstance(e, S.Logic):
        parts = [evaluate(x, values) for x in e.items]
        return all(parts) if e.op == "and" else any(parts)
    if isinstance(e, S.Between):
        x = evaluate(e.arg, values)
        return (evaluate(e.lo, values) <= x <= evaluate(e.hi, values)) != e.negated
    x, y = evaluate(e.left, values), evaluate(e.right, values)
    return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "<": lambda: x < y,
            "<=": lambda: x <= y, ">": lambda: x > y, ">=": lambda: x >= y, "=": lambda: x == y,
            "<>": lambda: x != y}[e.op]()


@pytest.mark.parametrize("seed", range(6))
def test_decide_agrees_with_every_binding(seed):
    """True only where every binding of the ranges holds, False only where none does; and it decides
    a good share of the random conditions (so that a ``decide`` answering None always fails)."""
    rng = random.Random(seed)
    decided = 0
    for _ in range(250):
        text = random_expr(rng)
        q = S.parse(f"PATTERN SEQ(A a, B b, C c) FROM ev WHERE {text} WITHIN 5 RETURN COUNT(*)")
        if len(q.conditions) != 1:
            continue  # a condition over one variable is a filter
        ranges = {}
        for v in "abc":
            lo = rng.randint(-5, 5)
            ranges[v] = (lo, lo + rng.randint(0, 3), True)
        got = decide(q.conditions[0], lambda col: ranges[col.var])
        truths = {evaluate(q.conditions[0], dict(zip("abc", vals)))
                  for vals in itertools.product(*(range(lo, hi + 1) for lo, hi, _ in ranges.values()))}
        if got is not None:
            decided += 1
            assert truths == {got}, (text, ranges)
    assert decided > 60


def test_floats_are_decided_only_with_a_margin():
    q = S.parse("PATTERN SEQ(A a, B b) FROM ev WHERE a.v - b.v < 0.3 WITHIN 5 RETURN COUNT(*)")
    cond = q.conditions[0]
    # 0.1 + 0.2 is 0.30000000000000004 in floats: too close to the bound to say either way
    assert decide(cond, lambda col: (0.2, 0.2, False) if col.var == "a" else (-0.1, -0.1, False)) is None
    assert decide(cond, lambda col: (0.2, 0.2, False) if col.var == "a" else (0.0, 0.1, False)) is True
    assert decide(cond, lambda col: (0.5, 0.7, False) if col.var == "a" else (0.0, 0.1, False)) is False
    assert decide(cond, lambda col: None if col.var == "a" else (0.0, 0.1, False)) is None


@pytest.fixture
def zoned(con):
    """Events whose ``v`` lies in a range of its own per type (A 0-9, B 20-29, C 5-24, D NULL in some,
    E NaN in some), ``w`` anywhere."""
    con.cursor().execute("""CREATE TABLE zoned AS SELECT i AS ts,
        ['A', 'B', 'C', 'D', 'E'][1 + (i * 7 % 5)] AS type,
        CASE i * 7 % 5 WHEN 0 THEN (i // 5 % 10) * 1.0 WHEN 1 THEN 20 + i // 5 % 10 WHEN 2 THEN 5 + i // 5 % 20
             WHEN 3 THEN CASE WHEN i % 9 = 0 THEN NULL ELSE i % 7 END
             ELSE CASE WHEN i % 11 = 0 THEN 'NaN'::DOUBLE ELSE i % 5 END END AS v,
        (i * 37 % 23) AS w FROM range(300) t(i)""")
    return con


STATEMENTS = [
    # true for every binding: left out
    ("PATTERN SEQ(A a, B b, C c) FROM zoned WHERE b.v - a.v > 10 WITHIN 12 RETURN COUNT(*)", True),
    ("PATTERN SEQ(A a, C c, B b) FROM zoned WHERE abs(a.v - b.v) < 30 AND c.v BETWEEN 0 AND 25 "
     "WITHIN 12 RETURN COUNT(*)", True),
    ("PATTERN SEQ(A a, ~B n, C c) FROM zoned WHERE n.v > a.v WITHIN 9 RETURN COUNT(*)", True),
    ("PATTERN SEQ(A a, B+ k, C c) FROM zoned WHERE c.v < a.v + 30 OR c.w > 3 WITHIN 12 RETURN COUNT(*)", True),
    ("PATTERN SEQ(A a, AND(B b, C c)) FROM zoned WHERE b.v * 2 >= a.v WITHIN 12 RETURN a.ts, b.ts, c.ts", True),
    # false for every binding: the alternatives binding its variables match nothing
    ("PATTERN SEQ(A a, B b) FROM zoned WHERE a.v > b.v WITHIN 12 RETURN COUNT(*)", "never"),
    ("PATTERN SEQ(A a, OR(B b, C c)) FROM zoned WHERE b.v < a.v WITHIN 12 RETURN a.ts, c.ts", "never"),
    ("PATTERN SEQ(A a, ~B n, C c) FROM zoned WHERE n.v < a.v WITHIN 9 RETURN COUNT(*)", False),  # blocks nothing
    # either: kept
    ("PATTERN SEQ(A a, C c, B b) FROM zoned WHERE c.v > a.v WITHIN 12 RETURN COUNT(*)", False),
    ("PATTERN SEQ(A a, C c) FROM zoned WHERE c.v - a.v < c.w WITHIN 12 RETURN COUNT(*)", False),
    # NULL and NaN among a type's values: never decided
    ("PATTERN SEQ(A a, D d) FROM zoned WHERE d.v < a.v + 100 WITHIN 12 RETURN COUNT(*)", False),
    ("PATTERN SEQ(A a, E e) FROM zoned WHERE e.v < a.v + 100 WITHIN 12 RETURN COUNT(*)", False),
    # a Kleene variable's condition: not decided
    ("PATTERN SEQ(A a, B+ k) FROM zoned WHERE max(k.v) > a.v WITHIN 12 RETURN COUNT(*)", False),
]


def test_conditions_true_for_every_binding_are_left_out_and_results_stay(zoned):
    stmts = [s for s, _ in STATEMENTS]
    want = [alone(zoned, s) for s in stmts]
    for share in (False, True):
        r = matchrec.run_many(zoned, stmts, share=share)
        for t, w, s in zip(r.tables, want, stmts):
            assert t.equals(w), s
        for what, marked in (("true for every binding", True), ("false for every binding", "never")):
            lines = [x for x in r.report if what in x]
            said = {int(x.split(" (")[0]) for line in lines for x in line.split("statements ", 1)[1].split("), ")}
            assert said == {i for i, (_, m) in enumerate(STATEMENTS) if m == marked}, lines
    for s, w in zip(stmts, want):
        assert zoned.cursor().execute(s).fetch_arrow_table().equals(w), s
    assert any(w.num_rows and w.column(0)[0].as_py() for w in want)  # not all empty


def test_statements_run_alone_see_only_their_classes_rows(zoned):
    """A statement the shared operator does not take (adjacent closures: recomputation) runs over the
    rows of its own elements' classes only, under skip-till-any-match; its matches, single rows and
    closures' sequences, are the read's rows again - equal to the statement through a cursor."""
    stmts = ["PATTERN SEQ(A a, B+ b, C+ c, A d) FROM zoned WHERE d.w > a.w WITHIN 14 RETURN a.ts, b.ts, c.w, d.ts",
             "PATTERN SEQ(A a, B+ b, C+ c) FROM zoned WHERE a.v < 5 WITHIN 10 RETURN COUNT(*)",
             "PATTERN SEQ(D a, E e) FROM zoned WITHIN 6 RETURN a.ts, e.ts",  # every type in the read
             "PATTERN SEQ(A a, B+ b, C+ c) FROM zoned USE skip-till-next-match WITHIN 10 RETURN a.ts, c.ts"]
    want = [alone(zoned, s) for s in stmts]
    r = matchrec.run_many(zoned, stmts)
    for t, w, s in zip(r.tables, want, stmts):
        assert t.equals(w), s
    assert "statements 0 (" in next(x for x in r.report if "one by one" in x)
    assert want[0].num_rows > 10 and want[1].column(0)[0].as_py() > 10


@pytest.mark.parametrize("seed", range(5))
def test_rows_near_anchors_equal_a_search_of_every_pair(seed):
    from matchrec.engine.multi_eval import near_anchors
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    pid = np.sort(rng.integers(0, 4, n))
    # partitions' key ranges overlap, each starting about where the one before ends: the last anchor of
    # one partition lies within the window of the next one's first rows
    key = np.concatenate([np.sort(rng.integers(30 * p - 40, 30 * p + 10, (pid == p).sum())) for p in range(4)])
    key[:1] = -2**62 if n > 2 else key[:1]  # far keys: differences beyond 2^63
    anchor = rng.random(n) < 0.08
    w = int(rng.integers(0, 40))
    want = np.array([any(anchor[j] and pid[j] == pid[i] and abs(int(key[j]) - int(key[i])) <= w for j in range(n))
                     for i in range(n)])
    assert (near_anchors(key, pid, anchor, w) == want).all()
    flat = np.array([any(anchor[j] and abs(int(key[j]) - int(key[i])) <= w for j in range(n)) for i in range(n)])
    order = np.argsort(key, kind="stable")
    assert (near_anchors(key[order], None, anchor[order], w) == flat[order]).all()


def test_a_statement_alone_with_rare_anchors_reads_their_windows_only(con):
    """Partitioned events, a rare anchor type: recomputation over the rows near its candidates equals
    the cursor's (which filters in DuckDB) and the NFA mechanisms'."""
    con.cursor().execute("""CREATE TABLE sparse AS SELECT i AS ts, i % 3 AS p,
        CASE WHEN i % 97 = 5 THEN 'R' WHEN i % 2 = 0 THEN 'B' ELSE 'C' END AS type, i % 13 AS v
        FROM range(3000) t(i)""")
    stmts = ["PATTERN SEQ(R r, B+ b, C+ c) FROM sparse PARTITION BY p WITHIN 12 RETURN COUNT(*)",
             "PATTERN SEQ(B b, C+ c, B+ d, R r) FROM sparse PARTITION BY p WHERE r.v <> b.v WITHIN 12 "
             "RETURN b.ts, r.ts, count(d) AS n",
             "PATTERN SEQ(R r, B+ b, C+ c) FROM sparse PARTITION BY p USE strict-contiguity WITHIN 12 "
             "RETURN COUNT(*)"]
    want = [alone(con, s) for s in stmts]
    r = matchrec.run_many(con, stmts)
    for t, w, s in zip(r.tables, want, stmts):
        assert t.equals(w), s
    assert want[0].column(0)[0].as_py() > 50 and want[1].num_rows > 20
