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

Join filters. An equality ``x.k = y.k`` between two variables is a condition of every match
that binds both (``operators.cer_reference``: a condition whose variables are all bound must
hold; NULL is false). It gives the rounds a window-wise join filter (``connectors.dual_filtering``)
when all of this holds, else EXPLAIN says which part does not:

* both elements are positive, single events (no Kleene: a condition reads a Kleene variable as
  the tuple of its events) and mandatory with a type or filter, so each has a round and every
  match binds both - the condition then holds in every match;
* one of them, ``x``, precedes the other in every match: their nearest common node of the
  pattern is a SEQ with ``x``'s item first (an AND leaves the order open, and the filter probes
  one side of ``t`` only). Keys strictly increase along a SEQ and lie within ``w`` of each
  other, so ``y``'s event at ``t`` has ``x``'s event, with the same value, in ``[t - w, t]``
  ("follow"), and ``x``'s event at ``t`` has ``y``'s in ``[t, t + w]`` ("precede", as ``x``
  takes one event);
* both sides are plain columns of one comparable type whose DuckDB cast and hash agree with the
  engine's equality: integers (as BIGINT), strings, dates, timestamps, booleans, decimals of one
  scale - not floats (``-0.0`` equals ``0.0`` but need not hash alike).

So every event a match binds to ``x`` or ``y`` passes its join filter, and the candidates the
rounds drop bind in no match: the time interval set built from the survivors still holds every
row any match looks at, by the argument above, whatever the strategy (the rows skip-till-next-
match or a negated element look at lie within ``w`` of a bound event, which survived). What a
join filter must not do is drop a row from the final pull: a row failing ``y``'s join filter can
still be passed over by skip-till-next-match (a Kleene element that could have grown takes any
row passing its own filter) or block a negated element. ``dfs_stateful`` may answer the final pull
with the rows the nodes kept after each round - rows that passed the join filters - only under
skip-till-any-match without negated elements, where the rows no match binds change nothing;
otherwise the final pull reads by the row filter (``IntervalPlan.filter_labels`` None).
"""
from __future__ import annotations

from matchrec.operators.cer_reference import element_sets
from matchrec.operators.pattern_ir import Element, Seq
from matchrec.parser import sase as S
from matchrec.parser.names import quote_ident
from matchrec.planner.cer.choice import anchors_of
from matchrec.planner.cer.plan import NO_WINDOW, CerPlan
from matchrec.planner.intervals import IntervalPlan, JoinCondition, VariableIntervals

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


def interval_plan(plan: CerPlan, notes: list[str] | None = None) -> tuple[IntervalPlan | None, str]:
    """The time interval plan of a CER statement (see the module's docstring), or None and why.
    ``notes`` receives why an equality condition gives no join filter."""
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
    joined = _add_joins(plan, variables, notes if notes is not None else [])
    rows, _ = row_filter(plan)
    # dfs_stateful may answer the final pull with the rows the nodes kept for each round, when those
    # are exactly the rows the row filter keeps: every element positive, mandatory and in a round
    # (and, with join filters, only where the rows they drop are bound by no match and seen by none)
    labels = None
    if rows is not None and not any(e.negated for e in q.elements.values()) and \
            {v.name for v in variables} == set(q.elements) and not (joined and q.strategy != "any"):
        labels = [v.label for v in variables]
    elif joined and notes is not None and q.strategy == "next" and rows is not None:
        notes.append("join filters shrink the intervals only: skip-till-next-match looks at rows they would "
                     "drop, so the final pull reads by the row filter")
    ip = IntervalPlan(plan.key_sql, plan.key_column, window,
                      [quote_ident(plan.partition_column)] if plan.partition_column else [],
                      variables, rows, labels)
    return ip, f"{len(variables)} element(s) bound the time intervals"


# Column types whose DuckDB cast and hash agree with the engine's equality, and the type both
# sides are hashed as (None: the type itself, when both sides have it).
_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"}
_EXACT = ("VARCHAR", "DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "BOOLEAN", "DECIMAL")


def _join_type(a: str, b: str) -> str | None:
    a, b = a.upper(), b.upper()
    if a in _INTEGERS and b in _INTEGERS:
        return "BIGINT"
    if a == b and (a in _EXACT or a.startswith("DECIMAL(")):
        return a
    return None


def _path(node, var: str) -> list | None:
    """The nodes from ``node`` down to ``var``'s element, with the item index taken at each."""
    if isinstance(node, Element):
        return [] if node.var == var else None
    for i, item in enumerate(node.items):
        below = _path(item, var)
        if below is not None:
            return [(node, i)] + below
    return None


def precedes(root, x: str, y: str) -> bool | None:
    """True when ``x``'s event precedes ``y``'s in every match, False when ``y``'s precedes,
    None when the pattern leaves the order open (an AND) or never binds both (an OR)."""
    px, py = _path(root, x), _path(root, y)
    if px is None or py is None:
        return None
    for (nx, ix), (ny, iy) in zip(px, py):
        if nx is not ny:
            break
        if ix != iy:
            if isinstance(nx, Seq):
                return ix < iy
            return None  # And: any order; Or: never together
    return None


def equality_joins(plan: CerPlan) -> tuple[list[tuple[str, str, str, str, str]], list[str]]:
    """The equalities that give join filters, as (consumer, source, consumer SQL, source SQL,
    common type) with the source preceding the consumer in every match, and why each other
    equality between two variables gives none (see the module's docstring)."""
    q = plan.query
    out, why = [], []
    must = set(mandatory(plan))
    for c in q.conditions:
        if not (isinstance(c, S.Binary) and c.op == "=" and isinstance(c.left, S.Col) and isinstance(c.right, S.Col)):
            continue
        a, b = c.left, c.right
        if a.var == b.var:
            continue
        text = q.text[c.span[0]:c.span[1]] if getattr(c, "span", None) else f"{a.var}.{a.name} = {b.var}.{b.name}"
        ea, eb = q.elements[a.var], q.elements[b.var]
        if ea.negated or eb.negated:
            why.append(f"no join filter for {text}: a negated element is blocked by its rows, it binds none")
            continue
        if ea.kleene is not None or eb.kleene is not None:
            why.append(f"no join filter for {text}: a Kleene element is compared as the tuple of its events")
            continue
        if not {a.var, b.var} <= must:
            why.append(f"no join filter for {text}: not every match binds both elements")
            continue
        if "TRUE" in (plan.element_test(a.var), plan.element_test(b.var)):
            why.append(f"no join filter for {text}: an element without type or filter has no round")
            continue
        order = precedes(q.root, a.var, b.var)
        if order is None:
            why.append(f"no join filter for {text}: the pattern leaves the order of {a.var} and {b.var} open "
                       "(AND)")
            continue
        ca, cb = plan.columns[a.name.lower()], plan.columns[b.name.lower()]
        common = _join_type(ca[1], cb[1])
        if common is None:
            why.append(f"no join filter for {text}: columns of types {ca[1]} and {cb[1]} may compare equal "
                       "with different hashes")
            continue
        sa, sb = quote_ident(ca[0]), quote_ident(cb[0])
        out.append((b.var, a.var, sb, sa, common) if order else (a.var, b.var, sa, sb, common))
    return out, why


def _add_joins(plan: CerPlan, variables: list[VariableIntervals], notes: list[str]) -> bool:
    """Attach the join filters of ``equality_joins`` to the round of their consumer; whether any."""
    by_name = {v.name: v for v in variables}
    joins, why = equality_joins(plan)
    notes += why
    for consumer, source, current_sql, other_sql, common in joins:
        v, s = by_name.get(consumer), by_name.get(source)
        if v is None or s is None:
            continue
        v.joins.append(JoinCondition(current_sql, other_sql, frozenset({s.label}), common,
                                     plan.element_test(source)))
    return any(v.joins for v in variables)
