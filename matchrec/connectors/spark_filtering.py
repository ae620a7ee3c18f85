"""Dual filtering on Spark: every partition of the input plays a storage node.

The rounds are those of the storage-node strategy (``RemoteStore.filter_rounds``: candidate
counts, rounds in ascending count, time interval sets sent as shrinking window filters, join
filters for equality conditions, the cost model), and each partition answers them with the same
``ShardService`` a storage node runs, over its rows loaded into an in-memory DuckDB. A round is a
Spark job (DataFrame operations only, so it runs under Spark Connect too): its request and
payloads travel with the task function, the small replies come back to the driver. The final pull is not collected: it is a ``mapInArrow`` over the cached input that
keeps only rows inside the final time interval set, and only those rows are shuffled to the
matching stage.

``run_many`` makes one set of rounds for each group of statements sharing a shuffle and for each
statement matched alone (``GroupRounds``), and the sets of all of them over one table come from a
single Spark job (``TableRounds``, ``filter_table``) in which every partition loads its rows once
and answers the statistics and the candidates of each distinct element condition (with the values
of the equality conditions' join filters); each statement's set is derived from those replies on
the driver, its join filters applied there, and one final pull per group keeps the rows inside the
union of its sets. Spark's per-job cost dwarfs the candidates' bytes, so the job trades the
rounds' shrinking filters for fewer jobs.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from matchrec.connectors.dual_filtering import _refine, tis_payload
from matchrec.connectors.duckdb_source import DuckDBOracle
from matchrec.connectors.remote import NodeTraffic, PullStats, RemoteStore
from matchrec.connectors.shard import DEFAULT_MAX_PAYLOAD_MB, ShardService, unpack_candidates
from matchrec.connectors.source import Source
from matchrec.connectors.spark_common import cache
from matchrec.connectors.spark_matching import conform
from matchrec.connectors.spark_metrics import ShuffleMeter, collect
from matchrec.operators.intervals import IntervalSet
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


FREQUENT = (0.25, 50_000)  # auto mode: shared rounds skip conditions above this share and count of rows
GROUP_ROUNDS = "spark.matchrec.groupRounds"  # the session conf choosing a group's rounds: shared | each


def rounds_mode(spark, rounds: str | None = None) -> str:
    """``rounds``, else the session conf ``spark.matchrec.groupRounds``, else "shared"; checked."""
    if rounds is None:
        rounds = spark.conf.get(GROUP_ROUNDS, None) or "shared"
    if rounds not in ("shared", "each"):
        from matchrec.errors import ProgrammingError
        raise ProgrammingError(f"{GROUP_ROUNDS} must be shared or each, not {rounds!r}")
    return rounds


def filter_by_plans(df, schema: pa.Schema, ips: list, mode: str, rid: str, rounds: str | None = None):
    """Interval filtering for a group of statements over one DataFrame (``matchrec.spark.run_many``),
    then ONE final pull keeping a row when any statement's final interval set holds it, so the
    group's shuffle carries each row once. ``rounds`` (default: the session conf
    ``spark.matchrec.groupRounds``, else "shared"): "shared" finds every statement's set with one
    Spark job for the whole group (``shared_sets``); "each" makes each statement's own rounds
    (``filter_by_plan``'s, several jobs per statement), kept to measure what sharing saves.
    (DataFrame or None, [FilterReport per statement]); None when a statement cannot be filtered
    (it needs every row) or, in auto mode, the input is too small for the rounds to pay."""
    reports = [FilterReport() for _ in ips]
    if any(ip is None for ip in ips):
        for r in reports:
            r.reason = "not used (a statement of the group needs every row)"
        return None, reports
    if rounds_mode(df.sparkSession, rounds) == "shared" and len({ip.key_sql for ip in ips}) == 1:
        return _shared_filter(df, schema, ips, mode, rid)
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


def answer_batch(con, requests: list[dict], skip: tuple[float, int] | None = None) -> list[pa.Table]:
    """The replies of one partition (its rows in ``con``'s table ``TABLE``) to several requests.
    With ``skip`` (share, rows) and a statistics request first, a candidates request whose
    condition holds on more than that share of the partition's rows and more than ``rows`` rows
    gets the reply ``{"skipped": [count]}`` instead: its intervals would cover nearly everything,
    and its candidates would be the bulk of the job's reply."""
    service = ShardService(con, DEFAULT_MAX_PAYLOAD_MB << 20)
    replies, counts, n = [], {}, 0
    for r in requests:
        count = counts.get(r.get("condition")) if r["op"] == "candidates" else None
        if skip is not None and count is not None and count > max(skip[0] * n, skip[1]):
            replies.append(pa.table({"skipped": pa.array([count], pa.int64())}))
            continue
        reply = service.answer(r, [])
        if r["op"] == "stats":
            # a condition's count is the same whatever key a statistics request names: kept across them
            counts.update({c: int(reply.column(f"c{i}")[0].as_py() or 0) for i, c in enumerate(r["conditions"])})
            n = int(reply.column("n")[0].as_py() or 0)
        replies.append(reply)
    return replies


def batch_task(requests_json: str, schema: pa.Schema, skip: tuple[float, int] | None = None):
    """A ``mapInArrow`` function: the partition answers several requests over one load of its rows
    (``answer_batch``); one row per reply (its request's index, the reply as Arrow IPC bytes)."""

    def run(batches):
        con = _load(batches, schema)
        try:
            replies = answer_batch(con, json.loads(requests_json), skip)
        finally:
            con.close()
        out = []
        for reply in replies:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, reply.schema) as w:
                w.write_table(reply)
            out.append(sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_pydict({"i": list(range(len(out))), "reply": out},
                                         schema=pa.schema([("i", pa.int32()), ("reply", pa.binary())]))
    return run


def joined_pairs(ips: list):
    """(statement's plan, consumer, join, source) for each join filter of the statements: an
    equality whose one source variable precedes its consumer in every match."""
    out = []
    for ip in ips:
        by_label = {v.label: v for v in ip.variables}
        for v in ip.variables:
            for j in v.joins:
                if len(j.sources) == 1 and next(iter(j.sources)) in by_label:
                    out.append((ip, v, j, by_label[next(iter(j.sources))]))
    return out


def _near(a: tuple, b: tuple, lo: int, hi: int) -> np.ndarray:
    """For each candidate of ``a`` (partitions, value hashes, slots): whether ``b`` has one with the
    same partition and value and a slot in ``[slot + lo, slot + hi]`` (``lo <= 0 <= hi``)."""
    (pa_, va, sa), (pb, vb, sb) = a, b
    if not len(sa) or not len(sb):
        return np.zeros(len(sa), bool)
    pairs = np.stack([np.r_[pa_, pb], np.r_[va, vb]], axis=1)
    _, group = np.unique(pairs, axis=0, return_inverse=True)
    group = group.reshape(-1).astype(np.int64)
    low = min(int(sa.min()), int(sb.min()))
    span = max(int(sa.max()), int(sb.max())) - low + (hi - lo) + 2
    if span <= 0 or (int(group.max()) + 1) > (1 << 62) // span:
        return np.ones(len(sa), bool)  # too wide to number as one line: keep every candidate
    # each (partition, value) on its own stretch of one line, wide enough that a range never leaves it
    line = group * span + (np.r_[sa, sb].astype(np.int64) - low) - lo + 1
    ka, kb = line[:len(sa)], np.sort(line[len(sa):])
    return np.searchsorted(kb, ka + hi, "right") > np.searchsorted(kb, ka + lo, "left")


def _join_kept(ip, slots_of: dict, pk_of: dict, values_of: dict, quantum: int) -> dict[int, np.ndarray]:
    """Which candidates of each variable of ``ip`` the statement's join filters keep, as its own
    rounds apply them but exactly, at slot precision, and from one set of replies: a consumer's
    candidate needs a source candidate with its value at most the window before it; a source
    taking at most one row of a match needs a consumer candidate at most the window after it.
    Both sides are judged against the other's full candidates, so neither filter drops a row any
    match takes. Variable index -> mask, for the variables some join filter reads."""
    index = {v.label: i for i, v in enumerate(ip.variables)}
    reach = ip.window // quantum + 1  # slots a window can span, rounded up
    keep: dict[int, np.ndarray] = {}
    for _, v, j, source in joined_pairs([ip]):
        if v.condition not in slots_of or source.condition not in slots_of:
            continue  # a side too frequent to ask: nothing to compare with
        cons = (pk_of[v.condition], values_of[v.condition][(j.current_sql, j.common_type)], slots_of[v.condition])
        src = (pk_of[source.condition], values_of[source.condition][(j.other_sql, j.common_type)],
               slots_of[source.condition])
        ci, si = index[v.label], index[source.label]
        keep[ci] = keep.get(ci, np.ones(len(cons[2]), bool)) & _near(cons, src, -reach, 0)
        if source.at_most_once:
            keep[si] = keep.get(si, np.ones(len(src[2]), bool)) & _near(src, cons, 0, reach)
    return keep


def _distinct_slots(pk: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates carrying values come once per value: once per (partition, slot) here."""
    if not len(slots):
        return pk, slots
    both = np.unique(np.stack([pk, slots], axis=1), axis=0)
    return both[:, 0].copy(), both[:, 1].copy()


@dataclass
class GroupRounds:
    """One set of rounds for a group of statements over one key (``ips``): the requests every
    partition answers in one job (the statistics, then the candidates of each distinct element
    condition, each asked once however many statements or elements have it)."""
    ips: list
    conds: list[str]
    quantum: int
    partition_sql: list[str]
    requests: list[dict]

    @classmethod
    def of(cls, ips: list) -> "GroupRounds":
        same = len({tuple(ip.partition_sql) for ip in ips}) == 1
        # statements partitioned differently: their sets over all partitions at once (a superset of each)
        partition_sql = list(ips[0].partition_sql) if same else []
        base = {"table": TABLE, "key_sql": ips[0].key_sql, "partition_sql": partition_sql}
        quantum = max(1, min(ip.window for ip in ips) // 20)
        conds = list(dict.fromkeys(v.condition for ip in ips for v in ip.variables))
        values: dict[str, list] = {c: [] for c in conds}  # condition -> the join values its candidates carry
        for ip, v, j, source in joined_pairs(ips):
            for cond, value in ((v.condition, [j.current_sql, j.common_type]),
                                (source.condition, [j.other_sql, j.common_type])):
                if value not in values[cond]:
                    values[cond].append(value)
        requests = [{"op": "stats", "conditions": conds, "columns": [], "sample": False, **base}]
        requests += [{"op": "candidates", "condition": c, "packed": True, "quantum": quantum, "joins": [],
                      "values": values[c], **base} for c in conds]
        return cls(list(ips), conds, quantum, partition_sql, requests)

    def sets(self, parts: list[list[pa.Table]], received: int = 0) -> "SharedSets":
        """Each statement's time interval set from the replies (``parts[i]``: every partition's reply
        to request ``i``): the intervals around the candidates of its elements intersected, rarest
        first, dropping intervals around candidates that left the set (``dual_filtering._refine``),
        as its own rounds would, after its join filters (``_join_kept``). No round waits for an
        earlier one's set to filter its candidates (on Spark a job costs far more than the
        candidates it returns): each set holds every row its statement's matches look at."""
        stats, conds = parts[0], self.conds
        n = sum(int(p.column("n")[0].as_py() or 0) for p in stats)
        counts = [sum(int(p.column(f"c{i}")[0].as_py() or 0) for p in stats) for i in range(len(conds))]
        bits = None
        if self.partition_sql:
            # enough bits to tell the partitions apart (a shared hash only merges intervals, never loses rows)
            found = max((int(p.column("parts")[0].as_py() or 1) for p in stats), default=1)
            bits = int(min(32, math.ceil(math.log2(found + 1)) + 1))
        slots_of, pk_of, values_of = {}, {}, {}
        skipped = [c for c, got in zip(conds, parts[1:]) if any("skipped" in p.column_names for p in got)]
        for c, got, request in zip(conds, parts[1:], self.requests[1:]):
            if c in skipped:  # some partition found it frequent: no statement intersects its intervals
                continue
            asked = [tuple(v) for v in request["values"]]
            names = (["pk"] if self.partition_sql else []) + [f"v{k}" for k in range(len(asked))] + ["s"]
            cand = unpack_candidates(got, names, Source.max_reply)
            slots_of[c] = cand["s"]
            # the replies' hashes have 32 bits: their top ``bits`` name the partition as the final pull's do
            pk_of[c] = cand["pk"] >> (32 - bits) if bits else np.zeros(len(cand["s"]), np.int64)
            values_of[c] = {v: cand[f"v{k}"] for k, v in enumerate(asked)}
        sets, dropped, distinct = [], 0, {}
        q = self.quantum
        for ip in self.ips:
            tis, points = None, {}
            keep = _join_kept(ip, slots_of, pk_of, values_of, q)
            dropped += sum(len(k) - int(k.sum()) for k in keep.values())
            mine = [i for i, v in enumerate(ip.variables) if v.condition in slots_of]
            for i in sorted(mine, key=lambda i: counts[conds.index(ip.variables[i].condition)]):
                v = ip.variables[i]
                pk, slots = pk_of[v.condition], slots_of[v.condition]
                if i in keep:
                    pk, slots = _distinct_slots(pk[keep[i]], slots[keep[i]])
                elif values_of[v.condition]:
                    if v.condition not in distinct:
                        distinct[v.condition] = _distinct_slots(pk, slots)
                    pk, slots = distinct[v.condition]
                new = IntervalSet.around_slots(pk, slots, q, v.before, v.after)
                points[i] = (pk, slots * q, slots * q + (q - 1))
                tis = new if tis is None else tis.intersect(new)
                tis = _refine(tis, points, ip)
            sets.append(tis)
        return SharedSets(sets, bits, n, len(stats), {c: len(slots_of[c]) for c in slots_of}, received, skipped,
                          dropped)

    def pull(self, found: "SharedSets", columns: list[str]) -> tuple[dict, list[bytes]]:
        """The final pull: the rows inside the union of the statements' sets that meet any of their
        row filters (every row when a statement has none)."""
        ips = self.ips
        filters = [ip.row_filter for ip in ips]
        where = None if any(f is None for f in filters) else " OR ".join(f"({f})" for f in dict.fromkeys(filters))
        union = IntervalSet._merged(*(np.concatenate(x) for x in zip(*[(s.pk, s.lo, s.hi) for s in found.sets])))
        kind, blob = tis_payload(union, max(ip.window for ip in ips), False)
        request = {"op": "pull", "table": TABLE, "columns": columns, "where": where, "key_sql": ips[0].key_sql,
                   "partition_sql": self.partition_sql, "filter": {"kind": kind, "blob": 0},
                   "range": [int(union.lo.min()), int(union.hi.max())] if len(union) else [1, 0]}
        if found.bits is not None:
            request["pk_bits"] = found.bits
        found.union = union
        return request, [blob]


@dataclass
class SharedSets:
    """What one set of rounds for a group found: each statement's time interval set (None: none of
    its elements had candidates asked), the partition-hash bits they are keyed by (None: no
    partitions), the input's rows and partitions, candidate slots per condition, reply bytes."""
    sets: list
    bits: int | None
    rows: int
    partitions: int
    candidates: dict
    received: int
    skipped: list = field(default_factory=list)  # conditions some partition found too frequent to ask
    joined_out: int = 0  # candidates the join filters dropped, over all statements
    union: object = None


@dataclass
class TableRounds:
    """The rounds of several groups over one table, answered in ONE Spark job: every group's
    requests in the group's order, a request asked by several groups (the same condition over the
    same key, partitions and quantum) asked once; ``at[g]``: where group ``g``'s requests lie."""
    groups: list
    requests: list[dict]
    at: list[list[int]]

    @classmethod
    def of(cls, groups: list[GroupRounds]) -> "TableRounds":
        requests, at, seen = [], [], {}
        for g in groups:
            mine = []
            for r in g.requests:
                text = json.dumps(r, sort_keys=True)
                if text not in seen:
                    seen[text] = len(requests)
                    requests.append(r)
                mine.append(seen[text])
            at.append(mine)
        return cls(list(groups), requests, at)

    def sets(self, parts: list[list[pa.Table]], received: int = 0) -> list[SharedSets]:
        """Each group's ``SharedSets`` from every partition's replies to ``requests``."""
        return [g.sets([parts[i] for i in mine], received) for g, mine in zip(self.groups, self.at)]


def table_sets(df, schema: pa.Schema, rounds: TableRounds, skip: tuple[float, int] | None = None) -> list[SharedSets]:
    """Every group's time interval sets from ONE Spark job over ``df``: each partition loads its
    rows once and answers all of ``rounds``' requests (``answer_batch``, with ``skip``)."""
    task = batch_task(json.dumps(rounds.requests), schema, skip)
    rows = collect(df.mapInArrow(task, "i int, reply binary"))
    parts: list[list[pa.Table]] = [[] for _ in rounds.requests]
    for r in rows:
        parts[r["i"]].append(pa.ipc.open_stream(pa.py_buffer(r["reply"])).read_all())
    return rounds.sets(parts, sum(len(r["reply"]) for r in rows))


def shared_sets(df, schema: pa.Schema, rounds: GroupRounds, skip: tuple[float, int] | None = None) -> SharedSets:
    """The statements' time interval sets of one group from ONE Spark job over ``df``."""
    return table_sets(df, schema, TableRounds.of([rounds]), skip)[0]


def filter_table(df, schema: pa.Schema, groups: list[tuple], mode: str, rid: str) -> list[tuple]:
    """Interval filtering for every group of statements over one table (``run_many``: each shared
    shuffle, and each statement matched alone, by time ranges or by one task) with ONE Spark job
    over ``df``, the table's cached scan of Arrow schema ``schema``: every partition loads its rows
    once and answers the requests of all groups (``TableRounds``); each statement's set is made on
    the driver. ``groups``: (the group's rows, a DataFrame narrowed from ``df``; their Arrow schema;
    the interval plans of its statements). Per group: (DataFrame of the rows inside any of its
    statements' sets, each once, or None; [FilterReport per statement])."""
    meter = ShuffleMeter(df.sparkSession)
    out: list = [None] * len(groups)
    asked = []
    for g, (_, _, ips) in enumerate(groups):
        reports = [FilterReport() for _ in ips]
        out[g] = (None, reports)
        if any(ip is None for ip in ips):
            for r in reports:
                r.reason = "not used (a statement of the group needs every row)"
        else:
            asked.append(g)
    if not asked:
        return out
    t0 = time.perf_counter()
    rounds = TableRounds.of([GroupRounds.of(groups[g][2]) for g in asked])
    # auto: a condition on more than a quarter of a partition's rows (and 50,000 of them) is not
    # asked, its candidates would be the bulk of the reply for little shrinking; on: all are asked
    found = table_sets(df, schema, rounds, FREQUENT if mode == "auto" else None)
    seconds = time.perf_counter() - t0
    shuffle = meter.delta()
    statements = sum(len(groups[g][2]) for g in asked)
    whole = f"1 Spark job in {seconds:.3f} s" + (f" (the table's {statements} statements in {len(asked)} groups, "
                                                 f"{len(rounds.requests)} requests)" if len(asked) > 1 else "")
    for k, g in enumerate(asked):
        src, src_schema, ips = groups[g]
        reports = out[g][1]
        kept = _group_pull(src, src_schema, ips, rounds.groups[k], found[k], mode, rid, reports, whole)
        out[g] = (kept, reports)
        if kept is not None and shuffle is not None:
            reports[0].shuffle, shuffle = shuffle, None  # the job once, with the first group filtered
    return out


def _group_pull(src, schema: pa.Schema, ips: list, rounds: GroupRounds, found: SharedSets, mode: str, rid: str,
                reports: list, job: str):
    """The final pull of one group's rows (``src``) inside the union of its statements' sets, and
    their reports; None when the group is not filtered after all."""
    for r in reports:
        r.rows_in = found.rows
    if mode == "auto" and found.rows < MIN_ROWS:
        for r in reports:
            r.reason = f"not used ({found.rows} rows: below {MIN_ROWS}, the final pull would cost more)"
        return None
    if any(s is None for s in found.sets):
        for r in reports:
            r.reason = ("not used (a statement's element conditions were all too frequent to ask: it needs "
                        "every row)")
        return None
    request, blobs = rounds.pull(found, list(schema.names))
    conditions = ", ".join(f"{n:,}" for n in found.candidates.values()) + \
        (f"; {len(found.skipped)} too frequent, not asked" if found.skipped else "") + \
        (f"; join filters dropped {found.joined_out:,}" if found.joined_out else "")
    for k, (ip, tis, report) in enumerate(zip(ips, found.sets, reports)):
        report.used = True
        report.reason = "used: " + "; ".join(ip.describe()[:1])
        report.notes.append(f"time interval set: {len(tis)} intervals covering {tis.total_length()} key units; " +
                            (f"one final pull for the {len(ips)} statements of the shuffle keeps rows inside any of "
                             "their time interval sets" if len(ips) > 1 else
                             "the final pull keeps rows inside it before the shuffle"))
        if k == 0:
            whose = f"the {len(ips)} statements'" if len(ips) > 1 else "the statement's"
            report.notes.append(f"shared rounds: {job}; {whose} "
                                f"{len(found.candidates)} distinct element conditions ({conditions} candidate "
                                f"slots, {found.received:,} bytes back) over {found.partitions} partitions; final "
                                f"pull filter: time {request['filter']['kind']} {len(blobs[0]):,} B, "
                                f"{len(found.union)} intervals")
    return src.mapInArrow(pull_any_task([(json.dumps(request), blobs)], schema, rid), src.schema)


def _shared_filter(df, schema: pa.Schema, ips: list, mode: str, rid: str):
    """``filter_by_plans`` with one set of rounds for the whole group (``GroupRounds``, one Spark
    job), then the final pull of the rows inside the union of the sets."""
    cached = cache(df)
    kept, reports = filter_table(cached, schema, [(cached, schema, ips)], mode, rid)[0]
    if kept is None:
        cached.unpersist()
    return kept, reports


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
