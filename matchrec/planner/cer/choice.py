"""The choice of evaluation mechanism and order, and of the anchors used to read only the events
that can be in a match (filtering before matching); ``plan_query`` runs the whole planning.

The mechanism is the one of least estimated cost (``costs``) among those that support the
pattern and its strategy (``mechanism_support``: the registry's ``supports``, and for the batch
operator skip-till-any-match and the Kleene closures it can count)."""
from __future__ import annotations

import duckdb

from matchrec.errors import NotSupportedError, OperationalError
from matchrec.operators.cer_reference import Condition, alternatives, element_sets
from matchrec.operators.pattern_ir import And, Element
from matchrec.parser import sase as S
from matchrec.planner.cer.costs import COSTS, MAX_COST

CLOSE_COST = 0.02  # seconds: estimated costs closer than this are not told apart (planning and reading take longer)
from matchrec.planner.cer.estimates import (anchor_cover, cost_model, gather_stats, interval_cover, rate_changes,
                                            sample_reach)
from matchrec.planner.cer.plan import FILTER_COVER, MECHANISMS, NO_WINDOW, CerPlan, CerSettings
from matchrec.planner.cer.resolve import resolve_query


def plan_query(duck: duckdb.DuckDBPyConnection, q: S.CerQuery, settings: CerSettings, mechanisms,
               columns: dict | None = None, rowid: bool | None = None) -> CerPlan:
    """The whole plan (``columns`` and ``rowid``: the source's schema and rowid, when known)."""
    plan = resolve_query(duck, q, settings, columns, rowid)
    # a forced mechanism needs no costs: the conditions' selectivity (a sample's random bindings, most
    # of planning) serves only them, so it is left out unless EXPLAIN shows it
    with_costs = settings.mechanism == "auto" or bool(q.explain)
    gather_stats(duck, plan, conditions=with_costs)
    choose_mechanism(plan, settings, mechanisms, with_costs)
    if settings.mechanism == "auto":
        recheck_counted_closures(duck, plan, settings, mechanisms)
    choose_filtering(plan, settings, duck)
    return plan


def recheck_counted_closures(duck: duckdb.DuckDBPyConnection, plan: CerPlan, settings: CerSettings,
                             mechanisms) -> None:
    """A count given from the rates to a mechanism that enumerates a Kleene closure's event sets:
    the sets grow exponentially with the events in reach, and where those come in bursts around
    the other elements the rates understate them by orders of magnitude. So count them around
    sampled anchors (``sample_reach``, a query paid only here) and choose again; only a move to
    counting (recomputation, the batch operator) is taken. Between enumerating mechanisms the sets
    sampled around one element stand for every position: two closures side by side made every
    estimate astronomical, and the eager NFA then chosen held 5,000,000 partial matches where the
    rates' choice counted 0 matches in 0.12 s. Statements returning rows enumerate the sets under
    every mechanism; there the sample sent statements whose partial matches die before the
    closure from the eager NFA to recomputation (0.5 s to 23 s), so they keep the rates."""
    q = plan.query
    if q.returns != "count" or plan.mechanism not in ("chain", "tree", "eager") or plan.window >= NO_WINDOW \
            or not any(q.elements[v].kleene is not None for v in q.positive) \
            or not any(n in ("batch", "rcep") and c is not None for n, c, _ in plan.candidates):
        return
    first = (plan.mechanism, plan.reason, plan.candidates, plan.order)
    sample_reach(duck, plan)
    if not plan.stats.reach:
        return
    choose_mechanism(plan, settings, mechanisms)
    if plan.mechanism not in ("batch", "rcep"):
        plan.mechanism, plan.reason, plan.candidates, plan.order = first
        plan.stats.reach, plan.stats.reach_anchor = {}, None


def choose_mechanism(plan: CerPlan, settings: CerSettings, mechanisms, with_costs: bool = True) -> None:
    """Every mechanism that supports the pattern and its strategy gets an estimated cost
    (``costs``); the cheapest runs unless ``SET matchrec_cer_mechanism`` forces one.
    ``plan.candidates`` keeps each one's cost, or why it is excluded, for EXPLAIN; without
    ``with_costs`` (a forced mechanism, no EXPLAIN) only why."""
    q, st = plan.query, plan.stats
    pattern = pattern_shape(plan)
    by_estimate = sorted(q.positive, key=lambda v: (st.estimates.get(v, 0), q.positive.index(v)))
    forced = settings.mechanism
    model = cost_model(plan)
    plan.candidates = []
    for name in MECHANISMS:
        why = mechanism_support(plan, name, pattern, mechanisms)
        if why:
            plan.candidates.append((name, None, why))
            continue
        if not with_costs:
            continue
        try:
            if name == "batch":
                cost, what = COSTS[name](model, q.root, countable=not batch_kleene(plan))
            else:
                cost, what = COSTS[name](model, q.root)
        except (OperationalError, OverflowError) as e:  # an AND too large to expand is costed as unbounded
            cost, what = MAX_COST, str(e)
        plan.candidates.append((name, min(cost, MAX_COST), what))
    costed = [(c, n) for n, c, _ in plan.candidates if c is not None]
    if forced == "batch":
        if q.strategy != "any":
            raise NotSupportedError(f"SET matchrec_cer_mechanism = batch: the batch operator evaluates "
                                    f"skip-till-any-match only, not {S.STRATEGY_NAMES[q.strategy]}")
        plan.mechanism, plan.reason = forced, "forced by SET matchrec_cer_mechanism" + (
            "; a Kleene closure it cannot count goes to recomputation (rcep)" if batch_kleene(plan) else "")
    elif forced != "auto":
        why = mechanisms.supports(forced, pattern)
        if why:
            raise NotSupportedError(f"SET matchrec_cer_mechanism = {forced}: {why}")
        plan.mechanism, plan.reason = forced, "forced by SET matchrec_cer_mechanism"
    elif not costed:
        raise NotSupportedError("No evaluation mechanism supports this pattern: "
                                + "; ".join(f"{n}: {why}" for n, _, why in plan.candidates))
    else:
        least, best = min(costed, key=lambda x: (x[0], MECHANISMS.index(x[1])))
        usual, usual_reason = shape_default(plan, pattern, mechanisms)
        cost = dict((n, c) for c, n in costed).get(usual)
        if cost is not None and cost - least <= CLOSE_COST:
            # estimates this close are within their error: the mechanism the pattern's shape favours
            plan.mechanism = usual
            plan.reason = usual_reason + ("; least estimated cost" if usual == best else
                                          f"; estimated cost {_seconds(cost)}, within {_seconds(CLOSE_COST)} of "
                                          f"the least ({best} {_seconds(least)})")
        else:
            plan.mechanism = best
            plan.reason = f"least estimated cost ({_seconds(least)}" + (
                f"; {usual} {_seconds(cost)})" if cost is not None else ")") + "; " + DESCRIPTIONS[best]
            varying = rate_changes(plan)
            if varying and best in ("batch", "tree"):
                plan.reason += "; event rates vary over time (" + "; ".join(varying) + ")"
    plan.order = by_estimate if plan.mechanism in ("chain", "tree") else None


def shape_default(plan: CerPlan, pattern, mechanisms) -> tuple[str, str]:
    """The mechanism the pattern's shape favours, and why: kept when the estimates do not tell
    the mechanisms apart (``CLOSE_COST``)."""
    q = plan.query
    kleene = any(q.elements[v].kleene for v in q.positive)
    if q.strategy == "any" and kleene:
        name = "rcep"
        reason = ("skip-till-any-match with Kleene closure: recomputation shares the closure's "
                  "partial matches instead of enumerating them per run")
    elif q.strategy == "any" and not _holds_and(q.root):
        varying = rate_changes(plan)
        name = "batch"
        reason = ("skip-till-any-match: batch operator, each alternative's elements bound in the order of "
                  "least estimated work (dynamic programming over the sets of bound elements), candidates "
                  "found by binary search and extended in blocks"
                  + ("; event rates vary over time (" + "; ".join(varying) + "): the order is chosen again "
                     "for a stretch of the stream whose rates drift" if varying else ""))
    elif q.strategy == "any":
        varying = rate_changes(plan)
        if varying:
            name, reason = "tree", "AND, event rates vary over time (" + "; ".join(varying) + "): tree NFA"
        else:
            name, reason = "chain", "AND, stable event rates: lazy chain NFA, rarest element first"
    else:
        name, reason = "eager", f"{S.STRATEGY_NAMES[q.strategy]} decides each event as it arrives: eager NFA"
    why = mechanisms.supports(name, pattern) if name != "batch" else ""
    if why:
        return "eager", f"{name} would fit, but it does not support this pattern ({why}); eager NFA"
    return name, reason


DESCRIPTIONS = {
    "batch": ("batch operator: each alternative's elements bound in the order of least estimated work (dynamic "
              "programming over the sets of bound elements, chosen again for a stretch of the stream whose rates "
              "drift), candidates found by binary search and extended in blocks"),
    "chain": "lazy chain NFA: the rarest element first, the others searched in its window in one order",
    "tree": "tree NFA: the evaluation order planned again per instance from the counts in its window",
    "rcep": ("recomputation: each match built back from its last event, a Kleene closure's subsets counted or "
             "enumerated in batch"),
    "eager": "eager NFA: every event extends the partial matches waiting for it",
}


def mechanism_support(plan: CerPlan, name: str, pattern, mechanisms) -> str:
    """'' when mechanism ``name`` can evaluate the plan's pattern under its strategy, else why not."""
    q = plan.query
    if name == "batch":
        if q.strategy != "any":
            return f"evaluates skip-till-any-match only, not {S.STRATEGY_NAMES[q.strategy]}"
        why = batch_kleene(plan)
        if why:
            return f"{why}: the batch operator would hand it to recomputation (rcep)"
        return ""
    return mechanisms.supports(name, pattern)


def batch_kleene(plan: CerPlan) -> str:
    """'' when the batch operator evaluates the pattern's Kleene closures itself (it counts one
    between two single events under RETURN COUNT(*), with no condition reading it), else why not.
    Whether two candidates share a key is seen only at run time (then recomputation takes over)."""
    q = plan.query
    kvars = {v for v in q.positive if q.elements[v].kleene}
    if not kvars:
        return ""
    if q.returns != "count":
        return "Kleene closure with its matches returned"
    chains = alternatives(q.root)
    if not orders_apart(chains):
        return "Kleene closure in OR / AND"
    read = set().union(*(S.variables(c) for c in q.conditions))
    if not all(closures_counted(chain, read) for chain in chains):
        return KLEENE_NOT_COUNTED
    if any(set(S.variables(c)) & kvars for c in q.conditions):
        return "Kleene closure read by a condition"
    return ""


KLEENE_NOT_COUNTED = ("Kleene closure the batch operator cannot count (its neighbours must be single events, an "
                      "end, or on one side negations without conditions)")


def orders_apart(chains) -> bool:
    """Whether no two alternatives (``alternatives``: an AND's orders among them) bind their single,
    positive events in one order. Keys strictly increase along an alternative, so a binding is
    then a match of one alternative at most: their counts add up, Kleene closures' sets included,
    with no deduplication (``cer_shared.PatternSink``)."""
    orders = [tuple(e.var for e in chain if not e.negated and e.kleene is None) for chain in chains]
    return len(set(orders)) == len(orders)


def closures_counted(chain, read: set) -> bool:
    """Whether the batch (shared) operator counts every Kleene closure of a chain of elements
    (``operators.cer_shared.Kleene``): each lies between two single, positive events, or ends
    (starts) the chain after (before) one; on one side the neighbour may instead be negated
    elements no condition reads (``read``: the variables conditions read), followed by a single,
    positive event, or the chain's end (a trailing negation after a closing closure: no event of
    it between the set's last candidate and the window's end; a leading one before an opening
    closure, read the other way). At most one closure lies at an end: its sets reach as far as the
    window from the match's other end, which must then be a single event. A negation with no single event
    before it (after it) reaches back from the match's last (forward from its first) event, which
    a closure ending (starting) the chain decides set by set: such a chain is not counted."""
    def single(j):
        return 0 <= j < len(chain) and not chain[j].negated and chain[j].kleene is None

    ends = 0
    gating = set()
    closes, opens = False, False  # a closure ends / starts the chain
    for i, e in enumerate(chain):
        if e.kleene is None:
            continue
        sides = []
        for step in (-1, 1):
            j = i + step
            if not 0 <= j < len(chain):
                sides.append("end")
            elif single(j):
                sides.append("single")
            elif chain[j].negated:  # a gate: negated elements no condition reads, then a single event
                while 0 <= j < len(chain) and chain[j].negated and chain[j].var not in read:
                    gating.add(j)
                    j += step
                if not 0 <= j < len(chain):  # the chain's end: a trailing (leading) negation
                    sides.append("gated end")
                elif not single(j):
                    return False
                else:
                    sides.append("gate")
            else:
                return False
        at_end = [side in ("end", "gated end") for side in sides]
        ends += any(at_end)
        opens |= at_end[0]
        closes |= at_end[1]
        if all(at_end) or sum(side.startswith("gate") for side in sides) > 1 or ends > 1:
            return False
    for i, e in enumerate(chain):
        if e.negated and i not in gating:
            if closes and not any(single(j) for j in range(i)):
                return False
            if opens and not any(single(j) for j in range(i + 1, len(chain))):
                return False
    return True


def _seconds(x: float) -> str:
    return "unbounded" if x >= MAX_COST else f"{x * 1000:.3g} ms"


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
    if settings.nodes_filtered:
        plan.filtering, plan.filtering_reason = False, "the storage nodes returned only the rows inside the " \
            "time interval set of their rounds"
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
