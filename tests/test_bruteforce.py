"""Hand-checked tests of the brute-force oracle (tests/bruteforce.py) and of randgen.py.

The compact style: ``data[i]`` lists the variables row i satisfies ("AAB", or ["AB", "C"]);
variables mentioned nowhere in ``data`` hold on every row. Expected outputs are
(row index, match number, classifier), rows numbered from 0.
"""
from __future__ import annotations

import random
import re

import duckdb
import pytest

from bruteforce import SkipError, find_match, letter_cond, parse_pattern, run_partition
import randgen
from matchrec.parser.spec import pattern_to_text


def run(pattern: str, data, **options) -> list[tuple]:
    return run_partition(parse_pattern(pattern), len(data), letter_cond(data), **options)


def rows(*labels_and_numbers) -> list[tuple]:
    """rows((0, 1, "A"), ...) reads better than a bare list in the assertions below."""
    return list(labels_and_numbers)


# ---------------------------------------------------------------- Trino's documented examples
VALUES = [90, 80, 70, 70]


def decreasing(strict: bool):
    def cond(var, labels, start, row):  # B AS B.value < PREV(B.value); NULL before row 0
        if row == 0:
            return False
        return VALUES[row] < VALUES[row - 1] if strict else VALUES[row] <= VALUES[row - 1]
    return cond


def test_trino_b_star_shows_empty_matches():
    out = run_partition(parse_pattern("B*"), 4, decreasing(True))
    assert out == rows((0, 1, None), (1, 2, "B"), (2, 2, "B"), (3, 3, None))


def test_trino_b_plus():
    assert run_partition(parse_pattern("B+"), 4, decreasing(True)) == rows((1, 1, "B"), (2, 1, "B"))


def test_trino_reluctant_star_only_empty_matches():
    out = run_partition(parse_pattern("B*?"), 4, decreasing(True))
    assert out == rows((0, 1, None), (1, 2, None), (2, 3, None), (3, 4, None))


def test_trino_bounded_quantifier():
    out = run_partition(parse_pattern("B{,2}"), 4, decreasing(False))
    assert out == rows((0, 1, None), (1, 2, "B"), (2, 2, "B"), (3, 3, "B"))


# ---------------------------------------------------------------- preference order
def test_greedy_takes_as_many_as_possible():
    assert run("A+", "AAB") == rows((0, 1, "A"), (1, 1, "A"))


def test_reluctant_takes_as_few_as_possible():
    assert run("A+?", "AAB") == rows((0, 1, "A"), (1, 2, "A"))


def test_reluctant_still_extends_to_complete_the_match():
    assert run("A*? B", "AAB") == rows((0, 1, "A"), (1, 1, "A"), (2, 1, "B"))


def test_greedy_and_reluctant_compete_for_rows():
    any3 = ["", "", ""]  # X and Y hold everywhere
    assert run("X* Y*", any3) == rows((0, 1, "X"), (1, 1, "X"), (2, 1, "X"))
    assert run("X*? Y*", any3) == rows((0, 1, "Y"), (1, 1, "Y"), (2, 1, "Y"))
    assert run("X*? Y*?", any3) == rows((0, 1, None), (1, 2, None), (2, 3, None))
    assert run("X{2,3}? Y?", ["", "", "", ""]) == rows((0, 1, "X"), (1, 1, "X"), (2, 1, "Y"))


def test_alternation_prefers_the_leftmost_branch():
    assert run("X | Y", [""]) == rows((0, 1, "X"))
    assert run("Y | X", [""]) == rows((0, 1, "Y"))
    # a shorter preferred branch wins over a longer one...
    assert run("X | X Y", ["", ""]) == rows((0, 1, "X"), (1, 2, "X"))
    # ...unless the rest of the pattern fails, then the search backtracks into the next one
    assert run("(X | X Y) $", ["", ""]) == rows((0, 1, "X"), (1, 1, "Y"))


def test_permute_tries_orders_lexicographically():
    assert run("PERMUTE(A, B)", ["AB", "AB"]) == rows((0, 1, "A"), (1, 1, "B"))
    assert run("PERMUTE(B, A)", ["AB", "AB"]) == rows((0, 1, "B"), (1, 1, "A"))
    # A B C, A C B and B A C fail; B C A is the first to succeed (C A B would too)
    assert run("PERMUTE(A, B, C)", ["BC", "AC", "AB"]) == rows((0, 1, "B"), (1, 1, "C"), (2, 1, "A"))


def test_nested_loops_terminate_and_stay_greedy():
    data = "AAAAAAAAAB"
    assert find_match(parse_pattern("(A+)+ B"), 10, 0, letter_cond(data)) == (tuple(data), frozenset())
    assert find_match(parse_pattern("(A*)* B"), 10, 0, letter_cond(data)) == (tuple(data), frozenset())
    assert find_match(parse_pattern("(A+?)+? B"), 10, 0, letter_cond(data)) == (tuple(data), frozenset())
    never_b = lambda var, labels, start, row: var == "A"  # noqa: E731
    assert find_match(parse_pattern("((A*)*)* B"), 8, 0, never_b) is None


def test_empty_optional_iteration_ends_the_loop():
    # after "A A", a further iteration of (A*) could only be empty: the loop stops there
    assert run("(A*)*", "AAB") == rows((0, 1, "A"), (1, 1, "A"), (2, 2, None))


def test_mandatory_iterations_may_be_empty():
    assert run("(A?){2}", "BA") == rows((0, 1, None), (1, 2, "A"))
    assert run("(A?){2} B", "AB") == rows((0, 1, "A"), (1, 1, "B"))


# Empty iterations, Trino's way (see the module docstring of bruteforce.py). The "fail" rule
# is shown alongside where it differs.
def test_first_looping_iteration_empty_ends_the_loop():
    # iteration 1 of * takes the empty way through A? (preferred to B), then must stop
    assert run("(A? | B)*", "BA") == rows((0, 1, None), (1, 2, "A"))
    assert run("(A? | B)*", "BA", empty_iterations="fail") == rows((0, 1, "B"), (1, 1, "A"))
    # with min = 1 the looping copy is the first one: empty there means no more iterations
    assert run("(D*?)+", "DDD") == rows((0, 1, None), (1, 2, None), (2, 3, None))
    assert run("(D*?)+", "DDD", empty_iterations="fail") == rows((0, 1, "D"), (1, 1, "D"), (2, 1, "D"))


def test_later_empty_looping_iteration_is_a_failed_path():
    # iteration 2 cannot be the empty way through B?, so A is tried next
    assert run("(B? | A)*", "BA") == rows((0, 1, "B"), (1, 1, "A"))


def test_bounded_quantifiers_allow_empty_optional_iterations():
    assert run("(A? | B){1,3}", "AB") == rows((0, 1, "A"), (1, 2, None))
    assert run("(A? | B){1,3}", "AB", empty_iterations="fail") == rows((0, 1, "A"), (1, 1, "B"))


# ---------------------------------------------------------------- exclusion and anchors
def test_exclusion_hides_rows_from_all_rows_per_match():
    assert run("A {- B+ -} C", "ABBC") == rows((0, 1, "A"), (3, 1, "C"))
    assert run("A {- B+ -} C", "ABBC", rows_per_match="one") == rows((None, 1, "C"))
    assert run("A {- B -}", "AB", rows_per_match="one") == rows((None, 1, "B"))
    labels, excluded = find_match(parse_pattern("A {- B+ -} C"), 4, 0, letter_cond("ABBC"))
    assert labels == ("A", "B", "B", "C") and excluded == {1, 2}


def test_skip_to_an_excluded_variable():
    out = run("A {- B -} C", "ABCABC", skip=("to_first", "B"))
    assert out == rows((0, 1, "A"), (2, 1, "C"), (3, 2, "A"), (5, 2, "C"))


def test_anchors():
    assert run("^ A", "AAA", skip="next_row") == rows((0, 1, "A"))
    assert run("A $", "AAA", skip="next_row") == rows((2, 1, "A"))
    assert run("A+ $", "AAA") == rows((0, 1, "A"), (1, 1, "A"), (2, 1, "A"))
    assert run("A* $", "BA") == rows((1, 1, "A"))
    assert run("^ A*", "BA", empty_matches="unmatched") == rows((0, 1, None), (1, None, None))


# ---------------------------------------------------------------- empty matches and output modes
def test_empty_match_options():
    assert run("A*", "BAB") == rows((0, 1, None), (1, 2, "A"), (2, 3, None))
    assert run("A*", "BAB", empty_matches="omit") == rows((1, 2, "A"))
    assert run("A*", "BAB", empty_matches="unmatched") == rows((0, 1, None), (1, 2, "A"), (2, 3, None))
    assert run("A*", "BAB", rows_per_match="one") == rows((None, 1, None), (None, 2, "A"), (None, 3, None))
    assert run("()", "BB") == rows((0, 1, None), (1, 2, None))


def test_unmatched_rows_inside_an_earlier_match_are_not_output():
    out = run("A B+", ["A", "B", "B", "C"], skip="next_row", empty_matches="unmatched")
    assert out == rows((0, 1, "A"), (1, 1, "B"), (2, 1, "B"), (3, None, None))
    out = run("A B", "CAB", empty_matches="unmatched")
    assert out == rows((0, None, None), (1, 1, "A"), (2, 1, "B"))
    assert run("A B", "CAB") == rows((1, 1, "A"), (2, 1, "B"))


# ---------------------------------------------------------------- AFTER MATCH SKIP
DATA = ["A", "B", "AB", "B"]
FIRST = [(0, 1, "A"), (1, 1, "B"), (2, 1, "B"), (3, 1, "B")]


def test_skip_past_last_row():
    assert run("A B+", DATA) == FIRST


def test_skip_to_next_row():
    assert run("A B+", DATA, skip="next_row") == FIRST + [(2, 2, "A"), (3, 2, "B")]


def test_skip_to_first_and_last_variable():
    assert run("A B+", DATA, skip=("to_first", "B")) == FIRST + [(2, 2, "A"), (3, 2, "B")]
    assert run("A B+", DATA, skip=("to_last", "B")) == FIRST
    assert run("A B+", DATA, skip=("to_last", "U"), subsets={"U": ("A", "B")}) == FIRST


def test_skip_errors():
    with pytest.raises(SkipError, match="first row"):
        run("A B+", DATA, skip=("to_first", "A"))
    with pytest.raises(SkipError, match="first row"):
        run("A B+", DATA, skip=("to_first", "U"), subsets={"U": ("A", "B")})
    with pytest.raises(SkipError, match="not present"):
        run("A B+ C*", ["A", "B", "BC"], skip=("to_last", "C"))
    # empty matches never skip, so they cannot fail
    never = lambda var, labels, start, row: False  # noqa: E731
    out = run_partition(parse_pattern("C*"), 2, never, skip=("to_first", "C"))
    assert out == rows((0, 1, None), (1, 2, None))


# ---------------------------------------------------------------- running semantics
def test_condition_sees_the_current_row_tentatively_labelled():
    at_most_two = lambda var, labels, start, row: labels.count("A") <= 2  # noqa: E731
    out = run_partition(parse_pattern("A+"), 5, at_most_two)
    assert out == rows((0, 1, "A"), (1, 1, "A"), (2, 2, "A"), (3, 2, "A"), (4, 3, "A"))
    seen = []
    find_match(parse_pattern("A B"), 2, 0, lambda var, labels, start, row: seen.append(labels) or True)
    assert seen == [("A",), ("A", "B")]


# ---------------------------------------------------------------- helpers and randgen
@pytest.mark.parametrize("text", ["A B* C", "(A+)+ B", "A{0,2}? | B{3,} C{2,4} | D{2}",
                                  "{- A -} PERMUTE(A, B | C) ^ $ ()", "(A B)*?", "A{,2}"])
def test_parse_pattern_round_trips(text):
    node = parse_pattern(text)
    assert pattern_to_text(parse_pattern(pattern_to_text(node))) == pattern_to_text(node)


def test_random_patterns_round_trip_through_text():
    rng = random.Random(7)
    for _ in range(500):
        text = pattern_to_text(randgen.random_pattern(rng))
        assert pattern_to_text(parse_pattern(text)) == text


def test_random_cases_are_deterministic_and_computable():
    for seed in range(300):
        case = randgen.random_case(seed)
        assert case.sql() == randgen.random_case(seed).sql()
        assert "DEFINE" in case.sql()
        try:
            out = case.expected(budget=200_000)
        except SkipError:
            continue
        assert all(len(r) == len(case.columns) for r in out)


def test_condition_three_valued_logic():
    prev_a = randgen.Cond("contains(PREV(c), 'A')",
                          lambda rows, l, s, r: randgen._contains(rows[r - 1][1] if r else None, "A"))
    data = [(1, "A"), (2, "")]
    assert randgen._not(prev_a).fn(data, ("X",), 0, 0) is None  # NOT NULL is NULL, not true
    assert randgen._not(prev_a).fn(data, ("X", "X"), 0, 1) is False
    false = randgen.Cond("false", lambda *a: False)
    true = randgen.Cond("true", lambda *a: True)
    assert randgen._and(prev_a, false).fn(data, ("X",), 0, 0) is False
    assert randgen._or(prev_a, true).fn(data, ("X",), 0, 0) is True
    assert randgen._or(prev_a, false).fn(data, ("X",), 0, 0) is None


def test_history_free_conditions_agree_with_duckdb():
    """Conditions that only look at rows (not at labels) can be checked in plain DuckDB,
    with PREV/NEXT spelled as lag/lead: this checks their Python twins' NULL handling."""
    rng = random.Random(3)
    con = duckdb.connect()
    checked = 0
    for _ in range(400):
        data = [(i + 1, c) for _, i, c in randgen.random_rows(rng)] or [(1, "")]
        cond = randgen.random_condition(rng, "A", {"A": frozenset("A")})
        if re.search(r"count|FIRST|LAST|CLASSIFIER|\.id", cond.sql):
            continue
        sql = re.sub(r"PREV\(c(, \d)?\)", lambda m: f"lag(c{m.group(1) or ''}) OVER w", cond.sql)
        sql = sql.replace("NEXT(c)", "lead(c) OVER w")
        values = ", ".join(f"({i}, '{c}')" for i, c in data)
        got = con.sql(f"SELECT ({sql}) IS TRUE FROM (VALUES {values}) t(id, c) "
                      "WINDOW w AS (ORDER BY id) ORDER BY id").fetchall()
        want = [cond.fn(data, ("A",), r, r) is True for r in range(len(data))]
        assert [g for (g,) in got] == want, (cond.sql, data)
        checked += 1
    assert checked > 100
