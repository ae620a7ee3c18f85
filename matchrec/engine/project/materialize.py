"""Storing a model in the database: tables built under a temporary name and swapped in, views, Parquet
files written through a temporary file; a failing model leaves the previous relation untouched."""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable

from matchrec import errors as E
from matchrec.engine.project.models import BUILD_PREFIX, Model, Project, _normalise


def _relation_kind(cur, relation: str) -> str | None:
    """'table', 'view' or None for a model's relation (``name`` or ``schema.name``)."""
    parts = _normalise(relation).split(".")
    schema_sql = f"'{parts[0]}'" if len(parts) == 2 else "current_schema()"
    name = parts[-1]
    where = (f"database_name = current_database() AND lower(schema_name) = {schema_sql} "
             f"AND lower({{col}}) = '{name}' AND NOT temporary")
    cur.execute(f"SELECT 'table' FROM duckdb_tables() WHERE {where.format(col='table_name')} "
                f"UNION ALL SELECT 'view' FROM duckdb_views() WHERE {where.format(col='view_name')} AND NOT internal")
    row = cur.fetchone()
    return row[0] if row else None


def _build_name(model: Model, project: Project) -> str:
    name = f"{BUILD_PREFIX}{model.name}_{secrets.token_hex(4)}"
    return (f"{project.schema}." if project.schema else "") + f'"{name}"'


def _swap_in(cur, model: Model, create: Callable[[], None]) -> None:
    """Drop the model's old relation and ``create`` the new one in one transaction (rolled back on error)."""
    cur.execute("BEGIN TRANSACTION")
    try:
        kind = _relation_kind(cur, model.relation)
        if kind is not None:
            cur.execute(f"DROP {kind.upper()} {model.relation}")
        create()
        cur.execute("COMMIT")
    except BaseException:
        try:
            cur.execute("ROLLBACK")
        except E.Error:
            pass
        raise


def _swap_table(cur, model: Model, build: str) -> None:
    _swap_in(cur, model, lambda: cur.execute(f'ALTER TABLE {build} RENAME TO "{model.name}"'))


def _swap_parquet(cur, project: Project, model: Model, write: Callable[[str], None]) -> None:
    """Write the model's Parquet file through a temporary file, then point the model's view at it."""
    path = _parquet_path(project, model)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        write(_sql_string(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _swap_in(cur, model, lambda: cur.execute(
        f"CREATE VIEW {model.relation} AS SELECT * FROM read_parquet({_sql_string(path)})"))


def _count(cur, relation: str) -> int:
    cur.execute(f"SELECT count(*) FROM {relation}")
    return int(cur.fetchone()[0])


class _Statement(Exception):
    """An error of the model's own statement, executed with ``prefix`` before the model's SQL."""

    def __init__(self, err: BaseException, prefix: str):
        super().__init__(str(err))
        self.err, self.prefix = err, prefix


def _run_model_statement(cur, prefix: str, sql: str, suffix: str = "") -> None:
    try:
        cur.execute(prefix + sql + suffix)
    except E.Error as err:
        raise _Statement(err, prefix) from None


def _materialise_sql(project: Project, con, model: Model) -> int | None:
    """Build a plain SQL model with DuckDB (through matchrec); the rows it holds (None for a view)."""
    cur = con.cursor()
    try:
        if model.materialized == "view":
            _swap_in(cur, model, lambda: _run_model_statement(cur, f"CREATE VIEW {model.relation} AS ", model.sql))
            return None
        if model.materialized == "parquet":
            _swap_parquet(cur, project, model, lambda file: _run_model_statement(
                cur, "COPY (", model.sql, f"\n) TO {file} (FORMAT parquet)"))
            return _count(cur, model.relation)
        build = _build_name(model, project)
        try:
            _run_model_statement(cur, f"CREATE TABLE {build} AS ", model.sql)
            rows = _count(cur, build)
            _swap_table(cur, model, build)
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {build}")
        return rows
    finally:
        cur.close()


def _materialise_arrow(project: Project, con, model: Model, table) -> None:
    """Store a pattern model's Arrow result as its table or Parquet file."""
    name = f"__matchrec_result_{secrets.token_hex(6)}"
    con.register(name, table)
    cur = con.cursor()
    try:
        if model.materialized == "parquet":
            _swap_parquet(cur, project, model, lambda file: cur.execute(
                f"COPY (SELECT * FROM {name}) TO {file} (FORMAT parquet)"))
            return
        build = _build_name(model, project)
        try:
            cur.execute(f"CREATE TABLE {build} AS SELECT * FROM {name}")
            _swap_table(cur, model, build)
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {build}")
    finally:
        cur.close()
        con.unregister(name)


def _parquet_path(project: Project, model: Model) -> Path:
    project.target.mkdir(parents=True, exist_ok=True)
    return (project.target / f"{model.name}.parquet").resolve()


def _sql_string(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"
