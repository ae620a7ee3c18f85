"""CER statements (``PATTERN ... FROM``, MATCH_RECOGNIZE with STRATEGY) over Spark tables.

The matching runs on the executors, by matchrec's own CER engine: each task loads the rows it
received into an in-memory DuckDB (``matchrec.connect()``, a table named as the statement's FROM,
rows inserted in the source's order so DuckDB's rowid keeps the tie order of equal keys) and runs
the statement through the connection - or ``matchrec.run_many`` for a workload. The engine plans
per task, over the task's rows (statistics, mechanism, filtering before matching): every mechanism
returns the same matches, so the plan changes the work, never the result. The driver only
resolves the statement against the table's schema (an empty table of it through the same
connection: errors with line and column, the output schema) and chooses how rows reach tasks:

* PARTITION BY: rows hash-partitioned by the column, each task matching the partitions it holds
  (a match lies within one partition value);
* no PARTITION BY, with WITHIN ``w``: the key line is cut into ranges ``[c_r, c_{r+1})`` (from a
  key sample); task ``r`` reads the rows with keys in ``[c_r - w, c_{r+1} + w)`` and keeps the
  matches whose first event lies in ``[c_r, c_{r+1})`` (see ``split_task`` for why each match
  comes out exactly once);
* otherwise one task.

Before the shuffle, interval filtering (``connectors.spark_filtering``: the dual-filtering rounds
with the CER interval plan of ``planner.cer_intervals``) keeps only rows within the window of the
candidates of the elements every match binds, per partition value.

Result types: a task's table is what the DuckDB path returns for those rows; RETURN projections
computed in Python take their type from their values there (as on DuckDB, where an empty result
types them NULL). When the empty-table run leaves such a column untyped, the tasks' results travel
as Arrow IPC in a cached DataFrame, their schemas are collected and unified, and the tables are
decoded into that schema.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec import errors as E

HIDDEN = "__mrc_"
RID = HIDDEN + "rid"  # the source's row order (tie order of equal keys)
PAYLOAD = "stmt int, payload binary"
CHUNK_ROWS = 65_536  # rows per IPC payload (a Spark binary value stays far below 2 GB)


# ------------------------------------------------------------------ tables on both sides
def naive(schema: pa.Schema) -> pa.Schema:
    """Spark's instants (UTC) as DuckDB's TIMESTAMP, the type a DuckDB table of the same events has."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_timestamp(t) and t.tz is not None:
            t = pa.timestamp(t.unit)
        fields.append(pa.field(f.name, t, f.nullable))
    return pa.schema(fields)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s types, column by column (position)."""
    arrays = []
    for i, f in enumerate(schema):
        col = table.column(i)
        if col.type != f.type:
            col = col.cast(f.type)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def create_source(duck, name: str, table: pa.Table) -> None:
    """``table`` as the DuckDB table ``name`` (as the statement's FROM writes it: ``t``, ``s.t``, ``d.s.t``)."""
    parts = name.split(".")
    if len(parts) == 3:
        duck.execute(f"ATTACH ':memory:' AS {parts[0]}")
        duck.execute(f"CREATE SCHEMA IF NOT EXISTS {parts[0]}.{parts[1]}")
    elif len(parts) == 2:
        duck.execute(f"CREATE SCHEMA IF NOT EXISTS {parts[0]}")
    duck.register("__mrc_input", table)
    try:
        duck.execute(f"CREATE TABLE {name} AS SELECT * FROM __mrc_input")
    finally:
        duck.unregister("__mrc_input")


def _connect(name: str, table: pa.Table, settings: list[str]):
    import matchrec
    con = matchrec.connect()
    con.session.duck.execute("SET threads = 1")  # Spark runs one task per core already
    create_source(con.session.duck, name, table)
    for s in settings:
        con.session.execute(s)
    return con


# ------------------------------------------------------------------ the driver's analysis
@dataclass
class Analysis:
    text: str  # the statement as the tasks run it (EXPLAIN blanked out: positions stay the user's)
    query: object  # parser.sase.CerQuery
    plan: object  # planner.cer.CerPlan (resolution only: columns, key, window)
    output_schema: pa.Schema  # of the empty-table run; null-typed columns take their type from values
    explain: str
    settings: list[str] = field(default_factory=list)

    @property
    def typed(self) -> bool:
        return not any(pa.types.is_null(f.type) or _has_null(f.type) for f in self.output_schema)


def _has_null(t: pa.DataType) -> bool:
    return pa.types.is_list(t) and (pa.types.is_null(t.value_type) or _has_null(t.value_type))


def source_frame(spark, query):
    """The Spark table a statement's FROM names (a ProgrammingError at FROM if Spark has none)."""
    try:
        return spark.table(query.source)
    except Exception as err:  # noqa: BLE001 - Spark's analysis errors come as several classes
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise E.positioned(E.ProgrammingError, f"Spark cannot read {query.source}: {first}", query.text,
                           *query.source_span) from None


def analyze(text: str, schema: pa.Schema, settings: list[str]) -> Analysis:
    """Resolve ``text`` against a table of ``schema`` (naive Arrow, no hidden columns): errors with
    line and column as the DuckDB path raises them, the output schema, the plan's resolution."""
    from matchrec.parser import sase as S
    from matchrec.planner.cer import resolve_query
    query = S.parse(text)
    con = _connect(query.source, schema.empty_table(), settings)
    try:
        out = con.execute(text).fetch_arrow_table().schema
        plan = resolve_query(con.session.duck, query, con.session.cer_settings)
        explain = "\n".join(r[1] for r in con.execute("EXPLAIN " + text).fetchall())
    finally:
        con.close()
    return Analysis(text, query, plan, out, explain, list(settings))


def needed_columns(plans: list) -> list[str]:
    """The source columns the statements read (their RETURN, conditions, filters, type, key, partition)."""
    from matchrec.engine.cer import needed_columns as cer_needed
    from matchrec.engine.cer_remote import filter_columns
    need: set[str] = set()
    for plan in plans:
        need |= set(cer_needed(plan)) | filter_columns(plan) | {plan.key_column}
        need |= {c for c in (plan.type_column, plan.partition_column) if c}
    return [c for c, _ in plans[0].columns.values() if c in need]


# ------------------------------------------------------------------ the tasks
def _ordered(batches, schema: pa.Schema) -> pa.Table | None:
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return None
    return conform(pa.Table.from_batches(batches), schema)


def _events(table: pa.Table, columns: list[str], schema: pa.Schema) -> pa.Table:
    """The task's events in the source's order (by row id), as DuckDB's types."""
    table = table.take(pc.sort_indices(table.column(RID)))
    return conform(table.select(columns), schema)


def _payloads(index: int, table: pa.Table):
    """``table`` as (statement, Arrow IPC) rows, a chunk of rows per payload (the schema always
    travels, also for an empty table)."""
    stmts, blobs = [], []
    starts = range(0, max(table.num_rows, 1), CHUNK_ROWS)
    for s in starts:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table.slice(s, CHUNK_ROWS))
        stmts.append(index)
        blobs.append(sink.getvalue().to_pybytes())
    return pa.RecordBatch.from_pydict({"stmt": pa.array(stmts, pa.int32()), "payload": pa.array(blobs, pa.binary())})


def _emit(results: list[tuple[int, pa.Table]], direct: pa.Schema | None):
    for index, table in results:
        if direct is not None:
            yield from conform(table, direct).to_batches()
        else:
            yield _payloads(index, table)


def _env() -> None:
    import os
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")


def match_task(source: str, settings: list[str], statements: list[str], cer_indices: list[int],
               in_schema: pa.Schema, columns: list[str], event_schema: pa.Schema, direct: pa.Schema | None):
    """A ``mapInArrow`` function: the task's rows as the table ``source``, the statements run over
    it through ``matchrec.connect()`` (one statement) or ``matchrec.run_many`` (several, SETs
    among them); yields each CER statement's rows (``direct``: as that schema; else IPC payloads)."""
    def run(batches):
        _env()
        table = _ordered(batches, in_schema)
        if table is None:
            return
        events = _events(table, columns, event_schema)
        con = _connect(source, events, settings)
        try:
            if len(statements) == 1:
                results = [(cer_indices[0], con.execute(statements[0]).fetch_arrow_table())]
            else:
                import matchrec
                tables = matchrec.run_many(con, statements).tables
                results = [(i, tables[i]) for i in cer_indices]
        finally:
            con.close()
        yield from _emit(results, direct)
    return run


def first_key_query(query, key_column: str):
    """``query`` returning, besides its own columns, the key of each positive variable's first event
    (``__mrc_first<i>``; a Kleene variable's keys as a list): the time split keeps a match by the
    smallest of them. RETURN * already has them (``first_key_columns``); COUNT(*) becomes them."""
    from matchrec.parser import sase as S
    if query.returns == "events":
        return query
    hidden = [S.Projection(S.Col((0, 0), var, key_column), f"{HIDDEN}first{i}") for i, var in enumerate(query.positive)]
    own = list(query.projections) if query.returns == "project" else []
    return dataclasses.replace(query, returns="project", projections=own + hidden, explain=None)


def first_key_columns(query, columns: list[str], key_column: str, result: pa.Table) -> list[int]:
    """Positions of the first-event key columns in ``result`` of ``first_key_query`` (``columns``:
    the source table's, in order)."""
    if query.returns == "events":
        names = columns
        at = names.index(key_column)
        return [j * len(names) + at for j in range(len(query.positive))]
    return list(range(result.num_columns - len(query.positive), result.num_columns))


def key_units(arr: pa.ChunkedArray) -> np.ndarray:
    """Key values as the engine's BIGINT key (epoch microseconds for times), NULL as int64 max."""
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        arr = pc.list_element(arr, 0)  # a Kleene variable's keys strictly increase: the first is the least
        t = arr.type
    if pa.types.is_timestamp(t):
        arr = arr.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
    elif pa.types.is_date(t):
        arr = arr.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
        arr = pc.multiply(arr, 86_400_000_000)
    else:
        arr = arr.cast(pa.int64())
    return np.asarray(arr.fill_null(np.iinfo(np.int64).max).to_numpy(zero_copy_only=False), np.int64)


def split_task(text: str, settings: list[str], key_column: str, in_schema: pa.Schema, columns: list[str],
               event_schema: pa.Schema, cuts: list[int], index: int, direct: pa.Schema | None):
    """A ``mapInArrow`` function of the time split: rows arrive with their range id (a row may come
    in several ranges); each range's rows are matched and its matches kept by their first event.

    Why every match comes out exactly once. Let a match have first event key ``f`` and last ``l``,
    ``l - f <= w``. Everything the engine looks at to accept it lies in ``[f, l]`` (its events, and
    for strict contiguity and skip-till-next-match the rows between them) or in ``[l - w, f + w]``
    (a negation before the first event looks back to ``l - w``, one after the last forward to
    ``f + w``): all of it in ``[f - w, f + w]`` (``planner.cer_intervals`` proves the same bound for
    the interval filter). The ranges ``[c_r, c_{r+1})`` partition the key line, so exactly one
    range ``r`` holds ``f``, and its task reads every row with a key in ``[c_r - w, c_{r+1} + w)``
    ⊇ ``[f - w, f + w]``: the match is found there, as over the whole input (rows outside that
    span change nothing it depends on, and the rows inside keep the source's order). Conversely a
    match found by any task over its rows has everything it depends on inside its own span, so it
    is a match of the whole input too. Every task keeps only matches whose ``f`` lies in its own
    range, so the match is reported by task ``r`` alone. Rows with a NULL key never match and were
    dropped before."""
    cut = np.asarray(cuts, np.int64)

    def run(batches):
        _env()
        from matchrec.parser import sase as S
        table = _ordered(batches, in_schema)
        if table is None:
            return
        query = S.parse(text)
        ranges = pc.unique(table.column("__mrs_range")).to_pylist()
        out: list[tuple[int, pa.Table]] = []
        for r in sorted(ranges):
            rows = table.filter(pc.equal(table.column("__mrs_range"), r))
            con = _connect(query.source, _events(rows, columns, event_schema), settings)
            try:
                wide = first_key_query(query, key_column)
                statement = dataclasses.replace(con.session.classify(text), _cer=wide)
                result = con.session.table(statement)
            finally:
                con.close()
            first = None
            for i in first_key_columns(query, columns, key_column, result):
                k = key_units(result.column(i))
                first = k if first is None else np.minimum(first, k)
            lo = cut[r - 1] if r > 0 else np.iinfo(np.int64).min
            hi = cut[r] if r < len(cut) else np.iinfo(np.int64).max
            keep = (first >= lo) & (first < hi) if first is not None else np.zeros(result.num_rows, bool)
            kept = result.filter(pa.array(keep))
            if query.returns == "count":
                kept = pa.table({"count": pa.array([kept.num_rows], pa.int64())})
            elif query.returns == "project":
                kept = kept.select(list(range(kept.num_columns - len(query.positive))))
            out.append((index, kept))
        yield from _emit(out, direct)
    return run


def schema_task():
    """A ``mapInArrow`` function: the (statement, serialized schema) of every payload."""
    def run(batches):
        for b in batches:
            stmts = b.column(0).to_pylist()
            schemas = [pa.ipc.open_stream(pa.py_buffer(p)).schema.serialize().to_pybytes()
                       for p in b.column(1).to_pylist()]
            yield pa.RecordBatch.from_pydict({"stmt": pa.array(stmts, pa.int32()),
                                              "schema": pa.array(schemas, pa.binary())})
    return run


def decode_task(index: int, schema: pa.Schema):
    """A ``mapInArrow`` function: the payloads of statement ``index`` as rows of ``schema``."""
    def run(batches):
        for b in batches:
            for stmt, payload in zip(b.column(0).to_pylist(), b.column(1).to_pylist()):
                if stmt != index:
                    continue
                table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
                if table.num_rows:
                    yield from conform(table, schema).to_batches()
    return run


def unify(schemas: list[pa.Schema], fallback: pa.Schema) -> pa.Schema:
    """The schema of the union of the tasks' tables: a column's type as the values of all of them give
    it (NULL-typed where a task had no value; ints and floats together as floats)."""
    if not schemas:
        return fallback
    try:
        out = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        raise E.DataError(f"The tasks' results do not share one type per column ({err})") from None
    return pa.schema([pa.field(f.name, out.field(i).type) for i, f in enumerate(fallback)]) \
        if out.names == fallback.names else out


# ------------------------------------------------------------------ time ranges
@dataclass
class Ranges:
    cuts: list[int]
    rows: int


def key_ranges(df, key_sql: str, in_schema: pa.Schema, tasks: int) -> Ranges:
    """Cuts of the key line into about ``tasks`` ranges of equal row counts (from a key sample)."""
    from matchrec.connectors.spark_matching import key_task
    from matchrec.connectors.spark_metrics import collect
    stats = collect(df.mapInArrow(key_task(key_sql, in_schema, 97), "n long, nulls long, lo long, hi long, "
                                                                     "sample binary"))
    rows = sum(r["n"] for r in stats)
    sample = np.sort(np.concatenate([np.frombuffer(r["sample"], np.int64) for r in stats])) \
        if stats else np.zeros(0, np.int64)
    ranges = max(tasks, -(-rows // 2_000_000))
    cuts = sorted({int(sample[int(len(sample) * i / ranges)]) for i in range(1, ranges)}) if len(sample) else []
    return Ranges(cuts, rows)


# ------------------------------------------------------------------ the driver's orchestration
@dataclass
class Env:
    """What the public Spark module lends: the number of matching tasks, Spark/Arrow schema
    conversions and the range id -> hash value map of its time split."""
    tasks: int
    partition_keys: object  # (spark, k) -> list of k longs, one hashing to each task
    spark_schema: object  # Arrow schema -> Spark struct
    arrow_schema: object  # Spark struct -> Arrow schema (timestamps in UTC)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def base_frame(df, columns: list[str]):
    """The columns the statements read, numbered in the source's order (``RID``)."""
    from pyspark.sql import functions as F
    return df.select(*[F.col(_q(c)) for c in columns]).withColumn(RID, F.monotonically_increasing_id())


def _finish(spark, env: Env, result, analyses: list[tuple[int, Analysis]], direct: bool):
    """The DataFrame of each statement from the tasks' output (``direct``: rows already in the
    statement's schema; else IPC payloads, decoded into the union of the tasks' schemas)."""
    from pyspark.sql import functions as F

    from matchrec.connectors.spark_common import cache
    from matchrec.connectors.spark_metrics import collect
    out = {}
    if direct:
        (index, a), = analyses
        frames = {index: result}
    else:
        payloads = cache(result)
        seen: dict[int, list[pa.Schema]] = {}
        if any(not a.typed for _, a in analyses):
            for r in collect(payloads.mapInArrow(schema_task(), "stmt int, schema binary").distinct()):
                seen.setdefault(r["stmt"], []).append(pa.ipc.read_schema(pa.py_buffer(r["schema"])))
        frames = {}
        for index, a in analyses:
            schema = a.output_schema if a.typed else unify(seen.get(index, []), a.output_schema)
            struct = env.spark_schema(schema)
            frames[index] = payloads.mapInArrow(decode_task(index, env.arrow_schema(struct)), struct)
    for index, a in analyses:
        frame = frames[index]
        if a.query.returns == "count":  # partial counts of the tasks (none for a task without rows)
            frame = frame.agg(F.coalesce(F.sum(F.col("`count`")), F.lit(0)).cast("long").alias("count"))
        out[index] = frame
    return out


def run_statement(spark, text: str, env: Env, report, interval_filter: str = "auto", settings=(), base=None,
                  prefiltered: tuple | None = None):
    """The DataFrame of one CER statement over the Spark table its FROM names; ``report`` (a
    ``matchrec.spark.ClauseReport``) gets the mode, filtering lines and the plan. ``prefiltered``:
    (rows inside its time interval set or None, FilterReport) found by ``run_many``'s one job of
    rounds for the table, instead of the statement's own rounds."""
    from pyspark.sql import functions as F

    from matchrec.parser import sase as S
    from matchrec.planner.cer import NO_WINDOW
    settings = list(settings)
    query = S.parse(text)  # a syntax error before any Spark call
    df = source_frame(spark, query)
    a = analyze(text, naive(env.arrow_schema(df.schema)), settings)
    plan = a.plan
    columns = needed_columns([plan])
    src = base if base is not None else base_frame(df, columns)
    src = src.where(F.col(_q(plan.key_column)).isNotNull())  # a NULL key never matches
    in_schema = env.arrow_schema(src.schema)
    all_columns = [f.name for f in in_schema if f.name != RID]
    event_schema = naive(pa.schema([in_schema.field(c) for c in all_columns]))
    report.explain = ("the DuckDB path's plan over the table's schema (each task plans again over its own rows: "
                      "statistics, mechanism, filtering before matching):\n" + a.explain)
    report.lines.append(f"source: Spark table {query.source}, columns {', '.join(all_columns)}; rows with a NULL "
                        f"key {plan.key_column} dropped (they never match)")
    if interval_filter not in ("auto", "on", "off"):
        raise E.ProgrammingError("interval_filter must be auto, on or off")
    if prefiltered is not None:
        filtered, freport = prefiltered
        if filtered is not None:
            src = filtered
        report.filtering = freport
        report.lines += freport.lines()
    elif interval_filter != "off":
        from matchrec.connectors.spark_filtering import FilterReport, filter_by_plan
        from matchrec.planner.cer_intervals import interval_plan
        ip, why = interval_plan(plan)
        if ip is None:
            freport = FilterReport(reason=f"not used ({why})")
        else:
            filtered, freport = filter_by_plan(src, in_schema, ip, interval_filter)
            if filtered is not None:
                src = filtered
        report.filtering = freport
        report.lines += freport.lines()
    typed = a.typed
    struct = env.spark_schema(a.output_schema) if typed else None
    direct = env.arrow_schema(struct) if typed else None
    out_struct = struct if typed else PAYLOAD
    n = env.tasks
    if plan.partition_column:
        report.mode = f"partitioned: rows hash-partitioned by {plan.partition_column} into {n} tasks"
        task = match_task(query.source, settings, [text], [0], in_schema, all_columns, event_schema, direct)
        result = src.repartition(n, F.col(_q(plan.partition_column))).mapInArrow(task, out_struct)
    elif plan.window != NO_WINDOW:
        result = _time_split(spark, src, a, env, in_schema, all_columns, event_schema, direct, out_struct, report)
    else:
        report.mode = "one task (no PARTITION BY and no WITHIN)"
        task = match_task(query.source, settings, [text], [0], in_schema, all_columns, event_schema, direct)
        result = src.repartition(1).mapInArrow(task, out_struct)
    return _finish(spark, env, result, [(0, a)], typed)[0]


def _time_split(spark, src, a: Analysis, env: Env, in_schema, columns, event_schema, direct, out_struct, report):
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from matchrec.connectors.spark_common import cache
    from matchrec.connectors.spark_matching import range_task
    plan = a.plan
    src = cache(src)  # read by the key sample and by the ranges
    ranges = key_ranges(src, plan.key_sql, in_schema, env.tasks)
    cuts, window = ranges.cuts, plan.window
    starts = (np.asarray(cuts, np.int64) - window).tolist()
    k = len(cuts) + 1
    pkeys = env.partition_keys(spark, k)
    ranged_struct = StructType(list(src.schema.fields) + [StructField("__mrs_key", LongType(), False),
                                                          StructField("__mrs_range", IntegerType(), False),
                                                          StructField("__mrs_part", LongType(), False)])
    ranged = src.mapInArrow(range_task(plan.key_sql, in_schema, cuts, window, starts, pkeys,
                                       env.arrow_schema(ranged_struct)), ranged_struct)
    task_in = env.arrow_schema(StructType(list(ranged_struct.fields)[:-1]))
    task = split_task(a.text, a.settings, plan.key_column, task_in, columns, event_schema, cuts, 0, direct)
    report.mode = (f"time split: {k} ranges of ~{ranges.rows // max(k, 1)} rows, each read with WITHIN ({window} key "
                   "units) before and after it; matches kept by their first event's range")
    return ranged.repartition(k, "__mrs_part").drop("__mrs_part").mapInArrow(task, out_struct)


def run_workload(spark, statements: list[str], env: Env, reports: list, interval_filter: str = "auto") -> list:
    """One DataFrame per CER statement of ``statements`` (SET/RESET statements apply to the ones
    after them and get None). Statements over one Spark table share one scan (its columns any of
    them reads, cached); those with the same PARTITION BY column also share one shuffle, each task
    running ``matchrec.run_many`` over its rows; the others run one by one over the shared scan.
    ``interval_filter`` as for one statement: a shared shuffle carries the rows inside any of its
    statements' time interval sets, each once; the rounds of every group and of every statement
    matched alone over one table are one Spark job (``spark_filtering.filter_table``; the session
    conf ``spark.matchrec.groupRounds=each`` keeps each statement's own rounds)."""
    from pyspark.sql import functions as F

    from matchrec.connectors.spark_common import cache
    from matchrec.parser import sase as S
    from matchrec.parser.classify import classify
    if interval_filter not in ("auto", "on", "off"):
        raise E.ProgrammingError("interval_filter must be auto, on or off")
    kinds, settings, parsed = [], [], {}
    for i, text in enumerate(statements):
        E.check_text(text)
        st = classify(text, "duckdb")
        if st.kind in ("set", "reset"):
            kinds.append(("set", list(settings)))
            settings.append(text)
        elif st.kind == "cer":
            kinds.append(("cer", list(settings)))
            parsed[i] = S.parse(text)
        else:
            raise E.NotSupportedError(f"matchrec.spark.run_many takes CER statements (PATTERN ... FROM, "
                                      f"MATCH_RECOGNIZE with STRATEGY) and SET/RESET; statement {i + 1} is neither: "
                                      "run it with matchrec.spark.sql")
    frames: dict[str, object] = {}
    analyses: dict[int, Analysis] = {}
    for i, q in parsed.items():
        key = q.source.lower()
        if key not in frames:
            frames[key] = source_frame(spark, q)
        analyses[i] = analyze(statements[i], naive(env.arrow_schema(frames[key].schema)), kinds[i][1])
        if analyses[i].query.explain:
            raise E.NotSupportedError("matchrec.spark.run_many does not run EXPLAIN; give the statement to "
                                      "matchrec.spark.sql")
    out: list = [None] * len(statements)
    by_source: dict[str, list[int]] = {}
    for i in parsed:
        by_source.setdefault(parsed[i].source.lower(), []).append(i)
    for key, members in by_source.items():
        columns = needed_columns([analyses[i].plan for i in members])
        base = cache(base_frame(frames[key], columns))  # the one scan of this table
        groups = shuffle_groups(members, analyses)
        filtered = _filter_groups(spark, base, groups, analyses, env, interval_filter)
        for gkey, idx in groups.items():
            if not gkey[0]:
                i = idx[0]
                rep = _new_report(reports)
                got = filtered.get(gkey)
                out[i] = run_statement(spark, statements[i], env, rep, interval_filter, kinds[i][1], base=base,
                                       prefiltered=(got[0], got[1][0]) if got else None)
                rep.lines.append("run_many: over the table's shared scan" +
                                 ("; its rounds in the table's one job of rounds" if got else ""))
                continue
            plan = analyses[idx[0]].plan
            src = base.where(F.col(_q(plan.key_column)).isNotNull())
            in_schema = env.arrow_schema(src.schema)
            event_schema = naive(pa.schema([f for f in in_schema if f.name != RID]))
            filter_lines, freport = [], None
            if interval_filter != "off":
                from matchrec.connectors.spark_filtering import filter_by_plans
                from matchrec.planner.cer_intervals import interval_plan
                planned = [interval_plan(analyses[j].plan) for j in idx]
                if gkey in filtered:
                    kept, freports = filtered[gkey]
                else:
                    kept, freports = filter_by_plans(src, in_schema, [ip for ip, _ in planned], interval_filter, RID)
                if kept is not None:
                    src = kept
                freport = freports[0]
                for n, (j, (ip, why), fr) in enumerate(zip(idx, planned, freports), 1):
                    lines = fr.lines() if ip is not None else [f"interval filtering: not used ({why})"]
                    filter_lines += [f"statement {j + 1}: {line}" for line in lines]
            # the group's statements with the SETs in force among them, in the workload's order
            first, last = min(idx), max(idx)
            texts, cer_at = [], []
            for j in range(len(statements)):
                if j in idx:
                    cer_at.append(len(texts))
                    texts.append(statements[j])
                elif kinds[j][0] == "set" and j < last:
                    texts.append(statements[j])
            task = match_task(parsed[first].source, [], texts, cer_at, in_schema, event_schema.names, event_schema,
                              None)
            result = src.repartition(env.tasks, F.col(_q(plan.partition_column))).mapInArrow(task, PAYLOAD)
            done = _finish(spark, env, result, [(k, analyses[j]) for k, j in zip(cer_at, idx)], False)
            rep = _new_report(reports)
            rep.mode = (f"partitioned: {len(idx)} statements share one shuffle by {plan.partition_column} into "
                        f"{env.tasks} tasks, each running matchrec.run_many over its rows")
            rep.explain = "\n".join(analyses[j].explain for j in idx)
            rep.filtering = freport
            rep.lines += filter_lines
            for k, j in zip(cer_at, idx):
                out[j] = done[k]
    return out


def shuffle_groups(members: list[int], analyses: dict) -> dict:
    """The statements ``members`` by shuffle: (PARTITION BY, key column) -> their numbers; a
    statement without PARTITION BY alone under ("", its number)."""
    groups: dict = {}
    for i in members:
        plan = analyses[i].plan
        part = plan.partition_column
        groups.setdefault((part.lower(), plan.key_column.lower()) if part else ("", i), []).append(i)
    return groups


def _filter_groups(spark, base, groups: dict, analyses: dict, env: Env, interval_filter: str) -> dict:
    """The interval filtering of every group over one table's cached scan ``base`` in ONE Spark
    job (``spark_filtering.filter_table``): group key -> (rows kept or None, [FilterReport]). Empty
    when filtering is off or the session asks each statement's own rounds; a statement without
    PARTITION BY whose interval plan is None is left to its own path (its report says why)."""
    from pyspark.sql import functions as F

    from matchrec.connectors.spark_filtering import filter_table, rounds_mode
    from matchrec.planner.cer_intervals import interval_plan
    if interval_filter == "off" or rounds_mode(spark) != "shared":
        return {}
    todo, asked = [], []
    for gkey, idx in groups.items():
        ips = [interval_plan(analyses[j].plan)[0] for j in idx]
        if not gkey[0] and ips[0] is None:
            continue
        src = base.where(F.col(_q(analyses[idx[0]].plan.key_column)).isNotNull())
        todo.append((src, env.arrow_schema(src.schema), ips))
        asked.append(gkey)
    if not todo:
        return {}
    return dict(zip(asked, filter_table(base, env.arrow_schema(base.schema), todo, interval_filter, RID)))


def _new_report(reports: list):
    from matchrec.connectors.spark_metrics import ClauseReport
    rep = ClauseReport(kind="CER statement")
    reports.append(rep)
    return rep
