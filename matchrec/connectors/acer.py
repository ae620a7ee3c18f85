"""The ACER index of a shard table (range bitmaps and two-phase filtering), and the planner that
decides, request by request, whether it beats DuckDB's own scan.

Building (``build_index`` request, ``matchrec index``) rewrites the table ordered by event type,
then time: every type's rows are one run of row ids (its row-id bitmap is a single run) and
inside a run the time is sorted. Each indexed attribute gets a quantized code per row - its rank
among the column's distinct values (NaN last, as DuckDB orders it), or one of ``MAX_CODES``
equal-depth bins when there are more distinct values - and ``ceil(log2(#codes))`` range-encoded
bit slices over that code: slice ``j`` holds the rows whose code has bit ``j`` at 0, so
``code <= c`` takes one pass over the slices (O'Neil and Quass). Slices are cut in blocks of
``block_size`` rows; on disk an all-zero or all-one block is a flag, other blocks are packed
bits; in the node's memory the slices are whole-table 64-bit words (at most 16 slices: 2 bytes
a row per attribute). Kept in the shard, in schema ``mr_acer`` (not visible as a node table):

* ``meta``: per indexed table its type and time columns, attributes, block size, row count;
* ``syn_<table>``: one row per type run (type, first and last row id);
* ``val_<table>``: per attribute its code book (each code's smallest and largest value and
  row count, as Arrow IPC) and whether codes are exact values;
* ``bm_<table>``: per attribute, slice and block the bits (slice -1: the non-NULL rows, with
  the block's smallest and largest code).

Answering a condition with a time cover (the replay intervals, merged over partitions: the
node's own union of the request's exact time set when it has one, else the cover sent, which the
caller caps at 1,024 ranges; merged down when runs times ranges exceed ``MAX_SEARCHES``): phase
one takes the type runs the condition's type tests allow and, inside each, the row ranges whose
time lies in the cover (a binary search on the run's sorted keys); phase two evaluates the
condition's attribute tests (``col op const``, BETWEEN, ``col = 'str'``, IN; dates and
timestamps against DATE/TIMESTAMP literals; a column may be cast to a type that keeps its values,
and ``coalesce(test, FALSE)`` is the test) on the bit slices of the blocks those ranges touch
(less the blocks whose code range cannot meet them) only. Both phases over-approximate (a part
the index does not know keeps every row), so:

* a ``candidates`` request whose condition the bitmaps decide exactly, and whose candidates the
  code books expect to be at most ``EXACT_SHARE`` of the table, is answered from the index alone
  (the key, its position key for phase one and the partition hash of every row are cached by
  the node, 8 bytes a row each);
* so is such a ``pull``: its rows are taken from the table's columns, kept by the node (at most
  ``COLUMN_CACHE`` bytes a table), since DuckDB scans the type-major table slower than the table
  in its load order and fetches scattered row ids slower still;
* otherwise DuckDB scans with the condition, restricted to at most ``MAX_RANGES`` row-id ranges
  that cover every row the index let through; phase two runs for it only when the code books
  expect few rows. When those ranges would cover more than ``SCAN_SHARE`` of the table, DuckDB
  scans the whole table as without the index.

The rows returned are those of the unindexed path. A load into the table drops its index; an
index whose row count no longer matches is ignored.
"""
from __future__ import annotations

import bisect
import json
import math
import threading
from dataclasses import dataclass
from fractions import Fraction

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from matchrec.parser.names import quote_ident

SCHEMA = "mr_acer"
DEFAULT_BLOCK = 65536
MAX_CODES = 1 << 16  # codes per attribute: at most 16 slices; more distinct values share equal-depth bins
MAX_RANGES = 8  # row-id ranges per DuckDB scan: DuckDB prunes with up to about 8 OR-ed ranges, more cost per row
SCAN_SHARE = 0.5  # ranges covering more of the table than this: the index saves too little over a scan
BITMAP_SHARE = 1 / 16  # phase two runs for a DuckDB scan only when it is expected to keep fewer rows than this
FEW_ROWS = 2 * MAX_RANGES  # or when it is expected to keep so few rows that a few short ranges hold them
MAX_SEARCHES = 1 << 16  # type runs x intervals phase one searches at most
MAX_RUNS = 256  # type runs phase one searches at most (one step each)
EXACT_SHARE = 0.25  # the index answers candidates alone when they are at most this share of the table
COLUMN_CACHE = 1 << 28  # bytes of a table's columns a node keeps to hand over the rows of pulls the index decides


class IndexError_(ValueError):
    """An index that cannot be built as asked; the message says why."""


def _kind(t: pa.DataType) -> str | None:
    """How an attribute of Arrow type ``t`` is coded: int, float, str, date, ts; None: not indexable."""
    if pa.types.is_integer(t) and not (pa.types.is_unsigned_integer(t) and t.bit_width == 64):
        return "int"
    if pa.types.is_float64(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t) and t.unit == "us" and t.tz is None:
        return "ts"
    return None


# -- building

def build(con: duckdb.DuckDBPyConnection, table: str, attributes: list[str], type_column: str, time_column: str,
          block_size: int = DEFAULT_BLOCK) -> dict:
    """Order ``table`` by type and time and write its type runs, code books and bit slices."""
    cur = con.cursor()
    schema = cur.sql(f"SELECT * FROM {quote_ident(table)} LIMIT 0").to_arrow_table().schema
    names = {n.lower(): n for n in schema.names}
    if not isinstance(block_size, int) or not 1024 <= block_size <= 1 << 22 or block_size % 64:
        raise IndexError_("block size must be a multiple of 64 between 1024 and 4194304 events")
    for c in [type_column, time_column, *attributes]:
        if not isinstance(c, str) or c.lower() not in names:
            raise IndexError_(f"table {table} has no column {c!r}; its columns: {', '.join(schema.names)}")
    type_column, time_column = names[type_column.lower()], names[time_column.lower()]
    attributes = [a for a in dict.fromkeys(names[a.lower()] for a in attributes) if a != type_column]
    kinds = {}
    for a in attributes:
        kinds[a] = _kind(schema.field(a).type)
        if kinds[a] is None:
            raise IndexError_(f"attribute {a} has type {schema.field(a).type}: range bitmaps index integers, "
                              "doubles, strings, dates and timestamps (without time zone) only")
    tt = schema.field(time_column).type
    if not (pa.types.is_integer(tt) or pa.types.is_timestamp(tt) or pa.types.is_date(tt)):
        raise IndexError_(f"time column {time_column} has type {tt}: an integer, date or timestamp is needed")
    t, ty, tm = quote_ident(table), quote_ident(type_column), quote_ident(time_column)
    cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    cur.execute(f"CREATE OR REPLACE TABLE {t} AS SELECT * FROM {t} ORDER BY {ty} NULLS LAST, {tm} NULLS LAST")
    syn = f"{SCHEMA}.{quote_ident('syn_' + table)}"
    cur.execute(f"CREATE OR REPLACE TABLE {syn} AS SELECT {ty} AS ty, min(rowid) AS r_lo, max(rowid) AS r_hi, "
                f"count(*) AS n FROM {t} GROUP BY {ty} ORDER BY r_lo")
    if cur.execute(f"SELECT count(*) FROM {syn} WHERE r_hi - r_lo + 1 <> n").fetchall()[0][0]:
        # row ids must be positions of the sorted order, or a type's run would mean other rows
        raise IndexError_("the rewritten table's row ids do not follow its order; the index was not built")
    n_rows = cur.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
    n_blocks = (n_rows + block_size - 1) // block_size
    val = f"{SCHEMA}.{quote_ident('val_' + table)}"
    bm = f"{SCHEMA}.{quote_ident('bm_' + table)}"
    cur.execute(f"CREATE OR REPLACE TABLE {val} (attr VARCHAR, kind VARCHAR, exact BOOLEAN, book BLOB)")
    cur.execute(f"CREATE OR REPLACE TABLE {bm} (attr VARCHAR, slice INTEGER, block INTEGER, fill TINYINT, "
                "cmin INTEGER, cmax INTEGER, bits BLOB)")
    for a in attributes:
        got = cur.sql(f"SELECT rowid AS r, {quote_ident(a)} AS x FROM {t}").to_arrow_table()
        r = got.column("r").to_numpy()
        col = got.column("x")
        if len(r) and (np.diff(r) != 1).any() or (len(r) and r[0] != 0):
            col = col.take(pa.array(np.argsort(r, kind="stable")))
        col = col.combine_chunks() if col.num_chunks else pa.array([], col.type)
        codes, valid, book, exact = _codes(col, kinds[a])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, book.schema) as w:
            w.write_table(book)
        cur.execute(f"INSERT INTO {val} VALUES (?, ?, ?, ?)", [a, kinds[a], exact, sink.getvalue().to_pybytes()])
        rows = []
        nbits = _nbits(book.num_rows)
        for b in range(n_blocks):
            part = slice(b * block_size, min(n_rows, (b + 1) * block_size))
            v, c = valid[part], codes[part]
            cmin, cmax = (int(c[v].min()), int(c[v].max())) if v.any() else (None, None)
            rows.append((a, -1, b, *_packed(v), cmin, cmax))
            for j in range(nbits):
                rows.append((a, j, b, *_packed(v & ((c >> j) & 1 == 0)), None, None))
        if rows:
            cur.executemany(f"INSERT INTO {bm} VALUES (?, ?, ?, ?, ?, ?, ?)",
                            [(a_, j, b, fill, cmin, cmax, bits) for a_, j, b, fill, bits, cmin, cmax in rows])
    cur.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.meta (tbl VARCHAR PRIMARY KEY, info VARCHAR)")
    info = {"type": type_column, "time": time_column, "attributes": attributes, "block": block_size, "rows": n_rows}
    cur.execute(f"INSERT OR REPLACE INTO {SCHEMA}.meta VALUES (?, ?)", [table, json.dumps(info)])
    cur.execute("CHECKPOINT")
    clusters = cur.execute(f"SELECT count(*) FROM {syn}").fetchall()[0][0]
    return {"rows": n_rows, "blocks": n_blocks, "clusters": clusters}


def _nbits(n_codes: int) -> int:
    return max(1, (n_codes - 1).bit_length())


def _packed(mask: np.ndarray) -> tuple[int, bytes | None]:
    """A block's bits on disk: 0 all zero, 1 all one (no bytes), 2 packed."""
    if not mask.any():
        return 0, None
    if mask.all():
        return 1, None
    return 2, np.packbits(mask, bitorder="little").tobytes()


def _codes(col: pa.Array, kind: str) -> tuple[np.ndarray, np.ndarray, pa.Table, bool]:
    """(code per row, non-NULL mask, code book (lo, hi, n per code), whether codes are exact values)."""
    n = len(col)
    valid = np.asarray(col.is_valid()) if col.null_count else np.ones(n, bool)
    if kind == "str":
        enc = pc.dictionary_encode(col)
        idx = enc.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        words = enc.dictionary.to_pylist()
        order = sorted(range(len(words)), key=lambda i: words[i].encode())  # DuckDB compares bytes
        rank = np.empty(len(words), np.int64)
        rank[order] = np.arange(len(words))
        vals = rank[idx] if len(words) else np.zeros(n, np.int64)
        sorted_words = [words[i] for i in order]
    else:
        vals = col.view(pa.int32() if kind == "date" else pa.int64()) if kind in ("date", "ts") else col
        vals = vals.fill_null(0).to_numpy(zero_copy_only=False)
        vals = vals.astype(np.float64 if kind == "float" else np.int64)
    distinct = np.unique(vals[valid])  # NaN, if any, last
    if len(distinct) <= MAX_CODES:
        code = np.searchsorted(distinct, vals) if kind != "float" else _float_rank(distinct, vals)
        lo = hi = distinct
        exact = True
    else:  # equal-depth bins: a code then stands for a value range, tests on it are rechecked by DuckDB
        sv = np.sort(vals[valid])
        starts = np.unique(sv[np.linspace(0, len(sv) - 1, MAX_CODES).astype(np.int64)])
        code = np.searchsorted(starts, vals, "right") - 1
        if kind == "float" and np.isnan(starts[-1]):
            code[np.isnan(vals)] = len(starts) - 1
        lo = starts
        last = np.r_[np.searchsorted(sv, starts[1:], "left") - 1, len(sv) - 1]
        hi = sv[last]
        exact = False
    code = np.where(valid, code, 0).astype(np.int64)
    counts = np.bincount(code[valid], minlength=len(lo)).astype(np.int64)
    if kind == "str":
        book = pa.table({"lo": pa.array([sorted_words[int(i)] for i in lo], pa.string()),
                         "hi": pa.array([sorted_words[int(i)] for i in hi], pa.string()), "n": counts})
    else:
        book = pa.table({"lo": lo, "hi": hi, "n": counts})
    return code, valid, book, exact


def _float_rank(distinct: np.ndarray, vals: np.ndarray) -> np.ndarray:
    code = np.searchsorted(distinct, vals)  # NaN sorts after every number, as in np.unique
    if len(distinct) and np.isnan(distinct[-1]):
        code[np.isnan(vals)] = len(distinct) - 1
    return code


def drop(con: duckdb.DuckDBPyConnection, table: str) -> None:
    cur = con.cursor()
    if not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = 'meta'",
                       [SCHEMA]).fetchall()[0][0]:
        return
    cur.execute(f"DELETE FROM {SCHEMA}.meta WHERE tbl = ?", [table])
    for part in ("syn_", "val_", "bm_"):
        cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{quote_ident(part + table)}")


def indexed_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    cur = con.cursor()
    if not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = 'meta'",
                       [SCHEMA]).fetchall()[0][0]:
        return set()
    return {r[0] for r in cur.sql(f"SELECT tbl FROM {SCHEMA}.meta").fetchall()}


# -- conditions: the parts an index can decide

@dataclass(frozen=True)
class Cmp:
    """``column`` between ``lo`` and ``hi`` (open or closed; None: unbounded), numbers exact."""
    column: str
    lo: object
    lo_open: bool
    hi: object
    hi_open: bool


@dataclass(frozen=True)
class In:
    """``column`` equals one of ``values`` (the type column: ``column`` is None)."""
    column: str | None
    values: frozenset


TRUE = ("true",)  # a part the index knows nothing of: every row may pass


def _literal(node):
    """A number (exact), a string, or ('cast', type, sql) of a DATE/TIMESTAMP literal; else None."""
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
    if isinstance(node, exp.Cast) and not neg and isinstance(node.this, exp.Literal) and node.this.is_string:
        to = node.to.this
        if to == exp.DataType.Type.DATE:
            return ("cast", "DATE", node.this.this)
        if to in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.DATETIME):
            return ("cast", "TIMESTAMP", node.this.this)
    return None


_T = exp.DataType.Type
# casts that keep every value of a column of that kind as it is (the compute node's SQL casts the
# type column to VARCHAR and keys to BIGINT): a test on the cast is a test on the column
_SAME_VALUES = {"str": {_T.TEXT, _T.VARCHAR}, "int": {_T.BIGINT, _T.INT128}, "float": {_T.DOUBLE}}


def _column(node, kinds: dict[str, str | None] | None = None) -> str | None:
    """The column ``node`` reads as it is: a column, or one cast to a type that keeps its values."""
    while isinstance(node, exp.Paren):
        node = node.this
    cast_to = None
    if isinstance(node, exp.Cast) and kinds is not None:
        cast_to, node = node.to.this, node.this
        while isinstance(node, exp.Paren):
            node = node.this
    if isinstance(node, exp.Column) and not node.table:
        name = node.name.lower()
        if cast_to is None or cast_to in _SAME_VALUES.get(kinds.get(name), ()):
            return name
    return None


_FLIP = {exp.LT: exp.GT, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.GTE: exp.LTE, exp.EQ: exp.EQ}


def _cmp(op, col: str, lit) -> Cmp:
    return {exp.EQ: Cmp(col, lit, False, lit, False), exp.LT: Cmp(col, None, False, lit, True),
            exp.LTE: Cmp(col, None, False, lit, False), exp.GT: Cmp(col, lit, True, None, False),
            exp.GTE: Cmp(col, lit, False, None, False)}[op]


def necessary(node, kinds: dict[str, str], type_column: str, type_kind: str | None):
    """A tree of and/or over Cmp/In that is TRUE wherever ``node`` is TRUE (TRUE: no idea).
    Without NOT, SQL's three-valued AND and OR are TRUE exactly when the tree of their TRUE
    parts is, so a tree without TRUE leaves is the condition itself."""
    while isinstance(node, exp.Paren):
        node = node.this
    if (isinstance(node, exp.Coalesce) and len(node.expressions) == 1
            and isinstance(node.expressions[0], exp.Boolean) and node.expressions[0].this is False):
        return necessary(node.this, kinds, type_column, type_kind)  # TRUE exactly where its argument is
    if isinstance(node, (exp.And, exp.Or)):
        op = "and" if isinstance(node, exp.And) else "or"
        return (op, [necessary(c, kinds, type_column, type_kind) for c in (node.left, node.right)])
    readable = {**kinds, type_column: type_kind} if type_column else kinds
    if type(node) in _FLIP:
        op, col, lit = type(node), _column(node.left, readable), _literal(node.right)
        if col is None:
            op, col, lit = _FLIP[op], _column(node.right, readable), _literal(node.left)
        if col is None or lit is None:
            return TRUE
        if col == type_column:
            if op is exp.EQ and _fits(type_kind, lit, equality=True):
                return In(None, frozenset([lit]))
            return TRUE
        if col in kinds and _fits(kinds[col], lit, equality=op is exp.EQ):
            return In(col, frozenset([lit])) if kinds[col] == "str" else _cmp(op, col, lit)
        return TRUE
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        col, lo, hi = _column(node.this, readable), _literal(node.args.get("low")), _literal(node.args.get("high"))
        if col in kinds and kinds[col] != "str" and _fits(kinds[col], lo) and _fits(kinds[col], hi):
            return Cmp(col, lo, False, hi, False)
        return TRUE
    if isinstance(node, exp.In) and not node.args.get("query") and not node.args.get("unnest"):
        col = _column(node.this, readable)
        lits = [_literal(e) for e in node.expressions]
        kind = type_kind if col == type_column else kinds.get(col)
        if lits and all(_fits(kind, v, equality=True) for v in lits):
            if col == type_column or kind == "str":
                return In(None if col == type_column else col, frozenset(lits))
            return ("or", [Cmp(col, v, False, v, False) for v in lits])
        return TRUE
    return TRUE


def _fits(kind: str | None, lit, equality: bool = False) -> bool:
    """Whether DuckDB compares a column of ``kind`` with ``lit`` as the index does."""
    if kind in ("int", "float"):
        return isinstance(lit, Fraction)
    if kind == "str":
        return equality and isinstance(lit, str)
    if kind == "date":
        return isinstance(lit, tuple) and lit[1] == "DATE"
    if kind == "ts":
        return isinstance(lit, tuple)
    return False


def _leaves(tree):
    if tree == TRUE:
        return
    if isinstance(tree, tuple):
        for t in tree[1]:
            yield from _leaves(t)
    else:
        yield tree


# -- the index of one table, in memory

class _Attribute:
    """One attribute's code book and bit slices (whole-table 64-bit words)."""

    def __init__(self, kind: str, exact: bool, book: pa.Table):
        self.kind, self.exact = kind, exact
        lo, hi = book.column("lo"), book.column("hi")
        self.lo = lo.to_pylist() if kind == "str" else lo.to_numpy()
        self.hi = hi.to_pylist() if kind == "str" else hi.to_numpy()
        self.cum = np.r_[0, np.cumsum(book.column("n").to_numpy())]
        self.nbits = _nbits(book.num_rows)
        self.nonnull: np.ndarray | None = None
        self.slices: list[np.ndarray] = []
        self.cmin = self.cmax = None
        self.has_nan = kind == "float" and len(self.lo) > 0 and bool(np.isnan(self.lo[-1]))

    def code_range(self, leaf, literal) -> tuple[int, int, bool]:
        """(first code, last code, exact) of the rows ``leaf`` may hold on; first > last: none."""
        n = len(self.lo)
        if isinstance(leaf, In):
            return self._code_of(next(iter(leaf.values)))
        if self.kind == "str":
            return 0, n - 1, False
        lo, hi = literal(leaf.lo), literal(leaf.hi)
        if (leaf.lo is not None and lo is None) or (leaf.hi is not None and hi is None):
            return 0, n - 1, False
        nums = self.lo[:-1] if self.has_nan else self.lo
        exact = self.exact
        if self.kind == "float":
            for bound in (lo, hi):
                if bound is None:
                    continue
                try:
                    f = float(bound)
                except OverflowError:
                    exact = False
                    continue
                if Fraction(f) != bound and len(nums):
                    # DuckDB rounds the literal to a double as Python does; a value within one unit in
                    # the last place of it is left to DuckDB in case it rounded otherwise
                    a, b = np.nextafter(f, -np.inf), np.nextafter(f, np.inf)
                    exact &= int(np.searchsorted(nums, b, "right")) == int(np.searchsorted(nums, a, "left"))
            lo = None if lo is None else _float(lo)
            hi = None if hi is None else _float(hi)
        elif lo is not None or hi is not None:
            lo = None if lo is None else (math.floor(lo) + 1 if leaf.lo_open else math.ceil(lo))
            hi = None if hi is None else (math.ceil(hi) - 1 if leaf.hi_open else math.floor(hi))
            lim = (-(1 << 63), (1 << 63) - 1)
            if (lo is not None and lo > lim[1]) or (hi is not None and hi < lim[0]):
                return 0, -1, exact
            lo = None if lo is None or lo < lim[0] else lo
            hi = None if hi is None or hi > lim[1] else hi
        if self.exact:
            first = 0 if lo is None else int(np.searchsorted(nums, lo, "right" if leaf.lo_open and self.kind == "float"
                                                             else "left"))
            last = (n - 1 if hi is None else
                    int(np.searchsorted(nums, hi, "left" if leaf.hi_open and self.kind == "float" else "right")) - 1)
        else:  # bins: every bin whose values may meet the range
            first = 0 if lo is None else int(np.searchsorted(self.hi[:len(nums)], lo, "left"))
            last = n - 1 if hi is None else int(np.searchsorted(nums, hi, "right")) - 1
        if hi is not None and self.has_nan:
            last = min(last, len(nums) - 1)  # NaN is above every number
        return first, last, exact

    def _code_of(self, value) -> tuple[int, int, bool]:
        """The code (range) of rows equal to ``value``."""
        i = bisect.bisect_right(self.lo, value) - 1
        if self.exact:
            return (i, i, True) if i >= 0 and self.lo[i] == value else (0, -1, True)
        return (i, i, False) if i >= 0 else (0, -1, True)

    def le(self, c: int, words: slice | np.ndarray) -> np.ndarray:
        """Rows (bits of ``words``) whose code is <= c, over the range-encoded slices."""
        nonnull = self.nonnull[words]
        if c >= len(self.lo) - 1:
            return nonnull.copy()  # ``words`` may be a slice: never hand out a view of the index
        if c < 0:
            return np.zeros_like(nonnull)
        le = np.zeros_like(nonnull)
        eq = nonnull.copy()
        for j in range(self.nbits - 1, -1, -1):
            zero = self.slices[j][words]
            if (c >> j) & 1:
                le |= eq & zero
                eq &= ~zero
            else:
                eq &= zero
        return le | eq

    def between(self, first: int, last: int, words) -> np.ndarray:
        if first > last:
            return np.zeros_like(self.nonnull[words])
        out = self.le(last, words)
        if first > 0:
            out &= ~self.le(first - 1, words)
        return out


class TableIndex:
    def __init__(self, con, table: str, info: dict):
        cur = con.cursor()
        self.table = table
        self.type_column = info["type"]
        self.time_column = info["time"]
        self.block = info["block"]
        self.rows = info["rows"]
        self.words = (self.rows + 63) // 64
        syn = cur.sql(f"SELECT * FROM {SCHEMA}.{quote_ident('syn_' + table)} ORDER BY r_lo").to_arrow_table()
        self.run_lo = syn.column("r_lo").to_numpy().astype(np.int64)
        self.run_hi = syn.column("r_hi").to_numpy().astype(np.int64)
        self.run_types = syn.column("ty").to_pylist()
        tt = syn.schema.field("ty").type
        self.type_kind = "str" if _kind(tt) == "str" else ("int" if pa.types.is_integer(tt) else None)
        self.attrs: dict[str, _Attribute] = {}
        self.names: dict[str, str] = {}
        for a, kind, exact, book in cur.sql(f"SELECT * FROM {SCHEMA}.{quote_ident('val_' + table)}").fetchall():
            self.attrs[a.lower()] = _Attribute(kind, exact, pa.ipc.open_stream(book).read_all())
            self.names[a.lower()] = a
        wpb = self.block // 64
        n_blocks = (self.rows + self.block - 1) // self.block
        for at in self.attrs.values():
            at.slices = [np.zeros(self.words, np.uint64) for _ in range(at.nbits)]
            at.nonnull = np.zeros(self.words, np.uint64)
            at.cmin = np.full(n_blocks, 1 << 30, np.int64)
            at.cmax = np.full(n_blocks, -1, np.int64)
        for a, j, b, fill, cmin, cmax, bits in cur.sql(
                f"SELECT * FROM {SCHEMA}.{quote_ident('bm_' + table)}").fetchall():
            at = self.attrs[a.lower()]
            target = at.nonnull if j < 0 else at.slices[j]
            w0, w1 = b * wpb, min(self.words, (b + 1) * wpb)
            if fill == 1:
                n = min(self.rows, (b + 1) * self.block) - b * self.block
                mask = np.packbits(np.ones(n, bool), bitorder="little")
                target[w0:w1] = np.frombuffer(mask.tobytes() + b"\0" * ((w1 - w0) * 8 - len(mask)), "<u8")
            elif fill == 2:
                target[w0:w1] = np.frombuffer(bits + b"\0" * ((w1 - w0) * 8 - len(bits)), "<u8")
            if j < 0 and cmin is not None:
                at.cmin[b], at.cmax[b] = cmin, cmax
        self.lock = threading.Lock()
        self.keys: dict[str, tuple | None] = {}
        self.hashes: dict[tuple, np.ndarray] = {}
        self.literals: dict[tuple, int | None] = {}
        self.trees: dict[str, object] = {}
        self.columns: dict[str, pa.Array] = {}
        self.schemas: dict[str, pa.Schema] = {}  # a pull's select list -> its result's schema
        self._last_phase_one = None
        self._con = con

    # the per-row columns an exact answer reads, cached per node

    def _keys(self, con, key_sql: str):
        """(key per row, non-NULL mask, first NULL key per type run, key type, position keys or
        None) when every type run's keys are sorted with NULLs last (then a time cover maps to row
        ranges), else None."""
        with self.lock:
            if key_sql in self.keys:
                return self.keys[key_sql]
        got = con.cursor().sql(f"SELECT rowid AS r, {key_sql} AS k FROM {quote_ident(self.table)}").to_arrow_table()
        out = None
        k = got.column("k")
        if got.num_rows == self.rows and pa.types.is_integer(k.type):
            r = got.column("r").to_numpy()
            order = None if (np.diff(r) == 1).all() and (not len(r) or r[0] == 0) else np.argsort(r, kind="stable")
            valid = np.asarray(k.is_valid()) if k.null_count else np.ones(self.rows, bool)
            keys = pc.fill_null(k, 0).to_numpy().astype(np.int64)
            if order is not None:
                keys, valid = keys[order], valid[order]
            first_null = np.empty(len(self.run_lo), np.int64)
            ok = True
            for i, (a, b) in enumerate(zip(self.run_lo, self.run_hi)):
                v = valid[a:b + 1]
                nv = int(v.sum())
                seg = keys[a:a + nv]
                if not v[:nv].all() or (nv > 1 and (np.diff(seg) < 0).any()):
                    ok = False
                    break
                first_null[i] = a + nv
            if ok:
                out = (keys, valid, first_null, k.type, _positions(keys, valid, self.run_lo, self.run_hi, first_null))
        with self.lock:
            self.keys[key_sql] = out
        return out

    def taken(self, con, names: list[str], ids: np.ndarray) -> list[pa.Array] | None:
        """The rows ``ids`` (sorted) of the table's columns ``names``, from columns the node keeps
        in memory; None when they would take more than ``COLUMN_CACHE`` bytes. A scan of the
        type-major table costs more per row than one of the table in its load order (columns that
        were sorted there no longer are), so rows the bitmaps find are taken, not scanned for."""
        keys = [n.lower() for n in names]
        with self.lock:
            missing = [n for n, k in zip(names, keys) if k not in self.columns]
            held = sum(a.nbytes for a in self.columns.values())
        if missing:
            select = f"SELECT rowid AS r, {', '.join(quote_ident(n) for n in missing)} FROM {quote_ident(self.table)}"
            head = con.cursor().sql(f"{select} LIMIT 4096").to_arrow_table()  # never read a table that cannot fit
            if held + head.nbytes / max(head.num_rows, 1) * self.rows > COLUMN_CACHE:
                return None
            got = con.cursor().sql(select).to_arrow_table()
            if got.num_rows != self.rows:
                return None
            r = got.column(0).to_numpy()  # by position: the table may have a column named r
            if len(r) and ((np.diff(r) != 1).any() or r[0] != 0):
                got = got.take(pa.array(np.argsort(r, kind="stable")))
            fresh = {n.lower(): got.column(i + 1).combine_chunks() for i, n in enumerate(missing)}
            if held + sum(a.nbytes for a in fresh.values()) > COLUMN_CACHE:
                return None
            with self.lock:
                self.columns.update(fresh)
        with self.lock:
            arrays = [self.columns[k] for k in keys]
        at = pa.array(ids, pa.int64())
        return [a.take(at) for a in arrays]

    def decided_rows(self, con, condition: str, key_sql: str, cover) -> np.ndarray | None:
        """The sorted row ids where ``condition`` is TRUE inside ``cover`` (rows without a key
        kept), from the index alone; None when the bitmaps do not decide the condition exactly
        or when more than ``EXACT_SHARE`` of the table may pass (a scan hands those over as fast)."""
        tree = self._tree(condition)
        if not self._exact(tree, con):
            return None
        starts, ends, _ = self._phase_one(con, tree, key_sql, cover, True)
        share = int((ends - starts + 1).sum())
        if any(getattr(x, "column", None) is not None for x in _leaves(tree)):
            share *= self._estimate(tree, con)
            if share > EXACT_SHARE * self.rows:
                return None
            return self._rows(tree, con, starts, ends)
        if share > EXACT_SHARE * self.rows:
            return None
        return _expand(starts, ends)

    def pulled(self, con, condition: str, key_sql: str, partition_sql: list[str], pk_bits: int, cover,
               keep=None, bounds=None) -> np.ndarray | None:
        """The row ids a pull of ``condition`` returns, from the index alone: ``decided_rows``
        less the rows with a key that ``keep(pk, t)`` refuses or that lie outside ``bounds``."""
        ids = self.decided_rows(con, condition, key_sql, cover)
        if ids is None or keep is None:
            return ids
        keyed = self._keys(con, key_sql)
        if keyed is None:
            return None
        keys, valid = keyed[0], keyed[1]
        has_key = valid[ids]
        with_key = ids[has_key]
        t = keys[with_key]
        if partition_sql:
            pk = (self._hashes(con, tuple(partition_sql))[with_key] >> np.uint64(64 - pk_bits)).astype(np.int64)
        else:
            pk = np.zeros(len(with_key), np.int64)
        ok = np.asarray(keep(pk, t), bool)
        if bounds:
            ok &= (t >= bounds[0]) & (t <= bounds[1])
        mask = ~has_key  # rows without a key are kept, as the scan keeps them: the engine decides on them
        mask[has_key] = ok
        return ids[mask]

    def _hashes(self, con, parts: tuple) -> np.ndarray:
        """hash(partition columns) per row, as DuckDB computes it (UBIGINT)."""
        with self.lock:
            if parts in self.hashes:
                return self.hashes[parts]
        got = con.cursor().sql(f"SELECT rowid AS r, hash({', '.join(parts)}) AS h "
                               f"FROM {quote_ident(self.table)}").to_arrow_table()
        r = got.column("r").to_numpy()
        h = got.column("h").to_numpy().astype(np.uint64)
        if len(r) and ((np.diff(r) != 1).any() or r[0] != 0):
            h = h[np.argsort(r, kind="stable")]
        with self.lock:
            self.hashes[parts] = h
        return h

    def _literal(self, con, kind: str):
        """Turns a leaf's bound into the attribute's coded domain (dates: days, timestamps: µs)."""
        def convert(lit):
            if lit is None or not isinstance(lit, tuple):
                return lit
            key = (kind, lit)
            with self.lock:
                if key in self.literals:
                    return self.literals[key]
            sql = (f"SELECT epoch_us(CAST(CAST(? AS {lit[1]}) AS TIMESTAMP))" if kind == "ts"
                   else "SELECT CAST(CAST(? AS DATE) AS DATE) - DATE '1970-01-01'")
            try:
                value = con.cursor().execute(sql, [lit[2]]).fetchall()[0][0]
            except duckdb.Error:
                value = None  # DuckDB will refuse the condition itself; the index leaves it alone
            if value is not None:
                value = Fraction(int(value))
            with self.lock:
                self.literals[key] = value
            return value
        return convert

    # -- planning

    def _tree(self, condition: str):
        with self.lock:
            tree = self.trees.get(condition)
        if tree is None:  # parsing costs about as much as a small scan: once per condition
            kinds = {a: at.kind for a, at in self.attrs.items()}
            tree = necessary(sqlglot.parse_one(f"SELECT {condition}", read="duckdb").expressions[0], kinds,
                             self.type_column.lower() if self.type_kind else "", self.type_kind)
            with self.lock:
                if len(self.trees) > 1024:
                    self.trees.clear()
                self.trees[condition] = tree
        return tree

    def _runs(self, tree) -> np.ndarray:
        """Which type runs the tree's type tests let through."""
        if not any(isinstance(x, In) and x.column is None for x in _leaves(tree)):
            return np.ones(len(self.run_lo), bool)

        def may(t, value) -> bool:
            if t == TRUE:
                return True
            if isinstance(t, tuple):
                parts = (may(x, value) for x in t[1])
                return all(parts) if t[0] == "and" else any(parts)
            if isinstance(t, In) and t.column is None:
                return value is not None and value in t.values
            return True
        return np.array([may(tree, v) for v in self.run_types], bool)

    def _phase_one(self, con, tree, key_sql: str, cover, keep_keyless: bool):
        """(first, last) row ranges of the allowed runs whose time lies in ``cover``; with the
        keys when they map the cover to rows (None: no time phase). The last answer is kept: a
        candidates request the index cannot answer alone asks again for its scan."""
        ask = (key_sql, keep_keyless, None if cover is None else (cover[0].tobytes(), cover[1].tobytes()))
        last = self._last_phase_one
        if last is not None and last[0] is tree and last[1] == ask:
            return last[2]
        out = self._search_runs(con, tree, key_sql, cover, keep_keyless)
        self._last_phase_one = (tree, ask, out)
        return out

    def _search_runs(self, con, tree, key_sql: str, cover, keep_keyless: bool):
        runs = self._runs(tree)
        lo, hi = self.run_lo[runs], self.run_hi[runs]
        n_runs = int(runs.sum())
        if cover is None or not key_sql or n_runs > MAX_RUNS:
            return lo, hi, None  # many types: the search would cost more than a scan
        if n_runs * len(cover[0]) > MAX_SEARCHES:  # a coarser cover (its smallest gaps closed) bounds the search
            cover = _merge(cover[0], cover[1], max(1, MAX_SEARCHES // n_runs))
        keyed = self._keys(con, key_sql)
        if keyed is None:
            return lo, hi, None
        keys, _, first_null, _, pos = keyed
        c_lo, c_hi = cover
        if pos is not None:  # every run's searches in two calls: planning must stay small next to a scan
            comp, kmin, span = pos
            r = np.flatnonzero(runs).astype(np.int64)[:, None] * span
            q_lo = (r + (np.clip(c_lo, kmin, kmin + span - 1) - kmin)[None, :]).ravel()
            q_hi = (r + (np.clip(c_hi, kmin - 1, kmin + span - 2) - kmin)[None, :]).ravel()
            i0, i1 = np.searchsorted(comp, q_lo, "left"), np.searchsorted(comp, q_hi, "right")
            m = i1 > i0
            s, e = i0[m].astype(np.int64), i1[m].astype(np.int64) - 1  # in row order: runs, then intervals
            if keep_keyless:
                fn = first_null[runs]
                kl = fn <= hi
                if kl.any():
                    s, e = np.r_[s, fn[kl]], np.r_[e, hi[kl]]
                    order = np.argsort(s, kind="stable")
                    s, e = s[order], e[order]
            return s, e, keyed
        starts, ends = [], []
        for a, b, fn in zip(lo, hi, first_null[runs]):
            seg = keys[a:fn]
            i0 = np.searchsorted(seg, c_lo, "left")
            i1 = np.searchsorted(seg, c_hi, "right")
            m = i1 > i0
            starts.append(a + i0[m])
            ends.append(a + i1[m] - 1)
            if keep_keyless and fn <= b:
                starts.append(np.array([fn]))
                ends.append(np.array([b]))
        if not starts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), keyed
        s, e = np.concatenate(starts).astype(np.int64), np.concatenate(ends).astype(np.int64)
        order = np.argsort(s, kind="stable")
        return s[order], e[order], keyed

    def _estimate(self, tree, con) -> float:
        """The share of rows the attribute tests keep, from the code books (independence assumed)."""
        if tree == TRUE or (isinstance(tree, In) and tree.column is None):
            return 1.0
        if isinstance(tree, tuple):
            parts = [self._estimate(t, con) for t in tree[1]]
            return math.prod(parts) if tree[0] == "and" else min(1.0, sum(parts))
        at = self.attrs[tree.column]
        total = 0.0
        for leaf in ([In(tree.column, frozenset([v])) for v in tree.values] if isinstance(tree, In) else [tree]):
            first, last, _ = at.code_range(leaf, self._literal(con, at.kind))
            if first <= last:
                total += (at.cum[last + 1] - at.cum[first]) / max(self.rows, 1)
        return min(1.0, total)

    def _exact(self, tree, con) -> bool:
        if tree == TRUE:
            return False
        if isinstance(tree, tuple):
            return all(self._exact(t, con) for t in tree[1])
        if tree.column is None:
            return True
        at = self.attrs[tree.column]
        if isinstance(tree, In):
            return all(at.code_range(In(tree.column, frozenset([v])), None)[2] for v in tree.values)
        return at.code_range(tree, self._literal(con, at.kind))[2]

    def _bitmap(self, tree, con, words) -> np.ndarray | None:
        """Rows (bits of ``words``) the tree's tests may hold on; None: all."""
        if tree == TRUE:
            return None
        if isinstance(tree, In) and tree.column is None:  # the type's row-id bitmap: its runs
            runs = np.array([v is not None and v in tree.values for v in self.run_types], bool)
            if isinstance(words, slice):
                words = np.arange(words.start, words.stop)
            return _range_words(words, self.run_lo[runs], self.run_hi[runs])
        if isinstance(tree, tuple):
            parts = [self._bitmap(t, con, words) for t in tree[1]]
            if tree[0] == "and":
                known = [p for p in parts if p is not None]
                if not known:
                    return None
                out = known[0].copy()
                for p in known[1:]:
                    out &= p
                return out
            if any(p is None for p in parts):
                return None
            out = parts[0].copy()
            for p in parts[1:]:
                out |= p
            return out
        at = self.attrs[tree.column]
        leaves = [In(tree.column, frozenset([v])) for v in tree.values] if isinstance(tree, In) else [tree]
        out = None
        for leaf in leaves:
            first, last, _ = at.code_range(leaf, self._literal(con, at.kind))
            m = at.between(first, last, words)
            out = m if out is None else (out | m)
        return out

    def _rows(self, tree, con, starts, ends) -> np.ndarray:
        """Row ids inside the sorted disjoint ranges where the tree's attribute tests may hold
        (phase two, over the words of the blocks the ranges touch only)."""
        if not len(starts):
            return np.zeros(0, np.int64)
        B, wpb = self.block, self.block // 64
        n_blocks = (self.rows + B - 1) // B
        mark = np.zeros(n_blocks + 1, np.int64)
        np.add.at(mark, starts // B, 1)
        np.add.at(mark, ends // B + 1, -1)
        blocks = np.flatnonzero(np.cumsum(mark[:-1]) > 0)
        blocks = blocks[self._blocks_may(tree, con, blocks)]
        if not len(blocks):
            return np.zeros(0, np.int64)
        words = (blocks[:, None] * wpb + np.arange(wpb)[None, :]).ravel()
        words = words[words < self.words]
        first = 0
        if words[-1] - words[0] + 1 == len(words):  # contiguous: views of the slices, no copies
            words = slice(int(words[0]), int(words[-1]) + 1)
            first = words.start
        bits = self._bitmap(tree, con, words)
        if bits is None:
            return _expand(starts, ends)
        nz = np.flatnonzero(bits)  # decode only the words with a row set
        x = _set_bits(bits[nz])
        word_ids = (nz + first) if isinstance(words, slice) else words[nz]
        rows = word_ids[x // 64] * 64 + x % 64
        k = np.searchsorted(starts, rows, "right") - 1
        return rows[(k >= 0) & (rows <= ends[np.maximum(k, 0)])]

    def _clip_blocks(self, tree, con, starts, ends):
        """The ranges without the blocks whose code ranges cannot meet the tree's tests."""
        B = self.block
        n_blocks = (self.rows + B - 1) // B
        dead = ~self._blocks_may(tree, con, np.arange(n_blocks))
        if not dead.any():
            return starts, ends
        lo = np.flatnonzero(dead) * B
        hi = np.minimum(lo + B - 1, self.rows - 1)
        # cut the ranges at every dead block: keep the parts between dead blocks
        cuts_lo, cuts_hi = np.r_[-1, hi] + 1, np.r_[lo, self.rows] - 1  # the live spans
        live = cuts_hi >= cuts_lo
        cuts_lo, cuts_hi = cuts_lo[live], cuts_hi[live]
        i = np.searchsorted(cuts_hi, starts, "left")  # first live span ending at or after the start
        j = np.searchsorted(cuts_lo, ends, "right") - 1  # last live span starting at or before the end
        out_s, out_e = [], []
        for a, b, p, q in zip(starts, ends, i, j):
            for k in range(p, q + 1):
                out_s.append(max(a, cuts_lo[k]))
                out_e.append(min(b, cuts_hi[k]))
        return np.array(out_s, np.int64), np.array(out_e, np.int64)

    def _blocks_may(self, tree, con, blocks) -> np.ndarray:
        if tree == TRUE or (isinstance(tree, In) and tree.column is None):
            return np.ones(len(blocks), bool)
        if isinstance(tree, tuple):
            parts = [self._blocks_may(t, con, blocks) for t in tree[1]]
            out = parts[0].copy()
            for p in parts[1:]:
                out = (out & p) if tree[0] == "and" else (out | p)
            return out
        at = self.attrs[tree.column]
        leaves = [In(tree.column, frozenset([v])) for v in tree.values] if isinstance(tree, In) else [tree]
        out = np.zeros(len(blocks), bool)
        for leaf in leaves:
            first, last, _ = at.code_range(leaf, self._literal(con, at.kind))
            out |= (at.cmin[blocks] <= last) & (at.cmax[blocks] >= first)
        return out

    def scope(self, con, condition: str, key_sql: str, cover, keep_keyless: bool) -> tuple[str, dict]:
        """A rowid condition for DuckDB's scan of the rows ``condition`` may hold on inside
        ``cover`` ("TRUE": scan the table), and what the planner saw."""
        tree = self._tree(condition)
        starts, ends, _ = self._phase_one(con, tree, key_sql, cover, keep_keyless)
        phase_one = int((ends - starts + 1).sum())
        seen = {"phase_one": phase_one}
        if any(getattr(x, "column", None) is not None for x in _leaves(tree)) and phase_one:
            expected = self._estimate(tree, con) * phase_one
            seen["expected"] = expected
            narrowed = _covered(starts, ends) <= SCAN_SHARE * self.rows
            if not narrowed:  # blocks whose codes cannot meet the tests go, at no cost
                starts, ends = self._clip_blocks(tree, con, starts, ends)
                narrowed = _covered(starts, ends) <= SCAN_SHARE * self.rows
            # Phase two pays off for a scan only when its few rows may fall into a few ranges;
            # many scattered rows need every range, which a scan of the table beats.
            if expected <= FEW_ROWS or (narrowed and expected <= BITMAP_SHARE * self.rows):
                ids = self._rows(tree, con, starts, ends)
                seen["bitmaps"] = len(ids)
                s2, e2 = _runs_of(ids)
                if _covered(s2, e2) < 0.5 * _covered(starts, ends):  # OR-ed ranges cost more per row than one
                    starts, ends = s2, e2
        lo, hi = _merge(starts, ends, MAX_RANGES)
        covered = int((hi - lo + 1).sum())
        seen["covered"] = covered
        if covered > SCAN_SHARE * self.rows:
            return "TRUE", seen
        if not len(lo):
            return "FALSE", seen
        return "(" + " OR ".join(f"rowid BETWEEN {int(a)} AND {int(b)}" for a, b in zip(lo, hi)) + ")", seen

    def candidates(self, con, condition: str, key_sql: str, partition_sql: list[str], pk_bits: int, cover):
        """(pk, t) of the rows with a key where ``condition`` is TRUE inside ``cover``, from the
        index alone; None when the bitmaps do not decide the condition exactly."""
        tree = self._tree(condition)
        if not self._exact(tree, con):
            return None
        keyed = self._keys(con, key_sql)
        if keyed is None:
            return None
        starts, ends, _ = self._phase_one(con, tree, key_sql, cover, False)
        if any(getattr(x, "column", None) is not None for x in _leaves(tree)):
            phase_one = int((ends - starts + 1).sum())
            if self._estimate(tree, con) * phase_one > EXACT_SHARE * self.rows:
                return None  # most rows pass: DuckDB's scan hands them over faster than gathering them here
            ids = self._rows(tree, con, starts, ends)
        else:
            ids = _expand(starts, ends)
        keys, valid, _, key_type, _ = keyed
        ids = ids[valid[ids]]
        if partition_sql:
            pk = (self._hashes(con, tuple(partition_sql))[ids] >> np.uint64(64 - pk_bits)).astype(np.int64)
        else:
            pk = np.zeros(len(ids), np.int64)
        return pa.table({"pk": pk, "t": pa.array(keys[ids]).cast(key_type)})  # as DuckDB would type it


def _positions(keys: np.ndarray, valid: np.ndarray, run_lo, run_hi, first_null):
    """(position key per row, smallest key, span): run number times span plus the key's offset,
    NULL keys at the top of their run, so the position keys of the whole table are sorted and one
    search finds a key range inside every run. None when they would not fit in 64 bits."""
    if not valid.any():
        return None
    kmin, kmax = int(keys[valid].min()), int(keys[valid].max())
    span = kmax - kmin + 2  # offsets 0 .. span - 2 for keys, span - 1 for NULL
    if len(run_lo) * span >= 1 << 62 or kmin - 1 < -(1 << 63):
        return None
    lengths = run_hi - run_lo + 1
    if int(lengths.sum()) != len(keys):
        return None
    run = np.repeat(np.arange(len(run_lo), dtype=np.int64), lengths)
    off = np.where(valid, keys - kmin, span - 1)
    comp = run * span + off
    if len(comp) > 1 and (np.diff(comp) < 0).any():
        return None
    return comp, kmin, span


def _set_bits(words: np.ndarray) -> np.ndarray:
    """Positions (word * 64 + bit, sorted) of the set bits of ``words``."""
    single = (words != 0) & ((words & (words - np.uint64(1))) == 0)  # one bit set (numpy 1.x has no bitwise_count)
    if 2 * int(single.sum()) < len(words):  # dense words: unpack them all
        return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
    # mostly one row per word (a selective test): its position is the word's binary exponent
    at = np.arange(len(words))
    one = at[single] * 64 + np.frexp(words[single].astype(np.float64))[1] - 1  # powers of two are exact
    x = np.flatnonzero(np.unpackbits(words[~single].view(np.uint8), bitorder="little"))
    return np.sort(np.r_[one, at[~single][x // 64] * 64 + x % 64])


def _expand(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if not len(starts):
        return np.zeros(0, np.int64)
    lengths = ends - starts + 1
    offsets = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + offsets


ALL_BITS = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def _range_words(words: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The 64-row words ``words`` (sorted word ids) of the bitmap of the rows in the sorted disjoint
    ranges [starts, ends]: words a range covers whole are set through a running count over the
    words, the at most two words where a range begins or ends get their bits or-ed in, so the
    work is per word and per range, not per row (a type's runs cover most of a node's rows)."""
    out = np.zeros(len(words), np.uint64)
    if not len(starts) or not len(words):
        return out
    # words wholly inside a range: [ceil(start / 64), floor((end + 1) / 64) - 1]
    i = np.searchsorted(words, -(-starts // 64), "left")
    j = np.searchsorted(words, (ends + 1) // 64, "left")
    whole = j > i
    if whole.any():
        mark = np.zeros(len(words) + 1, np.int32)
        np.add.at(mark, i[whole], 1)
        np.add.at(mark, j[whole], -1)
        out[np.cumsum(mark[:-1]) > 0] = ALL_BITS
    # the words where a range begins and ends, each with the range's bits in that word
    for edge in (starts // 64, ends // 64):
        at = np.searchsorted(words, edge, "left")
        at_ok = at < len(words)
        hit = at_ok & (words[np.minimum(at, len(words) - 1)] == edge)
        lo = np.maximum(starts[hit], edge[hit] * 64) - edge[hit] * 64
        hi = np.minimum(ends[hit], edge[hit] * 64 + 63) - edge[hit] * 64
        bits = (ALL_BITS >> (63 - hi).astype(np.uint64)) & (ALL_BITS << lo.astype(np.uint64))
        np.bitwise_or.at(out, at[hit], bits)
    return out


def _covered(starts: np.ndarray, ends: np.ndarray) -> int:
    """Rows the at most MAX_RANGES ranges a scan gets for these ranges cover."""
    lo, hi = _merge(starts, ends, MAX_RANGES)
    return int((hi - lo + 1).sum())


def _float(x: Fraction) -> float:
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _runs_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(np.diff(ids) > 1)
    return np.r_[ids[0], ids[cut + 1]], np.r_[ids[cut], ids[-1]]


def union_of(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of closed intervals (any order, any partition) as sorted disjoint ranges."""
    if not len(lo):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(lo, kind="stable")
    lo, hi = np.asarray(lo, np.int64)[order], np.asarray(hi, np.int64)[order]
    reach = np.maximum.accumulate(hi)
    starts = np.r_[0, np.flatnonzero(lo[1:] > reach[:-1] + 1) + 1]
    return lo[starts], np.r_[reach[starts[1:] - 1], reach[-1]]


def _merge(starts: np.ndarray, ends: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``most`` ranges covering the sorted ranges given, the widest gaps kept open (the
    fewest rows covered for that many ranges)."""
    if len(starts) <= most:
        return starts, ends
    if most <= 1:
        return starts[:1], ends[-1:]
    gaps = starts[1:] - ends[:-1]
    keep = np.sort(np.argpartition(gaps, len(gaps) - (most - 1))[len(gaps) - (most - 1):])
    return np.r_[starts[0], starts[keep + 1]], np.r_[ends[keep], ends[-1]]


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
                try:
                    idx = TableIndex(con, table, info)
                except duckdb.CatalogException:  # an index of an older layout: ignored until built again
                    idx = None
        with self._lock:
            self._cache[table] = (version, idx)
        return idx

    def forget(self, table: str) -> None:
        with self._lock:
            self._cache.pop(table, None)
