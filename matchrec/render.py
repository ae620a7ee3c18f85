"""Rendering of query results as text: DuckDB-style box tables, value formatting, widths.

Used by the shell and by ``matchrec demo``.
"""
from __future__ import annotations

import datetime
import decimal
import os
import unicodedata
from typing import TextIO

DEFAULT_MAX_COL_WIDTH = 40
_NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                  "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL", "REAL")


def format_value(value) -> str:
    """A value as the table and line modes show it (NULL for None)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same double
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in bytes(value))
    if isinstance(value, datetime.timedelta):
        return _format_interval(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"'{k}': {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _format_interval(delta: datetime.timedelta) -> str:
    if delta < datetime.timedelta(0):
        return "-" + _format_interval(-delta)
    days, rest = divmod(delta, datetime.timedelta(days=1))
    seconds = rest.total_seconds()
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    clock = f"{int(hours):02d}:{int(minutes):02d}:" + (f"{seconds:09.6f}".rstrip("0").rstrip(".")
                                                         if seconds % 1 else f"{int(seconds):02d}")
    if days:
        return f"{days} day{'s' if abs(days) != 1 else ''} {clock}"
    return clock


_CONTROL = {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def _printable(text: str) -> str:
    return text.translate(_CONTROL)  # a raw line break or tab would break the table's alignment


def display_width(text: str) -> int:
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def _truncate(text: str, width: int) -> str:
    if display_width(text) <= width:
        return text
    out, used = [], 0
    for c in text:
        w = display_width(c)
        if used + w > width - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def _pad(text: str, width: int, align: str) -> str:
    gap = width - display_width(text)
    if align == "right":
        return " " * gap + text
    if align == "center":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def _is_numeric(type_name: str, cells: list) -> bool:
    upper = type_name.upper()
    if upper:
        return upper.startswith(_NUMERIC_TYPES)
    values = [v for v in cells if v is not None]
    return bool(values) and all(isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)
                                for v in values)


def _pick_columns(widths: list[int], max_width: int | None) -> list[int | None]:
    """Indices of the columns to show, None where an ellipsis column replaces the middle ones."""
    def total(ws):
        return sum(w + 3 for w in ws) + 1
    n = len(widths)
    if n <= 1 or max_width is None or total(widths) <= max_width:
        return list(range(n))
    left, right = [], []
    lo, hi = 0, n - 1
    while lo <= hi:  # alternate between both ends so the first and last columns survive
        take_left = len(left) <= len(right)
        idx = lo if take_left else hi
        if total([widths[i] for i in left + right + [idx]] + [1]) > max_width and (left or right):
            break
        if take_left:
            left.append(lo)
            lo += 1
        else:
            right.insert(0, hi)
            hi -= 1
    return left + [None] + right


def format_table(names: list[str], types: list[str], rows: list[tuple], *, total: int | None = None,
                 split: int | None = None, max_width: int | None = None,
                 max_col_width: int = DEFAULT_MAX_COL_WIDTH) -> str:
    """A DuckDB-style box table of ``rows``.

    ``split`` is the index in ``rows`` where omitted rows were (drawn as a row of dots),
    ``total`` the row count of the whole result, ``max_width`` the width to fit in (middle
    columns give way to an ellipsis column).
    """
    total = len(rows) if total is None else total
    cells = [[_printable(format_value(v)) for v in row] for row in rows]
    ncols = len(names)
    max_col_width = max(max_col_width, 3)
    widths = []
    for c in range(ncols):
        longest = max([display_width(names[c]), display_width(types[c])] + [display_width(r[c]) for r in cells])
        widths.append(min(longest, max_col_width))
    shown = _pick_columns(widths, max_width)
    real = [c for c in shown if c is not None]
    while max_width is not None and sum(widths[c] + 3 for c in real) + 4 * (None in shown) + 1 > max_width:
        widest = max(real, key=lambda c: widths[c])
        if widths[widest] <= 3:
            break
        widths[widest] -= 1  # still too wide: narrow the widest column
    aligns = ["right" if _is_numeric(types[c], [r[c] for r in rows]) else "left" for c in range(ncols)]
    col_w = [1 if c is None else widths[c] for c in shown]

    def line(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * (w + 2) for w in col_w) + right

    def row_text(texts: list[str], align_of) -> str:
        parts = []
        for c, w, text in zip(shown, col_w, texts):
            parts.append(" " + _pad(_truncate(text, w), w, align_of(c)) + " ")
        return "│" + "│".join(parts) + "│"

    lines = [line("┌", "┬", "┐"), row_text([("…" if c is None else names[c]) for c in shown], lambda c: "center")]
    if any(types):
        lines.append(row_text([("" if c is None else types[c]) for c in shown], lambda c: "center"))
    lines.append(line("├", "┼", "┤"))
    for i, row in enumerate(cells):
        if split is not None and i == split:
            lines.append(row_text(["·"] * len(shown), lambda c: "center"))
        lines.append(row_text([("…" if c is None else row[c]) for c in shown],
                              lambda c: "left" if c is None else aligns[c]))
    if split is not None and split >= len(cells):
        lines.append(row_text(["·"] * len(shown), lambda c: "center"))
    lines.append(line("└", "┴", "┘"))
    footer = []
    if total != len(rows) or total == 0:
        footer.append(f"{total} row{'s' if total != 1 else ''}" + (f" ({len(rows)} shown)" if total != len(rows)
                                                                       else ""))
    if None in shown:
        footer.append(f"{ncols} columns ({len(shown) - 1} shown)")
    if footer:
        lines.append("  ".join(footer))
    return "\n".join(lines)


def terminal_width(stream: TextIO) -> int | None:
    """Columns available for tables: $COLUMNS, else the terminal's width, else no limit."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if stream.isatty():
            columns = os.get_terminal_size(stream.fileno()).columns
            return columns if columns > 0 else 80  # a fresh pseudo-terminal reports 0
    except (AttributeError, OSError, ValueError):
        pass
    return None


def _type_name(type_code) -> str:
    return "" if type_code is None else str(type_code).strip('"').lower()


# ---------------------------------------------------------------- history
