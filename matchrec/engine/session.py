"""The session: the one engine object every entry point calls (the front door of matchrec).

A ``Session`` owns a DuckDB connection and everything a statement may read or change: the
settings of the MATCH_RECOGNIZE engine and of CER statements, the SQL dialect statements are
written in, and the registered sources (local objects, storage-node tables of a compute node,
Spark inputs). Entry points hand it work and get results back:

* the DB-API cursor (``matchrec.dbapi``) classifies nothing itself: ``execute(text, params)``
  classifies the statement once (``parser.classify``) and runs it; the ``Result`` says whether
  the rows wait in DuckDB (the cursor streams them) or are held in memory (EXPLAIN);
* ``run_many`` (``engine.multi``) classifies each statement of a workload, evaluates CER
  pattern queries in groups and runs the others with ``execute``/``table``;
* Spark (``connectors.spark_matching``) hands ``match`` a parsed clause and an Arrow table.

Errors leave the session as matchrec's PEP 249 classes, whichever entry point called.
Open one with ``Session.open(database, dialect=...)`` (a path, ``:memory:`` or a DuckDB
connection) or ``Session(duck_connection)``. A session serves one call at a time: callers
that share one between threads take turns on ``lock`` (the DB-API connection holds it around
each call; ``claim`` holds it around a workload).
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot

from matchrec import budget as work
from matchrec import errors as E
from matchrec.engine import explain as X
from matchrec.engine import interrupts
from matchrec.engine import settings as S
from matchrec.connectors.duckdb_source import own_change
from matchrec.engine.errors import map_duckdb_error
from matchrec.engine.executor import Settings
from matchrec.engine.statement import ClauseRun, StatementRunner, to_duckdb
from matchrec.parser.classify import Statement, classify
from matchrec.parser.query import dialect_of
from matchrec.parser.source import Origin
from matchrec.planner.cer import CerSettings


@dataclass
class Result:
    """What one statement returned. ``pending``: the rows wait in the session's DuckDB connection
    (read them with ``duck.fetch*`` before the next statement, then ``release``); otherwise
    ``rows`` holds them (EXPLAIN) or there are none (``description`` None: SET, RESET)."""
    description: list | None = None
    rowcount: int = -1
    rows: list[tuple] | None = None
    pending: bool = False
    registered: list[str] = field(default_factory=list)  # Arrow objects the rows are read from
    stats: list | None = None  # per clause run of the statement: (plan, Stats); None if no clause ran
    pull_stats: list | None = None  # per clause read from storage nodes: connectors.remote.PullStats
    cer_run: Any = None  # engine.cer.CerRun of a CER statement (plan and counters)


@dataclass
class ClauseResult:
    """One MATCH_RECOGNIZE clause run over an Arrow table (``Session.match``)."""
    table: pa.Table
    plan: Any  # planner.plan.Plan
    stats: Any  # engine.executor.Stats
    explain: str  # what EXPLAIN shows for the clause


class Session:
    def __init__(self, duck: duckdb.DuckDBPyConnection, dialect: str = "duckdb", owned: bool = False):
        dialect_of(dialect)
        self.duck = duck
        self.dialect = dialect.lower()
        self.owned = owned  # close() closes the DuckDB connection too
        self.settings = Settings()
        self.cer_settings = CerSettings()  # SET matchrec_cer_...: CER statements (PATTERN ... FROM ...)
        self.remote = None  # connectors.remote.RemoteStore when this is a compute node
        self.sources: dict[str, str] = {}  # registered name -> what it is (local, storage node, spark input)
        self.materialized: set[str] = set()  # storage-node tables pulled whole for the current statement
        self.closed = False
        # Callers sharing the session between threads take turns on this (re-entrant) lock; the
        # DB-API connection holds it around each call, ``claim`` around a whole workload.
        self.lock = threading.RLock()
        # Called under the lock before a caller runs statements on the session directly: the owner
        # of the session (the DB-API connection) reads a cursor's pending rows into memory there.
        self.on_claim = None

    @classmethod
    def open(cls, database: str | duckdb.DuckDBPyConnection = ":memory:", dialect: str = "duckdb",
             read_only: bool = False, config: dict | None = None, storage_nodes: list[str] | str | None = None,
             token: str | None = None, node_timeout: float = 60.0,
             tls_root_certs: str | bytes | None = None) -> "Session":
        """A session on a DuckDB database file, ``:memory:`` or an existing DuckDB connection (not
        closed with the session); with ``storage_nodes`` a compute node (see ``matchrec.connect``)."""
        dialect_of(dialect)
        remote = None
        if storage_nodes is not None:
            if isinstance(storage_nodes, str):
                storage_nodes = [u for u in storage_nodes.split(",") if u.strip()]
            from matchrec.connectors.remote import RemoteStore
            remote = RemoteStore([u.strip() for u in storage_nodes], token=token, timeout=node_timeout,
                                 tls_root_certs=tls_root_certs)
        if isinstance(database, duckdb.DuckDBPyConnection):
            session = cls(database, dialect, owned=False)
        elif not isinstance(database, str):
            raise E.InterfaceError("database must be a path, ':memory:' or a duckdb connection")
        else:
            try:
                duck = duckdb.connect(database, read_only=read_only, config=config or {})
            except duckdb.Error as err:
                raise map_duckdb_error(err) from None
            session = cls(duck, dialect, owned=True)
        if remote is not None:
            session.attach_remote(remote)
        return session

    # ------------------------------------------------------------ sources
    def attach_remote(self, remote) -> None:
        """Make this a compute node reading the tables of ``remote`` (a connectors.remote.RemoteStore)."""
        self.remote = remote
        self._placeholders()

    def _placeholders(self) -> None:
        """Register every storage-node table as an empty relation with its columns (for planning);
        a statement that reads one replaces it with pulled rows until the next statement."""
        for name, schema in self.remote.schemas.items():
            self.duck.register(name, schema.empty_table())
            self.sources[name] = "storage node"
        self.materialized = set()

    def register(self, name: str, obj: Any, kind: str = "local") -> None:
        """Make a pandas DataFrame, Arrow table or similar queryable under ``name``."""
        try:
            self.duck.register(name, obj)
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        self.sources[name] = kind

    def unregister(self, name: str) -> None:
        self.duck.unregister(name)
        self.sources.pop(name, None)

    @contextlib.contextmanager
    def claim(self):
        """The session for one caller's exclusive use (``run_many``): other threads wait until the
        block ends, and whatever the owner keeps pending in DuckDB is read first."""
        with self.lock:
            if self.closed:
                raise E.InterfaceError("Connection is closed")
            if self.on_claim is not None:
                self.on_claim()
            yield self

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.remote is not None:
            self.remote.close()
        if self.owned:
            self.duck.close()

    # ------------------------------------------------------------ statements
    def classify(self, text: str, parameters=None) -> Statement:
        """``text`` classified once in the session's dialect (see parser.classify)."""
        E.check_text(text)
        return classify(text, self.dialect, parameters)

    def execute(self, statement: Statement | str, parameters=None) -> Result:
        """Run one statement (classified, or text to classify with ``parameters``)."""
        with interrupts.forwarding(self.duck), self.errors():
            if isinstance(statement, str):
                statement = self.classify(statement, parameters)
            return self._execute(statement)

    def table(self, statement: Statement | str, parameters=None) -> pa.Table:
        """The rows of one statement as an Arrow table (an empty table for SET, RESET and the like)."""
        result = self.execute(statement, parameters)
        try:
            if result.description is None:
                return pa.table({})
            return self.fetch_table(result)
        finally:
            self.release(result)

    def fetch_table(self, result: Result) -> pa.Table:
        """The (remaining) rows of ``result`` as an Arrow table."""
        if not result.pending:
            names = [d[0] for d in result.description or []]
            rows, result.rows = result.rows or [], []
            return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = self.duck.to_arrow_table()
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        result.pending = False
        return table

    def release(self, result: Result, keep: bool = False) -> list[tuple] | None:
        """Done with ``result``: its registered objects are dropped; rows still pending in DuckDB are
        read into memory and returned when ``keep`` (another statement is about to run), else dropped."""
        rows = None
        if result.pending:
            try:
                rows = self.duck.fetchall()
            except duckdb.Error:
                rows = []
            result.pending = False
        self.unregister_all(result.registered)
        result.registered = []
        return rows if keep else None

    def unregister_all(self, names) -> None:
        for name in names:
            try:  # a result name no kept planner answer reads: they stay valid
                own_change(self.duck, lambda: self.duck.unregister(name))
            except duckdb.Error:
                pass

    def set(self, name: str, value: Any = None, reset: bool = False) -> None:
        """``SET name = value`` (``RESET name`` when ``reset``) without writing the statement."""
        S.apply(self.settings, self.cer_settings, name, None if value is None else str(value), reset)

    def _execute(self, statement: Statement) -> Result:
        kind = statement.kind
        if kind in ("set", "reset"):
            S.apply(self.settings, self.cer_settings, statement.setting, statement.value, kind == "reset")
            return Result()
        if self.remote is not None:
            self.remote.retries = self.settings.node_retries
            self.remote.retry_backoff = self.settings.node_retry_backoff_ms / 1000
            if self.materialized:
                self._placeholders()
        if kind == "cer":
            return self._cer(statement)
        if kind == "sql":
            text = statement.text
            if self.dialect != "duckdb":
                text = to_duckdb(text, self.dialect, Origin.identity(len(text)), text, con=self.duck)
            self._materialize(text)
            return self._duck_execute(text, statement.parameters)
        if kind == "script":
            stats, pulls = None, None
            for part in statement.parts[:-1]:
                result = self._one(part)
                stats, pulls = (result.stats, result.pull_stats) if result.stats is not None else (stats, pulls)
                self.release(result)
            result = self._one(statement.parts[-1])
            if result.stats is None:
                result.stats, result.pull_stats = stats, pulls
            return result
        return self._one(statement)

    def _one(self, statement: Statement) -> Result:
        """One statement of a script (or the only one) with row pattern recognition somewhere."""
        if statement.kind == "sql":
            text = to_duckdb(statement.text, self.dialect, Origin.identity(len(statement.text)), statement.text,
                             con=self.duck)
            self._materialize(text)
            return self._duck_execute(text, statement.parameters)
        with work.statement(self.settings):
            prepared = self.runner().prepare(statement)
        stats = [(run.plan, run.stats) for run in prepared.runs]
        pulls = [run.pull for run in prepared.runs if run.pull is not None]
        if prepared.explain is not None:
            result = self._explain(prepared, statement.text)
        else:
            result = self._duck_execute(prepared.sql, None, source=statement.text, registered=prepared.registered)
        result.stats, result.pull_stats = stats, pulls
        return result

    def runner(self) -> StatementRunner:
        """The runner of one statement's MATCH_RECOGNIZE clauses over this session."""
        return StatementRunner(self.duck, self.settings, self.dialect, self.remote, self.materialized)

    def _materialize(self, sql: str) -> None:
        if self.remote is not None:
            self.runner().materialize(sql)

    def _duck_execute(self, sql: str, params, source: str | None = None, registered=()) -> Result:
        duck = self.duck
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if params is None:
                    duck.execute(sql)
                else:
                    duck.execute(sql, params)
        except duckdb.Error as err:
            self.unregister_all(registered)
            if source is not None:
                raise map_duckdb_error(err, source, 0) from None
            raise map_duckdb_error(err) from None
        return Result(description=duck.description, rowcount=duck.rowcount, pending=True, registered=list(registered))

    def _explain(self, prepared, source: str) -> Result:
        keyword = "EXPLAIN ANALYZE " if prepared.explain == "analyze" else "EXPLAIN "
        try:
            duck_rows = self.duck.execute(keyword + prepared.sql).fetchall()
        except duckdb.Error as err:  # DuckDB's excerpt would show the SQL matchrec wrote, not the user's
            raise map_duckdb_error(err, source, 0) from None
        finally:
            self.unregister_all(prepared.registered)
        return Result(description=X.DESCRIPTION, rows=X.rows(prepared.runs, prepared.explain == "analyze", duck_rows))

    def _cer(self, statement: Statement) -> Result:
        """A CER statement: matched in Python over events read from DuckDB, the result served by DuckDB."""
        from matchrec.engine import cer
        with work.statement(self.settings):
            if self.remote is not None:  # storage-node tables: pulled, then matched here
                from matchrec.engine import cer_remote
                run = cer_remote.execute(self, statement.cer_query())
            else:
                run = cer.execute(self.duck, statement.cer_query(), self.cer_settings)
        if run.explain is not None:
            return Result(description=X.DESCRIPTION, rows=[("matchrec", run.explain)], cer_run=run)
        name = f"__matchrec_cer_result_{secrets.token_hex(6)}"
        self.duck.register(name, run.table)
        result = self._duck_execute(f"SELECT * FROM {name}", None, registered=[name])
        result.cer_run = run
        return result

    # ------------------------------------------------------------ one clause over an Arrow table
    def match(self, spec, table: pa.Table) -> ClauseResult:
        """The rows of one parsed MATCH_RECOGNIZE clause (``parser.spec.MatchSpec``) over ``table``,
        with its plan and EXPLAIN text. Errors point into the text the clause was parsed from."""
        name = f"__matchrec_input_{secrets.token_hex(6)}"
        with interrupts.forwarding(self.duck), self.errors():
            self.register(name, table, kind="spark input")
            try:
                with work.statement(self.settings):
                    prepared = self.runner().prepare_clause(spec, name)
                run: ClauseRun = prepared.runs[0]
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = self.duck.execute(f"SELECT * FROM {run.view_sql}").to_arrow_table()
                except duckdb.Error as err:
                    raise map_duckdb_error(err, spec.source, spec.span.start) from None
                finally:
                    self.unregister_all(prepared.registered)
            finally:
                self.unregister(name)
        return ClauseResult(out, run.plan, run.stats, X.clauses_text(prepared.runs, analyze=False))

    # ------------------------------------------------------------ errors
    @contextlib.contextmanager
    def errors(self):
        """Whatever goes wrong inside leaves as a matchrec error (or KeyboardInterrupt, MemoryError)."""
        try:
            yield
        except E.Error:
            raise
        except duckdb.Error as err:
            raise map_duckdb_error(err) from None
        except (KeyboardInterrupt, MemoryError):
            raise
        except work.BudgetExceeded:  # arrived just as its statement ended
            raise work.memory_error(self.settings.max_memory_mb) from None
        except RuntimeError as err:
            if "interrupted" in str(err).lower():  # DuckDB's own answer to Ctrl-C
                raise KeyboardInterrupt() from None
            raise E.InternalError(f"Internal error while executing the query ({type(err).__name__}: {err}). "
                                  "Please report it with the query.") from err
        except RecursionError:
            raise E.OperationalError("The query is too deeply nested to process") from None
        except sqlglot.errors.SqlglotError as err:  # a statement sqlglot cannot read or write
            raise E.ProgrammingError(f"Cannot read the statement: {err}") from None
        except Exception as err:  # noqa: BLE001 - never let an engine bug escape as a raw exception
            raise E.InternalError(f"Internal error while executing the query ({type(err).__name__}: {err}). "
                                  "Please report it with the query.") from err
