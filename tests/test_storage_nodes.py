"""Storage nodes over Arrow Flight: every pull strategy returns exactly the local result.

Three real Flight servers on 127.0.0.1 (the session's cluster from conftest.py; the fault tests
run ``matchrec storage-node`` processes of their own and kill one) hold a random table spread by
``matchrec load``'s partitionings. Random patterns with WITHIN and equality conditions -
including shapes the time interval filter must refuse (PREV, anchors, empty matches) - run
locally and through every strategy; the results must be the same multiset of rows.

The structures and services these rely on are tested without processes in
test_storage_nodes_unit.py.
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
from unittest import mock

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import matchrec
from matchrec.connectors.loader import load
from matchrec.operators.intervals import ShrinkingWindowFilter
from nodes import TOKEN, free_port, start_node, stop_nodes

STRATEGIES = ["pull_all", "push_down", "naive_dfs", "dfs", "dfs_stateful", "push_pull"]


@pytest.fixture
def cluster(node_cluster):
    """The test session's three storage nodes (token ``TOKEN``)."""
    return node_cluster


def random_table(rng: random.Random, n: int) -> pa.Table:
    ts, t = [], 0
    for _ in range(n):
        t += rng.randint(1, 4)
        ts.append(t)
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "ts": pa.array(ts, pa.int64()),
        "type": pa.array([rng.choice("aabbccdd") if rng.random() < 0.9 else None for _ in range(n)]),
        "g": pa.array([rng.randint(0, 3) if rng.random() < 0.95 else None for _ in range(n)], pa.int32()),
        "p": pa.array([rng.randint(0, 2) for _ in range(n)], pa.int32()),
        "v": pa.array([rng.randint(0, 50) for _ in range(n)], pa.int32()),
    })


def random_query(rng: random.Random) -> str:
    names = ["A", "B", "C"][: rng.randint(2, 3)]
    items = []
    for i, v in enumerate(names):
        q = rng.choice(["", "", "", "+", "{1,2}", "?"]) if i else rng.choice(["", "", "+"])
        items.append(v + q)
        if i < len(names) - 1:
            items.append(rng.choice(["N*", "{- N* -}", "N*?", ""]))
    if rng.random() < 0.15:
        items = ["(" + items[0] + " | " + names[-1] + ")"] + items[1:]
    if rng.random() < 0.05:
        items.insert(0, "^")
    pattern = " ".join(i for i in items if i)
    defines = []
    for i, v in enumerate(names):
        cond = f"type = '{rng.choice('abcd')}'"
        if rng.random() < 0.3:
            cond += f" AND v {rng.choice(['<', '>'])} {rng.randint(10, 40)}"
        if i and rng.random() < 0.6:
            cond += f" AND {v}.g = {names[rng.randrange(i)]}.g"
        if rng.random() < 0.05:
            cond += " AND v > PREV(v)"
        defines.append(f"{v} AS {cond}")
    if "N" in pattern and rng.random() < 0.7:
        defines.append("N AS true")
    measures = rng.sample(["FIRST(A.id) AS fa", f"LAST({names[-1]}.id) AS ll", "count(B.*) AS nb",
                           "MATCH_NUMBER() AS mn", "CLASSIFIER() AS cl", "LAST(ts) - FIRST(ts) AS span"],
                          rng.randint(1, 3))
    rows = rng.choice(["ONE ROW PER MATCH", "ONE ROW PER MATCH", "ALL ROWS PER MATCH"])
    skip = rng.choice(["PAST LAST ROW", "PAST LAST ROW", "TO NEXT ROW"])
    within = f"WITHIN {rng.randint(3, 60)}" if rng.random() < 0.9 else ""
    partition = rng.choice(["", "PARTITION BY p"])
    return (f"SELECT * FROM ev MATCH_RECOGNIZE ({partition} ORDER BY ts MEASURES {', '.join(measures)} {rows} "
            f"AFTER MATCH SKIP {skip} PATTERN ({pattern}) {within} DEFINE {', '.join(defines)})")


def _rows(cur) -> list:
    return sorted(cur.fetchall(), key=repr)


@contextlib.contextmanager
def _prefer_other_payloads():
    """Window filters instead of packed intervals and packed join sets instead of Bloom filters."""
    from matchrec.connectors.remote import RemoteStore
    from matchrec.operators.packing import SlotJoinSet as Slots

    def tis_payload(tis, window, exact):
        return ("exact", np.concatenate([tis.pk, tis.lo, tis.hi]).tobytes()) if exact else \
            ("swf", ShrinkingWindowFilter.build(tis, window).to_bytes())

    def join_payload(pk, val, slot, quantum, window, exact):
        if exact:
            return original(pk, val, slot, quantum, window, exact)
        return "slots", Slots.of_points(pk, val, slot, quantum, window).to_bytes()

    original = RemoteStore._join_payload
    with mock.patch.object(RemoteStore, "_tis_payload", staticmethod(tis_payload)), \
            mock.patch.object(RemoteStore, "_join_payload", staticmethod(join_payload)):
        yield


def _differential(cluster, seeds, n_rows):
    mismatches = []
    filters = set()  # the payload kinds the rounds sent: every kind must have been exercised
    for seed in seeds:
        rng = random.Random(seed)
        data = random_table(rng, n_rows)
        local = matchrec.connect()
        local.duckdb_connection.register("ev_arrow", data)
        local.cursor().execute("CREATE TABLE ev AS SELECT * FROM ev_arrow")
        load(cluster, "ev", "SELECT * FROM ev_arrow", local.duckdb_connection,
             rng.choice(["random", "time", "type"]), "ts", "type", TOKEN)
        remote = matchrec.connect(storage_nodes=cluster, token=TOKEN)
        rcur = remote.cursor()
        for k in range(4):
            q = random_query(rng)
            # each payload is sent in the smaller of two encodings; on these small tables make
            # every query send the other one as well (both must give the same answers)
            other = _prefer_other_payloads if k % 2 else contextlib.nullcontext
            cur = local.cursor()
            cur.execute(q)
            want = _rows(cur)
            for strategy in STRATEGIES:
                for trips in (["auto", "always"] if strategy.endswith(("dfs", "dfs_stateful")) else ["auto"]):
                    rcur.execute(f"SET pull_strategy = {strategy}")
                    rcur.execute(f"SET matchrec_round_trips = {trips}")
                    with other():
                        rcur.execute(q)
                    got = _rows(rcur)
                    if got != want:
                        mismatches.append((seed, strategy, trips, q, len(want), len(got)))
                    for sent in rcur.pull_stats[0].filters.values() if rcur.pull_stats else []:
                        filters |= {" ".join(f.split()[:2]) + (" precede" if "precede" in f else "") for f in sent}
        remote.close()
        local.close()
    assert not mismatches, mismatches[:3]
    assert {"time intervals", "time swf", "time exact", "join slots", "join wjf", "join exact", "join slots precede",
            "join wjf precede", "join exact precede"} <= filters, filters


def test_every_strategy_equals_local_execution(cluster):
    _differential(cluster, range(3), 400)


@pytest.mark.slow
def test_every_strategy_equals_local_execution_exhaustive(cluster):
    _differential(cluster, range(1000, 1400), 1500)


def test_filtering_moves_fewer_bytes_and_reports_them(cluster):
    rng = random.Random(5)
    data = random_table(rng, 6000)
    local = duckdb.connect()
    local.register("ev_arrow", data)
    load(cluster, "ev", "SELECT * FROM ev_arrow", local, "time", "ts", "type", TOKEN)
    remote = matchrec.connect(storage_nodes=cluster, token=TOKEN)
    cur = remote.cursor()
    q = ("SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.id AS a, C.id AS c ONE ROW PER MATCH "
         "PATTERN (A {- N* -} B {- N* -} C) WITHIN 6 DEFINE A AS type = 'a' AND v < 3, B AS type = 'b', "
         "C AS type = 'c' AND C.g = B.g, N AS true)")
    moved, notes = {}, {}
    cur.execute("SET matchrec_round_trips = always")  # on loopback the cost model rightly skips rounds
    for strategy in STRATEGIES:
        cur.execute(f"SET pull_strategy = {strategy}")
        cur.execute(q)
        cur.fetchall()
        s = cur.pull_stats[0]
        assert s.strategy == strategy and set(s.nodes) == set(cluster)
        moved[strategy] = s.bytes_received + s.bytes_sent
        notes[strategy] = s.notes
        assert s.round_trips >= 1
    assert moved["dfs"] < moved["push_down"] < moved["pull_all"]
    assert moved["dfs_stateful"] < moved["push_down"]
    assert any("rows the nodes kept for A, B, C" in n for n in notes["dfs_stateful"])
    assert moved["push_pull"] < moved["push_down"]
    assert any("partial matches anchored at A" in n for n in notes["push_pull"])
    cur.execute("SET pull_strategy = dfs")
    cur.execute("EXPLAIN ANALYZE " + q)
    text = cur.fetchall()[0][1]
    assert "pull strategy dfs" in text and "bytes received" in text and "time interval filter" in text
    cur.execute("SELECT count(*) FROM ev")  # plain SQL over a node table reads all of it
    assert cur.fetchall() == [(6000,)]
    remote.close()


def test_token_is_required(cluster):
    with pytest.raises(matchrec.OperationalError, match="token"):
        matchrec.connect(storage_nodes=cluster)
    with pytest.raises(matchrec.OperationalError, match="token"):
        matchrec.connect(storage_nodes=cluster, token="wrong")


def test_bad_requests_are_refused_and_the_node_keeps_serving(cluster):
    client = fl.connect(cluster[0])
    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])

    def exchange(request: bytes, blobs=None, blob_type=pa.large_binary()):
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(request), options=opts)
        table = pa.table({"blob": pa.array(blobs or [], blob_type)})
        writer.begin(table.schema)
        if blobs:
            writer.write_table(table)
        writer.done_writing()
        out = reader.read_all()
        writer.close()
        return out

    bad = [
        (b"not json", None),
        (b'{"op": "pull", "table": "ev", "where": "1=1; DROP TABLE ev"}', None),
        (b'{"op": "pull", "table": "ev", "where": "(SELECT 1 FROM duckdb_tables()) = 1"}', None),
        (b'{"op": "pull", "table": "nope"}', None),
        (b'{"op": "candidates", "table": "ev", "condition": "true", "key_sql": "ts", '
         b'"filter": {"kind": "swf", "blob": 0}}', [b"SWF2garbage"]),
        (b'{"op": "probe", "bytes": 999999999999}', None),
        (b'{"op": "candidates", "table": "ev", "condition": "true", "key_sql": "ts"}', [b"x" * (65 << 20)]),
    ]
    for request, blobs in bad:
        with pytest.raises(fl.FlightServerError, match="bad request|could not run"):
            exchange(request, blobs)
    tables = exchange(b'{"op": "tables"}')
    assert "ev" in tables.column("name").to_pylist()
    client.close()


# -- node processes killed mid-query

def _fault_runs(tmp_path, kills: int):
    rng = random.Random(11)
    data = random_table(rng, 60_000)
    ports = [free_port() for _ in range(3)]
    procs = [start_node(str(tmp_path / f"k{i}.duckdb"), p) for i, p in enumerate(ports)]
    uris = [f"grpc://127.0.0.1:{p}" for p in ports]
    try:
        con = duckdb.connect()
        con.register("ev_arrow", data)
        load(uris, "ev", "SELECT * FROM ev_arrow", con, "random")
        q = ("SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.id AS a, LAST(C.id) AS c ONE ROW PER MATCH "
             "PATTERN (A N* B N* C+) WITHIN 40 DEFINE A AS type = 'a', B AS type = 'b', "
             "C AS type = 'c' AND C.g = B.g, N AS true)")
        local = matchrec.connect()
        local.duckdb_connection.register("ev", data)
        want = _rows(local.cursor().execute(q))
        outcomes = {"error": 0, "full": 0}
        for k in range(kills):
            remote = matchrec.connect(storage_nodes=uris, node_timeout=20)
            cur = remote.cursor()
            cur.execute(f"SET pull_strategy = {STRATEGIES[k % len(STRATEGIES)]}")
            victim = k % 3
            timer = threading.Timer(rng.uniform(0.0, 0.25), procs[victim].send_signal, [signal.SIGKILL])
            timer.start()
            try:
                cur.execute(q)
                got = _rows(cur)
                assert got == want, "a query that returned must return the full result"
                outcomes["full"] += 1
            except matchrec.OperationalError as err:
                assert uris[victim] in str(err) or "Cannot connect" in str(err)
                outcomes["error"] += 1
            timer.join()
            remote.close()
            procs[victim].wait(timeout=30)
            procs[victim] = start_node(str(tmp_path / f"k{victim}.duckdb"), ports[victim])
        assert outcomes["error"] + outcomes["full"] == kills
        return outcomes
    finally:
        stop_nodes(procs)


def test_killed_node_gives_an_error_naming_it_never_a_partial_result(tmp_path):
    _fault_runs(tmp_path, 3)


@pytest.mark.slow
def test_killed_node_twenty_times(tmp_path):
    outcomes = _fault_runs(tmp_path, 20)
    assert outcomes["error"] > 0


def test_cli_storage_node_and_load(tmp_path):
    port = free_port()
    proc = start_node(str(tmp_path / "cli.duckdb"), port)
    try:
        src = tmp_path / "events.parquet"
        con = duckdb.connect()
        con.register("d", random_table(random.Random(3), 500))
        con.execute(f"COPY d TO '{src}' (FORMAT parquet)")
        out = subprocess.run([sys.executable, "-m", "matchrec", "load", "--nodes", f"grpc://127.0.0.1:{port}",
                              "--table", "events", "--from", str(src), "--partition", "time"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "500 rows" in out.stdout
        remote = matchrec.connect(storage_nodes=[f"grpc://127.0.0.1:{port}"])
        assert remote.cursor().execute("SELECT count(*) FROM events").fetchall() == [(500,)]
        remote.close()
        bad = subprocess.run([sys.executable, "-m", "matchrec", "load", "--nodes", "grpc://127.0.0.1:1",
                              "--table", "events", "--from", str(src)], capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "Error" in bad.stderr and "Traceback" not in bad.stderr
        # the node keeps its tables' catalogue entries and statistics until its own loads forget
        # them: no other process may change (or even read) the file behind it while it serves
        for mode in ("", ", read_only=True"):
            other = subprocess.run([sys.executable, "-c", f"import duckdb; duckdb.connect({str(tmp_path / 'cli.duckdb')!r}"
                                    f"{mode}).execute('DELETE FROM events')"], capture_output=True, text=True,
                                   timeout=120)
            assert other.returncode != 0 and "lock" in other.stderr, other.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert os.path.exists(tmp_path / "cli.duckdb")


def test_settings_and_plain_explain(cluster):
    src = duckdb.connect()
    src.register("ev_arrow", random_table(random.Random(9), 300))
    load(cluster, "ev", "SELECT * FROM ev_arrow", src, "random", token=TOKEN)
    remote = matchrec.connect(storage_nodes=cluster, token=TOKEN)
    cur = remote.cursor()
    with pytest.raises(matchrec.ProgrammingError, match="pull_strategy takes one of"):
        cur.execute("SET pull_strategy = everything")
    with pytest.raises(matchrec.ProgrammingError, match="round_trips takes one of"):
        cur.execute("SET matchrec_round_trips = sometimes")
    cur.execute("SET pull_strategy = dfs")
    q = ("SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.id AS a ONE ROW PER MATCH "
         "PATTERN (A B) DEFINE A AS type = 'a', B AS v > PREV(v))")
    cur.execute("EXPLAIN " + q)  # plans without pulling anything
    text = cur.fetchall()[0][1]
    assert "cannot filter by time here (no WITHIN bounds the matches): push_down used" in text
    assert cur.pull_stats and cur.pull_stats[0].round_trips == 0
    cur.execute(q.replace("PATTERN (A B)", "PATTERN (A B) WITHIN 10"))
    cur.fetchall()
    assert "push_down" == cur.pull_stats[0].strategy  # PREV sees rows outside a match
    remote.close()


# -- dfs_stateful sessions

def test_dfs_stateful_node_restart_mid_query_names_the_node_and_never_answers(tmp_path):
    rng = random.Random(21)
    data = random_table(rng, 20_000)
    ports = [free_port() for _ in range(2)]
    dbs = [str(tmp_path / f"s{i}.duckdb") for i in range(2)]
    procs = [start_node(db, p) for db, p in zip(dbs, ports)]
    uris = [f"grpc://127.0.0.1:{p}" for p in ports]
    try:
        con = duckdb.connect()
        con.register("ev_arrow", data)
        load(uris, "ev", "SELECT * FROM ev_arrow", con, "random")
        q = ("SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.id AS a, C.id AS c ONE ROW PER MATCH "
             "PATTERN (A {- N* -} B {- N* -} C) WITHIN 20 DEFINE A AS type = 'a' AND v < 10, B AS type = 'b', "
             "C AS type = 'c' AND C.g = B.g, N AS true)")
        local = matchrec.connect()
        local.duckdb_connection.register("ev", data)
        want = _rows(local.cursor().execute(q))
        assert want
        remote = matchrec.connect(storage_nodes=uris)
        cur = remote.cursor()
        cur.execute("SET pull_strategy = dfs_stateful")
        cur.execute("SET matchrec_round_trips = always")
        assert _rows(cur.execute(q)) == want
        store = remote.remote
        plain = store.call_all
        seen = []

        def restart_after_first_round(request, *args, **kwargs):
            out = plain(request, *args, **kwargs)
            seen.append(request["op"])
            if request["op"] == "candidates" and seen.count("candidates") == 1:
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait(timeout=30)
                procs[0] = start_node(dbs[0], ports[0])
            return out
        store.call_all = restart_after_first_round
        with pytest.raises(matchrec.OperationalError, match="lost the state") as err:
            cur.execute(q)
        assert uris[0] in str(err.value) and uris[1] not in str(err.value)
        assert seen.count("candidates") >= 1
        store.call_all = plain
        assert _rows(cur.execute(q)) == want  # a new session on the restarted node
        remote.close()
    finally:
        stop_nodes(procs)



def test_acer_index_on_nodes_every_strategy_equals_local_execution(cluster):
    from matchrec.connectors.index_cli import build_index
    for seed in range(3):
        rng = random.Random(100 + seed)
        data = random_table(rng, 7000)
        local = matchrec.connect()
        local.duckdb_connection.register("ev_arrow", data)
        local.cursor().execute("CREATE TABLE ev AS SELECT * FROM ev_arrow")
        load(cluster, "ev", "SELECT * FROM ev_arrow", local.duckdb_connection, "random", token=TOKEN)
        queries = [random_query(rng) for _ in range(3)]
        wants = [_rows(local.cursor().execute(q)) for q in queries]
        summaries = build_index(cluster, "ev", ["v", "g"], "type", "ts", 1024, TOKEN)
        assert sum(s["rows"] for s in summaries) == 7000 and all(s["blocks"] >= 2 for s in summaries)
        remote = matchrec.connect(storage_nodes=cluster, token=TOKEN)
        assert remote.remote.indexed == {"ev"}
        rcur = remote.cursor()
        for q, want in zip(queries, wants):
            for strategy in STRATEGIES:
                rcur.execute(f"SET pull_strategy = {strategy}")
                rcur.execute("SET matchrec_round_trips = always")
                assert _rows(rcur.execute(q)) == want, (seed, strategy, q)
        remote.close()
        load(cluster, "ev", "SELECT * FROM ev_arrow", local.duckdb_connection, "random", token=TOKEN)
        again = matchrec.connect(storage_nodes=cluster, token=TOKEN)
        assert again.remote.indexed == set()  # a load drops the index
        again.close()
        local.close()


def test_acer_index_refusals(cluster, tmp_path):
    from matchrec.connectors.index_cli import build_index
    src = duckdb.connect()
    src.register("ev_arrow", random_table(random.Random(9), 300))
    load(cluster, "ev", "SELECT * FROM ev_arrow", src, "random", token=TOKEN)
    with pytest.raises(fl.FlightServerError, match="no column 'nope'"):
        build_index(cluster, "ev", ["nope"], token=TOKEN)
    with pytest.raises(fl.FlightServerError, match="an integer, date or timestamp is needed"):
        build_index(cluster, "ev", ["v"], time_column="type", token=TOKEN)
    out = subprocess.run([sys.executable, "-m", "matchrec", "index", "--nodes", cluster[0], "--table", "ev",
                          "--attributes", "v", "--token", TOKEN, "--block-size", "10"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "block size" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "matchrec", "index", "--nodes", ",".join(cluster), "--table", "ev",
                          "--attributes", "v,g", "--token", TOKEN, "--block-size", "1024"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.count("clusters") == 3, out.stderr
