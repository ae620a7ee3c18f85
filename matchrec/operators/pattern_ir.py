"""The row pattern as the matchers compile it: variables by number, no names or syntax left.

The parser's tree (``parser.spec``) keeps what the user wrote, for errors and EXPLAIN; the planner
lowers it to this form (``planner.pattern.lower``) once the pattern variables are numbered, and the
program compiler (``operators.program``) reads only this. Each node keeps the position of the
text it came from (``span``, opaque here) so a compile error can still point at the user's text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Node:
    span: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Var(Node):
    """One row whose DEFINE for variable ``index`` holds."""
    index: int = 0


@dataclass(frozen=True)
class Empty(Node):
    """Matches without consuming a row."""


@dataclass(frozen=True)
class Anchor(Node):
    """The partition's start (``^``) or end (``$``)."""
    start: bool = True


@dataclass(frozen=True)
class Seq(Node):
    items: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Alt(Node):
    """Alternatives, the left one preferred."""
    items: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Permute(Node):
    """Every ordering of the items, in lexicographic order of preference."""
    items: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Exclude(Node):
    """Rows matched by ``body`` are left out of ALL ROWS PER MATCH output."""
    body: Node = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Repeat(Node):
    """``body`` between ``min`` and ``max`` times (None: unbounded), greedy or reluctant."""
    body: Node = None  # type: ignore[assignment]
    min: int = 0
    max: int | None = None
    greedy: bool = True
