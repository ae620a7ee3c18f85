"""The ``Source`` interface: the dual-filtering rounds and the typed operations give the same
answers over a local DuckDB table or query (``LocalSource``) and over storage nodes on Arrow
Flight (``NodeSource``), and the rows they pull give the same matches as reading everything
locally. Random data and statements, seeded; real Flight servers on 127.0.0.1."""
from __future__ import annotations

import random
import secrets
import threading

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import matchrec
from matchrec.connectors.dual_filtering import DualFiltering
from matchrec.connectors.loader import load
from matchrec.connectors.remote import PullStats, RemoteStore
from matchrec.connectors.source import LocalSource, NodeSource, Source
from matchrec.connectors.spark_filtering import SparkSource
from matchrec.connectors.storage_node import StorageNode
from matchrec.operators.intervals import IntervalSet

TOKEN = "source-test-token"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """Three storage nodes: the first serves a table whole, the other two share it."""
    base = tmp_path_factory.mktemp("source_nodes")
    servers = [StorageNode(str(base / f"s{i}.duckdb"), token=TOKEN, max_payload_mb=64) for i in range(3)]
    for s in servers:
        threading.Thread(target=s.wait, daemon=True).start()
    uris = [f"grpc://127.0.0.1:{s.port}" for s in servers]
    yield uris[:1], uris[1:]
    for s in servers:
        s.close()


def _table(rng: random.Random, n: int) -> pa.Table:
    ts, t = [], 0
    for _ in range(n):
        t += rng.randint(1, 3)
        ts.append(t)
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "ts": pa.array(ts, pa.int64()),
        "type": pa.array([rng.choice("aabbbcd") if rng.random() < 0.95 else None for _ in range(n)]),
        "g": pa.array([rng.randint(0, 3) for _ in range(n)], pa.int32()),
        "p": pa.array([rng.randint(0, 2) for _ in range(n)], pa.int32()),
        "v": pa.array([rng.randint(0, 50) for _ in range(n)], pa.int32()),
    })


def _statement(rng: random.Random, shape: int) -> str:
    """Patterns whose WITHIN lets the planner build a time interval plan: a pair with a gap,
    a chain with an equality join, and an optional middle variable with value conditions."""
    within = rng.randint(4, 30)
    part = rng.choice(["", "PARTITION BY p"])
    x, y = rng.sample("abcd", 2)
    if shape == 0:
        body = (f"PATTERN (A N* B) WITHIN {within} DEFINE A AS type = '{x}', B AS type = '{y}', N AS true")
        measures = "FIRST(A.id) AS fa, LAST(B.id) AS lb"
    elif shape == 1:
        body = (f"PATTERN (A {{- N* -}} B+ C) WITHIN {within} DEFINE A AS type = '{x}', B AS type = '{y}', "
                f"C AS type = 'c' AND C.g = A.g, N AS true")
        measures = "FIRST(A.id) AS fa, count(B.*) AS nb, LAST(C.id) AS lc"
    else:
        body = (f"PATTERN (A B? N*? C) WITHIN {within} DEFINE A AS type = '{x}' AND v < {rng.randint(10, 40)}, "
                f"B AS type = 'b', C AS type = '{y}' AND v > {rng.randint(5, 30)}, N AS true")
        measures = "FIRST(A.id) AS fa, LAST(C.id) AS lc, CLASSIFIER() AS cl"
    rows = rng.choice(["ONE ROW PER MATCH", "ALL ROWS PER MATCH"])
    return (f"SELECT * FROM ev MATCH_RECOGNIZE ({part} ORDER BY ts MEASURES {measures} {rows} "
            f"AFTER MATCH SKIP PAST LAST ROW {body})")


def _rows(cur) -> list:
    return sorted(cur.fetchall(), key=repr)


def _matches_over(table: pa.Table, sql: str) -> list:
    """The statement's result when ``ev`` holds only ``table``'s rows."""
    con = matchrec.connect()
    try:
        con.duckdb_connection.register("ev", table)
        return _rows(con.cursor().execute(sql))
    finally:
        con.close()


def _engine_reads(uris: list[str], sql: str):
    """The arguments the engine hands to the pull (columns, push-down filter, interval plan) for
    ``sql``, and its result, read from storage nodes with every round made."""
    remote = matchrec.connect(storage_nodes=uris, token=TOKEN)
    try:
        store = remote.remote
        seen = []
        plain = store.pull

        def recording(table, strategy, columns, row_filter, ip, round_trips, stats):
            seen.append((table, columns, row_filter, ip))
            return plain(table, strategy, columns, row_filter, ip, round_trips, stats)
        store.pull = recording
        cur = remote.cursor()
        cur.execute("SET pull_strategy = dfs")
        cur.execute("SET matchrec_round_trips = always")
        got = _rows(cur.execute(sql))
        return seen, got
    finally:
        remote.close()


def _by_id(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def _same_rounds(a, b, all_points: bool = True) -> None:
    """The same final interval set, and the same distinct candidates per variable (each shard
    reports a candidate slot it holds). With ``all_points`` False only the candidates inside the
    final set must agree: with another shard layout the cost model may keep a round's set at
    the compute node (replies of several shards cost more per candidate), and that round then
    returns every candidate."""
    if a.tis is None or b.tis is None:
        assert a.tis is None and b.tis is None
    else:
        for x, y in ((a.tis.pk, b.tis.pk), (a.tis.lo, b.tis.lo), (a.tis.hi, b.tis.hi)):
            np.testing.assert_array_equal(x, y)
    assert a.points.keys() == b.points.keys()
    for i in a.points:
        mine, theirs = (np.unique(np.stack(r.points[i]), axis=1) for r in (a, b))
        if not all_points and a.tis is not None:
            mine, theirs = (p[:, a.tis.overlaps(*p)] for p in (mine, theirs))
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("seed", range(3))
def test_rounds_over_local_and_nodes_find_the_same_intervals_and_matches(nodes, seed):
    whole, shared = nodes
    rng = random.Random(seed)
    data = _table(rng, rng.randint(300, 700))
    duck = duckdb.connect()
    duck.register("ev_arrow", data)
    duck.execute("CREATE TABLE ev AS SELECT * FROM ev_arrow")
    load(whole, "ev", "SELECT * FROM ev_arrow", duck, "random", token=TOKEN)
    load(shared, "ev", "SELECT * FROM ev_arrow", duck, rng.choice(["random", "time"]), "ts", "type", TOKEN)
    local = LocalSource(duck, "ev")
    one, two = NodeSource(whole, token=TOKEN), NodeSource(shared, token=TOKEN)
    try:
        checked = 0
        for shape in (0, 1, 2):
            sql = _statement(rng, shape)
            want = _matches_over(data, sql)
            reads, got = _engine_reads(whole, sql)
            assert got == want, sql
            assert len(reads) == 1 and reads[0][3] is not None, sql  # the statement was read by dual filtering
            table, columns, row_filter, ip = reads[0]
            for strategy in ("naive_dfs", "dfs", "dfs_stateful"):
                exact = strategy == "naive_dfs"
                session = secrets.token_hex(16) if strategy == "dfs_stateful" else None
                found = {}
                for name, source in (("local", local), ("node", one)):
                    found[name] = DualFiltering(source).rounds(table, columns, ip, exact, "always", PullStats(),
                                                               session)
                    if session is not None:
                        source.end_session(session)
                _same_rounds(found["local"], found["node"])
                pulled = {}
                for name, source in (("local", local), ("node", one), ("two nodes", two)):
                    stats = PullStats()
                    pulled[name] = DualFiltering(source).pull(table, strategy, columns, row_filter, ip, "always",
                                                              stats)
                    assert stats.events_pulled == pulled[name].num_rows
                    assert _matches_over(pulled[name], sql) == want, (name, strategy, sql)
                assert _by_id(pulled["local"]).equals(_by_id(pulled["node"])), (strategy, sql)
                assert pulled["local"].num_rows <= data.num_rows
                checked += 1
        assert checked == 9
    finally:
        one.close()
        two.close()
        duck.close()


@pytest.mark.parametrize("seed", range(3))
def test_typed_operations_agree_with_duckdb(nodes, seed):
    """``stats``, ``candidates`` under an interval set and the final ``pull`` under an interval
    set and a row filter, over a local table, a local query and storage nodes, against plain SQL."""
    whole, shared = nodes
    rng = random.Random(100 + seed)
    data = _table(rng, 600)
    duck = duckdb.connect()
    duck.register("ev_arrow", data)
    duck.execute("CREATE TABLE ev AS SELECT * FROM ev_arrow")
    load(shared, "ev", "SELECT * FROM ev_arrow", duck, "random", token=TOKEN)
    sources: list[Source] = [LocalSource(duck, "ev"), LocalSource(duck, query="SELECT * FROM ev_arrow", name="ev"),
                             NodeSource(shared, token=TOKEN)]
    part = ['"p"'] if seed % 2 else []
    pk_sql = 'CAST(hash("p") >> 32 AS BIGINT)' if part else "CAST(0 AS BIGINT)"
    cond = f"type = '{rng.choice('abc')}' AND v < {rng.randint(10, 45)}"
    anchors = duck.execute(f"SELECT {pk_sql}, ts FROM ev WHERE type = 'd'").fetchall()
    w = rng.randint(3, 20)
    tis = IntervalSet.around(np.array([a[0] for a in anchors], np.int64), np.array([a[1] for a in anchors], np.int64),
                             w, w)
    rows = duck.execute(f"SELECT {pk_sql}, ts FROM ev WHERE ({cond}) AND ts IS NOT NULL").fetchall()
    pk = np.array([r[0] for r in rows], np.int64)
    ts = np.array([r[1] for r in rows], np.int64)
    inside = tis.contains(pk, ts)
    order = np.lexsort((ts[inside], pk[inside]))
    want_pk, want_t = pk[inside][order], ts[inside][order]
    all_rows = duck.execute(f"SELECT id, {pk_sql}, ts FROM ev WHERE v > 20").fetchall()
    keep = tis.contains(np.array([r[1] for r in all_rows], np.int64), np.array([r[2] for r in all_rows], np.int64))
    want_ids = sorted(r[0] for r, k in zip(all_rows, keep) if k)
    counts = duck.execute(f"SELECT count(*) FILTER (WHERE {cond}), count(*), min(ts), max(ts) FROM ev").fetchall()[0]
    try:
        for source in sources:
            assert source.schema("ev").equals(data.schema)
            st = source.stats("ev", [cond, "TRUE"], '"ts"', part)
            assert (st.counts[0], st.rows, st.kmin, st.kmax) == counts and st.counts[1] == st.rows
            got_pk, got_t = source.candidates("ev", cond, '"ts"', part, tis)
            np.testing.assert_array_equal(got_t, want_t)
            np.testing.assert_array_equal(got_pk, want_pk)
            everything = source.candidates("ev", cond, '"ts"', part)
            assert len(everything[0]) == len(rows)
            pulled = source.pull_rows("ev", ["id", "v"], "v > 20", tis, '"ts"', part)
            assert pulled.schema.equals(data.schema)
            assert sorted(pulled.column("id").to_pylist()) == want_ids
            assert pulled.column("type").null_count == pulled.num_rows  # columns not asked for travel as NULLs
    finally:
        sources[-1].close()
        duck.close()


def _engine_args(data: pa.Table, sql: str, source: Source) -> tuple:
    """(table, columns, push-down filter, interval plan) the engine hands to the pull of ``sql``'s
    input when ``ev`` is read through ``source`` as a compute node reads storage nodes."""
    from matchrec.engine.statement import StatementRunner
    from matchrec.parser.classify import classify
    con = matchrec.connect()
    try:
        con.duckdb_connection.register("ev", data)
        seen: list = []
        StatementRunner(con.duckdb_connection, con.settings, con.dialect, _Recorder(source, seen)).prepare(
            classify(sql, con.dialect))
    finally:
        con.close()
    assert len(seen) == 1 and seen[0][3] is not None, sql  # read once, by dual filtering
    return seen[0]


def test_local_query_source_runs_dfs_stateful_as_dfs_and_names_itself_in_errors():
    rng = random.Random(7)
    data = _table(rng, 400)
    duck = duckdb.connect()
    duck.register("ev_arrow", data)
    source = LocalSource(duck, query="SELECT * FROM ev_arrow WHERE v >= 0", name="ev")
    assert not source.sessions and source.shard_count == 1
    sql = _statement(rng, 1)
    want = _matches_over(data, sql)
    table, columns, row_filter, ip = _engine_args(data, sql, source)
    stats = PullStats()
    pulled = DualFiltering(source).pull(table, "dfs_stateful", columns, row_filter, ip, "always", stats)
    assert any("ran as dfs" in n for n in stats.notes)
    assert _matches_over(pulled, sql) == want
    with pytest.raises(matchrec.ProgrammingError, match="local source ev"):
        source.call_all({"op": "candidates", "table": "ev", "condition": "v >", "key_sql": "ts"})
    with pytest.raises(matchrec.ProgrammingError, match="either a table or a query"):
        LocalSource(duck)
    duck.close()


def test_spark_partitions_as_a_source_give_the_local_intervals_and_matches():
    from spark_conformance import spark_session
    import matchrec.spark as ms
    rng = random.Random(11)
    data = _table(rng, 500)
    duck = duckdb.connect()
    duck.register("ev_arrow", data)
    local = LocalSource(duck, query="SELECT * FROM ev_arrow", name="events")
    spark = spark_session()
    try:
        df = spark.createDataFrame(data.to_pandas(), schema="id long, ts long, type string, g int, p int, v int")
        source = ms.source(df.repartition(3).cache(), data.schema)
        assert isinstance(source, SparkSource)
        assert source.shard_count == 3 and source.table == "events"
        for shape in (1,):  # the chain with a join: rounds with join filters both ways
            sql = _statement(rng, shape)
            want = _matches_over(data, sql)
            _, columns, row_filter, ip = _engine_args(data, sql, LocalSource(duck, query="SELECT * FROM ev_arrow",
                                                                             name="ev"))
            for strategy in ("naive_dfs", "dfs"):
                exact = strategy == "naive_dfs"
                mine = DualFiltering(local).rounds("events", columns, ip, exact, "always", PullStats())
                theirs = DualFiltering(source).rounds("events", columns, ip, exact, "always", PullStats())
                _same_rounds(mine, theirs, all_points=exact)
                pulled = DualFiltering(source).pull("events", strategy, columns, row_filter, ip, "always",
                                                    PullStats())
                assert _matches_over(pulled, sql) == want, (strategy, sql)
                assert source.final_rows(theirs.request, theirs.blobs).count() == pulled.num_rows
    finally:
        spark.stop()
        duck.close()


class _Recorder:
    """A compute node's store over a local source: the engine reads through it as it reads
    storage nodes, and the arguments of each pull are kept."""

    def __init__(self, source: LocalSource, seen: list):
        self.source = source
        self.schemas = source.schemas
        self.seen = seen

    def bare_table(self, text):
        return self.source.bare_table(text)

    def pull(self, table, strategy, columns, row_filter, ip, round_trips, stats):
        self.seen.append((table, columns, row_filter, ip))
        return DualFiltering(self.source).pull(table, strategy, columns, row_filter, ip, round_trips, stats)

    def pull_all(self, table, stats):
        return self.source.pull_all(table, stats)


def test_remote_store_is_a_node_source():
    assert issubclass(RemoteStore, NodeSource) and issubclass(NodeSource, Source)
