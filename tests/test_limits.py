"""The work budget: runaway patterns stop at matchrec_max_steps or matchrec_max_memory_mb with an
OperationalError naming the setting, sizes are checked before expansion, and Ctrl-C stops a
statement (compiled matcher, reference matcher, DuckDB) leaving the connection usable."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import matchrec
from matchrec import budget as work
from matchrec.operators.cer_reference import And, Element, alternatives, count_alternatives, orders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LETTERS = "ABCDEFGHIJK"


def _table(cur, n: int, value: str = "(range * 7919) % 1000") -> None:
    cur.execute(f"CREATE OR REPLACE TABLE t AS SELECT range AS id, {value} AS v FROM range({n})")


def _mr(pattern: str, define: str, measures: str = "count(*) AS c") -> str:
    return f"""SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES {measures} ONE ROW PER MATCH
        AFTER MATCH SKIP PAST LAST ROW PATTERN ({pattern}) DEFINE {define})"""


ALTERNATION = _mr("(A|B)* C", "A AS v >= 0, B AS v >= 0, C AS v < 0")
ALTERNATION_MATCHING = _mr("(A|B)* C", "A AS v >= 0, B AS v >= 0, C AS v = 999", "first(id) AS s, last(id) AS e")


@pytest.fixture
def cur():
    con = matchrec.connect()
    yield con.cursor()
    con.close()


# ---------------------------------------------------------------- steps
def test_runaway_alternation_stops_at_the_step_budget(cur):
    _table(cur, 100_000)
    cur.execute("SET matchrec_max_steps = 20_000_000")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_steps") as info:
        cur.execute(ALTERNATION)
    assert "20,000,000 steps" in str(info.value)
    assert "__mr" not in str(info.value)
    cur.execute("SELECT 42")  # the connection keeps working
    assert cur.fetchall() == [(42,)]


def test_step_budget_raised_on_a_small_input_gives_the_reference_result(cur):
    _table(cur, 3_000)
    cur.execute("SET matchrec_max_steps = 1000")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_steps"):
        cur.execute(ALTERNATION_MATCHING)
    cur.execute("SET matchrec_max_steps = 100_000_000")
    cur.execute(ALTERNATION_MATCHING)
    compiled = cur.fetchall()
    assert cur.stats[0][1].matcher == "compiled"
    cur.execute("SET matchrec_fast_path = 0")
    cur.execute("SET matchrec_max_steps = 2_000_000_000")
    cur.execute(ALTERNATION_MATCHING)
    assert cur.fetchall() == compiled and compiled
    cur.execute("RESET matchrec_max_steps")
    assert cur.connection.settings.max_steps == work.DEFAULT_MAX_STEPS


def test_reference_matcher_stops_at_the_step_budget(cur):
    _table(cur, 20_000)
    cur.execute("SET matchrec_fast_path = 0")
    cur.execute("SET matchrec_max_steps = 5_000_000")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_steps"):
        cur.execute(ALTERNATION)


def test_first_navigation_counts_the_history_it_reads(cur):
    # C's condition reads FIRST(A.v): each evaluation may walk the whole partial match, so the
    # work is cubic in the run of A rows; the budget charges those rows
    query = _mr("A+ C", "C AS C.v > FIRST(A.v) + 100000")
    _table(cur, 3_000, "range")
    cur.execute("SET matchrec_fast_path = 0")  # the compiled matcher keeps FIRST per thread
    cur.execute("SET matchrec_max_steps = 20_000_000")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_steps"):
        cur.execute(query)
    # raised, on a small input: one match from the first row to the last A-run's end
    n = 150
    _table(cur, n, "range")
    cur.execute("SET matchrec_max_steps = 2_000_000_000")
    cur.execute(_mr("A+ C", "C AS C.v > FIRST(A.v) + 100"))
    assert cur.fetchall() == [(n,)]


def test_step_setting_is_validated(cur):
    with pytest.raises(matchrec.ProgrammingError, match="matchrec_max_steps"):
        cur.execute("SET matchrec_max_steps = 0")
    with pytest.raises(matchrec.ProgrammingError, match="matchrec_max_memory_mb"):
        cur.execute("SET matchrec_max_memory_mb = lots")
    cur.execute("SET matchrec_max_memory_mb = 64")
    cur.execute("SET matchrec_max_steps = 1_000")
    assert (cur.connection.settings.max_memory_mb, cur.connection.settings.max_steps) == (64, 1000)


# ---------------------------------------------------------------- sizes before expansion
def test_permute_of_eleven_variables_is_refused_before_building(cur):
    _table(cur, 50)
    defines = ", ".join(f"{x} AS v >= 0" for x in LETTERS)
    query = _mr("PERMUTE(" + ", ".join(LETTERS) + ")", defines)
    started = time.perf_counter()
    with pytest.raises(matchrec.ProgrammingError, match="39,916,800 orderings") as info:
        cur.execute(query)
    assert time.perf_counter() - started < 60  # building 11! branches took minutes and gigabytes
    assert "Line 2" in str(info.value) and "^" in str(info.value)


def test_permute_within_the_limit_still_matches(cur):
    cur.execute("CREATE OR REPLACE TABLE t AS SELECT * FROM (VALUES (1, 3), (2, 1), (3, 2), (4, 9)) v(id, v)")
    cur.execute(_mr("PERMUTE(A, B, C)", "A AS v = 1, B AS v = 2, C AS v = 3", "classifier() AS last_label"))
    assert cur.fetchall() == [("B",)]


def test_and_expansion_is_sized_before_it_is_built():
    items = tuple(Element(x, x.lower()) for x in LETTERS)
    root = And(items)
    assert count_alternatives(root, None) == 39_916_800
    assert count_alternatives(root, "any") == 1  # kept as one partial order
    with work.Budget(1 << 40, 2048):
        with pytest.raises(matchrec.OperationalError, match="matchrec_max_memory_mb"):
            alternatives(root)
        with pytest.raises(matchrec.OperationalError, match="matchrec_max_memory_mb"):
            orders(root, "next")
        assert len(orders(root, "any")) == 1


def _and_query(window: int) -> str:
    return ("PATTERN AND(" + ", ".join(f"{x} {x.lower()}1" for x in LETTERS) + f") FROM ev WITHIN {window} "
            "RETURN COUNT(*)")


def test_and_of_eleven_items_under_skip_till_any_match(cur):
    # three bursts, each one event of every type in a shuffled order, far apart: three matches
    rows = []
    for burst in range(3):
        order = sorted(LETTERS, key=lambda x: (ord(x) * 7 + burst * 3) % 11)
        rows += [(burst * 1000 + i, x) for i, x in enumerate(order)]
    cur.execute("CREATE TABLE ev (ts BIGINT, type VARCHAR)")
    cur.executemany("INSERT INTO ev VALUES (?, ?)", rows)
    cur.execute(_and_query(30))
    assert cur.fetchall() == [(3,)]


def test_and_of_eleven_items_that_explodes_stops_at_the_budget(cur):
    cur.execute("CREATE TABLE ev AS SELECT range AS ts, chr(65 + (range % 11)::INT) AS type FROM range(2000)")
    cur.execute("SET matchrec_max_steps = 2_000_000")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_steps"):
        cur.execute(_and_query(30))


# ---------------------------------------------------------------- memory
def test_cer_matches_stop_at_the_memory_budget(cur):
    cur.execute("CREATE TABLE ev AS SELECT range AS ts, chr(65 + (range % 3)::INT) AS type, range % 100 AS x "
                "FROM range(2000)")
    cur.execute("SET matchrec_max_memory_mb = 100")
    cur.execute("SET matchrec_max_steps = 1_000_000_000_000")
    cur.execute("SET matchrec_cer_max_matches = 1_000_000_000")
    with pytest.raises(matchrec.OperationalError, match="matchrec_max_memory_mb") as info:
        cur.execute("PATTERN SEQ(A a, B+ b, C c) FROM ev RETURN *")
    assert "100 MB" in str(info.value)
    cur.execute("PATTERN SEQ(A a, B b) FROM ev WITHIN 1 RETURN COUNT(*)")
    assert cur.fetchall() == [(667,)]


def test_kleene_subsets_are_sized_before_they_are_listed(cur):
    cur.execute("CREATE TABLE ev AS SELECT range AS ts, chr(65 + (range % 3)::INT) AS type FROM range(200)")
    cur.execute("SET matchrec_cer_max_matches = 1000")
    cur.execute("SET matchrec_cer_mechanism = rcep")
    with pytest.raises(matchrec.OperationalError, match="matchrec_cer_max_matches"):
        cur.execute("PATTERN SEQ(A a, B+ b, C c) FROM ev RETURN *")


EXPLODING = {
    "permute": """
        cur.execute("CREATE TABLE t AS SELECT range AS id, range AS v FROM range(100)")
        letters = "ABCDEFGHIJK"
        cur.execute("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS c PATTERN (PERMUTE("
                    + ", ".join(letters) + ")) DEFINE " + ", ".join(f"{x} AS v >= 0" for x in letters) + ")")
    """,
    "and": """
        cur.execute("CREATE TABLE ev AS SELECT range AS ts, chr(65 + (range % 11)::INT) AS type FROM range(2000)")
        cur.execute("EXPLAIN PATTERN AND(" + ", ".join(f"{x} {x.lower()}1" for x in "ABCDEFGHIJK")
                    + ") FROM ev WITHIN 30 RETURN COUNT(*)")
    """,
}


@pytest.mark.parametrize("case", sorted(EXPLODING))
def test_exploding_statements_stay_small(case):
    """Peak memory of a fresh process running the statement (it grew by gigabytes before)."""
    script = textwrap.dedent("""
        import resource, sys
        import matchrec
        cur = matchrec.connect().cursor()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
    """) + textwrap.indent(textwrap.dedent(EXPLODING[case]), "    ") + textwrap.dedent("""
            outcome = "ok"
        except matchrec.Error as err:
            outcome = type(err).__name__
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024
        print(outcome, grown)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    outcome, grown = out.stdout.split()
    assert outcome == ("ProgrammingError" if case == "permute" else "ok")
    assert int(grown) < 300, f"{case}: grew by {grown} MB"


# ---------------------------------------------------------------- interrupts
def _interrupt_after(seconds: float) -> threading.Thread:
    def send():
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGINT)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fast_path", [1, 0], ids=["compiled", "reference"])
def test_interrupt_stops_a_long_match(cur, fast_path):
    _table(cur, 100_000)
    cur.execute(f"SET matchrec_fast_path = {fast_path}")
    cur.execute("SET matchrec_max_steps = 1_000_000_000_000")  # only the interrupt can stop it
    if fast_path:
        cur.execute(_mr("A C", "A AS v >= 0, C AS v = 5"))  # the kernel's compilation is not what is timed
        cur.fetchall()
    sender = _interrupt_after(0.5)
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        cur.execute(ALTERNATION)
    stopped = time.perf_counter() - started
    sender.join()
    assert stopped < 10, f"stopped after {stopped:.1f} s"
    # the connection still works, for MATCH_RECOGNIZE too
    cur.execute("RESET matchrec_max_steps")
    _table(cur, 3_000)
    cur.execute(ALTERNATION_MATCHING)
    assert cur.fetchall()
    cur.execute("SELECT count(*) FROM t")
    assert cur.fetchall() == [(3_000,)]


def test_interrupt_stops_a_long_duckdb_statement(cur):
    # DuckDB itself notices a pending signal only at some points of its work (a second Ctrl-C in
    # one process waited minutes): each one must stop the statement, not only the first
    for attempt in range(3):
        sender = _interrupt_after(0.5)
        started = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            cur.execute("SELECT count(*) FROM range(1000000000) a, range(100) b WHERE (a.range * b.range) % 7 = 3")
        sender.join()
        assert time.perf_counter() - started < 10, f"attempt {attempt + 1}"
        cur.execute("SELECT 42")
        assert cur.fetchall() == [(42,)]


def test_a_lost_keyboard_interrupt_still_stops_the_reference_matcher(cur):
    # Python raises Ctrl-C's KeyboardInterrupt wherever the main thread is; inside a __del__ or a GC
    # callback it is printed and dropped. The signal's thread also stops the statement's budget
    # (what it calls is called here directly, with no KeyboardInterrupt raised at all)
    _table(cur, 100_000)
    cur.execute("SET matchrec_fast_path = 0")
    cur.execute("SET matchrec_max_steps = 3_000_000_000")  # stops it, and fails the test, within minutes
    timer = threading.Timer(0.5, work.interrupt_main)
    timer.start()
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        cur.execute(ALTERNATION)
    timer.join()
    assert time.perf_counter() - started < 10
    cur.execute("RESET matchrec_max_steps")
    _table(cur, 3_000)
    cur.execute(ALTERNATION_MATCHING)  # the next statement is not stopped by the earlier interrupt
    assert cur.fetchall()


def test_ctrl_c_still_reaches_statements_after_in_process_flight_servers(cur):
    # Arrow Flight's serve() installs C-level signal handlers; after several servers in one process
    # shut down, a dead server's handler stayed installed and Ctrl-C did nothing (the suite hung)
    import pyarrow.flight as fl
    servers = [fl.FlightServerBase("grpc://127.0.0.1:0") for _ in range(3)]
    threads = [threading.Thread(target=s.serve, daemon=True) for s in servers]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for s in servers:
        s.shutdown()
    for t in threads:
        t.join()
    _table(cur, 100_000)
    cur.execute("SET matchrec_fast_path = 0")
    cur.execute("SET matchrec_max_steps = 3_000_000_000")  # stops it, and fails the test, within minutes
    sender = _interrupt_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        cur.execute(ALTERNATION)
    sender.join()


def test_a_signal_its_statement_did_not_serve_never_reaches_the_next_statement():
    # Under load the thread serving the wakeup descriptor can run late: a Ctrl-C written while
    # one statement ran must not be served after it ended, when it would interrupt the next one
    import duckdb
    from matchrec.engine import interrupts
    duck = duckdb.connect()
    with interrupts._serving:  # the serving thread is late: it cannot take the signal yet
        with interrupts.forwarding(duck):
            assert interrupts._target is duck
            interrupts._writer.send(bytes([signal.SIGINT]))  # what the C-level handler writes
    # the statement has ended; the thread may serve now
    with interrupts.forwarding(duck):
        time.sleep(0.3)
        assert duck.execute("SELECT 42").fetchall() == [(42,)]
    assert not work._main["interrupted"]
