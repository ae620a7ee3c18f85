"""Evaluation of a group's statements over its one read (``run_many``): the shared operator
(``operators.cer_shared``) on a plan of ``planner.sharing`` for the statements it takes - units,
selectivity estimates, slices of the stream and re-plans when rates drift - and the usual
mechanisms, one statement at a time, for the others."""
from __future__ import annotations

import time

import numpy as np

from matchrec.engine.mechanisms import mechanisms
from matchrec.engine.multi_classes import ElementClasses, PythonConditions
from matchrec.engine.multi_report import describe
from matchrec.operators import cer_sequences
from matchrec.operators import cer_shared as O
from matchrec.operators.cer_columns import ABSENT
from matchrec.operators.cer_reference import Events, Pattern, alternatives
from matchrec.planner import cer as P
from matchrec.planner import sharing as SH

SLICE_EVENTS = 20_000  # events per slice of the stream: rates re-estimated, plan searched again on a drift
REPLAN_SHARE = 0.25  # a re-plan's budget, as a share of the group's (all re-plans: at most the budget)
# evaluation seconds per unit of estimated plan cost: 4.5e-9 to 7.6e-9 measured on bench.multi's and
# bench.multi_crosscheck's workloads over power and flights-3m (evaluation seconds over the first
# slice's plan cost times the slices), once counted leaves, aggregation and gates made a unit cheaper
SECONDS_PER_COST = 5e-9
SEARCH_SHARE = 0.2  # the plan search takes at most this share of the start plan's expected evaluation time
SEARCH_MIN = 0.02  # ... but at least this many seconds (within the caller's budget)
DRIFT_MIN_EVENTS = 20  # a class with fewer candidates in both the slice and the plan's rates never drifts
# A node run once more (a plan taken after a drift ends the range run so far), in units of cost: one
# batch step's numpy calls took 110-270 us on bench.multi's real streams (fitted over every node's
# steps), against 5 ns a unit (SECONDS_PER_COST); the model's NODE_COST is that step spread over
# the slices of a range. At NODE_COST, re-plans for a gain of a few percent cost power prefix 12%.
RESTART_COST = 40000.0


def evaluate_alone(items: list, classes: ElementClasses, settings: P.CerSettings, lines: list) -> None:
    """The group's statements the shared operator does not take, each by its usual mechanism over the
    rows of the shared read it can look at (``rows_seen``): a mechanism steps over every row it is
    given, and recomputation over a whole 300,000-event read took five times what it takes over the
    cursor's own, filtered read."""
    rest = [i for i in items if not i.shared]
    if not rest:
        return
    m = mechanisms()
    types = None
    said = []
    for item in rest:
        q, plan = item.query, item.plan
        rows = rows_seen(item, classes)
        if rows is None:
            if types is None:
                types = classes.types.to_pylist()
            events = Events(classes.key, types, classes.pid)
            filters = {v: classes.masks[c] for v, c in item.class_of.items() if plan.filter_sql.get(v) is not None}
            conditions = item.py_conds.get()
        else:
            events = Events(classes.key[rows], classes.types.take(rows).to_pylist(),
                            None if classes.pid is None else classes.pid[rows])
            filters = {v: classes.masks[c][rows] for v, c in item.class_of.items()
                       if plan.filter_sql.get(v) is not None}
            conditions = PythonConditions(plan, classes.table.take(rows), {}).get()
        pattern = Pattern(q.root, plan.window, q.strategy, filters, conditions)
        kleene = any(q.elements[v].kleene for v in q.positive)
        name = ("rcep" if kleene else "chain") if q.strategy == "any" else "eager"
        if m.supports(name, pattern):
            name = "eager"
        limit = settings.max_partial_matches
        if q.returns == "count":
            item.count = m.count(name, pattern, events, max_partial=limit) if len(events) else 0
        else:
            item.matches = m.run_columns(name, pattern, events, max_matches=settings.max_matches,
                                         max_partial=limit) if len(events) else []
            if len(item.matches) > settings.max_matches:
                raise O.too_many(settings.max_matches)
            item.count = len(item.matches)
            if rows is not None and item.count:
                in_read(item.matches, rows)
        said.append(f"{item.index} ({item.why}: {name})")
    lines.append(f"  evaluated one by one over the shared read: statements {', '.join(said)}")


def rows_seen(item, classes: ElementClasses) -> np.ndarray | None:
    """The read's rows a statement evaluated alone can look at (None: all): under skip-till-any-match
    only the rows its elements' classes hold (an event no element can bind changes no match; the
    other strategies see every event), and with a window only the rows within it of a candidate of
    its anchors (``planner.cer.anchors_of``: every match binds one), as the statement's own read
    filters before matching: every event of a match, and every event its negations or strict
    contiguity look at, lies within the window of each of its events."""
    q, plan = item.query, item.plan
    keep = None
    if q.strategy == "any" and all(q.elements[v].type is not None for v in item.class_of):
        keep = np.logical_or.reduce([classes.masks[c] for c in set(item.class_of.values())])
    if plan.window < P.NO_WINDOW and len(classes.key):
        counts: dict = {}

        def candidates(v):
            c = item.class_of[v]
            if c not in counts:
                counts[c] = int(np.count_nonzero(classes.masks[c]))
            return counts[c]
        anchors = P.anchors_of(q, candidates)
        if anchors:
            near = near_anchors(classes.key, classes.pid,
                                np.logical_or.reduce([classes.masks[item.class_of[v]] for v in anchors]), plan.window)
            keep = near if keep is None else keep & near
    return None if keep is None else np.flatnonzero(keep)


def near_anchors(key: np.ndarray, pid: np.ndarray | None, anchor: np.ndarray, w: int) -> np.ndarray:
    """Where a row lies within ``w`` of an anchor row's key in its partition (rows sorted by partition,
    then key): the nearest anchor at or before and at or after each row, in one pass each way."""
    n = len(key)
    at = np.arange(n)
    prev = np.maximum.accumulate(np.where(anchor, at, -1))
    nxt = np.minimum.accumulate(np.where(anchor, at, n)[::-1])[::-1]
    ukey = key.view(np.uint64)  # the differences below are of ascending keys: exact modulo 2^64
    out = np.zeros(n, bool)
    for near, found in ((prev, prev >= 0), (nxt, nxt < n)):
        j = np.where(found, near, 0)
        gap = np.where(near <= at, ukey - ukey[j], ukey[j] - ukey)
        ok = found & (gap <= np.uint64(w))
        if pid is not None:
            ok &= pid[j] == pid
        out |= ok
    return out


def in_read(matches, rows: np.ndarray) -> None:
    """Matches over a subset of the read (``rows``: the read's row of each of its positions) made
    matches over the read, in place; ``rows`` ascends, so every order among them stays."""
    for var, r in matches.rows.items():
        r = np.asarray(r)
        matches.rows[var] = np.where(r == ABSENT, ABSENT, rows[np.where(r == ABSENT, 0, r)])
    for seqs in matches.seqs.values():
        seqs.flat = rows[np.asarray(seqs.flat, np.int64)]
        seqs.tuples = None


def evaluate_shared(run, items: list, classes: ElementClasses, settings: P.CerSettings, budget: float,
                    lines: list, threads: int = 1) -> None:
    """The group's statements the shared operator takes (``item.shared``), in one pass over the stream:
    plan, slices, re-plans after a rate drift; the plan's trees (and a long range's parts) on up
    to ``threads`` threads.
    ``run`` holds the options and the counters of the run."""
    group_items = items
    items = [i for i in group_items if i.shared]
    if not items:
        return
    r = run
    units, models, sinks = [], [], []
    for k, item in enumerate(items):
        units_of(item, k, units, models)
        # Only units binding the same variables in the same order can give one binding twice: keys
        # strictly increase along a unit, so a binding fits one order of its variables (the
        # permutations of an AND never meet and need no deduplication).
        orders = [tuple(units[u].vars) for u in item.units]
        shared = {frozenset(o) for o in orders if orders.count(o) > 1}
        sinks.append(O.PatternSink(item.query.returns == "count", settings.max_matches, shared))
    if not units:
        for item in items:
            item.count, item.matches = 0, ([] if item.query.returns != "count" else None)
        return
    wmax = max(u.window for u in units)
    try:
        stream = O.Stream(classes.key, classes.pid, classes.masks, wmax)
    except O.Unshareable as err:
        for item in items:
            item.shared, item.why = False, str(err)
        evaluate_alone(group_items, classes, settings, lines)
        return
    for m in models:
        m.window = stream.clamp(m.window)
    units, models = count_sequences(stream, units, models, sinks, items, lines, threads)
    if not units:
        for item, sink in zip(items, sinks):
            item.count, item.matches = sink.finish()
        return
    estimate(stream, units, models)
    work = SH.Workload(models)
    slices = stream.slices(r.slice_events)
    r.stats["slices"] += len(slices)
    first = slices[0] if slices else (0, 0, 0, 1)
    rates = slice_rates(stream, first)
    scale = stream.n / max(1, first[1] - first[0])  # the model costs one slice; the stream has this many
    model = SH.CostModel(work, rates)
    start = SH.start_plan(work, model, share=r.share, reorder=r.reorder)
    plan, info = SH.optimise(work, model, start, share=r.share, reorder=r.reorder,
                             budget=search_budget(model.cost(start) * scale, budget),
                             seconds_per_cost=SECONDS_PER_COST * scale)
    r.stats["optimiser_seconds"] += info.seconds
    r.stats["start_cost"] += info.start_cost
    r.stats["cost"] += info.cost
    roots = SH.build_nodes(work, plan, units, classes.labels)
    describe(r, lines, items, units, plan, info, roots, len(classes.masks), SEARCH_SHARE)
    ev = O.Evaluator(stream, units, sinks)
    replans = skipped = kept = waited = 0
    plan_rates, planned_at = rates, 0
    deciding, last_cost = 0.0, info.cost  # seconds the last drift decision took; the plan's cost then
    size = len(list(SH.walk(roots)))
    allowance = budget  # the re-plans together take at most the budget once more
    pending = None  # consecutive slices under one plan run as one range (fewer, larger batch steps)
    for n, sl in enumerate(slices):
        if n and r.reorder:
            now = slice_rates(stream, sl)
            if drifted(now, plan_rates, units):
                ahead = min(n - planned_at, len(slices) - n)
                if allowance <= 0:
                    skipped += 1
                elif SEARCH_SHARE * last_cost * ahead * SECONDS_PER_COST < deciding:
                    # a re-plan could save less than deciding on one costs (costing both plans,
                    # 2-5 ms on bench.multi's 100 patterns): wait until more slices lie ahead
                    waited += 1
                else:
                    t_plan = time.perf_counter()
                    model = SH.CostModel(work, now)
                    greedy = SH.start_plan(work, model, share=r.share, reorder=True)
                    held, other = model.cost(plan), model.cost(greedy)
                    begin, found_cost = (plan, held) if held <= other else (greedy, other)
                    # A re-plan is expected to hold as long as the plan before it did (rates that
                    # drifted once drift again), so its search is worth that many slices' evaluation
                    # (``ahead``), not the rest of the stream's.
                    worth = SEARCH_SHARE * found_cost * ahead * SECONDS_PER_COST
                    found = begin
                    if worth >= SEARCH_MIN:  # else no search: the cheaper of the plan and the greedy one
                        left = min(worth, allowance, budget * REPLAN_SHARE)
                        found, info2 = SH.optimise(work, model, begin, share=r.share, reorder=True, budget=left,
                                                   seed=n, seconds_per_cost=SECONDS_PER_COST * ahead)
                        found_cost = info2.cost
                    spent = time.perf_counter() - t_plan  # the whole decision, not only the search
                    deciding, last_cost = spent, found_cost
                    allowance -= spent
                    r.stats["optimiser_seconds"] += spent
                    plan_rates, planned_at = now, n
                    # A new plan ends the range evaluated so far: every node then runs once more.
                    # It is taken only when it saves more than that over the slices it should hold.
                    if (held - found_cost) * ahead > RESTART_COST * size:
                        if pending is not None:
                            ev.run(roots, *pending, threads=threads)
                            pending = None
                        plan = found
                        roots = SH.build_nodes(work, plan, units, classes.labels)
                        size = len(list(SH.walk(roots)))
                        replans += 1
                    else:
                        kept += 1
        pending = (pending[0], sl[3]) if pending is not None else (sl[2], sl[3])
    if pending is not None:
        ev.run(roots, *pending, threads=threads)
    r.stats["replans"] += replans
    if len(slices) > 1:
        more = [f"{kept} searches after a drift kept the plan (too little to gain)"] if kept else []
        more += [f"{skipped} more drifts after the re-planning budget was spent"] if skipped else []
        more += [f"{waited} drifts with too few slices ahead to pay for deciding"] if waited else []
        lines.append(f"  {len(slices)} slices of about {r.slice_events:,} events; re-plans after a rate "
                          f"drift: {replans}" + (f" ({'; '.join(more)})" if more else ""))
    w = ev.work
    r.stats["partial_matches"] += w["partial_matches"]
    r.stats["candidates"] += w["candidates"]
    r.stats["aggregated"] += w["aggregated"]
    agg = (f" ({w['aggregated']:,} aggregated: each stands for the partial matches no later step tells apart)"
           if w["aggregated"] else "")
    lines.append(f"  evaluation: {w['partial_matches']:,} partial matches{agg}, {w['searches']:,} searches, "
                      f"{w['candidates']:,} candidates examined, {w['matches']:,} unit matches")
    for item, sink in zip(items, sinks):  # column-wise: what the result builder reads
        item.count, item.matches = sink.finish()


def count_sequences(stream: O.Stream, units: list, models: list, sinks: list, items: list, lines: list,
                    threads: int = 1):
    """The counted units that are plain sequences (no condition between elements, or only between
    the first two, the last two, or the first and the last, read as rays; no negation but between
    the first two or the last two, no Kleene closure but one ``K+`` at the end or, in a sequence
    with neither condition nor negation, between two elements; no other alternative to deduplicate
    against) counted in closed form (``operators.cer_sequences``), on up to ``threads`` threads;
    returns the other units and their models, for the plan."""
    todo = [i for i, unit in enumerate(units)
            if sinks[unit.pattern].counting and frozenset(unit.vars) not in sinks[unit.pattern].shared]
    # an evaluator for its ranks of a class's values (cached on the stream per class and column)
    ranker = O.Evaluator(stream, units, sinks) if any(
        units[i].negs or units[i].conds or units[i].gates for i in todo) else None
    backwards = cer_sequences.Reversed(stream)
    counts = O.each_on_threads(lambda i: _closed_form(stream, backwards, units[i], ranker), todo, threads,
                               "matchrec-counts")
    done, n_done = [], 0
    for i, n in zip(todo, counts):
        if n is None:
            continue
        sinks[units[i].pattern].add_count(n)
        done.append(i)
        n_done += n
    if not done:
        return units, models
    said = sorted({items[units[i].pattern].index for i in done})
    lines.append(f"  counted in closed form (plain sequences, those ending in one closure, and those whose "
                 f"conditions and negations lie between the first two or the last two elements, or whose "
                 f"conditions lie between the first and the last: running sums "
                 f"over the elements' candidates, no partial matches): "
                 f"statements {', '.join(map(str, said))}; {n_done:,} matches")
    gone = set(done)
    keep = [i for i in range(len(units)) if i not in gone]
    return [units[i] for i in keep], [models[i] for i in keep]


def _closed_form(stream: O.Stream, backwards, unit, ranker) -> int | None:
    """``unit``'s matches counted in closed form, or None where it is not of a shape counted so
    (``count_sequences``) or the count declines."""
    if unit.negs:
        return _count_ends(stream, unit, ranker)
    if unit.conds or unit.gates:
        return _count_pair(stream, backwards, unit, ranker)
    if not unit.kleene:
        return cer_sequences.count(stream, unit.classes, unit.window, cheaper=True)
    if len(unit.kleene) == 1 and _trailing_closure(unit.kleene[0], len(unit.classes), gated=True):
        c = unit.kleene[0]
        return cer_sequences.count_closure(stream, unit.classes, c.cls, unit.window, cheaper=True,
                                           gates=() if c.gate_after else c.gate,
                                           trailing=c.gate if c.gate_after else ())
    if len(unit.kleene) == 1 and _middle_closure(unit.kleene[0]):
        c = unit.kleene[0]
        return cer_sequences.count_between(stream, unit.classes, c.prev, c.cls, unit.window, cheaper=True)
    return None


def _count_pair(stream: O.Stream, backwards: cer_sequences.Reversed, unit, ranker: O.Evaluator) -> int | None:
    """A unit whose conditions and negations (gates) all lie between its first two variables, or
    (with no closure) its last two, counted by ``cer_sequences.count_ranked_pair``: the last two
    as the first two of the sequence read backwards (a match's events in reverse key order are a
    match of the reversed sequence over the negated keys, with the same span and the same events
    between each pair; ``backwards``: ``stream`` so read). None where the unit is not of that shape
    or the count declines."""
    k = len(unit.classes)
    closing = bool(unit.kleene) and len(unit.kleene) == 1 and _trailing_closure(unit.kleene[0], k)
    if k < 2 or (unit.kleene and not closing):
        return None
    # where the conditions and gates lie (a gate always sits between two bound variables)
    spots = ({frozenset(c.vars) for c in unit.conds}
             | {frozenset((unit.vars[g.prev], unit.vars[g.next])) for g in unit.gates})
    if len(spots) != 1:
        return None
    spot = next(iter(spots))
    gates = tuple(g.cls for g in unit.gates)
    if spot == {unit.vars[0], unit.vars[1]}:
        pair = _pair_intervals(stream, unit, ranker, 0, 1)
        if pair is None:
            return None
        return cer_sequences.count_ranked_pair(stream, unit.classes, unit.window, *pair, cheaper=True,
                                               closure=unit.kleene[0].cls if closing else None, gates=gates)
    if spot == {unit.vars[0], unit.vars[-1]} and k >= 3 and not unit.kleene and not gates:
        pair = _pair_intervals(stream, unit, ranker, 0, k - 1)
        if pair is None:
            return None
        return cer_sequences.count_ranked_ends(stream, unit.classes, unit.window, *pair, cheaper=True)
    if closing or spot != {unit.vars[-2], unit.vars[-1]}:
        return None
    pair = _pair_intervals(stream, unit, ranker, k - 1, k - 2)
    if pair is None:
        return None
    low, high, rank, distinct = pair
    return cer_sequences.count_ranked_pair(backwards, unit.classes[::-1], unit.window,
                                           low[::-1], high[::-1], rank[::-1], distinct, cheaper=True, gates=gates)


def _count_ends(stream: O.Stream, unit, ranker: O.Evaluator) -> int | None:
    """A unit whose negations all lie before its first or after its last element, read by no
    condition, whose conditions (if any) lie between its first and last variables, with no Kleene
    closure and no negation between bound variables: ``cer_sequences.count_ranked_ends``. Else
    None."""
    k = len(unit.classes)
    if k < 2 or unit.kleene or unit.gates:
        return None
    before, after = [], []
    for g in unit.negs:
        if g.linked:
            return None
        if g.prev is None and g.next == 0:
            before.append(g.cls)
        elif g.next is None and g.prev == k - 1:
            after.append(g.cls)
        else:
            return None
    if any(c.vars != {unit.vars[0], unit.vars[-1]} for c in unit.conds):
        return None
    pair = _pair_intervals(stream, unit, ranker, 0, k - 1)
    if pair is None:
        return None
    return cer_sequences.count_ranked_ends(stream, unit.classes, unit.window, *pair, cheaper=True,
                                           before=tuple(before), after=tuple(after))


def _pair_intervals(stream: O.Stream, unit, ranker: O.Evaluator, bound: int, ranked: int):
    """When every condition of ``unit`` reads its variables ``bound`` and ``ranked`` only and is
    rays of one column of ``ranked`` (``engine.multi_rays``): per candidate of ``bound``, the
    interval of ranks of that column's values where the conditions hold (``Evaluator.narrow_ranks``,
    as ``Evaluator.rank_bounds`` finds them), the rank of each candidate of ``ranked``, and how many
    ranks there are - what ``cer_sequences.count_ranked_pair`` reads; with no condition, one rank
    that every pair takes. Else None."""
    first, second = unit.vars[bound], unit.vars[ranked]
    rows = stream.rows[unit.classes[bound]]
    u = len(rows)
    if not unit.conds:
        return (np.zeros(u, np.int64), np.ones(u, np.int64),
                np.zeros(len(stream.rows[unit.classes[ranked]]), np.int64), 1)
    found = []
    for c in unit.conds:
        r = c.rays.get(second) if c.vars == {first, second} and c.vec is not None else None
        if r is None or (found and r.column != found[0].column):
            return None
        found.append(r)
    rank, rep = ranker.ranks(unit.classes[ranked], found[0])
    # Where every condition reads one column of the bound variable too (it is rays of it), the
    # candidates with one value of that column share their interval: searched once per value (a
    # row holding it), NULL and NaN rows each on their own.
    by = [c.rays.get(first) for c in unit.conds]
    which = None
    if all(b is not None for b in by) and len({b.column for b in by}) == 1:
        value_rank, value_rows = ranker.ranks(unit.classes[bound], by[0])
        odd = np.flatnonzero(value_rank < 0)
        if len(value_rows) + len(odd) < u:
            which = np.where(value_rank < 0, len(value_rows) + np.cumsum(value_rank < 0) - 1, value_rank)
            rows = np.concatenate([value_rows, rows[odd]])
    n = len(rows)
    low, high = np.zeros(n, np.int64), np.full(n, len(rep), np.int64)
    for r in found:
        if not O.Evaluator.narrow_ranks(r, second, rep, {first: rows}, n, low, high):
            return None
    if which is not None:
        low, high = low[which], high[which]
    return low, high, rank, len(rep)


def _trailing_closure(k, positives: int, gated: bool = False) -> bool:
    """A closure ``K+`` (one or more, no upper bound, no negation beside it; with ``gated``,
    negations between it and the last positive element, or after it, allowed) after the last
    positive element: ``cer_sequences.count_closure`` counts it with the sequence before it."""
    return (k.next is None and k.prev == positives - 1 and k.lo <= 1 and k.hi is None
            and (not k.gate or gated))


def _middle_closure(k) -> bool:
    """A closure ``K+`` (one or more, no upper bound, no negation beside it) between two positive
    elements: ``cer_sequences.count_between`` counts it with the sequence around it."""
    return k.prev is not None and k.next == k.prev + 1 and k.lo <= 1 and k.hi is None and not k.gate


def threads_of(duck) -> int:
    """The threads the shared operator may use: DuckDB's ``threads`` setting on the connection the
    statement reads from (``SET threads = 1`` keeps matching on the calling thread, as it keeps
    DuckDB's own work; Spark's tasks set it so)."""
    try:
        return max(1, int(duck.execute("SELECT current_setting('threads')").fetchall()[0][0]))
    except Exception:  # a connection without the setting: one thread, as before
        return 1


def search_budget(cost: float, budget: float) -> float:
    """Seconds the plan search may take: ``SEARCH_SHARE`` of the time the plan it starts from is
    expected to take (its estimated cost at ``SECONDS_PER_COST``), at least ``SEARCH_MIN`` and at
    most ``budget``. A search can at best remove what the evaluation costs, so on a short stream
    a long search loses more than it wins."""
    return min(budget, max(SEARCH_MIN, SEARCH_SHARE * cost * SECONDS_PER_COST))

def units_of(item, k: int, units: list, models: list) -> None:
    q, plan = item.query, item.plan
    chains = alternatives(q.root)
    for alt, chain in enumerate(chains):
        pos = [e for e in chain if not e.negated and e.kleene is None]
        if not pos:
            continue
        names = [e.var for e in pos]
        varset = set(names)
        if any(v <= varset for v in item.never):
            continue  # a condition false for every binding of this alternative: no match
        at = {v: i for i, v in enumerate(names)}
        conds, cmodels = [], []
        for c, t in zip(item.conds, item.templates):
            if c.vars <= varset:
                conds.append(c)
                cmodels.append(SH.CondModel(frozenset(at[v] for v in c.vars),
                                            tuple(("var", at[p[1]]) if not isinstance(p, str) else p for p in t)))
        negs, gates, kleene = [], [], []
        gating = set()  # the negated elements that are a closure's gate
        for i, e in enumerate(chain):
            if e.kleene is None:
                continue
            # counted: its neighbours are single events or an end (``countable``), or negated
            # elements, the single event beyond them then the closure's neighbour
            gate, after = [], False
            prev = i - 1 if i else None
            nxt = i + 1 if i + 1 < len(chain) else None
            while prev is not None and chain[prev].negated:
                gate.append(prev)
                prev = prev - 1 if prev else None  # past the chain's start: a leading negation
            if not gate:
                while nxt is not None and chain[nxt].negated:
                    gate.append(nxt)
                    nxt = nxt + 1 if nxt + 1 < len(chain) else None  # past its end: a trailing one
                after = bool(gate)
            gating.update(gate)
            kleene.append(O.Kleene(item.class_of[e.var], at[chain[prev].var] if prev is not None else None,
                                   at[chain[nxt].var] if nxt is not None else None, e.kleene[0], e.kleene[1],
                                   tuple(item.class_of[chain[j].var] for j in gate), after))
        for i, e in enumerate(chain):
            if not e.negated or i in gating:
                continue
            before = [at[x.var] for x in chain[:i] if not x.negated and x.kleene is None]
            after = [at[x.var] for x in chain[i + 1:] if not x.negated and x.kleene is None]
            linked = [c for c in item.conds if e.var in c.vars and c.vars <= varset | {e.var}]
            g = O.Neg(item.class_of[e.var], e.var, before[-1] if before else None, after[0] if after else None, linked)
            if g.prev is not None and g.next is not None and not linked:
                # between two bound events and read by no condition: a bound on the later one's
                # candidates (``Node.gates``), part of the nodes' canonical form like a condition
                gates.append(g)
                cmodels.append(SH.CondModel(frozenset({g.prev, g.next}), (("var", g.prev), f" no #{g.cls} before ",
                                                                          ("var", g.next))))
            else:
                negs.append(g)
        label = f"statement {item.index}" + (f" alternative {alt + 1}" if len(chains) > 1 else "")
        item.units.append(len(units))
        units.append(O.Unit(k, names, [item.class_of[v] for v in names], conds, negs, plan.window, label, kleene,
                            gates))
        reads = {i for g in negs for i in (g.prev, g.next) if i is not None}
        reads |= {at[v] for g in negs for c in g.linked for v in c.vars if v in at}
        reads |= {i for c in kleene for i in (c.prev, c.next) if i is not None}
        models.append(SH.UnitModel([item.class_of[v] for v in names], cmodels, plan.window, label,
                                   item.query.returns == "count" and len(chains) == 1, frozenset(reads)))

def estimate(stream: O.Stream, units: list, models: list) -> None:
    """Condition selectivities on bindings drawn around a sample of the stream's events."""
    rng = np.random.default_rng(7)
    n = stream.n
    sample = np.sort(rng.choice(n, min(n, P.SAMPLE_ROWS), replace=False)) if n else np.zeros(0, np.int64)
    cache: dict = {}
    pools: dict = {}  # class -> its candidates among the sample, found once
    for unit, model in zip(units, models):
        for c, cm in zip(unit.conds, model.conds):
            names = {p: f"{model.classes[p]}:{i}" for i, p in enumerate(sorted(cm.vars))}
            key = (SH.render(cm.template, names), unit.window)
            sel = cache.get(key)
            if sel is None:
                classes = {v: unit.classes[unit.vars.index(v)] for v in c.vars}
                sel = cache[key] = SH.estimate_selectivity(stream, c, classes, unit.window, rng, sample,
                                                           P.SAMPLE_TRIALS, pools)
            cm.sel = sel
        for g, cm in zip(unit.gates, model.conds[len(unit.conds):]):
            key = ("gate", unit.classes[g.prev], unit.classes[g.next], g.cls, unit.window)
            sel = cache.get(key)
            if sel is None:
                sel = cache[key] = gate_selectivity(stream, unit.classes[g.prev], unit.classes[g.next], g.cls,
                                                    stream.clamp(unit.window))
            cm.sel = sel


def gate_selectivity(stream: O.Stream, prev: int, nxt: int, neg: int, w: int, sample: int = 4096) -> float:
    """The share of the pairs of a candidate of ``prev`` and one of ``nxt`` after it within the
    window that have no event of ``neg`` between them, over evenly spread ``prev`` candidates."""
    ck, gk = stream.cks[prev], stream.cks[neg]
    if not len(ck) or not len(gk):
        return 1.0
    k = ck[np.linspace(0, len(ck) - 1, min(sample, len(ck))).astype(np.int64)]
    nk = stream.cks[nxt]
    a = np.searchsorted(nk, k, "right")
    b = np.searchsorted(nk, k + w, "right")
    at = np.searchsorted(gk, k, "right")
    x = np.where(at < len(gk), gk[np.minimum(at, len(gk) - 1)], k + w)
    ok = np.searchsorted(nk, np.minimum(k + w, x), "right") - a
    every = int((b - a).sum())
    return float(ok.sum()) / every if every else 1.0

def slice_rates(stream: O.Stream, sl) -> SH.Rates:
    q0, q1, lo, hi = sl
    span = float(stream.real[q1 - 1] - stream.real[q0] + 1) if q1 > q0 else 1.0
    return SH.Rates(stream.counts(lo, hi), span)

def drifted(now: SH.Rates, then: SH.Rates, units: list) -> bool:
    used = {c for u in units for c in u.classes}
    for c in used:
        a, b = now.counts[c], then.counts[c]
        if max(a, b) < DRIFT_MIN_EVENTS:
            continue
        ra, rb = (a + 0.5) / now.span, (b + 0.5) / then.span
        if max(ra, rb) > P.RATE_CHANGE * min(ra, rb):
            return True
    return False
