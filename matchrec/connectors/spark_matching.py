"""MATCH_RECOGNIZE over Spark DataFrames: analysis on the driver, matching on the executors.

A clause body is parsed once and analysed on the driver by handing the parsed clause and an
empty Arrow table with the input's schema to an engine session (``engine.session.Session.match``):
that gives the output schema, the plan, and errors with line and column in the user's text
before any Spark job starts. Executors hand the very same session call their Arrow batches
(``mapInArrow``), so Spark and DuckDB results agree by construction:

* with PARTITION BY, rows are hash-partitioned by the keys and every task matches the keys it
  holds (one DuckDB connection per task, not per key);
* without PARTITION BY but with WITHIN, the stream is cut into time ranges; each range is read
  with the rows up to WITHIN before it (PREV context) and after it (matches that end later) and
  reports the match found at every start row (SKIP TO NEXT ROW, which does not depend on earlier
  matches). Matches are kept by their start row's range; for AFTER MATCH SKIP PAST LAST ROW the
  driver then walks the (start, end) pairs in row order to choose the matches a sequential run
  would report, and only the chosen ones are kept;
* otherwise one task matches the whole input (EXPLAIN says so).

Rows are ordered by the ORDER BY keys and, in the time-split path, by a row id as the last key,
so rows with equal keys keep one order in every range.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec import errors as E
from matchrec.parser.body import parse_body
from matchrec.parser import spec as S

HIDDEN = "__mrs_"  # not __mr_: the body parser names navigation functions so
_INPUT = "__mrs_input"  # the table a window statement reads


@dataclass
class Body:
    """One MATCH_RECOGNIZE body (the text between its parentheses) and where it came from."""
    text: str
    dialect: str
    spec: S.MatchSpec
    source: str  # the text errors point into (the user's statement, or the body itself)
    offset: int  # where ``text`` starts in ``source``

    @classmethod
    def parse(cls, text: str, dialect: str = "spark", source: str | None = None, offset: int = 0) -> "Body":
        if not isinstance(text, str) or not text.strip():
            raise E.ProgrammingError("The MATCH_RECOGNIZE body is empty: pass the text inside MATCH_RECOGNIZE ( ... ),"
                                     " e.g. 'ORDER BY ts MEASURES ... PATTERN (A B+) DEFINE B AS ...'")
        source = text if source is None else source
        spec = parse_body(text, offset, source, dialect, S.Span(offset, offset + len(text)))
        return cls(text, dialect, spec, source, offset)

    def local(self, offset: int) -> int:
        """An offset into ``text`` as an offset into ``source``."""
        return self.offset + max(0, min(offset, len(self.text)))


@dataclass
class Analysis:
    body: Body
    input_schema: pa.Schema  # what executors receive
    output_schema: pa.Schema  # what they must return
    plan: object  # planner.plan.Plan of the body over the input
    explain: str
    key_sql: str | None = None  # BIGINT SQL of the ORDER BY key when WITHIN has a fixed length
    window: int | None = None
    split_reason: str = ""  # why the time split does not apply ('' when it does)
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ running the engine locally
def _session(dialect: str, threads: int | None = None):
    """An engine session on a private in-memory DuckDB (``threads``: DuckDB's and the matcher's;
    a Spark task runs on one core)."""
    from matchrec.engine.session import Session
    session = Session.open(":memory:", dialect)
    if threads is not None:
        session.duck.execute(f"SET threads = {int(threads)}")
        session.set("matchrec_threads", int(threads))
    return session


def _clause(body: Body) -> S.MatchSpec:
    """The body's parsed clause; the clause as a whole is the body's own text (errors about it
    point at the body's start, not at a MATCH_RECOGNIZE keyword the body may not have)."""
    return replace(body.spec, span=S.Span(body.offset, body.offset + len(body.text)))


def run_local(table: pa.Table, text: str, dialect: str, threads: int | None = None) -> pa.Table:
    """The rows of the MATCH_RECOGNIZE body ``text`` over ``table``, computed by matchrec on DuckDB
    (``threads``: DuckDB's and the matcher's threads; a Spark task runs on one core)."""
    return run_body(table, Body.parse(text, dialect), threads).table


def run_body(table: pa.Table, body: Body, threads: int | None = None):
    """The parsed ``body`` matched over ``table`` by an engine session: ``engine.session.ClauseResult``
    (rows, plan, EXPLAIN text); errors point into the body's source."""
    session = _session(body.dialect, threads)
    try:
        return session.match(_clause(body), table)
    finally:
        session.close()


def analyze(body: Body, input_schema: pa.Schema) -> Analysis:
    """Plan ``body`` over rows of ``input_schema``: output schema, EXPLAIN text, split decision."""
    from matchrec.connectors.duckdb_source import DuckDBOracle
    from matchrec.planner.intervals import key_and_window
    session = _session(body.dialect)
    try:
        ran = session.match(_clause(body), input_schema.empty_table())
        analysis = Analysis(body, input_schema, ran.table.schema, ran.plan, ran.explain)
        kw = key_and_window(ran.plan, DuckDBOracle(session.duck))
        if isinstance(kw, str):
            analysis.split_reason = kw
        else:
            analysis.key_sql, analysis.window = kw
            analysis.split_reason = _split_blocker(body)
    finally:
        session.close()
    return analysis


def _calls(body: Body):
    """Every navigation/special function call of DEFINE and MEASURES, as (NAME, sqlglot node)."""
    from sqlglot import exp
    for item in list(body.spec.definitions) + list(body.spec.measures):
        tree = item.expression.tree
        if tree is None:
            continue
        for n in tree.walk():
            if isinstance(n, exp.Anonymous) and n.name.lower().startswith("__mr_"):
                yield n.name[5:].upper(), n


def _functions(body: Body) -> set[str]:
    return {name for name, _ in _calls(body)}


def _split_blocker(body: Body) -> str:
    """Why a pattern without PARTITION BY cannot be matched in time ranges ('' if it can)."""
    spec = body.spec
    if spec.partition_by:
        return "PARTITION BY already spreads the work"
    if len(spec.order_by) != 1:
        return "the time split orders by one key"
    if spec.skip.kind not in ("past_last", "next_row"):
        return "AFTER MATCH SKIP TO FIRST/LAST needs the matches in sequence"
    if spec.rows_per_match == "all" and spec.empty_matches == "unmatched":
        return "WITH UNMATCHED ROWS reports rows no match covers"
    if _min_rows(spec.pattern) == 0:
        return "the pattern can match no rows"
    if _has_anchor(spec.pattern):
        return "the pattern has an anchor (^ or $)"
    used = _functions(body)
    if "NEXT" in used:
        return "NEXT() reads rows after the match"
    if "MATCH_NUMBER" in used:
        return "MATCH_NUMBER() numbers matches in sequence"
    if prev_rows(body) is None:
        return "PREV() with an offset that is not a number"
    return ""


def prev_rows(body: Body) -> int | None:
    """How many rows before a match PREV() may read (0 without PREV; None if unknown)."""
    from sqlglot import exp
    most = 0
    for name, call in _calls(body):
        if name != "PREV":
            continue
        args = call.expressions
        if len(args) < 2:
            most = max(most, 1)
        elif isinstance(args[1], exp.Literal) and args[1].is_int:
            most = max(most, int(args[1].this))
        else:
            return None
    return most


def _min_rows(node: S.PatternNode) -> int:
    if isinstance(node, S.Label):
        return 1
    if isinstance(node, (S.EmptyPattern, S.Anchor)):
        return 0
    if isinstance(node, (S.Concat, S.Permute)):
        return sum(_min_rows(n) for n in node.items)
    if isinstance(node, S.Alternation):
        return min(_min_rows(n) for n in node.items)
    if isinstance(node, S.Quantified):
        return node.min * _min_rows(node.body)
    if isinstance(node, S.Exclusion):
        return _min_rows(node.body)
    return 0


def _has_anchor(node: S.PatternNode) -> bool:
    if isinstance(node, S.Anchor):
        return True
    kids = getattr(node, "items", None) or ([node.body] if getattr(node, "body", None) is not None else [])
    return any(_has_anchor(k) for k in kids)


# ------------------------------------------------------------------ rewriting a body
_SORT_TAIL = re.compile(r"(?:\s+(?:ASC|DESC)\b)?(?:\s+NULLS\s+(?:FIRST|LAST)\b)?", re.I)


def arrival_order_body(body: Body) -> str:
    """A body without ORDER BY ordered by a hidden row number (rows as they arrive)."""
    spec, text, off = body.spec, body.text, body.offset
    if spec.order_by:
        return text
    if spec.partition_by:
        at = spec.partition_by[-1].span.end - off
        return text[:at] + f" ORDER BY {HIDDEN}rid " + text[at:]
    return f"ORDER BY {HIDDEN}rid " + text


def split_body(body: Body) -> str:
    """The body as the time-split ranges run it: the row id as last ORDER BY key, the first and
    last row of each match as hidden measures, and SKIP TO NEXT ROW."""
    spec, text, off = body.spec, body.text, body.offset
    edits: list[tuple[int, int, str]] = []
    last_key = spec.order_by[-1].column.span.end - off
    tail = _SORT_TAIL.match(text, last_key)
    at = tail.end() if tail else last_key
    hidden = (f"FIRST({HIDDEN}key) AS {HIDDEN}sk, FIRST({HIDDEN}rid) AS {HIDDEN}sr, "
              f"FINAL LAST({HIDDEN}key) AS {HIDDEN}ek, FINAL LAST({HIDDEN}rid) AS {HIDDEN}er")
    if spec.measures:
        edits.append((at, at, f", {HIDDEN}rid"))
        end = spec.measures[-1].name_span.end - off
        edits.append((end, end, ", " + hidden))
    else:
        edits.append((at, at, f", {HIDDEN}rid MEASURES {hidden} "))
    skip = " AFTER MATCH SKIP TO NEXT ROW "
    if spec.skip.span is not None:
        after = list(re.finditer(r"\bAFTER\s+MATCH\b", text[:spec.skip.span.start - off], re.I))[-1].start()
        edits.append((after, spec.skip.span.end - off, skip))
    else:
        pattern_kw = [m for m in re.finditer(r"\bPATTERN\b", text[:spec.pattern.span.start - off], re.I)]
        if not pattern_kw:  # pragma: no cover - the grammar requires PATTERN
            raise E.InternalError("cannot find PATTERN in the body")
        p = pattern_kw[-1].start()
        edits.append((p, p, skip))
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out


# ------------------------------------------------------------------ executor functions
def _ensure_worker_env() -> None:
    # numba and DuckDB threads per task: Spark already runs one task per core
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s names and types (timestamp zones and the like differ)."""
    arrays = []
    for i, f in enumerate(schema):
        col = table.column(i)
        arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def match_task(text: str, dialect: str, input_schema: pa.Schema, output_schema: pa.Schema, threads: int = 1):
    """A ``mapInArrow`` function matching every row its task receives as one input."""
    def run(batches):
        _ensure_worker_env()
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        table = conform(table, input_schema)
        out = run_local(table, text, dialect, threads=1)
        yield from conform(out, output_schema).to_batches()
    return run


def run_statement_local(table: pa.Table, statement: str, dialect: str) -> pa.Table:
    """The rows of ``statement`` (which reads the table ``__mrs_input``) computed by matchrec on
    DuckDB over ``table``, on one thread (a Spark task runs on one core)."""
    session = _session(dialect, threads=1)
    try:
        session.register(_INPUT, table, kind="spark input")
        return session.table(statement)
    finally:
        session.close()


def window_statement(body: str, measures: list[tuple[str, str]]) -> str:
    """A statement computing, for every row of ``__mrs_input``, the measures of a window with
    PATTERN (``body``: its definition, parentheses included) as columns [(measure, column)]."""
    items = ", ".join(f"{m} OVER {HIDDEN}w AS {col}" for m, col in measures)
    return f"SELECT *, {items} FROM {_INPUT} WINDOW {HIDDEN}w AS {body}"


def statement_task(statement: str, dialect: str, input_schema: pa.Schema, output_schema: pa.Schema):
    """A ``mapInArrow`` function running ``statement`` over every row its task receives."""
    def run(batches):
        _ensure_worker_env()
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = conform(pa.Table.from_batches(batches), input_schema)
        yield from conform(run_statement_local(table, statement, dialect), output_schema).to_batches()
    return run


def key_task(key_sql: str, input_schema: pa.Schema, sample_every: int):
    """Per task: how many rows, how many NULL keys, min/max key, and every n-th key (for cuts)."""
    import duckdb

    def run(batches):
        con = duckdb.connect()
        n = nulls = 0
        lo, hi = None, None
        sample = []
        for b in batches:
            if not b.num_rows:
                continue
            t = pa.Table.from_batches([b])
            con.register("__mr_b", conform(t, input_schema))
            k = con.sql(f"SELECT {key_sql} AS k FROM __mr_b").to_arrow_table().column(0)
            con.unregister("__mr_b")
            arr = np.asarray(k.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
            valid = np.asarray(k.is_valid())
            n += len(arr)
            nulls += int((~valid).sum())
            arr = arr[valid]
            if len(arr):
                lo = int(arr.min()) if lo is None else min(lo, int(arr.min()))
                hi = int(arr.max()) if hi is None else max(hi, int(arr.max()))
                sample.append(arr[::sample_every])
        con.close()
        s = np.concatenate(sample) if sample else np.zeros(0, np.int64)
        yield pa.RecordBatch.from_pydict({"n": [n], "nulls": [nulls], "lo": [lo], "hi": [hi],
                                          "sample": [s.tobytes()]},
                                         schema=pa.schema([("n", pa.int64()), ("nulls", pa.int64()),
                                                           ("lo", pa.int64()), ("hi", pa.int64()),
                                                           ("sample", pa.binary())]))
    return run


def below_cuts_task(key_sql: str, input_schema: pa.Schema, cuts: list[int], back: int):
    """Per task and cut, the ``back`` largest keys below the cut (the rows PREV() may read)."""
    import duckdb
    cut = np.asarray(cuts, np.int64)

    def run(batches):
        con = duckdb.connect()
        keys = []
        for b in batches:
            if b.num_rows:
                con.register("__mr_b", conform(pa.Table.from_batches([b]), input_schema))
                k = con.sql(f"SELECT {key_sql} AS k FROM __mr_b WHERE {key_sql} IS NOT NULL").to_arrow_table().column(0)
                con.unregister("__mr_b")
                keys.append(np.asarray(k.to_numpy(zero_copy_only=False), np.int64))
        con.close()
        key = np.sort(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
        ends = np.searchsorted(key, cut, side="left")
        out_cut, out_key = [], []
        for i, end in enumerate(ends):
            chunk = key[max(0, end - back):end]
            out_cut += [i] * len(chunk)
            out_key += chunk.tolist()
        yield pa.RecordBatch.from_pydict({"cut": pa.array(out_cut, pa.int32()), "key": pa.array(out_key, pa.int64())})
    return run


def range_task(key_sql: str, input_schema: pa.Schema, cuts: list[int], window: int, starts: list[int],
               part_keys: list[int], out_schema: pa.Schema):
    """Each row once per time range that needs it: its own range (cuts[r-1] <= key < cuts[r]),
    every later range whose context start (``starts``, non-decreasing) lies at or before it, and
    every earlier range whose matches may reach it (key within ``window`` after the range)."""
    import duckdb
    cut = np.asarray(cuts, np.int64)
    start = np.asarray(starts, np.int64)
    parts = np.asarray(part_keys, np.int64)

    def run(batches):
        con = duckdb.connect()
        for b in batches:
            if not b.num_rows:
                continue
            t = conform(pa.Table.from_batches([b]), input_schema)
            con.register("__mr_b", t)
            k = con.sql(f"SELECT {key_sql} AS k FROM __mr_b").to_arrow_table().column(0)
            con.unregister("__mr_b")
            key = np.asarray(k.to_numpy(zero_copy_only=False), np.int64)
            own = np.searchsorted(cut, key, side="right")
            last = np.maximum(np.searchsorted(start, key, side="right"), own)
            first = np.minimum(np.searchsorted(cut, key - window, side="left"), own)
            reps = last - first + 1
            idx = np.repeat(np.arange(len(key)), reps)
            offs = np.arange(len(idx)) - np.repeat(np.cumsum(reps) - reps, reps)
            rng = np.repeat(first, reps) + offs
            out = t.take(pa.array(idx))
            out = out.append_column(f"{HIDDEN}key", pa.array(key[idx], pa.int64()))
            out = out.append_column(f"{HIDDEN}range", pa.array(rng.astype(np.int32), pa.int32()))
            out = out.append_column(f"{HIDDEN}part", pa.array(parts[rng], pa.int64()))
            yield from conform(out, out_schema).to_batches()
        con.close()
    return run


def split_match_task(text: str, dialect: str, input_schema: pa.Schema, output_schema: pa.Schema, cuts: list[int]):
    """Match one time range (rows arrive with their range id) and keep the matches that start
    in it; the hidden measures (first/last key and row id) stay for the driver."""
    cut = np.asarray(cuts, np.int64)

    def run(batches):
        _ensure_worker_env()
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        ranges = pc.unique(table.column(f"{HIDDEN}range")).to_pylist()
        body = Body.parse(text, dialect)
        for r in ranges:  # a task may hold several ranges
            part = table.filter(pc.equal(table.column(f"{HIDDEN}range"), r)).drop_columns([f"{HIDDEN}range"])
            out = run_body(conform(part, input_schema), body, threads=1).table
            sk = np.asarray(out.column(f"{HIDDEN}sk").to_numpy(zero_copy_only=False), np.int64)
            lo = cut[r - 1] if r > 0 else np.iinfo(np.int64).min
            hi = cut[r] if r < len(cut) else np.iinfo(np.int64).max
            keep = (sk >= lo) & (sk < hi)
            out = out.filter(pa.array(keep))
            yield from conform(out, output_schema).to_batches()
    return run


def choose_past_last(sk, sr, ek, er) -> np.ndarray:
    """Row ids of the matches a sequential AFTER MATCH SKIP PAST LAST ROW run reports, given the
    match found at every start row: walk the starts in row order and take a match when it starts
    after the end of the last one taken."""
    order = np.lexsort((sr, sk))
    sk, sr, ek, er = sk[order], sr[order], ek[order], er[order]
    chosen = []
    end_k, end_r = None, None
    for i in range(len(sk)):
        if end_k is None or sk[i] > end_k or (sk[i] == end_k and sr[i] > end_r):
            chosen.append(sr[i])
            end_k, end_r = ek[i], er[i]
    return np.asarray(chosen, np.int64)


def probe_task():
    """A ``mapInArrow`` function yielding one row per task; unpickling it on an executor imports
    matchrec, so a worker without matchrec fails this small job."""
    def run(batches):
        import duckdb  # noqa: F401 - the executor's Python must hold matchrec's dependencies too
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"tasks": [1]}, schema=pa.schema([("tasks", pa.int64())]))
    return run
