"""Where the input of a MATCH_RECOGNIZE lives, behind one interface: ``Source``.

A source answers the requests of ``connectors.shard`` (``tables``, ``stats``, ``candidates``,
``pull``, ``end_session``, ``build_index``), with one reply per shard that holds part of the
data, through ``call_all``. That protocol is the core of the interface: the dual-filtering
rounds (``connectors.dual_filtering``) encode time interval sets and join filters into binary
payloads whose size the cost model weighs, so they speak it directly, and any source that
answers it runs every pull strategy and feeds every matcher. On top of it ``Source`` offers
the typed operations the planner and other techniques use:

* ``schema(table)``;
* ``stats(...)``: row and per-condition counts, key range, bytes per row, and a sample of where
  the rows lie (``Sample``) for the planner's estimates;
* ``candidates(...)``: (partition hash, key) of the rows where a condition holds, restricted to
  an interval set;
* ``pull_rows(...)``: the final pull of some columns under a row filter and an interval set, as Arrow.

Implementations:

* ``LocalSource``: a table or query of a local DuckDB connection, answered in process by the
  same ``ShardService`` a storage node runs (one shard, no link: no round-trip cost);
* ``NodeSource``: storage nodes over Arrow Flight (``connectors.flight_transport``), one shard
  per node;
* Spark partitions: ``connectors.spark_filtering.SparkShards`` answers the same protocol with
  one Spark task per partition (it runs ``ShardService`` over each partition's rows), through
  its own ``call_all``; ``spark_filtering.SparkSource`` is the adapter that offers it as a
  ``Source`` (it lives there so that this module never imports Spark's).
"""
from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from matchrec.connectors.flight_transport import MAX_REPLY, FlightTransport, NodeTraffic
from matchrec.connectors.session import SessionLost
from matchrec.connectors.shard import DEFAULT_MAX_PAYLOAD_MB, RequestError, ShardService
from matchrec.parser.names import quote_ident as quote
from matchrec.errors import OperationalError, ProgrammingError
from matchrec.operators.intervals import FilterPayloadError, IntervalSet
from matchrec.operators.packing import unpack

_IDENT = re.compile(r'^\s*(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*))\s*$')


@dataclass
class PullStats:
    """What one MATCH_RECOGNIZE input cost on the network."""
    strategy: str = ""
    round_trips: int = 0
    events_pulled: int = 0
    candidates: dict[str, int] = field(default_factory=dict)  # variable -> candidates returned
    rounds_skipped: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    phase_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase -> (sent, received)
    filters: dict[str, list[str]] = field(default_factory=dict)  # round -> payloads sent (kind, bytes, direction)
    nodes: dict[str, NodeTraffic] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(t.sent for t in self.nodes.values())

    @property
    def bytes_received(self) -> int:
        return sum(t.received for t in self.nodes.values())

    def lines(self) -> list[str]:
        out = [f"pull strategy {self.strategy}: {self.round_trips} round trips, {self.events_pulled} events pulled, "
               f"{self.bytes_sent} bytes sent, {self.bytes_received} bytes received"]
        for uri, t in self.nodes.items():
            out.append(f"  node {uri}: {t.calls} calls, sent {t.sent} B, received {t.received} B, {t.seconds:.3f} s")
        if self.candidates:
            out.append("  candidates per round: " + ", ".join(f"{k} {v}" for k, v in self.candidates.items()))
        for r in self.rounds_skipped:
            out.append(f"  round skipped: {r}")
        out.append("  phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in self.phases.items()))
        if self.filters:
            out.append("  filters sent per round: " + "; ".join(
                f"{k}: {', '.join(v) or 'none'}" for k, v in self.filters.items()))
        if self.phase_bytes:
            out.append("  bytes sent/received per phase: " + ", ".join(
                f"{k} {s}/{r}" for k, (s, r) in self.phase_bytes.items()))
        out += [f"  {n}" for n in self.notes]
        return out


class Sample:
    """The shards' samples of the rows the final pull reads (partition, key, which variables'
    conditions hold): where in a time interval set the rows are, when they are not spread
    evenly over time (events of a partition come in bursts, variables come near each other)."""

    def __init__(self, parts: list[pa.Table], max_bytes: int):
        cols = [[], [], []]
        # Nodes that sample whole partitions (``sample_mod``: those whose hash is 0 modulo it)
        # may differ in the modulus; at the largest one every node's rows of a sampled
        # partition are present, so a round can be tried out on the sample (``complete``).
        mods = [p.column("sample_mod")[0].as_py() for p in parts if "sample_mod" in p.column_names]
        self.complete = bool(parts) and len(mods) == len(parts)
        mod = max(mods) if self.complete else 1
        for p in parts:
            if "sample" in p.column_names and p.column("sample")[0].as_py():
                pk, t, m = unpack(p.column("sample")[0].as_py(), max_bytes, 3)
                pk, t = np.cumsum(pk), np.cumsum(t)
                if mod > 1:
                    keep = (pk & (mod - 1)) == 0
                    pk, t, m = pk[keep], t[keep], m[keep]
                for c, x in zip(cols, (pk, t, m)):
                    c.append(x)
        self.pk, self.t, self.m = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols)

    def share(self, tis: IntervalSet, variable: int | None) -> tuple[float, int]:
        """The fraction of the sampled rows (of one variable) inside ``tis``, and how many there were."""
        pick = np.ones(len(self.t), bool) if variable is None else (self.m >> variable) & 1 == 1
        n = int(pick.sum())
        return (float(tis.contains(self.pk[pick], self.t[pick]).mean()) if n else 0.0), n

    def removed_by(self, variable: int, tis: IntervalSet | None, quantum: int, before: int,
                   after: int, pk_shift: int = 0) -> float | None:
        """The fraction of the sampled rows inside ``tis`` (all without one) that a round of
        ``variable`` would remove: those no candidate of it in the same partition lies near
        (partitions known by their hash shifted right by ``pk_shift``, as the round's set knows
        them). None when the sample cannot tell (not whole partitions, or too few rows inside)."""
        if not self.complete:
            return None
        pk = self.pk >> pk_shift
        inside = tis.contains(pk, self.t) if tis is not None else np.ones(len(self.t), bool)
        n = int(inside.sum())
        if n < 30:
            return None
        own = (self.m >> variable) & 1 == 1
        near = IntervalSet.around_slots(pk[own], self.t[own] // quantum, quantum, before, after)
        return 1.0 - int((inside & near.contains(pk, self.t)).sum()) / n


@dataclass
class SourceStats:
    """A source's answer to ``stats``, summed over its shards."""
    counts: list[int]  # rows meeting each condition asked about
    rows: int
    kmin: int | None
    kmax: int | None
    span: int  # kmax - kmin + 1 (1 when the table has no key)
    extent: int  # the time the partitions are alive, summed (the largest of the shards' sums, at least span)
    row_bytes: float  # bytes per row of the columns asked about
    partitions: int  # the largest shard's approximate partition count
    sample: Sample | None  # where the rows the last condition keeps lie, when asked


class Source(ABC):
    """Events one MATCH_RECOGNIZE reads: the shard protocol plus the typed operations over it.

    Subclasses provide ``call_all`` (the shard protocol, one reply per shard), ``schemas``
    (table -> Arrow schema) and ``shard_count``; ``indexed`` names the tables an ACER index
    covers, ``sessions`` says whether the shards keep ``dfs_stateful`` state, ``rtt`` and
    ``bandwidth`` describe the link for the round-trip cost model (none: 0 and None)."""

    max_reply = MAX_REPLY
    rtt = 0.0
    bandwidth = None
    sessions = True
    schemas: dict[str, pa.Schema]
    indexed: set[str]

    @abstractmethod
    def call_all(self, request: dict, blobs: list[bytes] | None = None, stats: PullStats | None = None
                 ) -> list[pa.Table]:
        """Every shard's reply to one request (``connectors.shard``); ``stats`` records the traffic."""

    @property
    @abstractmethod
    def shard_count(self) -> int:
        """How many shards answer a request: each payload goes to every one of them."""

    @property
    def round_choices(self) -> dict:
        """The round decisions of the cost model and the scan times they counted, by round identity
        (``dual_filtering.skip_round``), kept for the life of this source so that a statement run
        again decides alike."""
        return self.__dict__.setdefault("_round_choices", {})

    def probe(self) -> None:
        """Measure the link once (``rtt``, ``bandwidth``); nothing to measure without one."""

    def end_session(self, session: str) -> None:
        """Free the shards' state of a ``dfs_stateful`` query that failed (best effort)."""
        try:
            self.call_all({"op": "end_session", "session": session})
        except Exception:  # noqa: BLE001 - the shards expire the state anyway
            pass

    def close(self) -> None:
        pass

    # -- the typed operations
    def schema(self, table: str) -> pa.Schema:
        try:
            return self.schemas[table]
        except KeyError:
            raise ProgrammingError(f"Table {table} does not exist in this source") from None

    def bare_table(self, input_text: str) -> str | None:
        """The table ``input_text`` names when it is just a (quoted) name of this source's, else None."""
        m = _IDENT.match(input_text)
        if not m:
            return None
        name = m.group(1).replace('""', '"') if m.group(1) else m.group(2)
        return name if name in self.schemas else None

    def stats(self, table: str, conditions: list[str], key_sql: str, partition_sql: list[str] | tuple = (),
              columns: list[str] | None = None, sample: bool = False, pk_bits: int | None = None,
              stats: PullStats | None = None) -> SourceStats:
        """Counts of the rows meeting each of ``conditions`` (the last one's rows are sampled when
        ``sample``), the key's range and the bytes per row of ``columns``."""
        request = {"op": "stats", "conditions": list(conditions), "columns": columns or [], "sample": sample,
                   **_base(table, key_sql, partition_sql, pk_bits)}
        parts = self.call_all(request, stats=stats)
        counts = [sum(int(p.column(f"c{i}")[0].as_py() or 0) for p in parts) for i in range(len(conditions))]
        kmins = [p.column("kmin")[0].as_py() for p in parts if p.column("kmin")[0].as_py() is not None]
        kmaxs = [p.column("kmax")[0].as_py() for p in parts if p.column("kmax")[0].as_py() is not None]
        span = (max(kmaxs) - min(kmins) + 1) if kmins else 1
        # every shard holds a share of each partition (random spreading) or all of some
        # (spreading by key), so the largest sum of the partitions' lives is the estimate
        extent = max([int(p.column("active")[0].as_py() or 0) for p in parts] + [span])
        return SourceStats(
            counts=counts, rows=sum(int(p.column("n")[0].as_py() or 0) for p in parts),
            kmin=min(kmins) if kmins else None, kmax=max(kmaxs) if kmaxs else None, span=span, extent=extent,
            row_bytes=max((p.column("row_bytes")[0].as_py() or 0.0) for p in parts) or 16.0,
            partitions=max(int(p.column("parts")[0].as_py() or 1) for p in parts),
            sample=Sample(parts, self.max_reply) if sample else None)

    def candidates(self, table: str, condition: str, key_sql: str, partition_sql: list[str] | tuple = (),
                   intervals: IntervalSet | None = None, stats: PullStats | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(partition hash, key) of every row where ``condition`` holds and whose key lies in
        ``intervals`` (all of them without one), sorted. Partition hashes are those of
        ``IntervalSet`` keys here (32 bits); 0 without ``partition_sql``."""
        request = {"op": "candidates", "condition": condition, **_base(table, key_sql, partition_sql, None)}
        blobs = _exact_filter(request, intervals)
        parts = self.call_all(request, blobs, stats)
        pk = [p.column("pk").to_numpy().astype(np.int64) if "pk" in p.column_names
              else np.zeros(p.num_rows, np.int64) for p in parts]
        t = [p.column("t").to_numpy().astype(np.int64) for p in parts]
        pk, t = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (pk, t))
        order = np.lexsort((t, pk))
        return pk[order], t[order]

    def pull_rows(self, table: str, columns: list[str] | None = None, row_filter: str | None = None,
             intervals: IntervalSet | None = None, key_sql: str | None = None,
             partition_sql: list[str] | tuple = (), stats: PullStats | None = None) -> pa.Table:
        """The rows meeting ``row_filter`` whose key lies in ``intervals`` (rows without a key are
        kept: the matcher decides on them), as a table of the source's schema where columns not
        in ``columns`` are NULL."""
        request = {"op": "pull", "table": table, "columns": columns, "where": row_filter}
        blobs: list[bytes] = []
        if intervals is not None:
            if key_sql is None:
                raise ProgrammingError("a pull restricted to intervals needs the key they are intervals of")
            request.update(_base(table, key_sql, partition_sql, None))
            blobs = _exact_filter(request, intervals)
        return self.concat(table, self.call_all(request, blobs, stats), columns)

    def pull_all(self, table: str, stats: PullStats) -> pa.Table:
        return self.concat(table, self.call_all({"op": "pull", "table": table}, stats=stats), None)

    def concat(self, table: str, parts: list[pa.Table], columns: list[str] | None) -> pa.Table:
        """The shards' replies as one table of ``table``'s schema (types as the catalogue says)."""
        schema = self.schema(table)
        n = sum(p.num_rows for p in parts)
        arrays = []
        for f in schema:
            if columns is None or f.name in columns:
                chunks = [c if c.type == f.type else c.cast(f.type) for p in parts for c in p.column(f.name).chunks]
                arrays.append(pa.chunked_array(chunks, f.type))
            else:  # columns the query does not read travel as NULLs that take no bytes
                arrays.append(pa.chunked_array([pa.nulls(n, f.type)], f.type))
        return pa.Table.from_arrays(arrays, schema=schema)


def _base(table: str, key_sql: str, partition_sql, pk_bits: int | None) -> dict:
    base = {"table": table, "key_sql": key_sql, "partition_sql": list(partition_sql)}
    if pk_bits is not None:
        base["pk_bits"] = pk_bits
    return base


def _exact_filter(request: dict, intervals: IntervalSet | None) -> list[bytes]:
    if intervals is None:
        return []
    request["filter"] = {"kind": "exact", "blob": 0}
    return [np.concatenate([intervals.pk, intervals.lo, intervals.hi]).astype(np.int64).tobytes()]


class NodeSource(FlightTransport, Source):
    """Storage nodes over Arrow Flight: one shard per node, tables as their catalogues say."""

    def __init__(self, uris: list[str], token: str | None = None, timeout: float = 60.0,
                 tls_root_certs: str | bytes | None = None):
        FlightTransport.__init__(self, uris, token, timeout, tls_root_certs)
        self.schemas: dict[str, pa.Schema] = {}
        self.indexed: set[str] = set()  # tables with an ACER index on some node
        self._load_catalog()

    @property
    def shard_count(self) -> int:
        return len(self.nodes)

    def _load_catalog(self) -> None:
        for node, table in zip(self.nodes, self.call_all({"op": "tables"})):
            for name, blob in zip(table.column("name").to_pylist(), table.column("schema").to_pylist()):
                schema = pa.ipc.read_schema(pa.py_buffer(blob))
                known = self.schemas.get(name)
                if known is not None and not known.equals(schema):
                    raise OperationalError(f"Table {name} has different columns on storage node {node.uri} than on "
                                           "the others; load it again with matchrec load")
                self.schemas[name] = schema
            if "indexed" in table.column_names:
                self.indexed |= {n for n, i in zip(table.column("name").to_pylist(),
                                                   table.column("indexed").to_pylist()) if i}

    def refresh(self) -> None:
        self.schemas = {}
        self.indexed = set()
        self._load_catalog()

    def end_session(self, session: str) -> None:
        self.forget({"op": "end_session", "session": session})  # free the nodes' state now rather than at expiry


class LocalSource(Source):
    """A table or query of a local DuckDB connection as a source of one shard.

    The requests are answered in process by ``ShardService`` over the caller's connection (so
    its temporary tables and registered Arrow data are visible), under the name ``name``. A
    base table of the ``main`` schema keeps ``dfs_stateful`` sessions (they hold row ids) and uses
    its ACER index; a query does neither (``dfs_stateful`` then runs as ``dfs``). Not for use from
    several threads at once: the connection runs one query at a time."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str | None = None, *, query: str | None = None,
                 name: str | None = None, max_payload_mb: int = DEFAULT_MAX_PAYLOAD_MB):
        if (table is None) == (query is None):
            raise ProgrammingError("LocalSource reads either a table or a query")
        self.con = con
        self.name = name or table or "events"
        stored = table is not None and _is_base_table(con, table)
        self.sessions = stored
        relation = quote(table) if table is not None else f"(SELECT * FROM ({query})) AS __mr_src"
        try:
            schema = con.sql(f"SELECT * FROM {relation} LIMIT 0").to_arrow_table().schema
        except duckdb.Error as err:
            raise ProgrammingError(f"The source {self.name} cannot be read: {str(err).splitlines()[0]}") from None
        self.schemas = {self.name: schema}
        self.indexed: set[str] = set()
        if stored:
            from matchrec.connectors import acer
            if table in acer.indexed_tables(con):
                self.indexed.add(self.name)
        self.service = _LocalShard(con, self.name, relation, table if stored else None, schema,
                                   max_payload_mb << 20)

    @property
    def shard_count(self) -> int:
        return 1

    def call_all(self, request: dict, blobs: list[bytes] | None = None, stats: PullStats | None = None
                 ) -> list[pa.Table]:
        blobs = blobs or []
        started = time.perf_counter()
        try:
            reply = self.service.answer(request, blobs)
        except SessionLost as err:
            raise OperationalError(f"The local source {self.name} lost the state of this dfs_stateful query: {err}") \
                from None
        except (RequestError, FilterPayloadError, ValueError, TypeError, KeyError, IndexError,
                pa.ArrowException) as err:
            raise ProgrammingError(f"The local source {self.name} refused the request: "
                                   f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
        except duckdb.Error as err:
            raise OperationalError(f"The local source {self.name} could not run the request: "
                                   f"{str(err).splitlines()[0]}") from None
        if stats is not None:
            stats.round_trips += 1
            t = stats.nodes.setdefault(f"local {self.name}", NodeTraffic())
            t.sent += len(json.dumps(request)) + sum(len(b) for b in blobs)
            t.received += reply.nbytes
            t.calls += 1
            t.seconds += time.perf_counter() - started
        return [reply]


def _is_base_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    rows = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main' "
                       "AND NOT temporary", [name]).fetchall()
    return bool(rows[0][0])


class _LocalShard(ShardService):
    """``ShardService`` over one relation of the caller's connection."""

    def __init__(self, con, name: str, relation: str, table: str | None, schema: pa.Schema, max_payload: int):
        super().__init__(con, max_payload)
        self.name, self.relation, self.table, self.schema = name, relation, table, schema

    def _cursor(self):
        # the caller's connection itself: a cursor would not see its temporary tables and
        # registered Arrow data; requests run one at a time and read every result at once
        return self.con

    def _table(self, name) -> str:
        if name != self.name:
            raise RequestError(f"no table {name} in this source")
        return self.relation

    def _version(self, name: str) -> tuple:
        return super()._version(self.table) if self.table is not None else ("query", self.relation)

    @contextmanager
    def _scope(self, name: str, cond: str, req: dict, blobs, keep_keyless: bool, idx=False, found=None):
        if self.table is None:  # a query has no row ids and no index
            yield self.con, "TRUE", cond
            return
        with super()._scope(self.table, cond, req, blobs, keep_keyless, idx, found) as scope:
            yield scope

    def _open_session(self, req: dict, name: str):
        if self.table is None:
            raise RequestError("a query source keeps no dfs_stateful state")
        return super()._open_session(req, self.table)

    def _tables(self) -> pa.Table:
        return pa.table({"name": pa.array([self.name], pa.string()),
                         "schema": pa.array([self.schema.serialize().to_pybytes()], pa.large_binary()),
                         "indexed": pa.array([False], pa.bool_())})
