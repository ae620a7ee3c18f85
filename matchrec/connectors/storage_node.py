"""A storage node: an Arrow Flight server over one DuckDB shard (``matchrec storage-node``).

Row data stays in DuckDB. A compute node asks through ``do_exchange`` calls whose descriptor
is a JSON request and whose uploaded batch carries binary filter payloads (window filters,
join filters, exact interval arrays) and is answered by ``connectors.shard.ShardService``;
``do_put`` loads rows (``matchrec load``, which drops the table's ACER index); the
``build_index`` request (``matchrec index``) builds one. The ``partial_matches`` request is the
push-pull baseline's partial matching on the node's rows (``connectors.partial_matches``). The
``status`` action reports the node's request counters.

The shard is opened with external access off, so a request's SQL fragments can read only the
shard. A token, when set, is required on every call; TLS is on with a certificate and key.
Whatever a request does wrong, its caller gets a short error (the details of an unexpected
failure go to the node's log, never to the client), and the node keeps serving: requests are
bounded in size and nesting, the payload bytes all requests hold at once are bounded, and a
request whose caller timed out or went away has its DuckDB work interrupted.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
import traceback

import duckdb
import pyarrow as pa
import pyarrow.flight as fl

from matchrec.connectors import acer
from matchrec.connectors.credentials import TOKEN_ENV, read_token_file
from matchrec.connectors.session import SessionLost
from matchrec.connectors.shard import DEFAULT_MAX_PAYLOAD_MB, RequestCancelled, RequestError, ShardService
from matchrec.errors import ProgrammingError
from matchrec.operators.intervals import FilterPayloadError
from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident

MAX_REQUEST_BYTES = 1 << 20  # a request's JSON; SQL fragments are far smaller, payloads travel as Arrow
PAYLOAD_READERS = 2  # requests receiving payloads at once: gRPC and Arrow hold each message whole while it is read
PAYLOAD_WAIT_SECONDS = 30.0  # longest a request waits for its turn to send a payload before it is refused as busy
CANCEL_POLL_SECONDS = 0.05  # how often a running request checks that its caller still waits


class TokenMiddlewareFactory(fl.ServerMiddlewareFactory):
    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

    def start_call(self, info, headers):
        values = headers.get("authorization", [])
        given = [v if isinstance(v, bytes) else str(v).encode() for v in values]
        if not any(secrets.compare_digest(v, self.expected) for v in given):
            raise fl.FlightUnauthenticatedError("this storage node requires a valid token")
        return None


class NodeBusy(Exception):
    """A request the node cannot take now but could later (the caller may retry it)."""


class PayloadBudget:
    """The payload bytes all running requests may hold together; past it a request is refused
    (the caller may retry), so many large uploads at once cannot exhaust the node's memory."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            if self.held + n > self.limit:
                raise NodeBusy("the node holds as many payload bytes as it accepts at once; retry later")
            self.held += n

    def give(self, n: int) -> None:
        with self.lock:
            self.held -= n


class StorageNode(fl.FlightServerBase):
    """A storage node: serves from its constructor on. A process that is a node blocks in
    ``serve()`` (which also stops it on SIGINT/SIGTERM); a node hosted in a thread of another
    program waits with ``wait()`` instead, because ``serve()`` installs C-level signal handlers
    that stay behind when several such servers shut down, and Ctrl-C then reaches nothing."""

    def __init__(self, db: str, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_payload_mb: int = DEFAULT_MAX_PAYLOAD_MB, tls: tuple[bytes, bytes] | None = None,
                 log=None):
        # everything a request touches exists before the server starts listening (in its constructor)
        self.db = db
        self.con = duckdb.connect(db)
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")
        self.max_payload = max_payload_mb * 1024 * 1024
        self.budget = PayloadBudget(2 * self.max_payload)
        self.readers = threading.BoundedSemaphore(PAYLOAD_READERS)
        self.lock = threading.Lock()  # DDL of loads against concurrent readers
        self.service = ShardService(self.con, self.max_payload, keep_stats=True, keep_catalog=True)
        self.log = log if log is not None else sys.stderr
        self.counters = {"requests": 0, "refused": 0, "cancelled": 0, "internal_errors": 0}
        self._counter_lock = threading.Lock()
        middleware = {"auth": TokenMiddlewareFactory(token)} if token else None
        self.scheme = "grpc+tls" if tls else "grpc"
        host_part = f"[{host}]" if ":" in host else host
        try:
            super().__init__(f"{self.scheme}://{host_part}:{port}", middleware=middleware,
                             tls_certificates=[fl.CertKeyPair(*tls)] if tls else None)
        except BaseException:
            self.con.close()
            raise

    def close(self) -> None:
        """Stop serving and close the shard."""
        self.shutdown()
        self.con.close()

    def _count(self, name: str) -> None:
        with self._counter_lock:
            self.counters[name] += 1

    def _say(self, line: str) -> None:
        try:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", file=self.log, flush=True)
        except (OSError, ValueError):
            pass  # a closed log must not fail requests

    @staticmethod
    def _request(descriptor) -> dict:
        command = descriptor.command
        if command is None or len(command) > MAX_REQUEST_BYTES:
            raise RequestError(f"a request is JSON of at most {MAX_REQUEST_BYTES} bytes")
        try:
            req = json.loads(command.decode())
        except (ValueError, UnicodeDecodeError):
            raise RequestError("request is not JSON") from None
        except RecursionError:
            raise RequestError("request nests too deeply") from None
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            raise RequestError("request needs an op")
        return req

    def _blobs(self, reader, held: list[int], context) -> list[bytes]:
        """The uploaded payloads; ``held[0]`` counts the bytes taken from the budget. Only
        ``PAYLOAD_READERS`` requests read at once: a message not yet read stays with its sender
        (gRPC's flow control), so many large uploads together cannot exhaust the node's memory."""
        waited = 0.0
        while not self.readers.acquire(timeout=0.05):
            waited += 0.05
            if context.is_cancelled():
                raise RequestCancelled()
            if waited > PAYLOAD_WAIT_SECONDS:
                raise NodeBusy("other requests are sending payloads; retry later")
        try:
            return self._read_blobs(reader, held)
        finally:
            self.readers.release()

    def _read_blobs(self, reader, held: list[int]) -> list[bytes]:
        blobs, total = [], 0
        try:
            for chunk in reader:
                batch = chunk.data
                if batch is None:
                    continue
                if batch.schema.names != ["blob"] or not pa.types.is_large_binary(batch.schema.field(0).type):
                    raise RequestError("payload must be one large_binary column named blob")
                size = batch.get_total_buffer_size()
                if total + size > self.max_payload:
                    raise RequestError(f"payload exceeds the node's limit of {self.max_payload} bytes")
                self.budget.take(size)
                held[0] += size
                total += size
                blobs += [value or b"" for value in batch.column(0).to_pylist()]
        except pa.ArrowInvalid as err:
            raise RequestError(f"payload is not a valid Arrow stream: {_first_line(err)}") from None
        return blobs

    def _answering(self, what: str, context, work):
        """Run one call's ``work`` and turn whatever it raises into a short error for the caller.
        While it runs, a watcher interrupts its DuckDB work once the caller is gone."""
        self._count("requests")
        started = time.perf_counter()
        try:
            with self.service.cancellable(context.is_cancelled, CANCEL_POLL_SECONDS):
                return work()
        except RequestCancelled:
            self._count("cancelled")
            self._say(f"{what}: stopped after {time.perf_counter() - started:.2f} s, its caller timed out or left")
            raise fl.FlightCancelledError("the request was cancelled") from None
        except fl.FlightError:
            self._count("refused")
            raise
        except NodeBusy as err:
            self._count("refused")
            raise fl.FlightUnavailableError(f"the node is busy: {err}") from None
        except SessionLost as err:
            self._count("refused")
            raise fl.FlightServerError(f"query state lost: {err}") from None
        except (RequestError, FilterPayloadError) as err:
            self._count("refused")
            raise fl.FlightServerError(f"bad request: {_first_line(err)}") from None
        except duckdb.InterruptException:
            self._count("cancelled")
            raise fl.FlightCancelledError("the request was cancelled") from None
        except duckdb.Error as err:
            self._count("refused")
            raise fl.FlightServerError(f"the node could not run the request: {_first_line(err)}") from None
        except RecursionError:
            self._count("refused")
            raise fl.FlightServerError("bad request: it nests too deeply") from None
        except MemoryError:
            self._count("refused")
            raise fl.FlightServerError("the node has not the memory for this request") from None
        except (ValueError, TypeError, KeyError, IndexError, pa.ArrowException) as err:
            self._count("refused")
            raise fl.FlightServerError(f"bad request: {type(err).__name__}: {_first_line(err)}") from None
        except Exception:  # noqa: BLE001 - the caller gets a reference, the log gets the traceback
            self._count("internal_errors")
            ref = secrets.token_hex(4)
            self._say(f"{what}: internal error {ref}\n{traceback.format_exc()}")
            raise fl.FlightServerError(f"internal error in the storage node (reference {ref} in its log)") from None
        finally:
            pa.default_memory_pool().release_unused()

    # -- Flight
    def list_flights(self, context, criteria):
        return iter(())

    def get_flight_info(self, context, descriptor):
        raise fl.FlightServerError("bad request: this node answers do_exchange requests only")

    def get_schema(self, context, descriptor):
        raise fl.FlightServerError("bad request: this node answers do_exchange requests only")

    def do_get(self, context, ticket):
        raise fl.FlightServerError("bad request: this node hands out no tickets; use do_exchange")

    def list_actions(self, context):
        return [("ping", "answers pong"), ("status", "the node's request counters as JSON")]

    def do_action(self, context, action):
        def work():
            if action.type == "ping":
                return [fl.Result(b"pong")]
            if action.type == "status":
                with self._counter_lock:
                    counters = dict(self.counters)
                counters["payload_bytes_held"] = self.budget.held
                return [fl.Result(json.dumps(counters).encode())]
            raise RequestError(f"unknown action {str(action.type)[:100]!r}")
        return self._answering(f"action {str(action.type)[:40]!r}", context, work)

    def do_exchange(self, context, descriptor, reader, writer):
        held = [0]

        def work():
            req = self._request(descriptor)
            blobs = self._blobs(reader, held, context)
            if req["op"] == "build_index":
                with self.lock:
                    return self.service.answer(req, blobs)
            return self.service.answer(req, blobs)
        try:
            table = self._answering("exchange", context, work)
        finally:
            self.budget.give(held[0])
        writer.begin(table.schema)
        writer.write_table(table)

    def do_put(self, context, descriptor, reader, writer):
        self._answering("load", context, lambda: self._load(descriptor, reader))

    def _load(self, descriptor, reader) -> None:
        req = self._request(descriptor)
        if req["op"] != "load" or not isinstance(req.get("table"), str) or not req["table"]:
            raise RequestError("do_put takes {op: load, table: name}")
        try:
            data = reader.read_all()
        except pa.ArrowInvalid as err:
            raise RequestError(f"the rows are not a valid Arrow stream: {_first_line(err)}") from None
        cur = self.con.cursor()
        name = quote_ident(req["table"])
        with self.lock:
            cur.register(H.LOAD, data)
            exists = cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main'",
                                 [req["table"]]).fetchone()[0]
            if req.get("replace") or not exists:
                cur.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM {H.LOAD}")
            else:
                cur.execute(f"INSERT INTO {name} SELECT * FROM {H.LOAD}")
            cur.unregister(H.LOAD)
            acer.drop(self.con, req["table"])  # its clusters and bitmaps describe rows that are gone
            self.service.forget(req["table"])
            self.con.execute("CHECKPOINT")


def _first_line(err: BaseException) -> str:
    text = str(err).split("\n", 1)[0]
    return (text.split(". Detail:", 1)[0])[:300]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only loopback addresses (a name is resolved; unresolvable is not)."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(bare, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_exposure(host: str, token: str | None, insecure: bool) -> None:
    """Refuse to serve a non-loopback address without a token, unless told ``insecure``."""
    if token or insecure or is_loopback(host):
        return
    raise ProgrammingError(f"Refusing to listen on {host} without a token: anyone who reaches it could read the "
                           f"shard. Give --token-file FILE (or set {TOKEN_ENV}), or --insecure to serve it anyway")


# -- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, help="DuckDB file holding this node's shard (created if missing)")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other needs a token or --insecure)")
    parser.add_argument("--token", default=None,
                        help=f"require this token from clients (visible to other users in ps: prefer --token-file "
                             f"or {TOKEN_ENV})")
    parser.add_argument("--token-file", default=None, metavar="PATH", help="require the token in this file")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS (grpc+tls://) with this certificate")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback --host without a token")
    parser.add_argument("--max-payload-mb", type=int, default=DEFAULT_MAX_PAYLOAD_MB,
                        help="largest filter payload accepted per request")


def _tls_pair(args) -> tuple[bytes, bytes] | None:
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise ProgrammingError("TLS needs both --tls-cert and --tls-key")
    pair = []
    for what, path in (("certificate", args.tls_cert), ("key", args.tls_key)):
        try:
            with open(path, "rb") as f:
                pair.append(f.read())
        except OSError as err:
            raise ProgrammingError(f"Cannot read the TLS {what} {path}: {err.strerror}") from None
    return pair[0], pair[1]


def run(args) -> int:
    if args.token is not None and args.token_file is not None:
        raise ProgrammingError("Give --token or --token-file, not both")
    if args.token_file is not None:
        token = read_token_file(args.token_file)
    else:
        token = args.token or os.environ.get(TOKEN_ENV) or None
    check_exposure(args.host, token, args.insecure)
    tls = _tls_pair(args)
    try:
        node = StorageNode(args.db, args.host, args.port, token, args.max_payload_mb, tls)
    except duckdb.Error as err:
        print(f"Error: cannot open {args.db}: {_first_line(err)}", file=sys.stderr)
        return 1
    except (OSError, fl.FlightError, pa.ArrowException) as err:
        print(f"Error: cannot listen on {args.host}:{args.port}: {_first_line(err)}", file=sys.stderr)
        return 1
    access = "token required" if token else "no token"
    print(f"matchrec storage node serving {args.db} on {node.scheme}://{args.host}:{node.port} ({access})", flush=True)

    def stop(*_):
        threading.Thread(target=node.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    node.serve()
    node.con.close()
    return 0
