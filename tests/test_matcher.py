"""The reference matcher on compact inputs: each row is the set of letters it satisfies.

``run("A B+ C", "A B B C")`` matches the pattern against rows where row i satisfies the
letters of the i-th word, and returns the preferred match as a string of labels.
"""
from __future__ import annotations

import time

import pytest

from matchrec.operators.matcher import Matcher, MatchLimitExceeded
from matchrec.operators.program import compile_pattern
from matchrec.planner.pattern import lower
from matchrec.parser import spec as S
from matchrec.parser.query import split


def program_of(pattern: str):
    spec = split(f"SELECT * FROM t MATCH_RECOGNIZE (PATTERN ({pattern}))").clauses[0].spec
    labels = S.pattern_labels(spec.pattern)
    return compile_pattern(lower(spec.pattern, {n: i for i, n in enumerate(labels)}), labels), labels


def run(pattern: str, rows: str, start: int = 0, history=None):
    program, labels = program_of(pattern)
    words = rows.split()
    dependent = [history is not None] * len(labels)

    def evaluate(label, node, row):
        name = labels[label]
        ok = name in words[row] or words[row] == "*"
        return ok and (history is None or history(name, node.to_list(), labels))

    result = Matcher(program, dependent).find(start, len(words), evaluate)
    if result is None:
        return None
    return " ".join(labels[i] for i in result.labels)


@pytest.mark.parametrize("pattern,rows,expected", [
    ("A B+ C", "A B B C", "A B B C"),
    ("A B+? B", "A B B B", "A B B"),  # reluctant: fewest B before the final B
    ("A B* B", "A B B B", "A B B B"),
    ("A B*?", "A B B", "A"),
    ("A B??", "A B", "A"),
    ("A B?", "A B", "A B"),
    ("(A | B) C", "AB C", "A C"),  # alternation prefers the left branch
    ("(B | A) C", "AB C", "B C"),
    ("(A | AB)", "A", "A"),
    ("A{2,3}", "A A A A", "A A A"),
    ("A{2,3}?", "A A A A", "A A"),
    ("A{,2} B", "A A B", "A A B"),
    ("A{3}", "A A", None),
    ("PERMUTE(A, B, C)", "C B A", "C B A"),
    ("PERMUTE(A, B)", "AB AB", "A B"),  # lexicographic order of the permutations
    ("PERMUTE(B, A)", "AB AB", "B A"),
    ("^ A", "A A", "A"),
    ("A $", "A A", None),
    ("A+ $", "A A", "A A"),
    ("A*", "B", ""),  # empty match
    ("()", "A", ""),
    ("(A | ()) B", "B", "B"),
    ("(A*)*", "A A", "A A"),
    ("(A?){2,}", "B", ""),
    ("(A+)+ B", "A A A A", None),
    ("A {- B+ -} C", "A B B C", "A B B C"),
])
def test_preferment(pattern, rows, expected):
    assert run(pattern, rows) == expected


def test_anchor_only_at_partition_start():
    assert run("^ A", "A A", start=1) is None
    assert run("A", "A A", start=1) == "A"


def test_exclusion_ranges():
    program, labels = program_of("A {- B+ -} C {- D -}")
    words = "A B B C D".split()
    result = Matcher(program, [False] * 4).find(0, 5, lambda l, n, r: labels[l] in words[r])
    assert result.exclusions == [(1, 3), (4, 5)]


def test_nested_exclusions_mark_the_outer_range():
    program, labels = program_of("A {- {- B -} C -}")
    words = "A B C".split()
    result = Matcher(program, [False] * 3).find(0, 3, lambda l, n, r: labels[l] in words[r])
    assert result.exclusions == [(1, 3)]


def test_history_dependent_conditions_are_not_pruned_away():
    # X matches only if exactly two B came before it: threads with different labels must survive
    def history(name, labels_so_far, labels):
        if name != "X":
            return True
        return sum(1 for l in labels_so_far[:-1] if labels[l] == "B") == 2
    assert run("(A | B)* X", "AB AB AB X", history=history) == "A B B X"


def test_exponential_pattern_is_pruned():
    # (A+)+ B over many rows of A: without pruning of equivalent threads this never finishes
    started = time.perf_counter()
    assert run("(A+)+ B", " ".join(["A"] * 300)) is None
    assert run("((A | A)+)+ (B | A)", " ".join(["A"] * 200)) == " ".join(["A"] * 200)
    assert time.perf_counter() - started < 30  # generous: a correctness guard, not a benchmark


def test_thread_limit():
    program, labels = program_of("(A | B)+ C")
    with pytest.raises(MatchLimitExceeded):
        Matcher(program, [True] * 3, max_threads=8).find(0, 20, lambda l, n, r: labels[l] != "C")
