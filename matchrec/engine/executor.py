"""Run one planned MATCH_RECOGNIZE over ordered Arrow input and build the Arrow result.

Input batches arrive sorted by partition and order keys. They are cut into chunks of
complete partitions (boundaries found with Arrow compute, no per-row Python), so memory
holds one chunk and the largest partition at a time. Each chunk is matched by one of:

* the reference matcher (operators.matcher), driven by the standard's partition loop here;
* the compiled matcher (operators.vm), which runs that same loop over whole chunks;
* both: the compiled matcher on a relaxed pattern marks the start rows where a match is
  possible, and the reference matcher decides at those rows only.

Every path yields the same events (matches, empty matches, unmatched rows, in output order);
one output stage turns events into rows and evaluates MEASURES.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec import budget as work
from matchrec.budget import DEFAULT_MAX_MEMORY_MB, DEFAULT_MAX_STEPS
from matchrec.errors import DataError, OperationalError
from matchrec.operators import expr as ir
from matchrec.operators.matcher import ConsView, Matcher, MatchLimitExceeded
from matchrec.engine.output import EMPTY, MATCH, UNMATCHED, Matches, MeasureComputer, expand
from matchrec.planner.plan import Plan


class SkipError(DataError):
    pass


SKIP_ABSENT = "AFTER MATCH SKIP failed: pattern variable is not present in match"
CHUNK_ROWS = 1 << 20  # partitions are matched in chunks of about this many rows
SKIP_FIRST = "AFTER MATCH SKIP failed: cannot skip to first row of match"
INLINE_READ_ROWS = 100_000  # the input's first rows are read on the calling thread (see prefetched)


@dataclass
class Stats:
    rows_in: int = 0
    partitions: int = 0
    matches: int = 0
    empty_matches: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    match_seconds: float = 0.0
    output_seconds: float = 0.0
    fallback_calls: int = 0
    starts_tried: int = 0  # start rows the reference matcher was run from
    starts_pruned: int = 0  # start rows the compiled pre-filter ruled out
    matcher: str = "reference"
    extra: dict = field(default_factory=dict)


@dataclass
class Settings:
    max_threads: int = 1_000_000
    max_matches_per_partition: int = 50_000_000
    fast_path: int = 1  # 0: always use the reference matcher (for comparisons)
    prefilter: int = 1  # 0: never drop input rows before matching (for comparisons)
    max_partition_mb: int = 16_384  # input of one partition held in memory while it is matched
    threads: int = 2  # partitions matched in parallel by the compiled matcher
    # matcher steps of one statement (a step: one partial match taking one row; see matchrec.budget)
    max_steps: int = DEFAULT_MAX_STEPS
    max_memory_mb: int = DEFAULT_MAX_MEMORY_MB  # growth of the process's memory while a statement matches
    # storage nodes (compute-node connections only)
    pull_strategy: str = "auto"  # auto | pull_all | push_down | naive_dfs | dfs | dfs_stateful | push_pull
    round_trips: str = "auto"  # dual filtering rounds: auto (cost model) | always | never
    node_retries: int = 0  # further attempts at a request a node failed or timed out on
    node_retry_backoff_ms: int = 100  # wait before the first retry; doubled for each further one (at most 5 s)


@dataclass
class Event:
    kind: int  # MATCH, EMPTY or UNMATCHED
    start: int  # row in the partition
    labels: list[int]
    exclusions: list[tuple[int, int]]
    match_number: int


def partition_bounds(table: pa.Table, keys: list[int]) -> np.ndarray:
    """Row offsets where partitions start, plus the table length."""
    n = table.num_rows
    if n == 0:
        return np.array([0], np.int64)
    change = np.zeros(n - 1, dtype=bool)
    for k in keys:
        col = table.column(k)
        if n > 1 and pa.types.is_nested(col.type):
            # Arrow has no equality kernel for LIST, STRUCT or MAP keys: compare their values
            values = col.to_pylist()
            change |= np.fromiter((values[i + 1] != values[i] for i in range(n - 1)), bool, n - 1)
        elif n > 1:
            a, b = col.slice(1), col.slice(0, n - 1)
            same = pc.fill_null(pc.equal(a, b), False)
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            change |= ~pc.or_(same, both_null).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(change) + 1
    return np.concatenate([[0], starts, [n]]).astype(np.int64)


class PartitionRunner:
    """Matches chunks of partitions for one plan and accumulates the output."""

    def __init__(self, plan: Plan, fallback: Callable, arrow_types: list[pa.DataType],
                 settings: Settings | None = None, null_row: list | None = None, fast=None, duck=None,
                 layout=None):
        self.plan = plan
        self.settings = settings or Settings()
        self.matcher = Matcher(plan.program, plan.history_dependent, self.settings.max_threads, work.current())
        self.ctx = ir.Context(plan.labels, fallback)
        self.defines = [ir.compile_node(d) if d is not None else None for d in plan.defines]
        self.measures = [ir.compile_node(m.node) for m in plan.measures]
        self.arrow_types = arrow_types  # per measure
        self.used = sorted(ir.columns_of(list(plan.defines) + [m.node for m in plan.measures]))
        self.n_input = len(plan.input_columns)
        self.n_cols = self.n_input + len(plan.pushed)
        self.within = plan.within_sql is not None
        self.stats = Stats()
        self.chunks: list[pa.Table] = []
        self.null_row: list = null_row if null_row is not None else [None] * self.n_cols
        self.fast = fast  # engine.fast.CompiledMatcher or None
        # plan column -> column of the input chunks; WITHIN key and bound columns
        self.colmap = layout.colmap if layout is not None else {i: i for i in range(self.n_cols)}
        self.within_cols = layout.within if layout is not None else \
            ((self.n_cols, self.n_cols + 1) if self.within else None)
        self.computer = MeasureComputer([m.node for m in plan.measures], self.measures, plan.labels,
                                        arrow_types, [m.name for m in plan.measures], fallback, self.null_row,
                                        duck)
        if fast is not None:
            self.stats.matcher = "compiled" if fast.exact else "compiled pre-filter + reference"

    # ------------------------------------------------------------------ chunks
    def run_chunk(self, table: pa.Table, bounds: np.ndarray) -> None:
        n_parts = len(bounds) - 1
        self.stats.partitions += n_parts
        self.stats.rows_in += table.num_rows
        started = time.perf_counter()
        matches = None
        if self.fast is not None and self.fast.exact:
            matches = self.fast.matches(table, bounds, self.settings)  # None: the reference must decide
        if matches is None:
            possible = None
            if self.fast is not None and not self.fast.exact:
                possible = self.fast.possible_starts(table, bounds, self.settings)
            per_part = []
            for p in range(n_parts):
                lo, hi = int(bounds[p]), int(bounds[p + 1])
                per_part.append(self.reference_events(table.slice(lo, hi - lo),
                                                      None if possible is None else possible[lo:hi]))
            matches = events_to_matches(per_part, bounds)
        self.stats.match_seconds += time.perf_counter() - started
        started = time.perf_counter()
        self.emit(table, matches)
        self.stats.output_seconds += time.perf_counter() - started

    # ------------------------------------------------------------------ reference matching
    def reference_events(self, table: pa.Table, possible: np.ndarray | None) -> list[Event]:
        """The standard's partition loop with the reference matcher, on one partition."""
        plan, ctx = self.plan, self.ctx
        n = table.num_rows
        cols: list = [None] * self.n_cols
        for i in self.used:
            cols[i] = table.column(self.colmap[i]).to_pylist()
        ctx.cols, ctx.null_row, ctx.n = cols, self.null_row, n
        within_ok = None
        if self.within:
            wkey = table.column(self.within_cols[0]).to_pylist()
            wend = table.column(self.within_cols[1]).to_pylist()
            desc = plan.order_by[0][1]

            def within_ok(start: int, row: int) -> bool:
                key, bound = wkey[row], wend[start]
                if key is None or bound is None:
                    return False
                return key >= bound if desc else key <= bound

        evaluate = define_evaluator(self.defines, ctx)

        events: list[Event] = []
        unmatched = plan.spec.rows_per_match == "all" and plan.spec.empty_matches == "unmatched"
        skip = plan.spec.skip.kind
        pos, match_number, last_matched = 0, 1, -1
        matches_here = 0
        while pos < n:
            if possible is not None and not possible[pos]:
                self.stats.starts_pruned += 1
                result = None
            else:
                self.stats.starts_tried += 1
                ctx.start, ctx.match_number = pos, match_number
                try:
                    result = self.matcher.find(pos, n, evaluate, within_ok)
                except MatchLimitExceeded as err:
                    raise _thread_limit(err.setting, err.limit) from None
            if result is None:
                if unmatched and pos > last_matched:
                    events.append(Event(UNMATCHED, pos, [], [], 0))
                pos += 1
                continue
            matches_here += 1
            if matches_here > self.settings.max_matches_per_partition:
                raise _match_limit(self.settings.max_matches_per_partition)
            labels = result.labels
            events.append(Event(MATCH if labels else EMPTY, pos, labels, result.exclusions, match_number))
            match_number += 1
            if not labels:
                pos += 1
                continue
            end = pos + len(labels) - 1
            last_matched = max(last_matched, end)
            pos = self._next_start(skip, pos, labels, end)
        return events

    def _next_start(self, skip: str, start: int, labels: list[int], end: int) -> int:
        if skip == "past_last":
            return end + 1
        if skip == "next_row":
            return start + 1
        targets = self.plan.skip_labels
        rows = [i for i, label in enumerate(labels) if label in targets]
        if not rows:
            raise SkipError(SKIP_ABSENT)
        target = start + (rows[0] if skip == "to_first" else rows[-1])
        if target == start:
            raise SkipError(SKIP_FIRST)
        return target

    # ------------------------------------------------------------------ output
    def emit(self, table: pa.Table, m: Matches) -> None:
        """Output rows and MEASURES for the matches of a chunk."""
        spec = self.plan.spec
        kinds = m.kind
        self.stats.matches += int(np.count_nonzero(kinds == MATCH))
        self.stats.empty_matches += int(np.count_nonzero(kinds == EMPTY))
        rows = expand(m, spec.rows_per_match == "one", spec.empty_matches == "omit")
        n = len(rows.match)
        if n == 0:
            return
        self.stats.rows_out += n
        measures = self.computer.compute(table, self.colmap, m, rows)
        taken = table.take(pa.array(rows.source, pa.int64()))
        arrays, names = [], []
        for col in self.plan.output:
            names.append(f"c{len(names)}")
            if col.source == "input":
                arrays.append(taken.column(self.colmap[col.index]))
            elif col.source == "const":
                arrays.append(pa.array(np.ones(n, bool)))
            else:
                arrays.append(measures[col.index])
        self.chunks.append(pa.table(arrays, names=names))

    def result(self, schema: pa.Schema) -> pa.Table:
        if not self.chunks:
            return schema.empty_table()
        tables = [t.cast(schema) if t.schema != schema else t for t in self.chunks]
        return pa.concat_tables(tables)


def events_to_matches(per_part: list[list[Event]], bounds: np.ndarray) -> Matches:
    """The reference matcher's events (partition-relative) as the arrays of the output stage."""
    kind, start, length, number, offset, lo, hi = [], [], [], [], [], [], []
    excl: dict = {}
    labels: list[int] = []
    for p, events in enumerate(per_part):
        base, end = int(bounds[p]), int(bounds[p + 1])
        for ev in events:
            kind.append(ev.kind)
            start.append(base + ev.start)
            length.append(len(ev.labels))
            number.append(ev.match_number)
            offset.append(len(labels))
            labels += ev.labels
            lo.append(base)
            hi.append(end)
            if ev.exclusions:
                excl[len(kind) - 1] = ev.exclusions
    return Matches(np.array(kind, np.int8), np.array(start, np.int64), np.array(length, np.int64),
                   np.array(number, np.int64), np.array(offset, np.int64), np.array(labels, np.int16),
                   np.array(lo, np.int64), np.array(hi, np.int64), excl)


def _thread_limit(setting: str, limit: int) -> OperationalError:
    return OperationalError(f"Pattern matching needed more than {limit} simultaneous threads at one row; "
                            f"simplify the pattern or raise the limit with SET {setting} = <n>")


def _match_limit(limit: int) -> OperationalError:
    return OperationalError(f"A partition produced more than {limit} matches; raise the limit with "
                            f"SET matchrec_max_matches_per_partition = <n>")


def prefetched(reader, depth: int = 2, interrupt: Callable[[], None] | None = None, inline_rows: int = 0):
    """The batches of ``reader``, read ahead by a thread so that DuckDB produces the next batch
    while the caller matches this one (the fetch releases the GIL). At most ``depth`` batches
    wait; an error in the reader surfaces here, and a caller that stops early stops the thread.
    An exception (Ctrl-C) while waiting for a batch calls ``interrupt`` (DuckDB's), so that the
    thread is not waited for until DuckDB finishes a long sort on its own.

    The first ``inline_rows`` rows are read on the calling thread: a small input is then read
    whole without a thread to start and hand batches over (DuckDB's own interrupt reaches a
    fetch on this thread too); the thread takes over from the batch that passes the count."""
    batches = iter(reader)
    seen = 0
    while seen < inline_rows:
        batch = next(batches, None)
        if batch is None:
            return
        seen += batch.num_rows
        if seen >= inline_rows:
            yield from _read_ahead(batches, depth, interrupt, batch)
            return
        yield batch
    yield from _read_ahead(batches, depth, interrupt)


def _read_ahead(batches, depth: int, interrupt: Callable[[], None] | None, first=None):
    """``first`` (when given), then the batches of the iterator ``batches`` read by a thread."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def pull():
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        slots.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            item = done
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
            item = err
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    thread = threading.Thread(target=pull, name="matchrec-read", daemon=True)
    thread.start()
    try:
        if first is not None:
            yield first
        while True:
            try:
                item = slots.get()
            except BaseException:
                if interrupt is not None and thread.is_alive():
                    interrupt()
                raise
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def stream_chunks(reader, key_indexes: list[int], on_chunk: Callable[[pa.Table, np.ndarray], None],
                  max_bytes: int | None = None, interrupt: Callable[[], None] | None = None) -> None:
    """Feed chunks of complete partitions of an ordered batch stream to ``on_chunk``.

    The rows of the last partition of a batch may continue in the next batch, so they wait;
    without PARTITION BY the whole input is one partition. A partition larger than
    ``max_bytes`` raises OperationalError.
    """
    pending: list[pa.RecordBatch] = []
    pending_rows = pending_bytes = 0
    for batch in prefetched(reader, interrupt=interrupt, inline_rows=INLINE_READ_ROWS):
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        pending_rows += batch.num_rows
        pending_bytes += batch.nbytes
        if key_indexes and pending_rows >= CHUNK_ROWS:  # per-chunk costs favour chunks of many rows
            table = pa.Table.from_batches(pending).combine_chunks()
            bounds = partition_bounds(table, key_indexes)
            last = int(bounds[-2])
            if last > 0:
                on_chunk(table.slice(0, last), bounds[:-1])
            rest = table.slice(last)
            pending = rest.to_batches()
            pending_rows, pending_bytes = rest.num_rows, rest.nbytes
        if max_bytes is not None and pending_bytes > max_bytes:
            raise OperationalError(
                f"One partition of the input needs more than {max_bytes >> 20} MB in memory; add PARTITION BY, "
                f"filter the input, or raise the limit with SET matchrec_max_partition_mb = <n>")
    if pending_rows:
        table = pa.Table.from_batches(pending).combine_chunks()
        bounds = partition_bounds(table, key_indexes) if key_indexes else np.array([0, table.num_rows], np.int64)
        on_chunk(table, bounds)


def run_plan(plan: Plan, reader, fallback, arrow_types, schema: pa.Schema, settings: Settings | None = None,
             null_row: list | None = None, fast=None, duck=None, layout=None) -> tuple[pa.Table, Stats]:
    with work.statement(settings):
        runner = PartitionRunner(plan, fallback, arrow_types, settings, null_row, fast, duck, layout)
        started = time.perf_counter()
        settings = runner.settings
        stream_chunks(reader, [runner.colmap[i] for i in plan.partition_by], runner.run_chunk,
                      settings.max_partition_mb << 20, getattr(duck, "interrupt", None))
    runner.stats.seconds = time.perf_counter() - started
    runner.stats.fallback_calls = getattr(fallback, "calls", 0)
    runner.stats.extra["measures computed column-wise"] = runner.computer.vectorized
    runner.stats.extra["measures computed row by row"] = runner.computer.row_by_row
    return runner.result(schema), runner.stats


def define_evaluator(defines: list, ctx) -> Callable:
    """``evaluate(label, node, row)``: whether row ``row`` may take ``label`` in the thread whose
    history is ``node`` (a variable without DEFINE always may)."""
    def evaluate(label: int, node, row: int) -> bool:
        fn = defines[label]
        if fn is None:
            return True
        ctx.view = ConsView(node)
        ctx.cur = row
        ctx.classifier_visible = node.length
        return fn(ctx, row) is True
    return evaluate
