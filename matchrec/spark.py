"""MATCH_RECOGNIZE for Spark SQL and PySpark.

Three forms, all matched on the executors by the same engine as on DuckDB:

* ``register(spark)`` adds the table function ``match_recognize`` to Spark SQL:
  ``SELECT * FROM match_recognize(TABLE(events), 'PARTITION BY k ORDER BY ts MEASURES ... PATTERN (...)
  DEFINE ...')``, or with the partitioning on the call:
  ``match_recognize(TABLE(events) PARTITION BY k ORDER BY (ts), '<body without them>')``.
  Spark's grammar reads ``ORDER BY ts, 'body'`` as two sort keys, so the call's ORDER BY needs
  parentheses (or pass ``body => '...'``). This form runs row by row in Python (Spark's table
  function protocol) and suits small and medium tables; the next two are the fast paths.
* ``match_recognize(df, body)`` returns a DataFrame (batches move as Arrow).
* ``sql(spark, statement)`` runs any Spark SQL statement with MATCH_RECOGNIZE anywhere a table
  can stand: each clause's input is run by Spark, matched, and the rest of the statement is
  run by Spark over the matches. ``EXPLAIN`` and ``EXPLAIN ANALYZE`` in front of the statement
  return the plan (and the measured rows, shuffle bytes and time) as a DataFrame.

``sql`` also takes CER statements (``PATTERN ... FROM t``, MATCH_RECOGNIZE with STRATEGY) over a
Spark table, and ``run_many(spark, statements)`` a workload of them (``spark_cer``).

They run on local sessions, on clusters (``ship(builder, archive)`` sends executors a packed
Python with matchrec, see ``matchrec.spark_env``) and through Spark Connect: only DataFrame
operations, no SparkContext, RDDs or broadcast variables.

Errors in a body are raised before any job runs, as ``AnalysisError``: both a matchrec
``ProgrammingError`` (or ``NotSupportedError``) and a pyspark ``AnalysisException``, with the
line and column in the text the user wrote.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from matchrec import errors as E
from matchrec.connectors import spark_matching as M
from matchrec.connectors.spark_common import cache, release  # noqa: F401 (release is public API)
from matchrec.connectors.spark_metrics import ClauseReport

__all__ = ["register", "match_recognize", "sql", "run_many", "ship", "source", "AnalysisError", "last_runs",
           "matchrec_error", "release"]

_ERROR_CLASSES: dict[type, type] = {}


def _spark_error(err: E.Error) -> Exception:
    """``err`` as an exception that is both its matchrec class and Spark's AnalysisException."""
    from pyspark.errors import AnalysisException
    base = type(err)
    cls = _ERROR_CLASSES.get(base)
    if cls is None:
        def __init__(self, message):  # noqa: N807
            AnalysisException.__init__(self, message=message)
            Exception.__init__(self, message)

        def __str__(self):  # noqa: N807
            return self.args[0] if self.args else ""
        cls = type(f"Spark{base.__name__}", (base, AnalysisException), {"__init__": __init__, "__str__": __str__})
        _ERROR_CLASSES[base] = cls
    new = cls(str(err))
    for attr in ("position", "problem", "end"):
        if hasattr(err, attr):
            setattr(new, attr, getattr(err, attr))
    return new


def matchrec_error(err: BaseException) -> E.Error | None:
    """The matchrec error a failed Spark job carries (a runtime error of matching raised on an
    executor arrives as Spark's PythonException), or None if it carries none.

    ``try: df.collect() except Exception as e: raise matchrec.spark.matchrec_error(e) or e``
    """
    import re
    if isinstance(err, E.Error):
        return err
    missing = _missing_matchrec(str(err))
    if missing is not None:
        return missing
    found = None
    for m in re.finditer(r"^(matchrec(?:\.\w+)*)\.(\w+): (.*)$", str(err), re.M):
        found = m
    if found is None:
        return None
    import importlib
    try:
        cls = getattr(importlib.import_module(found.group(1)), found.group(2))
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, E.Error)):
        return None
    text = str(err)
    message = text[found.start(3):]
    message = message.split("\n\tat org.apache")[0].split("\n SQLSTATE")[0].strip()
    return _plain(cls, message)


def _missing_matchrec(text: str) -> E.OperationalError | None:
    """The error of an executor whose Python cannot run matchrec, from a failed job's text."""
    import re
    m = re.search(r"No module named '(matchrec|duckdb|pyarrow|numba|sqlglot|lark|numpy|pandas)[.']", text)
    if m:
        return E.OperationalError(
            f"The Python of a Spark executor has no {m.group(1)} (its workers cannot import it): ship matchrec "
            "to the executors with matchrec.spark.ship(SparkSession.builder, 'matchrec-env.tar.gz') (archive "
            "made by 'matchrec spark-env'), or install matchrec in the Python the workers run")
    m = re.search(r'Cannot run program "([^"]+)"', text)
    if m:
        return E.OperationalError(
            f"A Spark executor cannot start the Python interpreter {m.group(1)!r} (set by PYSPARK_PYTHON or "
            "spark.pyspark.python): point it at a Python that exists on every worker, or ship one with "
            "matchrec.spark.ship(SparkSession.builder, 'matchrec-env.tar.gz')")
    return None


def _plain(cls, message: str) -> E.Error:
    try:
        return cls(message)
    except TypeError:  # classes with their own constructor arguments
        base = next(c for c in cls.__mro__ if c.__module__ == "matchrec.errors")
        return base(message)


class AnalysisError(E.ProgrammingError):
    """Documentation anchor: errors raised here are instances of their matchrec class and of
    ``pyspark.errors.AnalysisException``."""


# ------------------------------------------------------------------ options and bookkeeping
_LAST: list[ClauseReport] = []


def last_runs() -> list[ClauseReport]:
    """Reports of the clauses of the last ``sql``/``match_recognize`` call (this process)."""
    return list(_LAST)


def _session(df):
    return df.sparkSession


def _arrow_schema(struct) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(struct, timezone="UTC")


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema
    try:
        return from_arrow_schema(schema, prefer_timestamp_ntz=False)
    except Exception as err:  # noqa: BLE001 - unsupported Arrow types come as several classes
        raise E.NotSupportedError(f"An output column has a type Spark cannot hold ({err}); CAST the measure "
                                  "to a simpler type") from None


def _parallelism(spark) -> int:
    default = _prepare(spark)
    conf = spark.conf.get("spark.matchrec.partitions", None)
    if conf:
        return max(1, int(conf))
    return max(2, 2 * default)


_READY: dict[str, int] = {}  # application id -> default parallelism, once its executors ran matchrec


def _prepare(spark) -> int:
    """Before a session's first matchrec job: its Python workers run an interpreter that imports
    matchrec (checked with one small job, so a worker without it fails here with a clear error
    instead of inside a query); returns the session's default parallelism."""
    from matchrec.connectors.spark_metrics import collect, is_connect
    app = spark.conf.get("spark.app.id", None) or str(id(spark))
    if app in _READY:
        return _READY[app]
    if not is_connect(spark):
        _default_python(spark)
    # spark.range spreads its rows over the default parallelism: one probe row per task
    probe = spark.range(0, 1 << 16).mapInArrow(M.probe_task(), "tasks long")
    try:
        tasks = sum(r[0] for r in collect(probe))
    except Exception as err:  # noqa: BLE001 - a worker that cannot start comes back as many classes
        missing = _missing_matchrec(str(err))
        if missing is None:
            raise
        raise missing from None
    _READY[app] = max(1, tasks)
    return _READY[app]


def _default_python(spark) -> None:
    """A local session whose user chose no interpreter runs its workers with this one (Spark's own
    default, ``python3`` from PATH, seldom has pyarrow and never this environment's matchrec).
    Other masters keep what the user or the cluster configured."""
    import os
    import sys
    sc = spark.sparkContext
    if (sc.master.startswith("local") and "PYSPARK_PYTHON" not in os.environ
            and not sc.getConf().get("spark.pyspark.python", None) and sc.pythonExec == "python3"):
        sc.pythonExec = sys.executable


# ------------------------------------------------------------------ shipping matchrec to executors
ARCHIVE_NAME = "matchrec_env"  # the folder each executor unpacks the archive into


def ship(builder, archive: str | None = None):
    """Set up ``builder`` (a ``SparkSession.Builder``, before ``getOrCreate()``) so executors run
    matchrec from a packed environment: ``archive`` is made by ``matchrec spark-env OUT.tar.gz``
    (built into the user cache on first use when omitted). Spark unpacks it on every executor
    (``spark.archives``); their Python workers start its interpreter, found through the executors'
    PATH, and the driver's Python workers (the table function's analysis) start this interpreter
    under the same name. Returns ``builder``.
    """
    import os
    import shlex
    import sys
    import tempfile

    from matchrec import spark_env
    # an interpreter the user chose is never replaced: ship() refuses instead
    options = getattr(builder, "_options", {})
    for where, chosen in (("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON")),
                          ("spark.pyspark.python", options.get("spark.pyspark.python"))):
        if chosen and chosen != spark_env.LAUNCHER:
            raise E.ProgrammingError(f"{where} is set to {chosen!r}; ship() would start the executors with the "
                                     f"packed interpreter instead: unset {where}, or keep it and install "
                                     "matchrec in that Python on every worker")
    try:
        from pyspark import SparkContext
        if SparkContext._active_spark_context is not None:
            raise E.ProgrammingError("ship() must run before the SparkSession is created: the workers' "
                                     "interpreter is fixed when the session starts")
    except ImportError:  # pragma: no cover - pyspark is a requirement of this module
        pass
    if archive is None:
        cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "matchrec")
        os.makedirs(cache, exist_ok=True)
        archive = os.path.join(cache, f"spark-env-{spark_env.version()}-py{sys.version_info[0]}"
                                      f"{sys.version_info[1]}.tar.gz")
        if not os.path.exists(archive):
            spark_env.build(archive)
    archive = os.path.abspath(archive)
    if not os.path.exists(archive):
        raise E.ProgrammingError(f"no archive at {archive}: make it with 'matchrec spark-env {archive}'")
    # the driver: the launcher's name stands for this interpreter, in a private folder (a script,
    # not a link: a virtual environment's interpreter finds its environment from its own path)
    here = tempfile.mkdtemp(prefix="matchrec-python-")
    launcher = os.path.join(here, spark_env.LAUNCHER)
    with open(launcher, "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    os.chmod(launcher, 0o755)
    os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYSPARK_PYTHON"] = spark_env.LAUNCHER
    # the archive's bin first, then the executors' PATH the user set (or the usual system folders)
    executor_path = f"./{ARCHIVE_NAME}/bin:" + (options.get("spark.executorEnv.PATH")
                                                 or "/usr/local/bin:/usr/bin:/bin")
    archives = ",".join(filter(None, [options.get("spark.archives"), f"{archive}#{ARCHIVE_NAME}"]))
    return (builder.config("spark.archives", archives)
            .config("spark.executorEnv.PATH", executor_path))


# ------------------------------------------------------------------ the DataFrame form
def source(df, schema: pa.Schema | None = None):
    """``df`` as a ``connectors.source.Source`` whose shards are its partitions, for the
    dual-filtering rounds (``connectors.dual_filtering``). Like every Spark door it makes sure the
    workers import matchrec; ``schema`` is the Arrow schema of ``df`` (its Spark schema's by default)."""
    from matchrec.connectors.spark_filtering import SparkSource
    _prepare(df.sparkSession)
    return SparkSource(df, schema if schema is not None else _arrow_schema(df.schema))


def match_recognize(df, body: str, dialect: str = "spark", *, interval_filter: str = "auto"):
    """Match the MATCH_RECOGNIZE ``body`` (the text inside ``MATCH_RECOGNIZE ( ... )``) over
    ``df``; returns a DataFrame with the columns the clause defines.

    ``interval_filter`` (auto | on | off): pull only rows inside time intervals that can hold a
    match (dual filtering) before the shuffle to the matching stage; auto uses it when the
    pattern allows it and the cost model expects fewer bytes.
    """
    _LAST.clear()
    try:
        b = M.Body.parse(body, dialect)
        out, report = _match(df, b, interval_filter)
    except E.Error as err:
        raise _spark_error(err) from None
    _LAST.append(report)
    return out


def _match(df, body: M.Body, interval_filter: str = "auto"):
    """(DataFrame of matches, ClauseReport) for one body over ``df``."""
    spark = _session(df)
    input_schema = _arrow_schema(df.schema)
    analysis = M.analyze(body, input_schema)
    out_struct = _spark_schema(analysis.output_schema)
    out_arrow = _arrow_schema(out_struct)
    report = ClauseReport(explain=analysis.explain)
    spec = body.spec
    n = _parallelism(spark)
    started = time.perf_counter()
    source = df
    if interval_filter not in ("auto", "on", "off"):
        raise E.ProgrammingError("interval_filter must be auto, on or off")
    if interval_filter != "off":
        from matchrec.connectors.spark_filtering import filter_rows
        filtered, freport = filter_rows(df, analysis, interval_filter)
        report.filtering = freport
        report.lines += freport.lines()
        if filtered is not None:
            source = filtered
    if spec.partition_by:
        keys = [c.name for c in spec.partition_by]
        report.mode = f"partitioned: rows hash-partitioned by {', '.join(keys)} into {n} tasks"
        cols = [_column(df, c) for c in spec.partition_by]
        result = source.repartition(n, *cols).mapInArrow(
            M.match_task(body.text, body.dialect, input_schema, out_arrow), out_struct)
    elif spec.within is not None and not analysis.split_reason:
        result = _time_split(source, analysis, out_struct, out_arrow, n, report)
    else:
        why = analysis.split_reason if spec.within is not None else "no PARTITION BY and no WITHIN"
        report.mode = f"one task ({why})"
        result = source.repartition(1).mapInArrow(
            M.match_task(body.text, body.dialect, input_schema, out_arrow), out_struct)
    report.jobs_seconds = time.perf_counter() - started
    return result, report


def _column(df, ref):
    from pyspark.sql import functions as F
    names = {c.lower(): c for c in df.columns}
    name = ref.name if ref.quoted else names.get(ref.name.lower(), ref.name)
    return F.col("`" + name.replace("`", "``") + "`")


# ------------------------------------------------------------------ the time split
def _time_split(df, analysis: M.Analysis, out_struct, out_arrow: pa.Schema, n: int, report: ClauseReport):
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from matchrec.connectors.spark_metrics import collect, to_arrow
    spark = _session(df)
    body = analysis.body
    rid = f"{M.HIDDEN}rid"
    # row ids must not change between the jobs below: keep the numbered rows
    based = cache(df.withColumn(rid, F.monotonically_increasing_id()))
    in_schema = _arrow_schema(based.schema)
    # 1. key statistics and a sample for cuts of equal row counts
    stats = collect(based.mapInArrow(M.key_task(analysis.key_sql, in_schema, 97),
                                     "n long, nulls long, lo long, hi long, sample binary"))
    rows = sum(r["n"] for r in stats)
    if sum(r["nulls"] for r in stats):
        based.unpersist()
        report.mode = "one task (the ORDER BY key has NULLs, which the time split cannot place)"
        return df.repartition(1).mapInArrow(
            M.match_task(body.text, body.dialect, analysis.input_schema, out_arrow), out_struct)
    sample = np.sort(np.concatenate([np.frombuffer(r["sample"], np.int64) for r in stats])) \
        if stats else np.zeros(0, np.int64)
    ranges = max(n, -(-rows // 2_000_000))
    cuts = [int(sample[int(len(sample) * i / ranges)]) for i in range(1, ranges)] if len(sample) else []
    cuts = sorted(set(cuts))
    window = analysis.window
    # 2. the rows PREV() may read before each cut
    back = M.prev_rows(body) or 0
    starts = np.asarray(cuts, np.int64) - window
    if back and cuts:
        below = collect(based.mapInArrow(M.below_cuts_task(analysis.key_sql, in_schema, cuts, back),
                                         "cut int, key long"))
        for i in range(len(cuts)):
            keys = sorted((r["key"] for r in below if r["cut"] == i), reverse=True)
            earliest = keys[back - 1] if len(keys) >= back else (keys[-1] if keys else cuts[i])
            starts[i] = min(starts[i], earliest)
    # a row feeds every later range whose (context) start it reaches: keep starts non-decreasing
    starts = np.minimum.accumulate(starts[::-1])[::-1] if len(starts) else starts
    # 3. one task per range (each range id mapped to a value Spark's hash sends to its own task)
    k = len(cuts) + 1
    pkeys = _partition_keys(spark, k)
    ranged_struct = StructType(list(based.schema.fields) + [StructField(f"{M.HIDDEN}key", LongType(), False),
                                                            StructField(f"{M.HIDDEN}range", IntegerType(), False),
                                                            StructField(f"{M.HIDDEN}part", LongType(), False)])
    ranged = based.mapInArrow(M.range_task(analysis.key_sql, in_schema, cuts, window, starts.tolist(), pkeys,
                                           _arrow_schema(ranged_struct)), ranged_struct)
    text = M.split_body(body)
    match_in = _arrow_schema(StructType(list(based.schema.fields) + [StructField(f"{M.HIDDEN}key", LongType(), False)]))
    split = M.analyze(M.Body(text, body.dialect, M.Body.parse(text, body.dialect).spec, text, 0), match_in)
    split_struct = _spark_schema(split.output_schema)
    matched = ranged.repartition(k, f"{M.HIDDEN}part").drop(f"{M.HIDDEN}part").mapInArrow(
        M.split_match_task(text, body.dialect, match_in, _arrow_schema(split_struct), cuts), split_struct)
    hidden = [c for c in split_struct.names if c.startswith(M.HIDDEN)]
    report.mode = (f"time split: {k} ranges of ~{rows // max(k, 1)} rows, each read with WITHIN ({window} key "
                   f"units) after it" + (f" and {back} row(s) of PREV context before it" if back else "")
                   + "; matches kept by their start row's range")
    if body.spec.skip.kind == "next_row":
        result = matched.drop(*hidden)
    else:
        matched = cache(matched)
        ends = to_arrow(matched.select(*(f"{M.HIDDEN}{c}" for c in ("sk", "sr", "ek", "er"))).distinct())
        chosen = M.choose_past_last(*(ends.column(i).to_numpy() for i in range(4)))
        report.lines.append(f"time split: {ends.num_rows} candidate matches (one per start row), {len(chosen)} "
                            "chosen by AFTER MATCH SKIP PAST LAST ROW")
        keep = spark.createDataFrame(pa.table({f"{M.HIDDEN}chosen": pa.array(chosen, pa.int64())}))
        result = matched.join(F.broadcast(keep), F.col(f"{M.HIDDEN}sr") == F.col(f"{M.HIDDEN}chosen"),
                              "left_semi").drop(*hidden)
    out_names = [f.name for f in out_struct.fields]
    result = result.select(*[F.col("`" + c.replace("`", "``") + "`") for c in result.columns
                             if not c.startswith(M.HIDDEN)])
    if result.columns != out_names:  # pragma: no cover - the rewrite only appends hidden columns
        raise E.InternalError(f"time split changed the columns: {result.columns} vs {out_names}")
    return result


def _partition_keys(spark, k: int) -> list[int]:
    """For each range id 0..k-1 a long that Spark's hash partitioning into k tasks sends to task
    id, so every range gets its own task (range ids hashed directly collide)."""
    from pyspark.sql import functions as F
    from matchrec.connectors.spark_metrics import to_arrow
    rows = to_arrow(spark.range(0, 64 * k).select("id", F.pmod(F.hash("id"), F.lit(k)).alias("p")))
    ids, parts = rows.column(0).to_numpy(), rows.column(1).to_numpy()
    out = []
    for target in range(k):
        hit = np.flatnonzero(parts == target)
        out.append(int(ids[hit[0]]) if len(hit) else target)
    return out


# ------------------------------------------------------------------ Spark SQL with MATCH_RECOGNIZE
def sql(spark, statement: str, dialect: str = "spark", *, interval_filter: str = "auto"):
    """Run ``statement`` (Spark SQL, or SQL of ``dialect``) with MATCH_RECOGNIZE anywhere a table
    can stand; returns a DataFrame. ``EXPLAIN [ANALYZE] <statement>`` returns the plan lines."""
    _LAST.clear()
    try:
        return _sql(spark, statement, dialect, interval_filter)
    except E.Error as err:
        raise _spark_error(err) from None


def _sql(spark, statement: str, dialect: str, interval_filter: str):
    import re
    import secrets

    from matchrec.engine.statement import cte_prefixes, replace_identifiers, to_duckdb
    from matchrec.parser.query import has_match_recognize, split
    from matchrec.connectors.spark_metrics import ShuffleMeter
    from matchrec.parser.source import Origin
    from matchrec.parser.window import has_pattern_window
    m = re.match(r"\s*EXPLAIN(\s+ANALYZE)?\b", statement, re.I)
    explain = ("analyze" if m.group(1) else "plain") if m else None
    text = statement[m.end():] if m else statement
    pad = " " * (m.end() if m else 0)  # offsets of errors stay those of the user's statement
    from matchrec.parser.sase import has_strategy_clause, is_cer_statement
    if is_cer_statement(text) or has_strategy_clause(text):
        return _cer(spark, statement, explain, pad + text, interval_filter)
    if not has_match_recognize(text) and not has_pattern_window(text):
        out = to_duckdb(text, dialect, Origin.identity(len(text)), statement, write="spark")
        if explain:
            raise E.ProgrammingError("EXPLAIN through matchrec.spark.sql needs a MATCH_RECOGNIZE; use "
                                     "DataFrame.explain() for other statements")
        return spark.sql(out)
    query = split(pad + text, dialect)
    _prepare(spark)
    # EXPLAIN ANALYZE meters the whole call: the jobs run while the DataFrame is built (statistics,
    # interval filtering rounds) as well as the query, on both sides of the filtering comparison
    meter = ShuffleMeter(spark) if explain == "analyze" else None
    prefixes = cte_prefixes(query, write="spark")
    views: dict[str, str] = {}
    tag = secrets.token_hex(4)
    frames = []
    for i, clause in enumerate(query.clauses):
        input_text = f"SELECT * FROM {clause.input_text}"
        input_sql = to_duckdb(input_text, dialect, Origin.identity(len(input_text), clause.input_span.start - 14),
                              query.source, write="spark")
        input_sql = replace_identifiers(prefixes.get(clause.placeholder, "") + input_sql, views)
        try:
            df = spark.sql(input_sql)
        except Exception as err:  # noqa: BLE001 - Spark's analysis errors carry their own text
            raise E.ProgrammingError(f"Spark cannot read the input of MATCH_RECOGNIZE ({clause.input_text}): "
                                     f"{_first_line(err)}") from None
        start = query.source.index("(", clause.spec.span.start) + 1
        body = M.Body(query.source[start:clause.spec.span.end - 1], dialect, clause.spec, query.source, start)
        result, report = _match(df, body, interval_filter)
        _LAST.append(report)
        name = f"__matchrec_{tag}_{i}"
        result.createOrReplaceTempView(name)
        views[clause.placeholder] = name
        frames.append(result)
    text_out, origin_out = _windows(spark, query, dialect, prefixes, views, tag)
    outer = to_duckdb(text_out, dialect, origin_out, query.source, write="spark")
    outer = replace_identifiers(outer, views)
    try:
        final = spark.sql(outer)
    except Exception as err:  # noqa: BLE001
        raise E.ProgrammingError(f"Spark cannot run the statement around MATCH_RECOGNIZE: {_first_line(err)}") \
            from None
    if explain is None:
        return final
    unfiltered = None
    if explain == "analyze" and any(r.filtering is not None and r.filtering.used for r in _LAST):
        # the shuffle the filtering saved: the same statement again without it (measured after)
        unfiltered = lambda: _sql(spark, text, dialect, "off")  # noqa: E731
    return _explain(spark, final, meter, unfiltered)


def _cer_env(spark):
    from matchrec.spark_cer import Env
    return Env(_parallelism(spark), _partition_keys, _spark_schema, _arrow_schema)


def _cer(spark, statement: str, explain: str | None, text: str, interval_filter: str):
    """A CER statement (``text``: the statement with EXPLAIN [ANALYZE] blanked out)."""
    from matchrec import spark_cer
    from matchrec.connectors.spark_metrics import ShuffleMeter
    _prepare(spark)
    meter = ShuffleMeter(spark) if explain == "analyze" else None
    report = ClauseReport(kind="CER statement")
    started = time.perf_counter()
    final = spark_cer.run_statement(spark, text, _cer_env(spark), report, interval_filter)
    report.jobs_seconds = time.perf_counter() - started
    _LAST.append(report)
    if explain is None:
        return final
    def unfiltered():  # the shuffle the filtering saved: the same statement without it
        return spark_cer.run_statement(spark, text, _cer_env(spark), ClauseReport(kind="CER statement"), "off")
    filtered = explain == "analyze" and report.filtering is not None and report.filtering.used
    return _explain(spark, final, meter, unfiltered if filtered else None)


def run_many(spark, statements: list[str], *, interval_filter: str = "auto") -> list:
    """Evaluate a workload of CER statements (and SET/RESET statements, which apply to the ones
    after them) on Spark: one DataFrame per statement (None for SET/RESET), each with the rows
    ``matchrec.run_many`` returns for it on DuckDB over the same rows. Statements over one table
    share one scan; those with the same PARTITION BY column share one shuffle, each task running
    ``matchrec.run_many`` over its rows. ``interval_filter`` (auto | on | off), as for ``sql``: before
    a shared shuffle, only rows inside any of its statements' time interval sets are kept; one Spark
    job finds the sets of all of them (the session conf ``spark.matchrec.groupRounds=each`` makes
    each statement's own rounds instead, several jobs per statement)."""
    from matchrec import spark_cer
    _LAST.clear()
    try:
        if isinstance(statements, str) or not all(isinstance(s, str) for s in statements):
            raise E.ProgrammingError("run_many takes a list of statements (strings)")
        _prepare(spark)
        return spark_cer.run_workload(spark, list(statements), _cer_env(spark), _LAST, interval_filter)
    except E.Error as err:
        raise _spark_error(err) from None


def _windows(spark, query, dialect: str, prefixes: dict, views: dict, tag: str):
    """Run each window with PATTERN of ``query`` on the executors, as engine.window does on
    DuckDB: the SELECT's table (filtered by its WHERE) gets one column per measure, computed
    per partition by matchrec in the task; returns the statement text with placeholders."""
    from types import SimpleNamespace

    from matchrec.engine.statement import cte_prefixes, replace_identifiers, to_duckdb
    from matchrec.parser.query import Clause
    from matchrec.parser.window import has_pattern_window, split_windows
    if not has_pattern_window(query.text):
        return query.text, query.origin
    wq = split_windows(query.text, dialect, query.source, query.origin)
    clauses = [Clause(w.placeholder, w.source_text, w.span, w.spec, None) for w in wq.windows]
    prefixes = {**prefixes, **cte_prefixes(SimpleNamespace(text=wq.text, dialect=dialect, clauses=clauses),
                                           write="spark")}
    for i, w in enumerate(wq.windows):
        if w.pos_column in wq.text:
            raise E.NotSupportedError(f"On Spark only measures can be used over the window {w.name} with PATTERN "
                                      "(measure OVER w); compute window functions over its matches with "
                                      "matchrec.connect on DuckDB")
        text = f"SELECT * FROM {w.source_text}" + (f" WHERE {w.where_text}" if w.where_text else "")
        input_sql = to_duckdb(text, dialect, wq.origin, query.source, write="spark")
        input_sql = replace_identifiers(prefixes.get(w.placeholder, "") + input_sql, views)
        try:
            df = spark.sql(input_sql)
        except Exception as err:  # noqa: BLE001 - Spark's analysis errors carry their own text
            raise E.ProgrammingError(f"Spark cannot read the input of the window {w.name}: {_first_line(err)}") \
                from None
        from sqlglot import exp
        names = [exp.to_identifier(m.name).sql(dialect) for m in w.spec.measures]
        statement = M.window_statement(query.source[w.span.start:w.span.end], list(zip(names, w.measure_columns)))
        input_schema = _arrow_schema(df.schema)
        try:  # the output schema, and any error, before a Spark job starts
            empty = M.run_statement_local(input_schema.empty_table(), statement, dialect)
        except E.Error as err:
            raise E.ProgrammingError(f"The window {w.name} cannot run over its input: {err}") from None
        out_struct = _spark_schema(empty.schema)
        out_arrow = _arrow_schema(out_struct)
        task = M.statement_task(statement, dialect, input_schema, out_arrow)
        n = _parallelism(spark)
        if w.spec.partition_by:
            result = df.repartition(n, *[_column(df, c) for c in w.spec.partition_by]).mapInArrow(task, out_struct)
            mode = f"partitioned: rows hash-partitioned by {', '.join(c.name for c in w.spec.partition_by)}"
        else:
            result = df.repartition(1).mapInArrow(task, out_struct)
            mode = "one task (no PARTITION BY)"
        _LAST.append(ClauseReport(explain=f"window {w.name} with PATTERN", mode=mode))
        name = f"__matchrec_{tag}_w{i}"
        result.createOrReplaceTempView(name)
        views[w.placeholder] = name
        views[w.star_marker] = ", ".join("`" + c.replace("`", "``") + "`" for c in df.columns
                                         if not c.startswith("__mrw_"))
    return wq.text, wq.origin


def _first_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:500] if text else type(err).__name__


def _explain(spark, final, meter, unfiltered=None):
    from matchrec.connectors.spark_metrics import ShuffleMeter, count
    lines = []
    reports = list(_LAST)
    analyze = meter is not None
    if analyze:
        t0 = time.perf_counter()
        rows = count(final)
        seconds = time.perf_counter() - t0
        moved = meter.delta()
        without = None
        if unfiltered is not None:
            meter = ShuffleMeter(spark)
            t1 = time.perf_counter()
            plain = unfiltered()
            plain_rows = count(plain)
            without = (meter.delta(), time.perf_counter() - t1, plain_rows)
            _LAST[:] = reports
    for i, r in enumerate(_LAST):
        lines.append(f"{r.kind} #{i + 1} on Spark: {r.mode}")
        lines += ["  " + x for x in r.lines]
        lines += ["  " + x for x in r.explain.splitlines()]
    if analyze:
        lines.append(f"Analyze: {rows} result rows in {seconds:.3f} s (+{sum(r.jobs_seconds for r in _LAST):.3f} s "
                     "of planning jobs before the query)")
        lines.append(f"  shuffle: {moved.written} bytes written, {moved.read} bytes read, {moved.records} records "
                     f"written, over {moved.stages} stages (the whole statement, planning jobs included)")
        for r in _LAST:
            if r.filtering is not None and r.filtering.shuffle is not None:
                s = r.filtering.shuffle
                lines.append(f"  interval filtering rounds: {s.written} shuffle bytes written")
        if without is not None:
            w, secs, n = without
            ratio = w.written / moved.written if moved.written else float("inf")
            lines.append(f"  without interval filtering: {w.written} shuffle bytes written, {w.records} records, "
                         f"{secs:.3f} s, {n} result rows; filtering shuffled {ratio:.1f}x fewer bytes")
            if n != rows:  # pragma: no cover - the differential tests guard this
                raise E.InternalError(f"interval filtering changed the result: {rows} rows vs {n} without it")
    return spark.createDataFrame([(x,) for x in lines], "plan string")


# ------------------------------------------------------------------ the SQL table function
def register(spark, name: str = "match_recognize") -> None:
    """Register the table function ``name`` in ``spark`` (see the module docstring)."""
    _prepare(spark)
    spark.udtf.register(name, _table_function())


def _table_function():
    from dataclasses import dataclass as _dataclass

    from pyspark.sql.functions import udtf
    from pyspark.sql.types import StructType
    from pyspark.sql.udtf import AnalyzeArgument, AnalyzeResult, OrderingColumn, PartitioningColumn

    @_dataclass
    class Analyzed(AnalyzeResult):
        text: str = ""  # the body as executors run it
        dialect: str = "spark"
        input_schema: bytes = b""  # serialized Arrow schema of the rows (plus the hidden row number)

    class MatchRecognize:
        def __init__(self, analyze_result: Analyzed = None):
            self.result = analyze_result
            self.rows = []

        @staticmethod
        def analyze(table: AnalyzeArgument, body: AnalyzeArgument, dialect: AnalyzeArgument = None):
            if not table.isTable:
                raise _spark_error(E.ProgrammingError(
                    "match_recognize takes TABLE(...) first, e.g. match_recognize(TABLE(events), 'ORDER BY ts ...')"))
            if not body.isConstantExpression or not isinstance(body.value, str):
                raise _spark_error(E.ProgrammingError("The second argument of match_recognize must be the "
                                                      "MATCH_RECOGNIZE body as a constant string"))
            lang = dialect.value if dialect is not None and isinstance(dialect.value, str) else "spark"
            try:
                b = M.Body.parse(body.value, lang)
                schema = _arrow_schema(table.dataType)
                struct = _spark_schema(M.analyze(b, schema).output_schema)  # errors point into the body
                text = M.arrival_order_body(b)
                if text != b.text:  # rows keep the order they arrive in: number them
                    schema = schema.append(pa.field(f"{M.HIDDEN}rid", pa.int64()))
            except E.Error as err:
                raise _spark_error(err) from None
            kwargs = {}
            spec = b.spec
            if spec.partition_by:
                kwargs["partitionBy"] = [PartitioningColumn(_q(c)) for c in spec.partition_by]
            if spec.order_by:
                kwargs["orderBy"] = [OrderingColumn(_q(k.column), ascending=not k.descending,
                                                    overrideNullsFirst=k.nulls_first) for k in spec.order_by]
                if not spec.partition_by:
                    kwargs["withSinglePartition"] = True
            visible = StructType([f for f in struct.fields if not f.name.startswith(M.HIDDEN)])
            return Analyzed(schema=visible, text=text, dialect=lang,
                            input_schema=schema.serialize().to_pybytes(), **kwargs)

        def eval(self, row, body, dialect=None):
            self.rows.append(row)

        def terminate(self):
            if not self.rows:
                return
            r = self.result
            schema = pa.ipc.read_schema(pa.py_buffer(r.input_schema))
            n = len(self.rows)
            data = {f.name: [row[i] for row in self.rows] if not f.name.startswith(M.HIDDEN) else list(range(n))
                    for i, f in enumerate(schema)}
            table = pa.Table.from_pydict(data, schema=schema)
            out = M.run_local(table, r.text, r.dialect)
            keep = [i for i, name in enumerate(out.column_names) if not name.startswith(M.HIDDEN)]
            yield from zip(*[out.column(i).to_pylist() for i in keep])

    return udtf(MatchRecognize)


def _q(ref) -> str:
    return "`" + ref.name.replace("`", "``") + "`"
