"""Translate DuckDB's exceptions into matchrec's PEP 249 classes with useful positions."""
from __future__ import annotations

import re

import duckdb

from matchrec import errors as E

_CLASSES = [
    (duckdb.ProgrammingError, E.ProgrammingError),
    (duckdb.DataError, E.DataError),
    (duckdb.IntegrityError, E.IntegrityError),
    (duckdb.OperationalError, E.OperationalError),
    (duckdb.InternalError, E.InternalError),
    (duckdb.NotSupportedError, E.NotSupportedError),
]


def matchrec_class(err: BaseException) -> type[E.Error]:
    for duck_cls, ours in _CLASSES:
        if isinstance(err, duck_cls):
            return ours
    return E.DatabaseError


def strip_location(message: str) -> str:
    """DuckDB's message without its 'LINE n:' excerpt (which refers to SQL we generated)."""
    return re.split(r"\n\s*LINE \d+:", message, maxsplit=1)[0].strip()


def map_duckdb_error(err: BaseException, source: str | None = None, offset: int | None = None,
                     context: str | None = None) -> E.Error:
    if isinstance(err, duckdb.InterruptException):  # DuckDB's answer to Ctrl-C stays a KeyboardInterrupt
        return KeyboardInterrupt()  # type: ignore[return-value]
    cls = matchrec_class(err)
    text = str(err).strip()
    if source is None:
        if "__matchrec_" in text or "__mr_" in text:  # the excerpt shows SQL matchrec generated
            text = strip_location(text)
        mapped = cls(text)
    else:
        message = strip_location(text)
        if context:
            message = f"{context}: {message}"
        at = _guess_position(message, source)
        if at is None:
            at = offset
        mapped = E.positioned(cls, message, source, at)
    mapped.__cause__ = None
    # DuckDB's own text, 'LINE n:' excerpt included, for a caller that knows the SQL it ran and
    # maps the excerpt back into the user's file (the batch runner); never shown as it is
    mapped.duckdb_message = str(err).strip()  # type: ignore[attr-defined]
    return mapped


def _guess_position(message: str, source: str) -> int | None:
    """Where a name quoted in DuckDB's message appears in the user's text, if it does once."""
    for name in re.findall(r'"([^"\n]+)"', message):
        hits = [m.start() for m in re.finditer(r"(?<![\w.])" + re.escape(name) + r"(?!\w)", source, flags=re.I)]
        if len(hits) >= 1:
            return hits[0]
    return None
