"""SQL expressions inside MATCH_RECOGNIZE: from delimited tokens to sqlglot trees.

sqlglot cannot parse the row-pattern-specific parts of an expression (``RUNNING LAST(x)``)
and gives FIRST/LAST dialect-specific meanings. Before handing the text to sqlglot we
therefore rewrite, at token level and outside subqueries:

* ``RUNNING f(...)`` / ``FINAL f(...)``  ->  ``__mr_running(f(...))`` / ``__mr_final(f(...))``
* ``PREV( NEXT( FIRST( LAST( CLASSIFIER( MATCH_NUMBER(``  ->  ``__mr_prev(`` ...

so that every row pattern function reaches the planner as an ``exp.Anonymous`` with a name
that cannot clash with a DuckDB function.
"""
from __future__ import annotations

import re

import sqlglot
from lark import Token, Tree
from sqlglot import exp

from matchrec.errors import ProgrammingError, positioned
from matchrec.parser import hidden as H
from matchrec.parser.source import rewrite
from matchrec.parser.translate import translate
from matchrec.parser.spec import Expression, Span

MR_FUNCTIONS = {"PREV", "NEXT", "FIRST", "LAST", "CLASSIFIER", "MATCH_NUMBER"}
MR_PREFIX = H.FUNCTION_PREFIX
_SUBQUERY_STARTERS = {"SELECT", "WITH", "VALUES", "FROM", "TABLE", "SUMMARIZE", "DESCRIBE", "PIVOT", "UNPIVOT"}


def flatten(node) -> list:
    """Children of an expr/group tree as a flat list at this nesting level."""
    return list(node.children)


def _is_group(node, opener="(") -> bool:
    return isinstance(node, Tree) and node.data == "group" and node.children and node.children[0] == opener


def _first_pos(node) -> int:
    if isinstance(node, Token):
        return node.start_pos
    return _first_pos(node.children[0])


def _last_end(node) -> int:
    if isinstance(node, Token):
        return node.end_pos
    return _last_end(node.children[-1])


def _collect_edits(items: list, edits: list, source: str, base: int) -> None:
    """Walk one nesting level of tokens/groups and record the rewrites described above."""
    i = 0
    while i < len(items):
        node = items[i]
        if isinstance(node, Tree):
            inner = node.children[1:-1]
            first = inner[0] if inner else None
            is_subquery = isinstance(first, Token) and str(first).upper() in _SUBQUERY_STARTERS
            if not is_subquery:
                _collect_edits(inner, edits, source, base)
            i += 1
            continue
        word = str(node).upper()
        nxt = items[i + 1] if i + 1 < len(items) else None
        if node.type in ("RUNNING", "FINAL"):
            call = items[i + 2] if i + 2 < len(items) else None
            if not (isinstance(nxt, Token) and nxt.type in ("IDENT", "FIRST", "LAST", "NEXT") and _is_group(call)):
                raise positioned(
                    ProgrammingError,
                    f"{word} must be followed by a navigation function (FIRST, LAST, PREV, NEXT) or an aggregate",
                    source, base + node.start_pos, base + node.end_pos)
            edits.append((node.start_pos, nxt.start_pos, f"{MR_PREFIX}{word.lower()}("))
            edits.append((call.meta.end_pos, call.meta.end_pos, ")"))
            i += 1
            continue
        if node.type in ("IDENT", "FIRST", "LAST", "NEXT") and word in MR_FUNCTIONS and _is_group(nxt):
            edits.append((node.start_pos, node.end_pos, MR_PREFIX + word.lower()))
        i += 1


def parse_expression(node: Tree, body: str, body_offset: int, source: str, dialect: str) -> Expression:
    """Turn a delimited ``expr`` tree of the body grammar into an Expression."""
    start, end = _first_pos(node), _last_end(node)
    text = body[start:end]
    edits: list = []
    _collect_edits(flatten(node), edits, source, body_offset)
    local = [(s - start, e - start, r) for s, e, r in edits]
    new_text, origin = rewrite(text, local, base=body_offset + start)
    tree = parse_sql_expression(new_text, origin, source, dialect)
    return Expression(text=text, span=Span(body_offset + start, body_offset + end), tree=tree, origin=origin)


def parse_sql_expression(text: str, origin, source: str, dialect: str) -> exp.Expression:
    """Parse one SQL expression with sqlglot, reporting errors at their place in ``source``."""
    try:
        tree = sqlglot.parse_one(text, read=dialect)
    except sqlglot.errors.ParseError as err:
        info = err.errors[0] if err.errors else {}
        offset = _offset_of(text, info.get("line", 1), info.get("col", 1), info.get("highlight", ""))
        desc = info.get("description", "invalid expression")
        raise positioned(ProgrammingError, f"Syntax error in expression: {_clean(desc)}", source,
                         origin.map(offset), origin.map(offset) + max(1, len(info.get('highlight', '')))) from None
    except (sqlglot.errors.TokenError, sqlglot.errors.SqlglotError, ValueError, KeyError, IndexError,
            TypeError, AttributeError, RecursionError) as err:
        raise positioned(ProgrammingError, f"Syntax error in expression: {_clean(str(err))}", source,
                         origin.map(0)) from None
    if tree is None:
        raise positioned(ProgrammingError, "Empty expression", source, origin.map(0))
    tree = translate(tree, dialect)
    if isinstance(tree, exp.Alias):
        at = node_offset(tree.args["alias"], origin, text)
        raise positioned(ProgrammingError, "Unexpected alias inside an expression (a missing comma or operator?)",
                         source, at)
    if isinstance(tree, (exp.Query, exp.Command)) and not isinstance(tree, exp.Subquery):
        raise positioned(ProgrammingError, "Expected an expression, found a statement "
                         "(put subqueries in parentheses)", source, origin.map(0))
    return tree


def _clean(message: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m", "", message)).strip()


def _offset_of(text: str, line: int, col: int, highlight: str) -> int:
    lines = text.split("\n")
    line = max(1, min(line, len(lines)))
    base = sum(len(x) + 1 for x in lines[: line - 1])
    # sqlglot reports the column of the last character of the offending token.
    return max(0, min(len(text), base + col - max(1, len(highlight))))


def node_offset(node: exp.Expression, origin, text: str | None = None) -> int:
    """Best known offset (in the original query) of a sqlglot node."""
    for sub in node.walk():
        meta = getattr(sub, "_meta", None) or {}
        if "start" in meta:
            return origin.map(meta["start"])
    return origin.map(0)


def node_span(node: exp.Expression, origin) -> tuple[int, int]:
    starts, ends = [], []
    for sub in node.walk():
        meta = getattr(sub, "_meta", None) or {}
        if "start" in meta:
            starts.append(meta["start"])
            ends.append(meta["end"] + 1)
    if not starts:
        return origin.map(0), origin.map(0) + 1
    return origin.map(min(starts)), origin.map(max(ends) - 1) + 1
