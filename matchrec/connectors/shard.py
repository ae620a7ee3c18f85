"""What a shard answers: the requests of the dual-filtering pull strategies over one DuckDB
database, whoever carries them (a Flight storage node, or a Spark task over its partition).

Requests (a dict plus binary payloads):

* ``tables``: the name and Arrow schema of every table;
* ``stats``: row count, per-condition counts, key range and bytes per row of a sample;
* ``probe``: N bytes of filler, to measure the link's bandwidth;
* ``candidates``: (partition hash, key, value hashes) of rows meeting a condition, checked
  first against a time filter and then against join filters (two-phase verification);
* ``pull``: rows (some columns) meeting a condition whose key passes a time filter;
* ``partial_matches``: the push-pull baseline's partial matching (``connectors.partial_matches``);
* ``end_session``: forget a query session.

These requests are stateless, so a caller may retry one, unless they name a ``session`` (the
``dfs_stateful`` strategy, ``connectors.session``): then ``candidates`` keeps the row ids of the
rows that survive for the round's variable (``var``) and later rounds of the session filter
only the rows kept, and a ``pull`` naming the variables to ``union`` returns the kept rows that
pass its time filter and ends the session. ``expect`` lists the variables the caller knows the
node keeps; when they are not there (restart, expiry) the request fails with ``SessionLost``.
SQL fragments in a request must each parse as one expression that reads no relation, nested at
most ``MAX_NESTING`` deep. A request runs inside ``ShardService.cancellable``: once its caller is
gone, the DuckDB queries it runs are interrupted and it ends with ``RequestCancelled``.
"""
from __future__ import annotations

import functools
import json
import math
import re
import threading
import time
from contextlib import contextmanager

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.connectors import acer
from matchrec.connectors import partial_matches
from matchrec.connectors.requests import RequestCancelled, RequestError, compact as _compact
from matchrec.connectors.requests import check_fragment as _check_fragment
from matchrec.connectors.session import SessionLost, SessionStore, VariableState
from matchrec.operators.intervals import (FilterPayloadError, IntervalSet, ShrinkingWindowFilter, WindowJoinFilter,
                                          distinct, mix)
from matchrec.operators.packing import SlotJoinSet, pack, unpack, unpack_intervals
from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident

DEFAULT_MAX_PAYLOAD_MB = 256
JOIN_INTERVALS_PER_PARTITION = 16  # at most this many per partition hash, a time set is joined in the scan
SAMPLE_ROWS = 5000  # rows per node the statistics and the cost model are estimated from
SAMPLE_PARTITIONS = 32  # whole partitions a node's sample must expect to hold to be taken by partition
MAX_PROBE_BYTES = 16 << 20  # filler one bandwidth probe may ask for
KEPT_STATS_REPLIES = 256  # statistics answers a storage node keeps per table version


@functools.lru_cache(maxsize=1024)
def _checked(sql: str) -> str:
    return _check_fragment(sql)


def check_fragment(sql) -> str:
    """``requests.check_fragment``, remembered for short fragments: every request of a statement
    sends the same conditions again, and parsing them cost a node more than some scans."""
    if isinstance(sql, str) and len(sql) <= 4096:
        return _checked(sql)
    return _check_fragment(sql)


def value_hash(sql: str, typ: str) -> str:
    """SQL of a 31-bit hash of a value: what join filters store and probe (the same on every node)."""
    return f"CAST(hash(CAST(({sql}) AS {typ})) >> 33 AS INTEGER)"


def check_type(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_ ,()\[\]]{0,200}", name):
        raise RequestError("bad type name")
    return name


class ShardService:
    """Answers requests against the tables of one DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, max_payload: int, keep_stats: bool = False,
                 keep_catalog: bool = False):
        self.con = con
        self.max_payload = max_payload
        self.sessions = SessionStore()
        self.indexes = acer.IndexCache()
        # a storage node, whose tables change only through loads (which forget them), keeps each
        # table version's statistics: a statement's first request then scans only for conditions
        # no earlier statement counted
        self.kept_stats = StatsCache() if keep_stats else None
        # and, when it alone changes its tables (``forget`` after each load or index build; a node
        # process holds its DuckDB file's lock, which DuckDB refuses every other process), each
        # table's catalogue entry: two catalogue queries a request cost more than an index lookup
        self._catalog: dict[str, tuple] | None = {} if keep_catalog else None
        self._catalog_lock = threading.Lock()
        self._catalog_generation = 0
        self._request = threading.local()  # the running request's cursors, per serving thread
        self._watchers: dict[float, _Watcher] = {}  # per poll interval, one thread watching every request's caller
        self._watchers_lock = threading.Lock()

    def _cursor(self):
        cur = self.con.cursor()
        running = getattr(self._request, "running", None)
        if running is not None:
            running.adopt(cur)
        return cur

    def _one_row(self, sql: str, params: list) -> tuple:
        """One row of a catalogue query, its cursor closed at once (an open result holds a
        transaction that would stop an index build's CHECKPOINT later in the same request)."""
        cur = self.con.cursor()
        try:
            return cur.execute(sql, params).fetchone()
        finally:
            cur.close()

    @contextmanager
    def cancellable(self, is_cancelled, poll: float):
        """Run the body as one request: a watcher polls ``is_cancelled`` every ``poll`` seconds and,
        once it is true, interrupts the DuckDB cursors the request opened (and any it opens later)."""
        running = _Running()
        self._request.running = running
        asking = threading.Lock()  # the call's context is freed once the body returns: never ask after
        with self._watchers_lock:
            watcher = self._watchers.get(poll)
            if watcher is None:
                watcher = self._watchers[poll] = _Watcher(poll)
        watcher.add(running, is_cancelled, asking)
        try:
            yield
        except duckdb.InterruptException:
            if running.cancelled:
                raise RequestCancelled() from None
            raise
        finally:
            with asking:
                watcher.remove(running)
            self._request.running = None
            running.close()  # an unfinished result would keep its transaction open (a load's CHECKPOINT waits)
        if running.cancelled:
            raise RequestCancelled()

    def _table(self, name) -> str:
        if not isinstance(name, str):
            raise RequestError("table name must be a string")
        self._entry(name)
        return quote_ident(name)

    def _entry(self, name: str) -> tuple:
        """(catalog oid, estimated size) of table ``name`` of schema main: its version."""
        if self._catalog is not None:
            with self._catalog_lock:
                hit = self._catalog.get(name)
                if hit is not None:
                    return hit
                generation = self._catalog_generation
        row = self._one_row(
            "SELECT table_oid, estimated_size FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main'", [name])
        if row is None:
            raise RequestError(f"no table {name} on this node")
        entry = tuple(row)
        if self._catalog is not None:
            with self._catalog_lock:
                if self._catalog_generation == generation:  # no load or build forgot it meanwhile
                    self._catalog[name] = entry
        return entry

    def forget(self, name: str) -> None:
        """Drop what is kept about table ``name``: it was loaded into or rewritten."""
        with self._catalog_lock:
            self._catalog_generation += 1
            if self._catalog is not None:
                self._catalog.pop(name, None)
        self.indexes.forget(name)
        if self.kept_stats is not None:
            self.kept_stats.forget(name)

    def answer(self, req: dict, blobs: list[bytes]) -> pa.Table:
        op = req["op"]
        if op == "tables":
            return self._tables()
        if op == "probe":
            n = req.get("bytes", 0)
            if not isinstance(n, int) or not 0 <= n <= min(self.max_payload, MAX_PROBE_BYTES):
                raise RequestError("probe size out of range")
            return pa.table({"blob": pa.array([b"\0" * n], pa.large_binary())})
        if op == "stats":
            return self._stats(req)
        if op == "candidates":
            return self._candidates(req, blobs)
        if op == "pull":
            return self._pull(req, blobs)
        if op == "build_index":
            return self._build_index(req)
        if op == "partial_matches":  # the push_pull baseline
            return partial_matches.answer(self, req, blobs)
        if op == "end_session":
            self.sessions.drop(req.get("session"))
            return pa.table({"ended": pa.array([True])})
        raise RequestError(f"unknown op {op}")

    def _tables(self) -> pa.Table:
        cur = self._cursor()
        names = [r[0] for r in cur.sql(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY table_name").fetchall()]
        schemas = []
        for n in names:
            schema = cur.sql(f"SELECT * FROM {quote_ident(n)} LIMIT 0").to_arrow_table().schema
            schemas.append(schema.serialize().to_pybytes())
        indexed = acer.indexed_tables(self.con)
        return pa.table({"name": pa.array(names, pa.string()), "schema": pa.array(schemas, pa.large_binary()),
                         "indexed": pa.array([n in indexed for n in names], pa.bool_())})

    def _stats(self, req: dict) -> pa.Table:
        name = req.get("table")
        table = self._table(name)
        conds = [check_fragment(c) for c in req.get("conditions", [])]
        pk, key = self._select_keys(req)
        cols = [quote_ident(c) for c in req.get("columns", [])] or ["*"]
        cur = self._cursor()
        kept = self.kept_stats.of(name, self._version(name)) if self.kept_stats is not None else {}
        # a statement run again asks the same: its answer over the kept sample is the same too
        asked = json.dumps(req, sort_keys=True, default=str) if self.kept_stats is not None else None
        replies = kept.setdefault("replies", {})
        if asked in replies:
            return replies[asked]
        counts = [kept.get(("count", c)) for c in conds]
        todo = list(dict.fromkeys(c for c, n in zip(conds, counts) if n is None))
        shape = kept.get(("shape", pk, key))
        exprs = [f"count_if({c})" for c in todo]
        if shape is None:
            exprs += ["count(*)", f"approx_count_distinct({pk})", f"min({key})", f"max({key})"]
        row = cur.sql(f"SELECT {', '.join(exprs)} FROM {table}").fetchall()[0] if exprs else ()
        if todo:  # the conditions not counted yet, all in the one scan
            got = dict(zip(todo, row))
            counts = [got[c] if n is None else n for c, n in zip(conds, counts)]
            kept.update({("count", c): got[c] for c in todo})
        if shape is None:
            shape = list(row[len(todo):])
            kmin, kmax = shape[2:]
            active = (kmax - kmin + 1) if kmax is not None else 0
            if req.get("partition_sql"):  # partitions live for a while, not over the whole time line
                active = cur.sql(f"SELECT sum(hi - lo + 1) FROM (SELECT min({key}) AS lo, max({key}) AS hi FROM "
                                 f"{table} WHERE {key} IS NOT NULL GROUP BY {pk})").fetchall()[0][0] or 0
            shape.append(active)
            kept[("shape", pk, key)] = shape
        n, parts, kmin, kmax, active = shape
        # One sample of the table (the paper's 5,000 events) gives the bytes per row and, for the
        # cost model, where the rows the final pull reads lie in time and which variables they are;
        # a node keeps one per table version and marks it for each request
        rows = kept.get("sample")
        if rows is None:
            rows = f"(SELECT * FROM {table} USING SAMPLE {SAMPLE_ROWS} ROWS)"
            if self.kept_stats is not None:
                rows = kept["sample"] = cur.sql(f"SELECT * FROM {rows}").to_arrow_table()
        bits = " | ".join(f"(CASE WHEN {c} THEN {1 << i} ELSE 0 END)" for i, c in enumerate(conds[:62])) or "0"
        final = conds[-1] if conds else "TRUE"
        marking = (f"SELECT {', '.join(cols)}, {pk} AS {H.PARTITION_HASH}, {key} AS {H.KEY}, "
                   f"CAST({bits} AS BIGINT) AS {H.MARKS}, "
                   f"{key} IS NOT NULL AND coalesce(({final}), false) AS {H.FINAL} FROM ")

        def marked(rows) -> pa.Table:
            if isinstance(rows, str):
                return cur.sql(marking + rows).to_arrow_table()
            # the kept rows under the table's own name, so the fragments read them as they read the table
            view = H.ids_view(id(rows))
            cur.register(view, rows)
            try:
                return cur.sql(f"{marking}{view} AS {table}").to_arrow_table()
            finally:
                cur.unregister(view)

        sample = marked(rows)
        marks = [H.PARTITION_HASH, H.KEY, H.MARKS, H.FINAL]
        per_row = sample.drop_columns(marks).nbytes / sample.num_rows if sample.num_rows else 0.0
        out = {f"c{i}": [counts[i]] for i in range(len(conds))}
        mod = 1 << max(0, math.ceil(math.log2(max(n / SAMPLE_ROWS, 1)))) if n else 0
        if req.get("sample") and req.get("partition_sql") and mod and (parts or 0) >= SAMPLE_PARTITIONS * mod:
            # Where a round's intervals fall depends on the other rows of the same partition
            # (a job's SCHEDULE follows its SUBMIT), which a row sample almost never holds when
            # partitions are many: sample whole partitions instead, those whose hash has its low
            # log2(mod) bits clear. Every node applies the same rule, so the compute node joins
            # the nodes' samples into complete partitions (at the largest node's ``mod``). With
            # few, long partitions that would be a handful of them: the row sample stays.
            whole = kept.get(("partition sample", pk, mod))
            if whole is None:
                whole = f"(SELECT * FROM {table} WHERE ({pk} & {mod - 1}) = 0)"
                if self.kept_stats is not None:
                    whole = kept[("partition sample", pk, mod)] = cur.sql(f"SELECT * FROM {whole}").to_arrow_table()
            sample = marked(whole)
            out["sample_mod"] = [mod]
        if req.get("sample"):
            got = sample.select(marks[:3]).filter(sample.column(H.FINAL))
            cols = [got.column(c).to_numpy().astype(np.int64) for c in marks[:3]]
            order = np.lexsort((cols[1], cols[0]))
            out["sample"] = [pack([np.diff(c[order], prepend=np.int64(0)) for c in cols[:2]] + [cols[2][order]])]
        out.update({"n": [n], "parts": [parts], "kmin": [kmin], "kmax": [kmax],
                    "row_bytes": [float(per_row)], "active": [int(active)]})
        reply = pa.table(out)
        if asked is not None and len(replies) < KEPT_STATS_REPLIES:
            replies[asked] = reply
        return reply

    def _time_filter(self, spec, blobs):
        """A callable (pk, t) -> keep mask from a request's filter spec, or None."""
        found = self._time_set(spec, blobs)
        return found.contains if found is not None else None

    def _time_set(self, spec, blobs):
        """The request's time filter: a ``ShrinkingWindowFilter`` or an ``IntervalSet``, or None."""
        if not spec:
            return None
        kind, idx = spec.get("kind"), spec.get("blob")
        if not isinstance(idx, int) or not 0 <= idx < len(blobs):
            raise RequestError("filter names a missing payload")
        if kind == "swf":
            return ShrinkingWindowFilter.from_bytes(blobs[idx], self.max_payload)
        if kind == "intervals":
            return unpack_intervals(blobs[idx], self.max_payload)
        if kind == "exact":
            arr = np.frombuffer(blobs[idx], np.int64) if len(blobs[idx]) % 24 == 0 else None
            if arr is None:
                raise FilterPayloadError("exact interval payload has the wrong length")
            pk, lo, hi = arr.reshape(3, -1)
            return IntervalSet(pk.copy(), lo.copy(), hi.copy())
        raise RequestError(f"unknown filter kind {kind}")

    @staticmethod
    def _joinable(found) -> pa.Table | None:
        """An exact interval set as a table the scan can semi-join (partition hash equal, key
        between the bounds) instead of testing each row it returns here, or None: a window
        filter, or too few partitions for the join's per-partition test to stay short. The row
        (-1, 0, 0) admits the rows without a key (partition hashes are never negative)."""
        if not isinstance(found, IntervalSet) or not len(found):
            return None
        partitions = 1 + int(np.count_nonzero(found.pk[1:] != found.pk[:-1]))
        if len(found) > JOIN_INTERVALS_PER_PARTITION * partitions:
            return None
        return pa.table({"pk": np.r_[np.int64(-1), found.pk], "lo": np.r_[np.int64(0), found.lo],
                         "hi": np.r_[np.int64(0), found.hi]})

    @contextmanager
    def _joined(self, cur, found):
        """The name of ``found``'s join table registered on ``cur`` for the block, or None."""
        table = self._joinable(found)
        if table is None:
            yield None
            return
        view = H.ids_view(id(table))
        cur.register(view, table)
        try:
            yield view
        finally:
            cur.unregister(view)

    def _select_keys(self, req) -> tuple[str, str]:
        key = check_fragment(req["key_sql"])
        parts = [check_fragment(p) for p in req.get("partition_sql", [])]
        # A partition is known by the top ``pk_bits`` bits of its hash (32 unless the compute
        # node asks for fewer). A collision only merges two partitions' intervals - rows pulled
        # that need not be, never rows missed - and fewer bits pack smaller on the wire.
        bits = req.get("pk_bits", 32)
        if not isinstance(bits, int) or not 1 <= bits <= 32:
            raise RequestError("pk_bits must be an integer from 1 to 32")
        pk = f"CAST(hash({', '.join(parts)}) >> {64 - bits} AS BIGINT)" if parts else "CAST(0 AS BIGINT)"
        return pk, key

    def _candidates(self, req: dict, blobs) -> pa.Table:
        name = req.get("table")
        table = self._table(name)
        cond = check_fragment(req["condition"])
        pk, key = self._select_keys(req)
        values = []
        for v in req.get("values", []):
            sql, typ = check_fragment(v[0]), check_type(v[1])
            values.append(value_hash(sql, typ))
        joins = req.get("joins", [])
        for j in joins:
            sql, typ = check_fragment(j["value_sql"]), check_type(j["type"])
            j["_col"] = value_hash(sql, typ)
        found = self._time_set(req.get("filter"), blobs)
        tf = found.contains if found is not None else None
        if req.get("session") is not None:
            return self._session_candidates(req, blobs, name, table, cond, pk, key, values, joins, tf)
        idx = self.indexes.get(self.con, name, self._version(name))
        rows = idx.candidates(self.con, cond, key, [check_fragment(p) for p in req.get("partition_sql", [])],
                              req.get("pk_bits", 32), self._cover(req, blobs, found)) \
            if idx is not None and not values and not joins else None
        if rows is not None:  # the index decided the condition: no scan
            return self._candidate_reply(req, rows.filter(pa.array(self._candidate_mask(rows, [], blobs, tf))), 0)
        select = [f"{pk} AS pk", f"{key} AS t"] + [f"{v} AS v{i}" for i, v in enumerate(values)]
        select += [f"{j['_col']} AS j{i}" for i, j in enumerate(joins)]
        with self._scope(name, cond, req, blobs, False, idx, found) as (cur, scope, cond):
            for j in joins:
                cond = f"({cond}) AND ({j['_col']}) IS NOT NULL"  # NULL never equals: such rows cannot match
            scan = f"SELECT {', '.join(select)} FROM {table} WHERE {scope} AND ({cond}) AND {key} IS NOT NULL"
            with self._joined(cur, found) as view:
                if view is not None:  # phase one in the scan
                    scan = f"SELECT q.* FROM ({scan}) q SEMI JOIN {view} f ON q.pk = f.pk AND q.t BETWEEN f.lo AND f.hi"
                    tf = None
                rows = cur.sql(scan).to_arrow_table()
        rows = rows.filter(pa.array(self._candidate_mask(rows, joins, blobs, tf)))
        return self._candidate_reply(req, rows, len(values))

    def _candidate_mask(self, rows: pa.Table, joins: list, blobs, tf) -> np.ndarray:
        """Which rows (columns pk, t, j0, ...) pass the time filter, then the join filters."""
        keep = np.ones(rows.num_rows, bool)
        pks = rows.column("pk").to_numpy()
        ts = rows.column("t").to_numpy()
        if tf is not None:  # phase one: the key lies in the current time interval set
            keep &= tf(pks, ts)
        for i, j in enumerate(joins):  # phase two: an equal value in this window or the one before
            idx = np.flatnonzero(keep)
            if not len(idx):
                break
            vals = rows.column(f"j{i}").to_numpy()[idx]
            keep[idx] &= self._join_filter(j, blobs)(pks[idx], vals, ts[idx])
        return keep

    @staticmethod
    def _candidate_reply(req: dict, rows: pa.Table, n_values: int) -> pa.Table:
        names = (["pk"] if req.get("partition_sql") else []) + [f"v{i}" for i in range(n_values)]
        quantum = req.get("quantum")
        if isinstance(quantum, int) and quantum >= 1:
            # one row per slot of the key (each slot quantum long) and distinct values
            slot = pa.array(np.floor_divide(rows.column("t").to_numpy(), quantum))
            out = rows.select(names).append_column("s", slot)
            out = out.group_by(out.column_names, use_threads=False).aggregate([])
            return _packed_candidates(out) if req.get("packed") else out
        return rows.select(names + ["t"])

    # -- the ACER index

    def _build_index(self, req: dict) -> pa.Table:
        name = req.get("table")
        self._table(name)
        attributes = req.get("attributes")
        if not isinstance(attributes, list) or not attributes:
            raise RequestError("build_index needs a list of attributes")
        try:
            summary = acer.build(self.con, name, attributes, req.get("type_column", "type"),
                                 req.get("time_column", "ts"), req.get("block_size", acer.DEFAULT_BLOCK))
        except acer.IndexError_ as err:
            raise RequestError(str(err)) from None
        self.forget(name)  # the table was rewritten in type-major order
        return pa.table({k: [v] for k, v in summary.items()})

    def _cover(self, req: dict, blobs, found=None):
        """The request's time cover: sorted disjoint [lo, hi] key ranges over all partitions
        (``found``: the request's time filter, decoded)."""
        idx = req.get("cover")
        if idx is None:
            return None
        if not isinstance(idx, int) or not 0 <= idx < len(blobs) or len(blobs[idx]) % 16:
            raise RequestError("cover names a missing or malformed payload")
        lo, hi = np.frombuffer(blobs[idx], np.int64).reshape(2, -1)
        if len(lo) and ((np.diff(lo) <= 0).any() or (hi < lo).any()):
            raise RequestError("cover intervals must be sorted and disjoint")
        if isinstance(found, IntervalSet):
            # the exact set's own union is finer than the cover sent, which the caller caps in size
            # (closing its smallest gaps): the index then searches and tests fewer rows
            return acer.union_of(found.lo, found.hi)
        return lo, hi

    @contextmanager
    def _scope(self, name: str, cond: str, req: dict, blobs, keep_keyless: bool, idx=False, found=None):
        """A cursor, a rowid condition restricting a scan to the rows the table's index (``idx``
        when the caller looked it up) lets through (TRUE without an index) and the condition to
        evaluate on them."""
        cur = self._cursor()
        if idx is False:
            idx = self.indexes.get(self.con, name, self._version(name))
        scope = "TRUE"
        if idx is not None:  # the index's planner keeps "TRUE" when a scan of the whole table is cheaper
            scope, _ = idx.scope(self.con, cond, req.get("key_sql", ""), self._cover(req, blobs, found),
                                 keep_keyless)
        yield cur, scope, cond

    # -- dfs_stateful: rounds over the rows a session kept

    def _version(self, name: str) -> tuple:
        return self._entry(name)

    def _open_session(self, req: dict, name: str):
        expect = req.get("expect", [])
        if not isinstance(expect, list) or not all(isinstance(i, int) for i in expect):
            raise RequestError("expect must be a list of variable numbers")
        try:
            return self.sessions.open(req["session"], name, self._version(name), expect)
        except ValueError as err:
            raise RequestError(str(err)) from None

    def _computed(self, table: str, state: VariableState, sqls: list[str]) -> list[str]:
        """Columns of ``state.rows`` holding ``sqls`` for its rows, computed on those rows only."""
        todo = [s for s in dict.fromkeys(sqls) if s not in state.columns]
        if todo and state.rows.num_rows:
            cur = self._cursor()
            ids = state.rows.select(["r"])
            view = H.ids_view(id(ids))
            cur.register(view, ids)
            try:
                lo, hi = pc.min_max(ids.column("r")).values()
                got = cur.sql(f"SELECT rowid AS r, {', '.join(f'{s} AS c{k}' for k, s in enumerate(todo))} "
                              f"FROM {table} WHERE rowid BETWEEN {lo.as_py()} AND {hi.as_py()} "
                              f"AND rowid IN (SELECT r FROM {view}) ORDER BY rowid").to_arrow_table()
            finally:
                cur.unregister(view)
            if got.num_rows != state.rows.num_rows:
                raise SessionLost("rows of this query session are gone from the table. Run the query again")
            for k, s in enumerate(todo):
                col = f"x{len(state.columns)}"
                state.rows = state.rows.append_column(col, got.column(f"c{k}"))
                state.columns[s] = col
        elif todo:
            for s in todo:
                col = f"x{len(state.columns)}"
                state.rows = state.rows.append_column(col, pa.nulls(0, pa.int32()))
                state.columns[s] = col
        return [state.columns[s] for s in sqls]

    def _session_candidates(self, req, blobs, name, table, cond, pk, key, values, joins, tf) -> pa.Table:
        var = req.get("var")
        if not isinstance(var, int):
            raise RequestError("a session round needs var")
        session = self._open_session(req, name)
        with session.lock:
            state = session.variables.get(var)
            if state is None:  # the variable's first round: its condition, once
                with self._scope(name, cond, req, blobs, False) as (cur, scope, left):
                    rows = cur.sql(f"SELECT rowid AS r, {pk} AS pk, {key} AS t FROM {table} "
                                   f"WHERE {scope} AND ({left}) AND {key} IS NOT NULL ORDER BY rowid").to_arrow_table()
                state = VariableState(rows)
            if tf is not None:  # the set only shrinks: every variable kept here shrinks with it
                for s in session.variables.values():
                    s.keep(tf(s.rows.column("pk").to_numpy(), s.rows.column("t").to_numpy()))
                state.keep(tf(state.rows.column("pk").to_numpy(), state.rows.column("t").to_numpy()))
            cols = self._computed(table, state, values + [j["_col"] for j in joins])
            view = state.rows.select(["pk", "t"])
            for i, c in enumerate(cols[:len(values)]):
                view = view.append_column(f"v{i}", state.rows.column(c))
            for i, c in enumerate(cols[len(values):]):
                view = view.append_column(f"j{i}", state.rows.column(c))
            keep = np.ones(view.num_rows, bool)
            for i in range(len(joins)):  # NULL never equals: such rows cannot match
                keep &= np.asarray(view.column(f"j{i}").is_valid())
            view = view.filter(pa.array(keep))
            state.keep(keep)
            mask = self._candidate_mask(view, joins, blobs, None)
            state.keep(mask)
            session.variables[var] = state
            return self._candidate_reply(req, view.filter(pa.array(mask)), len(values))

    def _join_filter(self, spec, blobs):
        idx = spec.get("blob")
        if not isinstance(idx, int) or not 0 <= idx < len(blobs):
            raise RequestError("join filter names a missing payload")
        direction = spec.get("direction", "follow")
        if direction not in ("follow", "precede"):
            raise RequestError("join filter direction must be follow or precede")
        kind = spec.get("kind")
        if kind == "wjf":
            f = WindowJoinFilter.from_bytes(blobs[idx], self.max_payload)
        elif kind == "slots":
            f = SlotJoinSet.from_bytes(blobs[idx], self.max_payload)
        elif kind == "exact":
            data = blobs[idx]
            window = spec.get("window")
            if len(data) % 24 or not isinstance(window, int) or window <= 0:
                raise FilterPayloadError("exact join payload is malformed")
            pk, val, t = np.frombuffer(data, np.int64).reshape(3, -1)
            f = _ExactJoin(pk, val, t, window)
        else:
            raise RequestError("unknown join filter kind")
        return f.may_follow if direction == "follow" else f.may_precede

    def _pull(self, req: dict, blobs) -> pa.Table:
        name = req.get("table")
        table = self._table(name)
        columns = req.get("columns")
        where = check_fragment(req["where"]) if req.get("where") else "TRUE"
        found = self._time_set(req.get("filter"), blobs)
        tf = found.contains if found is not None else None
        cur = self._cursor()
        cols = ", ".join(quote_ident(c) for c in columns) if columns else "*"
        if req.get("session") is not None:
            session = self._open_session(req, name)
            self.sessions.drop(req["session"])  # the final pull ends the session, whatever happens next
            union = req.get("union")
            if union is not None:
                return self._session_pull(table, session, union, cols, where, tf, req)
        idx = self.indexes.get(self.con, name, self._version(name))
        decided = self._pull_decided(idx, table, cols, where, req, blobs, found) if idx is not None else None
        if decided is not None:
            return decided
        if tf is None:
            with self._scope(name, where, req, blobs, True, idx, found) as (cur, scope, left):
                return _compact(cur.sql(f"SELECT {cols} FROM {table} WHERE {scope} AND ({left})").to_arrow_table())
        pk, key = self._select_keys(req)
        bounds = req.get("range")
        with self._scope(name, where, req, blobs, True, idx, found) as (cur, scope, where):
            if bounds:  # the TIS's hull as a range DuckDB's scan can use (zone maps)
                lo, hi = int(bounds[0]), int(bounds[1])
                where = f"({where}) AND ({key} IS NULL OR {key} BETWEEN {lo} AND {hi})"
            scan = f"SELECT {cols}, {pk} AS {H.PARTITION_HASH}, {key} AS {H.KEY} FROM {table} WHERE {scope} AND {where}"
            with self._joined(cur, found) as view:
                if view is not None:  # the time filter in the scan; rows without a key join the row (-1, 0, 0)
                    rows = cur.sql(f"SELECT q.* FROM ({scan}) q SEMI JOIN {view} f ON "
                                   f"(CASE WHEN q.{H.KEY} IS NULL THEN -1 ELSE q.{H.PARTITION_HASH} END) = f.pk "
                                   f"AND coalesce(q.{H.KEY}, 0) BETWEEN f.lo AND f.hi").to_arrow_table()
                    return _compact(rows.drop_columns([H.PARTITION_HASH, H.KEY]))
                rows = cur.sql(scan).to_arrow_table()
        t = rows.column(H.KEY)
        keep = np.ones(rows.num_rows, bool)  # rows without a key are kept: the engine decides on them
        valid = np.asarray(t.is_valid())
        if valid.any():
            keep[valid] = tf(rows.column(H.PARTITION_HASH).to_numpy()[valid],
                             t.filter(pa.array(valid)).to_numpy())
        return _compact(rows.filter(pa.array(keep)).drop_columns([H.PARTITION_HASH, H.KEY]))

    def _pull_decided(self, idx, table, cols, where, req, blobs, found) -> pa.Table | None:
        """The pull's rows when the table's index ``idx`` decides its condition and keeps its
        columns in memory, or None: DuckDB scans."""
        key, parts, bits, bounds = req.get("key_sql") or "", [], 32, None
        if key:
            key = check_fragment(key)
        tf = found.contains if found is not None else None
        if tf is not None:
            _, key = self._select_keys(req)
            parts = [check_fragment(p) for p in req.get("partition_sql", [])]
            bits = req.get("pk_bits", 32)
            if req.get("range"):
                bounds = (int(req["range"][0]), int(req["range"][1]))
        ids = idx.pulled(self.con, where, key, parts, bits, self._cover(req, blobs, found), tf, bounds)
        if ids is None:
            return None
        schema = idx.schemas.get(cols)
        if schema is None:
            schema = idx.schemas[cols] = self._cursor().sql(f"SELECT {cols} FROM {table} LIMIT 0").to_arrow_table().schema
        arrays = idx.taken(self.con, schema.names, ids)
        if arrays is None or any(a.type != f.type for a, f in zip(arrays, schema)):
            return None
        return _compact(pa.Table.from_arrays(arrays, schema=schema))

    def _session_pull(self, table, session, union, cols, where, tf, req) -> pa.Table:
        """The rows kept for ``union`` that lie in the final set (the union covers every
        variable the push-down filter names, so no other row can be needed), and the rows
        without a key that the push-down filter keeps (candidates never hold those)."""
        with session.lock:
            ids = _session_rows(session, union, tf)
        _, key = self._select_keys(req)
        cur = self._cursor()
        keyless = cur.sql(f"SELECT {cols} FROM {table} WHERE {key} IS NULL AND ({where})").to_arrow_table()
        if not len(ids):
            return _compact(keyless)
        view = H.ids_view(id(ids))
        cur.register(view, pa.table({"r": ids}))
        try:
            rows = cur.sql(f"SELECT {cols} FROM {table} WHERE rowid BETWEEN {int(ids[0])} AND {int(ids[-1])} "
                           f"AND rowid IN (SELECT r FROM {view})").to_arrow_table()
        finally:
            cur.unregister(view)
        if rows.num_rows != len(ids):
            raise SessionLost("rows of this query session are gone from the table. Run the query again")
        return _compact(pa.concat_tables([rows, keyless]) if keyless.num_rows else rows)


class _Running:
    """The DuckDB cursors of one running request, and whether its caller has gone."""

    def __init__(self):
        self.cursors: list = []
        self.cancelled = False
        self.lock = threading.Lock()

    def adopt(self, cur) -> None:
        with self.lock:
            if self.cancelled:
                raise RequestCancelled()
            self.cursors.append(cur)

    def close(self) -> None:
        with self.lock:
            cursors, self.cursors = self.cursors, []
        for cur in cursors:
            try:
                cur.close()
            except duckdb.Error:
                pass

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            cursors = list(self.cursors)
        for cur in cursors:
            try:
                cur.interrupt()
            except duckdb.Error:
                pass


class _Watcher:
    """One thread that asks, every ``poll`` seconds, whether the callers of the running requests
    are still there and interrupts the work of those that left (a thread started per request cost
    a small request as much as its work). It ends after a while without requests."""

    IDLE_POLLS = 200

    def __init__(self, poll: float):
        self.poll = poll
        self.lock = threading.Lock()
        self.watched: dict[int, tuple] = {}  # id(running) -> (running, is_cancelled, asking)
        self.thread: threading.Thread | None = None

    def add(self, running: _Running, is_cancelled, asking: threading.Lock) -> None:
        with self.lock:
            self.watched[id(running)] = (running, is_cancelled, asking)
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, daemon=True, name="matchrec-cancel-watch")
                self.thread.start()

    def remove(self, running: _Running) -> None:
        """Stop asking about ``running``'s caller; called holding its ``asking`` lock."""
        with self.lock:
            self.watched.pop(id(running), None)

    def _watch(self) -> None:
        idle = 0
        while True:
            time.sleep(self.poll)
            with self.lock:
                items = list(self.watched.items())
                idle = 0 if items else idle + 1
                if idle > self.IDLE_POLLS:
                    self.thread = None
                    return
            for key, (running, is_cancelled, asking) in items:
                with asking:
                    with self.lock:
                        if self.watched.get(key, (None,))[0] is not running:
                            continue  # the request ended: its caller's context is freed
                    try:
                        gone = is_cancelled()
                    except Exception:  # noqa: BLE001 - stop asking about this one
                        self.remove(running)
                        continue
                if gone:  # again on every poll: a query started between two polls is stopped too
                    running.cancel()


def _session_rows(session, union, tf) -> np.ndarray:
    """Sorted distinct row ids kept for the variables ``union``, inside the time filter."""
    if not isinstance(union, list) or any(i not in session.variables for i in union):
        raise RequestError("union names a variable this session has no candidates of")
    ids = []
    for i in union:
        rows = session.variables[i].rows
        r = rows.column("r").to_numpy()
        if tf is not None and len(r):
            r = r[tf(rows.column("pk").to_numpy(), rows.column("t").to_numpy())]
        ids.append(r)
    return np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)


def _gap_columns(order: int, names: list[str]) -> set[int]:
    """Which columns of packed candidates travel as gaps from the previous row."""
    if order == 1:
        return set(range(len(names)))
    return {0, len(names) - 1} if names[0] == "pk" else {len(names) - 1}


def _packed_candidates(table: pa.Table) -> pa.Table:
    """Distinct candidates (columns [pk], v0.., s) as one packed payload: sorted by slot with
    slot gaps (``order`` 0), or by values then slot with every column as gaps (``order`` 1),
    whichever is smaller. The compute node unpacks them with ``unpack_candidates``."""
    names = table.column_names
    cols = [table.column(c).to_numpy().astype(np.int64) for c in names]
    outer = (cols[0],) if names[0] == "pk" else ()
    vals, slot = cols[len(outer):-1], cols[-1]
    best = None
    for order, keys in ((0, tuple(vals[::-1]) + (slot,) + outer), (1, (slot,) + tuple(vals[::-1]) + outer)):
        idx = np.lexsort(keys) if len(slot) else np.zeros(0, np.int64)
        gaps = _gap_columns(order, names)
        blob = pack([np.diff(c[idx], prepend=np.int64(0)) if i in gaps else c[idx] for i, c in enumerate(cols)])
        if best is None or len(blob) < len(best[1]):
            best = (order, blob)
    return pa.table({"order": pa.array([best[0]], pa.int8()), "packed": pa.array([best[1]], pa.large_binary())})


def unpack_candidates(parts: list[pa.Table], names: list[str], max_bytes: int) -> dict[str, np.ndarray]:
    """The candidates of every node's packed reply, as columns named ``names`` (as packed)."""
    out: dict[str, list] = {n: [] for n in names}
    for p in parts:
        gaps = _gap_columns(p.column("order")[0].as_py(), names)
        cols = unpack(p.column("packed")[0].as_py(), max_bytes, len(names))
        for i, (n, c) in enumerate(zip(names, cols)):
            out[n].append(np.cumsum(c, dtype=np.int64) if i in gaps else c)
    return {n: (np.concatenate(v) if v else np.zeros(0, np.int64)) for n, v in out.items()}


class _ExactJoin:
    """The structure behind a window-wise join filter without its Bloom filter: the sorted 64-bit
    hashes of (pk, value, window) - no false negatives, false positives only on a hash collision."""

    def __init__(self, pk, val, t, window):
        self.window = window
        self.keys = distinct(mix(pk, val, np.floor_divide(t, window)))

    def _has(self, pk, val, wid):
        h = mix(pk, val, wid)
        idx = np.minimum(np.searchsorted(self.keys, h), max(len(self.keys) - 1, 0))
        return (self.keys[idx] == h) if len(self.keys) else np.zeros(len(h), bool)

    def may_follow(self, pk, val, t):
        wid = np.floor_divide(t, self.window)
        return self._has(pk, val, wid) | self._has(pk, val, wid - 1)

    def may_precede(self, pk, val, t):
        wid = np.floor_divide(t, self.window)
        return self._has(pk, val, wid) | self._has(pk, val, wid + 1)


class StatsCache:
    """A node's statistics per table version (catalog oid and size): per-condition counts, the
    key's range and the partitions' lives per key and partition hash, and one sample of rows.
    Statistics only steer the cost model (round order, skips, bits), never which rows a pull
    returns, and a node's tables change only through loads, which ``forget`` them."""

    MAX_TABLES = 64

    def __init__(self):
        self._by_table: dict[str, tuple[tuple, dict]] = {}
        self._lock = threading.Lock()

    def of(self, table: str, version: tuple) -> dict:
        """The statistics kept for ``table`` at ``version`` (a dict the caller fills)."""
        with self._lock:
            hit = self._by_table.get(table)
            if hit is None or hit[0] != version:
                if hit is None and len(self._by_table) >= self.MAX_TABLES:
                    self._by_table.pop(next(iter(self._by_table)))
                hit = self._by_table[table] = (version, {})
            return hit[1]

    def forget(self, table: str) -> None:
        with self._lock:
            self._by_table.pop(table, None)
