"""The wire between a compute node and its storage nodes: Arrow Flight exchanges.

``FlightTransport`` owns the connections to the nodes (tokens in call headers, TLS roots), sends
one request (JSON) with its binary payloads to every node at once and collects the Arrow
replies, and turns every failure into ``OperationalError`` naming the node: a refused request,
a missing token, a lost ``dfs_stateful`` session, a node that failed or timed out. A request
without a session is stateless, so it is retried ``retries`` more times, spaced by exponential
backoff (``retry_backoff`` seconds, doubling, at most ``MAX_BACKOFF``, with jitter), each on a
fresh connection: retries outlast a node's restart instead of failing within milliseconds
against a channel that still remembers the outage. A result is never assembled from some of
the nodes. ``max_reply`` bounds what one packed reply may unpack to.

What the requests mean is ``connectors.shard``'s business; what to ask is
``connectors.dual_filtering``'s. This module knows neither.
"""
from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.flight as fl

from matchrec.connectors.credentials import call_headers, connect_node, resolve_token, root_certificates
from matchrec.errors import OperationalError, ProgrammingError

DEFAULT_BACKOFF = 0.1  # seconds before the first retry; each further one waits twice as long
MAX_BACKOFF = 5.0
MAX_REPLY = 1 << 34  # bytes a packed candidate reply may unpack to
SLOW_TRANSFER_BYTES = 8 << 20  # a transfer this large may lower the bandwidth estimate (see call_all)


@dataclass
class NodeTraffic:
    """What one node (or a shard that plays one) moved for one MATCH_RECOGNIZE input."""
    sent: int = 0
    received: int = 0
    calls: int = 0
    seconds: float = 0.0


def _blob_table(blobs: list[bytes]) -> pa.Table:
    return pa.table({"blob": pa.array(blobs, pa.large_binary())})


class Node:
    """One storage node's connection."""

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
        """One request and its payloads; returns the reply and the bytes sent and received."""
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


class FlightTransport:
    """Requests to every storage node at once, with retries and errors naming the node.

    ``call_all`` records traffic on a stats object with ``round_trips`` and ``nodes`` (uri ->
    ``NodeTraffic``), and refines ``bandwidth`` (bytes/s over all nodes together) from real
    transfers; ``probe`` measures it and the round-trip time once."""

    max_reply = MAX_REPLY

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
        self.bandwidth = None  # bytes/s over all nodes together, probed lazily
        self.rtt = 0.0
        self.probed = False  # the round trip is measured once, before the first cost decision

    def call_all(self, request: dict, blobs: list[bytes] | None = None, stats=None,
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
            # the elapsed time includes the nodes' scan: a reply of 1 MB after scanning millions of
            # rows looks like a slow link, and taking it as one dragged the estimate down statement
            # after statement (14.7 to 3.1 MB/s over five runs on a 12.5 MB/s link). A faster
            # transfer proves a faster link; a slower one counts only when large enough for the
            # transfer, not the scan, to take most of its time.
            if self.bandwidth is None or observed > self.bandwidth or moved >= SLOW_TRANSFER_BYTES:
                self.bandwidth = observed if self.bandwidth is None else 0.7 * self.bandwidth + 0.3 * observed
        return results

    def _call(self, node: Node, request: dict, blobs: list[bytes], stats) -> pa.Table:
        attempts = 1 + max(0, int(self.retries))
        for attempt in range(attempts):
            started = time.perf_counter()
            try:
                table, sent, received = node.exchange(request, blobs)
            except fl.FlightServerError as err:
                if "query state lost" in str(err):
                    raise OperationalError(
                        f"Storage node {node.uri} lost the state of this dfs_stateful query ({_short(err)}); no partial "
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

    def probe(self) -> None:
        """Measure round-trip time and bandwidth once (256 KiB from every node at once: enough
        for a first estimate, which real transfers then refine, and cheap on a slow link)."""
        if self.probed:
            return
        self.probed = True
        t0 = time.perf_counter()
        self.call_all({"op": "probe", "bytes": 0})
        self.rtt = time.perf_counter() - t0
        if self.bandwidth is not None:  # a large pull (push_down, say) measured it already
            return
        size = 1 << 18
        t0 = time.perf_counter()
        self.call_all({"op": "probe", "bytes": size})
        elapsed = max(time.perf_counter() - t0 - self.rtt, 1e-6)
        self.bandwidth = size * len(self.nodes) / elapsed

    def forget(self, request: dict) -> None:
        """Send ``request`` to every node without waiting or reporting failures (cleanup after a
        failed query: a node expires the state anyway)."""
        for n in self.nodes:
            self.pool.submit(_quietly, n.exchange, request, [])

    def close(self) -> None:
        for n in self.nodes:
            n.close()
        self.pool.shutdown(wait=False)


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - cleanup after a failed query
        pass


def _short(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:300]
