"""The PEP 249 (DB-API 2.0) interface: ``connect()``, Connection and Cursor.

One DuckDB connection backs a matchrec Connection, so every cursor shares its session
(temporary tables, settings, transactions). A cursor's result stays in DuckDB and is
streamed as the user fetches; when another cursor of the same connection executes, the
pending result is first read into memory so both stay valid.

A DuckDB connection serves one call at a time and keeps one pending result, so threads that
share a Connection take turns: each execute (with every helper query it runs) and each fetch
holds the connection's re-entrant lock. A fetch takes the lock only for itself, so a thread
streaming a result never blocks another thread's statement; that statement first buffers it.
"""
from __future__ import annotations

import datetime
import functools
import re
import secrets
import threading
import time
import warnings
from dataclasses import fields
from typing import Any, Iterable, Sequence

import duckdb
import pyarrow as pa
import sqlglot

from matchrec import budget as work
from matchrec import errors as E
from matchrec.engine import interrupts
from matchrec.engine.errors import map_duckdb_error
from matchrec.engine.executor import Settings
from matchrec.engine.statement import Prepared, StatementRunner, to_duckdb
from matchrec.parser.query import dialect_of, has_match_recognize as _has_mr, split_statements
from matchrec.parser.window import has_pattern_window
from matchrec.parser.sase import has_strategy_clause, is_cer_statement
from matchrec.parser.source import Origin
from matchrec.planner.cer import CER_CHOICES, CerSettings

apilevel = "2.0"
threadsafety = 2  # threads may share a connection (calls on it are serialised)
paramstyle = "qmark"

_SET_RE = re.compile(
    r"^\s*(SET|RESET)\s+(?:SESSION\s+|GLOBAL\s+|LOCAL\s+)?(matchrec_\w+|pull_strategy)\s*(?:(?:=|TO)\s*(.+?))?\s*;?\s*$",
    re.I | re.S)
SETTINGS = {f"matchrec_{f.name}": f.name for f in fields(Settings)}
SETTINGS["pull_strategy"] = "pull_strategy"  # the name storage-node users know from the literature
DEFAULT_BATCH_SIZE = 131072  # DuckDB's default batch size for Arrow readers and tables
_CHOICES = {"pull_strategy": ("auto", "pull_all", "push_down", "naive_dfs", "dfs", "push_pull"),
            "round_trips": ("auto", "always", "never")}


def connect(database: str | duckdb.DuckDBPyConnection = ":memory:", dialect: str = "duckdb",
            read_only: bool = False, config: dict | None = None, storage_nodes: list[str] | None = None,
            token: str | None = None, node_timeout: float = 60.0,
            tls_root_certs: str | bytes | None = None) -> "Connection":
    """Open a matchrec connection on a DuckDB database file, ``:memory:``, or an existing connection.

    ``dialect`` is the SQL dialect queries are written in (duckdb, trino, snowflake, oracle, ...).
    With ``storage_nodes`` (``["grpc://host:port", ...]``) the connection is a compute node: the
    tables of the nodes can be queried by name, and MATCH_RECOGNIZE reads them with the pull
    strategy of ``SET pull_strategy`` (default auto: dual filtering where it is proven safe).
    ``token`` defaults to ``$MATCHREC_NODE_TOKEN``; ``grpc+tls://`` nodes are trusted through the
    system's authorities or ``tls_root_certs`` (a PEM file or its bytes; default
    ``$MATCHREC_NODE_TLS_ROOT_CERTS``).
    """
    dialect_of(dialect)
    if storage_nodes is not None:
        if isinstance(storage_nodes, str):
            storage_nodes = [u for u in storage_nodes.split(",") if u.strip()]
        from matchrec.connectors.remote import RemoteStore
        remote = RemoteStore([u.strip() for u in storage_nodes], token=token, timeout=node_timeout,
                             tls_root_certs=tls_root_certs)
        con = connect(database, dialect, read_only, config)
        con._attach_remote(remote)
        return con
    if isinstance(database, duckdb.DuckDBPyConnection):
        return Connection(database, dialect, owned=False)
    if not isinstance(database, str):
        raise E.InterfaceError("database must be a path, ':memory:' or a duckdb connection")
    try:
        con = duckdb.connect(database, read_only=read_only, config=config or {})
    except duckdb.Error as err:
        raise map_duckdb_error(err) from None
    return Connection(con, dialect, owned=True)


def _serialised(method):
    """``method`` run holding the connection's lock (``self._lock``, shared by its cursors)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        duck = self._duck if isinstance(self, Connection) else self.connection._duck
        with self._lock, interrupts.forwarding(duck):  # Ctrl-C interrupts DuckDB at once
            return method(self, *args, **kwargs)
    return run


class Connection:
    def __init__(self, duck: duckdb.DuckDBPyConnection, dialect: str, owned: bool):
        self._duck = duck
        # Re-entrant: run_many and executemany hold it across the statements they execute.
        self._lock = threading.RLock()
        self.dialect = dialect.lower()
        self._owned = owned
        self._closed = False
        self._active: Cursor | None = None
        self.settings = Settings()
        self.cer_settings = CerSettings()  # SET matchrec_cer_...: CER statements (PATTERN ... FROM ...)
        self.remote = None  # connectors.remote.RemoteStore when this is a compute node
        self._materialized: set[str] = set()

    def _attach_remote(self, remote) -> None:
        self.remote = remote
        self._placeholders()

    def _placeholders(self) -> None:
        """Register every storage-node table as an empty relation with its columns (for planning);
        a statement that reads one replaces it with pulled rows until the next statement."""
        for name, schema in self.remote.schemas.items():
            self._duck.register(name, schema.empty_table())
        self._materialized = set()

    # -- PEP 249
    def cursor(self) -> "Cursor":
        self._check()
        return Cursor(self)

    @_serialised
    def commit(self) -> None:
        self._check()
        self._release()
        try:
            self._duck.commit()
        except duckdb.TransactionException:
            pass  # nothing to commit: every statement already committed itself
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None

    @_serialised
    def rollback(self) -> None:
        self._check()
        self._release()
        try:
            self._duck.rollback()
        except duckdb.TransactionException:
            pass
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None

    @_serialised
    def close(self) -> None:
        if self._closed:
            return
        self._release()
        self._closed = True
        if self.remote is not None:
            self.remote.close()
        if self._owned:
            self._duck.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # -- conveniences
    @_serialised
    def execute(self, sql: str, parameters=None) -> "Cursor":
        cur = self.cursor()
        cur.execute(sql, parameters)
        return cur

    @_serialised
    def register(self, name: str, obj: Any) -> None:
        """Make a pandas DataFrame, Arrow table or similar queryable under ``name``."""
        self._check()
        self._release()
        try:
            self._duck.register(name, obj)
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None

    @_serialised
    def unregister(self, name: str) -> None:
        self._check()
        self._release()
        self._duck.unregister(name)

    @property
    def duckdb_connection(self) -> duckdb.DuckDBPyConnection:
        return self._duck

    @property
    def closed(self) -> bool:
        return self._closed

    # -- internals
    def _check(self) -> None:
        if self._closed:
            raise E.InterfaceError("Connection is closed")

    def _release(self) -> None:
        """Buffer the pending result of whichever cursor holds the DuckDB connection."""
        if self._active is not None:
            active, self._active = self._active, None
            active._buffer()


SETTING_MAX = (1 << 63) - 1  # settings reach the compiled matcher as 64-bit integers


def _integer_setting(name: str, raw: str, minimum: int) -> int:
    """The value of ``SET name = raw`` for an integer setting (digits may be grouped by _)."""
    try:
        value = int(raw.replace("_", ""))
        if not minimum <= value <= SETTING_MAX:
            raise ValueError
    except ValueError:
        raise E.ProgrammingError(f"SET {name} needs an integer >= {minimum} (and at most {SETTING_MAX:,}), "
                                 f"got {raw!r}") from None
    return value


def _needs_engine(sql: str) -> bool:
    """Whether the statement has row pattern recognition (MATCH_RECOGNIZE or a pattern window)."""
    return _has_mr(sql) or has_pattern_window(sql)


class Cursor:
    arraysize = 1

    def __init__(self, connection: Connection):
        self.connection = connection
        self._lock = connection._lock
        self.arraysize = 1
        self._closed = False
        self._description = None
        self._rowcount = -1
        self._pending = False
        self._buffer_rows: list[tuple] | None = None
        self._registered: list[str] = []
        self._prepared: Prepared | None = None
        self._explain_rows: list[tuple] | None = None
        self.stats: list = []  # per MATCH_RECOGNIZE of the last statement: (plan, Stats)
        self.pull_stats: list = []  # per MATCH_RECOGNIZE read from storage nodes: connectors.remote.PullStats
        self.cer_run = None  # engine.cer.CerRun of the last CER statement (plan and counters)
        self.elapsed = 0.0
        self._stream: _ResultStream | None = None  # the reader to_arrow_reader() handed out, while it reads DuckDB

    # -- PEP 249 attributes
    @property
    def description(self):
        return self._description

    @property
    def rowcount(self) -> int:
        return self._rowcount

    def setinputsizes(self, sizes) -> None:
        pass

    def setoutputsize(self, size, column=None) -> None:
        pass

    def callproc(self, procname, parameters=None):
        raise E.NotSupportedError("Stored procedures are not supported")

    # -- execution
    @_serialised
    def execute(self, operation: str, parameters: Sequence | dict | None = None) -> "Cursor":
        self._check()
        if not isinstance(operation, str):
            raise E.ProgrammingError("execute() needs the SQL text as a string")
        E.check_text(operation)
        if isinstance(parameters, dict):
            for name, value in parameters.items():
                E.check_parameter(value, f"Parameter {name}")
        elif isinstance(parameters, (list, tuple)):
            for i, value in enumerate(parameters):
                E.check_parameter(value, f"Parameter {i + 1}")
        con = self.connection
        con._release()
        self._reset()
        started = time.perf_counter()
        try:
            self._run(operation, parameters)
        except E.Error:
            self._reset()
            raise
        except duckdb.Error as err:
            self._reset()
            raise map_duckdb_error(err) from None
        except (KeyboardInterrupt, MemoryError):
            self._reset()
            raise
        except work.BudgetExceeded:  # arrived just as its statement ended
            self._reset()
            raise work.memory_error(con.settings.max_memory_mb) from None
        except RuntimeError as err:
            self._reset()
            if "interrupted" in str(err).lower():  # DuckDB's own answer to Ctrl-C
                raise KeyboardInterrupt() from None
            raise E.InternalError(f"Internal error while executing the query ({type(err).__name__}: {err}). "
                                  "Please report it with the query.") from err
        except RecursionError:
            self._reset()
            raise E.OperationalError("The query is too deeply nested to process") from None
        except sqlglot.errors.SqlglotError as err:  # a statement sqlglot cannot read or write
            self._reset()
            raise E.ProgrammingError(f"Cannot read the statement: {err}") from None
        except Exception as err:  # noqa: BLE001 - never let an engine bug escape as a raw exception
            self._reset()
            raise E.InternalError(f"Internal error while executing the query ({type(err).__name__}: {err}). "
                                  "Please report it with the query.") from err
        finally:
            self.elapsed = time.perf_counter() - started
        return self

    @_serialised
    def executemany(self, operation: str, seq_of_parameters: Iterable) -> "Cursor":
        total = 0
        for params in seq_of_parameters:
            self.execute(operation, params)
            if self._rowcount > 0:
                total += self._rowcount
            if self._pending:
                self._buffer()
        self._rowcount = total if total else self._rowcount
        return self

    def _run(self, sql: str, params) -> None:
        con = self.connection
        if params is not None and not isinstance(params, (list, tuple, dict)):
            raise E.ProgrammingError("parameters must be a sequence or a mapping")
        setting = _SET_RE.match(sql)
        if setting:
            self._set(setting)
            return
        if is_cer_statement(sql) or has_strategy_clause(sql):
            if params:
                raise E.NotSupportedError("CER statements (PATTERN ... FROM, MATCH_RECOGNIZE with STRATEGY) take no "
                                          "parameters: write the values into the statement")
            self._run_cer(sql)
            return
        if con.remote is not None:
            con.remote.retries = con.settings.node_retries
            con.remote.retry_backoff = con.settings.node_retry_backoff_ms / 1000
            if con._materialized:
                con._placeholders()
        if not _needs_engine(sql):
            text = to_duckdb(sql, con.dialect, Origin.identity(len(sql)), sql) if con.dialect != "duckdb" else sql
            self._materialize(text)
            self._duck_execute(text, params)
            return
        statements = split_statements(sql, con.dialect)
        for i, (text, _) in enumerate(statements):
            if i < len(statements) - 1:
                self._run_one(text, None if not _needs_engine(text) else None)
                self._buffer()
                self._reset()
            else:
                self._run_one(text, params)

    def _run_one(self, sql: str, params) -> None:
        con = self.connection
        if not _needs_engine(sql):
            text = to_duckdb(sql, con.dialect, Origin.identity(len(sql)), sql)
            self._materialize(text)
            self._duck_execute(text, params)
            return
        runner = StatementRunner(con._duck, con.settings, con.dialect, con.remote, con._materialized)
        with work.statement(con.settings):
            prepared = runner.prepare(sql, params)
        self._registered = list(prepared.registered)
        self.stats = [(run.plan, run.stats) for run in prepared.runs]
        self.pull_stats = [run.pull for run in prepared.runs if run.pull is not None]
        if prepared.explain is not None:
            self._explain(prepared, sql)
            return
        self._duck_execute(prepared.sql, None, source=sql)

    def _run_cer(self, sql: str) -> None:
        """A CER statement: matched in Python over events read from DuckDB, the result served by DuckDB."""
        from matchrec.engine import cer
        from matchrec.parser.sase import parse
        con = self.connection
        if con.remote is not None:
            raise E.NotSupportedError("CER statements read local DuckDB tables; storage-node tables are not supported")
        with work.statement(con.settings):
            run = cer.execute(con._duck, parse(sql), con.cer_settings)
        self.cer_run = run
        if run.explain is not None:
            self._description = [("explain_key", "VARCHAR", None, None, None, None, None),
                                 ("explain_value", "VARCHAR", None, None, None, None, None)]
            self._buffer_rows = [("matchrec", run.explain)]
            return
        name = f"__matchrec_cer_result_{secrets.token_hex(6)}"
        con._duck.register(name, run.table)
        self._registered = [name]
        self._duck_execute(f"SELECT * FROM {name}", None)

    def _materialize(self, sql: str) -> None:
        con = self.connection
        if con.remote is not None:
            StatementRunner(con._duck, con.settings, con.dialect, con.remote, con._materialized).materialize(sql)

    def _duck_execute(self, sql: str, params, source: str | None = None) -> None:
        con = self.connection
        duck = con._duck
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if params is None:
                    duck.execute(sql)
                else:
                    duck.execute(sql, params)
        except duckdb.Error as err:
            self._unregister()
            if source is not None:
                raise map_duckdb_error(err, source, 0) from None
            raise map_duckdb_error(err) from None
        self._description = duck.description
        self._rowcount = duck.rowcount
        self._pending = True
        con._active = self

    def _explain(self, prepared: Prepared, source: str) -> None:
        con = self.connection
        lines = []
        for i, run in enumerate(prepared.runs):
            lines.append(f"MATCH_RECOGNIZE #{i + 1}" if run.window is None else
                         f"#{i + 1}: window {run.window} with PATTERN")
            lines.append(run.plan.explain())
            if prepared.explain == "analyze":
                s = run.stats
                lines.append(f"Analyze: rows in {s.rows_in}, partitions {s.partitions}, matches {s.matches} "
                             f"(+{s.empty_matches} empty), rows out {s.rows_out}")
                lines.append(f"  matcher {s.matcher}: {s.match_seconds:.3f} s; output and MEASURES "
                             f"{s.output_seconds:.3f} s; DuckDB input {run.input_seconds:.3f} s")
                if s.starts_tried or s.starts_pruned:
                    lines.append(f"  reference matcher started at {s.starts_tried} rows; "
                                 f"{s.starts_pruned} start rows pruned by the compiled pre-filter")
                lines.append(f"  DuckDB fallback evaluations {s.fallback_calls}")
                for key, value in s.extra.items():
                    lines.append(f"  {key}: {value}")
        rows = [("matchrec", "\n".join(lines))]
        keyword = "EXPLAIN ANALYZE " if prepared.explain == "analyze" else "EXPLAIN "
        try:
            duck_rows = con._duck.execute(keyword + prepared.sql).fetchall()
            rows += [(str(a), str(b)) for a, b in duck_rows]
        except duckdb.Error as err:  # DuckDB's excerpt would show the SQL matchrec wrote, not the user's
            raise map_duckdb_error(err, source, 0) from None
        finally:
            self._unregister()
        self._description = [("explain_key", "VARCHAR", None, None, None, None, None),
                             ("explain_value", "VARCHAR", None, None, None, None, None)]
        self._buffer_rows = rows
        self._rowcount = -1

    def _set(self, m: re.Match) -> None:
        settings = self.connection.settings
        name = m.group(2).lower()
        if name.startswith("matchrec_cer_"):
            self._set_cer(name, m)
            return
        if name not in SETTINGS:
            raise E.ProgrammingError(f"Unknown setting {name}; known: {', '.join(sorted(SETTINGS))}")
        attr = SETTINGS[name]
        if m.group(1).upper() == "RESET":
            setattr(settings, attr, getattr(Settings(), attr))
            return
        raw = (m.group(3) or "").strip().strip("'\"")
        if attr in _CHOICES:
            if raw.lower() not in _CHOICES[attr]:
                raise E.ProgrammingError(f"SET {name} takes one of {', '.join(_CHOICES[attr])}, got {raw!r}")
            setattr(settings, attr, raw.lower())
            return
        minimum = 0 if attr in ("fast_path", "prefilter", "node_retries", "node_retry_backoff_ms") else 1
        setattr(settings, attr, _integer_setting(name, raw, minimum))

    def _set_cer(self, name: str, m: re.Match) -> None:
        settings = self.connection.cer_settings
        attr = name[len("matchrec_cer_"):]
        known = [f.name for f in fields(CerSettings)]
        if attr not in known:
            raise E.ProgrammingError(f"Unknown setting {name}; known: "
                                     f"{', '.join('matchrec_cer_' + k for k in known)}")
        if m.group(1).upper() == "RESET":
            setattr(settings, attr, getattr(CerSettings(), attr))
            return
        raw = (m.group(3) or "").strip().strip("'\"")
        if attr in CER_CHOICES:
            if raw.lower() not in CER_CHOICES[attr]:
                raise E.ProgrammingError(f"SET {name} takes one of {', '.join(CER_CHOICES[attr])}, got {raw!r}")
            setattr(settings, attr, raw.lower())
        elif attr in ("max_matches", "max_partial_matches"):
            setattr(settings, attr, _integer_setting(name, raw, 1))
        else:
            if not raw:
                raise E.ProgrammingError(f"SET {name} needs a column name")
            setattr(settings, attr, raw)

    # -- fetching
    @_serialised
    def fetchone(self):
        self._check_result()
        if self._buffer_rows is not None:
            return self._buffer_rows.pop(0) if self._buffer_rows else None
        try:
            row = self.connection._duck.fetchone()
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        if row is None:
            self._finish()
        return row

    @_serialised
    def fetchmany(self, size: int | None = None) -> list:
        self._check_result()
        size = self.arraysize if size is None else size
        if self._buffer_rows is not None:
            out, self._buffer_rows = self._buffer_rows[:size], self._buffer_rows[size:]
            return out
        try:
            rows = self.connection._duck.fetchmany(size)
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        if len(rows) < size:
            self._finish()
        return rows

    @_serialised
    def fetchall(self) -> list:
        self._check_result()
        if self._buffer_rows is not None:
            out, self._buffer_rows = self._buffer_rows, []
            return out
        try:
            rows = self.connection._duck.fetchall()
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        self._finish()
        return rows

    @_serialised
    def fetch_arrow_table(self) -> pa.Table:
        """The remaining rows of the result as an Arrow table (exact DuckDB types)."""
        self._check_result()
        if self._buffer_rows is not None:
            names = [d[0] for d in self._description or []]
            rows, self._buffer_rows = self._buffer_rows, []
            return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = self.connection._duck.to_arrow_table()
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        self._finish()
        return table

    # -- results as DuckDB's Python API gives them (same names and defaults as DuckDB 2.0)
    def to_arrow_table(self, batch_size: int = DEFAULT_BATCH_SIZE) -> pa.Table:
        """The remaining rows as an Arrow table (``batch_size`` is accepted for DuckDB's signature)."""
        _check_batch_size(batch_size)
        return self.fetch_arrow_table()

    @_serialised
    def to_arrow_reader(self, batch_size: int = DEFAULT_BATCH_SIZE) -> pa.RecordBatchReader:
        """A ``pyarrow.RecordBatchReader`` streaming the remaining rows in batches of at most ``batch_size``.

        The rows belong to the reader from then on (fetchone() returns None, as in DuckDB); they are read
        from DuckDB as the reader is consumed. Running another statement on the connection first reads
        what is left into memory, so the reader stays valid.
        """
        _check_batch_size(batch_size)
        self._check_result()
        if self._pending and self._buffer_rows is None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    duck_reader = self.connection._duck.to_arrow_reader(batch_size)
            except duckdb.Error as err:
                raise map_duckdb_error(err) from None
            self._stream = _ResultStream(self, duck_reader)
            self._pending = False
            self._buffer_rows = []
            return pa.RecordBatchReader.from_batches(duck_reader.schema, self._stream.batches())
        table = self.fetch_arrow_table()
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=batch_size))

    def arrow(self, batch_size: int = DEFAULT_BATCH_SIZE) -> pa.RecordBatchReader:
        """DuckDB 2.0's ``arrow()``: the same reader as :meth:`to_arrow_reader` (not a table)."""
        return self.to_arrow_reader(batch_size)

    def fetch_record_batch(self, rows_per_batch: int = DEFAULT_BATCH_SIZE) -> pa.RecordBatchReader:
        """DuckDB's older name of :meth:`to_arrow_reader`, kept for code written against it."""
        return self.to_arrow_reader(rows_per_batch)

    @_serialised
    def df(self, *, date_as_object: bool = False):
        """The remaining rows as a pandas DataFrame (DATE columns as datetime64 unless ``date_as_object``)."""
        try:
            import pandas  # noqa: F401 - fail before the rows are consumed
        except ImportError:
            raise E.NotSupportedError("df() needs pandas: pip install pandas") from None
        self._check_result()
        if self._pending and self._buffer_rows is None:
            # DuckDB's own conversion, so dtypes are exactly what a DuckDB user gets
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    frame = self.connection._duck.df(date_as_object=date_as_object)
            except duckdb.Error as err:
                raise map_duckdb_error(err) from None
            self._finish()
            return frame
        return self.fetch_arrow_table().to_pandas(date_as_object=date_as_object)

    fetchdf = df
    fetch_df = df

    def pl(self, batch_size: int = DEFAULT_BATCH_SIZE, *, lazy: bool = False):
        """The remaining rows as a polars DataFrame (a LazyFrame with ``lazy=True``); polars is optional."""
        _check_batch_size(batch_size)
        try:
            import polars
        except ImportError:
            raise E.NotSupportedError("pl() needs polars: pip install polars") from None
        frame = polars.from_arrow(self.fetch_arrow_table())
        return frame.lazy() if lazy else frame

    def fetchnumpy(self) -> dict:
        """The remaining rows as a dict of column name to numpy array."""
        table = self.fetch_arrow_table()
        return {name: column.to_numpy(zero_copy_only=False) for name, column in zip(table.column_names,
                                                                                      table.columns)}

    def __iter__(self):
        while True:
            row = self.fetchone()
            if row is None:
                return
            yield row

    @_serialised
    def close(self) -> None:
        if self._closed:
            return
        if self.connection._active is self:
            self.connection._active = None
        self._reset()
        self._closed = True

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals
    def _check(self) -> None:
        if self._closed:
            raise E.InterfaceError("Cursor is closed")
        self.connection._check()

    def _check_result(self) -> None:
        self._check()
        if self._description is None and self._buffer_rows is None:
            if not self._pending:
                raise E.ProgrammingError("No result to fetch: execute a query first")

    def _buffer(self) -> None:
        """Read the rest of a pending DuckDB result into memory (another statement is about to run)."""
        if self._stream is not None:
            self._stream.spill()
        if self._pending:
            try:
                rows = self.connection._duck.fetchall()
            except duckdb.Error:
                rows = []
            self._buffer_rows = rows
            self._pending = False
            if self.connection._active is self:
                self.connection._active = None
        self._unregister()

    def _finish(self) -> None:
        if self._pending:
            self._pending = False
            if self.connection._active is self:
                self.connection._active = None
            self._buffer_rows = []
        self._unregister()

    def _reset(self) -> None:
        if self._stream is not None:
            self._stream.spill()  # a reader handed out earlier keeps its rows
        if self._pending and self.connection._active is self:
            self.connection._active = None
        self._pending = False
        self._unregister()
        self._description = None
        self._rowcount = -1
        self._buffer_rows = None

    def _unregister(self) -> None:
        if self._stream is not None:
            return  # the reader may still scan the registered result tables
        for name in self._registered:
            try:
                self.connection._duck.unregister(name)
            except duckdb.Error:
                pass
        self._registered = []


def _check_batch_size(size) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise E.ProgrammingError(f"The batch size must be a positive integer, got {size!r}")


class _ResultStream:
    """The batches of a pending DuckDB result that a cursor handed out as a RecordBatchReader.

    DuckDB's reader keeps the connection busy until it is drained, so before another statement runs the
    rest is read into memory (spill) and the user's reader continues from there.
    """

    def __init__(self, cursor: Cursor, duck_reader: pa.RecordBatchReader):
        self.cursor = cursor
        self.duck_reader: pa.RecordBatchReader | None = duck_reader
        self.spilled: list[pa.RecordBatch] | None = None
        cursor.connection._active = cursor

    def batches(self):
        # Each batch is read holding the connection's lock: another thread's statement spills the
        # rest between two batches, never in the middle of one.
        while True:
            with self.cursor._lock:
                if self.duck_reader is None:
                    break
                try:
                    batch = self.duck_reader.read_next_batch()
                except StopIteration:
                    self._done()
                    break
                except duckdb.Error as err:
                    self._done()
                    raise map_duckdb_error(err) from None
            yield batch
        while self.spilled:
            yield self.spilled.pop(0)

    def spill(self) -> None:
        if self.duck_reader is not None:
            try:
                self.spilled = list(self.duck_reader)
            except duckdb.Error:
                self.spilled = []
            self._done()

    def _done(self) -> None:
        if self.duck_reader is not None:
            self.duck_reader.close()
            self.duck_reader = None
        cursor = self.cursor
        if cursor._stream is self:
            cursor._stream = None
            if cursor.connection._active is cursor:
                cursor.connection._active = None
            cursor._unregister()


# ---------------------------------------------------------------- PEP 249 type objects and constructors
class _DBAPIType:
    def __init__(self, *names: str):
        self.names = {n.upper() for n in names}

    def __eq__(self, other) -> bool:
        text = str(other).upper()
        return any(text == n or text.startswith(n + "(") for n in self.names)

    def __hash__(self) -> int:
        return hash(frozenset(self.names))


STRING = _DBAPIType("VARCHAR", "CHAR", "TEXT", "STRING", "UUID", "JSON", "ENUM")
BINARY = _DBAPIType("BLOB", "BYTEA", "BINARY", "VARBINARY", "BIT")
NUMBER = _DBAPIType("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                    "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL", "REAL", "BOOLEAN")
DATETIME = _DBAPIType("DATE", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "INTERVAL", "TIMESTAMP_NS",
                      "TIMESTAMP_MS", "TIMESTAMP_S")
ROWID = _DBAPIType("ROWID")

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> datetime.date:  # noqa: N802 - PEP 249 name
    return datetime.date.fromtimestamp(ticks)


def TimeFromTicks(ticks: float) -> datetime.time:  # noqa: N802
    return datetime.datetime.fromtimestamp(ticks).time()


def TimestampFromTicks(ticks: float) -> datetime.datetime:  # noqa: N802
    return datetime.datetime.fromtimestamp(ticks)
