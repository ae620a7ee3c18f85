"""Storage nodes over Arrow Flight: every pull strategy returns exactly the local result.

Three real Flight servers on 127.0.0.1 (threads of this process; the fault test runs them as
separate ``matchrec storage-node`` processes and kills one) hold a random table spread by
``matchrec load``'s partitionings. Random patterns with WITHIN and equality conditions -
including shapes the time interval filter must refuse (PREV, anchors, empty matches) - run
locally and through every strategy; the results must be the same multiset of rows.
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from unittest import mock

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import matchrec
from matchrec.connectors.loader import load
from matchrec.connectors.storage_node import StorageNode
from matchrec.operators.intervals import (FilterPayloadError, IntervalSet, ShrinkingWindowFilter,
                                          WindowJoinFilter)
from matchrec.operators.packing import SlotJoinSet, pack, pack_intervals, unpack, unpack_intervals

TOKEN = "t0ken"
STRATEGIES = ["pull_all", "push_down", "naive_dfs", "dfs", "push_pull"]


# -- the filter structures

def _brute_cover(pk, t, before, after, qpk, qt):
    return np.array([any(p == x and s - before <= y <= s + after for p, s in zip(pk, t)) for x, y in zip(qpk, qt)],
                    bool)


points = st.lists(st.tuples(st.integers(0, 2), st.integers(-300, 3000)), max_size=40)


@settings(max_examples=120, deadline=None)
@given(a=points, b=points, w=st.integers(1, 200), before=st.integers(0, 200), after=st.integers(0, 200),
       seed=st.integers(0, 10_000))
def test_interval_sets_and_filters_against_brute_force(a, b, w, before, after, seed):
    rng = np.random.default_rng(seed)
    qpk, qt = rng.integers(0, 3, 600), rng.integers(-600, 3300, 600)
    apk, at = (np.array([p for p, _ in a], np.int64), np.array([t for _, t in a], np.int64))
    bpk, bt = (np.array([p for p, _ in b], np.int64), np.array([t for _, t in b], np.int64))
    sa = IntervalSet.around(apk, at, before, after)
    sb = IntervalSet.around(bpk, bt, w, w)
    want_a = _brute_cover(apk, at, before, after, qpk, qt)
    want_b = _brute_cover(bpk, bt, w, w, qpk, qt)
    assert (sa.contains(qpk, qt) == want_a).all()
    both = sa.intersect(sb)
    assert (both.contains(qpk, qt) == (want_a & want_b)).all()
    lo = qt - rng.integers(0, 50, 600)
    want_overlap = np.array([(both.contains(np.full(h - l + 1, p), np.arange(l, h + 1))).any()
                             for p, l, h in zip(qpk[:60], lo[:60], qt[:60])])
    assert (both.overlaps(qpk[:60], lo[:60], qt[:60]) == want_overlap).all()
    swf = ShrinkingWindowFilter.build(both, w)
    got = swf.contains(qpk, qt)
    assert not (want_a & want_b & ~got).any(), "the window filter lost a point of the set"
    again = ShrinkingWindowFilter.from_bytes(swf.to_bytes(), 1 << 30)
    assert (again.contains(qpk, qt) == got).all()
    vals = rng.integers(0, 4, len(bt))
    wjf = WindowJoinFilter.build(bpk, vals, bt, w)
    qv = rng.integers(0, 4, 600)
    truth = np.array([any(p == x and v == y and 0 <= z - s <= w for p, v, s in zip(bpk, vals, bt))
                      for x, y, z in zip(qpk, qv, qt)], bool)
    assert not (truth & ~wjf.may_follow(qpk, qv, qt)).any(), "the join filter lost a pair"
    assert (WindowJoinFilter.from_bytes(wjf.to_bytes(), 1 << 30).may_follow(qpk, qv, qt)
            == wjf.may_follow(qpk, qv, qt)).all()


FAR_KEYS = [-(1 << 62), -7, 0, 12345, 1 << 61]
far_points = st.lists(st.tuples(st.sampled_from(FAR_KEYS), st.integers(0, 3), st.integers(-300, 3000)), max_size=40)


@settings(max_examples=80, deadline=None)
@given(a=far_points, b=far_points, w=st.integers(1, 200), seed=st.integers(0, 10_000))
def test_interval_sets_on_one_line_equal_the_per_partition_loops(a, b, w, seed):
    """Partitions whose times lie far apart (2^59 between partitions here, more than one line of
    2^60 could hold for all of them, as hashed keys and long histories give) still share one
    line; the answers equal the per-partition loops'."""
    import matchrec.operators.intervals as I
    home = {p: i * (1 << 59) for i, p in enumerate(FAR_KEYS + [99])}

    def arrays(pts):
        return (np.array([p for p, _, _ in pts], np.int64),
                np.array([home[p] + k * (1 << 40) + t for p, k, t in pts], np.int64))

    rng = np.random.default_rng(seed)
    qpk = rng.choice(np.array(FAR_KEYS + [99], np.int64), 400)
    qt = (np.array([home[p] for p in qpk.tolist()], np.int64) + rng.integers(0, 4, 400) * (1 << 40)
          + rng.integers(-600, 3300, 400))
    (apk, at), (bpk, bt) = arrays(a), arrays(b)

    def answers():
        sa = IntervalSet.around(apk, at, 0, w)
        both = sa.intersect(IntervalSet.around(bpk, bt, w, w))
        return (sa.contains(qpk, qt), both.contains(qpk, qt), both.overlaps(qpk, qt - 40, qt),
                (both.pk, both.lo, both.hi))

    on_line = answers()
    original = I._Line.of
    try:
        I._Line.of = classmethod(lambda cls, pairs: None)
        looped = answers()
    finally:
        I._Line.of = original
    for x, y in zip(on_line[:3], looped[:3]):
        assert (x == y).all()
    for x, y in zip(on_line[3], looped[3]):
        assert (x == y).all()
    if len(apk):  # the line was really used: its segments fit however far apart the spans are
        assert I._Line.of([(apk, at)]) is not None


def test_filter_false_positive_rates_are_small():
    rng = np.random.default_rng(7)
    t = np.sort(rng.integers(0, 10_000_000, 2000))
    tis = IntervalSet.around(np.zeros(len(t), np.int64), t, 0, 1000)
    swf = ShrinkingWindowFilter.build(tis, 1000)
    q = rng.integers(0, 10_000_000, 200_000)
    inside = tis.contains(np.zeros(len(q), np.int64), q)
    fp = (swf.contains(np.zeros(len(q), np.int64), q) & ~inside).sum() / max((~inside).sum(), 1)
    assert fp < 0.05
    vals = rng.integers(0, 1 << 30, len(t))
    wjf = WindowJoinFilter.build(np.zeros(len(t), np.int64), vals, t, 1000, eps=0.02)
    qv = rng.integers(1 << 30, 1 << 31, 50_000)  # values never inserted
    rate = wjf.may_follow(np.zeros(len(qv), np.int64), qv, rng.integers(0, 10_000_000, len(qv))).mean()
    assert rate < 0.06  # two probes of a 2% filter


@settings(max_examples=150, deadline=None)
@given(a=far_points, w=st.integers(0, 500), quantum=st.integers(1, 60), seed=st.integers(0, 10_000))
def test_packed_interval_sets_and_join_sets_against_brute_force(a, w, quantum, seed):
    """The packed encodings are exact: intervals come back bound for bound, and the slot join
    set answers 'a member may lie in [t - w, t]' / '... in [t, t + w]' as a scan of the members
    does, a member being anywhere in its slot."""
    rng = np.random.default_rng(seed)
    pk = np.array([p for p, _, _ in a], np.int64)
    t = np.array([k * 1000 + x for _, k, x in a], np.int64)
    tis = IntervalSet.around(pk, t * quantum, int(rng.integers(0, 3)) * quantum, w)
    back = unpack_intervals(pack_intervals(tis), 1 << 30)
    for x, y in zip((back.pk, back.lo, back.hi), (tis.pk, tis.lo, tis.hi)):
        assert (x == y).all()
    vals = rng.integers(0, 3, len(t))
    slots = np.floor_divide(t, 7)
    joins = SlotJoinSet.from_bytes(SlotJoinSet.of_points(pk, vals, slots, quantum, w).to_bytes(), 1 << 30)
    qpk = rng.choice(np.array(FAR_KEYS, np.int64), 300)
    qv, qt = rng.integers(0, 3, 300), rng.integers(-800, 4000, 300) * quantum // 7
    lo, hi = slots * quantum, slots * quantum + quantum - 1
    for got, (a_lo, a_hi) in ((joins.may_follow(qpk, qv, qt), (qt - w, qt)),
                              (joins.may_precede(qpk, qv, qt), (qt, qt + w))):
        want = np.array([((pk == p) & (vals == v) & (hi >= x) & (lo <= y)).any()
                         for p, v, x, y in zip(qpk, qv, a_lo, a_hi)], bool)
        assert (got == want).all()


@pytest.mark.parametrize("blob", [b"", b"SWF2" + b"\0" * 10, b"x" * 100])
def test_malformed_filter_payloads_are_refused(blob):
    with pytest.raises(FilterPayloadError):
        ShrinkingWindowFilter.from_bytes(blob, 1 << 20)
    with pytest.raises(FilterPayloadError):
        WindowJoinFilter.from_bytes(blob, 1 << 20)
    with pytest.raises(FilterPayloadError):
        unpack_intervals(blob, 1 << 20)
    with pytest.raises(FilterPayloadError):
        SlotJoinSet.from_bytes(blob, 1 << 20)


def test_packed_payloads_that_lie_are_refused():
    tis = IntervalSet.around(np.zeros(3, np.int64), np.array([0, 100, 200]), 0, 10)
    good = pack_intervals(tis)
    with pytest.raises(FilterPayloadError):  # a decompressed size over the limit: refused before decompressing
        unpack_intervals(good, 16)
    overlapping = b"\1\0\0\0\0\0\0\0" + pack([np.zeros(2, np.int64), np.array([0, 1]), np.array([5, 5])])
    with pytest.raises(FilterPayloadError):
        unpack_intervals(overlapping, 1 << 20)
    bomb = pack([np.zeros(1000, np.int64)] * 3)
    with pytest.raises(FilterPayloadError):
        unpack(bomb[:20] + b"junk", 1 << 20)


# -- a cluster of three nodes

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("nodes")
    nodes = [StorageNode(str(base / f"n{i}.duckdb"), token=TOKEN, max_payload_mb=64) for i in range(3)]
    threads = [threading.Thread(target=n.serve, daemon=True) for n in nodes]
    for t in threads:
        t.start()
    yield [f"grpc://127.0.0.1:{n.port}" for n in nodes]
    for n in nodes:
        n.close()


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
                for trips in (["auto", "always"] if strategy.endswith(("dfs", "push_pull")) else ["auto"]):
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
    _differential(cluster, range(12), 400)


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
    moved = {}
    cur.execute("SET matchrec_round_trips = always")  # on loopback the cost model rightly skips rounds
    for strategy in STRATEGIES:
        cur.execute(f"SET pull_strategy = {strategy}")
        cur.execute(q)
        cur.fetchall()
        s = cur.pull_stats[0]
        assert s.strategy == strategy and set(s.nodes) == set(cluster)
        moved[strategy] = s.bytes_received + s.bytes_sent
        assert s.round_trips >= 1
    assert moved["dfs"] < moved["push_down"] < moved["pull_all"]
    assert moved["push_pull"] < moved["push_down"]
    assert any("rows the nodes kept for A, B, C" in n for n in cur.pull_stats[0].notes)  # the last, push_pull
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

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(db: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "matchrec", "storage-node", "--db", db, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "serving" in line, proc.stderr.read()
    return proc


def _fault_runs(tmp_path, kills: int):
    rng = random.Random(11)
    data = random_table(rng, 60_000)
    ports = [_free_port() for _ in range(3)]
    procs = [_start_node(str(tmp_path / f"k{i}.duckdb"), p) for i, p in enumerate(ports)]
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
            procs[victim] = _start_node(str(tmp_path / f"k{victim}.duckdb"), ports[victim])
        assert outcomes["error"] + outcomes["full"] == kills
        return outcomes
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_killed_node_gives_an_error_naming_it_never_a_partial_result(tmp_path):
    _fault_runs(tmp_path, 3)


@pytest.mark.slow
def test_killed_node_twenty_times(tmp_path):
    outcomes = _fault_runs(tmp_path, 20)
    assert outcomes["error"] > 0


def test_cli_storage_node_and_load(tmp_path):
    port = _free_port()
    proc = _start_node(str(tmp_path / "cli.duckdb"), port)
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


# -- push_pull sessions

def test_push_pull_node_restart_mid_query_names_the_node_and_never_answers(tmp_path):
    rng = random.Random(21)
    data = random_table(rng, 20_000)
    ports = [_free_port() for _ in range(2)]
    dbs = [str(tmp_path / f"s{i}.duckdb") for i in range(2)]
    procs = [_start_node(db, p) for db, p in zip(dbs, ports)]
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
        cur.execute("SET pull_strategy = push_pull")
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
                procs[0] = _start_node(dbs[0], ports[0])
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
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_push_pull_sessions_expire_are_bounded_and_see_table_changes():
    from matchrec.connectors.session import SessionLost
    from matchrec.connectors.shard import RequestError, ShardService
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT range AS ts, range % 3 AS v FROM range(100)")
    svc = ShardService(con, 1 << 20)
    base = {"op": "candidates", "table": "ev", "key_sql": "ts", "condition": "v = 1"}

    def round_(sid, var, expect):
        return svc.answer({**base, "session": sid, "var": var, "expect": expect}, [])
    sid = "ab" * 8
    assert round_(sid, 0, []).num_rows == 33
    assert round_(sid, 1, [0]).num_rows == 33
    kept = svc.sessions.open(sid, "ev", svc._version("ev"), [0, 1]).variables
    assert kept[0].rows.column("r").to_pylist() == list(range(1, 100, 3))
    pulled = svc.answer({"op": "pull", "table": "ev", "key_sql": "ts", "session": sid, "expect": [0, 1],
                         "union": [0]}, [])
    assert sorted(pulled.column("ts").to_pylist()) == list(range(1, 100, 3))
    with pytest.raises(SessionLost, match="not known here"):  # the final pull ended it
        round_(sid, 1, [0])
    svc.sessions.max_sessions = 2
    for k in range(3):
        round_(f"{k:016x}", 0, [])
    assert len(svc.sessions) == 2
    with pytest.raises(SessionLost):
        round_(f"{0:016x}", 1, [0])  # evicted: the oldest
    round_(f"{2:016x}", 1, [0])
    con.execute("INSERT INTO ev VALUES (100, 1)")
    with pytest.raises(SessionLost, match="changed"):
        round_(f"{2:016x}", 1, [0, 1])
    svc.sessions.ttl = 0.0
    round_("cd" * 8, 0, [])
    import time
    time.sleep(0.01)
    with pytest.raises(SessionLost):
        round_("cd" * 8, 1, [0])
    with pytest.raises(RequestError, match="session id"):
        round_("not hex!", 0, [])


# -- the ACER index

def _index_table(rng: np.random.Generator, n: int) -> pa.Table:
    v = rng.integers(-5, 200, n)
    f = rng.normal(0, 10, n)
    f[rng.random(n) < 0.01] = np.nan
    return pa.table({
        "id": np.arange(n), "ts": np.cumsum(rng.integers(0, 3, n)),
        "type": pa.array([None if x == 6 else "abcdef"[x] for x in rng.integers(0, 7, n)]),
        "v": pa.array(v, mask=rng.random(n) < 0.05), "f": f,
        "g": pa.array(rng.integers(0, 4, n), pa.int32(), mask=np.arange(n) < 2000),  # one block all NULL
    })


def _random_condition(rng: random.Random) -> str:
    atoms = [lambda: f"type = '{rng.choice('abcdefz')}'", lambda: f"type IN ('{rng.choice('ab')}', 'c')",
             lambda: f"v {rng.choice(['<', '<=', '>', '>=', '='])} {rng.randint(-10, 210)}",
             lambda: f"{rng.randint(-10, 210)} {rng.choice(['<', '>='])} v",
             lambda: f"v BETWEEN {rng.randint(-10, 100)} AND {rng.randint(50, 210)}",
             lambda: f"f {rng.choice(['<', '>', '<=', '>='])} {rng.uniform(-20, 20):.3f}",
             lambda: f"g = {rng.randint(0, 4)}", lambda: f"v < {rng.randint(0, 100)}.5",
             lambda: "NOT (v < 50)", lambda: "lower(type) = 'b'", lambda: "v % 7 = 1", lambda: "f <> f",
             lambda: f"v > -{rng.randint(0, 3)}"]

    def tree(depth):
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(atoms)()
        return f"({tree(depth - 1)}) {rng.choice(['AND', 'AND', 'OR'])} ({tree(depth - 1)})"
    return tree(3)


def test_acer_index_answers_exactly_as_without_it():
    from matchrec.connectors.shard import ShardService
    data = _index_table(np.random.default_rng(4), 9000)
    plain, indexed = duckdb.connect(), duckdb.connect()
    for con in (plain, indexed):
        con.register("d", data)
        con.execute("CREATE TABLE ev AS SELECT * FROM d")
    a, b = ShardService(plain, 1 << 24), ShardService(indexed, 1 << 24)
    summary = b.answer({"op": "build_index", "table": "ev", "attributes": ["v", "f", "g"], "block_size": 2048}, [])
    assert summary.column("blocks")[0].as_py() == 5 and summary.column("clusters")[0].as_py() >= 5 * 7
    assert b.answer({"op": "tables"}, []).to_pylist() and b._tables().column("indexed").to_pylist() == [True]
    rng = random.Random(8)
    ts = np.sort(data.column("ts").to_numpy())
    key = 'CAST("ts" AS BIGINT)'
    skipped = 0
    for k in range(150):
        cond = _random_condition(rng)
        lo = rng.randint(0, 9000)
        intervals = np.array([[lo, lo + rng.randint(0, 400)], [lo + 2000, lo + 2100]], np.int64)
        if k % 2:  # intervals ending or starting exactly where a block's events begin or end
            edge = int(ts[2048 * rng.randint(1, 4) - rng.randint(0, 1)])
            intervals = np.array([[edge - 60, edge], [edge + 3000, edge + 3000]], np.int64)
        tis = IntervalSet(np.zeros(2, np.int64), intervals[:, 0].copy(), intervals[:, 1].copy())
        exact = np.concatenate([tis.pk, tis.lo, tis.hi]).tobytes()
        cover = np.concatenate([tis.lo, tis.hi]).tobytes()
        reqs = [({"op": "candidates", "table": "ev", "condition": cond, "key_sql": key}, []),
                ({"op": "candidates", "table": "ev", "condition": cond, "key_sql": key, "quantum": 5,
                  "filter": {"kind": "exact", "blob": 0}, "cover": 1}, [exact, cover]),
                ({"op": "pull", "table": "ev", "where": cond}, []),
                ({"op": "pull", "table": "ev", "where": cond, "key_sql": key, "columns": ["id", "v"],
                  "filter": {"kind": "exact", "blob": 0}, "cover": 1, "range": [int(tis.lo[0]), int(tis.hi[1])]},
                 [exact, cover])]
        for req, blobs in reqs:
            want = sorted(map(repr, a.answer(dict(req), blobs).to_pylist()))
            got = sorted(map(repr, b.answer(dict(req), blobs).to_pylist()))
            assert got == want, (k, cond, req)
        with b._scope("ev", cond, reqs[1][0], [exact, cover], False) as (_, scope, _left):
            skipped += scope != "TRUE"
    assert skipped > 100  # the index narrowed the rows of most requests


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
    with pytest.raises(fl.FlightServerError, match="numbers only"):
        build_index(cluster, "ev", ["type"], token=TOKEN)
    out = subprocess.run([sys.executable, "-m", "matchrec", "index", "--nodes", cluster[0], "--table", "ev",
                          "--attributes", "v", "--token", TOKEN, "--block-size", "10"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "block size" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "matchrec", "index", "--nodes", ",".join(cluster), "--table", "ev",
                          "--attributes", "v,g", "--token", TOKEN, "--block-size", "1024"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.count("clusters") == 3, out.stderr
