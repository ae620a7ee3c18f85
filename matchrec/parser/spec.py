"""The typed result of parsing one MATCH_RECOGNIZE clause: MatchSpec and the row pattern AST.

All spans are offsets into the original query text (``MatchSpec.source``), so any later
stage can report an error at the right line and column. Pattern variable names are
canonical: unquoted names are upper-cased, quoted names kept as written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from matchrec.parser.names import quote_ident

UNIVERSAL = None  # the implicit variable that matches every row (unqualified column refs)


@dataclass(frozen=True)
class Span:
    start: int
    end: int  # exclusive


# ---------------------------------------------------------------- row pattern AST
@dataclass(frozen=True)
class PatternNode:
    span: Span = field(compare=False, repr=False)


@dataclass(frozen=True)
class Label(PatternNode):
    name: str = ""


@dataclass(frozen=True)
class EmptyPattern(PatternNode):
    pass


@dataclass(frozen=True)
class Anchor(PatternNode):
    kind: str = "start"  # "start" (^) or "end" ($)


@dataclass(frozen=True)
class Concat(PatternNode):
    items: tuple[PatternNode, ...] = ()


@dataclass(frozen=True)
class Alternation(PatternNode):
    items: tuple[PatternNode, ...] = ()


@dataclass(frozen=True)
class Quantified(PatternNode):
    body: PatternNode = None  # type: ignore[assignment]
    min: int = 0
    max: int | None = None  # None: unbounded
    greedy: bool = True


@dataclass(frozen=True)
class Exclusion(PatternNode):
    body: PatternNode = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Permute(PatternNode):
    items: tuple[PatternNode, ...] = ()


def pattern_to_text(node: PatternNode) -> str:
    """Canonical text of a pattern (used by EXPLAIN and golden tests)."""
    if isinstance(node, Label):
        name = node.name
        return name if name.isidentifier() and name.upper() == name else quote_ident(name)
    if isinstance(node, EmptyPattern):
        return "()"
    if isinstance(node, Anchor):
        return "^" if node.kind == "start" else "$"
    if isinstance(node, Concat):
        return " ".join(_wrap(i, Alternation) for i in node.items)
    if isinstance(node, Alternation):
        return " | ".join(pattern_to_text(i) for i in node.items)
    if isinstance(node, Quantified):
        body = _wrap(node.body, (Concat, Alternation, Quantified))
        lo, hi = node.min, node.max
        if (lo, hi) == (0, None):
            q = "*"
        elif (lo, hi) == (1, None):
            q = "+"
        elif (lo, hi) == (0, 1):
            q = "?"
        elif hi is None:
            q = f"{{{lo},}}"
        elif lo == hi:
            q = f"{{{lo}}}"
        else:
            q = f"{{{lo},{hi}}}"
        return body + q + ("" if node.greedy else "?")
    if isinstance(node, Exclusion):
        return "{- " + pattern_to_text(node.body) + " -}"
    if isinstance(node, Permute):
        return "PERMUTE(" + ", ".join(pattern_to_text(i) for i in node.items) + ")"
    raise TypeError(node)


def _wrap(node: PatternNode, kinds) -> str:
    text = pattern_to_text(node)
    return f"({text})" if isinstance(node, kinds) else text


def pattern_labels(node: PatternNode) -> list[str]:
    """Distinct label names in order of first appearance."""
    seen: list[str] = []

    def walk(n: PatternNode) -> None:
        if isinstance(n, Label):
            if n.name not in seen:
                seen.append(n.name)
        for child in getattr(n, "items", ()) or ():
            walk(child)
        body = getattr(n, "body", None)
        if body is not None:
            walk(body)

    walk(node)
    return seen


# ---------------------------------------------------------------- clause parts
@dataclass(frozen=True)
class ColumnRef:
    name: str  # as written (identifier text, unquoted)
    quoted: bool
    span: Span = field(compare=False, repr=False)


@dataclass(frozen=True)
class SortKey:
    column: ColumnRef
    descending: bool = False
    nulls_first: bool | None = None  # None: the default (NULLS LAST)


@dataclass(frozen=True)
class Expression:
    """A SQL expression of MEASURES/DEFINE, parsed by sqlglot in the query's dialect.

    ``tree`` is the sqlglot tree of ``text`` after navigation keywords were made parseable
    (see parser.expressions); ``origin`` maps offsets in ``text`` back to the query.
    """
    text: str
    span: Span
    tree: Any = field(compare=False, repr=False)
    origin: Any = field(compare=False, repr=False)


@dataclass(frozen=True)
class Measure:
    name: str
    expression: Expression
    name_span: Span = field(compare=False, repr=False)


@dataclass(frozen=True)
class Definition:
    variable: str
    expression: Expression
    variable_span: Span = field(compare=False, repr=False)


@dataclass(frozen=True)
class SubsetDef:
    name: str
    members: tuple[str, ...]
    span: Span = field(compare=False, repr=False)
    member_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class SkipSpec:
    kind: str = "past_last"  # past_last | next_row | to_first | to_last
    variable: str | None = None
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Within:
    """The WITHIN extension: a bound on the ORDER BY distance between first and last row."""
    sql: str  # DuckDB SQL of the bound (a number or an INTERVAL literal)
    span: Span = field(compare=False, repr=False)


@dataclass(frozen=True)
class MatchSpec:
    partition_by: tuple[ColumnRef, ...]
    order_by: tuple[SortKey, ...]
    measures: tuple[Measure, ...]
    rows_per_match: str  # "one" | "all"
    empty_matches: str  # "show" | "omit" | "unmatched"  (ALL ROWS PER MATCH options)
    skip: SkipSpec
    pattern: PatternNode
    within: Within | None
    subsets: tuple[SubsetDef, ...]
    definitions: tuple[Definition, ...]
    span: Span = field(compare=False, repr=False)
    source: str = field(default="", compare=False, repr=False)
    dialect: str = field(default="duckdb", compare=False, repr=False)
    seek: bool = False  # SEEK (windows only): the match may start at any row of the frame

    def describe(self) -> str:
        """A readable multi-line rendering used by EXPLAIN."""
        lines = ["MatchSpec"]
        if self.partition_by:
            lines.append("  partition by: " + ", ".join(c.name for c in self.partition_by))
        if self.order_by:
            lines.append("  order by: " + ", ".join(
                k.column.name + (" DESC" if k.descending else "")
                + ("" if k.nulls_first is None else (" NULLS FIRST" if k.nulls_first else " NULLS LAST"))
                for k in self.order_by))
        for m in self.measures:
            lines.append(f"  measure {m.name} := {m.expression.text}")
        rows = "ONE ROW PER MATCH" if self.rows_per_match == "one" else "ALL ROWS PER MATCH"
        if self.rows_per_match == "all":
            rows += {"show": " SHOW EMPTY MATCHES", "omit": " OMIT EMPTY MATCHES",
                     "unmatched": " WITH UNMATCHED ROWS"}[self.empty_matches]
        lines.append("  rows: " + rows)
        skip = {"past_last": "PAST LAST ROW", "next_row": "TO NEXT ROW",
                "to_first": f"TO FIRST {self.skip.variable}", "to_last": f"TO LAST {self.skip.variable}"}
        lines.append("  after match skip: " + skip[self.skip.kind])
        lines.append("  pattern: " + pattern_to_text(self.pattern))
        if self.within is not None:
            lines.append("  within: " + self.within.sql)
        for s in self.subsets:
            lines.append(f"  subset {s.name} = ({', '.join(s.members)})")
        for d in self.definitions:
            lines.append(f"  define {d.variable} := {d.expression.text}")
        return "\n".join(lines)
