"""Query parameters (``?``, ``$1``, ``$name``) in statements that matchrec rewrites.

A statement with MATCH_RECOGNIZE cannot be handed to DuckDB with its parameters bound: the
clause is matched by matchrec, its input is read by several queries and its DEFINE/MEASURES
expressions are planned and partly evaluated in Python. So parameter values must become part
of the statement - but never part of the text that a SQL dialect's tokenizer reads. Dialects
disagree on string literals (backslash escapes in MySQL, Spark, Hive, BigQuery, Snowflake,
Redshift, Athena; ``'a' 'b'`` concatenation in Hive and Spark), so any value rendered as a
literal of the dialect being read can change the structure of the statement.

Instead:

1. ``mark`` finds the placeholders among the dialect's tokens and replaces each by a marker,
   a plain identifier made of letters, digits and underscores (the same in every dialect);
2. the statement is split, parsed and translated to DuckDB SQL with the markers in it;
3. each marker is then replaced by the value as a typed DuckDB expression: in the sqlglot
   trees of MEASURES/DEFINE (``bind_tree``), and in the translated DuckDB SQL (``duckdb_sql``),
   which only DuckDB reads.

Every value gets the type DuckDB gives the same Python value as a bound parameter
(``SELECT typeof(?)``), so the two ways of running a statement agree.
"""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import re
import secrets
import uuid
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.tokens import TokenType

from matchrec.errors import DataError, Error, ProgrammingError, positioned
from matchrec.parser import hidden as H
from matchrec.parser.query import _is_mr, matching_paren, tokenize
from matchrec.parser.source import Origin, rewrite

_DOLLAR_NAME = re.compile(r"\$(\d+|[A-Za-z_][A-Za-z0-9_]*)")
_INT32 = 2 ** 31
_INT64 = 2 ** 63
_UINT64 = 2 ** 64
_INT128 = 2 ** 127
_UINT128 = 2 ** 128
_MAX_DECIMAL_DIGITS = 38


@dataclass
class Marked:
    """A statement whose placeholders were replaced by markers."""
    text: str
    origin: Origin  # offsets of ``text`` -> offsets of the statement as written
    values: dict[str, object] = field(default_factory=dict)  # marker -> Python value
    written: dict[str, str] = field(default_factory=dict)  # marker -> the placeholder as written
    labels: dict[str, str] = field(default_factory=dict)  # marker -> "parameter 2", "parameter $name"

    def nodes(self) -> dict[str, exp.Expression]:
        """marker -> the value as a DuckDB expression (raises DataError/ProgrammingError)."""
        out = {}
        for marker, value in self.values.items():
            try:
                out[marker] = literal(value)
            except Error as err:
                raise type(err)(f"{self.labels[marker].capitalize()}: {err}") from None
        return out


# ------------------------------------------------------------------ finding placeholders
def mark(sql: str, params, dialect: str) -> Marked:
    """Replace every placeholder of ``sql`` (read as ``dialect``) by a marker identifier."""
    tokens = tokenize(sql, dialect)
    named = isinstance(params, dict)
    tag = secrets.token_hex(4)
    skip = _pattern_ranges(tokens)
    edits: list[tuple[int, int, str]] = []
    marked = Marked(text=sql, origin=Origin.identity(len(sql)))
    positional = 0
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        start, end = tok.start, tok.end + 1
        k = i
        i += 1
        if any(lo <= k <= hi for lo, hi in skip):
            continue
        text = sql[start:end]
        if tok.token_type == TokenType.PLACEHOLDER and text == "?":
            if named:
                raise positioned(ProgrammingError, "The query uses '?' placeholders but parameters were given as "
                                 "a mapping", sql, start)
            if positional >= len(params):
                raise positioned(ProgrammingError, f"Not enough parameters: the query needs more than {len(params)}",
                                 sql, start)
            value = params[positional]
            positional += 1
            label = f"parameter {positional}"
        else:
            name = None
            if tok.token_type == TokenType.PARAMETER and text == "$" and i < len(tokens) \
                    and tokens[i].start == end and not _glued_to_previous(tokens, k):
                # ``$1`` / ``$name`` as '$' followed by an adjacent token
                candidate = sql[start:tokens[i].end + 1]
                if _DOLLAR_NAME.fullmatch(candidate):
                    name, end = candidate[1:], tokens[i].end + 1
                    i += 1
            elif tok.token_type == TokenType.VAR and _DOLLAR_NAME.fullmatch(text):
                name = text[1:]
            if name is None:
                continue
            label = f"parameter ${name}"
            if name.isdigit() and not named:
                index = int(name) - 1
                if not 0 <= index < len(params):
                    raise positioned(ProgrammingError, f"Parameter ${name} is not given", sql, start)
                value = params[index]
            elif named and name in params:
                value = params[name]
            elif named:
                raise positioned(ProgrammingError, f"Parameter ${name} is not given", sql, start)
            else:
                continue
        marker = H.parameter(tag, len(marked.values))
        if _after_within(tokens, k, sql):
            edits.append((start, end, " " + _within_number(value, sql, start) + " "))
            continue
        marked.values[marker] = value
        marked.written[marker] = sql[start:end]
        marked.labels[marker] = label
        # spaces keep the marker from gluing onto the tokens around it
        edits.append((start, end, f" {marker} "))
    if not named and positional and positional != len(params):
        raise ProgrammingError(f"The query has {positional} '?' placeholders but {len(params)} parameters were given")
    if edits:
        marked.text, marked.origin = rewrite(sql, edits)
    return marked


def _glued_to_previous(tokens, k: int) -> bool:
    """``a$b`` in dialects that split it into three tokens is a name, not ``a`` and ``$b``."""
    return k > 0 and tokens[k - 1].end + 1 == tokens[k].start \
        and tokens[k - 1].token_type in (TokenType.VAR, TokenType.NUMBER, TokenType.PARAMETER)


def _pattern_ranges(tokens) -> list[tuple[int, int]]:
    """Token index ranges of ``PATTERN ( ... )`` inside MATCH_RECOGNIZE bodies, where ``?`` is a
    reluctant quantifier and ``$`` an anchor, never a parameter."""
    ranges = []
    for i in range(len(tokens)):
        if not _is_mr(tokens, i):
            continue
        close = matching_paren(tokens, i + 1)
        j = i + 2
        while 0 <= j < close:
            if tokens[j].text.upper() == "PATTERN" and j + 1 < close \
                    and tokens[j + 1].token_type == TokenType.L_PAREN:
                end = matching_paren(tokens, j + 1)
                if end < 0:
                    break
                ranges.append((j + 1, end))
                j = end
            j += 1
    return ranges


def _after_within(tokens, k: int, sql: str) -> bool:
    return k > 0 and sql[tokens[k - 1].start:tokens[k - 1].end + 1].upper() == "WITHIN"


def _within_number(value, sql: str, at: int) -> str:
    """``WITHIN ?``: the bound is part of the clause's syntax; only a number can stand there."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, float) and value >= 0 and value != float("inf"):
        return repr(value)
    raise positioned(ProgrammingError, f"A parameter after WITHIN must be a non-negative number, got "
                     f"{type(value).__name__}", sql, at)


# ------------------------------------------------------------------ values as DuckDB expressions
def _cast(text: str, type_sql: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build(type_sql, dialect="duckdb"))


def _integer(value: int) -> exp.Expression:
    # A plain literal has the bound parameter's type (INTEGER, BIGINT) except at the edges,
    # where DuckDB would read the digits as a wider type.
    if -_INT64 < value < _INT64 and value != -_INT32:
        node = exp.Literal.number(abs(value))
        return exp.Paren(this=exp.Neg(this=node)) if value < 0 else node
    if -_INT32 <= value < _INT32:
        kind = "INTEGER"
    elif -_INT64 <= value < _INT64:
        kind = "BIGINT"
    elif 0 <= value < _UINT64:
        kind = "UBIGINT"
    elif -_INT128 <= value < _INT128:
        kind = "HUGEINT"
    elif 0 <= value < _UINT128:
        kind = "UHUGEINT"
    else:
        raise DataError(f"Integer parameter {value} is out of range: DuckDB integers hold at most 128 bits")
    return _cast(str(value), kind)


def _decimal(value: decimal.Decimal) -> exp.Expression:
    if value.is_snan():
        raise DataError("A signalling NaN Decimal cannot be used as a parameter")
    if not value.is_finite():
        return _cast("nan" if value.is_nan() else ("-inf" if value < 0 else "inf"), "FLOAT")
    _, digits, exponent = value.as_tuple()
    if exponent >= 0:
        precision, scale = len(digits) + exponent, 0
    else:
        # DuckDB counts a leading zero when the digits do not reach the decimal point
        scale = -exponent
        precision = max(len(digits), scale) + (1 if len(digits) < scale else 0)
    if precision > _MAX_DECIMAL_DIGITS:
        return _cast(repr(float(value)), "DOUBLE")
    return _cast(format(value, "f"), f"DECIMAL({precision},{scale})")


def literal(value) -> exp.Expression:
    """``value`` as a DuckDB expression of the type DuckDB gives it as a bound parameter."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return _integer(value)
    if isinstance(value, float):
        return _cast(repr(value), "DOUBLE")
    if isinstance(value, decimal.Decimal):
        return _decimal(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise DataError(f"The string is not valid Unicode text: {err.reason} at position {err.start}") from None
        return exp.Literal.string(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return exp.Anonymous(this="FROM_HEX", expressions=[exp.Literal.string(bytes(value).hex())])
    if isinstance(value, datetime.datetime):
        if value.utcoffset() is not None:
            return _cast(value.isoformat(sep=" "), "TIMESTAMPTZ")
        return _cast(value.replace(tzinfo=None).isoformat(sep=" "), "TIMESTAMP")
    if isinstance(value, datetime.date):
        return _cast(value.isoformat(), "DATE")
    if isinstance(value, datetime.time):
        return _cast(value.isoformat(), "TIMETZ" if value.utcoffset() is not None else "TIME")
    if isinstance(value, datetime.timedelta):
        # DuckDB keeps the days and the microseconds of a timedelta as separate interval parts.
        micros = value.seconds * 1_000_000 + value.microseconds
        return _cast(f"{value.days} days {micros} microseconds", "INTERVAL")
    if isinstance(value, uuid.UUID):
        return _cast(str(value), "UUID")
    if isinstance(value, (list, tuple)):
        return exp.Array(expressions=[literal(v) for v in value])
    raise ProgrammingError(f"Cannot use a parameter of type {type(value).__name__} in a statement with "
                           "MATCH_RECOGNIZE; use None, bool, int, float, Decimal, str, bytes, date, time, "
                           "datetime, timedelta, UUID or a list of these")


def duckdb_sql(node: exp.Expression) -> str:
    """DuckDB SQL of a value, safe to put anywhere an operand can stand."""
    text = node.sql("duckdb")
    return f"({text})" if text.startswith("-") else text


# ------------------------------------------------------------------ substitution
def bind_tree(tree: exp.Expression, nodes: dict[str, exp.Expression]) -> exp.Expression:
    """``tree`` with every marker column replaced by its value."""
    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table and node.name in nodes:
            return nodes[node.name].copy()
        return node
    return tree.transform(swap)


def bind_spec(spec, nodes: dict[str, exp.Expression], texts: dict[str, str]):
    """A MatchSpec whose MEASURES/DEFINE expressions carry the values instead of markers."""
    def expression(e):
        text = e.text
        for marker, shown in texts.items():
            text = text.replace(f" {marker} ", shown).replace(marker, shown)
        return dataclasses.replace(e, text=text, tree=bind_tree(e.tree, nodes))

    measures = tuple(dataclasses.replace(m, expression=expression(m.expression)) for m in spec.measures)
    definitions = tuple(dataclasses.replace(d, expression=expression(d.expression)) for d in spec.definitions)
    return dataclasses.replace(spec, measures=measures, definitions=definitions)


def unmark_error(err: Error, marked: Marked | None, origin: Origin, source: str) -> Error:
    """``err``, raised on the marked text, pointing into ``source`` (the statement as written,
    which ``origin`` maps the marked text to)."""
    def clean(message: str) -> str:
        for marker, written in (marked.written if marked else {}).items():
            message = message.replace(marker, written)
        return message

    position = getattr(err, "position", None)
    if position is not None and getattr(err, "problem", None) is not None:
        end = getattr(err, "end", None)
        new = positioned(type(err), clean(err.problem), source, origin.map(position),
                         origin.map(end - 1) + 1 if end is not None else None)
    else:
        new = type(err)(clean(str(err)))
    new.__cause__ = None
    return new
