"""What a shard answers: the requests of the dual-filtering pull strategies over one DuckDB
database, whoever carries them (a Flight storage node, or a Spark task over its partition).

Requests (a dict plus binary payloads):

* ``tables``: the name and Arrow schema of every table;
* ``stats``: row count, per-condition counts, key range and bytes per row of a sample;
* ``probe``: N bytes of filler, to measure the link's bandwidth;
* ``candidates``: (partition hash, key, value hashes) of rows meeting a condition, checked
  first against a time filter and then against join filters (two-phase verification);
* ``pull``: rows (some columns) meeting a condition whose key passes a time filter.

Every request is stateless, so a caller may retry one. SQL fragments in a request must each
parse as one expression that reads no relation.
"""
from __future__ import annotations

import re

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from matchrec.operators.intervals import (FilterPayloadError, IntervalSet, ShrinkingWindowFilter, WindowJoinFilter,
                                          distinct, mix)

DEFAULT_MAX_PAYLOAD_MB = 256

def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class RequestError(ValueError):
    """A request the node refuses; the message goes back to the caller."""


def check_fragment(sql: str) -> str:
    """``sql`` if it is a single scalar expression that reads no other relation."""
    if not isinstance(sql, str) or len(sql) > 100_000:
        raise RequestError("SQL fragment must be a string of at most 100000 characters")
    try:
        trees = sqlglot.parse(f"SELECT {sql}", read="duckdb")
    except sqlglot.errors.SqlglotError as err:
        raise RequestError(f"SQL fragment does not parse: {str(err)[:200]}") from None
    if len(trees) != 1 or not isinstance(trees[0], exp.Select) or trees[0].args.get("from_") is not None:
        raise RequestError("SQL fragment must be one expression")
    tree = trees[0]
    if len(tree.expressions) != 1 or any(isinstance(n, (exp.Select, exp.Subquery, exp.Table, exp.Command))
                                         for n in tree.expressions[0].walk()):
        raise RequestError("SQL fragment must be one expression without subqueries")
    return sql


def value_hash(sql: str, typ: str) -> str:
    """SQL of a 31-bit hash of a value: what join filters store and probe (the same on every node)."""
    return f"CAST(hash(CAST(({sql}) AS {typ})) >> 33 AS INTEGER)"


def check_type(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_ ,()\[\]]{0,200}", name):
        raise RequestError("bad type name")
    return name


class ShardService:
    """Answers requests against the tables of one DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, max_payload: int):
        self.con = con
        self.max_payload = max_payload

    def _cursor(self):
        return self.con.cursor()

    def _table(self, name) -> str:
        if not isinstance(name, str):
            raise RequestError("table name must be a string")
        rows = self.con.cursor().execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main'", [name]).fetchone()
        if not rows[0]:
            raise RequestError(f"no table {name} on this node")
        return quote(name)

    def answer(self, req: dict, blobs: list[bytes]) -> pa.Table:
        op = req["op"]
        if op == "tables":
            return self._tables()
        if op == "probe":
            n = int(req.get("bytes", 0))
            if not 0 <= n <= self.max_payload:
                raise RequestError("probe size out of range")
            return pa.table({"blob": pa.array([b"\0" * n], pa.large_binary())})
        if op == "stats":
            return self._stats(req)
        if op == "candidates":
            return self._candidates(req, blobs)
        if op == "pull":
            return self._pull(req, blobs)
        raise RequestError(f"unknown op {op}")

    def _tables(self) -> pa.Table:
        cur = self._cursor()
        names = [r[0] for r in cur.sql(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY table_name").fetchall()]
        schemas = []
        for n in names:
            schema = cur.sql(f"SELECT * FROM {quote(n)} LIMIT 0").to_arrow_table().schema
            schemas.append(schema.serialize().to_pybytes())
        return pa.table({"name": pa.array(names, pa.string()), "schema": pa.array(schemas, pa.large_binary())})

    def _stats(self, req: dict) -> pa.Table:
        table = self._table(req.get("table"))
        conds = [check_fragment(c) for c in req.get("conditions", [])]
        pk, key = self._select_keys(req)
        cols = [quote(c) for c in req.get("columns", [])] or ["*"]
        cur = self._cursor()
        counts = ", ".join([f"count(*) FILTER (WHERE {c}) AS c{i}" for i, c in enumerate(conds)] + ["count(*) AS n"])
        row = cur.sql(f"SELECT {counts}, approx_count_distinct({pk}) AS parts, min({key}) AS kmin, "
                          f"max({key}) AS kmax FROM {table}").fetchall()[0]
        sample = cur.sql(f"SELECT {', '.join(cols)} FROM {table} USING SAMPLE 5000 ROWS").to_arrow_table()
        per_row = sample.nbytes / sample.num_rows if sample.num_rows else 0.0
        out = {f"c{i}": [row[i]] for i in range(len(conds))}
        out.update({"n": [row[len(conds)]], "parts": [row[len(conds) + 1]], "kmin": [row[-2]], "kmax": [row[-1]],
                    "row_bytes": [float(per_row)]})
        return pa.table(out)

    def _time_filter(self, spec, blobs):
        """A callable (pk, t) -> keep mask from a request's filter spec, or None."""
        if not spec:
            return None
        kind, idx = spec.get("kind"), spec.get("blob")
        if not isinstance(idx, int) or not 0 <= idx < len(blobs):
            raise RequestError("filter names a missing payload")
        if kind == "swf":
            f = ShrinkingWindowFilter.from_bytes(blobs[idx], self.max_payload)
            return f.contains
        if kind == "exact":
            arr = np.frombuffer(blobs[idx], np.int64) if len(blobs[idx]) % 24 == 0 else None
            if arr is None:
                raise FilterPayloadError("exact interval payload has the wrong length")
            pk, lo, hi = arr.reshape(3, -1)
            return IntervalSet(pk.copy(), lo.copy(), hi.copy()).contains
        raise RequestError(f"unknown filter kind {kind}")

    def _select_keys(self, req) -> tuple[str, str]:
        key = check_fragment(req["key_sql"])
        parts = [check_fragment(p) for p in req.get("partition_sql", [])]
        pk = f"CAST(hash({', '.join(parts)}) >> 1 AS BIGINT)" if parts else "CAST(0 AS BIGINT)"
        return pk, key

    def _candidates(self, req: dict, blobs) -> pa.Table:
        table = self._table(req.get("table"))
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
            cond = f"({cond}) AND ({sql}) IS NOT NULL"  # NULL never equals: such rows cannot match
        select = [f"{pk} AS pk", f"{key} AS t"] + [f"{v} AS v{i}" for i, v in enumerate(values)]
        select += [f"{j['_col']} AS j{i}" for i, j in enumerate(joins)]
        rows = self._cursor().sql(
            f"SELECT {', '.join(select)} FROM {table} WHERE ({cond}) AND {key} IS NOT NULL").to_arrow_table()
        keep = np.ones(rows.num_rows, bool)
        pks = rows.column("pk").to_numpy()
        ts = rows.column("t").to_numpy()
        tf = self._time_filter(req.get("filter"), blobs)
        if tf is not None:  # phase one: the key lies in the current time interval set
            keep &= tf(pks, ts)
        for i, j in enumerate(joins):  # phase two: an equal value in this window or the one before
            idx = np.flatnonzero(keep)
            if not len(idx):
                break
            vals = rows.column(f"j{i}").to_numpy()[idx]
            keep[idx] &= self._join_filter(j, blobs)(pks[idx], vals, ts[idx])
        rows = rows.filter(pa.array(keep))
        names = (["pk"] if req.get("partition_sql") else []) + [f"v{i}" for i in range(len(values))]
        quantum = req.get("quantum")
        if isinstance(quantum, int) and quantum >= 1:
            # one row per slot of the key (each slot quantum long) and distinct values
            slot = pa.array(np.floor_divide(rows.column("t").to_numpy(), quantum))
            out = rows.select(names).append_column("s", slot)
            return out.group_by(out.column_names, use_threads=False).aggregate([])
        return rows.select(names + ["t"])

    def _join_filter(self, spec, blobs):
        idx = spec.get("blob")
        if not isinstance(idx, int) or not 0 <= idx < len(blobs):
            raise RequestError("join filter names a missing payload")
        if spec.get("kind") == "wjf":
            return WindowJoinFilter.from_bytes(blobs[idx], self.max_payload).may_follow
        if spec.get("kind") == "exact":
            data = blobs[idx]
            window = spec.get("window")
            if len(data) % 24 or not isinstance(window, int) or window <= 0:
                raise FilterPayloadError("exact join payload is malformed")
            pk, val, t = np.frombuffer(data, np.int64).reshape(3, -1)
            return _ExactJoin(pk, val, t, window).may_follow
        raise RequestError("unknown join filter kind")

    def _pull(self, req: dict, blobs) -> pa.Table:
        table = self._table(req.get("table"))
        columns = req.get("columns")
        where = check_fragment(req["where"]) if req.get("where") else "TRUE"
        tf = self._time_filter(req.get("filter"), blobs)
        cur = self._cursor()
        cols = ", ".join(quote(c) for c in columns) if columns else "*"
        if tf is None:
            return _compact(cur.sql(f"SELECT {cols} FROM {table} WHERE {where}").to_arrow_table())
        pk, key = self._select_keys(req)
        bounds = req.get("range")
        if bounds:  # the TIS's hull as a range DuckDB's scan can use (zone maps)
            lo, hi = int(bounds[0]), int(bounds[1])
            where = f"({where}) AND ({key} IS NULL OR {key} BETWEEN {lo} AND {hi})"
        rows = cur.sql(f"SELECT {cols}, {pk} AS __mr_pk, {key} AS __mr_t FROM {table} WHERE {where}"
                           ).to_arrow_table()
        t = rows.column("__mr_t")
        keep = np.ones(rows.num_rows, bool)  # rows without a key are kept: the engine decides on them
        valid = np.asarray(t.is_valid())
        if valid.any():
            keep[valid] = tf(rows.column("__mr_pk").to_numpy()[valid],
                             t.filter(pa.array(valid)).to_numpy())
        return _compact(rows.filter(pa.array(keep)).drop_columns(["__mr_pk", "__mr_t"]))


def _compact(table: pa.Table) -> pa.Table:
    """Strings with few distinct values travel dictionary-encoded (the compute node decodes)."""
    cols = []
    for col in table.columns:
        if (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) and table.num_rows > 64:
            encoded = pc.dictionary_encode(col)
            if len(encoded.chunk(0).dictionary) * 4 < table.num_rows if encoded.num_chunks else False:
                col = encoded
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


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
