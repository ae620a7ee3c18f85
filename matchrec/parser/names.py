"""Quoting of SQL identifiers: the one place matchrec turns a name into a double-quoted identifier.

DuckDB, the storage nodes' SQL and the ANSI dialects all quote with ``"`` and write a ``"`` inside
a name twice. It imports nothing from matchrec, so every layer can use it.
"""
from __future__ import annotations


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted SQL identifier (``a"b`` → ``"a""b"``)."""
    return '"' + name.replace('"', '""') + '"'
