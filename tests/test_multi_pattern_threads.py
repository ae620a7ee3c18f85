"""The shared operator on threads (``Evaluator.run`` with ``threads``): the roots' trees and the parts
of a range cut at keys, run by forks of the evaluator, give the tables one thread gives, through
``run_many`` and through a cursor; limits and failures in any thread stop every thread and raise
as one thread does; the closed-form counts on threads as well. ``PART_ROWS`` and ``THREAD_ROWS`` are
lowered so that the small random tables are cut too."""
from __future__ import annotations

import random
import threading
import time

import numpy as np

import pytest

import matchrec
from matchrec.operators import cer_shared as O
from tests.test_multi_pattern import Workload, alone, make_table


@pytest.fixture
def parts(monkeypatch):
    """Ranges cut into parts of at least 3 rows, and reads of 3 rows or more on threads; the forks
    made, in a list."""
    monkeypatch.setattr(O, "PART_ROWS", 3)
    monkeypatch.setattr(O, "THREAD_ROWS", 3)
    made = []
    fork = O.Evaluator._fork

    def spy(self, spend):
        got = fork(self, spend)
        made.append(got)
        return got
    monkeypatch.setattr(O.Evaluator, "_fork", spy)
    return made


@pytest.mark.parametrize("seed", range(6))
def test_parts_on_threads_equal_the_statements_alone(parts, seed):
    rng = random.Random(seed)
    con = matchrec.connect()
    try:
        make_table(con, rng)
        stmts = Workload(rng, rng.randint(8, 30)).statements()
        want, kept = [], []
        for s in stmts:
            try:
                want.append(alone(con, s))
                kept.append(s)
            except matchrec.Error:
                continue
        con.cursor().execute(f"SET threads = {rng.choice([2, 3, 4])}")
        got = matchrec.run_many(con, kept, budget=0.02, slice_events=rng.choice([None, 9]))
        for s, g, w in zip(kept, got.tables, want):
            assert g.equals(w), f"seed {seed}\n{s}"
        for s, w in zip(kept, want):  # the cursor's batch operator runs in parts as well
            assert con.cursor().execute(s).fetch_arrow_table().equals(w), f"seed {seed}\n{s}"
    finally:
        con.close()
    assert parts  # ranges were cut


def _ticks(con, n: int = 400) -> None:
    rng = random.Random(7)
    rows = ", ".join(f"({i}, '{rng.choice('AB')}', {rng.randint(0, 9)})" for i in range(n))
    con.cursor().execute(f"CREATE TABLE ev AS SELECT * FROM (VALUES {rows}) t(ts, type, price)")


STMTS = ["PATTERN SEQ(A a, B b, A c) FROM ev TYPE type ORDER BY ts WITHIN 40 RETURN COUNT(*)",
         "PATTERN SEQ(A a, B b) FROM ev TYPE type ORDER BY ts WHERE b.price > a.price WITHIN 30 "
         "RETURN a.ts, b.ts AS last"]


def _outcome(con, stmts):
    try:
        return matchrec.run_many(con, stmts).tables
    except matchrec.Error as err:
        return type(err), str(err)


@pytest.mark.parametrize("setting, value", [("matchrec_max_steps", 200), ("matchrec_cer_max_matches", 1_000)])
def test_a_limit_reached_in_any_part_raises_as_one_thread_does(parts, setting, value):
    con = matchrec.connect()
    try:
        _ticks(con)
        con.cursor().execute(f"SET {setting} = {value}")
        con.cursor().execute("SET threads = 1")
        one = _outcome(con, STMTS)
        before = threading.active_count()
        con.cursor().execute("SET threads = 4")
        many = _outcome(con, STMTS)
        assert isinstance(one, tuple) and many == one
        assert parts and threading.active_count() == before  # every part joined
    finally:
        con.close()


def _raises_on_three_threads(kind, match=None) -> bool:
    """``run_many`` of ``STMTS`` on three threads raises ``kind``; whether every thread ended."""
    con = matchrec.connect()
    try:
        _ticks(con)
        con.cursor().execute("SET threads = 3")
        before = threading.active_count()
        with pytest.raises(kind, match=match):
            matchrec.run_many(con, STMTS)
        return threading.active_count() == before
    finally:
        con.close()


def test_a_failure_in_another_thread_stops_the_others_and_reaches_the_caller(parts, monkeypatch):
    run = O.Evaluator._run

    def failing(self, roots, lo, hi):
        if any(self is f for f in parts):
            raise matchrec.DataError("a part failed")
        return run(self, roots, lo, hi)
    monkeypatch.setattr(O.Evaluator, "_run", failing)
    assert _raises_on_three_threads(matchrec.DataError, "a part failed") and parts


def test_an_interrupt_of_the_calling_thread_stops_the_others(parts, monkeypatch):
    """Ctrl-C reaches the calling thread's task: the other threads, still busy, are stopped at
    their next step (not left running after the statement) and the interrupt reaches the caller."""
    run = O.Evaluator._run
    stopped, entered = [], []

    def busy(self, roots, lo, hi):
        if not any(self is f for f in parts):
            for _ in range(500):  # the interrupt once every other thread is inside a task
                if len(entered) == len(parts):
                    break
                time.sleep(0.01)
            raise KeyboardInterrupt()
        entered.append(1)
        for _ in range(5_000_000):  # a long task: steps until told to stop
            try:
                self.spend(1)
            except BaseException:
                stopped.append(1)
                raise
        return run(self, roots, lo, hi)
    monkeypatch.setattr(O.Evaluator, "_run", busy)
    assert _raises_on_three_threads(KeyboardInterrupt) and parts and len(stopped) == len(parts)


COUNTS = ["PATTERN SEQ(A a, B b, A c) FROM ev TYPE type ORDER BY ts WITHIN 40 RETURN COUNT(*)",
          "PATTERN SEQ(B a, A b) FROM ev TYPE type ORDER BY ts WITHIN 30 RETURN COUNT(*)",
          "PATTERN SEQ(A a, A b, B c, B d) FROM ev TYPE type ORDER BY ts WITHIN 20 RETURN COUNT(*)"]


def test_a_failure_in_a_counting_thread_reaches_the_caller(parts, monkeypatch):
    """The closed-form counts run on threads too (``multi_eval._each``): their tables equal one
    thread's, and a failure in a thread that is not the caller's reaches the caller once every
    thread has ended."""
    from matchrec.engine import multi_eval as E
    con = matchrec.connect()
    try:
        _ticks(con)
        con.cursor().execute("SET threads = 1")
        one = matchrec.run_many(con, COUNTS).tables
        con.cursor().execute("SET threads = 2")
        counted, names = E._closed_form, []

        def spy(*a):
            names.append(threading.current_thread().name)
            return counted(*a)
        monkeypatch.setattr(E, "_closed_form", spy)
        many = matchrec.run_many(con, COUNTS).tables
        assert all(a.equals(b) for a, b in zip(one, many)) and len(names) >= 3

        failed = threading.Event()

        def failing(*a):
            if threading.current_thread().name == "matchrec-counts":
                failed.set()
                raise matchrec.DataError("a count failed")
            failed.wait(5)  # the caller's thread holds its unit until the other one took one
            return counted(*a)
        monkeypatch.setattr(E, "_closed_form", failing)
        before = threading.active_count()
        with pytest.raises(matchrec.DataError, match="a count failed"):
            matchrec.run_many(con, COUNTS)
        assert threading.active_count() == before
    finally:
        con.close()


ROWS = ["PATTERN SEQ(A a, B b) FROM ev TYPE type ORDER BY ts WITHIN 30 RETURN a.ts, b.ts AS last",
        "PATTERN SEQ(B a, A b, B c) FROM ev TYPE type ORDER BY ts WHERE c.price > a.price WITHIN 20 "
        "RETURN a.ts, c.ts AS last",
        "PATTERN SEQ(A a, A b) FROM ev TYPE type ORDER BY ts WITHIN 10 RETURN COUNT(*)",
        "PATTERN SEQ(A a, B+ b, A c) FROM ev TYPE type ORDER BY ts WITHIN 12 RETURN a.ts, c.ts AS last"]


def test_the_tables_built_on_threads_equal_one_threads_and_the_first_error_in_order_is_raised(monkeypatch):
    """``run_many`` builds its statements' tables on threads once the group's matches are many
    (``BUILD_THREADED_ROWS``, lowered here): the tables equal one thread's and the cursor's; when
    two statements' tables fail, the error of the first of them in the workload's order is raised,
    whichever thread failed first."""
    from matchrec.engine import multi as MU
    monkeypatch.setattr(MU, "BUILD_THREADED_ROWS", 0)
    con = matchrec.connect()
    try:
        _ticks(con)
        con.cursor().execute("SET threads = 1")
        one = matchrec.run_many(con, ROWS).tables
        want = [con.cursor().execute(s).fetch_arrow_table() for s in ROWS]
        con.cursor().execute("SET threads = 3")
        built, names, entered = MU.E.build_result, [], threading.Event()

        def spy(plan, table, matches):
            names.append(threading.current_thread().name)
            if threading.current_thread().name == "matchrec-results":
                entered.set()
            else:  # the calling thread holds its table until a thread took another
                entered.wait(5)
            return built(plan, table, matches)
        monkeypatch.setattr(MU.E, "build_result", spy)
        many = matchrec.run_many(con, ROWS).tables
        assert all(a.equals(b) for a, b in zip(one, many)) and all(a.equals(b) for a, b in zip(many, want))
        assert len(names) == 3 and "matchrec-results" in names  # the three tables of rows, one on a thread

        later_failed = threading.Event()

        def failing(plan, table, matches):
            q = plan.query
            if len(q.elements) == 2:  # the first statement fails, once the last one has failed
                later_failed.wait(5)
                raise matchrec.DataError("the first statement's table")
            if not q.conditions:  # the last statement (a closure, no condition) fails at once
                later_failed.set()
                raise matchrec.DataError("the last statement's table")
            return built(plan, table, matches)
        monkeypatch.setattr(MU.E, "build_result", failing)
        with pytest.raises(matchrec.DataError, match="the first statement's table"):
            matchrec.run_many(con, ROWS)
    finally:
        con.close()


def test_a_closures_prime_tables_asked_for_at_once_are_each_made_once_in_order():
    """Statements counted on threads ask for a closure's tables modulo the primes at once
    (``cer_sequences._factors``): every caller gets the table of each prime in order, as one
    thread does (a second thread appending its own first prime's table after the first thread's
    made the count of a closure wrong)."""
    import sys

    from matchrec.operators import cer_sequences as C
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the race shows in most runs without the lock
    try:
        rng = np.random.default_rng(4)
        ck = np.sort(rng.integers(0, 40_000, 60_000))
        want = C._factors(ck)[2](3)  # per prime: (running products, running inverses)
        for _ in range(25):
            tables = C._factors(ck)[2]
            got, start = [], threading.Barrier(4)

            def ask():
                start.wait()
                got.append(tables(3))
            workers = [threading.Thread(target=ask) for _ in range(4)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            assert len(got) == 4
            for g in got:
                assert len(g) == 3 and all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(g, want))
    finally:
        sys.setswitchinterval(interval)
