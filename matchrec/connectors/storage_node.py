"""A storage node: an Arrow Flight server over one DuckDB shard (``matchrec storage-node``).

Row data stays in DuckDB. A compute node asks through ``do_exchange`` calls whose descriptor
is a JSON request and whose uploaded batch carries binary filter payloads (window filters,
join filters, exact interval arrays) and is answered by ``connectors.shard.ShardService``;
``do_put`` loads rows (``matchrec load``, which drops the table's ACER index); the
``build_index`` request (``matchrec index``) builds one.

The shard is opened with external access off, so a request's SQL fragments can read only the
shard. A token, when set, is required on every call.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

import duckdb
import pyarrow as pa
import pyarrow.flight as fl

from matchrec.connectors import acer
from matchrec.connectors.session import SessionLost
from matchrec.connectors.shard import DEFAULT_MAX_PAYLOAD_MB, RequestError, ShardService, quote
from matchrec.operators.intervals import FilterPayloadError


class TokenMiddlewareFactory(fl.ServerMiddlewareFactory):
    def __init__(self, token: str):
        self.token = token

    def start_call(self, info, headers):
        values = headers.get("authorization", [])
        if f"Bearer {self.token}" not in [v.decode() if isinstance(v, bytes) else v for v in values]:
            raise fl.FlightUnauthenticatedError("this storage node requires a valid token")
        return None


class StorageNode(fl.FlightServerBase):
    def __init__(self, db: str, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_payload_mb: int = DEFAULT_MAX_PAYLOAD_MB):
        middleware = {"auth": TokenMiddlewareFactory(token)} if token else None
        super().__init__(f"grpc://{host}:{port}", middleware=middleware)
        self.db = db
        self.con = duckdb.connect(db)
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")
        self.max_payload = max_payload_mb * 1024 * 1024
        self.lock = threading.Lock()  # DDL of loads against concurrent readers
        self.service = ShardService(self.con, self.max_payload)

    def close(self) -> None:
        """Stop serving and close the shard."""
        self.shutdown()
        self.con.close()

    @staticmethod
    def _request(descriptor) -> dict:
        try:
            req = json.loads(descriptor.command.decode())
        except (ValueError, UnicodeDecodeError):
            raise RequestError("request is not JSON") from None
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            raise RequestError("request needs an op")
        return req

    def _blobs(self, reader) -> list[bytes]:
        blobs, total = [], 0
        try:
            for chunk in reader:
                batch = chunk.data
                if batch is None:
                    continue
                if batch.schema.names != ["blob"] or not pa.types.is_large_binary(batch.schema.field(0).type):
                    raise RequestError("payload must be one large_binary column named blob")
                for value in batch.column(0).to_pylist():
                    total += len(value or b"")
                    if total > self.max_payload:
                        raise RequestError(f"payload exceeds the node's limit of {self.max_payload} bytes")
                    blobs.append(value or b"")
        except pa.ArrowInvalid as err:
            raise RequestError(f"payload is not a valid Arrow stream: {err}") from None
        return blobs

    # -- Flight
    def list_flights(self, context, criteria):
        return iter(())

    def do_action(self, context, action):
        if action.type == "ping":
            yield fl.Result(b"pong")
        else:
            raise fl.FlightServerError(f"unknown action {action.type}")

    def do_exchange(self, context, descriptor, reader, writer):
        try:
            req = self._request(descriptor)
            blobs = self._blobs(reader)
            if req["op"] == "build_index":
                with self.lock:
                    table = self.service.answer(req, blobs)
            else:
                table = self.service.answer(req, blobs)
        except SessionLost as err:
            raise fl.FlightServerError(f"query state lost: {err}") from None
        except (RequestError, FilterPayloadError) as err:
            raise fl.FlightServerError(f"bad request: {err}") from None
        except duckdb.Error as err:
            raise fl.FlightServerError(f"the node could not run the request: {str(err).splitlines()[0]}") from None
        except (ValueError, TypeError, KeyError, IndexError, pa.ArrowException) as err:
            raise fl.FlightServerError(f"bad request: {type(err).__name__}: {str(err)[:200]}") from None
        writer.begin(table.schema)
        writer.write_table(table)

    def do_put(self, context, descriptor, reader, writer):
        try:
            req = self._request(descriptor)
            if req["op"] != "load" or not isinstance(req.get("table"), str) or not req["table"]:
                raise RequestError("do_put takes {op: load, table: name}")
            data = reader.read_all()
        except RequestError as err:
            raise fl.FlightServerError(f"bad request: {err}") from None
        cur = self.con.cursor()
        name = quote(req["table"])
        with self.lock:
            cur.register("__mr_load", data)
            exists = cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main'",
                                 [req["table"]]).fetchone()[0]
            if req.get("replace") or not exists:
                cur.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM __mr_load")
            else:
                cur.execute(f"INSERT INTO {name} SELECT * FROM __mr_load")
            cur.unregister("__mr_load")
            acer.drop(self.con, req["table"])  # its clusters and bitmaps describe rows that are gone
            self.service.indexes.forget(req["table"])
            self.con.execute("CHECKPOINT")


# -- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, help="DuckDB file holding this node's shard (created if missing)")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--token", default=None, help="require this token from clients")
    parser.add_argument("--max-payload-mb", type=int, default=DEFAULT_MAX_PAYLOAD_MB,
                        help="largest filter payload accepted per request")


def run(args) -> int:
    try:
        node = StorageNode(args.db, args.host, args.port, args.token, args.max_payload_mb)
    except duckdb.Error as err:
        print(f"Error: cannot open {args.db}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except (OSError, fl.FlightError, pa.ArrowException) as err:
        print(f"Error: cannot listen on {args.host}:{args.port}: {err}", file=sys.stderr)
        return 1
    print(f"matchrec storage node serving {args.db} on grpc://{args.host}:{node.port}", flush=True)

    def stop(*_):
        threading.Thread(target=node.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    node.serve()
    node.con.close()
    return 0
