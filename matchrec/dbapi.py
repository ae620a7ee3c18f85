"""The PEP 249 (DB-API 2.0) interface: ``connect()``, Connection and Cursor.

This module owns only what PEP 249 asks for: the objects, their attributes, the type objects,
the fetch methods and the locking between threads. Everything a statement does happens in the
connection's ``engine.session.Session`` (classification, SET, EXPLAIN, MATCH_RECOGNIZE, CER):
a cursor hands it the text and keeps the ``Result`` it returns.

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
import time
import warnings
from typing import Any, Iterable, Sequence

import duckdb
import pyarrow as pa

from matchrec import errors as E
from matchrec.engine import interrupts
from matchrec.connectors.duckdb_source import own_change
from matchrec.engine.errors import map_duckdb_error
from matchrec.engine.session import Result, Session

apilevel = "2.0"
threadsafety = 2  # threads may share a connection (calls on it are serialised)
paramstyle = "qmark"

DEFAULT_BATCH_SIZE = 131072  # DuckDB's default batch size for Arrow readers and tables


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
    return Connection(Session.open(database, dialect, read_only, config, storage_nodes, token, node_timeout,
                                   tls_root_certs))


def _serialised(method):
    """``method`` run holding the connection's lock (``self._lock``, shared by its cursors)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        duck = self._duck if isinstance(self, Connection) else self.connection._duck
        with self._lock, interrupts.forwarding(duck):  # Ctrl-C interrupts DuckDB at once
            return method(self, *args, **kwargs)
    return run


class Connection:
    def __init__(self, session: Session):
        self.session = session
        # The session's re-entrant lock: executemany (and run_many, through Session.claim) hold it
        # across the statements they execute.
        self._lock = session.lock
        self._active: Cursor | None = None
        session.on_claim = self._release  # a caller of the session directly must not find rows pending

    # The session's state, under the names a connection has always had
    @property
    def _duck(self) -> duckdb.DuckDBPyConnection:
        return self.session.duck

    @property
    def dialect(self) -> str:
        return self.session.dialect

    @property
    def settings(self):
        """The MATCH_RECOGNIZE engine's settings (``SET matchrec_...``): ``engine.executor.Settings``."""
        return self.session.settings

    @property
    def cer_settings(self):
        """The CER statements' settings (``SET matchrec_cer_...``): ``planner.cer.CerSettings``."""
        return self.session.cer_settings

    @property
    def remote(self):
        """``connectors.remote.RemoteStore`` when this is a compute node, else None."""
        return self.session.remote

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
        if self.session.closed:
            return
        self._release()
        self.session.close()

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
        self.session.register(name, obj)

    @_serialised
    def unregister(self, name: str) -> None:
        self._check()
        self._release()
        self.session.unregister(name)

    @property
    def duckdb_connection(self) -> duckdb.DuckDBPyConnection:
        return self.session.duck

    @property
    def closed(self) -> bool:
        return self.session.closed

    # -- internals
    def _check(self) -> None:
        if self.session.closed:
            raise E.InterfaceError("Connection is closed")

    def _release(self) -> None:
        """Buffer the pending result of whichever cursor holds the DuckDB connection."""
        if self._active is not None:
            active, self._active = self._active, None
            active._buffer()


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
            self._take(con.session.execute(operation, parameters))
        except BaseException:
            self._reset()
            raise
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

    def _take(self, result: Result) -> None:
        """Keep what the session returned: rows pending in DuckDB (streamed as fetched) or in memory."""
        if result.stats is not None:
            self.stats = result.stats
            self.pull_stats = result.pull_stats or []
        if result.cer_run is not None:
            self.cer_run = result.cer_run
        self._registered = list(result.registered)
        self._description = result.description
        self._rowcount = result.rowcount
        if result.pending:
            self._pending = True
            self.connection._active = self
        elif result.rows is not None:
            self._buffer_rows = result.rows

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
        duck = self.connection._duck
        for name in self._registered:
            try:  # a result name no kept planner answer reads: they stay valid
                own_change(duck, lambda: duck.unregister(name))
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
