"""The ACER range-bitmap index of a shard table: building it, and the two-phase filtering it
gives ``candidates`` and ``pull``.

Building (``build_index`` request, ``matchrec index``) rewrites the table so that its events
lie in blocks of ``block_size`` consecutive events in time order and, inside a block, in
clusters of one event type each, time-ordered; row ids are then positions and every cluster is
one range of them. Kept in the shard, in schema ``mr_acer`` (not visible as a node table):

* ``meta``: per indexed table its type and time columns, attributes, block size, row count;
* ``syn_<table>``: the synopsis, one row per cluster: block, type, row id range, time range
  and min/max of every attribute;
* ``bm_<table>``: per block and attribute, a range-encoded bitmap over value bins: bins cut
  at equal depth (one per distinct value when there are few), bitmap ``k`` holding the rows
  whose value lies in bins ``0..k``, and each bin's smallest and largest value.

Answering: (1) clusters are skipped when their time range misses the request's time cover, or
their type or min/max cannot satisfy the condition's simple parts (``col op const``, BETWEEN,
``type = 'X'``, ``type IN (...)``); (2) in the blocks left, those simple parts are evaluated on
the bitmaps, and DuckDB evaluates the condition on the rows that survive only (not at all when
the bitmaps decided it exactly). Both phases over-approximate - a NULL or an unknown part keeps
a row - so the rows returned are exactly those of the unindexed path.

A load into the table drops its index; an index whose row count no longer matches is ignored.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from fractions import Fraction

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident

SCHEMA = "mr_acer"
DEFAULT_BLOCK = 65536
BINS = 64
MAX_RANGES = 8  # rowid ranges per DuckDB scan: many OR-ed ranges scan slower than one long one


class IndexError_(ValueError):
    """An index that cannot be built as asked; the message says why."""


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


# -- building

def build(con: duckdb.DuckDBPyConnection, table: str, attributes: list[str], type_column: str, time_column: str,
          block_size: int = DEFAULT_BLOCK) -> dict:
    """Cluster ``table`` and write its synopsis and bitmaps; returns a summary."""
    cur = con.cursor()
    schema = cur.sql(f"SELECT * FROM {quote_ident(table)} LIMIT 0").to_arrow_table().schema
    names = {n.lower(): n for n in schema.names}
    if not isinstance(block_size, int) or not 1024 <= block_size <= 1 << 22:
        raise IndexError_("block size must be between 1024 and 4194304 events")
    for c in [type_column, time_column, *attributes]:
        if not isinstance(c, str) or c.lower() not in names:
            raise IndexError_(f"table {table} has no column {c!r}; its columns: {', '.join(schema.names)}")
    type_column, time_column = names[type_column.lower()], names[time_column.lower()]
    attributes = list(dict.fromkeys(names[a.lower()] for a in attributes))
    for a in attributes:
        if not _numeric(schema.field(a).type):
            raise IndexError_(f"attribute {a} has type {schema.field(a).type}: range bitmaps index numbers only")
    tt = schema.field(time_column).type
    if not (pa.types.is_integer(tt) or pa.types.is_timestamp(tt) or pa.types.is_date(tt)):
        raise IndexError_(f"time column {time_column} has type {tt}: an integer, date or timestamp is needed")
    ty, tm = quote_ident(type_column), quote_ident(time_column)
    cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    cur.execute(f"CREATE OR REPLACE TABLE {quote_ident(table)} AS SELECT * EXCLUDE ({H.BLOCK}) FROM ("
                f"SELECT *, (row_number() OVER (ORDER BY {tm} NULLS LAST) - 1) // {block_size} AS {H.BLOCK} "
                f"FROM {quote_ident(table)}) ORDER BY {H.BLOCK}, {ty} NULLS LAST, {tm} NULLS LAST")
    aggs = "".join(f", min({quote_ident(a)}) AS {quote_ident('min_' + a)}, max({quote_ident(a)}) AS {quote_ident('max_' + a)}" for a in attributes)
    syn = f"{SCHEMA}.{quote_ident('syn_' + table)}"
    cur.execute(f"""CREATE OR REPLACE TABLE {syn} AS
        WITH x AS (SELECT rowid AS r, rowid // {block_size} AS b, {ty} AS ty, {tm} AS tm
                   {''.join(', ' + quote_ident(a) for a in attributes)} FROM {quote_ident(table)}),
        y AS (SELECT *, CASE WHEN b IS DISTINCT FROM lag(b) OVER w OR ty IS DISTINCT FROM lag(ty) OVER w
                             THEN 1 ELSE 0 END AS c FROM x WINDOW w AS (ORDER BY r)),
        z AS (SELECT *, sum(c) OVER (ORDER BY r) AS cl FROM y)
        SELECT cl, any_value(b) AS b, any_value(ty) AS ty, min(r) AS r_lo, max(r) AS r_hi, count(*) AS n,
               count(*) - count(tm) AS n_null_t, min(tm) AS tmin, max(tm) AS tmax {aggs}
        FROM z GROUP BY cl ORDER BY cl""")
    bad = cur.execute(f"SELECT count(*) FROM {syn} WHERE r_hi - r_lo + 1 <> n").fetchall()[0][0]
    if bad:  # row ids must be positions of the clustered order, or the ranges would mean other rows
        raise IndexError_("the rewritten table's row ids do not follow its order; the index was not built")
    n_rows = cur.execute(f"SELECT count(*) FROM {quote_ident(table)}").fetchall()[0][0]
    bm = f"{SCHEMA}.{quote_ident('bm_' + table)}"
    cur.execute(f"CREATE OR REPLACE TABLE {bm} (b BIGINT, attr VARCHAR, dtype VARCHAR, lo BLOB, hi BLOB, "
                "single BOOLEAN, bits BLOB, nonnull BLOB, nan BLOB)")
    n_blocks = (n_rows + block_size - 1) // block_size
    for a in attributes:
        col = cur.sql(f"SELECT {quote_ident(a)} FROM {quote_ident(table)} ORDER BY rowid").to_arrow_table().column(0)
        col = col.combine_chunks() if col.num_chunks else pa.array([], col.type)
        dtype = "f8" if pa.types.is_floating(col.type) else "i8"
        rows = []
        for b in range(n_blocks):
            part = col.slice(b * block_size, block_size)
            rows.append((b, a, dtype, *_bitmaps(part, dtype)))
        if rows:
            cur.executemany(f"INSERT INTO {bm} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    cur.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.meta (tbl VARCHAR PRIMARY KEY, info VARCHAR)")
    info = {"type": type_column, "time": time_column, "attributes": attributes, "block": block_size, "rows": n_rows}
    cur.execute(f"INSERT OR REPLACE INTO {SCHEMA}.meta VALUES (?, ?)", [table, json.dumps(info)])
    cur.execute("CHECKPOINT")
    clusters = cur.execute(f"SELECT count(*) FROM {syn}").fetchall()[0][0]
    return {"rows": n_rows, "blocks": n_blocks, "clusters": clusters}


def _bitmaps(part: pa.Array, dtype: str) -> tuple:
    """(bin minima, bin maxima, one value per bin?, range bitmaps, non-null rows, NaN rows) of a block."""
    n = len(part)
    valid = np.asarray(part.is_valid()) if part.null_count else np.ones(n, bool)
    vals = part.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64 if dtype == "f8" else np.int64)
    nan = np.isnan(vals) & valid if dtype == "f8" else np.zeros(n, bool)
    good = valid & ~nan
    u = np.unique(vals[good])
    single = len(u) <= BINS
    if single:
        starts = u
    else:  # equal depth over the values, so each bitmap splits the rows evenly
        sv = np.sort(vals[good])
        starts = np.unique(sv[np.linspace(0, len(sv) - 1, BINS).astype(np.int64)])
    code = np.searchsorted(starts, vals, "right") - 1
    k = len(starts)
    lo, hi = np.zeros(k, vals.dtype), np.zeros(k, vals.dtype)
    if k:
        gcode, gvals = code[good], vals[good]
        order = np.argsort(gcode, kind="stable")
        sc, sv2 = gcode[order], gvals[order]
        first = np.r_[0, np.flatnonzero(np.diff(sc)) + 1]
        lo[sc[first]] = np.minimum.reduceat(sv2, first)
        hi[sc[first]] = np.maximum.reduceat(sv2, first)
    bits = np.stack([good & (code <= j) for j in range(k - 1)]) if k > 1 else np.zeros((0, n), bool)
    return (lo.tobytes(), hi.tobytes(), single, np.packbits(bits, axis=1).tobytes(), np.packbits(good).tobytes(),
            np.packbits(nan).tobytes())


def drop(con: duckdb.DuckDBPyConnection, table: str) -> None:
    cur = con.cursor()
    if not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = 'meta'",
                       [SCHEMA]).fetchall()[0][0]:
        return
    cur.execute(f"DELETE FROM {SCHEMA}.meta WHERE tbl = ?", [table])
    cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{quote_ident('syn_' + table)}")
    cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{quote_ident('bm_' + table)}")


def indexed_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    cur = con.cursor()
    if not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = 'meta'",
                       [SCHEMA]).fetchall()[0][0]:
        return set()
    return {r[0] for r in cur.sql(f"SELECT tbl FROM {SCHEMA}.meta").fetchall()}


# -- conditions: the simple parts an index can decide

@dataclass(frozen=True)
class Cmp:
    column: str
    lo: Fraction | None
    lo_open: bool
    hi: Fraction | None
    hi_open: bool


@dataclass(frozen=True)
class TypeIs:
    values: frozenset


TRUE = ("true",)


def _literal(node):
    """A number (exact) or a string literal, else None."""
    neg = False
    while isinstance(node, (exp.Paren, exp.Neg)):
        if isinstance(node, exp.Neg):
            neg = not neg
        node = node.this
    if isinstance(node, exp.Literal):
        if node.is_string:
            return None if neg else node.this
        try:
            value = Fraction(node.this)
        except (ValueError, ZeroDivisionError):
            return None
        return -value if neg else value
    return None


def _column(node) -> str | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column) and not node.table:
        return node.name.lower()
    return None


_FLIP = {exp.LT: exp.GT, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.GTE: exp.LTE, exp.EQ: exp.EQ}


def necessary(node, attributes: set[str], type_column: str, type_is_string: bool):
    """A tree of And/Or over Cmp/TypeIs that holds wherever ``node`` is true (TRUE: no idea)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return ("and", [necessary(c, attributes, type_column, type_is_string) for c in (node.left, node.right)])
    if isinstance(node, exp.Or):
        return ("or", [necessary(c, attributes, type_column, type_is_string) for c in (node.left, node.right)])
    if type(node) in _FLIP:
        op, col, lit = type(node), _column(node.left), _literal(node.right)
        if col is None:
            op, col, lit = _FLIP[op], _column(node.right), _literal(node.left)
        if col is None or lit is None:
            return TRUE
        if col == type_column and op is exp.EQ and isinstance(lit, str) == type_is_string:
            return TypeIs(frozenset([lit]))
        if col in attributes and isinstance(lit, Fraction):
            return {exp.EQ: Cmp(col, lit, False, lit, False), exp.LT: Cmp(col, None, False, lit, True),
                    exp.LTE: Cmp(col, None, False, lit, False), exp.GT: Cmp(col, lit, True, None, False),
                    exp.GTE: Cmp(col, lit, False, None, False)}[op]
        return TRUE
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        col, lo, hi = _column(node.this), _literal(node.args.get("low")), _literal(node.args.get("high"))
        if col in attributes and isinstance(lo, Fraction) and isinstance(hi, Fraction):
            return Cmp(col, lo, False, hi, False)
        return TRUE
    if isinstance(node, exp.In) and not node.args.get("query") and not node.args.get("unnest"):
        col = _column(node.this)
        lits = [_literal(e) for e in node.expressions]
        if col == type_column and lits and all(v is not None and isinstance(v, str) == type_is_string for v in lits):
            return TypeIs(frozenset(lits))
        return TRUE
    return TRUE


def _exact_tree(tree) -> bool:
    """Whether the bitmaps can decide ``tree`` without DuckDB (given single-valued bins)."""
    if tree == TRUE:
        return False
    if isinstance(tree, tuple):
        return all(_exact_tree(t) for t in tree[1])
    return True


def _inside(v, c: Cmp) -> bool:
    """Whether value ``v`` satisfies ``c``."""
    if c.lo is not None and (v < c.lo or (c.lo_open and v == c.lo)):
        return False
    if c.hi is not None and (v > c.hi or (c.hi_open and v == c.hi)):
        return False
    return True


def _may(lo, hi, c: Cmp) -> bool:
    """Whether some value in [lo, hi] may satisfy ``c`` (a float range is widened by NaN elsewhere)."""
    if c.lo is not None and (hi < c.lo or (c.lo_open and hi == c.lo)):
        return False
    if c.hi is not None and (lo > c.hi or (c.hi_open and lo == c.hi)):
        return False
    return True


def _num(x):
    """A value of a synopsis or bin as an exact number (floats are exact binary fractions)."""
    return Fraction(x) if isinstance(x, float) else x


# -- the index of one table, in memory

class TableIndex:
    def __init__(self, con, table: str, info: dict):
        cur = con.cursor()
        self.table = table
        self.type_column = info["type"]
        self.time_column = info["time"]
        self.attributes = info["attributes"]
        self.block = info["block"]
        self.rows = info["rows"]
        syn = cur.sql(f"SELECT * FROM {SCHEMA}.{quote_ident('syn_' + table)} ORDER BY cl").to_arrow_table()
        self.syn = syn
        ty = syn.schema.field("ty").type
        self.type_is_string = pa.types.is_string(ty) or pa.types.is_large_string(ty)
        # a type column of another kind (dates, ...) compares with casts the index does not model
        self.type_known = self.type_is_string or _numeric(ty)
        self.b = syn.column("b").to_numpy()
        self.r_lo = syn.column("r_lo").to_numpy()
        self.r_hi = syn.column("r_hi").to_numpy()
        self.null_t = syn.column("n_null_t").to_numpy() > 0
        self.types = syn.column("ty").to_pylist()
        self.minmax = {a.lower(): (syn.column("min_" + a).to_pylist(), syn.column("max_" + a).to_pylist())
                       for a in self.attributes}
        self.by_lower = {a.lower(): a for a in self.attributes}
        self.bitmaps: dict[tuple[int, str], tuple] = {}
        for row in cur.sql(f"SELECT * FROM {SCHEMA}.{quote_ident('bm_' + table)}").fetchall():
            b, a, dtype, lo, hi, single, bits, nonnull, nan = row
            self.bitmaps[(b, a.lower())] = (np.frombuffer(lo, dtype), np.frombuffer(hi, dtype), single,
                                            bits, nonnull, nan)
        self.keys: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.lock = threading.Lock()

    def _key_range(self, con, key_sql: str):
        """Each cluster's range of ``key_sql``, or None when the key is not a monotone form of the
        time column (then no cluster is skipped by time)."""
        col = re.escape(quote_ident(self.time_column))
        forms = [rf"CAST\({col} AS BIGINT\)", rf"epoch_us\({col}\)", rf"epoch_us\(CAST\({col} AS TIMESTAMP\)\)"]
        if not any(re.fullmatch(f, key_sql.strip()) for f in forms):
            return None
        with self.lock:
            if key_sql not in self.keys:
                cur = con.cursor()
                cur.register(H.SYNOPSIS, self.syn.select(["tmin", "tmax"]))
                try:
                    tm = quote_ident(self.time_column)
                    lo = cur.sql(f"SELECT {key_sql} FROM (SELECT tmin AS {tm} FROM {H.SYNOPSIS})"
                                 ).to_arrow_table().column(0)
                    hi = cur.sql(f"SELECT {key_sql} FROM (SELECT tmax AS {tm} FROM {H.SYNOPSIS})"
                                 ).to_arrow_table().column(0)
                finally:
                    cur.unregister(H.SYNOPSIS)
                self.keys[key_sql] = (pc.fill_null(lo, 0).to_numpy(), pc.fill_null(hi, -1).to_numpy())
            return self.keys[key_sql]

    def _cluster_may(self, tree, i: int) -> bool:
        if tree == TRUE:
            return True
        if isinstance(tree, tuple):
            parts = (self._cluster_may(t, i) for t in tree[1])
            return all(parts) if tree[0] == "and" else any(parts)
        if isinstance(tree, TypeIs):
            return self.types[i] is not None and self.types[i] in tree.values
        lo, hi = self.minmax[tree.column][0][i], self.minmax[tree.column][1][i]
        if lo is None:
            return False  # every value NULL: the comparison is never true
        if isinstance(lo, float) and (lo != lo or hi != hi):
            return True
        return _may(_num(lo), _num(hi), tree)

    def _rows_may(self, tree, b: int, clusters: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
        """(rows of block ``b`` where ``tree`` may hold, whether that is exact)."""
        if tree == TRUE:
            return np.ones(n, bool), False
        if isinstance(tree, tuple):
            masks = [self._rows_may(t, b, clusters, n) for t in tree[1]]
            out = masks[0][0].copy()
            for m, _ in masks[1:]:
                out = (out & m) if tree[0] == "and" else (out | m)
            return out, all(e for _, e in masks)
        if isinstance(tree, TypeIs):
            out = np.zeros(n, bool)
            base = b * self.block
            for i in clusters:
                if self.types[i] is not None and self.types[i] in tree.values:
                    out[self.r_lo[i] - base:self.r_hi[i] - base + 1] = True
            return out, True
        lo, hi, single, bits, nonnull, nan = self.bitmaps[(b, tree.column)]
        k = len(lo)
        ok = [j for j in range(k) if (_may(_num(lo[j].item()), _num(hi[j].item()), tree))]
        nan_rows = np.unpackbits(np.frombuffer(nan, np.uint8), count=n).astype(bool)
        if not ok:
            return nan_rows, False
        k1, k2 = ok[0], ok[-1]  # bins are value-ordered: the ones that may hold are contiguous
        upper = (np.unpackbits(np.frombuffer(bits, np.uint8).reshape(k - 1, -1)[k2], count=n).astype(bool)
                 if k2 < k - 1 else np.unpackbits(np.frombuffer(nonnull, np.uint8), count=n).astype(bool))
        if k1 > 0:
            upper &= ~np.unpackbits(np.frombuffer(bits, np.uint8).reshape(k - 1, -1)[k1 - 1], count=n).astype(bool)
        exact = bool(single) and lo.dtype.kind == "i" and all(_inside(_num(lo[j].item()), tree) for j in ok)
        return upper | nan_rows, exact

    def select(self, con, condition: str, key_sql: str, cover, keep_keyless: bool):
        """(row ids to read, whether the condition is decided by them exactly) or None when the
        index cannot narrow the rows."""
        tree = necessary(sqlglot.parse_one(f"SELECT {condition}", read="duckdb").expressions[0],
                         set(self.by_lower), self.type_column.lower() if self.type_known else "",
                         self.type_is_string)
        n_cl = len(self.types)
        alive = np.array([self._cluster_may(tree, i) for i in range(n_cl)], bool) if n_cl else np.zeros(0, bool)
        if cover is not None and n_cl:  # phase one, time: the cluster's key range meets the cover
            keys = self._key_range(con, key_sql)
            if keys is not None:
                klo, khi = keys
                c_lo, c_hi = cover
                j = np.searchsorted(c_lo, khi, "right") - 1
                meets = (j >= 0) & (c_hi[np.maximum(j, 0)] >= klo) & (klo <= khi)
                alive &= meets | (self.null_t if keep_keyless else False)
        if tree == TRUE and alive.all():
            return None
        ids, exact = [], tree != TRUE
        for b in np.unique(self.b[alive]):
            cl = np.flatnonzero(alive & (self.b == b))
            base = b * self.block
            n = min(self.block, self.rows - base)
            mask, ex = self._rows_may(tree, int(b), cl, n)
            exact &= ex
            inside = np.zeros(n, bool)
            for i in cl:
                inside[self.r_lo[i] - base:self.r_hi[i] - base + 1] = True
            ids.append(np.flatnonzero(mask & inside) + base)
        ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
        return ids, exact


def ranges_sql(ids: np.ndarray) -> str:
    """A rowid condition covering sorted ``ids`` with at most MAX_RANGES ranges (the smallest
    gaps merged), which DuckDB's scan prunes with."""
    if not len(ids):
        return "FALSE"
    gaps = np.flatnonzero(np.diff(ids) > 1)
    if len(gaps) >= MAX_RANGES:
        sizes = np.diff(ids)[gaps]
        gaps = np.sort(gaps[np.argsort(sizes)[-(MAX_RANGES - 1):]])
    starts = np.r_[ids[0], ids[gaps + 1]]
    ends = np.r_[ids[gaps], ids[-1]]
    return "(" + " OR ".join(f"rowid BETWEEN {int(a)} AND {int(b)}" for a, b in zip(starts, ends)) + ")"


class IndexCache:
    """The indexes of a shard, loaded once per table version."""

    def __init__(self):
        self._cache: dict[str, tuple[tuple, TableIndex]] = {}
        self._lock = threading.Lock()

    def get(self, con, table: str, version: tuple) -> TableIndex | None:
        """The index of ``table`` as it is at ``version`` (catalog oid and size), or None."""
        with self._lock:
            hit = self._cache.get(table)
            if hit is not None and hit[0] == version:
                return hit[1]
        idx = None
        if table in indexed_tables(con):
            info = json.loads(con.cursor().execute(f"SELECT info FROM {SCHEMA}.meta WHERE tbl = ?",
                                                   [table]).fetchall()[0][0])
            n = con.cursor().execute(f"SELECT count(*) FROM {quote_ident(table)}").fetchall()[0][0]
            if n == info["rows"]:  # else the table changed since the index was built
                idx = TableIndex(con, table, info)
        with self._lock:
            self._cache[table] = (version, idx)
        return idx

    def forget(self, table: str) -> None:
        with self._lock:
            self._cache.pop(table, None)
