"""``matchrec index``: build the ACER range-bitmap index of a table on storage nodes.

Every node rewrites its part of the table ordered by event type and time (one run of rows per
type) and keeps bit-sliced range bitmaps of the attributes (``connectors.acer``). Loading the
table again drops the index; run this again after a load.
"""
from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.flight as fl

from matchrec.connectors.acer import DEFAULT_BLOCK
from matchrec.connectors.credentials import (add_client_arguments, call_headers, connect_node, resolve_token,
                                             root_certificates)


def build_index(nodes: list[str], table: str, attributes: list[str], type_column: str = "type",
                time_column: str = "ts", block_size: int = DEFAULT_BLOCK, token: str | None = None,
                tls_root_certs: str | bytes | None = None) -> list[dict]:
    """Build the index on every node in turn; returns each node's summary (rows, blocks, clusters)."""
    options = fl.FlightCallOptions(headers=call_headers(resolve_token(token)))
    roots = root_certificates(tls_root_certs)
    request = {"op": "build_index", "table": table, "attributes": attributes, "type_column": type_column,
               "time_column": time_column, "block_size": block_size}
    out = []
    for uri in nodes:
        client = connect_node(uri, roots)
        try:
            writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(json.dumps(request)), options=options)
            empty = pa.table({"blob": pa.array([], pa.large_binary())})
            writer.begin(empty.schema)
            writer.done_writing()
            out.append(reader.read_all().to_pylist()[0])
            writer.close()
        finally:
            client.close()
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--nodes", required=True, help="grpc://host:port,... of the storage nodes")
    parser.add_argument("--table", required=True, help="table on the nodes")
    parser.add_argument("--attributes", required=True,
                        help="columns to keep range bitmaps of (integers, doubles, strings, dates, timestamps)")
    parser.add_argument("--type-column", default="type", help="the event type column the rows are grouped by")
    parser.add_argument("--time-column", default="ts", help="the time column (integer, date or timestamp)")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK,
                        help="rows per bitmap block (a multiple of 64)")
    add_client_arguments(parser)


def run(args) -> int:
    nodes = [u.strip() for u in args.nodes.split(",") if u.strip()]
    attributes = [a.strip() for a in args.attributes.split(",") if a.strip()]
    try:
        summaries = build_index(nodes, args.table, attributes, args.type_column, args.time_column,
                                args.block_size, resolve_token(args.token, args.token_file), args.tls_root_certs)
    except fl.FlightServerError as err:
        print(f"Error: a node refused to build the index: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except (fl.FlightError, pa.ArrowException, OSError) as err:
        print(f"Error: building the index failed: {str(err).splitlines()[0]}. Check that every node runs and the "
              "token.", file=sys.stderr)
        return 1
    for uri, s in zip(nodes, summaries):
        print(f"{uri}: {s['rows']:,} rows in {s['blocks']} blocks, {s['clusters']} clusters (type runs)")
    return 0
