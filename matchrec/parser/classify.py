"""Classify a statement once: what kind it is and the parts later stages need, in one object.

``classify(text, dialect, parameters)`` returns a ``Statement`` that travels from the entry
point (a cursor, ``run_many``, Spark) to the session that runs it; no stage after this one
looks at the text to decide what to do with it. The kinds:

* ``set`` / ``reset``: a matchrec setting (``SET matchrec_x = v``, ``RESET pull_strategy``);
  ``setting`` and ``value`` hold the name and raw value.
* ``cer``: a CER statement (``[EXPLAIN [ANALYZE]] PATTERN ... FROM``, or MATCH_RECOGNIZE with
  STRATEGY); ``cer_query()`` parses it (once) with ``parser.sase``.
* ``match``: row pattern recognition (MATCH_RECOGNIZE or a window with PATTERN), ``explain``
  None; ``explain``: the same under EXPLAIN [ANALYZE] (``explain`` = "plain" or "analyze").
  ``tokens`` keeps the dialect's tokens of ``text`` when they were read here, so cutting the
  clauses out (``parser.query.split``) starts from them instead of reading the text again.
* ``sql``: anything else; DuckDB runs it as written (after translation from the dialect).
* ``script``: several statements separated by semicolons, at least one with row pattern
  recognition; ``parts`` holds each, classified.

Plain SQL is never tokenised here: DuckDB reports its own syntax errors for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlglot.tokens import TokenType

from matchrec import errors as E
from matchrec.parser.query import has_match_recognize, tokenize
from matchrec.parser.sase import has_strategy_clause, is_cer_statement
from matchrec.parser.window import has_pattern_window

_SET_RE = re.compile(
    r"^\s*(SET|RESET)\s+(?:SESSION\s+|GLOBAL\s+|LOCAL\s+)?(matchrec_\w+|pull_strategy)\s*(?:(?:=|TO)\s*(.+?))?\s*;?\s*$",
    re.I | re.S)
_EXPLAIN = re.compile(r"\s*EXPLAIN\s+(ANALY[SZ]E\s+)?", re.I)
KINDS = ("set", "reset", "cer", "match", "explain", "sql", "script")


@dataclass
class Statement:
    kind: str
    text: str
    dialect: str
    parameters: Any = None
    setting: str | None = None  # set/reset: the setting's name as written
    value: str | None = None  # set: the raw value
    explain: str | None = None  # explain: "plain" or "analyze"
    explain_end: int = 0  # explain: where the statement after EXPLAIN [ANALYZE] starts
    tokens: list | None = None  # match/explain: the dialect's tokens of ``text``, when read here
    parts: list["Statement"] = field(default_factory=list)  # script: its statements
    _cer: Any = field(default=None, repr=False)

    @property
    def pattern_recognition(self) -> bool:
        return self.kind in ("match", "explain")

    def cer_query(self):
        """The parsed CER statement (``parser.sase.CerQuery``), parsed on first use only."""
        if self._cer is None:
            from matchrec.parser.sase import parse
            self._cer = parse(self.text, self.parameters)
        return self._cer


def needs_engine(text: str) -> bool:
    """Whether ``text`` may hold row pattern recognition (MATCH_RECOGNIZE or a window with PATTERN)."""
    return has_match_recognize(text) or has_pattern_window(text)


def classify(text: str, dialect: str, parameters=None) -> Statement:
    """The ``Statement`` of ``text`` (one statement, or a script) written in ``dialect``."""
    if parameters is not None and not isinstance(parameters, (list, tuple, dict)):
        raise E.ProgrammingError("parameters must be a sequence or a mapping")
    setting = _SET_RE.match(text)
    if setting:
        kind = setting.group(1).lower()
        return Statement(kind, text, dialect, parameters, setting=setting.group(2), value=setting.group(3))
    if is_cer_statement(text) or has_strategy_clause(text):
        return Statement("cer", text, dialect, parameters)
    if not needs_engine(text):
        return Statement("sql", text, dialect, parameters)
    tokens = tokenize(text, dialect)
    pieces = _split(text, tokens)
    if len(pieces) == 1:
        piece, start, piece_tokens = pieces[0]
        return _one(piece, dialect, parameters, piece_tokens if start == 0 else None)
    parts = [_one(piece, dialect, None, piece_tokens if start == 0 else None)
             for piece, start, piece_tokens in pieces[:-1]]
    piece, start, piece_tokens = pieces[-1]
    parts.append(_one(piece, dialect, parameters, piece_tokens if start == 0 else None))
    return Statement("script", text, dialect, parameters, parts=parts)


def _one(text: str, dialect: str, parameters, tokens) -> Statement:
    """One statement of a script that holds row pattern recognition somewhere."""
    if not needs_engine(text):
        return Statement("sql", text, dialect, parameters)
    m = _EXPLAIN.match(text)
    if m:
        return Statement("explain", text, dialect, parameters, explain="analyze" if m.group(1) else "plain",
                         explain_end=m.end(), tokens=tokens)
    return Statement("match", text, dialect, parameters, tokens=tokens)


def _split(text: str, tokens) -> list[tuple[str, int, list]]:
    """``text`` cut at top-level semicolons: (statement, offset in text, its tokens), blank ones left out."""
    out = []
    start, first = 0, 0
    for k, tok in enumerate(tokens):
        if tok.token_type == TokenType.SEMICOLON:
            piece = text[start:tok.start]
            if piece.strip():
                out.append((piece, start, tokens[first:k]))
            start, first = tok.end + 1, k + 1
    piece = text[start:]
    if piece.strip():
        out.append((piece, start, tokens[first:]))
    return out
