"""Errors of a run mapped back to the model's file (line and column), and the rows of the summary table."""
from __future__ import annotations

import re

import duckdb

from matchrec import errors as E
from matchrec.engine.errors import map_duckdb_error, strip_location
from matchrec.engine.project.materialize import _Statement
from matchrec.engine.project.models import Model


_DUCK_LINE = re.compile(r"\n[ \t]*LINE (\d+): ?(.*)\n([ \t]*)(\^+)")


def _message(model: Model, err: BaseException) -> str:
    """The text of ``err`` as an error of ``model``, with its position in the model file where known."""
    if not isinstance(err, _Statement):  # outside the model's own statement: no position to map
        return str(model.run_error(_plain(err), cls=_class(err)))
    err, prefix = err.err, err.prefix
    offset = _statement_offset(err, prefix + model.sql)
    problem = getattr(err, "problem", None) or strip_location(str(err))
    if offset is None or model.origin is None:
        return str(model.run_error(problem, cls=_class(err)))
    at = model.origin.map(max(0, min(offset - len(prefix), len(model.sql))))
    return str(model.run_error(problem, at, cls=_class(err)))


def _class(err: BaseException) -> type[E.Error]:
    if isinstance(err, E.Error):
        return type(err)
    if isinstance(err, duckdb.Error):
        return type(map_duckdb_error(err))
    if isinstance(err, OSError):
        return E.OperationalError
    return E.InternalError


def _plain(err: BaseException) -> str:
    text = str(err)
    return text if isinstance(err, E.Error) else f"{type(err).__name__}: {text}"


def _statement_offset(err: BaseException, statement: str) -> int | None:
    """Where in the executed ``statement`` the error points: matchrec's offset, or DuckDB's LINE/caret."""
    position = getattr(err, "position", None)
    if isinstance(position, int):
        return position
    m = _DUCK_LINE.search(getattr(err, "duckdb_message", None) or str(err))
    if not m:
        return None
    line_no, excerpt = int(m.group(1)), m.group(2)
    lines = statement.split("\n")
    if not 1 <= line_no <= len(lines):
        return None
    line_start = sum(len(x) + 1 for x in lines[:line_no - 1])
    line = lines[line_no - 1]
    caret = len(m.group(3)) - len(f"LINE {line_no}: ")  # the caret's column in the excerpt
    shown = excerpt
    if shown.startswith("..."):
        shown, caret = shown[3:], caret - 3
    if shown.endswith("..."):
        shown = shown[:-3]
    found = line.find(shown) if shown else 0
    if found < 0:
        return line_start
    return line_start + found + max(0, caret)


def format_errors(result) -> list[str]:  # a runner.RunResult (not imported: the runner imports this module)
    """One message per failed model (already naming the model's file and position)."""
    return [r.error for r in result.results if r.status == "ERROR" and r.error]


def summary_rows(result) -> list[tuple]:  # a runner.RunResult
    rows = []
    for r in result.results:
        rows.append((r.name, r.status, r.materialized, "" if r.rows is None else f"{r.rows:,}",
                     "" if r.matches is None else f"{r.matches:,}", f"{r.seconds:.2f}",
                     f"#{r.shared_pass}" if r.shared_pass else "", r.note))
    return rows


SUMMARY_COLUMNS = ["model", "status", "materialized", "rows", "matches", "seconds", "pass", "note"]
