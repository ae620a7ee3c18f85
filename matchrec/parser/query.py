"""Find every MATCH_RECOGNIZE in a SQL statement and cut it out.

sqlglot attaches MATCH_RECOGNIZE to the SELECT rather than to its table and cannot parse
SUBSET or WITHIN, so we never let it see the clause. Working on the dialect's tokens,
each ``<table reference> MATCH_RECOGNIZE ( body ) [AS alias]`` is replaced, innermost
first, by ``<placeholder> [AS alias]``. What remains is ordinary SQL of the dialect; each
removed clause keeps its input (the table reference text, which may contain placeholders
of clauses nested in it) and its parsed body.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from matchrec.errors import NotSupportedError, ProgrammingError, positioned
from matchrec.parser.body import parse_body
from matchrec.parser import hidden as H
from matchrec.parser.source import Origin, rewrite
from matchrec.parser.spec import MatchSpec, Span

SUPPORTED_DIALECTS = ("duckdb", "trino", "presto", "snowflake", "oracle", "databricks", "spark", "postgres",
                      "bigquery", "mysql", "tsql", "sqlite", "redshift", "hive", "athena")

# Tokens that end a table reference when walking backwards from MATCH_RECOGNIZE.
_TABLE_REF_STARTERS = {TokenType.FROM, TokenType.JOIN, TokenType.COMMA, TokenType.LATERAL, TokenType.APPLY,
                       TokenType.USING}


@dataclass
class Clause:
    placeholder: str
    input_text: str  # table reference, in the query's dialect; may contain other placeholders
    input_span: Span
    spec: MatchSpec
    alias: str | None


@dataclass
class SplitQuery:
    source: str
    dialect: str
    text: str  # the statement with placeholders
    origin: Origin  # offsets of ``text`` -> offsets of ``source``
    clauses: list[Clause]
    tokens: list | None = None  # the dialect's tokens of ``text``


def dialect_of(name: str) -> Dialect:
    if not isinstance(name, str) or name.lower() not in SUPPORTED_DIALECTS:
        raise ProgrammingError(f"Unknown SQL dialect {name!r}; use one of: {', '.join(SUPPORTED_DIALECTS)}")
    return Dialect.get_or_raise(name.lower())


def tokenize(text: str, dialect: str, origin: Origin | None = None, source: str | None = None):
    try:
        return dialect_of(dialect).tokenize(text)
    except TokenError as err:
        msg = str(err)
        m = re.search(r"Line (\d+), Col: (\d+)", msg)
        offset = 0
        if m:
            line, col = int(m.group(1)), int(m.group(2))
            lines = text.split("\n")
            offset = sum(len(x) + 1 for x in lines[: line - 1]) + col - 1
        if origin is not None:
            offset = origin.map(offset)
        problem = "Unterminated string or quoted identifier" if "Missing" in msg or "unterminated" in msg.lower() \
            else "Cannot tokenize the query"
        raise positioned(ProgrammingError, problem, source or text, offset) from None


def has_match_recognize(sql: str) -> bool:
    return "match_recognize" in sql.lower()


def _is_mr(tokens, i: int) -> bool:
    tok = tokens[i]
    return tok.text.upper() == "MATCH_RECOGNIZE" and tok.token_type != TokenType.STRING \
        and tok.token_type != TokenType.IDENTIFIER and i + 1 < len(tokens) \
        and tokens[i + 1].token_type == TokenType.L_PAREN


def matching_paren(tokens, i: int) -> int:
    """Index of the ')' matching the '(' at ``i``; -1 if none."""
    depth = 0
    for j in range(i, len(tokens)):
        tt = tokens[j].token_type
        if tt == TokenType.L_PAREN:
            depth += 1
        elif tt == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _table_ref_start(tokens, i: int) -> int:
    """Index of the first token of the table reference before tokens[i]; -1 if none."""
    depth = 0
    j = i - 1
    while j >= 0:
        tt = tokens[j].token_type
        if tt == TokenType.R_PAREN:
            depth += 1
        elif tt == TokenType.L_PAREN:
            if depth == 0:
                return j + 1
            depth -= 1
        elif depth == 0 and tt in _TABLE_REF_STARTERS:
            return j + 1
        j -= 1
    return -1


def split(sql: str, dialect: str = "duckdb", tokens: list | None = None) -> SplitQuery:
    """Cut every MATCH_RECOGNIZE out of ``sql`` (one statement; ``tokens``: its tokens, when read already)."""
    text, origin = sql, Origin.identity(len(sql))
    clauses: list[Clause] = []
    tag = secrets.token_hex(4)
    while True:
        if tokens is None:
            tokens = tokenize(text, dialect, origin, sql)
        found = [i for i in range(len(tokens)) if _is_mr(tokens, i)]
        if not found:
            break
        chosen = None
        for i in found:
            close = matching_paren(tokens, i + 1)
            if close < 0:
                # Parse what follows anyway: a missing ')' inside the body gives a better message.
                body_start = tokens[i + 1].end + 1
                parse_body(text[body_start:], origin.map(body_start), sql, dialect, Span(0, 0))
                at = origin.map(tokens[i + 1].start)
                raise positioned(ProgrammingError, "Missing ')' to close MATCH_RECOGNIZE (", sql, at)
            start = _table_ref_start(tokens, i)
            inner = [k for k in found if k != i and (start <= k < i or i < k < close)]
            if any(i < k < close for k in found if k != i):
                at = origin.map(tokens[i].start)
                nested = next(k for k in found if i < k < close)
                raise positioned(NotSupportedError, "MATCH_RECOGNIZE inside the body of another MATCH_RECOGNIZE "
                                 "is not supported; use it in the FROM clause instead", sql,
                                 origin.map(tokens[nested].start))
            if not inner:
                chosen = (i, close, start)
                break
        if chosen is None:  # pragma: no cover - the innermost clause always exists
            raise ProgrammingError("Cannot locate MATCH_RECOGNIZE clauses")
        i, close, start = chosen
        mr_tok = tokens[i]
        if start < 0 or start >= i:
            raise positioned(ProgrammingError, "MATCH_RECOGNIZE must follow a table reference in a FROM clause",
                             sql, origin.map(mr_tok.start), origin.map(mr_tok.end) + 1)
        # alias
        end_tok = close
        alias = None
        if close + 1 < len(tokens):
            nxt = tokens[close + 1]
            if nxt.token_type == TokenType.ALIAS and close + 2 < len(tokens):
                alias_tok = tokens[close + 2]
                if alias_tok.token_type in (TokenType.L_PAREN, TokenType.R_PAREN, TokenType.COMMA,
                                            TokenType.SEMICOLON):
                    raise positioned(ProgrammingError, "Expected an alias after AS", sql, origin.map(alias_tok.start))
                alias = text[alias_tok.start:alias_tok.end + 1]
                end_tok = close + 2
            elif nxt.token_type in (TokenType.VAR, TokenType.IDENTIFIER):
                alias = text[nxt.start:nxt.end + 1]
                end_tok = close + 1
        body_start = tokens[i + 1].end + 1
        body_end = tokens[close].start
        body = text[body_start:body_end]
        body_offset = origin.map(body_start)
        clause_span = Span(origin.map(mr_tok.start), origin.map(tokens[close].end) + 1)
        spec = parse_body(body, body_offset, sql, dialect, clause_span)
        placeholder = H.clause(tag, len(clauses))
        input_start, input_end = tokens[start].start, mr_tok.start
        input_text = text[input_start:input_end].strip()
        clauses.append(Clause(placeholder=placeholder, input_text=input_text,
                              input_span=Span(origin.map(input_start), origin.map(input_end)), spec=spec,
                              alias=alias))
        replacement = placeholder + (f" AS {alias}" if alias else "")
        new_text, step = rewrite(text, [(input_start, tokens[end_tok].end + 1, replacement)])
        text, origin, tokens = new_text, step.compose(origin), None
    return SplitQuery(source=sql, dialect=dialect, text=text, origin=origin, clauses=clauses, tokens=tokens)


def split_statements(sql: str, dialect: str) -> list[tuple[str, int]]:
    """Split a script on top-level semicolons: [(statement text, offset in sql)]."""
    tokens = tokenize(sql, dialect)
    out: list[tuple[str, int]] = []
    start = 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            piece = sql[start:tok.start]
            if piece.strip():
                out.append((piece, start))
            start = tok.end + 1
    piece = sql[start:]
    if piece.strip():
        out.append((piece, start))
    return out
