"""Patterns as the matchers read them, for both statement forms; no syntax left.

Row patterns (MATCH_RECOGNIZE, windows): the parser's tree (``parser.spec``) keeps what the user
wrote, for errors and EXPLAIN; the planner lowers it to ``Var``/``Empty``/``Anchor``/``Concat``/
``Alt``/``Permute``/``Exclude``/``Repeat`` once the pattern variables are numbered
(``planner.pattern.lower``), and the program compiler (``operators.program``) reads only these.
Each keeps the position of the text it came from (``span``, opaque here) so a compile error can
still point at the user's text.

Event patterns (CER): ``Element`` (one event of a type bound to a variable, Kleene bounds,
negation) and ``Seq``/``And``/``Or`` nesting freely; ``operators.cer_reference`` says what they
mean under each selection strategy. The CER parser builds these directly (its syntax maps one to
one onto them; ``parser.cer_tree`` offers the names), the planner and the mechanisms read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union


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
class Concat(Node):
    """Items one after the other, on consecutive rows."""
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


# ---------------------------------------------------------------- event patterns (CER)
@dataclass(frozen=True)
class Element:
    type: str | None
    var: str
    kleene: tuple[int, int | None] | None = None
    negated: bool = False


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class And:
    items: tuple


@dataclass(frozen=True)
class Or:
    items: tuple


CerNode = Union[Element, Seq, And, Or]
