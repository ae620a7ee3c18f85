"""The cost model behind the choice of a CER evaluation mechanism: per mechanism, the estimated
seconds to evaluate a pattern, from the statistics (``estimates``).

The unit of work is a partial match tried: one candidate event bound to an element (a search step
of the lazy NFAs and of recomputation, an extension tried by the eager NFA, an element of a batch
array). How many there are follows from the rates per element per key unit (candidates over the
key span, the span summed over the partitions), the window W, the selectivity of the conditions
(from the sample; 0.5 where not estimated) and the order in which each mechanism binds the
elements:

* ``batch``: each alternative (an AND expanded into its permutations) in its cheapest order,
  chosen again where the rates drift (per half of the key range here), whole arrays at a time
  (a small cost per partial match, a fixed cost per statement, per event read and per step);
* ``chain``: each alternative (an AND kept as one partial order) in one order, rarest element
  first, fixed for the whole stream (its cost summed over the halves with the rates of each);
* ``tree``: the order re-planned per instance (per candidate of the rarest element): per half
  the cheapest order starting from that element, plus the planning of every instance;
* ``rcep``: the candidates buffered, each match built backwards from its last event; a Kleene
  closure between two single events is counted (RETURN COUNT(*)) instead of enumerated;
* ``eager``: the written order, every event read tried against the partial matches waiting for it
  (under skip-till-next-match a partial match takes one event, under strict contiguity the next row).

The constants are seconds per unit fitted to the times of ``bench.cer_choice`` on a loaded
2-core machine (so they are high in absolute terms); only their ratios matter for the choice. The
batch operator's fixed costs (per statement, per alternative) were fitted on patterns with almost
no partial matches (very rare types: its time is then those costs alone), its cost per partial
match on the uniform and drifting rates; fitted higher, they made the lazy NFAs look several times
cheaper than the batch operator on an AND of rare types where they measure about even. The
mechanisms in Python have a fixed cost too (``PY_FIXED``), measured on the same very rare types.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from matchrec.operators.cer_reference import alternatives, orders

PY_STEP = 1.2e-5  # a partial match tried one at a time in Python (chain, tree)
PY_FIXED = 1e-3  # a mechanism in Python (chain, tree, rcep, eager): its buffers and partitions per statement
STRATEGY_CHECK = 2.0  # chain and tree under next / strict: every candidate also checked exactly at the end
EAGER_STEP = 1e-5  # an extension tried by the eager NFA
EAGER_EVENT = 5e-6  # an event read and offered to the eager NFA's states
TREE_PLAN = 1e-5  # re-planning one instance of the tree
RCEP_STEP = 1e-5  # a partial match built backwards by recomputation
RCEP_BUFFER = 1e-6  # an event buffered by recomputation
BATCH_FIXED = 0.002  # the batch operator's preparation (classes, stream, plan search)
BATCH_ALTERNATIVE = 4e-4  # each alternative (unit) of the batch operator: compiled, planned, evaluated
BATCH_EVENT = 1.5e-7  # an event read by the batch operator
BATCH_STEP = 3e-7  # a partial match in a batch array
BATCH_BLOCK = 1e-4  # one step of one alternative over one stretch of the stream
BATCH_SLICE = 20_000  # events per stretch of the batch operator
MAX_COST = 1e30
DEFAULT_SELECTIVITY = 0.5
EXACT_ORDERS = 6  # up to this many elements every order is costed; beyond, a greedy order


@dataclass(frozen=True)
class Model:
    """What the costs rest on: per variable its candidates (``n``) and its candidates within one
    window of a point (``lam``), per half of the key range; the conditions (variables,
    selectivity); the pattern's events read and strategy."""
    n: tuple  # per half: {var: candidates in that half}
    lam: tuple  # per half: {var: candidates within W of a point}
    share: dict  # var -> share of the rows that are its candidates (strict contiguity)
    conditions: tuple  # (frozenset of vars, selectivity)
    events_read: float
    strategy: str
    counting: bool
    # var -> how much more crowded a Kleene element's reach is where its events are (``Stats.crowding``)
    crowd: dict = field(default_factory=dict)
    # var -> selectivity of the conditions between consecutive events of its Kleene closure (per pair)
    step: dict = field(default_factory=dict)
    # Kleene var -> its expected event sets within one side of the window and within both, averaged
    # over sampled anchors (``estimates.sample_reach``); the rates stand in where it is missing
    sampled: dict = field(default_factory=dict)


def subsets(lam: float, bounds, step: float = 1.0) -> float:
    """Expected event sets of a Kleene element with ``lam`` candidates in reach: sizes within
    bounds, each consecutive pair of a set passing the closure's iteration conditions with
    probability ``step`` (sets of k events: C(lam, k) step^(k-1); of any size ((1 + step)^lam - 1)
    / step, 2^lam - 1 without iteration conditions)."""
    lo, hi = bounds
    lo = max(lo, 1)
    hi = int(min(hi if hi is not None else 64, 64))
    step = min(max(step, 1e-9), 1.0)
    if lam <= 0 or hi < lo:
        return 0.0
    if hi == 64 and lo == 1 and lam < 64:
        return min(MAX_COST, math.expm1(lam * math.log1p(step)) / step)
    total = 0.0
    for k in range(lo, hi + 1):
        sets = math.exp(k * math.log(lam) - math.lgamma(k + 1)) if lam < k else \
            math.exp(math.lgamma(lam + 1) - math.lgamma(k + 1) - math.lgamma(lam - k + 1))
        total += sets * step ** (k - 1)
    return min(MAX_COST, total)


def order_work(model: Model, half: int, elements, before, order, *, kleene_counted=(), attempts_eager=False,
               first_all=None) -> float:
    """Partial matches tried binding ``elements`` (positive, by index) in ``order``: the first
    element's candidates, then per step the partial matches so far times the next element's
    candidates in reach (one side of the window when a bound element must precede or follow it, both
    sides else), a Kleene element's event sets, the conditions' selectivity once their variables
    are bound. ``attempts_eager``: the eager NFA (skip-till-next-match / strict contiguity keep
    one extension per partial match)."""
    n, lam = model.n[half], model.lam[half]
    strategy = model.strategy
    bound: set = set()
    bound_vars: set = set()
    pm = 0.0
    work = 0.0
    applied: set = set()
    for step, i in enumerate(order):
        e = elements[i]
        v = e.var
        related = any((i, j) in before or (j, i) in before for j in bound)
        reach = lam.get(v, 0.0) * (1.0 if related else 2.0)
        if e.kleene is not None and i not in kleene_counted and v in model.sampled:
            reach = model.sampled[v][0 if related else 1]
        elif e.kleene is not None and i not in kleene_counted:
            reach = subsets(lam.get(v, 0.0) * model.crowd.get(v, 1.0), e.kleene, model.step.get(v, 1.0)) * \
                (1.0 if related else 2.0)
        elif e.kleene is not None:
            reach = 1.0  # counted in closed form, not enumerated
        adjacent = strategy == "strict" and any(abs(i - j) == 1 for j in bound)
        if step == 0:
            tried = n.get(v, 0.0) if first_all is None else first_all
            pm = tried
        elif adjacent:
            tried = pm  # the one row next to a bound neighbour
            pm = pm * model.share.get(v, 0.0)
        elif attempts_eager and strategy == "next":
            sel_here = _selectivity(model, bound_vars | {v}, applied, dry=True)
            tried = pm * min(reach, 1.0 / max(sel_here, 1e-9))
            pm = pm * min(1.0, reach * sel_here)
        else:
            tried = pm * reach
            pm = tried
        bound.add(i)
        bound_vars.add(v)
        if not (attempts_eager and strategy == "next" and step):
            pm *= _selectivity(model, bound_vars, applied)
        else:
            _selectivity(model, bound_vars, applied)
        work += tried
        if work > MAX_COST:
            return MAX_COST
    return work


def _selectivity(model: Model, bound_vars: set, applied: set, dry: bool = False) -> float:
    out = 1.0
    for k, (vs, sel) in enumerate(model.conditions):
        if k not in applied and vs <= bound_vars:
            out *= sel
            if not dry:
                applied.add(k)
    return out


def best_order(model: Model, half: int, elements, before, positive, first=None, **kw) -> tuple[list, float]:
    """The cheapest order of ``positive`` (starting with ``first`` when given): every order up to
    ``EXACT_ORDERS`` elements, else greedily the element adding the least work."""
    rest = [i for i in positive if i != first]
    head = [first] if first is not None else []
    if len(positive) <= EXACT_ORDERS:
        best = None
        for perm in itertools.permutations(rest):
            o = head + list(perm)
            w = order_work(model, half, elements, before, o, **kw)
            if best is None or w < best[1]:
                best = (o, w)
        return best
    out = list(head)
    while rest:
        i = min(rest, key=lambda j: order_work(model, half, elements, before, out + [j], **kw))
        out.append(i)
        rest.remove(i)
    return out, order_work(model, half, elements, before, out, **kw)


def rarest_order(model: Model, elements, positive) -> list:
    """The chain's order as the planner hands it to ``cer_lazy`` (``CerPlan.order``): single events
    before Kleene elements, by ascending candidates overall."""
    total = {i: sum(h.get(elements[i].var, 0.0) for h in model.n) for i in positive}
    return sorted(positive, key=lambda i: (elements[i].kleene is not None, total[i], i))


def _alts(root, partial: bool, strategy: str) -> list[tuple]:
    """(elements, before pairs, positive indices) per alternative."""
    out = []
    if partial:
        for alt in orders(root, strategy):
            pos = [i for i, e in enumerate(alt.elements) if not e.negated]
            out.append((alt.elements, alt.before, pos))
    else:
        for chain in alternatives(root):
            m = len(chain)
            before = frozenset((i, j) for i in range(m) for j in range(i + 1, m))
            out.append((chain, before, [i for i, e in enumerate(chain) if not e.negated]))
    return out


def cost_chain(model: Model, root) -> tuple[float, str]:
    total = 0.0
    for elements, before, pos in _alts(root, model.strategy == "any", model.strategy):
        order = rarest_order(model, elements, pos)
        total += sum(order_work(model, h, elements, before, order) for h in range(2))
    factor = 1.0 if model.strategy == "any" else STRATEGY_CHECK
    return PY_FIXED + PY_STEP * factor * total, f"{total:,.0f} partial matches tried, rarest element first"


def cost_tree(model: Model, root) -> tuple[float, str]:
    total = instances = 0.0
    for elements, before, pos in _alts(root, model.strategy == "any", model.strategy):
        singles = [i for i in pos if elements[i].kleene is None]
        anchor = rarest_order(model, elements, singles)[0] if singles else None
        for h in range(2):
            total += best_order(model, h, elements, before, pos, first=anchor)[1]
            if anchor is not None:
                instances += model.n[h].get(elements[anchor].var, 0.0)
    factor = 1.0 if model.strategy == "any" else STRATEGY_CHECK
    return PY_FIXED + PY_STEP * factor * total + TREE_PLAN * instances, \
        f"{total:,.0f} partial matches tried, the order re-planned for {instances:,.0f} instances"


def cost_batch(model: Model, root, countable: bool) -> tuple[float, str]:
    total = 0.0
    steps = 0
    alts = _alts(root, False, "any")
    for elements, before, pos in alts:
        counted = tuple(i for i in pos if elements[i].kleene is not None) if countable else ()
        for h in range(2):
            total += best_order(model, h, elements, before, pos, kleene_counted=counted)[1]
        steps += len(pos)
    stretches = max(1.0, model.events_read / BATCH_SLICE)
    secs = (BATCH_FIXED + BATCH_ALTERNATIVE * len(alts) + BATCH_EVENT * model.events_read + BATCH_STEP * total
            + BATCH_BLOCK * steps * stretches)
    return secs, f"{total:,.0f} partial matches in arrays over {len(alts)} alternative(s), cheapest order each"


def cost_rcep(model: Model, root) -> tuple[float, str]:
    total = 0.0
    buffered = 0.0
    for elements, before, pos in _alts(root, True, "any"):
        # backwards from the last element: the reverse of an order consistent with the pattern
        order = list(reversed(pos))
        counted = tuple(i for n, i in enumerate(pos) if elements[i].kleene is not None and model.counting
                        and 0 < n < len(pos) - 1 and elements[pos[n - 1]].kleene is None
                        and elements[pos[n + 1]].kleene is None)
        total += sum(order_work(model, h, elements, before, order, kleene_counted=counted) for h in range(2))
        buffered += sum(model.n[h].get(elements[i].var, 0.0) for i in pos for h in range(2))
    return PY_FIXED + RCEP_STEP * total + RCEP_BUFFER * buffered, \
        f"{total:,.0f} partial matches tried backwards from each match's last event"


def cost_eager(model: Model, root) -> tuple[float, str]:
    total = 0.0
    for elements, before, pos in _alts(root, False, model.strategy):
        total += sum(order_work(model, h, elements, before, pos, attempts_eager=True) for h in range(2))
    secs = PY_FIXED + EAGER_STEP * total + EAGER_EVENT * model.events_read
    return secs, f"{total:,.0f} extensions tried in the written order, {model.events_read:,.0f} events offered"


COSTS = {"batch": cost_batch, "chain": cost_chain, "tree": cost_tree, "rcep": cost_rcep, "eager": cost_eager}
