"""The syntax tree of the CER language: what a parsed statement is, without how it was parsed.

This module owns the data of a CER statement as ``parser.sase`` builds it and the planner, the
engine and the operators read it:
  * the pattern: ``Element`` (one event of a type bound to a variable; ``kleene=(lo, hi)`` for
    ``T+ v``, ``negated`` for ``~T v``) and ``Seq``, ``And``, ``Or`` nesting freely
    (``operators.cer_reference`` says what they mean); they are the matchers' pattern form,
    defined in ``operators.pattern_ir`` and named here for the parser's users;
  * the expressions of WHERE and RETURN (``Expr`` and its kinds, each with its span in the text),
    with ``walk``, ``variables``, ``has_aggregate``, ``iterated`` and ``reads_previous``; a column
    may name one event of a Kleene variable's iteration (``Col.index``: ``b[i].price``, the current
    event, ``b[i-1].price``, the previous one), in a WHERE conjunct that must hold for every
    iteration (for every iteration after the first when it reads ``b[i-1]``);
  * the query: ``CerQuery`` (source, columns, strategy, window, filters over one variable,
    conditions over several, RETURN form and projections), ``Within``, ``Projection``.
The selection strategies and aggregate names of the language are here too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from matchrec.operators import pattern_ir as IR

STRATEGIES = ("strict", "next", "any")
STRATEGY_NAMES = {"strict": "strict-contiguity", "next": "skip-till-next-match", "any": "skip-till-any-match"}
AGGREGATES = ("avg", "sum", "min", "max", "count", "first", "last")


# ---------------------------------------------------------------- the pattern
# The pattern nodes carry no syntax (no text, no positions): the parser builds the matchers'
# pattern form (operators.pattern_ir) directly, and the names are offered here too.
Element, Seq, And, Or, Node = IR.Element, IR.Seq, IR.And, IR.Or, IR.CerNode


# ---------------------------------------------------------------- expressions
@dataclass(frozen=True, eq=False)
class Expr:
    span: tuple[int, int]


@dataclass(frozen=True, eq=False)
class Lit(Expr):
    value: object


@dataclass(frozen=True, eq=False)
class Col(Expr):
    var: str
    name: str
    # None: the variable's event (a single variable) or events (inside an aggregate over a Kleene one);
    # "i" / "i-1": the current / previous event of a Kleene variable's iteration (``b[i].price``)
    index: str | None = None


@dataclass(frozen=True, eq=False)
class Var(Expr):
    var: str


@dataclass(frozen=True, eq=False)
class Call(Expr):
    name: str  # lower case
    args: tuple


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    arg: Expr
    type: str  # as written, e.g. VARCHAR or DECIMAL(10, 2)


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    op: str  # '-' or 'not'
    arg: Expr


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    op: str  # + - * / % || = <> < <= > >=
    left: Expr
    right: Expr


@dataclass(frozen=True, eq=False)
class Logic(Expr):
    op: str  # 'and' | 'or'
    items: tuple


@dataclass(frozen=True, eq=False)
class Between(Expr):
    arg: Expr
    lo: Expr
    hi: Expr
    negated: bool


@dataclass(frozen=True, eq=False)
class IsNull(Expr):
    arg: Expr
    negated: bool


@dataclass(frozen=True, eq=False)
class InList(Expr):
    arg: Expr
    items: tuple
    negated: bool


def children(e: Expr) -> tuple:
    if isinstance(e, (Lit, Col, Var)):
        return ()
    if isinstance(e, Call):
        return e.args
    if isinstance(e, (Unary, Cast)):
        return (e.arg,)
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Logic):
        return e.items
    if isinstance(e, Between):
        return (e.arg, e.lo, e.hi)
    if isinstance(e, IsNull):
        return (e.arg,)
    if isinstance(e, InList):
        return (e.arg,) + e.items
    raise TypeError(e)


def walk(e: Expr):
    yield e
    for c in children(e):
        yield from walk(c)


def variables(e: Expr) -> set[str]:
    return {n.var for n in walk(e) if isinstance(n, (Col, Var))}


def has_aggregate(e: Expr) -> bool:
    return any(isinstance(n, Call) and n.name in AGGREGATES for n in walk(e))


def iterated(e: Expr) -> set[str]:
    """The Kleene variables whose iteration ``e`` reads (``b[i].col``, ``b[i-1].col``)."""
    return {n.var for n in walk(e) if isinstance(n, Col) and n.index is not None}


def reads_previous(e: Expr) -> bool:
    """Whether ``e`` reads the previous event of an iteration (``b[i-1].col``): it then holds for
    every iteration after the first only."""
    return any(isinstance(n, Col) and n.index == "i-1" for n in walk(e))


# ---------------------------------------------------------------- the query
@dataclass
class Within:
    amount: float
    unit: str | None  # None: in the ORDER BY key's own units
    span: tuple[int, int]


@dataclass
class Projection:
    expr: Expr
    name: str


@dataclass
class CerQuery:
    text: str
    root: Node
    elements: dict[str, Element]  # every variable, in pattern order
    source: str
    source_span: tuple[int, int]
    strategy: str = "any"
    type_column: tuple[str, tuple[int, int]] | None = None
    key_column: tuple[str, tuple[int, int]] | None = None
    partition_column: tuple[str, tuple[int, int]] | None = None
    filters: dict[str, list[Expr]] = field(default_factory=dict)  # var -> predicates over that var alone
    conditions: list[Expr] = field(default_factory=list)  # predicates over bindings
    constants: list[Expr] = field(default_factory=list)  # predicates naming no variable
    within: Within | None = None
    returns: str = "events"  # count | events | project
    projections: list[Projection] = field(default_factory=list)
    explain: str | None = None  # None | 'explain' | 'analyze'
    form: str = "sase"  # sase | match_recognize
    typed: bool = True  # elements test the type column (MATCH_RECOGNIZE's variables do not)

    @property
    def positive(self) -> list[str]:
        return [v for v, e in self.elements.items() if not e.negated]
