"""Differential tests: matchrec (through its DB-API, DuckDB dialect) against the brute force.

Each case is a seeded random query from randgen.py; the brute force of bruteforce.py says
what it must return (compared as sorted multisets) or that it must fail at run time (AFTER
MATCH SKIP TO errors). A failure message carries the seed, the SQL and both results, so
``randgen.random_case(seed).sql()`` reproduces it.

  .venv/bin/pytest tests/test_differential.py                 300 cases, on each matcher
  .venv/bin/pytest tests/test_differential.py -m slow         20,000 more (MATCHREC_DIFF_CASES)
"""
from __future__ import annotations

import collections
import os

import pytest

import matchrec
import randgen
from bruteforce import BudgetExceeded, SkipError

BUDGET = 200_000  # brute-force search steps per start row; a few pathological cases skip
FAST_CASES = 150
SLOW_CASES = int(os.environ.get("MATCHREC_DIFF_CASES", "20000"))
SLOW_FIRST_SEED = 1_000_000  # disjoint from the fast seeds


@pytest.fixture(scope="module", params=["reference", "compiled"])
def connection(request):
    """Every case runs twice: on the reference matcher and on the fast path (compiled matcher)."""
    con = matchrec.connect(":memory:")
    con.cursor().execute(f"SET matchrec_fast_path = {int(request.param == 'compiled')}")
    yield con
    con.close()


class Skipped(Exception):
    pass


def run_query(con, sql: str) -> tuple[list | None, str | None, bool]:
    """(sorted rows, None, _) or (None, error text, is a matchrec.Error).

    Only text leaves this function: a live exception keeps its traceback, and through it
    the engine's open result, which would make the shared connection refuse new queries."""
    cur = con.cursor()
    try:
        cur.execute(sql)
        return randgen.sort_rows(cur.fetchall()), None, False
    except Exception as e:  # anything but matchrec.Error is a bug even when an error is due
        return None, f"{type(e).__name__}: {e}", isinstance(e, matchrec.Error)
    finally:
        cur.close()


def check(con, seed: int) -> None:
    """Raise AssertionError (with a reproducible message) if matchrec disagrees."""
    case = randgen.random_case(seed)
    sql = case.sql()
    try:
        expected, error = case.expected(BUDGET), None
    except SkipError as e:
        expected, error = None, str(e)
    except BudgetExceeded:
        raise Skipped(f"seed {seed}: brute force gave up")
    header = f"seed {seed}, columns {case.columns}\n{sql}\n"
    got, failure, is_matchrec_error = run_query(con, sql)
    want = f"a runtime error ({error})" if error else f"({len(expected)} rows): {expected}"
    if failure is not None:
        if error is not None and is_matchrec_error:
            return
        raise AssertionError(f"{header}-- matchrec raised {failure}\n-- expected {want}")
    if error is not None:
        raise AssertionError(f"{header}-- expected {want}\n"
                             f"-- matchrec returned ({len(got)} rows): {got}")
    if got != expected:
        missing = collections.Counter(expected) - collections.Counter(got)
        extra = collections.Counter(got) - collections.Counter(expected)
        raise AssertionError(f"{header}-- expected {want}\n"
                             f"-- matchrec ({len(got)} rows): {got}\n"
                             f"-- missing: {sorted(missing.elements(), key=repr)}\n"
                             f"-- extra: {sorted(extra.elements(), key=repr)}")


@pytest.mark.parametrize("seed", range(FAST_CASES))
def test_random_case(connection, seed):
    try:
        check(connection, seed)
    except Skipped as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_many_random_cases(connection):
    failures, skipped = [], 0
    for seed in range(SLOW_FIRST_SEED, SLOW_FIRST_SEED + SLOW_CASES):
        try:
            check(connection, seed)
        except Skipped:
            skipped += 1
        except AssertionError as e:
            failures.append(str(e))
            if len(failures) >= 20:
                break
    assert not failures, (f"{len(failures)} failing cases (stopped at 20); the first ones:\n\n"
                          + "\n\n".join(failures[:5]))
    assert skipped < SLOW_CASES // 100, f"the brute force gave up on {skipped} cases"
