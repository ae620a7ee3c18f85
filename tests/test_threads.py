"""Threads sharing one connection: every statement's rows reach the cursor that ran it, whole.

Each test starts its threads together, lets them run thousands of statements (plain SQL,
MATCH_RECOGNIZE, CER, EXPLAIN, SET, register, executemany, run_many, storage-node tables) on
cursors of one connection, and counts every result that differs from what the statement returns
alone, every error, and every thread still running after a generous join (a deadlock).
"""
from __future__ import annotations

import threading
from collections import Counter

import pyarrow as pa
import pytest

import matchrec

JOIN_SECONDS = 120  # far above any run here: a thread still alive after this is stuck


def hammer(*workers) -> Counter:
    """Run each worker ``(times, step)`` in its own thread, all released at once, calling
    ``step(i, record)`` for i < times; return what went wrong.

    A step calls ``record(what)`` for a wrong result; an exception in a step is counted by class
    and message (and the thread goes on), and so is a thread that does not finish."""
    problems: Counter = Counter()
    lock = threading.Lock()
    start = threading.Barrier(len(workers))

    def record(what: str) -> None:
        with lock:
            problems[what] += 1

    def run(times: int, step) -> None:
        start.wait()
        for i in range(times):
            try:
                step(i, record)
            except Exception as err:  # noqa: BLE001 - counted: the test fails with the message
                record(f"{type(err).__name__}: {str(err)[:160]}")

    threads = [threading.Thread(target=run, args=w, daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_SECONDS)
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        problems["thread still running (deadlock?)"] += stuck
    return problems


def fetch(cur, how: int) -> list[tuple]:
    """The rest of ``cur``'s result, read one of four ways (they take different paths)."""
    if how == 0:
        return cur.fetchall()
    if how == 1:
        rows = []
        while batch := cur.fetchmany(3):
            rows += batch
        return rows
    if how == 2:
        return list(cur)
    table = cur.fetch_arrow_table()
    return [tuple(r.values()) for r in table.to_pylist()]


# ---------------------------------------------------------------- plain SQL
def selects(con, value: str, times: int):
    cur = con.cursor()

    def step(i: int, record) -> None:
        cur.execute(f"SELECT '{value}'")
        rows = fetch(cur, i % 4)
        if rows != [(value,)]:
            record(f"SELECT '{value}' returned {rows[:3]}")
    return times, step


def test_threadsafety_says_connections_may_be_shared():
    assert matchrec.threadsafety == 2


def test_two_threads_two_cursors_never_get_each_others_rows(con):
    problems = hammer(selects(con, "B", 2000), selects(con, "C", 2000))
    assert not problems, problems


def test_one_cursor_per_call_and_connection_execute(con):
    """``con.execute`` and a new cursor per statement (its result is never fetched by another)."""
    def worker(value: str):
        def step(i: int, record) -> None:
            cur = con.execute("SELECT ?, ?", [value, i]) if i % 2 else con.cursor().execute(f"SELECT '{value}', {i}")
            rows = cur.fetchall()
            if rows != [(value, i)]:
                record(f"{value} {i}: {rows[:3]}")
            if i % 3 == 0:
                cur.close()
        return 1000, step
    problems = hammer(worker("x"), worker("y"), worker("z"))
    assert not problems, problems


def streamed(con, tag: int, rows: int, passes: int, size: int):
    """Reads ``rows`` numbered rows with fetchmany(``size``) while the other threads execute."""
    cur = con.cursor()

    def step(_: int, record) -> None:
        cur.execute(f"SELECT {tag} AS tag, i FROM range({rows}) t(i) ORDER BY i")
        expected = 0
        while batch := cur.fetchmany(size):
            for t, i in batch:
                if t != tag or i != expected:
                    record(f"stream {tag}: got ({t}, {i}) where ({tag}, {expected}) was next")
                    return
                expected += 1
        if expected != rows:
            record(f"stream {tag}: {expected} rows of {rows}")
    return passes, step


def test_interleaved_fetchmany_on_streamed_results(con):
    """Large results stream from DuckDB; another thread's statement buffers them mid-read."""
    problems = hammer(streamed(con, 1, 30_000, 6, 250), streamed(con, 2, 30_000, 6, 250),
                      streamed(con, 3, 5_000, 40, 1000), selects(con, "B", 800))
    assert not problems, problems


def test_one_cursor_shared_by_threads_is_serialised(con):
    """Calls on a shared cursor run one at a time: a fetch returns the next rows of the statement
    last executed on that cursor (perhaps by another thread), never rows of two statements, a row
    twice, or an error. One cursor per thread keeps execute and fetch together."""
    cur = con.cursor()
    seen: dict[int, list[int]] = {}
    seen_lock = threading.Lock()
    statement_ids = iter(range(1, 10**9))

    def step(k: int, record) -> None:
        with seen_lock:
            sid = next(statement_ids)
        cur.execute(f"SELECT {sid} AS sid, i FROM range(3000) t(i) ORDER BY i")
        for _ in range(3):
            rows = cur.fetchmany(700) if k % 2 else cur.fetchmany(50)
            if not rows:
                continue
            sids = {s for s, _ in rows}
            numbers = [i for _, i in rows]
            if len(sids) != 1 or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
                record("one fetch mixed statements or skipped rows")
                continue
            with seen_lock:
                seen.setdefault(sids.pop(), []).extend(numbers)

    problems = hammer((150, step), (150, step), (150, step))
    assert not problems, problems
    twice = [sid for sid, numbers in seen.items() if len(numbers) != len(set(numbers))]
    assert not twice, f"{len(twice)} statements had a row fetched twice"
    assert sum(len(n) for n in seen.values()) > 0


# ---------------------------------------------------------------- MATCH_RECOGNIZE, EXPLAIN, SET
def make_ticks(con, rows_per_symbol: int = 400) -> None:
    con.cursor().execute(f"""
        CREATE TABLE ticks AS
        SELECT s AS sym, i AS ts, (i * 37 + s * 11) % 23 + (i % 7) AS price
        FROM range(3) a(s), range({rows_per_symbol}) b(i)""")


V_SHAPE = """
    SELECT * FROM ticks MATCH_RECOGNIZE (
      PARTITION BY sym ORDER BY ts
      MEASURES FIRST(ts) AS start_ts, LAST(DOWN.ts) AS bottom_ts, LAST(UP.ts) AS end_ts, COUNT(*) AS n
      ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
      PATTERN (STRT DOWN+ UP+)
      DEFINE DOWN AS price < PREV(price), UP AS price > PREV(price)
    ) ORDER BY sym, start_ts"""

HIGH_LOW = """
    SELECT sym, ts, price, label FROM ticks MATCH_RECOGNIZE (
      PARTITION BY sym ORDER BY ts
      MEASURES CLASSIFIER() AS label
      ALL ROWS PER MATCH AFTER MATCH SKIP TO NEXT ROW
      PATTERN (H L{2} H?)
      DEFINE H AS price > 20, L AS price < 10 AND price <= PREV(price) + 3
    ) WHERE ts % 2 = 0 ORDER BY sym, ts, label"""

WITHIN = """
    WITH r AS (SELECT * FROM ticks WHERE sym <> 1)
    SELECT count(*), sum(span) FROM (
      SELECT * FROM r MATCH_RECOGNIZE (
        PARTITION BY sym ORDER BY ts
        MEASURES LAST(B.ts) - FIRST(A.ts) AS span
        PATTERN (A X*? B) WITHIN 12
        DEFINE A AS price >= 25, B AS price <= 4
      ))"""


def alone(con, sql: str, params=None) -> list[tuple]:
    cur = con.cursor()
    cur.execute(sql, params)
    return cur.fetchall()


def statements_worker(con, plan: list[tuple[str, list[tuple]]], times: int):
    cur = con.cursor()

    def step(i: int, record) -> None:
        sql, expected = plan[i % len(plan)]
        cur.execute(sql)
        rows = fetch(cur, i % 4)
        if rows != expected:
            record(f"{sql.split()[0]} ... {sql.split()[-1]}: {len(rows)} rows, {len(expected)} expected")
    return times, step


def test_match_recognize_statements_in_threads(con):
    make_ticks(con)
    expected = {sql: alone(con, sql) for sql in (V_SHAPE, HIGH_LOW, WITHIN)}
    assert all(expected.values()) and len({repr(v) for v in expected.values()}) == 3  # mixing would show
    first = [(V_SHAPE, expected[V_SHAPE]), ("SELECT 'B'", [("B",)])]
    second = [(HIGH_LOW, expected[HIGH_LOW]), ("SELECT 'C'", [("C",)]), (WITHIN, expected[WITHIN])]
    problems = hammer(statements_worker(con, first, 40), statements_worker(con, second, 45),
                      selects(con, "D", 600))
    assert not problems, problems


def test_explain_set_and_parameters_while_matching(con):
    """A thread switching the fast path off and on (a setting of the connection, so the other
    thread's statements run under either) and explaining; the results stay the same."""
    make_ticks(con, 200)
    want = alone(con, V_SHAPE)
    with_param = V_SHAPE.replace("FROM ticks", "FROM (SELECT * FROM ticks WHERE price >= ?)")
    want_param = alone(con, with_param, [3])
    assert want and want_param and want != want_param

    matching, explaining = con.cursor(), con.cursor()

    def match(i: int, record) -> None:
        if i % 2:
            matching.execute(with_param, [3])
            if fetch(matching, i % 4) != want_param:
                record("parameterised MATCH_RECOGNIZE differs")
        else:
            matching.execute(V_SHAPE)
            if fetch(matching, i % 4) != want:
                record("MATCH_RECOGNIZE differs")

    def set_and_explain(i: int, record) -> None:
        explaining.execute(f"SET matchrec_fast_path = {i % 2}")
        explaining.execute("EXPLAIN " + HIGH_LOW)
        rows = explaining.fetchall()
        if rows[0][0] != "matchrec" or "MATCH_RECOGNIZE #1" not in rows[0][1] or len(rows) < 2:
            record(f"EXPLAIN returned {str(rows)[:120]}")

    problems = hammer((40, match), (40, set_and_explain))
    assert not problems, problems


# ---------------------------------------------------------------- CER and run_many
def make_events(con) -> None:
    con.cursor().execute("""
        CREATE TABLE ev AS
        SELECT i AS ts, ['A', 'B', 'C', 'D'][(i * 7 + i // 5) % 4 + 1] AS type, (i * 13) % 11 AS price
        FROM range(2000) t(i)""")


CER = ["PATTERN SEQ(A a, B b) FROM ev WHERE a.price < b.price WITHIN 4 RETURN COUNT(*)",
       "PATTERN SEQ(A a, C c) FROM ev WHERE a.price > c.price WITHIN 6 RETURN a.ts, c.ts, c.price - a.price AS d",
       "PATTERN SEQ(B b, C+ c, D d) FROM ev WHERE avg(c.price) > b.price WITHIN 8 "
       "USE skip-till-next-match RETURN b.ts, d.ts",
       "PATTERN SEQ(D d, ~A a, B b) FROM ev WITHIN 5 RETURN COUNT(*)"]


def ordered(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=repr)


def test_cer_statements_in_threads(con):
    make_events(con)
    expected = {sql: ordered(alone(con, sql)) for sql in CER}
    assert len({repr(v) for v in expected.values()}) == len(CER) and all(v != [(0,)] for v in expected.values())

    def worker(mine: list[str], times: int):
        cur = con.cursor()

        def step(i: int, record) -> None:
            sql = mine[i % len(mine)]
            cur.execute(sql)
            if ordered(fetch(cur, i % 4)) != expected[sql]:
                record(f"CER statement {CER.index(sql)} differs")
        return times, step

    problems = hammer(worker(CER[:2], 40), worker(CER[2:], 40), selects(con, "C", 500))
    assert not problems, problems


def test_run_many_register_and_executemany_in_threads(con):
    """run_many keeps the connection for its whole run; register/unregister and executemany
    serialise with the statements of the other threads."""
    make_events(con)
    expected = [ordered(alone(con, sql)) for sql in CER[:2]]

    con.cursor().execute("CREATE TABLE sink (k INTEGER, v VARCHAR)")
    registering, inserting = con.cursor(), con.cursor()

    def many(_: int, record) -> None:
        result = matchrec.run_many(con, CER[:2] + ["SELECT 'M'"])
        got = [ordered([tuple(r.values()) for r in t.to_pylist()]) for t in result.tables]
        if got[:2] != expected or got[2] != [("M",)]:
            record("run_many differs")

    def register(i: int, record) -> None:
        name, n = f"arrow_{i}", i % 17 + 1
        con.register(name, pa.table({"v": list(range(n))}))
        registering.execute(f"SELECT count(*), sum(v) FROM {name}")
        if registering.fetchall() != [(n, n * (n - 1) // 2)]:
            record("registered table read wrong")
        con.unregister(name)

    def insert(i: int, record) -> None:
        inserting.executemany("INSERT INTO sink VALUES (?, ?)", [(i, f"v{j}") for j in range(20)])
        con.commit()
        inserting.execute("SELECT count(*) FROM sink WHERE k = ?", [i])
        if inserting.fetchall() != [(20,)]:
            record("executemany lost rows")

    problems = hammer((15, many), (300, register), (30, insert), selects(con, "B", 400))
    assert not problems, problems


def test_run_many_keeps_a_streamed_result_of_another_cursor(con):
    """run_many's own queries on the session would end a cursor's pending result: it is read first."""
    make_events(con)
    cur = con.cursor()
    cur.execute("SELECT i FROM range(50000) t(i) ORDER BY i")
    first = cur.fetchmany(10)
    matchrec.run_many(con, CER[:2])
    assert [i for i, in first + cur.fetchall()] == list(range(50000))


# ---------------------------------------------------------------- a compute node
REMOTE_QUERIES = [
    """SELECT * FROM ev MATCH_RECOGNIZE (
         ORDER BY ts MEASURES A.ts AS a_ts, B.ts AS b_ts, B.price - A.price AS gain
         PATTERN (A N*? B) WITHIN 9
         DEFINE A AS type = 'A', B AS type = 'B' AND B.price > A.price, N AS true) ORDER BY a_ts, b_ts""",
    """SELECT count(*), sum(n) FROM ev MATCH_RECOGNIZE (
         ORDER BY ts MEASURES COUNT(C.*) AS n
         PATTERN (D C+ N*? A) WITHIN 12
         DEFINE D AS type = 'D', C AS type = 'C' AND price >= 3, A AS type = 'A' AND price > 2, N AS true)""",
    "SELECT type, count(*), sum(price) FROM ev GROUP BY type ORDER BY type",  # pulled whole
]


def test_compute_node_statements_in_threads(tmp_path):
    """Storage-node tables read by threads of one compute-node connection: the pulled rows, the
    placeholders swapped per statement and SET pull_strategy are the connection's, shared."""
    from matchrec.connectors.loader import load
    from matchrec.connectors.storage_node import StorageNode
    nodes = [StorageNode(str(tmp_path / f"n{i}.duckdb"), token="secret") for i in range(2)]
    for node in nodes:
        threading.Thread(target=node.wait, daemon=True).start()
    uris = [f"grpc://127.0.0.1:{node.port}" for node in nodes]
    local = matchrec.connect()
    remote = None
    try:
        make_events(local)
        load(uris, "ev", "SELECT * FROM ev", local.duckdb_connection, "time", "ts", "type", "secret")
        expected = [alone(local, sql) for sql in REMOTE_QUERIES]
        assert all(expected) and expected[1][0][0] > 0
        remote = matchrec.connect(storage_nodes=uris, token="secret")
        strategies = ["dfs", "push_down", "pull_all", "dfs_stateful", "naive_dfs", "auto"]

        def worker(k: int):
            cur = remote.cursor()

            def step(i: int, record) -> None:
                if k == 0:  # every strategy returns the same rows, whichever statement it meets
                    cur.execute(f"SET pull_strategy = {strategies[i % len(strategies)]}")
                sql = REMOTE_QUERIES[(i + k) % len(REMOTE_QUERIES)]
                cur.execute(sql)
                if fetch(cur, i % 4) != expected[REMOTE_QUERIES.index(sql)]:
                    record(f"storage-node query {REMOTE_QUERIES.index(sql)} differs")
            return 24, step

        problems = hammer(worker(0), worker(1), worker(2), selects(remote, "B", 300))
        assert not problems, problems
    finally:
        if remote is not None:
            remote.close()
        local.close()
        for node in nodes:
            node.close()


# ---------------------------------------------------------------- closing
def test_closing_the_connection_while_another_thread_reads(con):
    """close waits for the call in progress; the reader then gets InterfaceError, nothing else."""
    reading = threading.Event()
    outcome: list = []

    def reader() -> None:
        cur = con.cursor()
        cur.execute("SELECT i FROM range(2000000) t(i)")
        count = 0
        try:
            while batch := cur.fetchmany(1000):
                count += len(batch)
                reading.set()
            outcome.append(("done", count))
        except matchrec.InterfaceError as err:
            outcome.append(("closed", str(err)))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            outcome.append(("wrong error", repr(err)))
        finally:
            reading.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert reading.wait(JOIN_SECONDS)
    con.close()
    t.join(JOIN_SECONDS)
    assert not t.is_alive()
    assert outcome and outcome[0][0] in ("closed", "done"), outcome
    if outcome[0][0] == "closed":
        assert "Connection is closed" in outcome[0][1]
    else:
        assert outcome[0][1] == 2_000_000
    with pytest.raises(matchrec.InterfaceError):
        con.cursor()


# ---------------------------------------------------------------- larger runs
@pytest.mark.slow
def test_many_threads_many_statements(con):
    """Nine threads: plain selects, MATCH_RECOGNIZE, CER and two long streams, all on one connection."""
    make_ticks(con)
    make_events(con)
    expected_mr = {sql: alone(con, sql) for sql in (V_SHAPE, HIGH_LOW, WITHIN)}
    plans = [[(V_SHAPE, expected_mr[V_SHAPE]), ("SELECT 'B'", [("B",)])],
             [(HIGH_LOW, expected_mr[HIGH_LOW]), (WITHIN, expected_mr[WITHIN])],
             [(CER[0], alone(con, CER[0])), (CER[3], alone(con, CER[3]))]]
    problems = hammer(*(selects(con, v, 10_000) for v in "BCDE"),
                      *(statements_worker(con, p, 200) for p in plans),
                      streamed(con, 7, 200_000, 5, 333), streamed(con, 8, 50_000, 20, 4096))
    assert not problems, problems
