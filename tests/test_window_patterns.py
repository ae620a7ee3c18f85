"""Row pattern recognition in windows (SQL:2016 R020): ``measure OVER w``.

Hand-written cases with known answers, the errors users get, and a differential test: on
seeded random data and patterns (randgen.py), the window form must equal, row by row, the
first ONE ROW PER MATCH match of the same pattern over that row's frame taken as a partition
of its own (anchored at the row with ``^`` for INITIAL, anywhere in it for SEEK), with the
rows that AFTER MATCH SKIP passes over worked out from those matches.

  .venv/bin/pytest tests/test_window_patterns.py              a few dozen random cases per matcher
  .venv/bin/pytest tests/test_window_patterns.py -m slow      MATCHREC_WINDOW_CASES more (default 2000)
"""
from __future__ import annotations

import os
import random

import pytest

import matchrec
import randgen

FAST_CASES = 20
SLOW_CASES = int(os.environ.get("MATCHREC_WINDOW_CASES", "2000"))

PRICES = "(VALUES (1, 90), (2, 80), (3, 70), (4, 80), (5, 90), (6, 50), (7, 40), (8, 60)) t(id, value)"
V_SHAPE = ("WINDOW w AS (ORDER BY id MEASURES LAST(value) AS val, CLASSIFIER() AS label "
           "ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING AFTER MATCH SKIP PAST LAST ROW "
           "PATTERN (A B+ C+) DEFINE B AS B.value < PREV(B.value), C AS C.value > PREV(C.value))")


def rows(con, sql):
    cur = con.cursor()
    try:
        cur.execute(sql)
        return cur.fetchall()
    finally:
        cur.close()


def error_of(con, sql) -> matchrec.Error:
    cur = con.cursor()
    try:
        with pytest.raises(matchrec.Error) as info:
            cur.execute(sql)
            cur.fetchall()
    finally:
        cur.close()
    message = str(info.value)
    assert "__mr" not in message and "Traceback" not in message, message
    return info.value


# ---------------------------------------------------------------- known answers
def test_measures_of_one_window(trino):
    got = rows(trino, f"SELECT id, val OVER w, label OVER w FROM {PRICES} {V_SHAPE}")
    assert sorted(got) == [(1, 90, "C"), (2, None, None), (3, None, None), (4, None, None), (5, None, None),
                           (6, 60, "C"), (7, None, None), (8, None, None)]


def test_result_columns_are_named_as_written(trino):
    cur = trino.cursor()
    cur.execute(f"SELECT *, val OVER w, count(*) OVER w FROM {PRICES} {V_SHAPE}")
    assert [d[0] for d in cur.description] == ["id", "value", "val", "count(*) OVER w"]
    assert sorted(cur.fetchall())[0] == (1, 90, 90, 5)


def test_window_functions_over_the_match_and_ordinary_ones(trino):
    got = rows(trino, f"SELECT id, count(*) OVER w, sum(value) OVER w, row_number() OVER (ORDER BY id DESC), "
                      f"max(value) OVER () FROM {PRICES} {V_SHAPE}")
    by_id = {r[0]: r[1:] for r in got}
    assert by_id[1] == (5, 90 + 80 + 70 + 80 + 90, 8, 90)  # the match is rows 1..5
    assert by_id[6] == (3, 50 + 40 + 60, 3, 90)
    assert by_id[2] == (0, None, 7, 90)  # skipped: an empty frame


def test_inline_window_with_a_bounded_frame(trino):
    # A+ always matches; the frame (2 FOLLOWING) ends it; TO NEXT ROW tries every row
    got = rows(trino, f"SELECT id, last_id OVER (ORDER BY id MEASURES LAST(id) AS last_id "
                      f"ROWS BETWEEN CURRENT ROW AND 2 FOLLOWING AFTER MATCH SKIP TO NEXT ROW "
                      f"PATTERN (A+) DEFINE A AS true) FROM {PRICES}")
    assert sorted(got) == [(i, min(i + 2, 8)) for i in range(1, 9)]


def test_navigation_stops_at_the_frame(trino):
    # PREV of the first row reaches before the frame (the current row): NULL, so B never holds
    # at the start; NEXT past the frame end is NULL too
    got = rows(trino, f"SELECT id, p OVER w, n OVER w FROM {PRICES} WINDOW w AS (ORDER BY id "
                      f"MEASURES PREV(A.value) AS p, NEXT(A.value) AS n ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING "
                      f"AFTER MATCH SKIP TO NEXT ROW PATTERN (A) DEFINE A AS true)")
    assert sorted(got) == [(i, None, None if i == 8 else v)
                           for i, v in zip(range(1, 9), [80, 70, 80, 90, 50, 40, 60, None])]


def test_seek_finds_the_first_match_in_the_frame(trino):
    got = rows(trino, f"SELECT id, first_id OVER w FROM {PRICES} WINDOW w AS (ORDER BY id MEASURES "
                      f"FIRST(id) AS first_id ROWS BETWEEN CURRENT ROW AND 3 FOLLOWING AFTER MATCH SKIP TO NEXT ROW "
                      f"SEEK PATTERN (A) DEFINE A AS A.value < 60)")
    assert sorted(got) == [(1, None), (2, None), (3, 6), (4, 6), (5, 6), (6, 6), (7, 7), (8, None)]


def test_partitions_where_and_frame_from_a_column(trino):
    got = rows(trino, "SELECT part, id, last_id OVER w FROM (VALUES ('a', 1, 1), ('a', 2, 0), ('a', 3, 5), "
                      "('b', 1, 2), ('b', 2, 2), ('b', 3, 9), ('b', 4, 1)) t(part, id, k) WHERE id <> 3 "
                      "WINDOW w AS (PARTITION BY part ORDER BY id MEASURES LAST(id) AS last_id "
                      "ROWS BETWEEN CURRENT ROW AND k FOLLOWING AFTER MATCH SKIP TO NEXT ROW PATTERN (A+) "
                      "DEFINE A AS true)")
    assert sorted(got) == [("a", 1, 2), ("a", 2, 2), ("b", 1, 4), ("b", 2, 4), ("b", 4, 4)]


def test_in_subqueries_order_by_and_in_predicates(trino):
    inner = f"SELECT id, val OVER w AS v FROM {PRICES} {V_SHAPE}"
    assert rows(trino, f"SELECT count(*), sum(v) FROM ({inner}) WHERE v IS NOT NULL") == [(2, 150)]
    got = rows(trino, f"SELECT id FROM {PRICES} WHERE value IN (SELECT val OVER w FROM {PRICES} {V_SHAPE})")
    assert sorted(got) == [(1,), (5,), (8,)]  # values 90 and 60
    got = rows(trino, f"SELECT id FROM {PRICES} {V_SHAPE} ORDER BY val OVER w DESC NULLS LAST, id LIMIT 2")
    assert got == [(1,), (6,)]


def test_source_from_a_common_table_expression(trino):
    got = rows(trino, f"WITH src AS (SELECT * FROM {PRICES}) SELECT id, val OVER w FROM src {V_SHAPE}")
    assert sorted(r for r in got if r[1] is not None) == [(1, 90), (6, 60)]


def test_match_recognize_and_windows_inside_each_other(trino):
    inner_window = f"SELECT id, val OVER w AS v FROM {PRICES} {V_SHAPE}"
    got = rows(trino, f"SELECT * FROM ({inner_window}) MATCH_RECOGNIZE (ORDER BY id MEASURES COUNT(*) AS n "
                      f"PATTERN (X Y+) DEFINE X AS v IS NOT NULL, Y AS v IS NULL)")
    assert got == [(5,), (3,)]  # rows 1-5 and 6-8
    inner_mr = (f"SELECT * FROM {PRICES} MATCH_RECOGNIZE (ORDER BY id MEASURES FIRST(id) AS id, "
                f"LAST(value) AS value ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW PATTERN (A) DEFINE A AS true)")
    got = rows(trino, f"SELECT id, val OVER w FROM ({inner_mr}) s {V_SHAPE}")
    assert sorted(r for r in got if r[1] is not None) == [(1, 90), (6, 60)]


def test_two_pattern_windows_in_one_select(trino):
    got = rows(trino, f"SELECT id, val OVER w, up OVER u FROM {PRICES} {V_SHAPE[:-1]}), "
                      f"u AS (ORDER BY id MEASURES COUNT(*) AS up ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING "
                      f"AFTER MATCH SKIP TO NEXT ROW PATTERN (X Y+) DEFINE Y AS Y.value > PREV(Y.value))")
    by_id = {r[0]: r[1:] for r in got}
    assert by_id[1] == (90, None) and by_id[3] == (None, 3) and by_id[7] == (None, 2)


def test_skip_to_a_variable(trino):
    got = rows(trino, f"SELECT id, label OVER w FROM {PRICES} WINDOW w AS (ORDER BY id MEASURES "
                      f"CLASSIFIER() AS label ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING "
                      f"AFTER MATCH SKIP TO LAST B PATTERN (A B+) DEFINE B AS B.value < PREV(B.value))")
    # 1: A B B (rows 1-3) resumes at 3, 3 finds nothing, 4: A B (4-5)? 90 > 80: no; 5: A B B (5-7) -> 7
    assert sorted(got) == [(1, "B"), (2, None), (3, None), (4, None), (5, "B"), (6, None), (7, None), (8, None)]


def test_spark_dialect_reads_it_too():
    con = matchrec.connect(":memory:", dialect="spark")
    try:
        got = rows(con, "SELECT id, n OVER w FROM VALUES (1), (2), (3) AS t(id) WINDOW w AS (ORDER BY id "
                        "MEASURES COUNT(*) AS n ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING "
                        "PATTERN (A+) DEFINE A AS true)")
    finally:
        con.close()
    assert sorted(got) == [(1, 3), (2, None), (3, None)]


def test_compiled_matcher_runs_the_window_where_it_can():
    con = matchrec.connect(":memory:")
    try:
        cur = con.cursor()
        sql = ("SELECT id, n OVER w FROM (SELECT range AS id, range % 5 AS v FROM range(200)) t WINDOW w AS "
               "(ORDER BY id MEASURES COUNT(*) AS n ROWS BETWEEN CURRENT ROW AND 3 FOLLOWING "
               "AFTER MATCH SKIP TO NEXT ROW PATTERN (A B+) DEFINE A AS v = 0, B AS v > 0)")
        cur.execute(sql)
        compiled = sorted(cur.fetchall())
        assert [s.matcher for _, s in cur.stats] == ["compiled"]
        cur.execute("SET matchrec_fast_path = 0")
        cur.execute(sql)
        assert [s.matcher for _, s in cur.stats] == ["reference"]
        assert sorted(cur.fetchall()) == compiled
        # the frame (3 FOLLOWING) cuts A B B B B to A B B B
        assert compiled[0] == (0, 4) and compiled[1] == (1, None)
    finally:
        con.close()


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("window, problem", [
    ("ROWS BETWEEN 1 PRECEDING AND UNBOUNDED FOLLOWING", "starting at CURRENT ROW"),
    ("RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING", "ROWS frame"),
    ("ROWS BETWEEN CURRENT ROW AND 2 PRECEDING", "frame ending"),
    ("", "needs the frame"),
])
def test_frame_errors(trino, window, problem):
    err = error_of(trino, f"SELECT id, m OVER w FROM {PRICES} WINDOW w AS (ORDER BY id MEASURES COUNT(*) AS m "
                          f"{window} PATTERN (A+) DEFINE A AS true)")
    assert isinstance(err, matchrec.ProgrammingError)
    assert problem in str(err) and "Line 1" in str(err)


def test_measure_without_over(trino):
    err = error_of(trino, f"SELECT id, val FROM {PRICES} {V_SHAPE}")
    assert isinstance(err, matchrec.ProgrammingError)
    assert "val OVER w" in str(err) and "Col 12" in str(err)


def test_unknown_measure_before_over(trino):
    err = error_of(trino, f"SELECT id, nope OVER w FROM {PRICES} {V_SHAPE}")
    assert isinstance(err, matchrec.ProgrammingError) and "not a measure" in str(err)


def test_rows_per_match_is_not_part_of_a_window(trino):
    err = error_of(trino, f"SELECT id, m OVER w FROM {PRICES} WINDOW w AS (ORDER BY id MEASURES COUNT(*) AS m "
                          f"ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING ONE ROW PER MATCH PATTERN (A+) "
                          f"DEFINE A AS true)")
    assert isinstance(err, matchrec.ProgrammingError)


def test_seek_stays_out_of_match_recognize(trino):
    err = error_of(trino, f"SELECT * FROM {PRICES} MATCH_RECOGNIZE (ORDER BY id SEEK PATTERN (A) "
                          f"DEFINE A AS true)")
    assert "SEEK" in str(err)


def test_negative_frame_offset(trino):
    err = error_of(trino, f"SELECT id, m OVER w FROM {PRICES} WINDOW w AS (ORDER BY id MEASURES COUNT(*) AS m "
                          f"ROWS BETWEEN CURRENT ROW AND id - 3 FOLLOWING PATTERN (A+) DEFINE A AS true)")
    assert isinstance(err, matchrec.DataError) and "negative or null" in str(err)


@pytest.mark.parametrize("tail, problem", [
    ("JOIN (VALUES 1) u(x) ON true", "join"),
    ("GROUP BY id, value", "GROUP BY"),
])
def test_unsupported_shapes(trino, tail, problem):
    err = error_of(trino, f"SELECT id, val OVER w FROM {PRICES} {tail} {V_SHAPE}")
    assert isinstance(err, matchrec.NotSupportedError) and problem in str(err)


def test_a_pattern_window_cannot_extend_another(trino):
    err = error_of(trino, f"SELECT id, m OVER w FROM {PRICES} WINDOW base AS (ORDER BY id), w AS (base "
                          f"MEASURES COUNT(*) AS m ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING PATTERN (A+) "
                          f"DEFINE A AS true)")
    assert isinstance(err, matchrec.NotSupportedError) and "Line 1" in str(err)


def test_skip_to_the_current_row_fails_at_run_time(trino):
    err = error_of(trino, f"SELECT id, m OVER w FROM {PRICES} WINDOW w AS (ORDER BY id MEASURES COUNT(*) AS m "
                          f"ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING AFTER MATCH SKIP TO FIRST A "
                          f"PATTERN (A B) DEFINE A AS true)")
    assert isinstance(err, matchrec.DataError)


# ---------------------------------------------------------------- differential
def window_case(seed: int):
    """(window-form SQL, reference SQL, how to get the expected rows from the reference's)."""
    rng = random.Random(seed)
    case = randgen.random_case(rng)
    frame = rng.choice([None, 0, 1, 2, 3, 5])
    seek = rng.random() < 0.35
    kind, var = case.skip
    kind = "to_last" if kind == "to" else kind
    if rng.random() < 0.5 and kind not in ("past_last", "next_row"):
        kind, var = rng.choice(["past_last", "next_row"]), None
    values = ", ".join(f"({p}, {i}, '{c}')" for p, i, c in case.rows) or "(1, 1, 'x')"
    where = "" if case.rows else " WHERE false"
    source = f"(VALUES {values}) t(p, id, c)"
    pattern = case.pattern_sql()
    skip = {"past_last": "PAST LAST ROW", "next_row": "TO NEXT ROW", "to_first": f"TO FIRST {var}",
            "to_last": f"TO LAST {var}"}[kind]
    subset = ("SUBSET " + ", ".join(f"{n} = ({', '.join(m)})" for n, m in case.subsets.items())) \
        if case.subsets else ""
    define = "DEFINE " + ", ".join(f"{v} AS {c.sql}" for v, c in case.defines.items())
    extent = "UNBOUNDED FOLLOWING" if frame is None else f"{frame} FOLLOWING"
    var_measures = f", FIRST({var}.id) AS vf, LAST({var}.id) AS vl" if var else ""
    window_sql = (f"SELECT p, id, cls OVER w, s OVER w, e OVER w, count(*) OVER w FROM {source}{where} "
                  f"WINDOW w AS (PARTITION BY p ORDER BY id MEASURES CLASSIFIER() AS cls, FIRST(id) AS s, "
                  f"LAST(id) AS e ROWS BETWEEN CURRENT ROW AND {extent} AFTER MATCH SKIP {skip} "
                  f"{'SEEK' if seek else 'INITIAL'} PATTERN ({pattern}) {subset} {define})")
    upto = "b.rn <= a.rn + " + str(frame) if frame is not None else "true"
    reference_sql = (
        f"WITH numbered AS (SELECT *, row_number() OVER (PARTITION BY p ORDER BY id) AS rn "
        f"FROM {source}{where}), "
        f"frames AS (SELECT a.p, a.id AS anchor, b.id, b.c FROM numbered a JOIN numbered b "
        f"ON a.p = b.p AND b.rn >= a.rn AND {upto}) "
        f"SELECT p, anchor, cls, s, e, n{', vf, vl' if var else ''} FROM frames MATCH_RECOGNIZE ("
        f"PARTITION BY p, anchor ORDER BY id MEASURES MATCH_NUMBER() AS mn, CLASSIFIER() AS cls, "
        f"FIRST(id) AS s, LAST(id) AS e, COUNT(*) AS n{var_measures} ONE ROW PER MATCH "
        f"AFTER MATCH SKIP TO NEXT ROW PATTERN ({'' if seek else '^'}({pattern})) {subset} {define}) "
        f"WHERE mn = 1")

    def expected(reference_rows):
        first = {(r[0], r[1]): r[2:] for r in reference_rows}
        out = []
        for p in sorted({p for p, _, _ in case.rows}):
            ids = [i for q, i, _ in case.rows if q == p]
            index = {i: k for k, i in enumerate(ids)}
            resume = 0
            for k, i in enumerate(ids):
                found = first.get((p, i)) if k >= resume else None
                if found is None or found[3] == 0:  # no match, skipped, or an empty match
                    out.append((p, i, None, None, None, 0))
                    continue
                cls, s, e, n = found[:4]
                out.append((p, i, cls, s, e, n))
                if kind == "past_last":
                    resume = index[e] + 1
                elif kind == "next_row":
                    resume = k + 1
                else:
                    target = found[4] if kind == "to_first" else found[5]
                    if target is None or index[target] <= k:
                        return None  # AFTER MATCH SKIP fails at run time
                    resume = index[target]
        return randgen.sort_rows(out)

    return window_sql, reference_sql, expected


@pytest.fixture(scope="module", params=["reference", "compiled"])
def duck(request):
    con = matchrec.connect(":memory:")
    con.cursor().execute(f"SET matchrec_fast_path = {int(request.param == 'compiled')}")
    oracle = matchrec.connect(":memory:")
    yield con, oracle
    con.close()
    oracle.close()


def check(duck, seed: int) -> None:
    con, oracle = duck
    window_sql, reference_sql, expected_of = window_case(seed)
    header = f"seed {seed}\n{window_sql}\n-- reference: {reference_sql}\n"
    try:
        reference = rows(oracle, reference_sql)
    except matchrec.Error as e:  # the oracle fails too (a matcher limit): nothing to compare
        pytest.skip(f"seed {seed}: reference failed: {e}")
    want = expected_of(reference)
    cur = con.cursor()
    try:
        cur.execute(window_sql)
        got = randgen.sort_rows(cur.fetchall())
    except matchrec.Error as e:
        assert want is None, f"{header}-- raised {type(e).__name__}: {e}\n-- expected {want}"
        return
    finally:
        cur.close()
    assert want is not None, f"{header}-- expected an AFTER MATCH SKIP error, got {got}"
    assert got == want, f"{header}-- expected {want}\n-- got {got}"


@pytest.mark.parametrize("seed", range(FAST_CASES))
def test_window_equals_anchored_matches(duck, seed):
    check(duck, seed)


@pytest.mark.slow
def test_many_window_cases(duck):
    for seed in range(1_000_000, 1_000_000 + SLOW_CASES):
        check(duck, seed)


def test_explain_names_the_window(trino):
    plan = rows(trino, f"EXPLAIN SELECT id, val OVER w FROM {PRICES} {V_SHAPE}")[0][1]
    assert "window w with PATTERN" in plan and "one match attempt per row" in plan


def test_an_undefined_window_name(trino):
    err = error_of(trino, f"SELECT id, val OVER v FROM {PRICES} {V_SHAPE}")
    assert isinstance(err, matchrec.ProgrammingError)
    assert "Window v is not defined" in str(err) and "Col 21" in str(err)


@pytest.mark.parametrize("frame", ["3 FOLLOWING", "UNBOUNDED FOLLOWING", "k FOLLOWING"])
@pytest.mark.parametrize("mode", ["INITIAL", "SEEK"])
def test_compiled_frames_equal_the_reference(frame, mode):
    """Frames that cut greedy matches, in both modes, with per-row frame ends that go back and
    forth: the compiled matcher (each start bounded by its frame end) against the reference."""
    sql = (f"SELECT p, id, n OVER w, e OVER w, count(*) OVER w FROM (SELECT range % 3 AS p, range AS id, "
           f"hash(range) % 7 AS v, (hash(range + 1) % 4)::BIGINT AS k FROM range(600)) t WINDOW w AS "
           f"(PARTITION BY p ORDER BY id MEASURES COUNT(*) AS n, LAST(id) AS e ROWS BETWEEN CURRENT ROW AND "
           f"{frame} AFTER MATCH SKIP PAST LAST ROW {mode} PATTERN (A B+ C*?) "
           f"DEFINE A AS v < 3, B AS v >= 2, C AS v <> 4)")
    con = matchrec.connect(":memory:")
    try:
        cur = con.cursor()
        cur.execute(sql)
        compiled = sorted(cur.fetchall())
        assert [s.matcher for _, s in cur.stats] == ["compiled"]
        cur.execute("SET matchrec_fast_path = 0")
        cur.execute(sql)
        assert sorted(cur.fetchall()) == compiled
        assert sum(r[2] is not None for r in compiled) > 20
    finally:
        con.close()
