"""Run a window with row pattern recognition (SQL:2016 R020) over its input rows.

Every input row comes out once, with its partition position, its match's bounds and the
measures of its match. Row by row within a partition, as the standard's window frame
processing does: a row that an earlier match's AFTER MATCH SKIP passed over has no match;
any other row tries one match in its frame ``[row, frame end]``, starting at the row
(INITIAL) or at the first row of the frame where one is found (SEEK). The frame bounds the
match and every navigation: each frame is matched as if it were a partition of its own, so
the matchers and the output stage need nothing new beyond the per-match bounds they already
take. Empty matches and rows without a match get NULL measures and an empty frame for the
ordinary window functions over the window. The next row to try after a match is the row
after it (PAST LAST ROW), the row after the current row (TO NEXT ROW), or the row of a
pattern variable in the match (TO FIRST/LAST var).

The compiled matcher (engine.fast) runs the same per-frame search when the plan allows it;
the reference matcher (operators.matcher) decides otherwise and is the oracle.
"""
from __future__ import annotations

import bisect
import time
from types import SimpleNamespace

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.connectors.duckdb_source import DuckDBOracle, FallbackEvaluator, describe, read_batches
from matchrec.engine import reading
from matchrec.engine.errors import map_duckdb_error
from matchrec.engine.executor import (MATCH, define_evaluator, PartitionRunner, SkipError, SKIP_ABSENT, SKIP_FIRST,
                                      _match_limit, _thread_limit, stream_chunks)
from matchrec.engine.output import Matches, expand
from matchrec.errors import DataError, ProgrammingError, positioned
from matchrec.operators import expr as ir
from matchrec.operators import vm
from matchrec.operators.matcher import MatchLimitExceeded, MatchResult
from matchrec.parser import parameters
from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident
from matchrec.parser.query import Clause
from matchrec.parser.spec import Anchor
from matchrec.parser.window import has_pattern_window, split_windows
from matchrec.planner.plan import build_plan
from matchrec.engine.clauses import ClauseRun, cte_prefixes, replace_identifiers

FRAME_ERROR = "Window frame offset value must not be negative or null"


def window_plan_allows_compiled(plan) -> bool:
    """Whether a frame leaves every DEFINE as it is over the whole partition: no PREV/NEXT
    (they read rows outside the match, which a frame cuts off), no MATCH_NUMBER (a window
    numbers its matches differently) and no anchors (^ and $ are the frame's ends)."""
    def reads_outside(node) -> bool:
        if isinstance(node, ir.MatchNumber):
            return True
        if isinstance(node, ir.At):
            return node.nav.physical_offset != 0 or reads_outside(node.expr)
        if isinstance(node, ir.Agg) and node.filter is not None and reads_outside(node.filter):
            return True
        return any(reads_outside(a) for a in getattr(node, "args", ()) or ())

    def anchored(node) -> bool:
        if isinstance(node, Anchor):
            return True
        return any(anchored(c) for c in getattr(node, "items", ()) or ()) or \
            (getattr(node, "body", None) is not None and anchored(node.body))

    return not anchored(plan.spec.pattern) and not any(d is not None and reads_outside(d) for d in plan.defines)


class _Shifted:
    """A partition column seen from a frame start."""

    __slots__ = ("values", "base")

    def __init__(self, values: list, base: int):
        self.values, self.base = values, base

    def __getitem__(self, i: int):
        return self.values[i + self.base]


class WindowRunner(PartitionRunner):
    """PartitionRunner for a pattern window: one match attempt per row within its frame."""

    def __init__(self, plan, fallback, arrow_types, settings, null_row, duck, layout, seek: bool,
                 frame_col: int | None, input_names: list[str], compiled=None):
        super().__init__(plan, fallback, arrow_types, settings, null_row, None, duck, layout)
        self.seek = seek
        self.frame_col = frame_col  # batch column of the per-row "n FOLLOWING"; None: unbounded
        self.input_names = input_names
        self.compiled = compiled
        self.stats.matcher = "reference" if compiled is None else \
            ("compiled" if compiled.exact else "compiled pre-filter + reference")

    def frame_ends(self, table: pa.Table, lo: int, hi: int) -> np.ndarray:
        n = hi - lo
        if self.frame_col is None:
            return np.full(n, n - 1, np.int64)
        col = table.column(self.frame_col).slice(lo, n)
        if col.null_count or (n and pc.min(col).as_py() < 0):
            raise DataError(FRAME_ERROR)
        offsets = col.to_numpy(zero_copy_only=False).astype(np.int64)
        return np.minimum(np.arange(n, dtype=np.int64) + offsets, n - 1)

    def run_chunk(self, table: pa.Table, bounds: np.ndarray) -> None:
        n_parts = len(bounds) - 1
        self.stats.partitions += n_parts
        self.stats.rows_in += table.num_rows
        total = table.num_rows
        # per row: index of its match among the chunk's matches (-1: none), partition position
        match_of = np.full(total, -1, np.int64)
        pos = np.zeros(total, np.int64)
        kind, start, length, number, offset, labels, lo_arr, hi_arr = [], [], [], [], [], [], [], []
        excl: dict = {}
        # frame end of every row, relative to its partition and as a row of the chunk
        ends = np.zeros(total, np.int64)
        for p in range(n_parts):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            ends[lo:hi] = self.frame_ends(table, lo, hi)
        found = self.compiled_search(table, bounds, ends) if self.compiled is not None else None
        for p in range(n_parts):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            pos[lo:hi] = np.arange(hi - lo)
            part_ends = ends[lo:hi]
            part_found = None if found is None else (found[0][lo:hi], found[1], found[2], lo)
            for cur, s, result, number_ in self.window_matches(table.slice(lo, hi - lo), part_ends, part_found):
                if not result.labels:
                    continue  # an empty match: NULL measures, like no match
                match_of[lo + cur] = len(kind)
                kind.append(MATCH)
                start.append(lo + s)
                length.append(len(result.labels))
                number.append(number_)
                offset.append(len(labels))
                labels += result.labels
                lo_arr.append(lo + cur)
                hi_arr.append(lo + int(part_ends[cur]) + 1)
                if result.exclusions:
                    excl[len(kind) - 1] = list(result.exclusions)
        m = Matches(np.array(kind, np.int8), np.array(start, np.int64), np.array(length, np.int64),
                    np.array(number, np.int64), np.array(offset, np.int64), np.array(labels, np.int16),
                    np.array(lo_arr, np.int64), np.array(hi_arr, np.int64), excl)
        self.stats.matches += len(kind)
        self.emit_rows(table, m, match_of, pos)

    def compiled_search(self, table: pa.Table, bounds: np.ndarray, ends: np.ndarray):
        """What the compiled matcher knows of each start row of the chunk.

        With no navigation outside the match (PREV/NEXT), no anchors and no MATCH_NUMBER in
        DEFINE (see window_plan_allows_compiled), a frame changes a DEFINE's value nowhere: it
        only ends the match. The compiled matcher runs every row as a start with its own frame
        end as the bound (the mechanism WITHIN uses: a thread dies at a row past the bound), so
        its match from a row is that row's INITIAL match exactly. Returns (per row: index of
        its match or -1, or of possible starts only: -2 where none is possible and -1
        otherwise; Matches; exact)."""
        fast = self.compiled
        n = table.num_rows
        frame_ends = np.zeros(n, np.int64)
        for p in range(len(bounds) - 1):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            frame_ends[lo:hi] = lo + ends[lo:hi]
        bounded = table.append_column("__frame_row", pa.array(np.arange(n, dtype=np.int64))) \
            .append_column("__frame_end", pa.array(frame_ends))
        fast.within_cols = (table.num_columns, table.num_columns + 1, "int")
        fast.within_desc = False
        m = fast.matches(bounded, bounds, self.settings) if fast.exact else None
        if m is not None:  # None: a running sum the compiled matcher cannot keep, the reference decides
            at = np.full(n, -1, np.int64)
            at[m.start] = np.arange(len(m.start))
            return at, m, True
        possible = fast.possible_starts(bounded, bounds, self.settings)
        return np.where(possible.astype(bool), -1, -2).astype(np.int64), None, False

    def window_matches(self, table: pa.Table, ends: np.ndarray, known=None):
        """(current row, match start, MatchResult, match number) of each row that has a match.

        ``known``: the compiled matcher's knowledge of the partition's start rows, each bounded
        by its own frame end (compiled_search); the reference matcher decides the rest. A start
        row ``s`` tried for the current row ``cur`` (SEEK) has the bound ``ends[cur]``: what the
        compiled matcher found under ``ends[s]`` holds there when ``ends[s] >= ends[cur]`` and
        the match ends by ``ends[cur]`` (a smaller frame only takes away threads that were
        preferred to it), and "no match" holds too."""
        plan, ctx = self.plan, self.ctx
        n = table.num_rows
        state = {}

        def reference(cur: int, rel: int, width: int):
            if not state:
                cols: list = [None] * self.n_cols
                for i in self.used:
                    cols[i] = table.column(self.colmap[i]).to_pylist()
                state["cols"], state["evaluate"] = cols, define_evaluator(self.defines, ctx)
            # the frame is matched as a partition of its own
            ctx.cols = [_Shifted(c, cur) if c is not None else None for c in state["cols"]]
            ctx.null_row, ctx.n = self.null_row, width
            ctx.start, ctx.match_number = rel, match_number
            self.stats.starts_tried += 1
            try:
                return self.matcher.find(rel, width, state["evaluate"])
            except MatchLimitExceeded as err:
                raise _thread_limit(err.setting, err.limit) from None

        at = m = None
        exact = False
        if known is not None:
            at, m, exact, base = known
            if self.seek and n > 1 and np.any(np.diff(ends) < 0):
                at = None  # frame ends that go back: a later row's bound says nothing of this row's
        # rows where a match may start, in order (the compiled matcher rules the others out)
        starts = None if at is None else np.flatnonzero(at >= 0 if exact else at != -2).tolist()
        monotone_ends = ends if self.seek and starts is not None else None
        skip = plan.spec.skip.kind
        resume, match_number, found = 0, 1, 0
        cur = 0
        while cur < n:
            cur = max(cur, resume)
            if starts is not None:
                i = bisect.bisect_left(starts, cur)
                if i == len(starts):
                    break
                s = starts[i]
                if not self.seek:
                    cur = s  # the rows before start no match
                elif s > int(ends[cur]):  # no start in this frame: none in the frames ending before s
                    cur = max(cur + 1, int(np.searchsorted(monotone_ends, s)))
                    continue
            if cur >= n:
                break
            end = int(ends[cur])
            width = end - cur + 1
            result, rel = None, 0
            if starts is None:
                for rel in range(width if self.seek else 1):
                    result = reference(cur, rel, width)
                    if result is not None:
                        break
            else:
                while i < len(starts) and starts[i] <= end and (self.seek or starts[i] == cur):
                    rel = starts[i] - cur
                    k = int(at[cur + rel])
                    if exact and int(m.start[k]) - base + int(m.length[k]) - 1 <= end:
                        off = int(m.label_offset[k])
                        result = MatchResult(m.labels[off:off + int(m.length[k])].tolist(), m.exclusions.get(k, []))
                        break
                    result = reference(cur, rel, width)
                    if result is not None:
                        break
                    i += 1
            if result is None:
                cur += 1
                continue
            found += 1
            if found > self.settings.max_matches_per_partition:
                raise _match_limit(self.settings.max_matches_per_partition)
            yield cur, cur + rel, result, match_number
            match_number += 1
            if result.labels:
                resume = self._resume(skip, cur, cur + rel, result.labels)
            cur += 1

    def _resume(self, skip: str, cur: int, start: int, labels: list[int]) -> int:
        if skip == "past_last":
            return start + len(labels)
        if skip == "next_row":
            return cur + 1
        rows = [i for i, label in enumerate(labels) if label in self.plan.skip_labels]
        if not rows:
            raise SkipError(SKIP_ABSENT)
        target = start + (rows[0] if skip == "to_first" else rows[-1])
        if target <= cur:
            raise SkipError(SKIP_FIRST)
        return target

    def emit_rows(self, table: pa.Table, m: Matches, match_of: np.ndarray, pos: np.ndarray) -> None:
        total = table.num_rows
        if total == 0:
            return
        self.stats.rows_out += total
        rows = expand(m, True, False)
        measures = self.computer.compute(table, self.colmap, m, rows) if len(m.kind) else \
            [pa.nulls(0, t) for t in self.arrow_types]
        has = match_of >= 0
        take = pa.array(match_of, pa.int64(), mask=~has)
        m_start = np.where(has, m.start[np.maximum(match_of, 0)] if len(m.kind) else 0, 0)
        m_len = np.where(has, m.length[np.maximum(match_of, 0)] if len(m.kind) else 0, 0)
        rows_idx = np.arange(total, dtype=np.int64)
        lo_off = np.where(has, m_start - rows_idx, 1)  # an empty frame where there is no match
        hi_off = np.where(has, m_start + m_len - 1 - rows_idx, 0)
        arrays = [table.column(self.colmap[i]) for i in range(len(self.input_names))]
        arrays += [pa.array(pos), pa.array(lo_off), pa.array(hi_off)]
        arrays += [mv.take(take) for mv in measures]
        names = [f"c{k}" for k in range(len(arrays))]
        self.chunks.append(pa.table(arrays, names=names))

    def result(self, schema: pa.Schema) -> pa.Table:
        if not self.chunks:
            return schema.empty_table()
        return pa.concat_tables([t.cast(schema) if t.schema != schema else t for t in self.chunks])


def run_windows(runner, sql: str, prepared, done: dict, tag: str, dry: bool, nodes: dict | None = None,
                literals: dict | None = None) -> str:
    """Cut the windows with PATTERN out of ``sql`` (a statement of the runner's dialect), run
    each over its input and return the statement with placeholders left for ``done`` to fill.
    A window's input (its table, filtered by the WHERE) is itself prepared as a statement, so
    MATCH_RECOGNIZE in it runs first. ``nodes``/``literals`` are the statement's parameter
    values by marker (see parser.parameters): they replace the markers in the windows' bodies."""
    if not has_pattern_window(sql):
        return sql
    dialect = runner.dialect
    wq = split_windows(sql, dialect)
    if not wq.windows:
        return sql
    source = sql
    con = runner.con
    as_clauses = [Clause(w.placeholder, w.source_text, w.span, w.spec, None) for w in wq.windows]
    prefixes = cte_prefixes(SimpleNamespace(text=wq.text, dialect=dialect, clauses=as_clauses), write=dialect)
    for w, clause in zip(wq.windows, as_clauses):
        frame = f", CAST(({w.frame_end}) AS BIGINT) AS {w.frame_column}" if w.frame_end is not None else ""
        text = f"SELECT *{frame} FROM {w.source_text}" + (f" WHERE {w.where_text}" if w.where_text else "")
        nested = runner._prepare(prefixes.get(w.placeholder, "") + text, None, nodes or {}, literals or {})
        prepared.registered += nested.registered
        prepared.runs += nested.runs
        input_sql = replace_identifiers(nested.sql, done)
        if runner.remote is not None and not dry:
            runner.materialize(input_sql)
        try:
            columns = describe(con, input_sql)
        except duckdb.Error as err:
            raise map_duckdb_error(err, source, w.span.start, "The input of the window cannot be read") from None
        oracle = DuckDBOracle(con)
        n_inputs = len(columns) - (1 if w.frame_end is not None else 0)
        input_names = [n for n, _ in columns[:n_inputs]]
        lowered = {n.lower() for n in input_names}
        for name, span in w.bare_measures:
            if name.lower() not in lowered:
                raise positioned(ProgrammingError, f"{name} is a measure of a window with PATTERN: write "
                                 f"{name} OVER {w.name}", source, span.start, span.end)
        spec = parameters.bind_spec(w.spec, nodes, literals) if nodes else w.spec
        plan = build_plan(spec, columns, oracle)
        physical = reading.plan_clause(plan, input_sql, con, oracle, runner.settings,
                                       f"#{len(prepared.runs) + 1}: window {w.name} with PATTERN", window=True,
                                       compilable=window_plan_allows_compiled(plan))
        fp, read_sql = physical.fast, physical.read_sql
        measure_types = [oracle.arrow_type(m.type) for m in plan.measures]
        null_row = reading.null_row(plan, con)
        started = time.perf_counter()
        reader = None
        try:
            reader = read_batches(con, read_sql if not dry else read_sql + " LIMIT 0")
            schema_in = reader.schema
            lay = reading.layout(plan, schema_in)
            frame_col = schema_in.get_field_index(w.frame_column) if w.frame_end is not None else None
            fields = [pa.field(f"c{k}", schema_in.field(lay.colmap[k]).type) for k in range(n_inputs)]
            fields += [pa.field(f"c{n_inputs + k}", pa.int64()) for k in range(3)]
            fields += [pa.field(f"c{n_inputs + 3 + k}", t) for k, t in enumerate(measure_types)]
            schema = pa.schema(fields)
            compiled = None
            if fp is not None:
                compiled = reading.compiled_matcher(plan, fp, con, lay, schema_in)
                # every row is tried as a start: the window's own loop picks the ones it needs
                compiled.skip_kind, compiled.empty_mode = vm.SKIP_NEXT_ROW, 0
            wr = WindowRunner(plan, FallbackEvaluator(con.cursor()), measure_types, runner.settings, null_row,
                              con, lay, w.seek, frame_col, input_names, compiled)
            stream_chunks(reader, [wr.colmap[i] for i in plan.partition_by], wr.run_chunk,
                          runner.settings.max_partition_mb << 20)
            table = wr.result(schema)
            stats = wr.stats
        except duckdb.Error as err:
            raise map_duckdb_error(err, source, w.span.start, "Evaluating the window failed") from None
        finally:
            if reader is not None:
                reader.close()
            del reader
        stats.seconds = time.perf_counter() - started
        name = H.result(tag, len(prepared.registered))
        con.register(name, table)
        prepared.registered.append(name)
        select = [f"c{k} AS {quote_ident(n)}" for k, n in enumerate(input_names)]
        select += [f"c{n_inputs} AS {w.pos_column}", f"c{n_inputs + 1} AS {w.lo_column}",
                   f"c{n_inputs + 2} AS {w.hi_column}"]
        select += [f"CAST(c{n_inputs + 3 + j} AS {m.type}) AS {col}"
                   for j, (m, col) in enumerate(zip(plan.measures, w.measure_columns))]
        view = f"(SELECT {', '.join(select)} FROM {name})"
        done[w.placeholder] = view
        done[w.star_marker] = ", ".join(quote_ident(n) for n in input_names if not n.startswith(H.WINDOW_PREFIX))
        prepared.runs.append(ClauseRun(clause, plan, stats, name, view, 0.0, None, w.name))
    return wq.text
