"""What every CER evaluation mechanism builds on: the preparation of a pattern over its input.

The pattern split into its alternatives, per-element candidate masks, per-partition candidate
positions and keys, the schedule of conditions and negations for an evaluation order, the exact
checks of the rules that cannot be decided while searching (negation ranges, skip-till-next-match
relevance, strict contiguity), the sink that collects matches, and the errors for the limits.

The mechanisms (``cer_eager``, ``cer_lazy``, ``cer_kleene``) import this module; the registry
that names them (``cer_mechanisms``) imports them, so nothing here imports a mechanism.

``AttributeEquality`` is a ``Condition`` that also says *which* column must be equal, so a
mechanism can group candidates by value instead of calling the condition per binding.
"""
from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Callable

import numpy as np

from matchrec import budget
from matchrec.errors import OperationalError
from matchrec.operators.cer_reference import Condition, Element, Events, Order, Pattern, alternatives, orders
from matchrec.operators import cer_columns


_CHUNK = 1 << 15  # matches a sink materializes between two looks at the statement's budget


def too_many_partial(max_partial: int) -> OperationalError:
    return OperationalError(f"The eager NFA holds more than {max_partial} partial matches at once; raise SET "
                            f"matchrec_cer_max_partial_matches, narrow the WITHIN window, or let the planner pick a "
                            f"lazy mechanism (SET matchrec_cer_mechanism = auto), which stores no partial matches")


def too_many(max_matches: int) -> OperationalError:
    return OperationalError(f"The pattern has more than {max_matches} matches; raise SET matchrec_cer_max_matches, "
                            f"or RETURN COUNT(*) to count them without keeping them")


# ---------------------------------------------------------------- conditions with a known column
class AttributeEquality(Condition):
    """All events bound to ``vars`` (every event of a Kleene variable) have equal, non-NULL
    values in ``column`` (an array over the rows). Behaves as any condition for the reference;
    mechanisms may use ``column`` to group candidates."""

    def __init__(self, vars, column, text: str = ""):
        column = np.asarray(column)
        names = frozenset(vars)
        values = column.tolist()  # Python scalars: indexing a list is far cheaper than an array

        def fn(binding: dict) -> bool:
            first = None
            for v in names:
                value = binding[v]
                for r in (value if isinstance(value, tuple) else (value,)):
                    x = values[r]
                    if is_null(x):
                        return False
                    if first is None:
                        first = x
                    elif x != first:
                        return False
            return True

        super().__init__(names, fn, text or " = ".join(f"{v}.attr" for v in sorted(names)))
        self.column = column


def is_null(x) -> bool:
    return x is None or (isinstance(x, (float, np.floating)) and x != x)


def truth(value) -> bool:
    return value is not None and bool(value)


# ---------------------------------------------------------------- preparation
class Prepared:
    """A pattern over one input: candidate masks, partitions and the alternatives' plans.

    ``partial``: the alternatives are ``cer_reference.orders`` (an AND kept as one partial order
    where the strategy and the pattern allow); else the permutation chains of ``alternatives``."""

    def __init__(self, pattern: Pattern, events: Events, partial: bool = False):
        self.pattern = pattern
        self.events = events
        self.window = int(pattern.window)
        self.strategy = pattern.strategy
        n = len(events)
        self.n = n
        self.key = np.asarray(events.key, dtype=np.int64)
        self.keyl: list[int] = self.key.tolist()
        self.types = np.asarray(events.type, dtype=object) if n else np.zeros(0, object)
        if events.partition is None or n == 0:
            order = np.arange(n, dtype=np.int64)
            bounds = np.zeros(0, np.int64)
        else:
            part = np.asarray(events.partition)
            order = np.argsort(part, kind="stable").astype(np.int64)
            bounds = np.flatnonzero(np.diff(part[order])) + 1
        # the partitions' rows one after the other (``order``), partition k at [starts[k], starts[k + 1])
        self._order = order
        self._starts = np.concatenate([[0], bounds, [n]]).astype(np.int64) if n else np.zeros(1, np.int64)
        self.parts = [Partition(self, rows) for rows in np.split(order, bounds) if len(rows)]
        sizes = np.diff(self._starts)
        self.pos = np.empty(n, np.int64)
        self.pos[order] = np.arange(n) - np.repeat(self._starts[:-1], sizes)
        self.posl: list[int] = self.pos.tolist()
        self.part_index = np.empty(n, np.int64)
        self.part_index[order] = np.repeat(np.arange(len(sizes)), sizes)
        self._masks: dict = {}
        alts = orders(pattern.root, pattern.strategy) if partial else alternatives(pattern.root)
        self.chains = [ChainPlan(self, i, alt) for i, alt in enumerate(alts)]
        self.chains = [c for c in self.chains if c.positive]
        # alternatives that can yield the same canonical match must be deduplicated
        by_vars: dict = {}
        for c in self.chains:
            by_vars.setdefault(c.varset, []).append(c)
        for group in by_vars.values():
            for c in group:
                c.shared = len(group) > 1

    def all_cands(self, e: Element) -> list:
        """``Partition.cands(e)`` of every partition (in ``parts``' order), found for all of them at
        once: a statement partitioned by a key with many values has many small partitions."""
        k = (e.type, e.var)
        hit = np.flatnonzero(self.mask(e)[self._order])  # positions in the partitions' row order
        cut = np.searchsorted(hit, self._starts).tolist()
        rows = self._order[hit]
        keys = self.key[rows]
        pos = hit - np.repeat(self._starts[:-1], np.diff(cut))
        lists = (pos.tolist(), keys.tolist(), rows.tolist())
        out = []
        for j, part in enumerate(self.parts):
            c = part._cands.get(k)
            if c is None:
                a, b = cut[j], cut[j + 1]
                c = part._cands[k] = Cands.sliced(pos, keys, rows, lists, a, b)
            out.append(c)
        return out

    def mask(self, e: Element) -> np.ndarray:
        """Rows that ``e`` can take by type and filter (bool array over all rows)."""
        k = (e.type, e.var)
        m = self._masks.get(k)
        if m is not None:
            return m
        m = np.ones(self.n, bool) if e.type is None else (self.types == e.type)
        f = self.pattern.filters.get(e.var)
        if f is not None:
            if isinstance(f, np.ndarray):
                m = m & np.asarray(f, dtype=bool)
            else:
                rows = np.flatnonzero(m)
                ok = np.fromiter((truth(f(int(r))) for r in rows), bool, len(rows))
                m = np.zeros(self.n, bool)
                m[rows[ok]] = True
        self._masks[k] = m
        return m


class Partition:
    """One partition's rows in stream order, and per element the candidates among them."""

    def __init__(self, prep: Prepared, rows: np.ndarray):
        self.prep = prep
        self.rows = rows
        self.rowl: list[int] = rows.tolist()
        self.keys = prep.key[rows]
        self.keyl: list[int] = self.keys.tolist()
        self._cands: dict = {}

    def cands(self, e: Element) -> "Cands":
        k = (e.type, e.var)
        c = self._cands.get(k)
        if c is None:
            m = self.prep.mask(e)[self.rows]
            positions = np.flatnonzero(m)
            c = Cands(positions, self.keys[positions], self.rows[positions])
            self._cands[k] = c
        return c

    def gap(self, k0: int, k1: int) -> tuple[int, int]:
        """Positions of the rows with k0 < key < k1."""
        return bisect_right(self.keyl, k0), bisect_left(self.keyl, k1)


class Cands:
    """Candidate rows of one element in one partition, in key order."""
    __slots__ = ("pos", "keys", "rows", "posl", "keyl", "rowl", "n")

    def __init__(self, pos, keys, rows):
        self.pos, self.keys, self.rows = pos, keys, rows
        self.posl, self.keyl, self.rowl = pos.tolist(), keys.tolist(), rows.tolist()
        self.n = len(self.rowl)

    @classmethod
    def sliced(cls, pos, keys, rows, lists: tuple, a: int, b: int) -> "Cands":
        """Candidates [a, b) of arrays over several partitions (``lists``: the arrays as lists)."""
        c = cls.__new__(cls)
        c.pos, c.keys, c.rows = pos[a:b], keys[a:b], rows[a:b]
        c.posl, c.keyl, c.rowl = lists[0][a:b], lists[1][a:b], lists[2][a:b]
        c.n = b - a
        return c

    def count_between_pos(self, p0: int, p1: int) -> int:
        """Candidates at partition positions [p0, p1)."""
        return bisect_left(self.posl, p1) - bisect_left(self.posl, p0)


@dataclass
class Negation:
    index: int  # element index
    element: Element
    prevs: tuple  # element indices of the latest positive elements before it (its range starts after
    nexts: tuple  # the largest last key among them) / of the earliest after it (ends before the smallest
    linked: list  # first key); empty: a leading / trailing negation. A chain has at most one of each.
    needs: frozenset  # positive variables the linked conditions read

    @property
    def prev(self) -> int | None:
        """The positive neighbour before it in a chain (None: leading)."""
        return _single(self.prevs)

    @property
    def next(self) -> int | None:
        return _single(self.nexts)


def _single(t: tuple):
    if len(t) > 1:
        raise ValueError("a negation of a partial order has several neighbours on one side")
    return t[0] if t else None


class ChainPlan:
    """One alternative of the pattern: a linear chain of elements, or (``partial`` preparation)
    a partial order (``cer_reference.Order``) - then ``total`` is False when some AND is kept as
    one order, ``preds`` / ``succs`` say which positive elements must come before / after each
    one, and ``groups`` holds per such AND its items (positive element indices), whose key spans
    must be pairwise disjoint. ``positive`` lists the positive elements in an order consistent
    with ``preds``; for a chain it is the chain."""

    def __init__(self, prep: Prepared, ident: int, chain):
        self.prep = prep
        self.ident = ident
        alt = chain if isinstance(chain, Order) else Order(
            tuple(chain), frozenset((i, j) for i in range(len(chain)) for j in range(i + 1, len(chain))))
        self.alternative = alt
        chain = alt.elements
        self.elements = chain
        self.positive = [i for i, e in enumerate(chain) if not e.negated]
        self.total = alt.is_chain
        pos = set(self.positive)
        preds: dict = {i: set() for i in self.positive}
        succs: dict = {i: set() for i in self.positive}
        for a, b in alt.before:
            if a in pos and b in pos:
                preds[b].add(a)
                succs[a].add(b)
        self.preds = {i: frozenset(v) for i, v in preds.items()}
        self.succs = {i: frozenset(v) for i, v in succs.items()}
        self.groups = tuple(tuple(frozenset(j for j in item if j in pos) for item in g) for g in alt.apart)
        # the element every other one precedes (it holds the match's last event), if there is one
        last = [i for i in self.positive if len(self.preds[i]) == len(self.positive) - 1]
        self.last_positive = last[0] if last else None
        self.vars = {i: chain[i].var for i in self.positive}
        self.varset = frozenset(self.vars.values())
        self.shared = False
        p = prep.pattern
        self.conditions = [c for c in p.conditions if c.vars <= self.varset]
        self.negations = []
        for i, e in enumerate(chain):
            if not e.negated:
                continue
            before = {j for j in self.positive if (j, i) in alt.before}
            after = {j for j in self.positive if (i, j) in alt.before}
            prevs = tuple(sorted(j for j in before if not self.succs[j] & before))  # the latest ones
            nexts = tuple(sorted(j for j in after if not self.preds[j] & after))  # the earliest ones
            linked = [c for c in p.conditions if e.var in c.vars and c.vars <= self.varset | {e.var}]
            needs = frozenset(v for c in linked for v in c.vars if v != e.var)
            self.negations.append(Negation(i, e, prevs, nexts, linked, needs))
        # skip-till-next-match: conditions that decide whether an event could begin element i
        self.start_conditions = {}
        for n, i in enumerate(self.positive):
            upto = {self.vars[j] for j in self.positive[:n + 1]}
            self.start_conditions[i] = [c for c in p.conditions if self.vars[i] in c.vars and c.vars <= upto]
        if self.total:
            self.next_positive = {a: b for a, b in zip(self.positive, self.positive[1:])}
            self.prev_positive = {b: a for a, b in zip(self.positive, self.positive[1:])}
        else:
            self.next_positive, self.prev_positive = {}, {}  # no chain neighbours (see preds / succs)
        # effective Kleene bounds (a lower bound of 0 means 1, as in the reference)
        self.bounds = {}
        for i in self.positive:
            k = chain[i].kleene
            if k is not None:
                lo, hi = max(1, k[0]), k[1]
                self.bounds[i] = (lo, hi)

    def apart_steps(self, order: list[int]) -> list[list[tuple]]:
        """For an order of binding the positive elements, per step the AND spans to keep apart:
        (steps bound earlier in the element's own item, steps bound earlier in another item of the
        same AND) for every other item that has a bound element. Elements missing from ``order``
        are never bound (their item's span must not depend on them)."""
        at = {i: s for s, i in enumerate(order)}
        out = []
        for s, i in enumerate(order):
            here = []
            for g in self.groups:
                mine = [item for item in g if i in item]
                if not mine:
                    continue
                own = sorted(at[j] for j in mine[0] if at.get(j, s) < s)
                for item in g:
                    if item is mine[0]:
                        continue
                    other = sorted(at[j] for j in item if at.get(j, s) < s)
                    if other:
                        here.append((own, other))
            out.append(here)
        return out

    def element(self, i: int) -> Element:
        return self.elements[i]

    def empty(self) -> bool:
        """An element that can never match (Kleene upper bound below its lower bound)."""
        return any(hi is not None and hi < lo for lo, hi in self.bounds.values())

    def schedule(self, order: list[int], conditions: list | None = None) -> tuple[list, list, list]:
        """For an order of binding the positive elements: per step the conditions (the chain's own,
        or ``conditions``) that become decidable, per step the negations that can be checked (first
        chance: both neighbours and every variable their conditions read are bound), and the
        negations left for the end."""
        if conditions is None:
            conditions = self.conditions
        bound: set = set()
        conds, negs = [], []
        done_c: set = set()
        done_n: set = set()
        for i in order:
            bound.add(self.vars[i])
            now = [c for c in conditions if id(c) not in done_c and c.vars <= bound]
            done_c.update(id(c) for c in now)
            conds.append(now)
            here = []
            for g in self.negations:
                if g.index in done_n or not g.prevs or not g.nexts:
                    continue
                if all(self.vars[j] in bound for j in g.prevs + g.nexts) and g.needs <= bound:
                    here.append(g)
                    done_n.add(g.index)
            negs.append(here)
        rest = [g for g in self.negations if g.index not in done_n]
        return conds, negs, rest


# ---------------------------------------------------------------- exact checks
def first_key(keyl, value) -> int:
    return keyl[value[0]] if isinstance(value, tuple) else keyl[value]


def last_key(keyl, value) -> int:
    return keyl[value[-1]] if isinstance(value, tuple) else keyl[value]


def conditions_hold(conds, binding: dict) -> bool:
    for c in conds:
        if not truth(c.fn(binding)):
            return False
    return True


def negation_holds(prep: Prepared, part: Partition, chain: ChainPlan, g: Negation, binding: dict,
                   first: int | None = None, last: int | None = None) -> bool:
    """No event of the negated element lies in its range (``first``/``last``: the match's first and
    last keys, needed by a leading or trailing negation only)."""
    keyl = prep.keyl
    w = prep.window
    if g.prevs:
        lo = max(last_key(keyl, binding[chain.vars[j]]) for j in g.prevs)
        i0 = bisect_right
    else:
        lo = last - w
        i0 = bisect_left
    if g.nexts:
        hi = min(first_key(keyl, binding[chain.vars[j]]) for j in g.nexts)
        i1 = bisect_left
    else:
        hi = first + w
        i1 = bisect_right
    c = part.cands(g.element)
    a, b = i0(c.keyl, lo), i1(c.keyl, hi)
    if a >= b:
        return True
    if not g.linked:
        return False
    var = g.element.var
    trial = dict(binding)
    try:
        for r in c.rowl[a:b]:
            trial[var] = r
            if conditions_hold(g.linked, trial):
                return False
    finally:
        trial.pop(var, None)
    return True


def strict_holds(prep: Prepared, chain: ChainPlan, binding: dict) -> bool:
    """Strict contiguity on a chain's binding (a partial order is never evaluated under it)."""
    posl = prep.posl
    prev = None
    for i in chain.positive:
        v = binding[chain.vars[i]]
        for r in (v if isinstance(v, tuple) else (v,)):
            q = posl[r]
            if prev is not None and q != prev + 1:
                return False
            prev = q
    return True


def next_holds(prep: Prepared, part: Partition, chain: ChainPlan, binding: dict) -> bool:
    """The skip-till-next-match rule on a binding that satisfies everything else: between
    consecutive events no event could have begun the following element or grown a Kleene one."""
    keyl = prep.keyl
    bound: dict = {}
    stream = []  # (row, element, taken so far, element complete)
    for i in chain.positive:
        v = binding[chain.vars[i]]
        rows = v if isinstance(v, tuple) else (v,)
        for t, r in enumerate(rows, 1):
            stream.append((r, i, t, t == len(rows)))
    for j in range(len(stream) - 1):
        r, i, t, complete = stream[j]
        rn = stream[j + 1][0]
        if complete:
            bound[chain.vars[i]] = binding[chain.vars[i]]
        g0, g1 = part.gap(keyl[r], keyl[rn])
        if g0 >= g1:
            continue
        b = chain.bounds.get(i)
        if b is not None and (b[1] is None or t < b[1]):
            if part.cands(chain.elements[i]).count_between_pos(g0, g1):
                return False
        nxt = chain.next_positive.get(i)
        if nxt is None:
            continue
        if not could_start(part, chain, nxt, bound, g0, g1):
            continue
        return False
    return True


def could_start(part: Partition, chain: ChainPlan, i: int, bound: dict, g0: int, g1: int) -> bool:
    """Whether some event at partition positions [g0, g1) could begin element ``i`` given the
    complete elements in ``bound`` (skip-till-next-match relevance)."""
    c = part.cands(chain.elements[i])
    a, b = bisect_left(c.posl, g0), bisect_left(c.posl, g1)
    if a >= b:
        return False
    if i in chain.bounds:
        return True  # an aggregate over a Kleene variable is decided only when it completes
    var = chain.vars[i]
    conds = [cd for cd in chain.start_conditions[i] if cd.vars <= bound.keys() | {var}]
    if not conds:
        return True
    trial = dict(bound)
    for r in c.rowl[a:b]:
        trial[var] = r
        if conditions_hold(conds, trial):
            return True
    return False


# ---------------------------------------------------------------- where matches go
class Sink:
    """Collects matches (or their number), dropping duplicates between alternatives that bind
    the same variables, and enforces ``max_matches``."""

    def __init__(self, prep: Prepared, *, counting: bool, max_matches: int | None, max_partial: int | None = None):
        self.prep = prep
        self.counting = counting
        self.max = max_matches
        self.max_partial = max_partial
        self.n = 0
        self.kept: list = []
        self.products: list = []  # (binding items, choices) of add_product: every combination is a match
        self.blocks: list = []  # cer_columns.Block of add_block: matches as arrays
        self.sets: dict = {}
        # the statement's step budget: a mechanism charges what it binds or extends (matchrec.budget)
        self.spend = budget.current().spend

    def keeps(self, chain: ChainPlan) -> bool:
        """Whether matches of ``chain`` must be materialized (run, or duplicates to drop)."""
        return not self.counting or chain.shared

    def add(self, chain: ChainPlan, binding: dict) -> None:
        if self.counting and not chain.shared:
            self.n += 1
            return
        m = tuple(sorted(binding.items()))
        if chain.shared:
            s = self.sets.setdefault(chain.varset, set())
            before = len(s)
            s.add(m)
            if len(s) == before:
                return
        else:
            self.kept.append(m)
        self.n += 1
        if self.max is not None and self.n > self.max:
            raise too_many(self.max)

    def add_product(self, chain: ChainPlan, binding: dict, choices: list) -> None:
        """One match per combination of ``choices`` ((variable, its values) each) with the other
        variables bound as in ``binding``: the same as ``add`` once per combination, kept as one
        product (the events before a closure times the closure's sequences, listed together)
        and expanded only by ``matches`` or, without an object per match, ``columns``."""
        n = math.prod(len(values) for _, values in choices)
        if self.counting and not chain.shared:
            self.n += n
            return
        if chain.shared:
            saved = {var: binding[var] for var, _ in choices if var in binding}
            try:
                for combo in itertools.product(*(values for _, values in choices)):
                    for (var, _), v in zip(choices, combo):
                        binding[var] = v
                    self.add(chain, binding)
            finally:
                for var, _ in choices:
                    binding.pop(var, None)
                binding.update(saved)
            return
        if self.max is not None and self.n + n > self.max:
            raise too_many(self.max)
        # kept as one product, expanded column-wise (cer_columns) or into tuples (matches) at the end
        if any(var in binding for var, _ in choices):
            chosen = {var for var, _ in choices}
            items = tuple((v, x) for v, x in binding.items() if v not in chosen)
        else:
            items = tuple(binding.items())
        self.products.append((items, list(choices)))
        self.n += n

    def add_block(self, chain: ChainPlan, binding: dict, spread_var: str, spread_rows: np.ndarray,
                  kleene_var: str, ids: np.ndarray, flat: np.ndarray, offsets: np.ndarray) -> None:
        """Matches given as arrays: match m binds ``spread_var`` to ``spread_rows[m]``,
        ``kleene_var`` to sequence ``ids[m]`` (its rows ``flat[offsets[k]:offsets[k + 1]]``) and
        the other variables as in ``binding``. The sequences need not be distinct."""
        assert not chain.shared and not self.counting
        n = len(ids)
        if self.max is not None and self.n + n > self.max:
            raise too_many(self.max)
        items = tuple((v, x) for v, x in binding.items() if v != spread_var and v != kleene_var)
        self.blocks.append(cer_columns.Block(items, spread_var, spread_rows, kleene_var, ids, flat, offsets))
        self.n += n

    def add_count(self, chain: ChainPlan, n: int) -> None:
        """``n`` matches of a chain whose matches need not be kept."""
        assert self.counting and not chain.shared
        self.n += n

    def matches(self) -> list[tuple]:
        out = self.kept
        for items, choices in self.products:
            order = sorted(set(dict(items)) | {var for var, _ in choices})
            chosen, fixed = dict(choices), dict(items)
            product = itertools.product(*([(var, v) for v in chosen[var]] if var in chosen else ((var, fixed[var]),)
                                          for var in order))
            while True:  # a stop for memory or an interrupt need not wait for it all
                chunk = list(itertools.islice(product, _CHUNK))
                if not chunk:
                    break
                out.extend(chunk)
                self.spend(0)
        self.products = []
        for block in self.blocks:
            out.extend(block.tuples())
            self.spend(0)
        self.blocks = []
        for s in self.sets.values():
            out.extend(s)
        out.sort()
        return out

    def columns(self) -> "cer_columns.MatchColumns":
        """The matches column-wise (``cer_columns``), in no particular order: the products are
        expanded with numpy, never into one tuple per match."""
        kept = self.kept
        for s in self.sets.values():
            kept = kept + list(s)
        return cer_columns.build(kept, self.products, self.spend, self.blocks)

    def total(self) -> int:
        return self.n


Emit = Callable[[dict], None]
