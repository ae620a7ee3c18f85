"""The SQLAlchemy dialect ``matchrec://``: SQLAlchemy clients (pandas.read_sql, jupysql, Superset, ...) run
MATCH_RECOGNIZE and CER statements through matchrec's DB-API.

    engine = sqlalchemy.create_engine("matchrec:///events.duckdb")     # or matchrec:///:memory:
    pandas.read_sql(sqlalchemy.text("SELECT * FROM t MATCH_RECOGNIZE (...)"), engine)

SQL generation comes from duckdb_engine's dialect (DuckDB speaks PostgreSQL's SQL); connections are matchrec
connections, and reflection reads DuckDB's own catalog functions (duckdb_tables(), duckdb_columns()), which
answer for every DuckDB version, where the PostgreSQL catalog queries do not.

URL query arguments: ``dialect`` (the SQL dialect statements are written in, as in ``matchrec.connect``),
``read_only`` (true/false); any other argument is a DuckDB configuration option.
"""
from __future__ import annotations

import re
from typing import Any

import duckdb_engine
from sqlalchemy import pool
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects.postgresql.base import PGExecutionContext
from sqlalchemy.engine import URL, default

import matchrec

_TYPE_ARGS = re.compile(r"^([A-Za-z_ ]+?)\s*(?:\((\d+)\s*(?:,\s*(\d+))?\))?$")
_EXTRA_TYPES = {"hugeint": sqltypes.Numeric, "uhugeint": sqltypes.Numeric, "ubigint": sqltypes.BigInteger,
                "uinteger": sqltypes.BigInteger, "usmallint": sqltypes.Integer, "utinyint": sqltypes.SmallInteger,
                "tinyint": sqltypes.SmallInteger, "blob": sqltypes.LargeBinary, "double": sqltypes.Float,
                "float": sqltypes.Float, "varchar": sqltypes.String, "timestamp with time zone":
                sqltypes.TIMESTAMP(timezone=True)}


class _Connection:
    """A matchrec connection as SQLAlchemy's pool handles it (begin/commit/rollback, no autocommit switch)."""

    autocommit = None

    def __init__(self, connection: matchrec.Connection):
        self.matchrec_connection = connection

    def cursor(self) -> "_Cursor":
        return _Cursor(self.matchrec_connection)

    def begin(self) -> None:
        self.matchrec_connection._release()
        self.matchrec_connection.duckdb_connection.begin()

    def commit(self) -> None:
        self.matchrec_connection.commit()

    def rollback(self) -> None:
        self.matchrec_connection.rollback()

    def close(self) -> None:
        self.matchrec_connection.close()

    @property
    def closed(self) -> bool:
        return self.matchrec_connection.closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.matchrec_connection, name)


class _Cursor(matchrec.Cursor):
    """A matchrec cursor that also takes the statements SQLAlchemy clients send outside SQL: a bare COMMIT
    (ipython-sql and jupysql send it after every cell) and the ``register`` call that registers a
    DataFrame."""

    def execute(self, operation, parameters=None, context=None):
        text = operation.strip().rstrip(";").strip().lower() if isinstance(operation, str) else ""
        if text == "commit":
            self.connection.commit()
            return self
        if text in ("register", "register(?, ?)", "register($1, $2)") and parameters and len(parameters) == 2:
            name, frame = parameters
            self.connection.register(name, frame)
            return self
        return super().execute(operation, parameters)


class MatchrecDialect(duckdb_engine.Dialect):
    name = "matchrec"
    driver = "matchrec"
    default_paramstyle = "qmark"
    execution_ctx_cls = PGExecutionContext  # psycopg2's context reads server notices, which DuckDB has not
    supports_statement_cache = False

    def __init__(self, *args: Any, dbapi: Any = None, **kwargs: Any):
        # the psycopg2 dialect underneath checks the DB-API module's version as psycopg2's (SQLAlchemy 2.0
        # refuses anything below 2.7), so matchrec is handed over once that check is behind
        super().__init__(*args, dbapi=None, **kwargs)
        self.dbapi = dbapi

    @classmethod
    def import_dbapi(cls):
        return matchrec

    @staticmethod
    def dbapi(**kwargs: Any):
        return matchrec

    def _check_minimum_dbapi_version(self) -> None:
        pass  # the inherited check is psycopg2's version number, not matchrec's

    @classmethod
    def get_pool_class(cls, url: URL):
        # one in-memory database per thread, as duckdb_engine does; files get an ordinary pool
        if url.database in (None, "", ":memory:"):
            return pool.SingletonThreadPool
        return pool.QueuePool

    def create_connect_args(self, url: URL):
        options = dict(url.query)
        kwargs: dict[str, Any] = {"database": url.database or ":memory:"}
        if "dialect" in options:
            kwargs["dialect"] = options.pop("dialect")
        if "read_only" in options:
            kwargs["read_only"] = str(options.pop("read_only")).lower() in ("1", "true", "yes", "on")
        if options:
            kwargs["config"] = options
        return (), kwargs

    def connect(self, *cargs: Any, **cparams: Any) -> _Connection:
        return _Connection(matchrec.connect(*cargs, **cparams))

    def do_rollback(self, dbapi_connection) -> None:
        dbapi_connection.rollback()  # matchrec's rollback is a no-op without an open transaction

    def do_commit(self, dbapi_connection) -> None:
        dbapi_connection.commit()

    def do_begin(self, dbapi_connection) -> None:
        dbapi_connection.begin()

    def do_ping(self, dbapi_connection) -> bool:
        cursor = dbapi_connection.cursor()
        cursor.execute("SELECT 1")
        cursor.fetchall()
        return True

    def _get_default_schema_name(self, connection) -> str:
        return connection.exec_driver_sql("SELECT current_schema()").scalar()

    # -- reflection from DuckDB's catalog
    def _catalog(self, connection, sql: str, params: tuple = ()):
        return connection.exec_driver_sql(sql, params).fetchall()

    def _schema(self, connection, schema: str | None) -> str:
        return schema or self.default_schema_name or "main"

    def get_schema_names(self, connection, **kw):
        rows = self._catalog(connection, "SELECT DISTINCT schema_name FROM duckdb_schemas() "
                                         "WHERE database_name = current_database() ORDER BY 1")
        return [r[0] for r in rows]

    def get_table_names(self, connection, schema=None, **kw):
        rows = self._catalog(connection, "SELECT table_name FROM duckdb_tables() WHERE schema_name = ? "
                                         "AND database_name = current_database() ORDER BY 1",
                             (self._schema(connection, schema),))
        return [r[0] for r in rows]

    def get_temp_table_names(self, connection, **kw):
        rows = self._catalog(connection, "SELECT table_name FROM duckdb_tables() WHERE temporary ORDER BY 1")
        return [r[0] for r in rows]

    def get_view_names(self, connection, schema=None, **kw):
        rows = self._catalog(connection, "SELECT view_name FROM duckdb_views() WHERE schema_name = ? "
                                         "AND database_name = current_database() AND NOT internal ORDER BY 1",
                             (self._schema(connection, schema),))
        return [r[0] for r in rows]

    def has_table(self, connection, table_name, schema=None, **kw) -> bool:
        self._ensure_has_table_connection(connection)
        schema = self._schema(connection, schema)
        rows = self._catalog(connection, "SELECT 1 FROM duckdb_tables() WHERE schema_name = ? AND table_name = ? "
                                         "UNION ALL SELECT 1 FROM duckdb_views() WHERE schema_name = ? "
                                         "AND view_name = ? AND NOT internal",
                             (schema, table_name, schema, table_name))
        return bool(rows)

    def get_columns(self, connection, table_name, schema=None, **kw):
        rows = self._catalog(connection, "SELECT column_name, data_type, is_nullable, column_default "
                                         "FROM duckdb_columns() WHERE schema_name = ? AND table_name = ? "
                                         "ORDER BY column_index",
                             (self._schema(connection, schema), table_name))
        if not rows:
            from sqlalchemy.exc import NoSuchTableError
            raise NoSuchTableError(table_name)
        return [{"name": name, "type": self._column_type(data_type), "nullable": bool(nullable),
                 "default": default_value, "autoincrement": False}
                for name, data_type, nullable, default_value in rows]

    def _column_type(self, data_type: str):
        if data_type.endswith("]") or "(" in data_type and not _TYPE_ARGS.match(data_type):
            return sqltypes.NullType()  # LIST, ARRAY, STRUCT, MAP, UNION: no SQLAlchemy counterpart
        match = _TYPE_ARGS.match(data_type)
        base = (match.group(1) if match else data_type).strip().lower()
        if base in ("decimal", "numeric") and match and match.group(2):
            return sqltypes.Numeric(int(match.group(2)), int(match.group(3) or 0))
        found = _EXTRA_TYPES.get(base) or self.ischema_names.get(base)
        if found is None:
            return sqltypes.NullType()
        return found if isinstance(found, sqltypes.TypeEngine) else found()

    def get_pk_constraint(self, connection, table_name, schema=None, **kw):
        rows = self._catalog(connection, "SELECT constraint_column_names FROM duckdb_constraints() "
                                         "WHERE schema_name = ? AND table_name = ? "
                                         "AND constraint_type = 'PRIMARY KEY'",
                             (self._schema(connection, schema), table_name))
        return {"constrained_columns": list(rows[0][0]) if rows else [], "name": None}

    def get_foreign_keys(self, connection, table_name, schema=None, **kw):
        return []

    def get_indexes(self, connection, table_name, schema=None, **kw):
        return []

    def get_unique_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_check_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_table_comment(self, connection, table_name, schema=None, **kw):
        return {"text": None}

    def get_table_options(self, connection, table_name, schema=None, **kw):
        return {}

    # the PostgreSQL dialect answers these with one catalog query for many tables; DuckDB's catalog is
    # answered table by table above
    get_multi_columns = default.DefaultDialect.get_multi_columns
    get_multi_pk_constraint = default.DefaultDialect.get_multi_pk_constraint
    get_multi_foreign_keys = default.DefaultDialect.get_multi_foreign_keys
    get_multi_indexes = default.DefaultDialect.get_multi_indexes
    get_multi_unique_constraints = default.DefaultDialect.get_multi_unique_constraints
    get_multi_check_constraints = default.DefaultDialect.get_multi_check_constraints
    get_multi_table_comment = default.DefaultDialect.get_multi_table_comment
    get_multi_table_options = default.DefaultDialect.get_multi_table_options


dialect = MatchrecDialect
