"""A row filter pushed into DuckDB that cannot change the result.

Patterns like ``R {- N* -} B {- N* -} M`` with ``N AS true`` skip arbitrary rows between the
interesting ones. A *gap variable* is one that matches every row (no DEFINE, or DEFINE TRUE).
A row on which no other variable's row-level condition can hold can only ever be labelled
with a gap variable. Dropping such rows is safe when every thread of the matcher that meets
one would take it with a gap variable and come back to where it was - a forced,
single-choice step - and when nothing can observe the dropped rows. Both are proven here,
conservatively:

* after consuming any row, a thread that could still consume more waits at a set of
  instructions that includes a gap variable's self-loop (``{- N* -}`` between the variables
  that matter); a match can be neither empty nor begin or end with a gap variable;
* no anchor ``^``/``$`` (they see partition boundaries) and no PREV/NEXT anywhere (they see
  physical neighbours);
* MEASURES and DEFINE read only the current row, the last row of the match, and rows that
  navigation or aggregates over non-gap variables select (nothing counts all rows);
* ONE ROW PER MATCH, or ALL ROWS PER MATCH without WITH UNMATCHED ROWS whose gap variables
  are all excluded from the output;
* AFTER MATCH SKIP TO does not target a gap variable.

The filter keeps a row when the row-level part of some non-gap variable's condition holds.
"""
from __future__ import annotations

from sqlglot import exp

from matchrec.operators import expr as ir
from matchrec.operators.program import DONE, MATCH, Program
from matchrec.parser import hidden as H
from matchrec.parser import spec as S
from matchrec.planner.fastpath import FastPlan
from matchrec.planner.plan import Plan


def _children(node: S.PatternNode) -> list[S.PatternNode]:
    out = list(getattr(node, "items", ()) or ())
    if getattr(node, "body", None) is not None:
        out.append(node.body)
    return out


def has_anchor(node: S.PatternNode) -> bool:
    return isinstance(node, S.Anchor) or any(has_anchor(c) for c in _children(node))


def _gaps_excluded(node: S.PatternNode, gaps: set[str], excluded: bool = False) -> bool:
    """Every occurrence of a gap variable lies inside an exclusion {- -}."""
    if isinstance(node, S.Label):
        return node.name not in gaps or excluded
    inside = excluded or isinstance(node, S.Exclusion)
    return all(_gaps_excluded(c, gaps, inside) for c in _children(node))


def always_true(d: S.Definition | None) -> bool:
    if d is None:
        return True
    tree = d.expression.tree
    while isinstance(tree, exp.Paren):
        tree = tree.this
    return isinstance(tree, exp.Boolean) and tree.this is True


def _gaps_absorb_every_row(program: Program, gaps: frozenset[int]) -> str | None:
    """Why dropping rows that only gap variables can take would change some thread, or None.

    A thread that has consumed a row waits at a set of instructions. If that set offers more
    than DONE, a row no other variable can take must be absorbed by a gap variable that brings
    the thread back to the very same set; otherwise the thread dies at that row in the full
    input but lives on when the row is dropped. A match must neither begin nor end with a gap
    variable (its first or last row could be such a row).
    """
    code = program.code
    first = program.waits(0)
    if any(code[p].op == DONE for p in first):
        return "the pattern can match zero rows"
    if any(code[p].op == MATCH and code[p].a in gaps for p in first):
        return "a match can begin with a variable that matches every row"
    for pc, ins in enumerate(code):
        if ins.op != MATCH:
            continue
        wait = program.waits(pc + 1)
        if ins.a in gaps and any(code[p].op == DONE for p in wait):
            return "a match can end with a variable that matches every row"
        if all(code[p].op == DONE for p in wait):
            continue
        if not any(code[p].op == MATCH and code[p].a in gaps and program.waits(p + 1) == wait for p in wait):
            return "somewhere the pattern needs adjacent rows, which dropping rows would create"
    return None


def _observes_only(node: ir.Node, allowed: frozenset[int]) -> bool:
    """Whether evaluating ``node`` reads only rows labelled with ``allowed`` variables.

    The current row and the last row of a match always belong to such variables (a non-gap
    variable is labelling it, or in MEASURES it is an output row or the match's last row,
    which gap variables cannot take); so does every row navigation over ``allowed`` selects.
    """
    if isinstance(node, (ir.Const, ir.MatchNumber, ir.Col, ir.Classifier)):
        return True  # Col and Classifier are read at the row an enclosing At chose
    if isinstance(node, ir.At):
        nav = node.nav
        if nav.physical_offset != 0:
            return False
        ok = (nav.last and nav.logical_offset == 0) if nav.labels is None else nav.labels <= allowed
        return ok and _observes_only(node.expr, allowed)
    if isinstance(node, ir.Agg):
        if node.labels is None or not node.labels <= allowed:
            return False
        parts = list(node.args) + ([node.filter] if node.filter is not None else [])
        return all(_observes_only(a, allowed) for a in parts)
    if isinstance(node, (ir.Op, ir.Fallback)):
        return all(_observes_only(a, allowed) for a in node.args)
    return False


def row_filter(plan: Plan, fp: FastPlan | None) -> tuple[str | None, str]:
    """(DuckDB condition keeping the rows that matter, or None; why)."""
    spec = plan.spec
    if fp is None:
        return None, "no row-level conditions were derived"
    defined = {d.variable: d for d in spec.definitions}
    gaps = {v for v in plan.labels if always_true(defined.get(v))}
    if not gaps:
        return None, "no variable matches every row"
    others = [v for v in plan.labels if v not in gaps]
    if not others:
        return None, "every variable matches every row"
    if spec.rows_per_match == "all":
        if spec.empty_matches == "unmatched":
            return None, "WITH UNMATCHED ROWS outputs every row"
        if not _gaps_excluded(spec.pattern, gaps):
            return None, "ALL ROWS PER MATCH would output rows of a variable that matches every row"
    if has_anchor(spec.pattern):
        return None, "anchors see partition boundaries"
    gap_ids = frozenset(plan.labels.index(v) for v in gaps)
    why = _gaps_absorb_every_row(plan.program, gap_ids)
    if why:
        return None, why
    if plan.skip_labels is not None and plan.skip_labels & gap_ids:
        return None, "AFTER MATCH SKIP TO names a variable that matches every row"
    allowed = frozenset(plan.labels.index(v) for v in others)
    nodes = [m.node for m in plan.measures] + [d for d in plan.defines if d is not None]
    if not all(_observes_only(n, allowed) for n in nodes):
        return None, "MEASURES or DEFINE could observe rows of a variable that matches every row"
    conditions = []
    for v in others:
        sql = fp.row_sql[plan.labels.index(v)]
        if sql is None or H.SHIFT_PREFIX in sql:
            return None, f"{v} has no row-level condition to filter on"
        conditions.append(f"({sql})")
    return " OR ".join(conditions), f"rows where {' or '.join(others)} can hold"
