"""Text rewriting that remembers where every character came from.

The parser rewrites query text in small steps (MATCH_RECOGNIZE clauses replaced by
placeholders, RUNNING/FINAL made parseable for sqlglot, parameters replaced by markers). An ``Origin``
maps offsets in a rewritten text back to offsets in the text the user wrote, so that errors
found late still point at the right line and column.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class _Piece:
    new_start: int
    new_end: int
    orig_start: int
    orig_end: int
    verbatim: bool


class Origin:
    """Maps offsets of a derived text to offsets of its source."""

    def __init__(self, pieces: list[_Piece]):
        self._pieces = pieces
        self._starts = [p.new_start for p in pieces]

    @classmethod
    def identity(cls, length: int, base: int = 0) -> "Origin":
        return cls([_Piece(0, length, base, base + length, True)])

    def map(self, offset: int) -> int:
        if not self._pieces:
            return 0
        i = bisect.bisect_right(self._starts, offset) - 1
        i = max(0, min(i, len(self._pieces) - 1))
        piece = self._pieces[i]
        if piece.verbatim:
            return piece.orig_start + min(max(0, offset - piece.new_start), piece.orig_end - piece.orig_start)
        return piece.orig_start

    def compose(self, outer: "Origin") -> "Origin":
        """An origin mapping through ``self`` and then through ``outer``."""
        pieces = []
        for p in self._pieces:
            if p.verbatim:
                pieces.append(_Piece(p.new_start, p.new_end, outer.map(p.orig_start), outer.map(p.orig_end), True))
            else:
                pieces.append(_Piece(p.new_start, p.new_end, outer.map(p.orig_start), outer.map(p.orig_end), False))
        return Origin(pieces)


def rewrite(text: str, edits: list[tuple[int, int, str]], base: int = 0) -> tuple[str, Origin]:
    """Apply non-overlapping ``(start, end, replacement)`` edits to ``text``.

    Offsets of unchanged characters map back exactly; a replacement maps to the start of
    what it replaced. ``base`` is added to every original offset (for slices of a larger text).
    """
    out: list[str] = []
    pieces: list[_Piece] = []
    pos = 0
    new_len = 0
    for start, end, repl in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < pos:
            raise ValueError("overlapping edits")
        if start > pos:
            chunk = text[pos:start]
            pieces.append(_Piece(new_len, new_len + len(chunk), base + pos, base + start, True))
            out.append(chunk)
            new_len += len(chunk)
        pieces.append(_Piece(new_len, new_len + len(repl), base + start, base + end, False))
        out.append(repl)
        new_len += len(repl)
        pos = end
    if pos < len(text) or not pieces:
        chunk = text[pos:]
        pieces.append(_Piece(new_len, new_len + len(chunk), base + pos, base + len(text), True))
        out.append(chunk)
    return "".join(out), Origin(pieces)
