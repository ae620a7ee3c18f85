"""Run one planned MATCH_RECOGNIZE over ordered Arrow input and build the Arrow result.

Input batches arrive sorted by partition and order keys; each partition is matched as soon
as it is complete, so memory holds one partition (plus the output) at a time. The matching
itself is operators.matcher; this module owns the partition loop of the standard: candidate
start rows, match numbers, AFTER MATCH SKIP, and the rows each ROWS PER MATCH mode emits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from matchrec.errors import DataError, OperationalError
from matchrec.operators import expr as ir
from matchrec.operators.matcher import ConsView, ListView, Matcher, MatchLimitExceeded
from matchrec.planner.plan import Plan


class SkipError(DataError):
    pass


@dataclass
class Stats:
    rows_in: int = 0
    partitions: int = 0
    matches: int = 0
    empty_matches: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    fallback_calls: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class Settings:
    max_threads: int = 1_000_000
    max_matches_per_partition: int = 50_000_000
    fast_path: int = 1  # 0: always use the reference matcher (for comparisons)


def _columns_used(plan: Plan) -> set[int]:
    used: set[int] = set()

    def walk(n):
        if isinstance(n, ir.Col):
            used.add(n.index)
        for child in getattr(n, "args", ()) or ():
            walk(child)
        if isinstance(n, ir.At):
            walk(n.expr)
        if isinstance(n, ir.Agg) and n.filter is not None:
            walk(n.filter)
    for node in plan.defines:
        if node is not None:
            walk(node)
    for m in plan.measures:
        walk(m.node)
    return used


class PartitionRunner:
    """Matches partitions of one plan and accumulates the output."""

    def __init__(self, plan: Plan, fallback: Callable, arrow_types: list[pa.DataType],
                 settings: Settings | None = None, null_row: list | None = None):
        self.plan = plan
        self.settings = settings or Settings()
        self.matcher = Matcher(plan.program, plan.history_dependent, self.settings.max_threads)
        self.ctx = ir.Context(plan.labels, fallback)
        self.defines = [ir.compile_node(d) if d is not None else None for d in plan.defines]
        self.measures = [ir.compile_node(m.node) for m in plan.measures]
        self.arrow_types = arrow_types  # per measure
        self.used = sorted(_columns_used(plan))
        self.n_input = len(plan.input_columns)
        self.n_cols = self.n_input + len(plan.pushed)
        self.within = plan.within_sql is not None
        self.stats = Stats()
        self.chunks: list[pa.Table] = []
        self.null_row: list = null_row if null_row is not None else [None] * self.n_cols

    # ------------------------------------------------------------------ per partition
    def run_partition(self, table: pa.Table) -> None:
        """Match one partition (``table`` holds input columns, pushed columns, then WITHIN helpers)."""
        plan, ctx = self.plan, self.ctx
        n = table.num_rows
        self.stats.partitions += 1
        self.stats.rows_in += n
        cols: list[list] = [None] * self.n_cols  # type: ignore[list-item]
        for i in self.used:
            cols[i] = table.column(i).to_pylist()
        ctx.cols, ctx.null_row, ctx.n = cols, self.null_row, n
        within_ok = None
        if self.within:
            wkey = table.column(self.n_cols).to_pylist()
            wend = table.column(self.n_cols + 1).to_pylist()
            desc = plan.order_by[0][1]

            def within_ok(start: int, row: int) -> bool:
                key, bound = wkey[row], wend[start]
                if key is None or bound is None:
                    return False
                return key >= bound if desc else key <= bound

        defines = self.defines

        def evaluate(label: int, node, row: int) -> bool:
            fn = defines[label]
            if fn is None:
                return True
            ctx.view = ConsView(node)
            ctx.cur = row
            ctx.classifier_visible = node.length
            return fn(ctx, row) is True

        out_rows: list[int] = []  # row of the partition each output row comes from
        out_measures: list[list] = [[] for _ in self.measures]
        one_row = plan.spec.rows_per_match == "one"
        empty_mode = plan.spec.empty_matches
        skip = plan.spec.skip.kind
        pos, match_number, last_matched = 0, 1, -1
        matches_here = 0
        while pos < n:
            ctx.start, ctx.match_number = pos, match_number
            try:
                result = self.matcher.find(pos, n, evaluate, within_ok)
            except MatchLimitExceeded as err:
                raise OperationalError(
                    f"Pattern matching needed more than {err.limit} simultaneous threads at one row; "
                    f"simplify the pattern or raise the limit with SET {err.setting} = <n>") from None
            if result is None:
                if not one_row and empty_mode == "unmatched" and pos > last_matched:
                    out_rows.append(pos)
                    for values in out_measures:
                        values.append(None)
                pos += 1
                continue
            matches_here += 1
            if matches_here > self.settings.max_matches_per_partition:
                raise OperationalError(
                    f"A partition produced more than {self.settings.max_matches_per_partition} matches; raise the "
                    f"limit with SET matchrec_max_matches_per_partition = <n>")
            labels = result.labels
            if not labels:
                self.stats.empty_matches += 1
                if one_row or empty_mode != "omit":
                    self._emit(pos, [], pos - 1, match_number, out_rows, out_measures, pos)
                match_number += 1
                pos += 1
                continue
            self.stats.matches += 1
            end = pos + len(labels) - 1
            if one_row:
                self._emit(pos, labels, end, match_number, out_rows, out_measures, pos)
            else:
                excluded = set()
                for a, b in result.exclusions:
                    excluded.update(range(pos + a, pos + b))
                for row in range(pos, end + 1):
                    if row not in excluded:
                        self._emit(pos, labels, row, match_number, out_rows, out_measures, row)
            last_matched = max(last_matched, end)
            match_number += 1
            pos = self._next_start(skip, pos, labels, end)
        self.stats.rows_out += len(out_rows)
        if out_rows:
            self._append_output(table, out_rows, out_measures)

    def _emit(self, start, labels, cur, match_number, out_rows, out_measures, source_row) -> None:
        ctx = self.ctx
        ctx.start, ctx.match_number = start, match_number
        ctx.view = ListView(labels)
        ctx.cur = cur
        ctx.classifier_visible = len(labels)
        out_rows.append(source_row)
        for fn, values in zip(self.measures, out_measures):
            values.append(fn(ctx, cur))

    def _next_start(self, skip: str, start: int, labels: list[int], end: int) -> int:
        if skip == "past_last":
            return end + 1
        if skip == "next_row":
            return start + 1
        targets = self.plan.skip_labels
        rows = [i for i, label in enumerate(labels) if label in targets]
        if not rows:
            raise SkipError("AFTER MATCH SKIP failed: pattern variable is not present in match")
        target = start + (rows[0] if skip == "to_first" else rows[-1])
        if target == start:
            raise SkipError("AFTER MATCH SKIP failed: cannot skip to first row of match")
        return target

    def _append_output(self, table: pa.Table, rows: list[int], measures: list[list]) -> None:
        taken = table.take(pa.array(rows, pa.int64()))
        arrays, names = [], []
        for col in self.plan.output:
            names.append(f"c{len(names)}")
            if col.source == "input":
                arrays.append(taken.column(col.index))
            elif col.source == "const":
                arrays.append(pa.array([True] * len(rows), pa.bool_()))
            else:
                arrays.append(_to_arrow(measures[col.index], self.arrow_types[col.index], col.name))
        self.chunks.append(pa.table(arrays, names=names))

    def result(self, schema: pa.Schema) -> pa.Table:
        if not self.chunks:
            return schema.empty_table()
        tables = [t.cast(schema) if t.schema != schema else t for t in self.chunks]
        return pa.concat_tables(tables)


def _to_arrow(values: list, typ: pa.DataType, name: str) -> pa.Array:
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as err:
        raise DataError(f"Measure {name!r}: value does not fit its type {typ}: {err}") from None


def split_partitions(reader, key_indexes: list[int], on_partition: Callable[[pa.Table], None]) -> None:
    """Feed each complete partition of an ordered batch stream to ``on_partition``."""
    pending: list[pa.RecordBatch] = []
    pending_key = None
    for batch in reader:
        if batch.num_rows == 0:
            continue
        if not key_indexes:
            pending.append(batch)
            continue
        keys = list(zip(*(batch.column(i).to_pylist() for i in key_indexes)))
        start = 0
        for i in range(len(keys)):
            key = keys[i]
            if pending_key is None and not pending and i == start:
                pending_key = key
                continue
            if key != pending_key or _nan_split(key, pending_key):
                if i > start:
                    pending.append(batch.slice(start, i - start))
                on_partition(pa.Table.from_batches(pending))
                pending, start, pending_key = [], i, key
        if start < batch.num_rows:
            pending.append(batch.slice(start))
    if pending:
        on_partition(pa.Table.from_batches(pending))


def _nan_split(a, b) -> bool:
    return False


def run_plan(plan: Plan, reader, fallback, arrow_types, schema: pa.Schema,
             settings: Settings | None = None, null_row: list | None = None) -> tuple[pa.Table, Stats]:
    runner = PartitionRunner(plan, fallback, arrow_types, settings, null_row)
    started = time.perf_counter()
    split_partitions(reader, plan.partition_by, runner.run_partition)
    runner.stats.seconds = time.perf_counter() - started
    runner.stats.fallback_calls = getattr(fallback, "calls", 0)
    return runner.result(schema), runner.stats
