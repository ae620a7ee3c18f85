"""DuckDB as the place events live (the embedded default connector).

It answers the planner's questions (types of expressions, constant values, which functions
are aggregates), streams the ordered input of a MATCH_RECOGNIZE as Arrow record batches,
evaluates the rare expressions the matcher does not compute itself, and registers match
results so the rest of the query runs in DuckDB. Nothing is written to the database: results
are registered Arrow objects that disappear with the statement.
"""
from __future__ import annotations

import warnings
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


class DuckDBOracle:
    """Answers the planner through SQL on a connection; results are cached per statement."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self._types: dict[str, str] = {}
        self._constants: dict[str, tuple[Any, str]] = {}
        self._aggregates: set[str] | None = None

    def type_of(self, sql: str) -> str:
        if sql not in self._types:
            try:
                rows = self.con.execute(f"DESCRIBE SELECT {sql} AS {H.PROBE}").fetchall()
            except duckdb.Error as err:
                raise OracleError(_first_line(err)) from None
            self._types[sql] = rows[0][1]
        return self._types[sql]

    def constant(self, sql: str) -> tuple[Any, str]:
        if sql not in self._constants:
            typ = self.type_of(sql)
            try:
                value = self.con.execute(f"SELECT {sql} AS {H.PROBE}").fetchall()[0][0]
            except duckdb.Error as err:
                raise OracleError(_first_line(err)) from None
            self._constants[sql] = (value, typ)
        return self._constants[sql]

    def is_aggregate(self, name: str) -> bool:
        if self._aggregates is None:
            rows = self.con.execute(
                "SELECT DISTINCT lower(function_name) FROM duckdb_functions() WHERE function_type = 'aggregate'"
            ).fetchall()
            self._aggregates = {r[0] for r in rows}
        return name.lower() in self._aggregates

    def arrow_type(self, duck_type: str) -> pa.DataType:
        """The Arrow type a measure of ``duck_type`` is carried in (then cast back by DuckDB)."""
        if duck_type.upper() in TEXT_CARRIED:
            return pa.string()
        return self.con.sql(f"SELECT CAST(NULL AS {duck_type}) AS x").to_arrow_table().schema.field(0).type


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
