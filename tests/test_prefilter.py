"""The row filter pushed into DuckDB (planner.prefilter) never changes a result.

Random patterns with gap variables (``N*`` between the interesting variables), random
conditions and measures - some of them forms that must make the planner refuse the filter -
run with the filter on and off, on both matchers.
"""
from __future__ import annotations

import random

import pytest

import matchrec

E_CONDITIONS = [
    "contains(c, '{v}')", "v > {k}", "v < {k} AND contains(c, '{v}')", "{v}.v > A.v", "v % 3 = {m}",
    "count(A.*) < 3 AND contains(c, '{v}')", "v >= FIRST(A.v)", "{v}.id - A.id < 40",
]
MEASURES_OK = ["FIRST(A.id) AS fa", "LAST(B.v) AS lb", "count(A.*) AS na", "A.v AS av", "MATCH_NUMBER() AS mn",
               "CLASSIFIER() AS cl", "id AS cur", "FINAL LAST(id) AS last_id", "sum(B.v) AS sb"]
MEASURES_REFUSED = ["count(*) AS n", "PREV(v) AS pv", "FIRST(id, 1) AS second", "LAST(N.id) AS ln"]


def random_query(seed: int) -> str:
    rng = random.Random(seed)
    evars = ["A", "B", "C"][: rng.randint(2, 3)]
    items = []
    safe = rng.random() < 0.6  # shapes the filter accepts: single variables with gaps between
    for i in range(rng.randint(2, 4)):
        v = evars[i % len(evars)] if i else "A"
        if safe:
            q = rng.choice(["", "", "", "(X|Y)"]).replace("X", v).replace("Y", evars[-1])
            items.append(q if q else v)
            items.append(rng.choice(["N*", "N*?", "{- N* -}", "{- N*? -}"]))
            continue
        q = rng.choice(["", "", "+", "{1,2}", "?"]) if i else rng.choice(["", "+"])
        items.append(v + q)
        if i < 3:
            items.append(rng.choice(["N*", "N*?", "{- N* -}", "{- N*? -}", ""]))
    while not items[-1] or items[-1].startswith(("N", "{-")):
        items.pop()
    pattern = " ".join(i for i in items if i)
    defines = [f"{v} AS {rng.choice(E_CONDITIONS).format(v=v, k=rng.randint(20, 80), m=rng.randint(0, 2))}"
               for v in evars]
    if rng.random() < 0.5:
        defines.append("N AS true")
    measures = rng.sample(MEASURES_OK, rng.randint(1, 4))
    if rng.random() < 0.2:
        measures.append(rng.choice(MEASURES_REFUSED))
    rows = rng.choice(["ONE ROW PER MATCH", "ALL ROWS PER MATCH", "ALL ROWS PER MATCH OMIT EMPTY MATCHES"])
    if safe and rng.random() < 0.5:
        rows = "ONE ROW PER MATCH"
    skip = rng.choice(["PAST LAST ROW", "TO NEXT ROW", "TO LAST B", "TO FIRST " + evars[-1]])
    within = rng.choice(["", "", f"WITHIN {rng.randint(5, 60)}"])
    partition = rng.choice(["", "PARTITION BY p"])
    return (f"SELECT * FROM t MATCH_RECOGNIZE ({partition} ORDER BY id MEASURES {', '.join(measures)} {rows} "
            f"AFTER MATCH SKIP {skip} PATTERN ({pattern}) {within} DEFINE {', '.join(defines)})")


@pytest.fixture(scope="module")
def con():
    c = matchrec.connect()
    c.cursor().execute("""CREATE TABLE t AS SELECT i AS id, i % 3 AS p, (hash(i, 7) % 100)::INT AS v,
        ['A', 'B', 'C', 'AB', 'D', 'E', 'F', 'G'][1 + (hash(i, 8) % 8)::INT] AS c FROM range(400) r(i)""")
    yield c
    c.close()


def run(con, sql: str, fast: int, prefilter: int):
    cur = con.cursor()
    cur.execute(f"SET matchrec_fast_path = {fast}")
    cur.execute(f"SET matchrec_prefilter = {prefilter}")
    try:
        cur.execute(sql)
        rows = sorted(cur.fetchall(), key=repr)
        filtered = any("row filter in DuckDB" in n for plan, _ in cur.stats for n in plan.notes)
        return rows, filtered
    except matchrec.Error as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0]}", False


def test_filter_never_changes_results(con):
    applied = 0
    for seed in range(60):
        sql = random_query(seed)
        unfiltered, _ = run(con, sql, fast=1, prefilter=0)
        filtered, used = run(con, sql, fast=1, prefilter=1)
        assert filtered == unfiltered, f"seed {seed}: {sql}"
        applied += used
        if seed % 5 == 0:  # the reference matcher with the filter, now and then
            reference, _ = run(con, sql, fast=0, prefilter=0)
            assert reference == unfiltered, f"seed {seed}: {sql}"
    assert applied >= 10, f"the filter applied to only {applied} of 60 queries"


@pytest.mark.parametrize("measure", MEASURES_REFUSED)
def test_filter_refused_when_gap_rows_are_observable(con, measure):
    sql = (f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES {measure} ONE ROW PER MATCH "
           f"PATTERN (A N* B) DEFINE A AS contains(c, 'A'), B AS contains(c, 'B'), N AS true)")
    rows, used = run(con, sql, fast=1, prefilter=1)
    assert not used
    assert rows == run(con, sql, fast=0, prefilter=0)[0]


@pytest.mark.parametrize("pattern", ["N* A B", "A B N*", "A (N | B) B", "^ A N* B", "A N* B $", "A? N* B?",
                                     "A N+ B"])
def test_filter_refused_for_unsafe_patterns(con, pattern):
    sql = (f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES A.id AS a ONE ROW PER MATCH "
           f"PATTERN ({pattern}) DEFINE A AS contains(c, 'A'), B AS contains(c, 'B'), N AS true)")
    assert not run(con, sql, fast=1, prefilter=1)[1]
