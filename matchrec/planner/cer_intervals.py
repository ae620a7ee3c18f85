"""Which rows of a storage-node table a CER statement can use: the row filter and the time
interval plan its pull runs with (``engine.cer_remote`` pulls them, ``connectors.dual_filtering``
makes the rounds).

The rows. A row that passes no element's filter (type and one-variable WHERE conjuncts, what
``CerPlan.element_test`` gives) takes no part in any match under skip-till-any-match or
skip-till-next-match: a positive element binds only its candidates, a negated element is only
blocked by its candidates, and skip-till-next-match only asks, between two bound events,
whether a candidate of the element growing or beginning there was passed over
(``operators.cer_reference._next_match``). The local engine reads with the same row test
(``CerPlan.row_test``). Strict contiguity looks at every row (its positions), and an element
without type or filter takes any row: then every row is pulled (within the intervals).

The intervals. With ``WITHIN w`` the positive events of a match lie in ``[f, l]`` with
``l - f <= w``, and a negated element looks at most at ``[l - w, f + w]`` (a leading negation
from ``l - w``, a trailing one up to ``f + w``, others between two positive events). Let ``t``
be the key of any positive event of the match: ``f <= t <= l`` gives
``[f, l] ∪ [l - w, f + w] ⊆ [t - w, t + w]``. So for a *mandatory* element (positive, in every
alternative of the pattern; a Kleene element binds at least one event), every key the match
looks at lies within ``w`` of one of its candidates, and the intersection over the mandatory
elements of the unions ``[t - w, t + w]`` around their candidates holds every row any match
looks at - a contiguous range, so all of it inside one interval of the set, the rows between
included (which strict contiguity needs). Rows outside the set therefore change no match:
every match of the full input is one of the pulled rows, and a match of the pulled rows has
all the rows it looks at inside the set, so it is one of the full input. When the root is a
SEQ whose first item is a positive element, that element's event is the first of the match
(positive keys strictly increase along a SEQ, and no leading negation looks before it): its
candidates bound the match by ``[t, t + w]``; a positive last item likewise by ``[t - w, t]``.

When no element is mandatory (an OR at the top), every match still binds one of the
alternatives' anchors (``planner.cer.anchors_of``), so the rows meeting one of the anchors'
tests bound the set as one pseudo-element. Without WITHIN there is no interval set: the pull
is the row filter alone (``push_down``).

Equality conditions between variables (``x.k = y.k``) would allow the window-wise join filter
of MATCH_RECOGNIZE, but its contract (the other side read at the last row of a variable that
precedes the current row) does not map onto CER's partial orders yet: no join filters here.
"""
from __future__ import annotations

from matchrec.operators.cer_reference import element_sets
from matchrec.operators.pattern_ir import Element, Seq
from matchrec.parser.names import quote_ident
from matchrec.planner.cer.choice import anchors_of
from matchrec.planner.cer.plan import NO_WINDOW, CerPlan
from matchrec.planner.intervals import IntervalPlan, VariableIntervals

# Windows longer than this (in key units) bound nothing useful and risk BIGINT overflow in t +- w.
MAX_WINDOW = 1 << 56


def mandatory(plan: CerPlan) -> list[str]:
    """The positive elements present in every alternative of the pattern, in written order."""
    chains = element_sets(plan.query.root)
    sets = [{e.var for e in chain if not e.negated} for chain in chains]
    common = set.intersection(*sets) if sets else set()
    return [v for v in plan.query.positive if v in common]


def row_filter(plan: CerPlan) -> tuple[str | None, str]:
    """SQL keeping the rows some element could take or be blocked by (None: every row), and why."""
    test = plan.row_test()
    if test is not None:
        return test, "rows passing some element's type and filter"
    if plan.query.strategy == "strict":
        return None, "strict contiguity looks at every row"
    return None, "an element without type or filter can take any row"


def interval_plan(plan: CerPlan) -> tuple[IntervalPlan | None, str]:
    """The time interval plan of a CER statement (see the module's docstring), or None and why."""
    q = plan.query
    if plan.window == NO_WINDOW:
        return None, "no WITHIN bounds the matches"
    if plan.window > MAX_WINDOW:
        return None, f"WITHIN is longer than {MAX_WINDOW} key units"
    window = max(1, plan.window)  # the rounds work in whole units; 1 keeps [t, t] meaningful
    first = last = None
    if isinstance(q.root, Seq) and q.root.items:
        head, tail = q.root.items[0], q.root.items[-1]
        first = head.var if isinstance(head, Element) and not head.negated else None
        last = tail.var if isinstance(tail, Element) and not tail.negated else None
    variables = []
    for label, var in enumerate(mandatory(plan)):
        test = plan.element_test(var)
        if test == "TRUE":
            continue  # any row is a candidate: it would bound nothing
        before = 0 if var == first and var != last else window
        after = 0 if var == last and var != first else window
        variables.append(VariableIntervals(label, var, test, before, after,
                                           at_most_once=q.elements[var].kleene is None))
    if not variables:
        anchors = anchors_of(q, lambda v: 0)
        tests = [plan.element_test(v) for v in anchors]
        if not anchors or "TRUE" in tests:
            return None, "no element in every match has a type or filter"
        cond = " OR ".join(f"({t})" for t in tests)
        variables.append(VariableIntervals(0, "one of " + ", ".join(anchors), cond, window, window))
    rows, _ = row_filter(plan)
    # dfs_stateful may answer the final pull with the rows the nodes kept for each round, when those
    # are exactly the rows the row filter keeps: every element positive, mandatory and in a round
    labels = None
    if rows is not None and not any(e.negated for e in q.elements.values()) and \
            {v.name for v in variables} == set(q.elements):
        labels = [v.label for v in variables]
    ip = IntervalPlan(plan.key_sql, plan.key_column, window,
                      [quote_ident(plan.partition_column)] if plan.partition_column else [],
                      variables, rows, labels)
    return ip, f"{len(variables)} element(s) bound the time intervals"
