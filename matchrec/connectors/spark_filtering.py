"""Dual filtering on Spark: every partition of the input plays a storage node.

The rounds are those of the storage-node strategy (``RemoteStore.filter_rounds``: candidate
counts, rounds in ascending count, time interval sets sent as shrinking window filters, join
filters for equality conditions, the cost model), and each partition answers them with the same
``ShardService`` a storage node runs, over its rows loaded into an in-memory DuckDB. A round is a
Spark job (DataFrame operations only, so it runs under Spark Connect too): its request and
payloads travel with the task function, the small replies come back to the driver. The final pull is not collected: it is a ``mapInArrow`` over the cached input that
keeps only rows inside the final time interval set, and only those rows are shuffled to the
matching stage.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from matchrec.connectors.duckdb_source import DuckDBOracle
from matchrec.connectors.remote import NodeTraffic, PullStats, RemoteStore
from matchrec.connectors.shard import DEFAULT_MAX_PAYLOAD_MB, ShardService
from matchrec.connectors.source import Source
from matchrec.connectors.spark_common import cache
from matchrec.connectors.spark_matching import conform
from matchrec.connectors.spark_metrics import ShuffleMeter, collect
from matchrec.parser import hidden as H
from matchrec.planner.fastpath import fast_plan
from matchrec.planner.intervals import interval_plan

TABLE = "events"
MIN_ROWS = 200_000  # below this, the jobs of the rounds cost more than any shuffle they save (auto)


@dataclass
class FilterReport:
    used: bool = False
    reason: str = ""
    pull: PullStats | None = None
    rows_in: int = 0
    notes: list[str] = field(default_factory=list)
    shuffle: object = None  # spark_metrics.Shuffle of the rounds' jobs

    def lines(self) -> list[str]:
        out = [f"interval filtering: {self.reason}"] if self.reason else []
        if self.pull is not None:
            out += self.pull.lines()
        return out + self.notes


def _load(batches, schema: pa.Schema):
    con = duckdb.connect()
    con.execute("SET threads = 1")  # Spark runs one task per core already
    batches = [b for b in batches if b.num_rows]
    table = conform(pa.Table.from_batches(batches), schema) if batches else schema.empty_table()
    con.register(H.PARTITION, table)
    con.execute(f"CREATE TABLE {TABLE} AS SELECT * FROM {H.PARTITION}")
    con.unregister(H.PARTITION)
    return con


def answer_task(request_json: str, blobs: list[bytes], schema: pa.Schema):
    """A ``mapInArrow`` function: the partition answers one request (reply as Arrow IPC bytes)."""

    def run(batches):
        con = _load(batches, schema)
        try:
            reply = ShardService(con, DEFAULT_MAX_PAYLOAD_MB << 20).answer(json.loads(request_json), blobs)
        finally:
            con.close()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reply.schema) as w:
            w.write_table(reply)
        yield pa.RecordBatch.from_pydict({"reply": [sink.getvalue().to_pybytes()]},
                                         schema=pa.schema([("reply", pa.binary())]))
    return run


def rows_task():
    """A ``mapInArrow`` function: one row per partition, with its row count."""
    def run(batches):
        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"n": [n]}, schema=pa.schema([("n", pa.int64())]))
    return run


def pull_task(request_json: str, blobs: list[bytes], schema: pa.Schema):
    """A ``mapInArrow`` function: the partition's rows inside the final time interval set."""

    def run(batches):
        con = _load(batches, schema)
        try:
            rows = ShardService(con, DEFAULT_MAX_PAYLOAD_MB << 20).answer(json.loads(request_json), blobs)
        finally:
            con.close()
        yield from conform(rows, schema).to_batches()
    return run


class _Partition:
    def __init__(self, i: int):
        self.uri = f"spark partition {i}"


class SparkShards(RemoteStore):
    """The storage-node strategy's driver side over the partitions of a cached DataFrame."""

    def __init__(self, df, schema: pa.Schema, partitions: int):
        self.df = df
        self.spark = df.sparkSession
        self.schema = schema
        self.nodes = [_Partition(i) for i in range(partitions)]
        self.retries = 0
        self.bandwidth = None
        self.rtt = 0.0
        self.schemas = {TABLE: schema}
        self.indexed: set[str] = set()  # partitions have no ACER index

    def call_all(self, request: dict, blobs: list[bytes] | None = None, stats: PullStats | None = None,
                 nodes=None) -> list[pa.Table]:
        blobs = blobs or []
        started = time.perf_counter()
        # the payloads travel inside the task function (Spark broadcasts a large one by itself)
        rows = collect(self.df.mapInArrow(answer_task(json.dumps(request), blobs, self.schema), "reply binary"))
        replies = [pa.ipc.open_stream(pa.py_buffer(r["reply"])).read_all() for r in rows]
        elapsed = time.perf_counter() - started
        if stats is not None:
            stats.round_trips += 1
            sent = sum(len(b) for b in blobs) + len(json.dumps(request))
            for i, reply in enumerate(replies):
                t = stats.nodes.setdefault(f"spark partition {i}", NodeTraffic())
                t.sent += sent
                t.received += len(rows[i]["reply"])
                t.calls += 1
                t.seconds += elapsed
        moved = sum(len(r["reply"]) for r in rows) + len(self.nodes) * sum(len(b) for b in blobs)
        if moved > 256 * 1024 and elapsed > 0:
            observed = moved / elapsed
            self.bandwidth = observed if self.bandwidth is None else 0.7 * self.bandwidth + 0.3 * observed
        return replies

    def final_rows(self, request: dict, blobs: list[bytes]):
        return self.df.mapInArrow(pull_task(json.dumps(request), blobs, self.schema), self.df.schema)


def filter_rows(df, analysis, mode: str):
    """(DataFrame of the rows inside the final time intervals or None, FilterReport)."""
    report = FilterReport()
    plan = analysis.plan
    con = duckdb.connect()
    try:
        ip, why = interval_plan(plan, fast_plan(plan), DuckDBOracle(con))
    finally:
        con.close()
    if ip is None:
        report.reason = f"not used ({why})"
        return None, report
    return filter_by_plan(df, analysis.input_schema, ip, mode)


def filter_by_plan(df, schema: pa.Schema, ip, mode: str):
    """(DataFrame of the rows of ``df`` inside the final time intervals of the interval plan ``ip``
    or None, FilterReport): the rounds of any form's plan (MATCH_RECOGNIZE's, or a CER statement's
    from ``planner.cer_intervals``); ``schema`` is the Arrow schema of ``df``."""
    report = FilterReport()
    meter = ShuffleMeter(df.sparkSession)
    cached = cache(df)
    stats = PullStats(strategy="dfs")
    t0 = time.perf_counter()
    # one job gives both the row count (auto mode) and the partitions that play storage nodes
    sizes = collect(cached.mapInArrow(rows_task(), "n long"))
    shards = SparkShards(cached, schema, max(1, len(sizes)))
    if mode == "auto":
        rows = sum(r[0] for r in sizes)
        report.rows_in = rows
        if rows < MIN_ROWS:
            report.reason = f"not used ({rows} rows: below {MIN_ROWS}, the rounds' jobs would cost more)"
            cached.unpersist()
            return None, report
    trips = "auto" if mode == "auto" else "always"
    request, blobs = shards.filter_rounds(TABLE, list(schema.names), ip, exact=False,
                                          round_trips=trips, stats=stats)
    stats.phases["rounds"] = time.perf_counter() - t0
    report.used = True
    report.pull = stats
    report.reason = "used: " + "; ".join(ip.describe()[:1])
    report.shuffle = meter.delta()
    report.notes.append(f"rounds ran {stats.round_trips} Spark jobs in {stats.phases['rounds']:.3f} s; the final "
                        "pull keeps rows inside the time interval set before the shuffle")
    return shards.final_rows(request, blobs), report


def pull_any_task(requests: list[tuple[str, list[bytes]]], schema: pa.Schema, rid: str):
    """A ``mapInArrow`` function: the partition's rows inside the final time interval set of any
    of ``requests``, each row once (by its row number ``rid``), in row-number order."""
    import numpy as np

    def run(batches):
        con = _load(batches, schema)
        try:
            service = ShardService(con, DEFAULT_MAX_PAYLOAD_MB << 20)
            kept = [conform(service.answer(json.loads(r), blobs), schema) for r, blobs in requests]
        finally:
            con.close()
        rows = pa.concat_tables(kept) if kept else schema.empty_table()
        if not rows.num_rows:
            return
        ids = rows.column(rid).to_numpy()
        _, first = np.unique(ids, return_index=True)  # sorted by row number: the source's order
        yield from rows.take(pa.array(first)).to_batches()
    return run


def filter_by_plans(df, schema: pa.Schema, ips: list, mode: str, rid: str):
    """Interval filtering for a group of statements over one DataFrame (``matchrec.spark.run_many``):
    each statement's own rounds (``filter_by_plan``'s), then ONE final pull keeping a row when any
    statement's final interval set holds it, so the group's shuffle carries each row once.
    (DataFrame or None, [FilterReport per statement]); None when a statement cannot be filtered
    (it needs every row) or, in auto mode, the input is too small for the rounds to pay."""
    reports = [FilterReport() for _ in ips]
    if any(ip is None for ip in ips):
        for r in reports:
            r.reason = "not used (a statement of the group needs every row)"
        return None, reports
    cached = cache(df)
    sizes = collect(cached.mapInArrow(rows_task(), "n long"))
    rows = sum(r[0] for r in sizes)
    if mode == "auto" and rows < MIN_ROWS:
        for r in reports:
            r.rows_in = rows
            r.reason = f"not used ({rows} rows: below {MIN_ROWS}, the rounds' jobs would cost more)"
        cached.unpersist()
        return None, reports
    shards = SparkShards(cached, schema, max(1, len(sizes)))
    trips = "auto" if mode == "auto" else "always"
    requests = []
    for ip, report in zip(ips, reports):
        meter = ShuffleMeter(df.sparkSession)
        stats = PullStats(strategy="dfs")
        t0 = time.perf_counter()
        request, blobs = shards.filter_rounds(TABLE, list(schema.names), ip, exact=False,
                                              round_trips=trips, stats=stats)
        stats.phases["rounds"] = time.perf_counter() - t0
        requests.append((json.dumps(request), blobs))
        report.used, report.pull, report.rows_in = True, stats, rows
        report.reason = "used: " + "; ".join(ip.describe()[:1])
        report.shuffle = meter.delta()
        report.notes.append(f"rounds ran {stats.round_trips} Spark jobs in {stats.phases['rounds']:.3f} s; one final "
                            f"pull for the {len(ips)} statements of the shuffle keeps rows inside any of their time "
                            "interval sets")
    return cached.mapInArrow(pull_any_task(requests, schema, rid), cached.schema), reports


class SparkSource(Source):
    """A Spark DataFrame as a source: every partition plays a shard (one Spark job per request,
    each task answering it with ``ShardService`` over its rows loaded into an in-memory DuckDB;
    the replies come back to the driver). The adapter over this module's
    shards: its table is ``TABLE`` whatever the DataFrame's name. Partitions
    keep nothing between jobs, so ``dfs_stateful`` runs as ``dfs``. The rows of a final pull may
    stay in Spark: ``final_rows`` is the DataFrame of the rows inside the final interval set
    (``pull_rows`` and the strategies collect them instead). Cache ``df`` first: every round
    reads it again. The public Spark doors (``matchrec.spark``) prepare the session so that its
    workers import matchrec, and pass the DataFrame's Arrow schema."""

    sessions = False

    def __init__(self, df, schema: pa.Schema):
        partitions = len(collect(df.mapInArrow(rows_task(), "n long")))
        self.table = TABLE
        self.schemas = {TABLE: schema}
        self.indexed: set[str] = set()
        self._shards = SparkShards(df, schema, max(1, partitions))

    @property
    def shard_count(self) -> int:
        return len(self._shards.nodes)

    @property
    def bandwidth(self):
        return self._shards.bandwidth  # refined by the jobs' real transfers

    def call_all(self, request: dict, blobs: list[bytes] | None = None, stats: PullStats | None = None
                 ) -> list[pa.Table]:
        return self._shards.call_all(request, blobs, stats)

    def final_rows(self, request: dict, blobs: list[bytes]):
        return self._shards.final_rows(request, blobs)
