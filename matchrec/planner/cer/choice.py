"""The choice of evaluation mechanism and order, and of the anchors used to read only the events
that can be in a match (filtering before matching); ``plan_query`` runs the whole planning."""
from __future__ import annotations

import duckdb

from matchrec.errors import NotSupportedError
from matchrec.operators.cer_reference import Condition, element_sets
from matchrec.operators.pattern_ir import And, Element
from matchrec.parser import sase as S
from matchrec.planner.cer.estimates import anchor_cover, gather_stats, interval_cover, rate_changes
from matchrec.planner.cer.plan import FILTER_COVER, NO_WINDOW, CerPlan, CerSettings
from matchrec.planner.cer.resolve import resolve_query


def plan_query(duck: duckdb.DuckDBPyConnection, q: S.CerQuery, settings: CerSettings, mechanisms) -> CerPlan:
    plan = resolve_query(duck, q, settings)
    gather_stats(duck, plan)
    choose_mechanism(plan, settings, mechanisms)
    choose_filtering(plan, settings, duck)
    return plan


def choose_mechanism(plan: CerPlan, settings: CerSettings, mechanisms) -> None:
    q, st = plan.query, plan.stats
    pattern = pattern_shape(plan)
    by_estimate = sorted(q.positive, key=lambda v: (st.estimates.get(v, 0), q.positive.index(v)))
    forced = settings.mechanism
    kleene = any(q.elements[v].kleene for v in q.positive)
    if forced == "batch":
        if q.strategy != "any":
            raise NotSupportedError(f"SET matchrec_cer_mechanism = batch: the batch operator evaluates "
                                    f"skip-till-any-match only, not {S.STRATEGY_NAMES[q.strategy]}")
        plan.mechanism, plan.reason = forced, "forced by SET matchrec_cer_mechanism" + (
            "; a Kleene closure it cannot count goes to recomputation (rcep)" if kleene else "")
    elif forced != "auto":
        why = mechanisms.supports(forced, pattern)
        if why:
            raise NotSupportedError(f"SET matchrec_cer_mechanism = {forced}: {why}")
        plan.mechanism, plan.reason = forced, "forced by SET matchrec_cer_mechanism"
    else:
        if q.strategy == "any" and kleene:
            plan.mechanism = "rcep"
            plan.reason = ("skip-till-any-match with Kleene closure: recomputation shares the closure's "
                           "partial matches instead of enumerating them per run")
        elif q.strategy == "any" and not _holds_and(q.root):
            # The lazy order, evaluated over whole arrays at once: each alternative's elements bound
            # in the order of least estimated work, the candidates of each step found by binary search
            # and extended in blocks. The chain and tree NFAs make the same searches one partial match
            # at a time in Python (10 to 100 times slower on benchmark patterns); they stay available
            # through SET matchrec_cer_mechanism, and take AND, which they search as one partial order
            # while the batch operator would expand it into its permutations.
            varying = rate_changes(plan)
            plan.mechanism = "batch"
            plan.reason = ("skip-till-any-match: batch operator, each alternative's elements bound in the order of "
                           "least estimated work (dynamic programming over the sets of bound elements), candidates "
                           "found by binary search and extended in blocks"
                           + ("; event rates vary over time (" + "; ".join(varying) + "): the order is chosen again "
                              "for a stretch of the stream whose rates drift" if varying else ""))
        elif q.strategy == "any":
            varying = rate_changes(plan)
            if varying:
                plan.mechanism = "tree"
                plan.reason = "AND, event rates vary over time (" + "; ".join(varying) + "): tree NFA"
            else:
                plan.mechanism = "chain"
                plan.reason = "AND, stable event rates: lazy chain NFA, rarest element first"
        else:
            plan.mechanism = "eager"
            plan.reason = f"{S.STRATEGY_NAMES[q.strategy]} decides each event as it arrives: eager NFA"
        why = mechanisms.supports(plan.mechanism, pattern) if plan.mechanism != "batch" else ""
        if why:
            plan.reason = f"{plan.mechanism} would fit, but it does not support this pattern ({why}); eager NFA"
            plan.mechanism = "eager"
            why = mechanisms.supports("eager", pattern)
            if why:
                raise NotSupportedError(f"No evaluation mechanism supports this pattern: {why}")
    plan.order = by_estimate if plan.mechanism in ("chain", "tree") else None


def _holds_and(node) -> bool:
    if isinstance(node, Element):
        return False
    return isinstance(node, And) or any(_holds_and(x) for x in node.items)


def choose_filtering(plan: CerPlan, settings: CerSettings, duck: duckdb.DuckDBPyConnection | None = None) -> None:
    q, st = plan.query, plan.stats
    if plan.window == NO_WINDOW:
        plan.filtering, plan.filtering_reason = False, "no WITHIN: every event may be in a match"
        return
    if settings.filtering == "never":
        plan.filtering, plan.filtering_reason = False, "off (SET matchrec_cer_filtering = never)"
        return
    plan.anchors = anchors_of(q, lambda v: st.estimates.get(v, 0))
    candidates = sum(st.estimates.get(v, 0) for v in plan.anchors)
    if settings.filtering == "always":
        plan.filtering, plan.filtering_reason = True, "forced (SET matchrec_cer_filtering = always)"
        return
    test = " OR ".join(f"({plan.element_test(v)})" for v in plan.anchors)
    cover, what = anchor_cover(duck, plan.query.source, plan.key_sql, plan.partition_column, [(test, plan.window)],
                               interval_cover(candidates, plan.window, st.key_span))
    if cover > FILTER_COVER:
        plan.filtering = False
        plan.filtering_reason = f"the anchors' intervals would cover about {cover:.0%} of the {what}"
    else:
        plan.filtering = True
        plan.filtering_reason = f"the anchors' intervals cover at most about {cover:.1%} of the {what}"


def anchors_of(q: S.CerQuery, candidates) -> list[str]:
    """Per alternative of the pattern, its positive element with the fewest ``candidates(var)``
    (the first in the sequence on a tie): every match binds one of them, so reading only the
    events within the window of their candidates keeps every match."""
    anchors = []
    for chain in element_sets(q.root):  # an AND's k! orders hold the same elements: not expanded
        pos = [e.var for e in chain if not e.negated]
        if pos:
            anchors.append(min(pos, key=lambda v: (candidates(v), pos.index(v))))
    return list(dict.fromkeys(anchors))


def pattern_shape(plan: CerPlan):
    """The pattern model without data (for ``supports``)."""
    from matchrec.operators.cer_reference import Pattern
    return Pattern(plan.query.root, plan.window, plan.query.strategy, {}, [
        Condition(frozenset(S.variables(c)), lambda b: True, "") for c in plan.query.conditions])
