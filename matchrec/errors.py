"""PEP 249 exception classes and the rendering of errors that point into the query text.

Every error a user can see is one of these classes. Errors tied to a place in the query
carry its offset and render as ``problem. Line L, Col C.`` followed by the offending line
and a caret under the offending token.
"""
from __future__ import annotations


class Warning(Exception):  # noqa: A001 - the name is mandated by PEP 249
    """Important warnings (PEP 249)."""


class Error(Exception):
    """Base class of every matchrec error (PEP 249)."""


class InterfaceError(Error):
    """Misuse of the DB-API interface itself (closed cursor, fetch before execute...)."""


class DatabaseError(Error):
    """Errors related to the database."""


class DataError(DatabaseError):
    """Problems with processed data: conversion failures, out-of-range values, division errors."""


class OperationalError(DatabaseError):
    """Errors of the running system: limits reached, I/O, out of memory."""


class IntegrityError(DatabaseError):
    """Constraint violations reported by the storage engine."""


class InternalError(DatabaseError):
    """The engine reached a state it should never reach; a bug worth reporting."""


class ProgrammingError(DatabaseError):
    """Errors in the query: syntax, unknown names, misuse of MATCH_RECOGNIZE constructs."""


class NotSupportedError(DatabaseError):
    """A construct or API that matchrec does not support (yet)."""


def line_col(source: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``source``."""
    offset = max(0, min(offset, len(source)))
    line = source.count("\n", 0, offset) + 1
    col = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return line, col


def render_position(source: str, start: int, end: int | None = None) -> str:
    """``Line L, Col C.`` plus the source line and a caret (or tildes) under [start, end)."""
    line, col = line_col(source, start)
    line_start = source.rfind("\n", 0, start) + 1
    line_end = source.find("\n", start)
    if line_end < 0:
        line_end = len(source)
    text = source[line_start:line_end]
    width = 1
    if end is not None and end > start:
        width = max(1, min(end, line_end) - start)
    # Keep very long lines readable: show a window around the error.
    shift = 0
    if len(text) > 120:
        shift = max(0, (col - 1) - 60)
        text = ("..." if shift else "") + text[shift:shift + 120] + ("..." if shift + 120 < len(text) else "")
        shift -= 3 if shift else 0
    pad = " " * (col - 1 - shift)
    return f"Line {line}, Col {col}.\n  {text}\n  {pad}{'^' * width}"


def positioned(cls: type[Error], message: str, source: str | None, start: int | None,
               end: int | None = None) -> Error:
    """An error of class ``cls`` whose message points at ``source[start:end]``."""
    if source is None or start is None:
        err = cls(message)
    else:
        message = message.rstrip(".")
        err = cls(f"{message}. {render_position(source, start, end)}")
    err.position = start  # type: ignore[attr-defined]
    # kept so a caller that ran a rewritten statement can point into the user's own text
    err.problem, err.end = message, end  # type: ignore[attr-defined]
    return err
