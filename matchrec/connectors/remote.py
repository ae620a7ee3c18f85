"""The compute node's side of disaggregated storage: storage nodes over Arrow Flight.

``RemoteStore`` knows the nodes, their tables and the link, and reads the input of a
MATCH_RECOGNIZE with one of the pull strategies:

* ``pull_all``: every row and column of the table;
* ``push_down``: the needed columns, and only rows some non-gap variable can take when that is
  proven safe (planner.prefilter);
* ``dfs``: dual filtering. Variables are taken in order of their candidate counts; each round
  sends the current time interval set (and join filters for equality conditions, probed both
  ways when the source takes one row of a match) and gets back the candidates that pass both
  phases, whose intervals shrink the set. Each payload goes as the paper's filter (shrinking
  window filter, window-wise Bloom filter) or packed exactly (``operators.packing``), whichever
  is smaller; candidates come back packed. A cost model skips rounds whose expected saving is
  below their cost, and keeps the set here when sending it costs more than it filters. The
  final pull reads only rows inside the set, with the push-down filter;
* ``naive_dfs``: the same rounds with exact structures (interval arrays, value sets) instead of
  the filters - larger payloads, no false positives;
* ``push_pull``: the rounds of ``dfs`` in a query session the nodes keep state for
  (``connectors.session``): each node keeps the row ids of every variable's surviving
  candidates and shrinks them with each new set, so a later round touches only those rows and
  never evaluates a condition again. When the push-down filter names only variables that had a
  round, the final pull returns the kept rows inside the final set (a row that failed its
  variable's join filter can only be taken by a gap variable, which the push-down filter
  already proves droppable); otherwise it reads as ``dfs`` does.

Every request goes to all nodes at once. A node that fails or times out raises
``OperationalError`` naming it (after ``node_retries`` further attempts: requests without a
session are stateless); a result is never assembled from some of the nodes. A node that lost
a session's state (it restarted) fails the query the same way. Attempts are spaced by
exponential backoff (``retry_backoff`` seconds, doubling, at most ``MAX_BACKOFF``), each on a
fresh connection, so retries outlast a node's restart instead of failing within milliseconds
against a channel that still remembers the outage.
"""
from __future__ import annotations

import json
import math
import random
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from matchrec.errors import OperationalError, ProgrammingError
from matchrec.connectors.credentials import call_headers, connect_node, resolve_token, root_certificates
from matchrec.connectors.shard import unpack_candidates
from matchrec.operators.intervals import IntervalSet, ShrinkingWindowFilter, WindowJoinFilter
from matchrec.operators.packing import SlotJoinSet, pack_intervals, unpack
from matchrec.planner.intervals import IntervalPlan

STRATEGIES = ("auto", "pull_all", "push_down", "naive_dfs", "dfs", "push_pull")
ROUND_TRIPS = ("auto", "always", "never")
_IDENT = re.compile(r'^\s*(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*))\s*$')
DEFAULT_BACKOFF = 0.1  # seconds before the first retry; each further one waits twice as long
MAX_BACKOFF = 5.0


@dataclass
class NodeTraffic:
    sent: int = 0
    received: int = 0
    calls: int = 0
    seconds: float = 0.0


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


def _blob_table(blobs: list[bytes]) -> pa.Table:
    return pa.table({"blob": pa.array(blobs, pa.large_binary())})


class Node:
    def __init__(self, uri: str, token: str | None, timeout: float, root_certs: bytes | None = None):
        self.uri = uri
        self.root_certs = root_certs
        self.options = fl.FlightCallOptions(timeout=timeout, headers=call_headers(token))
        self.client = connect_node(uri, root_certs)
        self._lock = threading.Lock()

    def reconnect(self) -> None:
        """A new channel: gRPC's own would wait out its reconnect backoff (a second or more) after an outage."""
        fresh = connect_node(self.uri, self.root_certs)
        with self._lock:
            old, self.client = self.client, fresh
        try:
            old.close()
        except Exception:  # noqa: BLE001
            pass

    def exchange(self, request: dict, blobs: list[bytes]) -> tuple[pa.Table, int, int]:
        command = json.dumps(request).encode()
        descriptor = fl.FlightDescriptor.for_command(command)
        with self._lock:
            client = self.client
        writer, reader = client.do_exchange(descriptor, options=self.options)
        payload = _blob_table(blobs)
        writer.begin(payload.schema)
        if blobs:
            writer.write_table(payload)
        writer.done_writing()
        try:
            table = reader.read_all()
        except BaseException:
            try:  # closed here, the refused call is not reported again when the writer is collected
                writer.close()
            except (fl.FlightError, pa.ArrowException, OSError):
                pass
            raise
        writer.close()
        return table, len(command) + sum(len(b) for b in blobs), table.nbytes

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass


class RemoteStore:
    max_reply = 1 << 34  # bytes a packed candidate reply may unpack to

    def __init__(self, uris: list[str], token: str | None = None, timeout: float = 60.0,
                 tls_root_certs: str | bytes | None = None):
        if not uris:
            raise ProgrammingError("storage_nodes needs at least one grpc://host:port address")
        token = resolve_token(token)
        self.timeout = timeout
        roots = root_certificates(tls_root_certs)
        self.nodes = [Node(u, token, timeout, roots) for u in uris]
        self.pool = ThreadPoolExecutor(max_workers=max(2, len(self.nodes)))
        self.retries = 0
        self.retry_backoff = DEFAULT_BACKOFF
        self.schemas: dict[str, pa.Schema] = {}
        self.indexed: set[str] = set()  # tables with an ACER index on some node
        self.bandwidth = None  # bytes/s over all nodes together, probed lazily
        self.rtt = 0.0
        self._load_catalog()

    # -- calls to every node
    def call_all(self, request: dict, blobs: list[bytes] | None = None, stats: PullStats | None = None,
                 nodes: list[Node] | None = None) -> list[pa.Table]:
        nodes = self.nodes if nodes is None else nodes
        started = time.perf_counter()
        futures = [self.pool.submit(self._call, n, request, blobs or [], stats) for n in nodes]
        results, first_error = [], None
        for f in futures:
            try:
                results.append(f.result())
            except OperationalError as err:
                first_error = first_error or err
        if first_error is not None:
            raise first_error
        elapsed = time.perf_counter() - started
        if stats is not None:
            stats.round_trips += 1
        moved = sum(t.nbytes for t in results) + len(nodes) * sum(len(b) for b in (blobs or []))
        if moved > 256 * 1024 and elapsed > 0:  # refresh the bandwidth estimate from real transfers
            observed = moved / elapsed
            self.bandwidth = observed if self.bandwidth is None else 0.7 * self.bandwidth + 0.3 * observed
        return results

    def _call(self, node: Node, request: dict, blobs: list[bytes], stats: PullStats | None) -> pa.Table:
        attempts = 1 + max(0, int(self.retries))
        for attempt in range(attempts):
            started = time.perf_counter()
            try:
                table, sent, received = node.exchange(request, blobs)
            except fl.FlightServerError as err:
                if "query state lost" in str(err):
                    raise OperationalError(
                        f"Storage node {node.uri} lost the state of this push_pull query ({_short(err)}); no partial "
                        "result was used. Run the query again, or SET pull_strategy = dfs (stateless)") from None
                raise OperationalError(f"Storage node {node.uri} refused the request: {_short(err)}") from None
            except fl.FlightUnauthenticatedError:
                raise OperationalError(f"Storage node {node.uri} requires a valid token: pass "
                                       "matchrec.connect(storage_nodes=..., token=...)") from None
            except (fl.FlightError, pa.ArrowException, OSError) as err:
                if attempt + 1 < attempts:
                    time.sleep(self.backoff(attempt))
                    try:
                        node.reconnect()
                    except OperationalError:
                        pass  # the next attempt reports the node as failed
                    continue
                kind = "timed out" if isinstance(err, fl.FlightTimedOutError) else "failed"
                tried = f" after {attempts} attempts" if attempts > 1 else ""
                raise OperationalError(
                    f"Storage node {node.uri} {kind} during the query{tried} ({_short(err)}); no partial result was "
                    "used. Check that the node runs, or SET matchrec_node_retries to retry.") from None
            if stats is not None:
                t = stats.nodes.setdefault(node.uri, NodeTraffic())
                t.sent += sent
                t.received += received
                t.calls += 1
                t.seconds += time.perf_counter() - started
            return table
        raise AssertionError("unreachable")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt + 1``: doubling from ``retry_backoff``, capped,
        with +-20 % jitter so compute nodes that lost the same node do not return in step."""
        return min(MAX_BACKOFF, self.retry_backoff * (2 ** attempt)) * random.uniform(0.8, 1.2)

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

    def probe(self) -> None:
        """Measure round-trip time and bandwidth once (256 KiB from every node at once: enough
        for a first estimate, which real transfers then refine, and cheap on a slow link)."""
        if self.bandwidth is not None:
            return
        t0 = time.perf_counter()
        self.call_all({"op": "probe", "bytes": 0})
        self.rtt = time.perf_counter() - t0
        size = 1 << 18
        t0 = time.perf_counter()
        self.call_all({"op": "probe", "bytes": size})
        elapsed = max(time.perf_counter() - t0 - self.rtt, 1e-6)
        self.bandwidth = size * len(self.nodes) / elapsed

    def close(self) -> None:
        for n in self.nodes:
            n.close()
        self.pool.shutdown(wait=False)

    # -- which tables a statement reads
    def bare_table(self, input_text: str) -> str | None:
        m = _IDENT.match(input_text)
        if not m:
            return None
        name = m.group(1).replace('""', '"') if m.group(1) else m.group(2)
        return name if name in self.schemas else None

    # -- pulling
    def pull_all(self, table: str, stats: PullStats) -> pa.Table:
        parts = self.call_all({"op": "pull", "table": table}, stats=stats)
        return self._concat(table, parts, None)

    def _concat(self, table: str, parts: list[pa.Table], columns: list[str] | None) -> pa.Table:
        schema = self.schemas[table]
        n = sum(p.num_rows for p in parts)
        arrays = []
        for f in schema:
            if columns is None or f.name in columns:
                chunks = [c if c.type == f.type else c.cast(f.type) for p in parts for c in p.column(f.name).chunks]
                arrays.append(pa.chunked_array(chunks, f.type))
            else:  # columns the query does not read travel as NULLs that take no bytes
                arrays.append(pa.chunked_array([pa.nulls(n, f.type)], f.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def pull(self, table: str, strategy: str, columns: list[str], row_filter: str | None,
             ip: IntervalPlan | None, round_trips: str, stats: PullStats) -> pa.Table:
        stats.strategy = strategy
        t0 = time.perf_counter()
        if strategy == "pull_all":
            out = self.pull_all(table, stats)
            stats.phases["pull"] = time.perf_counter() - t0
        elif strategy == "push_down":
            parts = self.call_all({"op": "pull", "table": table, "columns": columns, "where": row_filter},
                                  stats=stats)
            out = self._concat(table, parts, columns)
            stats.phases["pull"] = time.perf_counter() - t0
        else:
            out = self._dual_filter(table, columns, ip, exact=(strategy == "naive_dfs"), round_trips=round_trips,
                                    stats=stats, session=secrets.token_hex(16) if strategy == "push_pull" else None)
        stats.events_pulled = out.num_rows
        return out

    def _dual_filter(self, table: str, columns: list[str], ip: IntervalPlan, exact: bool, round_trips: str,
                     stats: PullStats, session: str | None = None) -> pa.Table:
        try:
            request, blobs = self.filter_rounds(table, columns, ip, exact, round_trips, stats, session)
            t2 = time.perf_counter()
            sent0, received0 = stats.bytes_sent, stats.bytes_received
            parts = self.call_all(request, blobs, stats)
            stats.phases["final pull"] = time.perf_counter() - t2
            stats.phase_bytes["final pull"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
            return self._concat(table, parts, columns)
        except BaseException:
            if session is not None:  # free the nodes' state now rather than at its expiry
                for n in self.nodes:
                    self.pool.submit(_quietly, n.exchange, {"op": "end_session", "session": session}, [])
            raise

    def filter_rounds(self, table: str, columns: list[str] | None, ip: IntervalPlan, exact: bool, round_trips: str,
                      stats: PullStats, session: str | None = None) -> tuple[dict, list[bytes]]:
        """Make the candidate rounds; returns the final pull's request and payloads (rows inside
        the time interval set). With ``session`` (push_pull) the nodes keep each round's candidates."""
        base = {"table": table, "key_sql": ip.key_sql, "partition_sql": ip.partition_sql}
        kept: list[int] = []  # variables whose candidates the nodes keep (push_pull)
        t0 = time.perf_counter()
        if round_trips == "auto":
            self.probe()
        conds = [v.condition for v in ip.variables] + [ip.row_filter or "TRUE"]
        parts = self.call_all({"op": "stats", "conditions": conds, "columns": columns, "sample": round_trips == "auto",
                               **base}, stats=stats)
        sample = _Sample(parts, self.max_reply) if round_trips == "auto" else None
        counts = [sum(int(p.column(f"c{i}")[0].as_py() or 0) for p in parts) for i in range(len(conds))]
        kmins = [p.column("kmin")[0].as_py() for p in parts if p.column("kmin")[0].as_py() is not None]
        kmaxs = [p.column("kmax")[0].as_py() for p in parts if p.column("kmax")[0].as_py() is not None]
        row_bytes = max((p.column("row_bytes")[0].as_py() or 0.0) for p in parts) or 16.0
        span = (max(kmaxs) - min(kmins) + 1) if kmins else 1
        # the time the partitions are alive, summed: every node holds a share of each partition
        # (random spreading) or all of some (spreading by key), so the largest sum is the estimate
        extent = max([int(p.column("active")[0].as_py() or 0) for p in parts] + [span])
        stats.phases["statistics"] = time.perf_counter() - t0
        final_rows = counts[-1]
        order = _round_order(ip, counts)
        quantum = max(1, ip.window // 20)  # candidates travel as distinct (slot, values)
        if ip.partition_sql:
            base["pk_bits"] = _pk_bits(counts[order[0]], ip.variables[order[0]], quantum, span,
                                       max(int(p.column("parts")[0].as_py() or 1) for p in parts))
            if sample is not None:
                sample.pk >>= 32 - base["pk_bits"]
        tis: IntervalSet | None = None
        coverage = 1.0  # expected fraction of the time line still in the TIS
        sources: dict[tuple, tuple] = {}  # (label, sql, type) -> pk, value hash, slot of the candidates
        needs_values: dict[int, list[tuple[str, str]]] = {}  # label -> values its round returns
        by_label = {v.label: v for v in ip.variables}
        for v in ip.variables:
            for j in v.joins:
                if len(j.sources) == 1:
                    src = next(iter(j.sources))
                    _want(needs_values, src, (j.other_sql, j.common_type))
                    if src in by_label and by_label[src].at_most_once:  # the source is filtered by v's values
                        _want(needs_values, v.label, (j.current_sql, j.common_type))
        points: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # candidates: pk, earliest, latest key
        joined: dict[int, int] = {}  # variable -> join filters its last round used
        per_candidate = 4.0  # packed bytes per candidate, from the replies seen so far
        encoded: tuple = (None, None)  # (the set, its payload): built once per set, held by identity
        # Ascending candidate counts; then a second round for each variable whose join sources
        # (or whose joins' consumers) arrived after its first round.
        plan_rounds = [(i, False) for i in order] + [(i, True) for i in order if self._join_filters(ip, i, None)]
        for i, again in plan_rounds:
            v = ip.variables[i]
            usable = self._join_filters(ip, i, sources)
            if again and (i not in points or len(usable) <= joined.get(i, 0)):
                continue
            final_in = _rows_in(sample, final_rows, None, tis, coverage)
            candidates_in = _rows_in(sample, counts[i], i, tis, coverage)
            # Poisson: the chance that a point of the set lies near one of the round's candidates
            rate = candidates_in / max(tis.total_length(), 1) if tis is not None else counts[i] / extent
            own = 1 - math.exp(-rate * (v.before + v.after + quantum))
            ships_values = any((v.label, *m) not in sources for m in needs_values.get(v.label, []))
            mine = needs_values.get(v.label, [])
            if round_trips == "never":
                stats.rounds_skipped.append(f"{v.name} (round trips off)")
                continue
            if tis is not None and encoded[0] is not tis:
                encoded = (tis, self._tis_payload(tis, ip.window, exact))
            tis_bytes = len(encoded[1][1]) if tis is not None else 0
            # the set goes to every node: when that costs more than the candidates it would keep
            # back, the round asks for all of them and the set is applied here
            filtered = tis_bytes * len(self.nodes) + candidates_in * per_candidate
            blind = tis is not None and not exact and counts[i] * per_candidate < filtered
            round_bytes = min(filtered, counts[i] * per_candidate)
            if round_trips == "auto":
                if ships_values or usable:
                    join_bytes = sum((48 if exact else 2.5) * len(sources[key][0]) for _, _, key in usable)
                    why = self._skip_join_round(v.name, round_bytes + join_bytes * len(self.nodes),
                                                final_in * row_bytes)
                else:
                    why = self._skip_round(v.name, round_bytes, own, final_in, row_bytes)
                if why:
                    stats.rounds_skipped.append(why)
                    continue
            name = f"{v.name}{' (joins)' if again else ''}"
            t1 = time.perf_counter()
            sent0, received0 = stats.bytes_sent, stats.bytes_received
            blobs: list[bytes] = []
            request = {"op": "candidates", "condition": v.condition, "packed": True, "quantum": quantum, **base}
            if blind:
                stats.notes.append(f"round {name}: the time interval set stays here (sending it would cost more "
                                   "than the candidates it keeps back)")
            sent = stats.filters.setdefault(name, [])
            if tis is not None and not blind:
                kind, blob = encoded[1]
                request["filter"] = {"kind": kind, "blob": 0}
                blobs.append(blob)
                sent.append(f"time {kind} {len(blob)} B")
                if table in self.indexed:
                    request["cover"] = len(blobs)
                    blobs.append(_cover(tis))
            joins = []
            for j, direction, key in usable:
                pk, val, slot = sources[key]
                if tis is not None:
                    inside = tis.overlaps(pk, slot * quantum, slot * quantum + (quantum - 1))
                    pk, val, slot = pk[inside], val[inside], slot[inside]
                kind, blob = self._join_payload(pk, val, slot, quantum, ip.window, exact)
                value_sql = j.current_sql if direction == "follow" else j.other_sql
                joins.append({"value_sql": value_sql, "type": j.common_type, "blob": len(blobs), "kind": kind,
                              "direction": direction, "window": ip.window})
                sent.append(f"join {kind} {len(blob)} B ({direction})")
                blobs.append(blob)
            joined[i] = len(usable)
            request["joins"] = joins
            request["values"] = [list(m) for m in mine]
            if session is not None:
                request.update(session=session, var=i, expect=sorted(kept))
            parts = self.call_all(request, blobs, stats)
            if session is not None and i not in kept:
                kept.append(i)
            names = (["pk"] if ip.partition_sql else []) + [f"v{k}" for k in range(len(mine))] + ["s"]
            got = unpack_candidates(parts, names, self.max_reply)
            slots = got["s"]
            n_rows = len(slots)
            pk = got["pk"] if ip.partition_sql else np.zeros(n_rows, np.int64)
            stats.candidates[name] = n_rows
            if n_rows:
                per_candidate = max(0.5, sum(p.nbytes for p in parts) / n_rows)
            for k, m in enumerate(mine):
                sources[(v.label, *m)] = (pk, got[f"v{k}"], slots)
            lo, hi = slots * quantum, slots * quantum + (quantum - 1)
            new = IntervalSet.around_slots(pk, slots, quantum, v.before, v.after)
            points[i] = (pk, lo, hi)
            tis = new if tis is None else tis.intersect(new)
            tis = _refine(tis, points, ip)
            coverage = min(1.0, tis.total_length() / extent)
            stats.phase_bytes[f"round {name}"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
            stats.phases[f"round {name}"] = time.perf_counter() - t1
            if len(tis) == 0:
                break
        request = {"op": "pull", "columns": columns, "where": ip.row_filter, **base}
        blobs = []
        if tis is not None:
            kind, blob = encoded[1] if encoded[0] is tis else self._tis_payload(tis, ip.window, exact)
            request["filter"] = {"kind": kind, "blob": 0}
            blobs.append(blob)
            stats.filters["final pull"] = [f"time {kind} {len(blob)} B"]
            if len(tis):
                request["range"] = [int(tis.lo.min()), int(tis.hi.max())]
            else:
                request["range"] = [1, 0]
            if table in self.indexed:
                request["cover"] = len(blobs)
                blobs.append(_cover(tis))
        if session is not None and kept:
            request.update(session=session, expect=sorted(kept))
            labels = {ip.variables[i].label for i in kept}
            if ip.row_filter is not None and ip.filter_labels is not None and set(ip.filter_labels) <= labels:
                request["union"] = sorted(kept)
                stats.notes.append("final pull: the rows the nodes kept for " +
                                   ", ".join(ip.variables[i].name for i in sorted(kept)))
            else:
                stats.notes.append("final pull: by the push-down filter (a variable it names had no round)")
        if tis is not None:
            stats.notes.append(f"time interval set: {len(tis)} intervals covering {tis.total_length()} of {extent} "
                               f"key units (window {ip.window})")
        return request, blobs

    @staticmethod
    def _tis_payload(tis: IntervalSet, window: int, exact: bool) -> tuple[str, bytes]:
        """The TIS as the smaller of a shrinking window filter and its packed exact intervals
        (``naive_dfs``: the plain interval arrays)."""
        if exact:
            return "exact", np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes()
        packed = pack_intervals(tis)
        swf = ShrinkingWindowFilter.build(tis, window).to_bytes()
        return ("swf", swf) if len(swf) < len(packed) else ("intervals", packed)

    @staticmethod
    def _join_payload(pk, val, slot, quantum: int, window: int, exact: bool) -> tuple[str, bytes]:
        """One variable's candidates as a join filter: the smaller of the window-wise Bloom filter
        and the packed exact set of (partition, value, slot) (``naive_dfs``: plain arrays). A
        candidate is known to a slot: the Bloom filter stores it under the windows of both ends."""
        lo, hi = slot * quantum, slot * quantum + (quantum - 1)
        if exact:
            return "exact", np.concatenate([np.r_[pk, pk], np.r_[val, val], np.r_[lo, hi]]).astype(np.int64).tobytes()
        wjf = WindowJoinFilter.build(np.r_[pk, pk], np.r_[val, val], np.r_[lo, hi], window).to_bytes()
        slots = SlotJoinSet.of_points(pk, val, slot, quantum, window).to_bytes()
        return ("wjf", wjf) if len(wjf) < len(slots) else ("slots", slots)

    @staticmethod
    def _join_filters(ip: IntervalPlan, i: int, sources: dict | None) -> list[tuple]:
        """The join filters variable ``i``'s round can apply: (join, direction, source key) for its
        own joins whose source's values arrived ("follow": a source row in ``[t - w, t]``), and
        for the joins that read it, when it takes at most one row of a match, whose consumer's
        values arrived ("precede": a consumer row in ``[t, t + w]``). With ``sources`` None: every
        join filter the round could ever apply."""
        v = ip.variables[i]
        out = []
        for j in v.joins:
            if len(j.sources) == 1:
                key = (next(iter(j.sources)), j.other_sql, j.common_type)
                if sources is None or key in sources:
                    out.append((j, "follow", key))
        if v.at_most_once:
            for c in ip.variables:
                for j in c.joins:
                    if j.sources == frozenset({v.label}):
                        key = (c.label, j.current_sql, j.common_type)
                        if sources is None or key in sources:
                            out.append((j, "precede", key))
        return out

    def _skip_join_round(self, name, round_bytes, final_bytes) -> str | None:
        """A round that ships join values, or applies join filters, pays off only through the
        join's selectivity, which is unknown before it runs; make it only when its own traffic
        (the candidates' replies and the filters sent to every node) is under a quarter of the
        final pull it may shrink."""
        if round_bytes >= 0.25 * final_bytes:
            return (f"{name}: join round would move ~{round_bytes / 1e6:.1f} MB against a final pull of "
                    f"~{final_bytes / 1e6:.1f} MB")
        return None

    def _skip_round(self, name, round_bytes, own, final_in, row_bytes) -> str | None:
        """Why one more round for ``name`` would not pay off (Eq. 2-4 in spirit), or None: its
        traffic and round trip against the final-pull rows it is expected to remove (those in the
        part of the set no candidate of ``name`` lies near)."""
        bw = self.bandwidth or 1e9
        cost = self.rtt + round_bytes / bw
        benefit = final_in * (1 - own) * row_bytes / bw
        if benefit <= cost:
            return (f"{name}: expected saving {benefit * 1000:.2f} ms <= cost {cost * 1000:.2f} ms "
                    f"(bandwidth {bw / 1e6:.1f} MB/s, round trip {self.rtt * 1000:.1f} ms)")
        return None


def _refine(tis: IntervalSet, points: dict, ip: IntervalPlan, rounds: int = 3) -> IntervalSet:
    """Shrink the TIS without asking the nodes: candidates of an earlier round that no longer
    lie in the set cannot be part of a match, so their intervals are dropped and the set is
    intersected again, until nothing changes."""
    for _ in range(rounds):
        before = (len(tis), tis.total_length())
        for i, (pk, lo, hi) in points.items():
            v = ip.variables[i]
            keep = tis.overlaps(pk, lo, hi)
            tis = tis.intersect(IntervalSet._merged(pk[keep], lo[keep] - v.before, hi[keep] + v.after))
        if (len(tis), tis.total_length()) == before:
            break
    return tis


class _Sample:
    """The nodes' samples of the rows the final pull reads (partition, key, which variables'
    conditions hold): where in a time interval set the rows are, when they are not spread
    evenly over time (events of a partition come in bursts, variables come near each other)."""

    def __init__(self, parts: list[pa.Table], max_bytes: int):
        cols = [[], [], []]
        for p in parts:
            if "sample" in p.column_names and p.column("sample")[0].as_py():
                pk, t, m = unpack(p.column("sample")[0].as_py(), max_bytes, 3)
                for c, x in zip(cols, (np.cumsum(pk), np.cumsum(t), m)):
                    c.append(x)
        self.pk, self.t, self.m = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols)

    def share(self, tis: IntervalSet, variable: int | None) -> tuple[float, int]:
        """The fraction of the sampled rows (of one variable) inside ``tis``, and how many there were."""
        pick = np.ones(len(self.t), bool) if variable is None else (self.m >> variable) & 1 == 1
        n = int(pick.sum())
        return (float(tis.contains(self.pk[pick], self.t[pick]).mean()) if n else 0.0), n


def _rows_in(sample: _Sample | None, total: float, variable: int | None, tis: IntervalSet | None,
             coverage: float) -> float:
    """Expected rows (all the final pull reads, or one variable's candidates) inside ``tis``: from
    the sample when it has enough of them, else spread evenly over the partitions' lives."""
    if tis is None:
        return total
    if sample is not None:
        share, n = sample.share(tis, variable)
        if n >= 30:
            return total * share
    return total * coverage


def _pk_bits(first: int, v, quantum: int, span: int, partitions: int) -> int:
    """How many bits of the partition hash the rounds use. Partitions that share a hash value
    share their intervals: a row is then pulled for a bucket-mate's interval, with a chance of
    about (intervals per bucket) x (interval length) / (time span). Fewer bits pack every
    interval's key smaller (the set goes to every node each round), so take the fewest that keep
    that chance near 1% for the first round's intervals - never more than tell the partitions
    apart."""
    length = v.before + v.after + quantum
    wanted = math.ceil(math.log2(max(first * length / (0.01 * max(span, 1)), 1)))
    return int(min(32, math.ceil(math.log2(partitions + 1)) + 1, max(1, wanted)))


def _want(needs: dict, label: int, value: tuple[str, str]) -> None:
    wanted = needs.setdefault(label, [])
    if value not in wanted:
        wanted.append(value)


def _round_order(ip: IntervalPlan, counts: list[int]) -> list[int]:
    """Variables by ascending candidate count: the rarest shrinks the set first and every later
    round only ships candidates inside it."""
    return sorted(range(len(ip.variables)), key=lambda i: counts[i])


def _cover(tis: IntervalSet, most: int = 1024) -> bytes:
    """The set's intervals over all partitions, merged, as at most ``most`` sorted disjoint
    ranges (the smallest gaps closed): what an ACER index skips clusters with."""
    order = np.argsort(tis.lo, kind="stable")
    lo, hi = tis.lo[order].astype(np.int64), tis.hi[order].astype(np.int64)
    if len(lo):
        reach = np.maximum.accumulate(hi)
        starts = np.r_[0, np.flatnonzero(lo[1:] > reach[:-1] + 1) + 1]
        lo, hi = lo[starts], np.r_[reach[starts[1:] - 1], reach[-1]]
        if len(lo) > most:
            gaps = lo[1:] - hi[:-1]
            cut = np.sort(np.argsort(gaps, kind="stable")[-(most - 1):])
            lo, hi = np.r_[lo[0], lo[cut + 1]], np.r_[hi[cut], hi[-1]]
    return np.concatenate([lo, hi]).astype(np.int64).tobytes()


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - cleanup after a failed query; the node expires the state anyway
        pass


def _short(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:300]
