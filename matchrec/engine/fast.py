"""Feed chunks of partitions to the compiled matcher and turn its output into events.

The extra input columns (the label mask, the values register comparisons read, the WITHIN
bounds) arrive with the input from DuckDB; here they become numpy arrays, the matcher runs
(on two threads when a chunk holds enough partitions) and its flat output becomes Events.
"""
from __future__ import annotations

import decimal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec import budget as work
from matchrec.engine import arrow_eval
from matchrec.engine.executor import SKIP_ABSENT, SKIP_FIRST, SkipError, _match_limit, _thread_limit
from matchrec.engine.output import EMPTY, MATCH, UNMATCHED, Matches
from matchrec.operators import vm
from matchrec.parser import hidden as H
from matchrec.planner.fastpath import FastPlan

_SKIP = {"past_last": vm.SKIP_PAST_LAST, "next_row": vm.SKIP_NEXT_ROW, "to_first": vm.SKIP_TO_FIRST,
         "to_last": vm.SKIP_TO_LAST}
_KINDS = np.zeros(3, np.int8)
_KINDS[[vm.EV_MATCH, vm.EV_EMPTY, vm.EV_UNMATCHED]] = [MATCH, EMPTY, UNMATCHED]


def _empty_matches() -> Matches:
    z = np.zeros(0, np.int64)
    return Matches(np.zeros(0, np.int8), z, z, z, z, np.zeros(0, np.int16), z, z, {})
PARALLEL_MIN_ROWS = 200_000
# A chunk of at most this many rows is matched on the calling thread, its kernel held to
# INLINE_STEPS steps: handing a few milliseconds of work to a worker thread and waiting for it cost
# as much again. The kernel cannot see Ctrl-C, so the step cap bounds how long one may wait; a
# chunk that needs more steps is matched again, from its start, on a worker thread.
INLINE_MAX_ROWS = 100_000
INLINE_STEPS = 1_000_000


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _workers() -> ThreadPoolExecutor:
    """The process's matcher threads, started once: starting and joining threads per chunk was a
    fixed cost of ~1.5 ms per statement. Four, so that two statements on other connections can
    each run two pieces at once."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(4, thread_name_prefix="matchrec-match")
        return _POOL


class _Capped(Exception):
    """A kernel on the calling thread reached its step cap (INLINE_STEPS) before the end."""


class _OutOfRange(Exception):
    """An exact value (integer running sum, arithmetic, DECIMAL) left the range where the compiled
    matcher keeps it exactly: the reference matcher decides this chunk."""

# Python's sum() of floats, which the reference matcher's sum and avg use, compensates from 3.12 on
COMPENSATED_SUM = sys.version_info >= (3, 12)


def leaf_kind(leaf, typ: pa.DataType, func: str = "") -> str | None:
    """numeric_kind of a register program's leaf, or "decimal:<scale>" for a DECIMAL (kept as a
    scaled integer); an aggregate's argument must be a plain number (DuckDB's sum of times or min
    of booleans are not what the compiled matcher computes), bool_and's and bool_or's a boolean."""
    kind = decimal_kind(typ) or numeric_kind(typ)
    if getattr(leaf, "source", "row") == "agg" and kind is not None:
        if func in ("bool_and", "bool_or"):
            return kind if pa.types.is_boolean(typ) else None
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)):
            return None
    return kind


def decimal_kind(typ: pa.DataType) -> str | None:
    """"decimal:<scale>" for a DECIMAL whose values fit an int64 (HUGEINT, which DuckDB gives Arrow as
    decimal128(38, 0), and wider DECIMALs stay with the reference matcher)."""
    if pa.types.is_decimal(typ) and typ.precision <= 18 and 0 <= typ.scale <= 18:
        return f"decimal:{typ.scale}"
    return None


def _family(kind: str, typ: pa.DataType) -> str:
    """What the reference's Python operators see: 'int', 'float', 'decimal' or 'other' (times,
    booleans: no arithmetic)."""
    if kind.startswith("decimal"):
        return "decimal"
    if kind == "float":
        return "float"
    return "int" if pa.types.is_integer(typ) else "other"


def program_kinds(prog, types: list[pa.DataType], aggregates: list) -> list[str] | None:
    """The leaf kinds of a register program whose leaves have these Arrow types, or None when the
    compiled matcher cannot evaluate it exactly as the reference does: arithmetic only on numbers
    (integers with integers or floats, DECIMALs with DECIMALs or integers, division on integers and
    floats), no DECIMAL compared with a float or a time (the reference compares those exactly)."""
    kinds = [leaf_kind(leaf, t, aggregates[leaf.agg].func if leaf.source == "agg" else "")
             for leaf, t in zip(prog.leaves, types)]
    if None in kinds:
        return None
    stack: list[tuple[str, int]] = []  # (family, scale)
    for step in prog.code:
        if step[0] == "leaf":
            leaf, kind, typ = prog.leaves[step[1]], kinds[step[1]], types[step[1]]
            fam = _family(kind, typ)
            scale = int(kind.split(":")[1]) if fam == "decimal" else 0
            if leaf.source == "agg":
                func = aggregates[leaf.agg].func
                if func == "count":
                    fam, scale = "int", 0
                elif func in ("bool_and", "bool_or"):
                    fam, scale = "other", 0  # a boolean: compared, not computed with
                elif func == "avg":
                    fam, scale = "float", 0
            stack.append((fam, scale))
        elif step[0] == "arith":
            (fa, sa), (fb, sb) = stack.pop(-2), stack.pop()
            pair = {fa, fb}
            if step[1] == vm.P_DIV:
                if not pair <= {"int", "float"}:
                    return None
                stack.append(("float", 0))
            elif pair <= {"int", "float"}:
                stack.append(("float" if "float" in pair else "int", 0))
            elif pair <= {"int", "decimal"}:
                stack.append(("decimal", sa + sb if step[1] == vm.P_MUL else max(sa, sb)))
            else:
                return None
        elif step[0] == "neg":
            if stack[-1][0] not in ("int", "float", "decimal"):
                return None
        elif step[0] == "cmp":
            (fa, _), (fb, _) = stack.pop(-2), stack.pop()
            if "decimal" in (fa, fb) and not {fa, fb} <= {"int", "decimal"}:
                return None
            stack.append(("bool", 0))
        elif step[0] == "isnull":
            stack[-1] = ("bool", 0)
        elif step[0] in ("and", "or"):
            stack.pop()
            stack[-1] = ("bool", 0)
    return kinds


def numeric_kind(typ: pa.DataType) -> str | None:
    """'int' or 'float' when the compiled matcher can compare values of this Arrow type exactly."""
    if typ == pa.uint64():
        return None  # may not fit the matcher's int64
    if pa.types.is_integer(typ) or pa.types.is_timestamp(typ) or pa.types.is_date(typ) \
            or pa.types.is_duration(typ) or pa.types.is_time(typ) or pa.types.is_boolean(typ):
        return "int"
    if pa.types.is_floating(typ):
        return "float"
    return None


def compare_kind(a: pa.DataType, b: pa.DataType) -> str | None:
    """How a register comparison of values of these two types runs: 'int', 'float' (as order keys),
    'decimal:<scale>' (both sides as integers at the larger scale; a DECIMAL against an integer or
    a DECIMAL only) or 'string' (both sides as ranks in the chunk's sorted values, which order as
    Python orders strings: by code point); None when the compiled matcher cannot compare them."""
    if pa.types.is_decimal(a) or pa.types.is_decimal(b):
        kinds = [decimal_kind(t) or ("decimal:0" if pa.types.is_integer(t) and t != pa.uint64() else None)
                 for t in (a, b)]
        if None in kinds:
            return None
        return f"decimal:{max(int(k.split(':')[1]) for k in kinds)}"
    if all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in (a, b)):
        return "string"
    kinds = {numeric_kind(a), numeric_kind(b)}
    if None in kinds:
        return None
    return "float" if "float" in kinds else "int"


def _scale_of(typ: pa.DataType) -> int:
    return typ.scale if pa.types.is_decimal(typ) else 0


def _rescaled(values: np.ndarray, valid: np.ndarray, by: int) -> np.ndarray:
    """``values * 10**by``; _OutOfRange when a valid one would not fit an int64."""
    if by <= 0:
        return values
    factor = 10 ** by
    if np.any(np.abs(values[valid]) > (2 ** 62) // factor):
        raise _OutOfRange()
    return values * factor


def string_ranks(columns: list, extra: list[str]) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """(ranks, validity) of string columns in the sorted set of their values and ``extra``, and
    the ranks of ``extra``: equal strings get equal ranks, and ranks order as the strings do."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    arrays = [a.cast(pa.large_string()) for a in arrays]
    pool = pa.concat_arrays(arrays + [pa.array(extra, pa.large_string())])
    values = pc.unique(pc.drop_null(pool))
    values = values.take(pc.sort_indices(values))
    out = []
    for a in arrays:
        ranks = pc.fill_null(pc.index_in(a, value_set=values), 0).to_numpy(zero_copy_only=False)
        out.append((np.ascontiguousarray(ranks.astype(np.int64)),
                    np.ascontiguousarray(a.is_valid().to_numpy(zero_copy_only=False))))
    found = pc.index_in(pa.array(extra, pa.large_string()), value_set=values).to_pylist()
    return out, dict(zip(extra, found))


def _decimal_ints(arr: pa.Array) -> np.ndarray:
    """The unscaled values of a DECIMAL array as int64 (NULLs as 0); _OutOfRange when one does not fit."""
    arr = pc.fill_null(arr, pa.scalar(decimal.Decimal(0), arr.type))
    width = arr.type.byte_width // 8
    words = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset * width:(arr.offset + len(arr)) * width]
    words = words.reshape(-1, width)
    low = words[:, 0]
    if width > 1 and not np.array_equal(words[:, 1:], np.repeat((low >> 63)[:, None], width - 1, axis=1)):
        raise _OutOfRange()
    return low.copy()


def to_numpy(column, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, validity) of an Arrow column as int64 or float64 (a DECIMAL: its scaled integers)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    typ = arr.type
    if kind == "string":  # only for single values (a comparison's NULL row): columns are ranked together
        return np.array([str(x) if x is not None else "" for x in arr.to_pylist()]), np.ascontiguousarray(valid)
    if kind.startswith("decimal"):
        if pa.types.is_decimal(typ):
            values = _decimal_ints(arr)
        else:
            values = pc.fill_null(arr.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        values = _rescaled(values, valid, int(kind.split(":")[1]) - _scale_of(typ))
        return np.ascontiguousarray(values), np.ascontiguousarray(valid)
    if kind == "float":
        values = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    else:
        if pa.types.is_boolean(typ):
            arr = arr.cast(pa.int8())
        elif not pa.types.is_integer(typ):
            arr = arr.cast(pa.int64()) if not pa.types.is_date32(typ) else arr.cast(pa.int32())
        values = pc.fill_null(arr.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values), np.ascontiguousarray(valid)


def float_order_keys(values: np.ndarray) -> np.ndarray:
    """int64 keys that order float64 values as DuckDB does: -0.0 equals 0.0, every NaN is one
    value above +inf. The float's bits, with the magnitude bits of negatives flipped."""
    v = np.array(values, np.float64, copy=True)
    v[v == 0] = 0.0
    v[np.isnan(v)] = np.nan
    bits = v.view(np.int64)
    return bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


def first_labels_mask(program) -> int:
    """Labels of the MATCH instructions reachable from the start without consuming a row;
    0 when DONE is reachable there too (a match could be empty at any row)."""
    mask = 0
    for at in program.waits(0):
        ins = program.code[at]
        if ins.op == vm.DONE:
            return 0
        mask |= 1 << ins.a
    return mask


def shift_within_partitions(column, offset: int, bounds: np.ndarray) -> pa.Array:
    """``column`` read ``offset`` rows away (PREV: negative), NULL where that leaves the partition."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    k = abs(offset)
    if k >= n:
        return pa.nulls(n, arr.type)
    if offset < 0:
        shifted = pa.concat_arrays([pa.nulls(k, arr.type), arr.slice(0, n - k)])
        edges = bounds[:-1]  # the first k rows of every partition have no row k before them
    else:
        shifted = pa.concat_arrays([arr.slice(k), pa.nulls(k, arr.type)])
        edges = bounds[1:] - k  # nor do the last k rows a row k after them
    rows = (edges[:, None] + np.arange(k)).ravel()
    lo = np.repeat(bounds[:-1], k)
    hi = np.repeat(bounds[1:], k)
    rows = rows[(rows >= lo) & (rows < hi)]
    if len(rows) == 0:
        return shifted
    outside = np.zeros(n, bool)
    outside[rows] = True
    return pc.if_else(pa.array(outside), pa.scalar(None, arr.type), shifted)


class CompiledMatcher:
    """Runs operators.vm for one plan; column positions refer to the input query's columns."""

    def __init__(self, plan, fast: FastPlan, duck, compare_cols: list[tuple[int, int, str]],
                 compare_nulls: list, within_cols: tuple[int, int, str] | None, row_columns: dict[str, int],
                 read_mask_col: int, leaf_cols: list[int] = (), leaf_nulls: list = ()):
        self.fast = fast
        self.exact = fast.exact
        code = plan.program.code
        self.op = np.array([i.op for i in code], np.int32)
        self.ia = np.array([i.a for i in code], np.int32)
        self.ib = np.array([i.b for i in code], np.int32)
        labels_with_regs = {c.label for c in fast.compares} | {p.label for p in fast.programs}
        reach = plan.program.reachable_labels()
        self.keyed = np.array([bool(r & labels_with_regs) for r in reach], np.bool_)
        # per-thread words: LAST registers, then FIRST registers, then three per running aggregate,
        # then the windows of logical offsets (FIRST(V.x, n): count and row; LAST(V.x, n): n+1 rows),
        # then the labels of the last rows (PREV(CLASSIFIER(), n))
        n_last, n_first = len(fast.registers), len(fast.firsts)
        all_labels = (1 << len(plan.labels)) - 1
        init = [-1] * (n_last + n_first) + [0] * (3 * len(fast.aggregates))
        state = [(vm.S_FIRST, n_last + j, sum(1 << l for l in vs), 0, 0, 0) for j, vs in enumerate(fast.firsts)]
        state += [(0, 0, 0, 0, 0, 0)] * len(fast.aggregates)  # filled with the argument columns below
        window_state = []  # FastPlan.windows -> row of ``state``
        for kind, vs, n in fast.windows:
            window_state.append(len(state))
            mask = sum(1 << l for l in vs)
            if kind == "first":
                state.append((vm.S_NTH_FIRST, len(init), mask, n, 0, 0))
                init += [0, -1]
            else:
                state.append((vm.S_LAST_N, len(init), mask, n, 0, 0))
                init += [-1] * (n + 1)
        label_word = len(init)
        if fast.prev_label:
            state.append((vm.S_LABEL, label_word, all_labels, fast.prev_label, 0, 0))
            init += [-1] * fast.prev_label
        self.n_regs = len(init)
        sets = [sum(1 << l for l in s) for s in fast.registers] + [0] * (self.n_regs - n_last)
        self.reg_sets = np.array(sets or [0], np.int64)
        self.reg_init = np.array(init or [0], np.int64)
        self.duck = duck
        self.mask_sql = self._mask_sql(fast)
        self.arrow_masks = None  # [(label, evaluator)] when Arrow compute can take every chunk condition
        self.row_columns = row_columns  # input column name -> batch column
        self.read_mask_col = read_mask_col  # labels whose read-query conditions hold
        self.compare_cols = compare_cols
        self.within_cols = within_cols
        self.within_desc = bool(plan.order_by and plan.order_by[0][1])
        # comparison specs: (label, register, op, is_float, lhs index, rhs index, offset)
        ints, floats = 0, 0
        specs = []
        self.inull, self.inull_ok, self.fnull, self.fnull_ok = [], [], [], []
        # Floats are compared as their order keys (float_order_keys), so every comparison is an
        # integer one: the hot loop stays small, and NaN sorts as DuckDB sorts it.
        self.string_nulls = {}  # matrix row -> string a comparison reads on the NULL row (ranked per chunk)
        for c, (_, _, kind), null in zip(fast.compares, compare_cols, compare_nulls):
            specs.append((c.label, c.register, c.op, 0, ints, ints + 1, c.offset))
            if null is None:
                null_value = 0
            elif kind == "string":
                null_value = 0
                self.string_nulls[ints + 1] = str(null)
            elif kind == "float":
                null_value = int(float_order_keys(np.array([float(null)]))[0])
            else:
                null_value = int(null)
            self.inull += [0, null_value]
            self.inull_ok += [False, null is not None]
            ints += 2
        self.specs = np.array(specs, np.int64).reshape(-1, 7)
        # register programs: leaves take the next rows of the value matrices
        self.leaf_cols = []  # (batch column, matrix row, kind)
        leaves = []
        aggs = {"count": vm.A_COUNT, "sum": vm.A_SUM, "avg": vm.A_AVG, "min": vm.A_MIN, "max": vm.A_MAX,
                "bool_and": vm.A_MIN, "bool_or": vm.A_MAX}  # booleans as 0/1: every is min, any is max
        for leaf, col, null in zip((leaf for p in fast.programs for leaf in p.leaves), leaf_cols, leaf_nulls):
            is_float = leaf.kind == "float"
            mrow = floats if is_float else ints
            scale = int(leaf.kind.split(":")[1]) if leaf.kind.startswith("decimal") else 0
            reg, source, aux = leaf.register, vm.LEAF_ROW, 0
            if leaf.source == "first":
                reg, source, aux = n_last + leaf.register, vm.LEAF_FIRST, leaf.register
            elif leaf.source == "match_number":
                reg, source = -1, vm.LEAF_MATCH_NUMBER
            elif leaf.source == "prev_label":  # the labels' words hold the oldest first
                reg, source = label_word + fast.prev_label - leaf.offset, vm.LEAF_LABEL
            elif leaf.source == "nth":
                reg, source, aux = -1, vm.LEAF_NTH, window_state[leaf.register]
            elif leaf.source == "agg":
                spec = fast.aggregates[leaf.agg]
                aux = n_first + leaf.agg
                mask = all_labels if spec.labels is None else sum(1 << l for l in spec.labels)
                state[aux] = (aggs[spec.func], n_last + n_first + 3 * leaf.agg, mask, int(is_float), mrow, scale)
                reg, source = -1, vm.LEAF_AGG
                if spec.func == "count":
                    scale = 0
            leaves.append((int(is_float), mrow, reg, leaf.offset, source, aux, scale))
            if is_float:
                self.leaf_cols.append((col, floats, "float"))
                self.fnull.append(0.0 if null is None else float(null))
                self.fnull_ok.append(null is not None)
                floats += 1
            else:
                self.leaf_cols.append((col, ints, leaf.kind))
                self.inull.append(0 if null is None else int(null))
                self.inull_ok.append(null is not None)
                ints += 1
        self.pleaf = np.array(leaves, np.int64).reshape(-1, 7)
        self.state = np.array(state, np.int64).reshape(-1, 6) if state else None
        ops = {"leaf": vm.P_LEAF, "cmp": vm.P_CMP, "isnull": vm.P_ISNULL, "not": vm.P_NOT, "and": vm.P_AND,
               "or": vm.P_OR, "neg": vm.P_NEG}
        code, first, base = [], [0], 0
        by_label = {}

        def step_row(number, step):
            if step[0] == "leaf":
                return number, vm.P_LEAF, step[1] + base, 0, 0
            if step[0] == "arith":
                return number, step[1], 0, 0, 0
            return number, ops[step[0]], step[1] if len(step) > 1 else 0, 0, 0

        for number, prog in enumerate(fast.programs):
            steps = [step_row(number, step) for step in prog.code]
            by_label.setdefault(prog.label, []).extend(steps)
            base += len(prog.leaves)
        for label in range(len(plan.labels)):
            code += by_label.get(label, [])
            first.append(len(code))
        self.pcode = np.array(code, np.int64).reshape(-1, 5)
        self.pfirst = np.array(first, np.int64)
        self.n_ints, self.n_floats = ints, floats
        self.skip_kind = _SKIP[plan.spec.skip.kind]
        self.skip_mask = sum(1 << l for l in plan.skip_labels) if plan.skip_labels else 0
        unmatched = plan.spec.rows_per_match == "all" and plan.spec.empty_matches == "unmatched"
        self.empty_mode = 2 if unmatched else 0
        self.first_mask = first_labels_mask(plan.program)

    # ------------------------------------------------------------------ inputs
    @staticmethod
    def _mask_sql(fast: FastPlan) -> str | None:
        terms, constant = [], 0
        for label, sql in enumerate(fast.chunk_sql):
            if sql is None:
                constant |= 1 << label
            else:
                terms.append(f"(CASE WHEN {sql} THEN {1 << label} ELSE 0 END)")
        if not terms:
            return None
        return f"SELECT CAST({' + '.join(terms + [str(constant)])} AS BIGINT) AS m FROM " + H.CHUNK

    def _masks(self, table: pa.Table, bounds: np.ndarray) -> np.ndarray:
        """Per row, the labels whose row conditions hold: DuckDB over the chunk with PREV/NEXT
        columns shifted within partitions."""
        n = table.num_rows
        read = pc.fill_null(table.column(self.read_mask_col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if self.mask_sql is None:
            return np.ascontiguousarray(read)
        columns = {name: table.column(i) for name, i in self.row_columns.items()}
        for (name, offset), alias in self.fast.shifts.items():
            columns[alias] = shift_within_partitions(table.column(self.row_columns[name]), offset, bounds)
        if self.arrow_masks is None:  # decided once, on the first chunk's column types
            types = {name: col.type for name, col in columns.items()}
            compiled = [(label, arrow_eval.compile_condition(sql, types))
                        for label, sql in enumerate(self.fast.chunk_sql) if sql is not None]
            self.arrow_masks = compiled if all(fn is not None for _, fn in compiled) else []
        if self.arrow_masks:
            constant = sum(1 << label for label, sql in enumerate(self.fast.chunk_sql) if sql is None)
            chunk = arrow_eval.evaluate_masks(self.arrow_masks, columns, n, constant)
            if chunk is not None:
                return np.ascontiguousarray(read & chunk)
        # ROW_INDEX: the chunk's row numbers (also gives a condition without columns its rows)
        columns = {H.ROW_INDEX: pa.array(np.arange(n)), **columns}
        cur = self.duck.cursor()
        try:
            cur.register(H.CHUNK, pa.table(columns))
            ordered = cur.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
            sql = self.mask_sql
            if not ordered:  # rows must come back in chunk order
                sql += " ORDER BY " + H.ROW_INDEX
            result = cur.sql(sql).to_arrow_table().column(0)
        finally:
            cur.close()
        chunk = pc.fill_null(result, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.ascontiguousarray(read & chunk)

    def _arrays(self, table: pa.Table, bounds: np.ndarray) -> dict:
        n = table.num_rows
        masks = self._masks(table, bounds)
        ivals = np.zeros((max(self.n_ints, 1), n), np.int64)
        ivalid = np.zeros((max(self.n_ints, 1), n), np.bool_)
        fvals = np.zeros((max(self.n_floats, 1), n), np.float64)
        fvalid = np.zeros((max(self.n_floats, 1), n), np.bool_)
        inull = np.array(self.inull or [0], np.int64)
        for spec, (cur_col, other_col, kind) in zip(self.specs, self.compare_cols):
            lhs = int(spec[4])
            if kind == "string":
                extra = [self.string_nulls[lhs + 1]] if lhs + 1 in self.string_nulls else []
                ranked, extra_ranks = string_ranks([table.column(cur_col), table.column(other_col)], extra)
                (ivals[lhs], ivalid[lhs]), (ivals[lhs + 1], ivalid[lhs + 1]) = ranked
                if extra:
                    inull[lhs + 1] = extra_ranks[extra[0]]
                continue
            for k, col in ((lhs, cur_col), (lhs + 1, other_col)):
                values, valid = to_numpy(table.column(col), kind)
                ivals[k], ivalid[k] = (float_order_keys(values) if kind == "float" else values), valid
        for col, mrow, kind in self.leaf_cols:
            values, valid = to_numpy(table.column(col), kind)
            if kind == "float":
                fvals[mrow], fvalid[mrow] = values, valid
            else:
                ivals[mrow], ivalid[mrow] = values, valid
        has_within = self.within_cols is not None
        wi = np.zeros(1, np.int64)
        wf = np.zeros(1, np.float64)
        wkey_i, wend_i, wkey_f, wend_f = wi, wi, wf, wf
        wvalid = wend_valid = np.zeros(1, np.bool_)
        within_float = False
        if has_within:
            key_col, end_col, kind = self.within_cols
            key, wvalid = to_numpy(table.column(key_col), kind)
            end, wend_valid = to_numpy(table.column(end_col), kind)
            # writable copies of Arrow's read-only buffers: the kernel is compiled for writable arrays
            key, end = np.require(key, requirements="W"), np.require(end, requirements="W")
            within_float = kind == "float"
            if within_float:
                wkey_f, wend_f = key, end
            else:
                wkey_i, wend_i = key, end
        return dict(masks=np.ascontiguousarray(masks), ivals=ivals, ivalid=ivalid, fvals=fvals, fvalid=fvalid,
                    inull=inull, has_within=has_within, within_float=within_float, wkey_i=wkey_i, wend_i=wend_i,
                    wkey_f=wkey_f, wend_f=wend_f, wvalid=wvalid, wend_valid=wend_valid)

    # ------------------------------------------------------------------ running
    def _run(self, arrays: dict, bounds: np.ndarray, settings, probe: bool, n_rows: int, budget: work.Budget,
             spent: np.ndarray, worker: int, step_cap: int | None = None):
        """All events of the partitions in ``bounds`` (absolute rows), growing buffers as needed.
        ``step_cap``: steps after which _Capped is raised (when below what the budget has left)."""
        step_limit = budget.max_steps - budget.steps
        capped = step_cap is not None and step_cap < step_limit
        if capped:
            step_limit = step_cap
        rows = int(bounds[-1] - bounds[0])
        # a match holds an arena node per row and live thread: room for two per row of the longest partition
        # spares a long match restarts (an alternation in a loop keeps two threads)
        longest = int(np.diff(bounds).max()) if len(bounds) > 1 else 0
        caps = dict(events=rows + 16, labels=rows + 16, arena=max(1 << 16, 2 * longest + 16), visits=1 << 12,
                    threads=min(settings.max_threads, 1024))
        out = []
        possible = np.zeros(n_rows if probe else 1, np.uint8)
        part = 0
        n_parts = len(bounds) - 1
        inull = arrays["inull"]
        inull_ok = np.array(self.inull_ok or [False], np.bool_)
        fnull = np.array(self.fnull or [0.0], np.float64)
        fnull_ok = np.array(self.fnull_ok or [False], np.bool_)
        regs = max(self.n_regs, 1)
        buffers = None
        while part < n_parts:
            if buffers is None:
                t = caps["threads"] + 1
                buffers = dict(
                    ev=[np.empty(caps["events"], np.int64) for _ in range(6)],
                    labels=np.empty(caps["labels"], np.int16), exc=np.empty(caps["labels"], np.int64),
                    arena=(np.empty(caps["arena"], np.int32), np.empty(caps["arena"], np.int64),
                           np.empty(caps["arena"], np.int64)),
                    visits=(np.empty(caps["visits"], np.int64), np.empty((caps["visits"], regs), np.int64)),
                    threads=(np.empty(t, np.int32), np.empty(t, np.int64), np.empty((t, regs), np.int64),
                             np.empty(t, np.int32), np.empty(t, np.int64), np.empty((t, regs), np.int64)))
            b = buffers
            status, done, n_ev, n_lab, n_exc, detail = vm.run_partitions(
                self.op, self.ia, self.ib, self.keyed, self.n_regs, self.reg_sets, self.reg_init, self.state,
                COMPENSATED_SUM, arrays["masks"], bounds, part,
                self.specs if len(self.specs) else None, arrays["ivals"], arrays["ivalid"], arrays["fvals"],
                arrays["fvalid"], inull, inull_ok,
                fnull, fnull_ok, self.pcode if len(self.pcode) else None, self.pleaf, self.pfirst,
                arrays["has_within"],
                arrays["within_float"], arrays["wkey_i"], arrays["wend_i"], arrays["wkey_f"], arrays["wend_f"],
                arrays["wvalid"], arrays["wend_valid"], self.within_desc, self.skip_kind, self.skip_mask,
                self.empty_mode, probe, settings.max_threads, settings.max_matches_per_partition, self.first_mask,
                *b["ev"], b["labels"], b["exc"], possible, *b["arena"], *b["visits"], *b["threads"],
                budget.stop, spent, worker, step_limit)
            if n_ev or status == vm.OK:
                out.append(([a[:n_ev].copy() for a in b["ev"]], b["labels"][:n_lab].copy(), b["exc"][:n_exc].copy(),
                            n_ev, n_lab, n_exc, part, done))
            if status == vm.OK:
                break
            if status == vm.ERR_SKIP_ABSENT:
                raise SkipError(SKIP_ABSENT)
            if status == vm.ERR_SKIP_FIRST:
                raise SkipError(SKIP_FIRST)
            if status == vm.ERR_THREADS:
                raise _thread_limit("matchrec_max_threads", settings.max_threads)
            if status == vm.ERR_MATCHES:
                raise _match_limit(settings.max_matches_per_partition)
            if status == vm.ERR_STEPS:
                if capped:
                    raise _Capped()
                budget.halt(work.OUT_OF_STEPS)
                raise budget.error(work.OUT_OF_STEPS)
            if status == vm.ERR_STOPPED:
                raise budget.error()
            if status == vm.ERR_RANGE:
                raise _OutOfRange()
            grow = {vm.NEED_EVENTS: "events", vm.NEED_LABELS: "labels", vm.NEED_ARENA: "arena",
                    vm.NEED_VISITS: "visits", vm.NEED_THREADS: "threads"}[status]
            if done == part or grow in ("arena", "visits", "threads"):
                caps[grow] = max(caps[grow] * 4, detail * 2)
                if grow == "threads":
                    caps[grow] = min(caps[grow], settings.max_threads)
                buffers = None
            part = done
        return out, possible

    def matches(self, table: pa.Table, bounds: np.ndarray, settings) -> Matches | None:
        """The events of a chunk; None when an integer running sum of a DEFINE left the range the
        compiled matcher compares exactly (the reference matcher then matches the chunk)."""
        pieces = self._split(bounds, settings)
        try:
            arrays = self._arrays(table, bounds)  # a DECIMAL beyond int64 stops here
            results = [r[0] for r in self._in_workers(arrays, pieces, settings, False, table.num_rows)]
        except _OutOfRange:
            return None
        parts = []
        starts_of_parts = bounds[:-1]
        for result in results:
            for ev, labels_out, exc_out, n_ev, n_lab, n_exc, _, _ in result:
                kinds, starts, lens, mns, labs, excs = ev
                owner = np.searchsorted(starts_of_parts, starts, side="right") - 1
                exclusions = {}
                if n_exc:
                    ends = np.append(excs[1:], n_exc)
                    for j in np.flatnonzero(ends > excs):
                        flat = exc_out[int(excs[j]):int(ends[j])].tolist()
                        exclusions[int(j)] = [(flat[k], flat[k + 1]) for k in range(0, len(flat) - 1, 2)]
                parts.append(Matches(_KINDS[kinds], starts, lens, mns, labs, labels_out, bounds[owner],
                                     bounds[owner + 1], exclusions))
        if not parts:
            return Matches.concat([_empty_matches()])
        return Matches.concat(parts)

    def possible_starts(self, table: pa.Table, bounds: np.ndarray, settings) -> np.ndarray:
        try:
            arrays = self._arrays(table, bounds)
            (_, possible), = self._in_workers(arrays, [bounds], settings, True, table.num_rows)
        except _OutOfRange:  # a running sum the compiled matcher cannot keep: every row may start one
            return np.ones(table.num_rows, np.uint8)
        return possible

    def _in_workers(self, arrays: dict, pieces: list[np.ndarray], settings, probe: bool, n_rows: int) -> list:
        """``_run`` over each piece of partitions, each on a worker thread, while this thread waits;
        a small chunk (INLINE_MAX_ROWS) first on this thread, up to INLINE_STEPS steps.

        The kernels never return to Python on their own, so this thread watches for them: a
        KeyboardInterrupt (or a budget stop) reaching it sets the budget's stop flag, which the
        kernels poll, and it is raised once they have returned. The steps of all pieces are
        charged to the statement's budget."""
        budget = work.current()
        if len(pieces) == 1 and int(pieces[0][-1] - pieces[0][0]) <= INLINE_MAX_ROWS:
            spent = np.zeros(1, np.int64)
            try:
                result = self._run(arrays, pieces[0], settings, probe, n_rows, budget, spent, 0, INLINE_STEPS)
            except _Capped:
                # more work than a wait without Ctrl-C should hold: again, watched, on a worker; the
                # steps of the attempt are not charged, so the budget decides as on a worker alone
                budget.check_interrupt()
            else:
                budget.steps += int(spent.sum())
                return [result]
        spent = np.zeros(len(pieces), np.int64)
        pool = _workers()
        futures = []
        try:
            for k, b in enumerate(pieces):
                futures.append(pool.submit(self._run, arrays, b, settings, probe, n_rows, budget, spent, k))
            try:
                while wait(futures, timeout=0.05).not_done:
                    budget.check_interrupt()
            except BaseException as stopped:
                budget.halt(work.OUT_OF_MEMORY if isinstance(stopped, work.BudgetExceeded) else work.INTERRUPTED)
                raise
            return [f.result() for f in futures]
        finally:
            wait(futures)  # a stopped kernel returns within POLL_STEPS steps
            budget.steps += int(spent.sum())

    @staticmethod
    def _split(bounds: np.ndarray, settings) -> list[np.ndarray]:
        """Partition boundaries for each worker thread: halves by row count when it pays off."""
        threads = max(1, int(getattr(settings, "threads", 1)))
        n_parts = len(bounds) - 1
        total = int(bounds[-1] - bounds[0])
        if threads < 2 or n_parts < 2 or total < PARALLEL_MIN_ROWS:
            return [bounds]
        cut = int(np.searchsorted(bounds, bounds[0] + total // 2))
        cut = min(max(cut, 1), n_parts - 1)
        return [bounds[:cut + 1], bounds[cut:]]

