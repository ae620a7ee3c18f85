"""What keeps a small statement's fixed cost low gives the results, errors and interrupts of the
long way: parsed MATCH_RECOGNIZE bodies kept by their text (engine cannot corrupt the kept one),
a small chunk's kernel run on the calling thread under a step cap (matched again on a worker past
it), and a small input read without the read-ahead thread."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import matchrec
from matchrec import budget as work
from matchrec.engine import executor, fast
from matchrec.parser import body
from matchrec.parser.spec import Span
from matchrec.planner.plan import build_plan
from matchrec.connectors.duckdb_source import DuckDBOracle


@pytest.fixture
def cur():
    con = matchrec.connect()
    yield con.cursor()
    con.close()


def _table(cur, n: int) -> None:
    cur.execute(f"CREATE OR REPLACE TABLE t AS SELECT range AS id, (range * 7919) % 1000 AS v FROM range({n})")


SUM = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n, sum(A.v) AS s ONE ROW PER MATCH "
       "PATTERN (A+) DEFINE A AS sum(A.v) < 20000)")
ALTERNATION = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES first(id) AS s, last(id) AS e "
               "ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW PATTERN ((A|B)* C) "
               "DEFINE A AS v >= 0, B AS v >= 0, C AS v {}) ")


# ---------------------------------------------------------------- parsed bodies kept
def test_a_kept_body_is_equal_and_not_changed_by_planning(cur):
    _table(cur, 10)
    text = "ORDER BY id MEASURES sum(A.v) AS s ONE ROW PER MATCH PATTERN (A+ B) DEFINE A AS A.v > PREV(A.v) + 1"
    body._PARSED.clear()
    first = body.parse_body(text, 0, text, "duckdb", Span(0, len(text)))
    before = [d.expression.tree.sql() for d in first.definitions] + [m.expression.tree.sql() for m in first.measures]
    # planning reads (and may rewrite) the trees of its own copy
    build_plan(first, [("id", "BIGINT"), ("v", "BIGINT")], DuckDBOracle(cur.connection._duck))
    for d in first.definitions:  # what any caller may do to its copy must not reach the kept spec
        d.expression.tree.set("this", None)
    second = body.parse_body(text, 0, text, "duckdb", Span(0, len(text)))
    assert second == first and len(body._PARSED) == 1
    assert second.definitions[0].expression.tree is not first.definitions[0].expression.tree
    after = [d.expression.tree.sql() for d in second.definitions] + [m.expression.tree.sql() for m in second.measures]
    assert after == before


def test_a_statement_run_twice_parses_once_and_answers_the_same(cur, monkeypatch):
    _table(cur, 300)
    calls = []
    parse = body._parse_body
    monkeypatch.setattr(body, "_parse_body", lambda *a: calls.append(a) or parse(*a))
    body._PARSED.clear()
    cur.execute(SUM)
    once = cur.fetchall()
    cur.execute(SUM)
    assert cur.fetchall() == once and len(calls) == 1
    cur.execute("SET matchrec_fast_path = 0")
    cur.execute(SUM)
    assert cur.fetchall() == once


def test_a_kept_body_still_reports_errors_where_they_are(cur):
    _table(cur, 10)
    bad = SUM.replace("sum(A.v) < 20000", "sum(A.w) < 5")
    messages = []
    for _ in range(2):
        with pytest.raises(matchrec.ProgrammingError) as info:
            cur.execute(bad)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and f"Col {bad.index('A.w') + 3}." in messages[0]


# ---------------------------------------------------------------- small inputs on the calling thread
def _no_workers():
    raise AssertionError("a small chunk went to a worker thread")


def test_a_small_input_is_matched_and_read_on_the_calling_thread(cur, monkeypatch):
    _table(cur, 20_000)
    cur.execute(SUM)
    expected = cur.fetchall()
    monkeypatch.setattr(fast, "_workers", _no_workers)
    started = threading.active_count()
    seen = []
    monkeypatch.setattr(executor, "_read_ahead", lambda *a, **k: seen.append(1) or iter(()))
    cur.execute(SUM)
    assert cur.fetchall() == expected and not seen
    assert cur.stats[0][1].matcher == "compiled"
    assert threading.active_count() == started


def test_past_the_step_cap_a_worker_matches_again_with_the_same_result_and_budget(cur, monkeypatch):
    _table(cur, 600)
    sql = ALTERNATION.format("= 999")
    assert 1_000 < _steps_of(cur, sql) < fast.INLINE_STEPS
    cur.execute("SET matchrec_fast_path = 0")
    cur.execute(sql)
    reference = cur.fetchall()
    cur.execute("SET matchrec_fast_path = 1")
    used = []
    workers = fast._workers
    monkeypatch.setattr(fast, "_workers", lambda: used.append(1) or workers())
    cur.execute(sql)
    assert cur.fetchall() == reference and reference and not used  # within the cap: inline
    steps = cur.stats[0][1]
    needed = _steps_of(cur, sql)  # all on the calling thread
    monkeypatch.setattr(fast, "INLINE_STEPS", 50)
    cur.execute(sql)
    assert cur.fetchall() == reference and used  # past it: again on a worker
    # the capped attempt (at least a poll's 4,096 steps) is not charged: a budget the worker
    # alone fits in still suffices
    assert steps.matcher == "compiled" and _steps_of(cur, sql) == needed
    cur.execute(f"SET matchrec_max_steps = {needed + 1_000}")
    cur.execute(sql)
    assert cur.fetchall() == reference


def _steps_of(cur, sql: str) -> int:
    spent = []
    statement = work.statement

    class Recording:
        def __init__(self, settings):
            self.inner = statement(settings)

        def __enter__(self):
            self.budget = self.inner.__enter__()
            return self.budget

        def __exit__(self, *exc):
            spent.append(self.budget.steps)
            return self.inner.__exit__(*exc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(work, "statement", Recording)
        cur.execute(sql)
        cur.fetchall()
    return spent[0]


def test_ctrl_c_stops_an_exploding_pattern_on_a_small_input(cur):
    # 20,000 rows are few enough to start on the calling thread, where the kernel cannot see Ctrl-C;
    # the step cap hands it to a worker thread, which the waiting thread stops
    _table(cur, 20_000)
    cur.execute("SET matchrec_max_steps = 1_000_000_000_000")
    cur.execute(ALTERNATION.format("= 5"))
    cur.fetchall()

    def send():
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        cur.execute(ALTERNATION.format("< 0"))
    sender.join()
    assert time.perf_counter() - started < 5
    cur.execute("SELECT count(*) FROM t")
    assert cur.fetchall() == [(20_000,)]


# ---------------------------------------------------------------- plans kept by text
def test_a_statement_run_again_reuses_its_plan_until_the_catalog_changes(cur, monkeypatch):
    from matchrec.engine import statement
    _table(cur, 300)
    calls = []
    build = statement.build_plan
    monkeypatch.setattr(statement, "build_plan", lambda *a: calls.append(1) or build(*a))
    cur.execute(SUM)
    once = cur.fetchall()
    cur.execute(SUM)
    assert cur.fetchall() == once and len(calls) == 1
    cur.execute("SET matchrec_prefilter = 0")  # another setting: planned again
    cur.execute(SUM)
    assert cur.fetchall() == once and len(calls) == 2
    # a table of the same name with other types: the catalog moved, the plan follows it
    cur.execute("CREATE OR REPLACE TABLE t AS SELECT range AS id, ((range * 7919) % 1000)::DOUBLE / 2 AS v "
                "FROM range(300)")
    cur.execute(SUM)
    halves = cur.fetchall()
    assert len(calls) == 3 and halves != once and isinstance(halves[0][1], float)


def test_a_plan_resting_on_data_is_not_kept(cur):
    # the value of a subquery in DEFINE is read when the statement is planned: that plan is not kept
    from matchrec.engine import statement
    _table(cur, 300)
    cur.execute("CREATE TABLE lim AS SELECT 100 AS x")
    kept = {}
    for bound in ("(SELECT max(x) FROM lim)", "100"):
        sql = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n ONE ROW PER MATCH "
               f"PATTERN (A+) DEFINE A AS A.v < {bound})")
        cur.execute(sql)
        rows = cur.fetchall()
        kept[bound] = any(key[0] == sql for plans in statement._PLANS.values() for key in plans)
        cur.execute(sql)
        assert cur.fetchall() == rows
    assert kept == {"(SELECT max(x) FROM lim)": False, "100": True}
