"""PEP 249 exception classes and the rendering of errors that point into the query text.

Every error a user can see is one of these classes. Errors tied to a place in the query
carry its offset and render as ``problem. Line L, Col C.`` followed by the offending line
and a caret under the offending token.
"""
from __future__ import annotations

import re


class Warning(Exception):  # noqa: A001 - the name is mandated by PEP 249
    """Important warnings (PEP 249)."""


class Error(Exception):
    """Base class of every matchrec error (PEP 249).

    The message is cleaned when the error is made (``clean_message``): texts of DuckDB, sqlglot or
    numpy may name things the user never wrote."""

    def __init__(self, *args):
        super().__init__(*(clean_message(a) if isinstance(a, str) else a for a in args))


_GENERATED = re.compile(r'"?\b__(?:matchrec|mr)_[\w.]*"?')
_LIBRARY = re.compile(r"\bsqlglot(?:\.\w+)*(?:\s*:\s*)?", re.I)
_LIBRARY_CLASSES = re.compile(r"\b(?:ParseError|TokenError|OptimizeError|UnsupportedError|SqlglotError)\b:?\s*")
_UFUNC = re.compile(r"(?:\w+\.)*(?:_UFunc\w*: )?ufunc '(\w+)'[^\n]*", re.I)


_MISSING_PART = re.compile(r"Required keyword: '\w+' missing for <class '(?:[\w.]*\.)?(\w+)'>")
_CLASS = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>")
_NODE_WORDS = {"Add": "'+'", "Sub": "'-'", "Mul": "'*'", "Div": "'/'", "IntDiv": "'//'", "Mod": "'%'",
               "Pow": "'**'", "GT": "'>'", "GTE": "'>='", "LT": "'<'", "LTE": "'<='", "EQ": "'='", "NEQ": "'<>'",
               "And": "AND", "Or": "OR", "Not": "NOT", "DPipe": "'||'", "BitwiseOr": "'|'", "BitwiseAnd": "'&'",
               "BitwiseXor": "'^'", "Is": "IS", "Like": "LIKE", "ILike": "ILIKE", "In": "IN", "Between": "BETWEEN",
               "Alias": "AS", "Cast": "CAST", "Dot": "'.'", "Bracket": "'['"}


def _missing_part(m: re.Match) -> str:
    node = m.group(1)
    if node == "Column":
        return "a name is missing (after '.'?)"
    if node in _NODE_WORDS:
        return f"{_NODE_WORDS[node]} is missing an operand"
    return "the expression is incomplete"


def clean_message(message: str) -> str:
    """``message`` without the names of generated SQL objects (``__matchrec_*``, ``__mr_*``) and of
    the libraries' internals (sqlglot's classes, numpy's ufuncs), which mean nothing to the user."""
    if "__" in message:
        message = _GENERATED.sub("(a value matchrec computes)", message)
    if "<class '" in message:
        message = _MISSING_PART.sub(_missing_part, message)
        message = _CLASS.sub(lambda m: _NODE_WORDS.get(m.group(1), "an expression"), message)
    if "sqlglot" in message.lower() or "Error" in message:
        message = _LIBRARY.sub("", message)
        message = _LIBRARY_CLASSES.sub("", message)
    if "ufunc" in message.lower():
        message = _UFUNC.sub(lambda m: f"operator {m.group(1)} does not apply to these types", message)
    return message


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
    # a lone surrogate cannot be printed: show the replacement character in its place
    text = source[line_start:line_end]
    if _has_surrogate(text):
        text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
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


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_text(source: str) -> None:
    """Raise ProgrammingError at the first lone surrogate in ``source``: such a string (which Python
    allows, say from ``'\\ud800'``) is not Unicode text, and no SQL engine can read it."""
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(source[err.start])
        raise positioned(ProgrammingError, f"The statement holds a lone surrogate U+{code:04X}, which is not a "
                         "character: the text is not valid Unicode", source, err.start) from None


def check_parameter(value, where: str) -> None:
    """Raise DataError when a string parameter (or one inside a list or dict) is not valid Unicode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise DataError(f"{where} holds a lone surrogate U+{ord(value[err.start]):04X} at position "
                            f"{err.start}: the text is not valid Unicode") from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_parameter(item, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_parameter(key, where)
            check_parameter(item, where)
