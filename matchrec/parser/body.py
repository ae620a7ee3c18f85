"""Parse the body of one MATCH_RECOGNIZE clause (lark grammar) into a MatchSpec.

Only syntax is checked here, plus what the syntax alone decides (quantifier bounds,
duplicate names). Name resolution and the rules about navigation and aggregation live
in the planner, which knows the input schema.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import threading

import lark
from lark import Token, Tree

from matchrec.errors import ProgrammingError, positioned
from matchrec.parser import spec as S
from matchrec.parser.expressions import parse_expression
from matchrec.parser.grammar_cache import cache_file

MAX_QUANTIFIER = 100_000


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    grammar = importlib.resources.files("matchrec.parser").joinpath("match_recognize.lark").read_text()
    return lark.Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=False,
                     cache=cache_file("match_recognize.lark"))


_TERMINAL_NAMES = {
    "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "IDENT": "a name", "QIDENT": "a quoted name",
    "STRING": "a string", "NUMBER": "a number", "INT": "an integer", "OP": "an operator", "$END": "end of clause",
    "DOLLAR": "'$'", "RELUCTANT": "'?'", "STAR_OP": "'*'", "LBRACE": "'{'", "RBRACE": "'}'", "DOT": "'.'",
}


def _describe_expected(expected) -> str:
    names = []
    for term in sorted(expected):
        if term.startswith("__ANON") or term.startswith("ANON"):
            continue
        names.append(_TERMINAL_NAMES.get(term, term.replace("_KW", "")))
    names = sorted(set(names))
    if not names:
        return ""
    if len(names) > 8:
        names = names[:8] + ["..."]
    return "; expected " + ", ".join(names)


def canonical_name(token: Token | str) -> str:
    """Pattern variable / identifier canonical form: unquoted upper-cased, quoted verbatim."""
    text = str(token)
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return text[1:-1].replace('""', '"')
    if text.startswith("`") and text.endswith("`") and len(text) >= 2:
        return text[1:-1].replace("``", "`")
    return text.upper()


def parse_body(body: str, body_offset: int, source: str, dialect: str, clause_span: S.Span,
               window: bool = False) -> S.MatchSpec:
    """Parse ``body`` (the text inside MATCH_RECOGNIZE(...)) located at ``body_offset`` in ``source``.

    ``window``: the body of a window with pattern recognition, its frame already blanked out.

    A statement run again parses the same text again (lark takes milliseconds): the specs of
    recent texts are kept, and each caller gets its own copy of their sqlglot trees, the one
    mutable part of a spec, so that nothing a caller does to them reaches the kept one."""
    key = (body, body_offset, source, dialect, clause_span, window)
    kept = _PARSED.get(key)
    if kept is None:
        kept = _parse_body(body, body_offset, source, dialect, clause_span, window)
        with _PARSED_LOCK:  # statements on other connections parse at the same time
            while len(_PARSED) >= _PARSED_MAX:
                _PARSED.pop(next(iter(_PARSED)))
            _PARSED[key] = kept
    return _fresh(kept)


_PARSED: dict[tuple, S.MatchSpec] = {}  # parsed specs by their text and position, oldest first
_PARSED_MAX = 256
_PARSED_LOCK = threading.Lock()


def _fresh(spec: S.MatchSpec) -> S.MatchSpec:
    """``spec`` with copies of the sqlglot trees of its MEASURES and DEFINE."""
    def expression(e: S.Expression) -> S.Expression:
        return dataclasses.replace(e, tree=e.tree.copy())

    return dataclasses.replace(
        spec, measures=tuple(dataclasses.replace(m, expression=expression(m.expression)) for m in spec.measures),
        definitions=tuple(dataclasses.replace(d, expression=expression(d.expression)) for d in spec.definitions))


def _parse_body(body: str, body_offset: int, source: str, dialect: str, clause_span: S.Span,
                window: bool) -> S.MatchSpec:
    try:
        tree = _parser().parse(body)
    except lark.exceptions.UnexpectedToken as err:
        tok = err.token
        if tok.type == "$END":
            at = body_offset + len(body.rstrip())
            what = "Unexpected end of MATCH_RECOGNIZE clause"
        else:
            at = body_offset + (tok.start_pos or 0)
            what = f"Unexpected {str(tok)!r} in MATCH_RECOGNIZE"
        end = at + max(1, len(str(tok))) if tok.type != "$END" else None
        raise positioned(ProgrammingError, what + _describe_expected(err.expected), source, at, end) from None
    except lark.exceptions.UnexpectedCharacters as err:
        at = body_offset + err.pos_in_stream
        raise positioned(ProgrammingError, f"Unexpected character {body[err.pos_in_stream]!r} in MATCH_RECOGNIZE",
                         source, at) from None
    except lark.exceptions.UnexpectedEOF:
        raise positioned(ProgrammingError, "Unexpected end of MATCH_RECOGNIZE clause", source,
                         body_offset + len(body)) from None
    return _Builder(body, body_offset, source, dialect, window).build(tree, clause_span)


class _Builder:
    def __init__(self, body: str, offset: int, source: str, dialect: str, window: bool = False):
        self.body, self.offset, self.source, self.dialect = body, offset, source, dialect
        self.window = window

    def span(self, node) -> S.Span:
        if isinstance(node, Token):
            return S.Span(self.offset + node.start_pos, self.offset + node.end_pos)
        return S.Span(self.offset + node.meta.start_pos, self.offset + node.meta.end_pos)

    def error(self, message: str, node) -> ProgrammingError:
        sp = self.span(node)
        return positioned(ProgrammingError, message, self.source, sp.start, sp.end)

    # ------------------------------------------------------------------ clauses
    def build(self, tree: Tree, clause_span: S.Span) -> S.MatchSpec:
        parts = {child.data: child for child in tree.children if isinstance(child, Tree)}
        partition = ()
        if "partition_clause" in parts:
            partition = tuple(self.column_ref(c) for c in parts["partition_clause"].children)
        order = ()
        if "order_clause" in parts:
            order = tuple(self.sort_key(k) for k in parts["order_clause"].children)
        measures = ()
        if "measures_clause" in parts:
            measures = tuple(self.measure(m) for m in parts["measures_clause"].children)
            self.check_unique([(m.name, m.name_span) for m in measures], "measure")
        rows, empty = "one", "show"
        if self.window:
            for kind in ("one_row", "all_rows"):
                if kind in parts:
                    raise self.error("ROWS PER MATCH is not allowed in a window", parts[kind])
        if "all_rows" in parts:
            rows = "all"
            opts = [c for c in parts["all_rows"].children if isinstance(c, Tree)]
            if opts:
                empty = {"show_empty": "show", "omit_empty": "omit", "with_unmatched": "unmatched"}[opts[0].data]
        skip = S.SkipSpec()
        if "skip_clause" in parts:
            skip = self.skip(parts["skip_clause"].children[0])
        seek = False
        if "initial_clause" in parts:
            word = parts["initial_clause"].children[0]
            seek = word.type == "SEEK"
            if seek and not self.window:
                raise self.error("SEEK is not allowed in MATCH_RECOGNIZE (only INITIAL)", word)
        pattern_clause = parts["pattern_clause"]
        inner = [c for c in pattern_clause.children if isinstance(c, Tree)]
        pattern = self.pattern(inner[0]) if inner else S.EmptyPattern(span=self.span(pattern_clause))
        within = self.within(parts["within_clause"]) if "within_clause" in parts else None
        subsets = ()
        if "subset_clause" in parts:
            subsets = tuple(self.subset(s) for s in parts["subset_clause"].children)
            self.check_unique([(s.name, s.span) for s in subsets], "SUBSET")
        definitions = ()
        if "define_clause" in parts:
            definitions = tuple(self.definition(d) for d in parts["define_clause"].children)
            self.check_unique([(d.variable, d.variable_span) for d in definitions], "DEFINE")
        return S.MatchSpec(
            partition_by=partition, order_by=order, measures=measures, rows_per_match=rows,
            empty_matches=empty, skip=skip, pattern=pattern, within=within, subsets=subsets,
            definitions=definitions, span=clause_span, source=self.source, dialect=self.dialect, seek=seek)

    def check_unique(self, names, what: str) -> None:
        seen = set()
        for name, span in names:
            key = name.upper() if what == "measure" else name
            if key in seen:
                raise positioned(ProgrammingError, f"{what} name {name!r} is defined more than once",
                                 self.source, span.start, span.end)
            seen.add(key)

    def column_ref(self, node: Tree) -> S.ColumnRef:
        names = [c.children[0] for c in node.children]
        if len(names) > 1:
            raise self.error("PARTITION BY and ORDER BY of MATCH_RECOGNIZE take plain column names", node)
        tok = names[0]
        quoted = tok.type == "QIDENT"
        return S.ColumnRef(name=canonical_name(tok) if quoted else str(tok), quoted=quoted, span=self.span(node))

    def sort_key(self, node: Tree) -> S.SortKey:
        col = self.column_ref(node.children[0])
        desc, nulls_first = False, None
        for part in node.children[1:]:
            if part.data == "sort_dir":
                desc = part.children[0].type == "DESC"
            elif part.data == "nulls_order":
                nulls_first = part.children[0].type == "FIRST"
        return S.SortKey(column=col, descending=desc, nulls_first=nulls_first)

    def expression(self, node: Tree) -> S.Expression:
        return parse_expression(node, self.body, self.offset, self.source, self.dialect)

    def measure(self, node: Tree) -> S.Measure:
        expr_node, name_node = node.children
        tok = name_node.children[0]
        name = canonical_name(tok) if tok.type == "QIDENT" else str(tok)
        return S.Measure(name=name, expression=self.expression(expr_node), name_span=self.span(tok))

    def definition(self, node: Tree) -> S.Definition:
        var_node, expr_node = node.children
        return S.Definition(variable=self.var(var_node), expression=self.expression(expr_node),
                            variable_span=self.span(var_node))

    def var(self, node: Tree) -> str:
        return canonical_name(node.children[0])

    def subset(self, node: Tree) -> S.SubsetDef:
        name, *members = node.children
        return S.SubsetDef(name=self.var(name), members=tuple(self.var(m) for m in members), span=self.span(name),
                           member_spans=tuple(self.span(m) for m in members))

    def skip(self, node: Tree) -> S.SkipSpec:
        kind = node.data
        if kind == "skip_past_last":
            return S.SkipSpec("past_last", span=self.span(node))
        if kind == "skip_next_row":
            return S.SkipSpec("next_row", span=self.span(node))
        var_node = [c for c in node.children if isinstance(c, Tree)][0]
        mode = "to_first" if kind == "skip_to_first" else "to_last"
        return S.SkipSpec(mode, variable=self.var(var_node), span=self.span(var_node))

    def within(self, node: Tree) -> S.Within:
        value = node.children[0]
        kind = value.data
        toks = [t for t in value.scan_values(lambda v: isinstance(v, Token))]
        if kind == "within_number":
            sql = str(toks[0])
        elif kind == "within_string":
            sql = f"INTERVAL {toks[0]}"
        else:
            sql = "INTERVAL " + " ".join(str(t) for t in toks)
        return S.Within(sql=sql, span=self.span(value))

    # ------------------------------------------------------------------ pattern
    def pattern(self, node) -> S.PatternNode:
        sp = self.span(node)
        if isinstance(node, Token):  # pragma: no cover - the grammar wraps tokens
            raise self.error("Unexpected token in PATTERN", node)
        kind = node.data
        if kind == "alternation":
            return S.Alternation(span=sp, items=tuple(self.pattern(c) for c in node.children))
        if kind == "concatenation":
            return S.Concat(span=sp, items=tuple(self.pattern(c) for c in node.children))
        if kind == "quantified":
            body = self.pattern(node.children[0])
            lo, hi, greedy = self.quantifier(node.children[1])
            return S.Quantified(span=sp, body=body, min=lo, max=hi, greedy=greedy)
        if kind == "p_label":
            return S.Label(span=sp, name=self.var(node.children[0]))
        if kind == "p_group":
            inner = [c for c in node.children if isinstance(c, Tree)]
            return self.pattern(inner[0]) if inner else S.EmptyPattern(span=sp)
        if kind == "p_start":
            return S.Anchor(span=sp, kind="start")
        if kind == "p_end":
            return S.Anchor(span=sp, kind="end")
        if kind == "p_exclusion":
            inner = [c for c in node.children if isinstance(c, Tree)]
            body = self.pattern(inner[0]) if inner else S.EmptyPattern(span=sp)
            return S.Exclusion(span=sp, body=body)
        if kind == "p_permute":
            items = tuple(self.pattern(c) for c in node.children if isinstance(c, Tree))
            return S.Permute(span=sp, items=items)
        raise self.error(f"Unsupported pattern element {kind}", node)  # pragma: no cover

    def quantifier(self, node: Tree) -> tuple[int, int | None, bool]:
        kind_node = node.children[0]
        greedy = len(node.children) == 1
        kind = kind_node.data
        if kind == "q_star":
            return 0, None, greedy
        if kind == "q_plus":
            return 1, None, greedy
        if kind == "q_optional":
            return 0, 1, greedy
        ints = [t for t in kind_node.children if isinstance(t, Token) and t.type == "INT"]
        if kind == "q_exact":
            n = self.bound(ints[0])
            if n < 1:
                raise self.error("Pattern quantifier upper bound must be greater than or equal to 1", kind_node)
            return n, n, greedy
        # q_range: {n,} {,m} {n,m} {,}
        comma = next(t for t in kind_node.children if isinstance(t, Token) and t.type == "COMMA")
        lo = hi = None
        for t in ints:
            if t.start_pos < comma.start_pos:
                lo = self.bound(t)
            else:
                hi = self.bound(t)
        lo = lo if lo is not None else 0
        if hi is not None:
            if hi < 1:
                raise self.error("Pattern quantifier upper bound must be greater than or equal to 1", kind_node)
            if lo > hi:
                raise self.error(f"Pattern quantifier lower bound {lo} is greater than upper bound {hi}", kind_node)
        return lo, hi, greedy

    def bound(self, tok: Token) -> int:
        value = int(str(tok))
        if value > MAX_QUANTIFIER:
            raise self.error(f"Pattern quantifier bound {value} is too large (at most {MAX_QUANTIFIER})", tok)
        return value

