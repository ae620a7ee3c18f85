"""Plan a multi-pattern workload: the evaluation order of each pattern and the sub-patterns the
patterns share (Kolchinsky & Schuster, SIGMOD'19: sharing and reordering found together by local
search over multi-pattern plans).

This module owns
  * the canonical form of a sub-pattern: a prefix of a unit's evaluation order (unit: one
    alternative of a pattern, a chain of single-event elements) is described by its elements'
    classes (type and canonical filter text) in binding order, their relative order in the
    sequence, and the canonical text of the conditions among them (variables renamed to their
    binding step). Two prefixes with equal forms have equal sets of partial matches under equal
    windows, so a node of the plan may serve both;
  * the cost model: from arrival rates (candidates of each class per key unit) and condition
    selectivities, a prefix of k elements within window W has about
    ``n_1 * prod_{i>=2} (r_i * W) / (k-1)! * prod(selectivities)`` partial matches; a node costs the
    searches made for its parent's partial matches, the candidates it examines and a fixed
    overhead; a plan costs the sum over its *distinct* nodes (a shared node is paid once, under the
    largest window of the units using it);
  * the local search over plans: simulated annealing and tabu search, from the greedy per-unit
    lazy orders (rarest candidates first, scaled by the selectivity of the conditions linking to
    what is bound), with moves that swap two adjacent elements of an order, re-order a unit so it
    starts with another unit's sub-pattern, or change how deep a unit shares; bounded in time;
  * the plan's node forest for ``operators.cer_shared``.
"""
from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from matchrec.operators import cer_shared as O
from matchrec.parser import sase as S

ROOT_COST = 0.0  # per candidate of a first element (its candidates are a slice of a sorted array)
SEARCH_COST = 1.0  # per partial match of a node's parent (binary searches for its candidate range)
CANDIDATE_COST = 1.0  # per candidate a node examines (gathered, conditions evaluated)
NODE_COST = 300.0  # per node: the fixed cost of one batch step, in partial matches
EXACT_MAX = 9  # units up to this many elements get their best order alone by dynamic programming
PATIENCE = 100  # moves without a better plan (plus 10 per unit) after which a search stops before its budget
PAYOFF_STRETCH = 0.002  # seconds: the shortest stretch of moves ``_Payoff`` judges
PAYOFF_SHARE = 0.05  # ... and a stretch's share of the search budget (a search that finds nothing stops after it)
PLANS_KEPT = 64  # plans whose nodes a workload keeps for costing (the held plan and the greedy ones of recent drifts)


# ---------------------------------------------------------------- canonical texts
def condition_template(e: S.Expr, resolve) -> tuple:
    """The condition's text with resolved column names, variables left as placeholders: a tuple of
    strings and ('var', name) items, rendered per prefix by ``render``."""
    out: list = []
    _canon(e, resolve, out)
    return tuple(out)


def _canon(e, resolve, out: list) -> None:
    if isinstance(e, S.Lit):
        out.append(f"{type(e.value).__name__}:{e.value!r}")
    elif isinstance(e, S.Col):
        out.append(("var", e.var))
        out.append("." + resolve(e) + (f"[{e.index}]" if e.index else ""))  # b[i] and b[i-1] differ
    elif isinstance(e, S.Var):
        out.append(("var", e.var))
    elif isinstance(e, S.Call):
        out.append(e.name + "(")
        for i, a in enumerate(e.args):
            if i:
                out.append(",")
            _canon(a, resolve, out)
        out.append(")")
    elif isinstance(e, S.Cast):
        out.append("cast(")
        _canon(e.arg, resolve, out)
        out.append(" as " + e.type.upper() + ")")
    elif isinstance(e, S.Unary):
        out.append("(" + e.op + " ")
        _canon(e.arg, resolve, out)
        out.append(")")
    elif isinstance(e, S.Binary):
        out.append("(")
        _canon(e.left, resolve, out)
        out.append(" " + e.op + " ")
        _canon(e.right, resolve, out)
        out.append(")")
    elif isinstance(e, S.Logic):
        out.append("(")
        for i, item in enumerate(e.items):
            if i:
                out.append(f" {e.op} ")
            _canon(item, resolve, out)
        out.append(")")
    elif isinstance(e, S.Between):
        out.append("(")
        _canon(e.arg, resolve, out)
        out.append(" not between " if e.negated else " between ")
        _canon(e.lo, resolve, out)
        out.append(" and ")
        _canon(e.hi, resolve, out)
        out.append(")")
    elif isinstance(e, S.IsNull):
        out.append("(")
        _canon(e.arg, resolve, out)
        out.append(" is not null)" if e.negated else " is null)")
    elif isinstance(e, S.InList):
        out.append("(")
        _canon(e.arg, resolve, out)
        out.append(" not in (" if e.negated else " in (")
        for i, item in enumerate(e.items):
            if i:
                out.append(",")
            _canon(item, resolve, out)
        out.append("))")
    else:
        raise TypeError(e)


def render(template: tuple, names: dict) -> str:
    return "".join(p if isinstance(p, str) else f"${names[p[1]]}" for p in template)


# ---------------------------------------------------------------- the optimiser's view of a workload
@dataclass
class CondModel:
    vars: frozenset  # positions in the unit's variables
    template: tuple  # with ('var', position) placeholders
    sel: float = 1.0
    mask: int = field(init=False, default=0)  # the positions as a bit set

    def __post_init__(self):
        self.mask = sum(1 << p for p in self.vars)


@dataclass
class UnitModel:
    classes: list  # class id per position (sequence order)
    conds: list  # CondModel
    window: int  # clamped to the stream
    label: str = ""
    counting: bool = False  # its matches are only counted (the operator may aggregate its partial matches)
    reads: frozenset = frozenset()  # positions its finished matches are checked on (negations, closures)


@dataclass
class Rates:
    counts: list  # candidates per class
    span: float  # key units those counts cover


@dataclass
class Plan:
    orders: list  # per unit: positions in evaluation order
    cuts: list  # per unit: its first ``cut`` nodes may be shared, the others are its own

    def copy(self) -> "Plan":
        return Plan(list(self.orders), list(self.cuts))


@dataclass
class SearchInfo:
    start_cost: float = 0.0
    cost: float = 0.0
    seconds: float = 0.0
    budget: float = 0.0
    method: str = "none"
    details: list = field(default_factory=list)  # (method, best cost, moves)


class Workload:
    """Units and the canonical forms of their prefixes (interned as ints)."""

    def __init__(self, units: list):
        self.units = units
        self._canon: dict = {}
        self._ids: dict = {}
        self._unit_nodes: dict = {}
        self._plan_nodes: dict = {}
        self.by_class: dict = {}
        for u, unit in enumerate(units):
            for c in set(unit.classes):
                self.by_class.setdefault(c, []).append(u)

    def canon(self, u: int, prefix: tuple) -> int:
        k = (u, prefix)
        got = self._canon.get(k)
        if got is not None:
            return got
        unit = self.units[u]
        members = set(prefix)
        ranks = sorted(prefix)
        slot = {p: i for i, p in enumerate(prefix)}
        conds = sorted(render(c.template, slot) for c in unit.conds if c.vars <= members)
        form = (tuple(unit.classes[p] for p in prefix), tuple(ranks.index(p) for p in prefix), tuple(conds))
        got = self._ids.setdefault(form, len(self._ids))
        self._canon[k] = got
        return got

    def node_keys(self, u: int, order: tuple, cut: int) -> list:
        return [self.canon(u, order[:k]) if k <= cut else ("own", u, order[:k], cut) for k in range(1, len(order) + 1)]

    def plan_nodes(self, plan: Plan) -> list:
        """(node key, largest window of its units, a unit, its prefix, the parent's largest window)
        of each node of ``plan``: independent of the rates, so kept for the cost models of the
        slices after it (each drift of the rates costs the plan held and the greedy one again)."""
        k = (tuple(plan.orders), tuple(plan.cuts))
        got = self._plan_nodes.get(k)
        if got is None:
            entries: dict = {}
            for u, (order, cut) in enumerate(zip(plan.orders, plan.cuts)):
                w = self.units[u].window
                for key, prefix, parent in self.unit_nodes(u, order, cut):
                    e = entries.get(key)
                    if e is None:
                        entries[key] = [w, u, prefix, parent]
                    elif w > e[0]:
                        e[0] = w
            got = [(key, w, u, prefix, entries[parent][0] if parent is not None else 0)
                   for key, (w, u, prefix, parent) in entries.items()]
            if len(self._plan_nodes) >= PLANS_KEPT:
                self._plan_nodes.clear()
            self._plan_nodes[k] = got
        return got

    def unit_nodes(self, u: int, order: tuple, cut: int) -> list:
        """(node key, prefix, parent's key) of each node of unit ``u`` in ``order``: independent of the
        rates, so kept here for every cost model of the workload (one per re-plan)."""
        k = (u, order, cut)
        got = self._unit_nodes.get(k)
        if got is None:
            keys = self.node_keys(u, order, cut)
            got = [(key, order[:i + 1], keys[i - 1] if i else None) for i, key in enumerate(keys)]
            self._unit_nodes[k] = got
        return got


class CostModel:
    def __init__(self, work: Workload, rates: Rates):
        self.work = work
        self.counts = [float(c) for c in rates.counts]
        self.span = max(1.0, float(rates.span))
        self._base: dict = {}
        self._set: dict = {}
        self._node: dict = {}
        self._conds: dict = {}
        self._effective: dict = {}
        self._aggregates: dict = {}

    def base(self, u: int, prefix: tuple) -> tuple[float, float]:
        """(partial matches per window^(k-1), selectivity of the conditions the last element adds)."""
        mask = 0
        for p in prefix:
            mask |= 1 << p
        last = prefix[-1]
        k = (u, mask, last)
        got = self._base.get(k)
        if got is not None:
            return got
        value = self._set.get((u, mask))
        conds = self.conds(u)
        if value is None:
            classes = self.work.units[u].classes
            n = [self.counts[classes[p]] for p in prefix]
            value = n[0]
            for x in n[1:]:
                value *= x / self.span
            value /= math.factorial(len(prefix) - 1)
            for cm, sel in conds:
                if cm & mask == cm:
                    value *= sel
            self._set[(u, mask)] = value
        new = 1.0
        for cm, sel in conds:
            if cm & mask == cm and cm >> last & 1:
                new *= sel
        got = self._base[k] = (value, new)
        return got

    def conds(self, u: int) -> list:
        """Unit ``u``'s conditions as (bit set of positions, selectivity), taken once per model."""
        got = self._conds.get(u)
        if got is None:
            got = self._conds[u] = [(c.mask, c.sel) for c in self.work.units[u].conds]
        return got

    def pm(self, u: int, prefix: tuple, w: float) -> float:
        b, _ = self.base(u, prefix)
        full = b * min(float(w), self.span) ** (len(prefix) - 1)
        kept, aggregated = self.effective(u, prefix)
        if kept is prefix or len(kept) == len(prefix):
            return full
        # aggregated: about as many as the partial matches of the elements kept alone
        value = 1.0
        for i, p in enumerate(kept):
            value *= self.counts[self.work.units[u].classes[p]] / (self.span if i else 1.0)
        value /= math.factorial(len(kept) - 1)
        mask = sum(1 << p for p in kept)
        for cm, sel in self.conds(u):
            if cm & mask == cm:
                value *= sel
        return min(full, value * min(float(w), self.span) ** (len(kept) - 1))

    def aggregates(self, u: int) -> bool:
        """Whether some step of unit ``u`` may aggregate (``effective``): a step aggregates only next
        to its neighbour (else the neighbour borders a gap) and with no condition between them;
        most units have none such, and their prefixes are kept whole."""
        got = self._aggregates.get(u)
        if got is None:
            unit = self.work.units[u]
            conds = self.conds(u)
            got = self._aggregates[u] = unit.counting and any(
                not any(cm >> i & 3 == 3 for cm, _ in conds) for i in range(len(unit.classes) - 1))
        return got

    def effective(self, u: int, prefix: tuple) -> tuple[tuple, bool]:
        """The positions whose bindings tell the partial matches of ``prefix`` apart, as the shared
        operator aggregates them (``Evaluator.aggregate_extend``), and whether its last step
        aggregated: for a counted unit, a step that extends the bound elements at one end
        aggregates when neither its own conditions nor a later step reads the neighbour it
        searched from; the partial matches then keep the far end and what later steps read - the
        bound elements next to a gap of unbound ones, those a condition links to an unbound one,
        those the finished matches are checked on."""
        k = (u, prefix)
        got = self._effective.get(k)
        if got is not None:
            return got
        unit = self.work.units[u]
        n = len(unit.classes)
        conds = self.conds(u)
        if not self.aggregates(u):
            got = self._effective[k] = (prefix, False)
            return got
        kept, aggregated = {prefix[0]}, False
        for i in range(1, len(prefix)):
            bound = prefix[:i]
            p = prefix[i]
            lo, hi = min(bound), max(bound)
            aggregated = False
            if p > hi or p < lo:
                near, far = (hi, lo) if p > hi else (lo, hi)
                both = set(bound) | {p}
                mask = sum(1 << q for q in both)
                later = set(unit.reads)
                for q in both:  # next to a gap: the first element bound in it searches from q
                    if (q > 0 and q - 1 not in both) or (q < n - 1 and q + 1 not in both):
                        later.add(q)
                step = set()
                for cm, _ in conds:
                    if cm & ~mask:  # links a bound element to an unbound one
                        later.update(q for q in both if cm >> q & 1)
                    elif cm >> p & 1:
                        step.update(q for q in both if cm >> q & 1 and q != p)
                if near not in later and near not in step:
                    kept = ({far} | ((later | step) & kept)) - {p}
                    kept.add(p)
                    aggregated = True
                    continue
            kept.add(p)
        got = self._effective[k] = (tuple(sorted(kept)), aggregated)
        return got

    def node_cost(self, u: int, prefix: tuple, w: float, parent_w: float) -> float:
        unit = self.work.units[u]
        if len(prefix) == 1:
            return NODE_COST + ROOT_COST * self.counts[unit.classes[prefix[0]]]
        b, new = self.base(u, prefix)
        _, aggregated = self.effective(u, prefix)
        if aggregated:  # built once per group and candidate
            examined = self.pm(u, prefix, w)
        else:
            examined = self.pm(u, prefix, w) / max(new, 1e-9)
        return NODE_COST + SEARCH_COST * self.pm(u, prefix[:-1], parent_w) + CANDIDATE_COST * examined

    def unit_nodes(self, u: int, order: tuple, cut: int) -> list:
        return self.work.unit_nodes(u, order, cut)

    def cost(self, plan: Plan) -> float:
        total = 0.0
        for key, w, u, prefix, pw in self.work.plan_nodes(plan):
            ck = (key, w, pw)
            c = self._node.get(ck)
            if c is None:
                c = self._node[ck] = self.node_cost(u, prefix, w, pw)
            total += c
        return total


# ---------------------------------------------------------------- start plans
def written_orders(work: Workload) -> list:
    return [tuple(range(len(u.classes))) for u in work.units]


def greedy_order(work: Workload, model: CostModel, u: int) -> tuple:
    """The lazy order: first the element with the fewest candidates, then repeatedly the one whose
    candidates times the selectivity of the conditions linking it to what is bound is smallest."""
    unit = work.units[u]
    conds = model.conds(u)
    counts = [model.counts[c] for c in unit.classes]
    left = list(range(len(unit.classes)))
    out: list = []
    bound = 0  # the bound positions as a bit set
    while left:
        best = None
        for p in left:
            bit = 1 << p
            s = counts[p]
            for cm, sel in conds:  # a condition linking p to elements all bound already
                if cm & bit and cm != bit and cm & ~bit & ~bound == 0:
                    s *= sel
            if best is None or (s, p) < best:
                best = (s, p)
        p = best[1]
        out.append(p)
        left.remove(p)
        bound |= 1 << p
    return tuple(out)


def best_order(work: Workload, model: CostModel, u: int) -> tuple:
    """The order of unit ``u`` alone (nothing shared) of least cost: dynamic programming over the
    sets of bound elements (a node's cost depends on its set, its parent's set and its last
    element); the greedy order for units of more than ``EXACT_MAX`` elements. The costs are
    ``CostModel.node_cost``'s, computed per set of elements once (a workload's start plan runs this
    for every unit, so it must not go through the model's per-prefix caches). For a counted unit,
    whose steps at one end of the sequence may aggregate (which the sets do not see), the cheapest
    by the model's node costs of that order, the written one and its reverse."""
    unit = work.units[u]
    k = len(unit.classes)
    if k > EXACT_MAX:
        return greedy_order(work, model, u)
    full = 1 << k
    span = model.span
    reach = min(float(unit.window), span)  # a node's partial matches scale with reach^(size-1)
    n = [model.counts[c] for c in unit.classes]
    conds = [(c.mask, c.sel) for c in unit.conds]
    pm = [0.0] * full  # partial matches of a node binding the set
    size = [0] * full
    for mask in range(1, full):
        low = mask & -mask
        rest = mask ^ low
        size[mask] = size[rest] + 1
        value = n[low.bit_length() - 1]
        for p in range(k):
            if rest >> p & 1:
                value *= n[p] / span
        value /= math.factorial(size[mask] - 1)
        for cm, sel in conds:
            if cm & mask == cm:
                value *= sel
        pm[mask] = value * reach ** (size[mask] - 1)
    best: list = [None] * full
    best[0] = (0.0, ())
    for mask in range(1, full):
        choice = None
        # Sources in ascending order of their set, ties kept by the first: the order found does not
        # depend on how the sets are walked.
        for p in range(k - 1, -1, -1):
            bit = 1 << p
            if not mask & bit:
                continue
            c0, order = best[mask ^ bit]
            if size[mask] == 1:
                step = NODE_COST + ROOT_COST * n[p]
            else:
                new = 1.0
                for cm, sel in conds:
                    if cm & bit and cm & mask == cm:
                        new *= sel
                step = NODE_COST + SEARCH_COST * pm[mask ^ bit] + CANDIDATE_COST * pm[mask] / max(new, 1e-9)
            c = c0 + step
            if choice is None or c < choice[0]:
                choice = (c, order + (p,))
        best[mask] = choice
    found = best[full - 1][1]
    if k < 3 or not model.aggregates(u):
        return found
    # The sets above do not see aggregation (``CostModel.effective``: a counted unit's steps that
    # extend the sequence at one end keep one partial match per group), which depends on the order
    # the elements were bound in, not only on the set; the orders it helps most are the written one
    # and its reverse. The cheapest of the three by the model's own node costs.
    costs = {}
    for order in (found, tuple(range(k)), tuple(range(k - 1, -1, -1))):
        if order not in costs:
            costs[order] = sum(model.node_cost(u, order[:i + 1], unit.window, unit.window if i else 0)
                               for i in range(k))
    return min(costs, key=lambda o: (costs[o], o != found))


def start_plan(work: Workload, model: CostModel, *, share: bool, reorder: bool) -> Plan:
    orders = [greedy_order(work, model, u) for u in range(len(work.units))] if reorder else written_orders(work)
    cuts = [len(o) if share else 0 for o in orders]
    return Plan(orders, cuts)


# ---------------------------------------------------------------- local search
class _Entry:
    __slots__ = ("users", "wmax", "parent", "children", "cost")

    def __init__(self, parent):
        self.users: dict = {}  # unit -> its prefix at this node
        self.wmax = 0
        self.parent = parent
        self.children: set = set()
        self.cost = 0.0


class _State:
    """A plan and its cost, kept up to date as single units change (the search's moves): only the
    moved unit's nodes and the children of nodes whose window changed are costed again."""

    def __init__(self, model: CostModel, plan: Plan):
        self.model = model
        self.units = model.work.units
        self.plan = plan.copy()
        self.nodes: dict = {}
        self.total = 0.0
        for u in range(len(self.units)):
            self._add(u)

    def _cost(self, key) -> float:
        e = self.nodes[key]
        pw = self.nodes[e.parent].wmax if e.parent is not None else 0
        ck = (key, e.wmax, pw)
        c = self.model._node.get(ck)
        if c is None:
            u, prefix = next(iter(e.users.items()))
            c = self.model._node[ck] = self.model.node_cost(u, prefix, e.wmax, pw)
        return c

    def _refresh(self, key, children: bool) -> None:
        e = self.nodes[key]
        c = self._cost(key)
        self.total += c - e.cost
        e.cost = c
        if children:
            for k in e.children:
                self._refresh(k, False)

    def _add(self, u: int) -> None:
        w = self.units[u].window
        for key, prefix, parent in self.model.unit_nodes(u, self.plan.orders[u], self.plan.cuts[u]):
            e = self.nodes.get(key)
            if e is None:
                e = self.nodes[key] = _Entry(parent)
                e.users[u] = prefix
                e.wmax = w
                if parent is not None:
                    self.nodes[parent].children.add(key)
                self._refresh(key, False)
            else:
                e.users[u] = prefix
                if w > e.wmax:
                    e.wmax = w
                    self._refresh(key, True)

    def _remove(self, u: int) -> None:
        for key, _, parent in reversed(self.model.unit_nodes(u, self.plan.orders[u], self.plan.cuts[u])):
            e = self.nodes[key]
            del e.users[u]
            if not e.users:
                self.total -= e.cost
                del self.nodes[key]
                if parent is not None:
                    self.nodes[parent].children.discard(key)
                continue
            w = max(self.units[v].window for v in e.users)
            if w != e.wmax:
                e.wmax = w
                self._refresh(key, True)

    def set(self, u: int, order: tuple, cut: int) -> None:
        self._remove(u)
        self.plan.orders[u] = order
        self.plan.cuts[u] = cut
        self._add(u)


class _Moves:
    def __init__(self, work: Workload, share: bool, reorder: bool, rng: random.Random):
        self.work, self.rng = work, rng
        self.kinds = []
        if reorder:
            self.kinds += ["swap", "swap"]
            if share:
                self.kinds += ["align", "align"]
        if share:
            self.kinds.append("cut")
        self.multi = [u for u, unit in enumerate(work.units) if len(unit.classes) > 1]

    def neighbour(self, plan: Plan):
        """A random move from ``plan``: (unit, its new order, its new cut, the attribute the tabu list
        remembers), or None."""
        rng = self.rng
        kind = rng.choice(self.kinds)
        n = len(self.work.units)
        if kind == "swap":
            if not self.multi:
                return None
            u = rng.choice(self.multi)
            order = list(plan.orders[u])
            i = rng.randrange(len(order) - 1)
            order[i], order[i + 1] = order[i + 1], order[i]
            return u, tuple(order), plan.cuts[u], ("order", u)
        if kind == "cut":
            u = rng.randrange(n)
            k = len(plan.orders[u])
            c = rng.randint(0, k)
            if c == plan.cuts[u]:
                c = k if plan.cuts[u] != k else rng.randint(0, k - 1) if k else 0
            if c == plan.cuts[u]:
                return None
            return u, plan.orders[u], c, ("cut", u)
        u = rng.randrange(n)
        unit = self.work.units[u]
        others = [v for v in self.work.by_class.get(rng.choice(unit.classes), []) if v != u]
        if not others:
            return None
        v = rng.choice(others)
        order = self.align(plan, u, v)
        if order is None or order == plan.orders[u]:
            return None
        return u, order, len(order), ("order", u)

    def align(self, plan: Plan, u: int, v: int):
        """``u``'s order beginning with the longest prefix of ``v``'s order it can share."""
        work = self.work
        ou, ov = plan.orders[u], plan.orders[v]
        cu, cv = work.units[u].classes, work.units[v].classes
        chosen: list = []
        for i in range(min(len(ov), plan.cuts[v])):
            target = work.canon(v, ov[:i + 1])
            found = None
            for p in ou:
                if p in chosen or cu[p] != cv[ov[i]]:
                    continue
                if work.canon(u, tuple(chosen) + (p,)) == target:
                    found = p
                    break
            if found is None:
                break
            chosen.append(found)
        if not chosen:
            return None
        return tuple(chosen) + tuple(p for p in ou if p not in chosen)


def optimise(work: Workload, model: CostModel, start: Plan, *, share: bool, reorder: bool, budget: float,
             seed: int = 0, seconds_per_cost: float = 0.0) -> tuple[Plan, SearchInfo]:
    """The cheapest plan found from ``start`` within ``budget`` seconds. Without sharing the units
    are independent and each gets its best order alone (``best_order``). With sharing: simulated
    annealing from ``start`` for half the budget, then (with reordering) tabu search from the units'
    best orders alone, sharing every common prefix, for the rest (annealing then starts from the
    cheaper of ``start`` and that plan). Never costlier than ``start``. With ``seconds_per_cost`` (the
    evaluation time a unit of cost stands for) a search also stops once a stretch of its moves has
    removed less evaluation time than the stretch took (``_Payoff``)."""
    t0 = time.perf_counter()
    info = SearchInfo(budget=budget)
    best, best_cost = start, model.cost(start)
    info.start_cost = info.cost = best_cost
    if reorder and not share:
        plan = Plan([best_order(work, model, u) for u in range(len(work.units))], list(start.cuts))
        cost = model.cost(plan)
        info.details.append(("exact order per unit", cost, len(work.units)))
        if cost < best_cost:
            best, best_cost, info.method = plan, cost, "exact order per unit"
        info.cost = best_cost
        info.seconds = time.perf_counter() - t0
        return best, info
    rng = random.Random(seed)
    moves = _Moves(work, share, reorder, rng)
    if not moves.kinds or not work.units or budget <= 0:
        info.seconds = time.perf_counter() - t0
        return best, info
    second = start
    if reorder:
        second = Plan([best_order(work, model, u) for u in range(len(work.units))],
                      [len(o) for o in start.orders])
        cost = model.cost(second)
        if cost < best_cost:
            best, best_cost, info.method = second, cost, "best orders alone, shared"
    # Annealing starts from the cheaper of the two plans: from a much costlier start its moves are
    # spent walking towards what the best orders alone already give.
    first = best if reorder else start
    for method, fn, origin in (("simulated annealing", _annealing, first), ("tabu search", _tabu, second)):
        left = budget - (time.perf_counter() - t0)
        if left <= 0:
            break
        plan, steps = fn(model, moves, origin, left / 2 if method != "tabu search" else left,
                         _Payoff(seconds_per_cost, budget))
        cost = model.cost(plan)  # from scratch: the incremental total only guided the search
        info.details.append((method, cost, steps))
        if cost < best_cost:
            best, best_cost, info.method = plan, cost, method
    info.cost = best_cost
    info.seconds = time.perf_counter() - t0
    return best, info


class _Payoff:
    """Whether a search still pays: it stops once a stretch of its moves (``PAYOFF_SHARE`` of the
    budget, at least ``PAYOFF_STRETCH`` seconds) has lowered the best cost by less evaluation time
    than the stretch took. Without a price of cost (``seconds_per_cost`` 0) only the budget and the patience
    stop it."""

    def __init__(self, seconds_per_cost: float, budget: float):
        self.rate = seconds_per_cost
        self.stretch = max(PAYOFF_STRETCH, budget * PAYOFF_SHARE)
        self.mark: tuple | None = None

    def spent(self, now: float, best_cost: float) -> bool:
        if self.rate <= 0:
            return False
        if self.mark is None:
            self.mark = (now, best_cost)
            return False
        t, c = self.mark
        if now - t < self.stretch:
            return False
        if (c - best_cost) * self.rate < now - t:
            return True
        self.mark = (now, best_cost)
        return False


def _annealing(model: CostModel, moves: _Moves, start: Plan, seconds: float, payoff: _Payoff):
    t_start = time.perf_counter()
    t_end = t_start + seconds
    state = _State(model, start)
    cur_cost = state.total
    best, best_cost = state.plan.copy(), cur_cost
    temp0 = max(1e-9, 0.05 * cur_cost / max(1, len(moves.work.units)))
    patience = PATIENCE + 10 * len(moves.work.units)
    steps = since = 0
    rng = moves.rng
    while since < patience:
        now = time.perf_counter()
        if now >= t_end or payoff.spent(now, best_cost):
            break
        mv = moves.neighbour(state.plan)
        steps += 1
        since += 1
        if mv is None:
            continue
        u, order, cut, _ = mv
        old = (state.plan.orders[u], state.plan.cuts[u])
        state.set(u, order, cut)
        cost = state.total
        temp = temp0 * max(1e-3, 1 - (now - t_start) / max(seconds, 1e-9))
        d = cost - cur_cost
        if d <= 0 or rng.random() < math.exp(-d / temp):
            cur_cost = cost
            if cost < best_cost * (1 - 1e-9):
                best, best_cost, since = state.plan.copy(), cost, 0
        else:
            state.set(u, *old)
    return best, steps


def _tabu(model: CostModel, moves: _Moves, start: Plan, seconds: float, payoff: _Payoff, sample: int = 16,
          tenure: int = 8):
    t_end = time.perf_counter() + seconds
    state = _State(model, start)
    best, best_cost = state.plan.copy(), state.total
    tabu: deque = deque(maxlen=tenure)
    patience = max(10, (PATIENCE + 10 * len(moves.work.units)) // sample)
    steps = since = 0
    while since < patience:
        now = time.perf_counter()
        if now >= t_end or payoff.spent(now, best_cost):
            break
        chosen = None
        for _ in range(sample):
            mv = moves.neighbour(state.plan)
            if mv is None:
                continue
            u, order, cut, attr = mv
            old = (state.plan.orders[u], state.plan.cuts[u])
            state.set(u, order, cut)
            cost = state.total
            state.set(u, *old)
            if attr in tabu and cost >= best_cost:
                continue  # tabu unless it beats the best plan (aspiration)
            if chosen is None or cost < chosen[0]:
                chosen = (cost, mv)
        steps += 1
        since += 1
        if chosen is None:
            continue
        cost, (u, order, cut, attr) = chosen
        state.set(u, order, cut)
        tabu.append(attr)
        if cost < best_cost * (1 - 1e-9):
            best, best_cost, since = state.plan.copy(), cost, 0
    return best, steps


# ---------------------------------------------------------------- the plan as operator nodes
def build_nodes(work: Workload, plan: Plan, units: list, class_labels: list) -> list:
    """The forest of ``operators.cer_shared.Node`` for ``plan`` (``units``: the operator's units,
    parallel to ``work.units``)."""
    nodes: dict = {}
    roots: list = []
    for u, unit in enumerate(units):
        order = plan.orders[u]
        parent = None
        for k, key in enumerate(work.node_keys(u, order, plan.cuts[u]), 1):
            node = nodes.get(key)
            if node is None:
                prefix = order[:k]
                p = prefix[-1]
                bound = prefix[:-1]
                before = [q for q in bound if q < p]
                after = [q for q in bound if q > p]
                slot = {unit.vars[q]: i for i, q in enumerate(prefix)}
                conds = [(c, {v: slot[v] for v in c.vars}) for c in unit.conds
                         if unit.vars[p] in c.vars and c.vars <= slot.keys()]
                label = " < ".join(f"{class_labels[unit.classes[q]]} {unit.vars[q]}" for q in sorted(prefix))
                if conds:
                    label += " | " + " AND ".join(c.text for c, _ in conds)
                gates = [(g.cls, p == g.next) for g in unit.gates
                         if p in (g.prev, g.next) and {g.prev, g.next} <= set(prefix)]
                if gates:
                    label += " | " + " AND ".join(
                        f"no {class_labels[c]} between" for c, _ in gates)
                node = O.Node(unit.classes[p], k, bound.index(max(before)) if before else None,
                              bound.index(min(after)) if after else None, unit.window, conds, label=label,
                              gates=gates)
                nodes[key] = node
                (parent.children if parent is not None else roots).append(node)
            node.window = max(node.window, unit.window)
            node.users.append(u)
            parent = node
        parent.finishing.append((u, [order.index(i) for i in range(len(order))]))
    return roots


def walk(roots: list):
    stack = list(reversed(roots))
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


# ---------------------------------------------------------------- selectivity from the stream
def estimate_selectivity(stream: O.Stream, cond: O.Cond, classes: dict, window: int, rng: np.random.Generator,
                         sample: np.ndarray, trials: int, pools: dict | None = None) -> float:
    """The fraction of random bindings that satisfy ``cond``: the first variable's event drawn from
    ``sample`` (row numbers of a sample of the stream) among its class's candidates, each other
    variable's from its class's candidates within the window of it (pairs a match could bind).
    ``pools`` keeps each class's candidates among the sample between calls over one sample."""
    names = sorted(cond.vars)
    first = names[0]
    rows0 = stream.rows[classes[first]]
    pool = pools.get(classes[first]) if pools is not None else None
    if pool is None:
        # both sorted and unique: a binary search per sampled row, not a sort of the class's rows
        at = np.minimum(np.searchsorted(rows0, sample), max(len(rows0) - 1, 0))
        pool = sample[rows0[at] == sample] if len(rows0) else rows0
        if len(pool) == 0:
            pool = rows0
        if pools is not None:
            pools[classes[first]] = pool
    if len(pool) == 0:
        return 1.0
    anchor = pool[rng.integers(0, len(pool), trials)]
    ck0 = stream.ck[anchor]
    w = stream.clamp(window)
    b = {first: anchor}
    ok = np.ones(trials, bool)
    for v in names[1:]:
        ck, rows = stream.cks[classes[v]], stream.rows[classes[v]]
        a = np.searchsorted(ck, ck0 - w, "left")
        z = np.searchsorted(ck, ck0 + w, "right")
        has = z > a
        ok &= has
        pick = a + (rng.random(trials) * np.maximum(z - a, 1)).astype(np.int64)
        b[v] = rows[np.minimum(pick, max(len(rows) - 1, 0))] if len(rows) else np.zeros(trials, np.int64)
    if not ok.any():
        return 1.0
    b = {v: r[ok] for v, r in b.items()}
    try:
        hits = cond.holds(b)
    except Exception:  # noqa: BLE001 - an estimate: a condition failing on a random binding counts as false
        return 0.5
    return max(float(hits.mean()), 0.5 / trials)
