"""Find row pattern recognition in windows (SQL:2016 R020) and cut it out of a statement.

``SELECT m OVER w FROM src WHERE c WINDOW w AS (PARTITION BY .. ORDER BY .. MEASURES ..
ROWS BETWEEN CURRENT ROW AND .. FOLLOWING AFTER MATCH .. PATTERN (..) DEFINE ..)`` and the
inline ``OVER (... PATTERN ...)`` cannot be read by sqlglot, so they are handled on the
dialect's tokens, as MATCH_RECOGNIZE is (parser.query). For each pattern window, innermost
first:

* the window definition is removed (from the WINDOW clause, or the inline ``OVER (...)``);
* the single table reference of the SELECT that owns the window becomes ``<placeholder> AS
  <alias>``; the placeholder stands for that table filtered by the SELECT's WHERE, with one
  column per measure and the row's match bounds added (computed by engine.window);
* ``measure OVER w`` becomes that measure's column, and ``f(...) OVER w`` an ordinary window
  function whose frame is the rows of the row's match (empty where there is none).

The WHERE clause stays in the SELECT: applied again to the same rows it keeps them all.
The window body is parsed by the MATCH_RECOGNIZE grammar once its frame is taken out.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from matchrec.errors import NotSupportedError, ProgrammingError, positioned
from matchrec.parser import hidden as H
from matchrec.parser.body import parse_body
from matchrec.parser.names import quote_ident
from matchrec.parser.query import matching_paren, tokenize
from matchrec.parser.source import Origin, rewrite
from matchrec.parser.spec import MatchSpec, Span

# Tokens that end the FROM clause of a SELECT (at the SELECT's depth).
_AFTER_FROM = {TokenType.WHERE, TokenType.GROUP_BY, TokenType.HAVING, TokenType.WINDOW, TokenType.QUALIFY,
               TokenType.ORDER_BY, TokenType.LIMIT, TokenType.UNION, TokenType.EXCEPT, TokenType.INTERSECT,
               TokenType.SEMICOLON, TokenType.FETCH, TokenType.OFFSET}
_PATTERN_WORDS = {"PATTERN", "MEASURES"}
# Words after the frame extent in a pattern window: the frame ends before the first of them.
_AFTER_FRAME = {"AFTER", "INITIAL", "SEEK", "PATTERN", "SUBSET", "DEFINE"}


@dataclass
class PatternWindow:
    """One window with row pattern recognition, cut out of the statement."""
    name: str
    spec: MatchSpec
    seek: bool
    frame_end: str | None  # SQL (query dialect) of the n in "n FOLLOWING"; None: UNBOUNDED FOLLOWING
    frame_span: Span
    placeholder: str
    source_text: str  # the SELECT's table reference, in the query's dialect
    where_text: str | None
    span: Span  # the window definition, in the user's text
    measure_columns: list[str] = field(default_factory=list)
    # measure names written without OVER (fine only if the table has such a column)
    bare_measures: list[tuple[str, Span]] = field(default_factory=list)

    @property
    def star_marker(self) -> str:
        return f"{self.placeholder}_star"

    @property
    def pos_column(self) -> str:
        return f"{self.placeholder}_pos"

    @property
    def lo_column(self) -> str:
        return f"{self.placeholder}_lo"

    @property
    def hi_column(self) -> str:
        return f"{self.placeholder}_hi"

    @property
    def frame_column(self) -> str:
        return f"{self.placeholder}_frame"


@dataclass
class WindowQuery:
    text: str
    origin: Origin
    windows: list[PatternWindow]


_PATTERN_WINDOW_HINT = re.compile(r"\bPATTERN\s*\(", re.I)
_WINDOW_HINT = re.compile(r"\b(OVER|WINDOW)\b", re.I)


def has_pattern_window(sql: str) -> bool:
    """A cheap test: could ``sql`` hold a window with PATTERN?"""
    return bool(_PATTERN_WINDOW_HINT.search(sql)) and bool(_WINDOW_HINT.search(sql))


def _depths(tokens) -> list[int]:
    out, depth = [], 0
    for tok in tokens:
        if tok.token_type == TokenType.R_PAREN:
            depth -= 1
        out.append(depth)
        if tok.token_type == TokenType.L_PAREN:
            depth += 1
    return out


def _word(tok) -> str:
    if tok.token_type in (TokenType.STRING, TokenType.IDENTIFIER):
        return ""
    return tok.text.upper()


def _is_pattern_body(tokens, depths, open_i: int, close_i: int) -> bool:
    d = depths[open_i] + 1
    return any(depths[k] == d and _word(tokens[k]) in _PATTERN_WORDS for k in range(open_i + 1, close_i))


def _name_of(text: str, tok) -> str:
    raw = text[tok.start:tok.end + 1]
    if tok.token_type == TokenType.IDENTIFIER:
        return raw[1:-1] if raw[:1] in "\"`[" else raw
    return raw.upper()


@dataclass
class _Definition:
    name: str
    open_i: int  # '(' of the body
    close_i: int
    cut_start: int  # text offsets to remove (a WINDOW list entry) or None for inline
    cut_end: int
    inline_over: int | None  # token index of OVER for an inline definition
    depth: int
    window_kw: int | None  # token index of the WINDOW keyword owning a named definition
    written: str = "(...)"  # the name as written, for messages


def _definitions(text: str, tokens, depths) -> list[_Definition]:
    found: list[_Definition] = []
    n = len(tokens)
    for i, tok in enumerate(tokens):
        tt = tok.token_type
        if tt == TokenType.WINDOW:
            j = i + 1
            entries = []
            while j + 2 < n and tokens[j + 1].token_type == TokenType.ALIAS \
                    and tokens[j + 2].token_type == TokenType.L_PAREN:
                close = matching_paren(tokens, j + 2)
                if close < 0:
                    break
                entries.append((j, close))
                if close + 1 < n and tokens[close + 1].token_type == TokenType.COMMA:
                    j = close + 2
                else:
                    break
            for k, (j0, close) in enumerate(entries):
                if not _is_pattern_body(tokens, depths, j0 + 2, close):
                    continue
                if len(entries) == 1:  # the last definition: the WINDOW keyword goes too
                    cut_start, cut_end = tok.start, tokens[close].end + 1
                elif k + 1 < len(entries):  # "name AS (...)," up to the next definition
                    cut_start, cut_end = tokens[j0].start, tokens[entries[k + 1][0]].start
                else:  # ", name AS (...)"
                    cut_start, cut_end = tokens[j0 - 1].start, tokens[close].end + 1
                found.append(_Definition(_name_of(text, tokens[j0]), j0 + 2, close, cut_start, cut_end, None,
                                         depths[i], i, text[tokens[j0].start:tokens[j0].end + 1]))
        elif tt == TokenType.OVER and i + 1 < n and tokens[i + 1].token_type == TokenType.L_PAREN:
            close = matching_paren(tokens, i + 1)
            if close > 0 and _is_pattern_body(tokens, depths, i + 1, close):
                found.append(_Definition("", i + 1, close, -1, -1, i, depths[i], None))
    return found


def _select_bounds(tokens, depths, at: int) -> tuple[int, int]:
    """Token range [select, end) of the innermost SELECT that contains token ``at``."""
    target = depths[at]
    s = at
    while s >= 0:
        target = min(target, depths[s])
        if depths[s] == target and tokens[s].token_type == TokenType.SELECT:
            break
        s -= 1
    if s < 0:
        return -1, -1
    d = depths[s]
    e = s + 1
    while e < len(tokens) and depths[e] >= d and not (
            depths[e] == d and tokens[e].token_type in (TokenType.UNION, TokenType.EXCEPT, TokenType.INTERSECT,
                                                        TokenType.SEMICOLON)):
        e += 1
    return s, e


def split_windows(sql: str, dialect: str, source: str | None = None, origin: Origin | None = None) -> WindowQuery:
    """Cut every pattern window out of ``sql`` (one statement of ``dialect``).

    ``source``/``origin``: the user's text and how offsets of ``sql`` map into it (errors
    point there)."""
    source = source if source is not None else sql
    origin = origin if origin is not None else Origin.identity(len(sql))
    text = sql
    windows: list[PatternWindow] = []
    tag = secrets.token_hex(4)
    while True:
        tokens = tokenize(text, dialect, origin, source)
        depths = _depths(tokens)
        defs = _definitions(text, tokens, depths)
        if not defs:
            break
        if not windows:
            _check_window_names(text, tokens, source, origin)
        # innermost first: its table reference holds no other pattern window
        d = max(defs, key=lambda x: (x.depth, -x.open_i))
        k = len(windows)
        placeholder = H.window(tag, k)
        text, origin, window = _cut_one(text, origin, source, dialect, tokens, depths, d, placeholder)
        windows.append(window)
    return WindowQuery(text, origin, windows)


def _check_window_names(text: str, tokens, source: str, origin: Origin) -> None:
    """Every ``OVER name`` must name a window of a WINDOW clause (checked before any is cut out,
    so that the error points at the user's text rather than at the rewritten statement)."""
    defined = set()
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.WINDOW:
            j = i + 1
            while j + 2 < len(tokens) and tokens[j + 1].token_type == TokenType.ALIAS \
                    and tokens[j + 2].token_type == TokenType.L_PAREN:
                defined.add(_name_of(text, tokens[j]))
                close = matching_paren(tokens, j + 2)
                if close < 0 or close + 1 >= len(tokens) or tokens[close + 1].token_type != TokenType.COMMA:
                    break
                j = close + 2
    for i, tok in enumerate(tokens[:-1]):
        nxt = tokens[i + 1]
        if tok.token_type == TokenType.OVER and nxt.token_type in (TokenType.VAR, TokenType.IDENTIFIER) \
                and _name_of(text, nxt) not in defined:
            raise positioned(ProgrammingError, f"Window {text[nxt.start:nxt.end + 1]} is not defined in a WINDOW "
                             "clause", source, origin.map(nxt.start), origin.map(nxt.end) + 1)


def _frame(text: str, tokens, depths, d: _Definition, source: str, origin: Origin):
    """Find the frame extent in the body: (first token, last token, end SQL or None)."""
    depth = depths[d.open_i] + 1
    body = [k for k in range(d.open_i + 1, d.close_i) if depths[k] == depth]
    start = next((k for k in body if tokens[k].token_type in (TokenType.ROWS, TokenType.RANGE)
                  or _word(tokens[k]) == "GROUPS"), None)
    if start is None:
        at = origin.map(tokens[d.open_i].start)
        raise positioned(ProgrammingError, "A window with PATTERN needs the frame ROWS BETWEEN CURRENT ROW AND ... "
                         "FOLLOWING", source, at)
    end = next((k for k in body if k > start and _word(tokens[k]) in _AFTER_FRAME), d.close_i)
    last = end - 1
    while last > start and depths[last] != depth:
        last -= 1
    frame_span = Span(origin.map(tokens[start].start), origin.map(tokens[last].end) + 1)
    words = [_word(tokens[k]) for k in range(start, end)]

    def fail(message: str):
        return positioned(ProgrammingError, message, source, frame_span.start, frame_span.end)

    if words[0] != "ROWS":
        raise fail(f"Pattern recognition requires a ROWS frame, not {words[0]}")
    if len(words) < 2 or words[1] != "BETWEEN":
        raise fail("Pattern recognition requires the frame ROWS BETWEEN CURRENT ROW AND ...")
    if words[2:5] != ["CURRENT", "ROW", "AND"]:
        raise fail("Pattern recognition requires a frame starting at CURRENT ROW")
    rest = list(range(start + 5, end))
    rest_words = words[5:]
    if rest_words == ["UNBOUNDED", "FOLLOWING"]:
        return start, last, None, frame_span
    if rest_words == ["CURRENT", "ROW"]:
        return start, last, "0", frame_span
    if len(rest_words) >= 2 and rest_words[-1] == "FOLLOWING":
        expr = text[tokens[rest[0]].start:tokens[rest[-2]].end + 1]
        return start, last, expr, frame_span
    raise fail("Pattern recognition requires a frame ending at CURRENT ROW, n FOLLOWING or UNBOUNDED FOLLOWING")


def _cut_one(text: str, origin: Origin, source: str, dialect: str, tokens, depths, d: _Definition,
             placeholder: str):
    def at(k: int) -> int:
        return origin.map(tokens[k].start)

    f_start, f_last, frame_end, frame_span = _frame(text, tokens, depths, d, source, origin)
    body_start = tokens[d.open_i].end + 1
    body_end = tokens[d.close_i].start
    # the frame is blanked (same length) so that offsets in the body stay true
    fs, fe = tokens[f_start].start, tokens[f_last].end + 1
    body = text[body_start:fs] + " " * (fe - fs) + text[fe:body_end]
    first_word = _word(tokens[d.open_i + 1]) if d.open_i + 1 < d.close_i else ""
    if tokens[d.open_i + 1].token_type in (TokenType.VAR, TokenType.IDENTIFIER) and first_word not in \
            ("PARTITION", "ORDER", "MEASURES", "ROWS") and tokens[d.open_i + 2].token_type not in (TokenType.DOT,):
        raise positioned(NotSupportedError, "A pattern window cannot extend another named window; write its "
                         "PARTITION BY and ORDER BY in it", source, at(d.open_i + 1))
    def_span = Span(at(d.open_i), origin.map(tokens[d.close_i].end) + 1)
    spec = parse_body(body, origin.map(body_start), source, dialect, def_span, window=True)
    if spec.within is not None:
        raise positioned(NotSupportedError, "WITHIN is not supported in a window; use MATCH_RECOGNIZE",
                         source, spec.within.span.start, spec.within.span.end)

    owner = d.window_kw if d.window_kw is not None else d.inline_over
    sel, sel_end = _select_bounds(tokens, depths, owner)
    if sel < 0:
        raise positioned(ProgrammingError, "A window with PATTERN must belong to a SELECT", source, at(owner))
    sd = depths[sel]
    frm = next((k for k in range(sel, sel_end) if depths[k] == sd and tokens[k].token_type == TokenType.FROM), None)
    if frm is None:
        raise positioned(ProgrammingError, "A window with PATTERN needs a FROM clause in its SELECT", source,
                         at(sel))
    from_end = next((k for k in range(frm + 1, sel_end) if depths[k] == sd
                     and tokens[k].token_type in _AFTER_FROM), sel_end)
    bare_values = tokens[frm + 1].token_type == TokenType.VALUES  # FROM VALUES (1), (2) AS t(x)
    joined = next((k for k in range(frm + 1, from_end) if depths[k] == sd and (
        tokens[k].token_type in (TokenType.JOIN, TokenType.CROSS, TokenType.LATERAL)
        or (tokens[k].token_type == TokenType.COMMA and not bare_values))), None)
    if joined is not None:
        raise positioned(NotSupportedError, "A window with PATTERN over a join is not supported; join in a "
                         "subquery and use the window on it", source, at(joined))
    if any(depths[k] == sd and tokens[k].token_type in (TokenType.GROUP_BY, TokenType.HAVING)
           for k in range(from_end, sel_end)):
        k = next(k for k in range(from_end, sel_end) if depths[k] == sd
                 and tokens[k].token_type in (TokenType.GROUP_BY, TokenType.HAVING))
        raise positioned(NotSupportedError, "A window with PATTERN in a SELECT with GROUP BY or HAVING is not "
                         "supported; group in a subquery", source, at(k))
    src_start, src_end = tokens[frm + 1].start, tokens[from_end - 1].end + 1
    source_text = text[src_start:src_end]
    where_text = None
    where = next((k for k in range(from_end, sel_end) if depths[k] == sd
                  and tokens[k].token_type == TokenType.WHERE), None)
    if where is not None:
        w_end = next((k for k in range(where + 1, sel_end) if depths[k] == sd
                      and tokens[k].token_type in _AFTER_FROM), sel_end)
        where_text = text[tokens[where + 1].start:tokens[w_end - 1].end + 1]
    alias = _alias(source_text, dialect)
    if alias is None:
        raise positioned(ProgrammingError, "The table of a window with PATTERN needs a name; add an alias", source,
                         at(frm + 1))

    window = PatternWindow(name=d.written, spec=spec, seek=spec.seek, frame_end=frame_end, frame_span=frame_span,
                           placeholder=placeholder, source_text=source_text, where_text=where_text, span=def_span)
    measures = {}
    for j, m in enumerate(spec.measures):
        col = f"{placeholder}_m{j}"
        window.measure_columns.append(col)
        measures[m.name.upper()] = col
    partition = ", ".join(quote_ident(c.name) if c.quoted else c.name
                          for c in spec.partition_by)
    frame_sql = ("PARTITION BY " + partition + " " if partition else "") + \
        f"ORDER BY {window.pos_column} ROWS BETWEEN {window.lo_column} FOLLOWING AND {window.hi_column} FOLLOWING"

    edits: list[tuple[int, int, str]] = [(src_start, src_end, f"{placeholder} AS {alias}")]
    if d.inline_over is None and d.cut_start >= 0:
        edits.append((d.cut_start, d.cut_end, ""))

    def use(over: int, after: int) -> None:
        """Rewrite the use ``... OVER <window>`` whose window ends at token ``after``."""
        before = over - 1
        end = tokens[after].end + 1
        prev = tokens[before] if before >= 0 else None
        if prev is not None and prev.token_type == TokenType.R_PAREN:
            depth, k = 0, before
            while k >= 0:  # back to the function's '('
                if tokens[k].token_type == TokenType.R_PAREN:
                    depth += 1
                elif tokens[k].token_type == TokenType.L_PAREN:
                    depth -= 1
                    if depth == 0:
                        break
                k -= 1
            name_tok = k - 1
            # a whole select item is named as written, not by the frame that replaces the window
            alias = ""
            if name_tok > 0 and tokens[name_tok - 1].token_type in (TokenType.SELECT, TokenType.COMMA) \
                    and after + 1 < len(tokens) and tokens[after + 1].token_type in (TokenType.COMMA, TokenType.FROM):
                written = " ".join(text[tokens[name_tok].start:end].split())
                alias = " AS " + quote_ident(written)
            edits.append((tokens[over].start, end, f"OVER ({frame_sql}){alias}"))
            return
        if prev is not None and prev.token_type in (TokenType.VAR, TokenType.IDENTIFIER) \
                and not (before > 0 and tokens[before - 1].token_type == TokenType.DOT):
            name = _name_of(text, prev)
            col = measures.get(name.upper())
            if col is None:
                raise positioned(ProgrammingError, f"{text[prev.start:prev.end + 1]} is not a measure of window "
                                 f"{d.written}", source, at(before), origin.map(prev.end) + 1)
            # a whole select item keeps the measure's name as its column name
            whole = before > 0 and tokens[before - 1].token_type in (TokenType.SELECT, TokenType.COMMA) \
                and after + 1 < len(tokens) and tokens[after + 1].token_type in (TokenType.COMMA, TokenType.FROM)
            edits.append((prev.start, end, col + (f" AS {text[prev.start:prev.end + 1]}" if whole else "")))
            return
        raise positioned(ProgrammingError, "Only a measure name or a window function can stand before OVER of a "
                         "window with PATTERN", source, at(over))

    # ``*`` in the select list stands for the table's own columns, not the added match columns
    for k in range(sel + 1, frm):
        if depths[k] != sd or tokens[k].token_type != TokenType.STAR:
            continue
        if tokens[k - 1].token_type in (TokenType.SELECT, TokenType.COMMA, TokenType.DISTINCT):
            edits.append((tokens[k].start, tokens[k].end + 1, window.star_marker))
        elif tokens[k - 1].token_type == TokenType.DOT and k >= 2 \
                and tokens[k - 2].token_type in (TokenType.VAR, TokenType.IDENTIFIER) \
                and tokens[k - 3].token_type in (TokenType.SELECT, TokenType.COMMA, TokenType.DISTINCT):
            edits.append((tokens[k - 2].start, tokens[k].end + 1, window.star_marker))
    # a measure name used as a column: reported if the table has no such column
    for k in range(sel + 1, sel_end):
        tok = tokens[k]
        if tok.token_type not in (TokenType.VAR, TokenType.IDENTIFIER) or d.open_i <= k <= d.close_i:
            continue
        if tok.token_type == TokenType.VAR and tok.text.upper() not in measures:
            continue
        if tok.token_type == TokenType.IDENTIFIER and _name_of(text, tok).upper() not in measures:
            continue
        if (k + 1 < len(tokens) and tokens[k + 1].token_type in (TokenType.OVER, TokenType.DOT, TokenType.L_PAREN)) \
                or tokens[k - 1].token_type in (TokenType.DOT, TokenType.ALIAS):
            continue
        window.bare_measures.append((text[tok.start:tok.end + 1], Span(at(k), origin.map(tok.end) + 1)))

    if d.inline_over is not None:
        use(d.inline_over, d.close_i)
    else:
        for k in range(sel, sel_end):
            if tokens[k].token_type != TokenType.OVER or k + 1 >= len(tokens):
                continue
            nxt = tokens[k + 1]
            if nxt.token_type in (TokenType.VAR, TokenType.IDENTIFIER) and _name_of(text, nxt) == d.name:
                use(k, k + 1)
            elif nxt.token_type == TokenType.L_PAREN and k + 3 < len(tokens) \
                    and tokens[k + 3].token_type == TokenType.R_PAREN \
                    and tokens[k + 2].token_type in (TokenType.VAR, TokenType.IDENTIFIER) \
                    and _name_of(text, tokens[k + 2]) == d.name:
                use(k, k + 3)
    new_text, step = rewrite(text, sorted(edits))
    return new_text, step.compose(origin), window


def _alias(source_text: str, dialect: str) -> str | None:
    try:
        tree = sqlglot.parse_one(f"SELECT * FROM {source_text}", read=dialect)
    except sqlglot.errors.SqlglotError:
        return None
    table = tree.args["from_"].this
    alias = table.alias
    if alias:
        ident = table.args["alias"].this
        return ident.sql(dialect)
    if isinstance(table, exp.Table):
        return table.args["this"].sql(dialect)
    return None
