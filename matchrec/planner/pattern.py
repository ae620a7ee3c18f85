"""Lowering of the parser's row pattern tree to the matchers' pattern form (``operators.pattern_ir``)."""
from __future__ import annotations

from matchrec.operators import pattern_ir as P
from matchrec.parser import spec as S


def lower(node: S.PatternNode, ids: dict[str, int]) -> P.Node:
    """The pattern with its variables numbered by ``ids``; spans are carried along for errors."""
    span = node.span
    if isinstance(node, S.Label):
        return P.Var(span, ids[node.name])
    if isinstance(node, S.EmptyPattern):
        return P.Empty(span)
    if isinstance(node, S.Anchor):
        return P.Anchor(span, node.kind == "start")
    if isinstance(node, S.Concat):
        return P.Concat(span, tuple(lower(i, ids) for i in node.items))
    if isinstance(node, S.Alternation):
        return P.Alt(span, tuple(lower(i, ids) for i in node.items))
    if isinstance(node, S.Permute):
        return P.Permute(span, tuple(lower(i, ids) for i in node.items))
    if isinstance(node, S.Exclusion):
        return P.Exclude(span, lower(node.body, ids))
    if isinstance(node, S.Quantified):
        return P.Repeat(span, lower(node.body, ids), node.min, node.max, node.greedy)
    raise TypeError(node)  # pragma: no cover
