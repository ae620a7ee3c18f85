"""The output stage: from matches (as arrays) to output rows and MEASURES, column-wise.

Matches of a chunk arrive as flat arrays (kind, start row, length, match number, labels).
Output rows are expanded with numpy (ONE ROW: one per match; ALL ROWS: every matched row that
is not excluded, plus empty matches and unmatched rows as the mode asks). MEASURES are then
computed a column at a time where their form allows it: navigation becomes arithmetic on row
positions followed by one ``take`` (FIRST/LAST with logical offsets over a variable set: ordinals
of the set's slots), counts become cumulative sums per match, count/sum/avg/min/max and
bool_and/bool_or of a column become running reductions per match (``operators.running``), and operators
over such columns are evaluated by DuckDB over the whole column. Any other measure is
evaluated row by row with the expression evaluator, which defines the semantics; the
column-wise forms are shortcuts that the differential tests hold to it.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.connectors.duckdb_source import TEXT_CARRIED
from matchrec.engine import arrow_eval
from matchrec.errors import DataError
from matchrec.operators import expr as ir
from matchrec.operators.kernels import label_extents
from matchrec.operators.matcher import ListView
from matchrec.operators.running import running_extreme, running_sum, slot_rows
from matchrec.parser import hidden as H

MATCH, EMPTY, UNMATCHED = 0, 1, 2  # event kinds, shared with the executor that produces them
ROW_BY_ROW = False  # True: every measure by the defining evaluation (differential tests set it)


class LazyColumn:
    """Python values of an Arrow column, converted one row at a time on demand."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __getitem__(self, i: int):
        return self.array[i].as_py()


@dataclass
class Matches:
    """The matches of one chunk, in output order. Rows are chunk rows (absolute)."""
    kind: np.ndarray  # int8
    start: np.ndarray  # int64
    length: np.ndarray  # int64
    number: np.ndarray  # int64 (MATCH_NUMBER)
    label_offset: np.ndarray  # int64: first label of the match in ``labels``
    labels: np.ndarray  # int16, all matches' labels one after another
    part_lo: np.ndarray  # int64: partition bounds of each match
    part_hi: np.ndarray
    exclusions: dict  # match index -> list of (start, end) relative ranges; only matches that have some

    @staticmethod
    def concat(parts: list["Matches"]) -> "Matches":
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [len(p.labels) for p in parts[:-1]])
        counts = np.cumsum([0] + [len(p.kind) for p in parts[:-1]])
        return Matches(
            kind=np.concatenate([p.kind for p in parts]), start=np.concatenate([p.start for p in parts]),
            length=np.concatenate([p.length for p in parts]), number=np.concatenate([p.number for p in parts]),
            label_offset=np.concatenate([p.label_offset + o for p, o in zip(parts, offsets)]),
            labels=np.concatenate([p.labels for p in parts]), part_lo=np.concatenate([p.part_lo for p in parts]),
            part_hi=np.concatenate([p.part_hi for p in parts]),
            exclusions={int(i + c): e for p, c in zip(parts, counts) for i, e in p.exclusions.items()})


@dataclass
class Rows:
    """One entry per output row."""
    match: np.ndarray  # index into Matches (-1 for none)
    source: np.ndarray  # chunk row the input columns come from
    cur: np.ndarray  # current row for RUNNING semantics (start - 1 for an empty match)
    unmatched: np.ndarray  # bool: measures are all NULL


def expand(m: Matches, one_row: bool, omit_empty: bool) -> Rows:
    if one_row:
        keep = m.kind != UNMATCHED
        idx = np.flatnonzero(keep)
        cur = m.start[idx] + m.length[idx] - 1
        return Rows(idx, m.start[idx].copy(), cur, np.zeros(len(idx), bool))
    counts = np.where(m.kind == MATCH, m.length, np.where((m.kind == EMPTY) & omit_empty, 0, 1))
    idx = np.repeat(np.arange(len(m.kind)), counts)
    first = np.cumsum(counts) - counts
    within = np.arange(len(idx)) - np.repeat(first, counts)
    is_match = m.kind[idx] == MATCH
    source = m.start[idx] + np.where(is_match, within, 0)
    cur = np.where(is_match, source, m.start[idx] - 1)
    rows = Rows(idx, source, cur, m.kind[idx] == UNMATCHED)
    if m.exclusions:
        keep = np.ones(len(idx), bool)
        for i, ranges in m.exclusions.items():
            for a, b in ranges:
                keep &= ~((idx == i) & (within >= a) & (within < b))
        rows = Rows(rows.match[keep], rows.source[keep], rows.cur[keep], rows.unmatched[keep])
    return rows


class MeasureComputer:
    """Computes MEASURES for a chunk's output rows (see the module docstring)."""

    def __init__(self, measures: list[ir.Node], compiled: list[Callable], label_names: list[str],
                 arrow_types: list[pa.DataType], names: list[str], fallback: Callable, null_row: list,
                 duck: duckdb.DuckDBPyConnection | None):
        self.measures = measures
        self.compiled = compiled
        self.label_names = label_names
        self.arrow_types = arrow_types
        self.names = names
        self.ctx = ir.Context(label_names, fallback)
        self.null_row = null_row
        self.duck = duck
        self.label_dict = pa.array(label_names, pa.string())
        self.vectorized = 0
        self.row_by_row = 0

    def compute(self, table: pa.Table, colmap: dict[int, int], m: Matches, rows: Rows) -> list[pa.Array]:
        out = []
        vector = _Vector(self, table, colmap, m, rows) if len(rows.match) and not ROW_BY_ROW else None
        for node, fn, typ, name in zip(self.measures, self.compiled, self.arrow_types, self.names):
            arr = None
            if vector is not None:
                try:
                    arr = vector.value(node)
                except _NotVectorizable:
                    arr = None
            if arr is not None and pa.types.is_string(typ) and not _textual(arr.type):
                arr = None  # a number carried as text (UHUGEINT, BIGNUM): its values, row by row
            if arr is not None:
                self.vectorized += 1
                arr = arr if isinstance(arr, (pa.Array, pa.ChunkedArray)) else pa.array(arr)
                if rows.unmatched.any():
                    arr = pc.if_else(pa.array(rows.unmatched), pa.nulls(len(rows.match), arr.type), arr)
                out.append(_cast(arr, typ, name))
            else:
                self.row_by_row += 1
                out.append(_to_arrow(self.row_values(fn, table, colmap, m, rows), typ, name))
        return out

    def row_values(self, fn, table, colmap, m: Matches, rows: Rows) -> list:
        """The defining evaluation: one row at a time with the expression evaluator."""
        ctx = self.ctx
        values = []
        current_part = None
        width = max(colmap, default=-1) + 1
        cols = [LazyColumn(table.column(colmap[i])) if i in colmap else None for i in range(width)]
        for j in range(len(rows.match)):
            if rows.unmatched[j]:
                values.append(None)
                continue
            i = int(rows.match[j])
            lo, hi = int(m.part_lo[i]), int(m.part_hi[i])
            if current_part != lo:
                current_part = lo
                ctx.cols = [_Shifted(c, lo) if c is not None else None for c in cols]
                ctx.null_row, ctx.n = self.null_row, hi - lo
            off, length = int(m.label_offset[i]), int(m.length[i])
            labels = m.labels[off:off + length].tolist()
            ctx.start, ctx.match_number = int(m.start[i]) - lo, int(m.number[i])
            ctx.view = ListView(labels)
            ctx.cur = int(rows.cur[j]) - lo
            ctx.classifier_visible = length
            values.append(fn(ctx, ctx.cur))
        return values


class _Shifted:
    """A column read with partition-relative row numbers."""

    __slots__ = ("column", "lo")

    def __init__(self, column, lo: int):
        self.column, self.lo = column, lo

    def __getitem__(self, i: int):
        return self.column[i + self.lo]


class _NotVectorizable(Exception):
    pass


class _Vector:
    """Column-wise evaluation of one measure over all output rows of a chunk."""

    def __init__(self, owner: MeasureComputer, table: pa.Table, colmap, m: Matches, rows: Rows):
        self.o, self.table, self.colmap, self.m, self.rows = owner, table, colmap, m, rows
        self.i = rows.match
        self.start = m.start[self.i]
        self.length = m.length[self.i]
        self.lo = m.part_lo[self.i]
        self.hi = m.part_hi[self.i]
        self.cur = rows.cur
        self._cache: dict = {}
        self.n_slots = len(m.labels)
        # every output row reads its whole match (ONE ROW PER MATCH, FINAL): per-match reductions do
        self.at_match_end = bool(np.all(self.cur == self.start + self.length - 1))

    # -- values at the output rows
    def value(self, node: ir.Node):
        if isinstance(node, ir.At):
            return self.at(node.nav, node.expr)
        if isinstance(node, ir.MatchNumber):
            return pa.array(self.m.number[self.i])
        if isinstance(node, ir.Const):
            return const_array(node, len(self.i))
        if isinstance(node, ir.Agg):
            return self.aggregate(node)
        if isinstance(node, (ir.Op, ir.Fallback)):
            return self.combine(node, [self.value(a) for a in node.args])
        raise _NotVectorizable()

    # -- navigation
    def at(self, nav: ir.Nav, expr: ir.Node):
        pos = self.resolve(nav)
        return self.row_local(expr, pos)

    def resolve(self, nav: ir.Nav) -> np.ndarray:
        """Chunk row selected by ``nav`` for every output row, -1 where there is none."""
        limit = self.cur - self.start if nav.running else self.length - 1
        k = nav.logical_offset
        if nav.labels is None:
            rel = limit - k if nav.last else np.where(k <= limit, k, -1)
            rel = np.where(limit >= 0, rel, -1)
        elif k != 0:
            rel = self.nth_labelled(nav.labels, nav.last, k, limit)
        else:
            rel = self.labelled(nav.labels, nav.last, limit)
        pos = np.where(rel >= 0, self.start + rel + nav.physical_offset, -1)
        return np.where((rel >= 0) & (pos >= self.lo) & (pos < self.hi), pos, -1)

    def _extents(self):
        """(first, last) relative slot of every label in every match."""
        if "extents" not in self._cache:
            m = self.m
            self._cache["extents"] = label_extents(m.labels, m.label_offset, m.length,
                                                   len(self.o.label_names))
        return self._cache["extents"]

    def _inside(self, labels: frozenset[int]) -> np.ndarray:
        """Per label slot: whether its label is one of ``labels``."""
        key = ("inside", labels)
        if key not in self._cache:
            flat = self.m.labels
            member = np.zeros(max(int(flat.max(initial=0)), max(labels, default=0)) + 1, bool)
            member[list(labels)] = True
            self._cache[key] = member[flat] if self.n_slots else np.zeros(0, bool)
        return self._cache[key]

    def nth_labelled(self, labels: frozenset[int], last: bool, k: int, limit: np.ndarray) -> np.ndarray:
        """Relative row of the (k+1)-th first (or last) row with a label in ``labels``, among the
        match's rows up to ``limit`` (FIRST(A.v, k), LAST(A.v, k)); -1 where there is none."""
        m = self.m
        key = ("members", labels)
        if key not in self._cache:  # the slots of the set, in order, and how many precede each slot
            inside = self._inside(labels)
            self._cache[key] = (np.flatnonzero(inside), np.concatenate([[0], np.cumsum(inside, dtype=np.int64)]))
        slots, before = self._cache[key]
        base = m.label_offset[self.i]
        upto = np.clip(limit + 1, 0, self.length)  # visible slots of each output row's match
        seen = before[base + upto] - before[base]  # members among them
        ordinal = seen - 1 - k if last else np.full(len(base), k)
        ok = (ordinal >= 0) & (ordinal < seen)
        if not len(slots):
            return np.full(len(base), -1)
        slot = slots[np.clip(before[base] + ordinal, 0, len(slots) - 1)]
        return np.where(ok, slot - base, -1)

    def labelled(self, labels: frozenset[int], last: bool, limit: np.ndarray) -> np.ndarray:
        """Relative row of the last (or first) row with a label in ``labels``, up to ``limit``."""
        m, n = self.m, self.n_slots
        if last and (self.at_match_end or np.all(limit == self.length - 1)):
            key = ("last of match", labels)
            if key not in self._cache:  # per match: its last slot of the set, relative
                self._cache[key] = self._extents()[1][:, sorted(labels)].max(axis=1)
            return self._cache[key][self.i]
        if last:
            key = ("last", labels)
            if key not in self._cache:  # per slot: the last slot of the set at or before it, in its match
                seg_start = np.repeat(m.label_offset, m.length) if n else np.zeros(0, np.int64)
                marked = np.where(self._inside(labels), np.arange(n), -1)
                running = np.maximum.accumulate(marked) if n else marked
                self._cache[key] = np.where(running >= seg_start, running - seg_start, -1)
            running = self._cache[key]
            slot = m.label_offset[self.i] + limit
            ok = (limit >= 0) & (limit < self.length)
            return np.where(ok, running[np.clip(slot, 0, max(n - 1, 0))] if n else -1, -1)
        key = ("first", labels)
        if key not in self._cache:  # per match: its first slot of the set, relative
            firsts = self._extents()[0][:, sorted(labels)]
            big = np.iinfo(np.int64).max
            low = np.where(firsts >= 0, firsts, big).min(axis=1)
            self._cache[key] = np.where(low < big, low, -1)
        first_rel = self._cache[key][self.i]
        return np.where((first_rel >= 0) & (first_rel <= limit), first_rel, -1)

    def row_local(self, expr: ir.Node, pos: np.ndarray):
        if isinstance(expr, ir.Col):
            if expr.index not in self.colmap:
                raise _NotVectorizable()
            column = self.table.column(self.colmap[expr.index])
            present = pos >= 0
            taken = column.take(pa.array(np.where(present, pos, 0)))
            null = self.o.null_row[expr.index] if expr.index < len(self.o.null_row) else None
            fill = pa.scalar(null, type=column.type) if null is not None else pa.nulls(1, column.type)[0]
            return pc.if_else(pa.array(present), taken, fill)
        if isinstance(expr, ir.Classifier):
            rel = pos - self.start
            visible = (pos >= 0) & (rel >= 0) & (rel < self.length)
            slot = np.where(visible, self.m.label_offset[self.i] + rel, 0)
            codes = self.m.labels[slot].astype(np.int32) if len(self.m.labels) else np.zeros(len(pos), np.int32)
            indices = pa.array(codes, mask=~visible)
            return pc.take(self.o.label_dict, indices)
        if isinstance(expr, ir.MatchNumber):
            return pa.array(self.m.number[self.i])
        if isinstance(expr, ir.Const):
            return const_array(expr, len(pos))
        if isinstance(expr, (ir.Op, ir.Fallback)):
            return self.combine(expr, [self.row_local(a, pos) for a in expr.args])
        raise _NotVectorizable()

    # -- aggregates
    def aggregate(self, node: ir.Agg):
        if node.filter is not None or node.distinct:
            raise _NotVectorizable()
        if not node.star:
            if node.func in ("list", "string_agg"):
                return self.collect(node)
            return self.reduce(node)
        m = self.m
        limit = self.cur - self.start if node.running else self.length - 1
        if node.labels is None:
            return pa.array(np.maximum(limit + 1, 0), pa.int64())
        flat = m.labels
        n = len(flat)
        member = np.zeros(int(flat.max(initial=0)) + 1 if n else 1, bool)
        for l in node.labels:
            if l < len(member):
                member[l] = True
        inside = (member[flat] if n else np.zeros(0, bool)).astype(np.int64)
        csum = np.concatenate([[0], np.cumsum(inside)])
        base = m.label_offset[self.i]
        upto = np.clip(limit + 1, 0, None)
        return pa.array(csum[base + upto] - csum[base], pa.int64())

    def reduce(self, node: ir.Agg):
        """count/sum/avg/min/max of a column over the match rows of the label set: a running
        reduction per match over its slots, read at each output row's last visible slot."""
        func = node.func
        if func not in _REDUCERS or len(node.args) != 1:
            raise _NotVectorizable()
        values, valid = self.slot_values(node.args[0])
        if node.labels is not None:
            valid &= self._inside(node.labels)
        m = self.m
        limit = self.cur - self.start if node.running else self.length - 1
        upto = np.clip(limit + 1, 0, self.length)
        slot = np.where(upto > 0, m.label_offset[self.i] + upto - 1, 0)
        if func == "count":
            csum = np.concatenate([[0], np.cumsum(valid, dtype=np.int64)])
            base = m.label_offset[self.i]
            return pa.array(csum[base + upto] - csum[base], pa.int64())
        boolean = func in ("bool_and", "bool_or")
        if boolean:  # every/any: the running min/max of the booleans as 0/1
            values = self.slot_booleans(node.args[0])
            func = "min" if func == "bool_and" else "max"
        if values is None:
            raise _NotVectorizable()
        integer = values.dtype == np.int64
        if integer and func in ("sum", "avg"):
            # the evaluator sums Python ints (never overflowing); int64 must not overflow either,
            # and an average divides the sum as a float only while it is exact
            bound = 1 << (53 if func == "avg" else 62)
            used = values[valid]
            biggest = max(int(used.max(initial=0)), -int(used.min(initial=0)))
            if biggest * int(self.m.length.max(initial=0)) >= bound:
                raise _NotVectorizable()
        key = ("sum" if func == "avg" else func, node.args[0], node.labels)
        if key not in self._cache:
            offsets, lengths = m.label_offset, m.length
            if func in ("sum", "avg"):
                self._cache[key] = running_sum(values, valid, offsets, lengths) + (None,)
            else:
                self._cache[key] = running_extreme(values, valid, offsets, lengths, func == "max")
        acc, cnt, nan = self._cache[key]
        if not self.n_slots:
            return pa.nulls(len(self.i), pa.float64() if func == "avg" or not integer else pa.int64())
        got = acc[slot]
        count = np.where(upto > 0, cnt[slot], 0)
        if boolean:
            return pa.array(got != 0, mask=count == 0)
        if func == "avg":
            got = got.astype(np.float64) / np.maximum(count, 1)
        elif nan is not None and not integer:
            got = np.where(nan[slot], np.nan, got)
        return pa.array(got, mask=count == 0)

    def collect(self, node: ir.Agg):
        """array_agg (``list``) and string_agg of a column: each output row's visible match rows of
        the label set, in match order, taken from the column at once (array_agg keeps NULLs,
        string_agg skips them; no row gives NULL)."""
        if len(node.args) != 1 or not isinstance(node.args[0], ir.Col) or node.args[0].index not in self.colmap:
            raise _NotVectorizable()
        if not self.n_slots:
            raise _NotVectorizable()
        m = self.m
        rows = slot_rows(m.start, m.label_offset, m.length, self.n_slots)
        if (rows < 0).any():
            raise _NotVectorizable()
        taken = self.table.column(self.colmap[node.args[0].index]).take(pa.array(rows))
        if isinstance(taken, pa.ChunkedArray):
            taken = taken.combine_chunks()
        keep = self._inside(node.labels).copy() if node.labels is not None else np.ones(self.n_slots, bool)
        if node.func == "string_agg":
            if not _textual(taken.type):
                raise _NotVectorizable()
            keep &= np.asarray(taken.is_valid().to_numpy(zero_copy_only=False), bool)
        kept = np.flatnonzero(keep)  # slots in match order: matches are laid out one after another
        limit = self.cur - self.start if node.running else self.length - 1
        base = m.label_offset[self.i]
        upto = np.clip(limit + 1, 0, self.length)
        lo = np.searchsorted(kept, base)
        counts = np.searchsorted(kept, base + upto) - lo
        offsets = np.concatenate([[0], np.cumsum(counts)])
        if offsets[-1] > MAX_COLLECTED:  # RUNNING lists of long matches grow with the square
            raise _NotVectorizable()
        picks = np.repeat(lo - offsets[:-1], counts) + np.arange(offsets[-1])
        lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), taken.take(pa.array(kept[picks])))
        if node.func == "string_agg":
            lists = pc.binary_join(lists, node.extra[0] if node.extra else ",")
        return pc.if_else(pa.array(counts == 0), pa.nulls(len(counts), lists.type), lists)

    def slot_booleans(self, arg: ir.Node) -> np.ndarray:
        """A BOOLEAN argument's values at every match slot as int64 0/1 (NULLs as 0)."""
        self.slot_values(arg)  # fills the cache, checks the column
        key = ("slot booleans", arg.index)
        if key not in self._cache:
            m = self.m
            rows = slot_rows(m.start, m.label_offset, m.length, self.n_slots)
            taken = self.table.column(self.colmap[arg.index]).take(pa.array(rows))
            if isinstance(taken, pa.ChunkedArray):
                taken = taken.combine_chunks()
            if not pa.types.is_boolean(taken.type):
                raise _NotVectorizable()
            self._cache[key] = np.asarray(taken.fill_null(False).to_numpy(zero_copy_only=False), np.int64)
        return self._cache[key]

    def slot_values(self, arg: ir.Node):
        """The argument's values at every match slot (NULLs as 0) and where they are not NULL:
        int64 for integer columns, float64 for DOUBLE, None (only the validity) for other types."""
        if not isinstance(arg, ir.Col) or arg.index not in self.colmap:
            raise _NotVectorizable()
        key = ("slot values", arg.index)
        if key not in self._cache:
            m = self.m
            rows = slot_rows(m.start, m.label_offset, m.length, self.n_slots)
            if (rows < 0).any():
                raise _NotVectorizable()
            column = self.table.column(self.colmap[arg.index])
            taken = column.take(pa.array(rows))
            if isinstance(taken, pa.ChunkedArray):
                taken = taken.combine_chunks()
            valid = np.asarray(taken.is_valid().to_numpy(zero_copy_only=False), bool)
            typ = taken.type
            if pa.types.is_integer(typ):
                try:
                    values = taken.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    values = None  # UBIGINT beyond int64: sums and extremes left to the evaluator
            elif pa.types.is_float64(typ):
                values = taken.fill_null(0.0).to_numpy(zero_copy_only=False)
            else:
                values = None  # only its validity is used (count(x))
            self._cache[key] = (values, valid)
        values, valid = self._cache[key]
        return values, valid.copy()

    # -- operators, evaluated by DuckDB over the whole column
    def combine(self, node, args: list):
        if isinstance(node, ir.Op) and node.op in _ARROW_OPS and len(args) == 2:
            a, b = args
            if _plain_number(a.type) and _plain_number(b.type) and (pa.types.is_floating(a.type) or
                                                                      pa.types.is_floating(b.type)
                                                                      or node.op in _COMPARE_OPS):
                # float arithmetic means the same in Arrow and DuckDB, comparisons once NaN is
                # ordered as DuckDB orders it; integer arithmetic is left to DuckDB (its overflow
                # checks and result types)
                if node.op in _COMPARE_OPS:
                    return arrow_eval.duck_compare(node.op, a, b)
                return _ARROW_OPS[node.op](a, b)
        duck = self.o.duck
        if duck is None:
            raise _NotVectorizable()
        if isinstance(node, ir.Fallback):
            if not node.template.endswith(" FROM " + H.ARGS):
                raise _NotVectorizable()
            sql = node.template
        else:
            expr = _op_sql(node.op, len(args))
            if expr is None:
                raise _NotVectorizable()
            sql = f"SELECT {expr} FROM {H.ARGS}"
        columns = {H.arg(k): a for k, a in enumerate(args)}
        columns[H.ROW_INDEX] = pa.array(np.arange(len(self.i)))
        cur = duck.cursor()
        try:
            cur.register(H.ARGS, pa.table(columns))
            # an explicit order: DuckDB may scan the rows in parallel
            return cur.sql(sql + " ORDER BY " + H.ROW_INDEX).to_arrow_table().column(0)
        except duckdb.Error:
            raise _NotVectorizable() from None
        finally:
            cur.close()


MAX_COLLECTED = 1 << 26  # values in the lists of one array_agg/string_agg measure computed column-wise
_REDUCERS = {"count", "sum", "avg", "min", "max", "bool_and", "bool_or"}
_ARROW_OPS = {"add": pc.add, "sub": pc.subtract, "mul": pc.multiply, "eq": None, "ne": None, "lt": None,
              "le": None, "gt": None, "ge": None}  # comparisons: arrow_eval.duck_compare
_COMPARE_OPS = {"eq", "ne", "lt", "le", "gt", "ge"}


def _plain_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


_BINARY = {"eq": "=", "ne": "<>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "add": "+", "sub": "-",
           "mul": "*", "and": "AND", "or": "OR", "concat": "||"}


def _op_sql(op: str, n: int) -> str | None:
    a = [H.arg(k) for k in range(n)]
    if op in _BINARY and n == 2:
        return f"({a[0]} {_BINARY[op]} {a[1]})"
    if op == "div" and n == 2:
        return f"(CAST({a[0]} AS DOUBLE) / CAST({a[1]} AS DOUBLE))"
    if op == "not":
        return f"(NOT {a[0]})"
    if op == "neg":
        return f"(-{a[0]})"
    if op == "is_null":
        return f"({a[0]} IS NULL)"
    if op == "is_not_null":
        return f"({a[0]} IS NOT NULL)"
    if op == "distinct" and n == 2:
        return f"({a[0]} IS DISTINCT FROM {a[1]})"
    if op == "not_distinct" and n == 2:
        return f"({a[0]} IS NOT DISTINCT FROM {a[1]})"
    if op == "coalesce":
        return f"coalesce({', '.join(a)})"
    if op == "between" and n == 3:
        return f"({a[0]} BETWEEN {a[1]} AND {a[2]})"
    if op == "in" and n >= 2:
        return f"({a[0]} IN ({', '.join(a[1:])}))"
    if op == "case":
        whens = " ".join(f"WHEN {a[i]} THEN {a[i + 1]}" for i in range(0, n - 1, 2))
        default = f" ELSE {a[-1]}" if n % 2 else ""
        return f"(CASE {whens}{default} END)"
    return None


_INT128 = (-(1 << 127), (1 << 127) - 1)


def const_array(node: ir.Const, n: int) -> pa.Array:
    """``n`` copies of a constant, in an Arrow type that holds DuckDB's value exactly."""
    value = node.value
    typ = (node.type or "").upper()
    if typ in TEXT_CARRIED:
        raise _NotVectorizable()  # the evaluator's row-by-row values keep them exact
    if isinstance(value, uuid.UUID):
        return pa.array([str(value)] * n, pa.string())  # as DuckDB exports UUID
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 63):
        if typ == "UBIGINT" and 0 <= value < (1 << 64):
            return pa.array([value] * n, pa.uint64())
        return int128_array([value] * n)  # HUGEINT
    return pa.array([value] * n)


def int128_array(values: list) -> pa.Array:
    """Python ints (or None) as decimal128(38, 0), the Arrow form DuckDB gives HUGEINT: written as
    128-bit integers, since pyarrow refuses the values beyond 38 digits a HUGEINT can hold."""
    lo, hi = _INT128
    data = bytearray()
    valid = np.ones(len(values), bool)
    for i, v in enumerate(values):
        if v is None:
            valid[i] = False
            v = 0
        if not lo <= v <= hi:
            raise OverflowError(f"{v} is out of the range of HUGEINT")
        data += int(v).to_bytes(16, "little", signed=True)
    mask = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()) if not valid.all() else None
    return pa.Array.from_buffers(pa.decimal128(38, 0), len(values), [mask, pa.py_buffer(bytes(data))],
                                 null_count=int((~valid).sum()))


def _textual(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _cast(arr, typ: pa.DataType, name: str):
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type == typ:
        return arr
    try:
        return arr.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return _to_arrow(arr.to_pylist(), typ, name)


def _to_arrow(values: list, typ: pa.DataType, name: str) -> pa.Array:
    if _textual(typ):  # a number carried as text (TEXT_CARRIED)
        values = [v if v is None or isinstance(v, str) else str(v) for v in values]
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as err:
        if typ == pa.decimal128(38, 0) and all(v is None or type(v) is int for v in values):
            try:
                return int128_array(values)
            except OverflowError:
                pass
        if isinstance(err, OverflowError) or "out of bounds" in str(err) or "precision" in str(err):
            raise DataError(f"Measure {name!r}: a value is out of the range of its type ({typ})") from None
        raise DataError(f"Measure {name!r}: value does not fit its type {typ}: {err}") from None
