"""``matchrec load``: spread a table over storage nodes.

Rows are read with DuckDB from a Parquet/CSV file or a table of a DuckDB database and sent to
the nodes with Flight ``do_put``, the table replaced on every node. ``--partition`` decides
which node gets a row: ``random`` (a hash of the row number), ``time`` (contiguous ranges of
the time column, equal in row count) or ``type`` (a hash of the type column, so all events of
one type live on one node).
"""
from __future__ import annotations

import argparse
import json
import sys

import duckdb
import pyarrow as pa
import pyarrow.flight as fl

from matchrec.connectors.credentials import (add_client_arguments, call_headers, connect_node, resolve_token,
                                             root_certificates)
from matchrec.connectors.duckdb_source import read_batches
from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident


def load(nodes: list[str], table: str, source_sql: str, con: duckdb.DuckDBPyConnection, partition: str,
         time_column: str | None = None, type_column: str | None = None, token: str | None = None,
         progress=None, tls_root_certs: str | bytes | None = None) -> list[int]:
    """Send the rows of ``source_sql`` to ``nodes`` as table ``table``; returns rows per node."""
    n = len(nodes)
    if partition == "random":
        assign = f"CAST(hash(row_number() OVER ()) % {n} AS INTEGER)"
    elif partition == "time":
        if not time_column:
            raise ValueError("--partition time needs --time-column")
        assign = f"CAST(ntile({n}) OVER (ORDER BY {quote_ident(time_column)}) - 1 AS INTEGER)"
    elif partition == "type":
        if not type_column:
            raise ValueError("--partition type needs --type-column")
        assign = f"CAST(hash({quote_ident(type_column)}) % {n} AS INTEGER)"
    else:
        raise ValueError(f"unknown partitioning {partition}: random, time or type")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {H.SPREAD} AS SELECT *, {assign} AS {H.NODE} FROM ({source_sql})")
    options = fl.FlightCallOptions(headers=call_headers(resolve_token(token)))
    roots = root_certificates(tls_root_certs)
    counts = []
    for i, uri in enumerate(nodes):
        reader = read_batches(con, f"SELECT * EXCLUDE ({H.NODE}) FROM {H.SPREAD} WHERE {H.NODE} = {i}", 1 << 17)
        client = connect_node(uri, roots)
        descriptor = fl.FlightDescriptor.for_command(json.dumps({"op": "load", "table": table, "replace": True}))
        writer, _ = client.do_put(descriptor, reader.schema, options=options)
        rows = 0
        for batch in reader:
            writer.write_batch(batch)
            rows += batch.num_rows
            if progress:
                progress(i, rows)
        if rows == 0:  # the node still gets the table, empty, so every node knows its columns
            writer.write_table(reader.schema.empty_table())
        writer.close()
        client.close()
        counts.append(rows)
    con.execute("DROP TABLE " + H.SPREAD)
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", required=True, help="grpc://host:port,... of the storage nodes")
    parser.add_argument("--table", required=True, help="table name on the nodes")
    parser.add_argument("--from", dest="source", required=True,
                        help="a Parquet or CSV file, or a DuckDB database (then --source-table names the table)")
    parser.add_argument("--source-table", default=None, help="table in a DuckDB --from file (default: --table)")
    parser.add_argument("--partition", choices=("random", "time", "type"), default="random")
    parser.add_argument("--time-column", default="ts")
    parser.add_argument("--type-column", default="type")
    add_client_arguments(parser)


def run(args) -> int:
    nodes = [u.strip() for u in args.nodes.split(",") if u.strip()]
    con = duckdb.connect()
    try:
        if args.source.endswith((".duckdb", ".db")):
            con.execute(f"ATTACH {_literal(args.source)} AS src (READ_ONLY)")
            source_sql = f"SELECT * FROM src.{quote_ident(args.source_table or args.table)}"
        else:
            source_sql = f"SELECT * FROM {_literal(args.source)}"
        total = con.execute(f"SELECT count(*) FROM ({source_sql})").fetchone()[0]
    except duckdb.Error as err:
        print(f"Error: cannot read {args.source}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    done = [0] * len(nodes)

    def progress(i, rows):
        done[i] = rows
        frac = sum(done) / total if total else 1.0
        bar = "#" * int(frac * 30)
        print(f"\r[{bar:<30}] {sum(done):,}/{total:,} rows", end="", file=sys.stderr, flush=True)

    try:
        counts = load(nodes, args.table, source_sql, con, args.partition, args.time_column, args.type_column,
                      resolve_token(args.token, args.token_file), progress if sys.stderr.isatty() else None,
                      args.tls_root_certs)
    except (fl.FlightError, pa.ArrowException, OSError) as err:
        print(f"\nError: loading failed: {str(err).splitlines()[0]}. Check that every node runs and the token.",
              file=sys.stderr)
        return 1
    except (ValueError, duckdb.Error) as err:
        print(f"\nError: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    if sys.stderr.isatty():
        print(file=sys.stderr)
    for uri, c in zip(nodes, counts):
        print(f"{uri}: {c:,} rows")
    return 0


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
