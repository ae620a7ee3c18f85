"""DuckDB as the place events live (the embedded default connector).

It answers the planner's questions (types of expressions, constant values, which functions
are aggregates), streams the ordered input of a MATCH_RECOGNIZE as Arrow record batches,
evaluates the rare expressions the matcher does not compute itself, and registers match
results so the rest of the query runs in DuckDB. Nothing is written to the database: results
are registered Arrow objects that disappear with the statement.
"""
from __future__ import annotations

import re
import warnings
import weakref
from typing import Any

import duckdb
import pyarrow as pa

from matchrec.parser.names import quote_ident  # noqa: F401 (callers import it from here too)
from matchrec.planner.analysis import OracleError
from matchrec.parser import hidden as H

# DuckDB types whose values Arrow cannot carry exactly in DuckDB's own Arrow form: UHUGEINT is
# exported as a signed decimal128 (wrong above 2**127), BIGNUM as opaque bytes. Measures of these
# types travel as their text, which DuckDB casts back exactly (engine.output reads them back).
TEXT_CARRIED = ("UHUGEINT", "BIGNUM", "VARINT")


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# The Arrow types DuckDB gives these column types whatever its settings (checked against DuckDB by
# tests/test_statement_cost.py); other types are asked once per catalog state.
_FIXED_ARROW = {"BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(),
                "BIGINT": pa.int64(), "UTINYINT": pa.uint8(), "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(),
                "UBIGINT": pa.uint64(), "FLOAT": pa.float32(), "DOUBLE": pa.float64()}
# an expression that names no relation: its type depends only on the functions and settings
_READS_RELATION = re.compile(r"\bfrom\b", re.I)
_NUMBER = re.compile(r"[\s()]*[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?[\s()]*", re.I)
_TABLE_INPUT = re.compile(r'SELECT \* FROM ([A-Za-z_][A-Za-z0-9_]*|"(?:[^"]|"")+")')


def _catalog_version_of(con) -> int | None:
    """How many statements that may change what a name binds to (DDL, SET, registrations) have run
    on ``con``'s database; None when this DuckDB does not tell."""
    try:
        return con._catalog_version()
    except Exception:  # noqa: BLE001 - another DuckDB build: answers are then kept per statement only
        return None


class CatalogAnswers:
    """Planner answers that hold while the catalog does not change, kept across statements.

    A statement used to ask DuckDB again for the same types on every run (a DESCRIBE per
    expression, per input, per measure type: round trips that made up much of the fixed cost
    of a short statement). These answers depend only on the catalog, the functions and the
    settings, all of which move DuckDB's catalog version; they are dropped when it moves, except
    for the registrations matchrec makes of its own uniquely named results (``own_change``),
    which no cached answer reads."""

    def __init__(self, version: int | None):
        self.version = version
        self.types: dict[str, str] = {}
        self.constants: dict[str, tuple[Any, str]] = {}
        self.arrow: dict[str, pa.DataType] = {}
        self.columns: dict[str, list[tuple[str, str]]] = {}
        self.aggregates: set[str] | None = None


_ANSWERS: "weakref.WeakKeyDictionary[Any, CatalogAnswers]" = weakref.WeakKeyDictionary()


def catalog_answers(con) -> CatalogAnswers:
    """The answers kept for ``con`` at its current catalog version (new, empty ones when it moved)."""
    version = _catalog_version_of(con)
    try:
        kept = _ANSWERS.get(con)
    except TypeError:  # not weakly referenceable: per statement only
        return CatalogAnswers(None)
    if kept is not None and version is not None and kept.version == version:
        return kept
    fresh = CatalogAnswers(version)
    if version is not None:
        _ANSWERS[con] = fresh
    return fresh


def own_change(con, action):
    """Run ``action`` (a registration or unregistration of a result name only matchrec reads) on
    ``con`` without dropping the answers kept for it: they were valid before and it changes none."""
    before = _catalog_version_of(con)
    try:
        return action()
    finally:
        after = _catalog_version_of(con)
        kept = _ANSWERS.get(con) if before is not None else None
        # one step: this action alone (another cursor's DDL in between moves it further)
        if kept is not None and kept.version == before and after == before + 1:
            kept.version = after


class DuckDBOracle:
    """Answers the planner through SQL on a connection; answers that only the catalog decides are
    kept across statements (``CatalogAnswers``), the others per statement."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self.kept = catalog_answers(con)
        self._types: dict[str, str] = {}
        self._constants: dict[str, tuple[Any, str]] = {}

    def type_of(self, sql: str) -> str:
        typ = self._types.get(sql) or self.kept.types.get(sql)
        if typ is None:
            try:
                rows = self.con.execute(f"DESCRIBE SELECT {sql} AS {H.PROBE}").fetchall()
            except duckdb.Error as err:
                raise OracleError(_first_line(err)) from None
            typ = rows[0][1]
            if not _READS_RELATION.search(sql):
                self.kept.types[sql] = typ
        self._types[sql] = typ
        return typ

    def constant(self, sql: str) -> tuple[Any, str]:
        if sql in self._constants:
            return self._constants[sql]
        if sql in self.kept.constants:  # a number literal: the same value in every statement
            return self.kept.constants[sql]
        typ = self.type_of(sql)
        try:
            value = self.con.execute(f"SELECT {sql} AS {H.PROBE}").fetchall()[0][0]
        except duckdb.Error as err:
            raise OracleError(_first_line(err)) from None
        self._constants[sql] = (value, typ)
        if _NUMBER.fullmatch(sql):
            self.kept.constants[sql] = (value, typ)
        return self._constants[sql]

    def is_aggregate(self, name: str) -> bool:
        if self.kept.aggregates is None:
            rows = self.con.execute(
                "SELECT DISTINCT lower(function_name) FROM duckdb_functions() WHERE function_type = 'aggregate'"
            ).fetchall()
            self.kept.aggregates = {r[0] for r in rows}
        return name.lower() in self.kept.aggregates

    def arrow_type(self, duck_type: str) -> pa.DataType:
        """The Arrow type a measure of ``duck_type`` is carried in (then cast back by DuckDB)."""
        upper = duck_type.upper()
        if upper in TEXT_CARRIED:
            return pa.string()
        fixed = _FIXED_ARROW.get(upper)
        if fixed is not None:
            return fixed
        typ = self.kept.arrow.get(duck_type)
        if typ is None:
            typ = self.con.sql(f"SELECT CAST(NULL AS {duck_type}) AS x").to_arrow_table().schema.field(0).type
            self.kept.arrow[duck_type] = typ
        return typ

    def columns(self, sql: str) -> list[tuple[str, str]]:
        """(name, DuckDB type) of the columns of query ``sql``; kept across statements when it reads
        a stored table whole (its columns change only by DDL), asked again otherwise (a view, a
        file or a Python object may read differently each time)."""
        kept = self.kept.columns.get(sql)
        if kept is not None:
            return list(kept)
        out = describe(self.con, sql)
        table = _TABLE_INPUT.fullmatch(sql)
        if table is not None and _table_kind(self.con, table.group(1)) == "table":
            self.kept.columns[sql] = list(out)
        return out


def _table_kind(con, name: str) -> str:
    """"table", "view" or "none" for the relation a (possibly quoted) name binds to; "none" when
    this DuckDB does not tell."""
    if name.startswith('"'):
        name = name[1:-1].replace('""', '"')
    try:
        return con._table_kind(name)
    except Exception:  # noqa: BLE001 - another DuckDB build
        return "none"


class FallbackEvaluator:
    """Evaluates expressions the matcher leaves to DuckDB, memoised on the argument values.

    A template reads its arguments as columns of a one-row relation ``__mr_args``. Scalar
    arguments travel as query parameters; arguments of nested types (STRUCT, MAP, ...) travel
    as a typed Arrow table, because DuckDB cannot tell a STRUCT from a MAP in a Python dict.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, max_entries: int = 200_000):
        self.con = con
        self.memo: dict = {}
        self.max_entries = max_entries
        self.calls = 0
        self._sql: dict = {}
        self._arrow_types: dict[str, pa.DataType] = {}

    def __call__(self, template: str, types: tuple[str, ...], args: tuple) -> Any:
        try:
            key = (template, _hashable(args))
            return self.memo[key]
        except KeyError:
            pass
        except TypeError:
            key = None
        self.calls += 1
        if not types:
            value = self.con.execute(template).fetchall()[0][0]
        elif any(_nested(t) for t in types):
            value = self._via_arrow(template, types, args)
        else:
            sql = self._sql.get((template, types))
            if sql is None:
                cols = ", ".join(f"CAST(${i + 1} AS {t}) AS {H.arg(i)}" for i, t in enumerate(types))
                sql = self._sql[(template, types)] = f"WITH {H.ARGS} AS (SELECT {cols}) {template}"
            value = self.con.execute(sql, [_param(a) for a in args]).fetchall()[0][0]
        if key is not None:
            if len(self.memo) >= self.max_entries:
                self.memo.clear()
            self.memo[key] = value
        return value

    def _arrow_type(self, duck_type: str) -> pa.DataType:
        if duck_type not in self._arrow_types:
            table = self.con.sql(f"SELECT CAST(NULL AS {duck_type}) AS x").to_arrow_table()
            self._arrow_types[duck_type] = table.schema.field(0).type
        return self._arrow_types[duck_type]

    def _via_arrow(self, template: str, types, args) -> Any:
        arrays = {}
        for i, (t, v) in enumerate(zip(types, args)):
            typ = self._arrow_type(t)
            arrays[H.arg(i)] = pa.array([_arrow_value(_param(v), typ)], type=typ)
        table = pa.table(arrays)
        self.con.register(H.ARGS, table)
        try:
            return self.con.execute(template).fetchall()[0][0]
        finally:
            self.con.unregister(H.ARGS)


def _nested(duck_type: str) -> bool:
    upper = duck_type.upper()
    return any(word in upper for word in ("STRUCT", "MAP", "UNION"))


def _arrow_value(value, typ: pa.DataType):
    """Shape a Python value as pyarrow expects it for ``typ`` (maps as lists of pairs)."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        items = value.items() if isinstance(value, dict) else zip(value["key"], value["value"])
        return [(_arrow_value(k, typ.key_type), _arrow_value(v, typ.item_type)) for k, v in items]
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [_arrow_value(v, typ.value_type) for v in value]
    if pa.types.is_struct(typ):
        return {typ.field(i).name: _arrow_value(value.get(typ.field(i).name), typ.field(i).type)
                for i in range(typ.num_fields)}
    return value


def _param(value):
    if isinstance(value, tuple):
        return [_param(v) for v in value]
    return value


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    for prefix in ("Binder Error: ", "Parser Error: ", "Conversion Error: ", "Catalog Error: ",
                   "Invalid Input Error: ", "Not implemented Error: "):
        text = text.replace(prefix, "")
    return text.split("\n")[0].strip()


def describe(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, str]]:
    rows = con.execute(f"DESCRIBE {sql}").fetchall()
    return [(r[0], r[1]) for r in rows]


def read_batches(con: duckdb.DuckDBPyConnection, sql: str, batch_size: int = 1 << 20) -> pa.RecordBatchReader:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return con.sql(sql).to_arrow_reader(batch_size)
