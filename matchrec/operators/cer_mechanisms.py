"""CER evaluation mechanisms: the registry and the entry points the planner and the engine call.

This module owns ``MECHANISMS`` (each mechanism's name, the function that evaluates, the
strategies it accepts) and ``run``, ``count`` and ``supports``. The mechanisms live in
``cer_eager`` (eager NFA), ``cer_lazy`` (lazy chain and tree NFAs) and ``cer_kleene``
(recomputation for Kleene closure) and are imported here as ordinary modules; what they build
on (candidate masks, partitions, chain plans, the sink) is ``cer_common``, which they import, so
the registry sits above its mechanisms and nothing imports back into it.

Every mechanism returns exactly ``cer_reference.reference_matches``' result.

Conjunction. The alternatives are the permutation chains of ``cer_reference.alternatives``, or
- for a mechanism marked ``partial`` (chain, tree, rcep) unless ``conjunction="permutations"``
is asked - the partial orders of ``cer_reference.orders``: under skip-till-any-match an AND
without a negated element inside is one alternative whose items are unordered among themselves
(``ChainPlan.preds`` / ``succs`` hold only the order SEQ imposes, ``ChainPlan.groups`` the AND
items whose key spans must stay apart), so AND of k items costs one search over k elements
instead of k! chains. Under skip-till-next-match and strict contiguity, for an AND with a negated
element inside, and for the eager NFA (whose states would have to be the subsets of the AND's
items) the permutations remain.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from matchrec.errors import NotSupportedError
from matchrec.operators import cer_eager, cer_kleene, cer_lazy
# AttributeEquality is part of this module's interface: the planner builds it, the mechanisms use it
from matchrec.operators.cer_common import AttributeEquality, Prepared, Sink  # noqa: F401
from matchrec.operators.cer_columns import MatchColumns
from matchrec.operators.cer_reference import Events, Pattern, orders
from matchrec.parser.cer_tree import STRATEGIES

__all__ = ["MECHANISMS", "Mechanism", "run", "run_columns", "count", "supports", "AttributeEquality", "label"]

label = "evaluation mechanisms (eager NFA, lazy chain NFA, tree NFA, recomputation)"


# ---------------------------------------------------------------- the interface
@dataclass(frozen=True)
class Mechanism:
    name: str
    function: Callable  # function(prep, sink, order, **options) of the mechanism's module
    description: str
    strategies: tuple = STRATEGIES
    partial: bool = False  # evaluates an AND as one partial order (cer_reference.orders), not permutations

    def evaluate(self, prep: "Prepared", sink: "Sink", order, options: dict | None = None) -> None:
        self.function(prep, sink, order, **(options or {}))


MECHANISMS: dict[str, Mechanism] = {
    "eager": Mechanism("eager", cer_eager.evaluate, "eager NFA: partial matches extended on every event"),
    "chain": Mechanism("chain", cer_lazy.evaluate_chain,
                       "lazy chain NFA: matches built from the rarest element's events by searching the buffers",
                       partial=True),
    "tree": Mechanism("tree", cer_lazy.evaluate_tree,
                      "tree NFA: the lazy evaluation order re-planned per instance from the counts in its window",
                      partial=True),
    "rcep": Mechanism("rcep", cer_kleene.evaluate,
                      "recomputation: matches built when their last event arrives, Kleene subsets in batch",
                      strategies=("any",), partial=True),
}


def supports(name: str, pattern: Pattern) -> str:
    """'' when mechanism ``name`` evaluates ``pattern`` exactly, else the reason it does not."""
    m = MECHANISMS.get(name)
    if m is None:
        return f"unknown mechanism {name} (one of {', '.join(MECHANISMS)})"
    if pattern.strategy not in STRATEGIES:
        return f"unknown selection strategy {pattern.strategy}"
    if pattern.strategy not in m.strategies:
        return (f"{name} evaluates skip-till-any-match only (the pattern uses "
                f"{STRATEGY_TEXT[pattern.strategy]})")
    try:
        alts = orders(pattern.root)  # the same elements as the permutation chains, far fewer of them
    except TypeError as e:
        return str(e)
    for alt in alts:
        names = [e.var for e in alt.elements]
        if len(set(names)) != len(names):
            return "a variable is bound twice in one alternative of the pattern"
    return ""


STRATEGY_TEXT = {"strict": "strict contiguity", "next": "skip-till-next-match", "any": "skip-till-any-match"}


def run(name: str, pattern: Pattern, events: Events, *, order=None, max_matches: int | None = None,
        max_partial: int | None = None, options: dict | None = None, conjunction: str = "linear") -> list[tuple]:
    """Every match of ``pattern`` in ``events`` (``reference_matches``' format), by mechanism ``name``.

    ``order``: variable names, the evaluation order of the lazy mechanisms (chain; tree plans its
    own). ``options``: mechanism tuning - chain and tree: ``negation`` "first" (default) or "post";
    tree: ``seed`` (a random order per instance, for tests). ``conjunction``: "linear" (default) evaluates an AND
    as one partial order where the mechanism and the pattern allow it (``cer_reference.orders``),
    "permutations" always expands it into the permutations of its items. ``max_partial``: the most
    partial matches a mechanism that stores them (eager) may hold at once, else OperationalError."""
    return _listed(name, pattern, events, order, max_matches, max_partial, options, conjunction).matches()


def _listed(name: str, pattern: Pattern, events: Events, order, max_matches, max_partial, options,
            conjunction: str) -> Sink:
    """The sink holding every match of ``pattern`` by mechanism ``name`` (``run``'s arguments)."""
    mech = _mechanism(name, pattern)
    prep = Prepared(pattern, events, partial=_partial(mech, conjunction))
    sink = Sink(prep, counting=False, max_matches=max_matches, max_partial=max_partial)
    if len(events):
        with collector_paused():
            mech.evaluate(prep, sink, order, options)
    return sink


def run_columns(name: str, pattern: Pattern, events: Events, *, order=None, max_matches: int | None = None,
                max_partial: int | None = None, options: dict | None = None,
                conjunction: str = "linear") -> "MatchColumns":
    """``run``'s matches column-wise (``cer_columns.MatchColumns``, in no particular order): what
    the result builder reads, without a tuple per match where the mechanism lists in bulk."""
    return _listed(name, pattern, events, order, max_matches, max_partial, options, conjunction).columns()


def count(name: str, pattern: Pattern, events: Events, *, order=None, max_matches: int | None = None,
          max_partial: int | None = None, options: dict | None = None, conjunction: str = "linear") -> int:
    """The number of matches, without keeping them where the mechanism can (``max_matches``
    bounds only the matches that must be kept to drop duplicates between alternatives)."""
    mech = _mechanism(name, pattern)
    prep = Prepared(pattern, events, partial=_partial(mech, conjunction))
    sink = Sink(prep, counting=True, max_matches=max_matches, max_partial=max_partial)
    if len(events):
        with collector_paused():
            mech.evaluate(prep, sink, order, options)
    return sink.total()


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused for a mechanism's run: the mechanisms allocate
    many small objects that hold no cycle (row tuples, lists of sequences, partial matches),
    and the collector's passes over them, triggered by the allocations alone, took 30 to 40% of
    a run while freeing nothing. Reference counting still frees everything; a cycle made
    meanwhile is collected after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _partial(mech: Mechanism, conjunction: str) -> bool:
    if conjunction not in ("linear", "permutations"):
        raise ValueError(f"conjunction is 'linear' or 'permutations', not {conjunction!r}")
    return mech.partial and conjunction == "linear"


def _mechanism(name: str, pattern: Pattern) -> Mechanism:
    why = supports(name, pattern)
    if why:
        raise NotSupportedError(f"CER mechanism {name}: {why}")
    return MECHANISMS[name]


