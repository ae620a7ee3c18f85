"""Counting the matches of a sequence in closed form: ``SEQ(e0, ..., ek-1) ... WITHIN w RETURN
COUNT(*)`` under skip-till-any-match, the elements' types and filters being their classes, with
no condition between elements (``count``), followed by a closure ``K+`` with or without negated
elements before it (``count_closure``), or with conditions read as rank intervals and negations
only between ``e0`` and ``e1`` (``count_ranked_pair``: a sweep over those pairs that weighs each
by the running sums below; between the last two, over the stream read backwards, ``Reversed``).

This module owns that count, used by the shared operator's caller (``engine.multi_eval``) for
such units instead of a plan of nodes. The events lie on the composite key axis
(``cer_shared.Stream``); a match takes at most one event per composite key, its keys strictly
increasing. A chain is a walk through the states 0..k (elements matched so far). ``P[a, b](x)``,
the walks from state a to state b over the events with a key below x, are the chains of elements
a..b-1 below x; they form unit upper-triangular matrices, and the walks over the keys in
``[x0, x1)`` are ``inverse(P(x0)) @ P(x1)``, whose first row follows from ``P(x0)`` alone. A match
is counted at its last event e: the walks from state 0 to k-1 over the keys in
``[key(e) - w, key(e))``.

``P[a, b]`` is held over the candidates of element b-1 (its events in key order): running sums of
``P[a, b-1]`` at each candidate's key, read at x by a binary search. Each pattern costs a few passes
over its elements' candidates and binary searches of its last element's, whatever the window holds
and however many other events the stream has.

The counts are computed in int64 arithmetic, which numpy wraps modulo 2^64: sums and products of
the ring are exact there, so the total is exact when it is below 2^63. A bound certifies that
first (per last event, the product of the other elements' candidates in its window; the product
of the classes' sizes when that alone is small enough); where it cannot, ``count`` returns None
and the caller evaluates the pattern by nodes (which raises the BIGINT error of a count past it).
"""
from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["count", "count_closure", "count_between", "count_ranked_pair", "Reversed", "MAX_ELEMENTS"]

MAX_ELEMENTS = 6  # running sums per pattern: k(k-1)/2 arrays the length of an element's candidates
SAMPLE = 2048  # first or last events whose bound estimates whether the nodes would cost less
LIMIT = 2.0 ** 62
# odd primes below 2^31 (products of two residues fit in int64): a closure's weights are ratios of
# products of (multiplicity + 1), invertible modulo each; the residues give a sum below their
# product, about 2^124, exactly (Chinese remainders)
PRIMES = (2147483647, 2147483629, 2147483587, 2147483579)
MODULUS = math.prod(PRIMES)


SEARCHED_MAX = 1 << 23  # positions kept per stream (64 MB): the searches of a workload's statements


def search(stream, into, of: int, offset: int = 0, side: str = "left") -> np.ndarray:
    """``np.searchsorted(stream.cks[into], stream.cks[of] + offset, side)``: the candidates of class
    ``into`` below (or up to) each candidate of class ``of`` moved by ``offset``. Kept on the
    stream: a workload's statements repeat the same classes and windows, so most of their binary
    searches were made by a statement before (``run_many`` counts many statements over one
    stream; a single statement gains nothing and loses nothing). ``into`` may also be a closure's
    class as ``("runs", class)``: its distinct keys (``_closure_factors``)."""
    kept = getattr(stream, "_searched", None)
    if kept is None:
        kept = stream._searched = {"size": 0}
    key = (into, of, offset, side)
    got = kept.get(key)
    if got is None:
        from matchrec.operators.cer_shared_kernels import sorted_search
        keys = _closure_factors(stream, into[1])[0] if isinstance(into, tuple) else stream.cks[into]
        got = sorted_search(keys, stream.cks[of] + offset if offset else stream.cks[of], side)
        if kept["size"] + len(got) <= SEARCHED_MAX:
            got.flags.writeable = False  # read by later statements: no caller may write into it
            kept[key] = got
            kept["size"] += len(got)
    return got


def count(stream, classes: list, w: int, cheaper: bool = False, at: tuple | None = None) -> int | None:
    """The matches of the sequence whose element j takes the candidates of class ``classes[j]`` of
    ``stream`` (``cer_shared.Stream``; an event may be a candidate of several elements), the last
    event at most ``w`` after the first; None when the count cannot be certified below 2^63 here
    (or the stream's keys are not in row order), or, with ``cheaper``, when the pattern has so few
    matches for its events that evaluating it by nodes should cost less. ``at``: the binary
    searches of ``_walk_positions`` for this window, when the caller has them."""
    k = len(classes)
    if not 1 <= k <= MAX_ELEMENTS or not stream.ordered():
        return None
    w = stream.clamp(w)  # a wider window would reach into the next partition on the composite axis
    cks = [stream.cks[c] for c in classes]
    last = cks[-1]
    if k == 1:
        return int(len(last))
    events = sum(len(stream.cks[c]) for c in set(classes))
    if cheaper:
        # few matches for many events (short partitions, narrow windows): the nodes, which build
        # about as many partial matches as there are matches, cost less than the running sums
        if float(_bound(stream, classes, w, _sample(len(last))).mean() if len(last) else 0.0) * len(last) \
                < events * k * (k - 1) / 2:
            return None
    # certified below 2^63 first: a match at e takes, for each class, as many distinct candidates
    # of it among those in [key(e) - w, key(e)) as elements before e have that class (in key
    # order), so the product of those binomials bounds e's matches; the classes' whole sizes
    # bound them too, and cost nothing to check
    crude = float(len(last))
    for c in set(classes[:-1]):
        crude *= math.comb(len(stream.cks[c]), classes[:-1].count(c))
    if crude * (1 + 1e-9) >= LIMIT and float(_bound(stream, classes, w).sum()) * (1 + 1e-9) >= LIMIT:
        return None
    return _walk_sum(stream, classes, at or _walk_positions(stream, classes, w))  # wraps modulo 2^64: exact


def count_closure(stream, classes: list, closure: int, w: int, cheaper: bool = False,
                  gates: tuple = (), trailing: tuple = ()) -> int | None:
    """The matches of ``SEQ(e0, ..., ek-1, K+)``: the plain sequence of ``classes`` (as ``count``)
    followed by a Kleene closure of one or more candidates of class ``closure``, at most one per
    composite key, all after ``ek-1`` and at most ``w`` after ``e0``. A prefix match (first key
    ``x``, last key ``y``) stands for ``R(x + w) / R(y) - 1`` matches, ``R(z)`` the product of
    (multiplicity + 1) over the closure's keys up to ``z``: a weight of its first event times a
    weight of its last, so the sum over prefix matches is ``count``'s walks with the first step
    weighed, in the integers modulo a prime (where those weights are invertible), for each of
    ``PRIMES``, exact once a bound puts the sum below their product (per last prefix event, the
    bound of its prefix matches times ``R(y + w) / R(y)``). None where ``count`` declines the
    prefix, that bound does not hold, or the count is 2^62 or more (the nodes then count it, or
    raise the BIGINT error).

    ``gates``: the classes of negated elements between ``ek-1`` and the closure (``Kleene.gate``):
    a set whose first candidate lies after the first of their events after ``ek-1`` (key ``c``,
    strictly after the prefix's last key ``y``) is no match. Those are the sets of the closure's
    keys in ``(c, x + w]``, ``R(x + w) / R(c) - 1`` of them where ``c < x + w``: the same sums over
    the prefix matches whose first key is at least ``c - w``, with ``c`` for the last event's
    weight, subtracted (the walks over ``[c - w, y)`` instead of ``[y - w, y)``).

    ``trailing``: the classes of negated elements after the closure (at most one of ``gates`` and
    ``trailing``): a set is no match when one of their events lies after its last candidate, up to
    ``x + w``. Where an event of them lies in ``(y, x + w]`` (the same prefix matches as above:
    ``c <= x + w``), the sets lost are those of the closure's keys in ``(y, L)``, ``L`` the last
    such event, ``R(L-) / R(y) - 1``: a weight of the first event (``L`` follows from ``x``) times
    the last's, subtracted over the same walks."""
    k = len(classes)
    if not 1 <= k < MAX_ELEMENTS or not stream.ordered():
        return None
    w = stream.clamp(w)
    at = _walk_positions(stream, classes, w) if k > 1 else None  # searched once for both sums
    plain = count(stream, classes, w, cheaper, at)
    if plain is None:
        return None
    last = stream.cks[classes[-1]]
    _, logs, tables = _closure_factors(stream, closure)
    runs = ("runs", closure)
    to_last = search(stream, runs, classes[-1], 0, "right")  # the closure's keys up to each last prefix event
    gain = logs[search(stream, runs, classes[-1], w, "right")] - logs[to_last]
    prefixes = _bound(stream, classes, w) if k > 1 else np.ones(len(last))
    primes = _primes_for(prefixes, gain)
    if not primes:
        return None
    to_end = search(stream, runs, classes[0], w, "right")  # the closure's keys up to each first event's reach
    if gates and trailing:
        return None
    cut = _gated(stream, classes, closure, w, at, gates or trailing) if gates or trailing else None
    to_lost = _last_before_reach(stream, classes[0], closure, w, trailing) if trailing else None
    residues = []
    for m, (products, inverses) in zip(primes, tables(len(primes))):
        reach = products[to_end]
        back = inverses[to_last]
        walks = reach if k == 1 else _walks(stream, classes, at, reach, m)
        r = int(((walks * back) % m).sum()) % m
        if cut is not None:
            at_c, to_c, has, lost = cut
            # gated: the sets past c, R(x + w) / R(c) - 1; trailing: those before L, R(L-) / R(y) - 1
            first, last_weight = (reach, inverses[to_c]) if gates else (products[to_lost], back)
            walks = first * has if k == 1 else _walks(stream, classes, at_c, first, m)
            r = (r - int(((walks * last_weight) % m * has).sum()) + lost) % m
        residues.append(r)
    total = _chinese(residues) - plain
    return total if total < LIMIT else None


def count_between(stream, classes: list, j: int, closure: int, w: int, cheaper: bool = False) -> int | None:
    """The matches of ``SEQ(e0, ..., ej, K+, ej+1, ..., ek-1)``: the plain sequence of ``classes``
    (as ``count``) with a Kleene closure of one or more candidates of class ``closure`` between
    elements j and j+1, at most one per composite key. A chain whose events j and j+1 have keys
    ``u < v`` stands for ``R(v-) / R(u) - 1`` matches (``count_closure``'s ``R``; ``v-``: the keys
    below ``v``): a weight of event j times a weight of event j+1, so the sum is the walks with
    those two steps weighed, modulo each prime, less the chains. None where ``count`` declines the
    sequence, the bound (per last event, its chains times the factors of the closure's keys in its
    window) needs more than the four primes, or the count is 2^62 or more."""
    k = len(classes)
    if not 2 <= k <= MAX_ELEMENTS or not 0 <= j < k - 1 or not stream.ordered():
        return None
    w = stream.clamp(w)
    at = _walk_positions(stream, classes, w)
    plain = count(stream, classes, w, cheaper, at)
    if plain is None:
        return None
    _, logs, tables = _closure_factors(stream, closure)
    runs = ("runs", closure)
    gain = logs[search(stream, runs, classes[-1], 0, "right")] - logs[search(stream, runs, classes[-1], -w, "left")]
    primes = _primes_for(_bound(stream, classes, w), gain)
    if not primes:
        return None
    to_u = search(stream, runs, classes[j], 0, "right")  # the closure's keys up to event j
    to_v = search(stream, runs, classes[j + 1], 0, "left")  # and below event j+1
    residues = []
    for m, (products, inverses) in zip(primes, tables(len(primes))):
        walks = _walks(stream, classes, at, {j: inverses[to_u], j + 1: products[to_v]}, m)
        residues.append(int(walks.sum()) % m)
    total = _chinese(residues) - plain
    return total if total < LIMIT else None


def _gated(stream, classes: list, closure: int, w: int, at: tuple | None, gates: tuple):
    """``count_closure``'s negated events before the closure: per last prefix event, the walks'
    positions over ``[c - w, y)`` (``c`` the first negated event after it; none where there is no
    such ``c`` or, for a single element, where ``c`` is past the window), the closure's keys up to
    ``c``, whether ``c`` counts, and how many prefix matches have one (each loses 1 from its
    subtracted ``R(x + w) / R(c) - 1``)."""
    last = stream.cks[classes[-1]]
    c = np.full(len(last), np.iinfo(np.int64).max, np.int64)
    for g in gates:
        gk = stream.cks[g]
        if len(gk):
            i = search(stream, g, classes[-1], 0, "right")
            np.minimum(c, np.where(i < len(gk), gk[np.minimum(i, len(gk) - 1)], c), out=c)
    has = c != np.iinfo(np.int64).max
    keys = _closure_factors(stream, closure)[0]
    to_c = np.searchsorted(keys, np.where(has, c, last), "right")
    if len(classes) == 1:  # the prefix is its one event: x = y
        has &= c <= last + w
        return None, to_c, has.astype(np.int64), int(has.sum())
    # no c, or c - w past y (no first event can reach c): an empty range, no walks
    start = np.where(has, np.minimum(c - w, last), last)
    cks = [stream.cks[x] for x in classes]
    at0 = [None] + [np.searchsorted(cks[b - 1], start, "left") for b in range(1, len(classes))]
    at_c = (at[0], at0, at[2])
    lost = _walk_sum(stream, classes, at_c)  # at most the prefix matches: below 2^63
    return at_c, to_c, has.astype(np.int64), lost


def _last_before_reach(stream, first: int, closure: int, w: int, negated: tuple) -> np.ndarray:
    """Per candidate of class ``first`` (key ``x``), the closure's distinct keys below ``L``, the
    last event of the ``negated`` classes up to ``x + w`` (``count_closure``'s trailing negations;
    none where there is no such event: those first events carry no lost sets)."""
    x = stream.cks[first]
    last = np.full(len(x), np.iinfo(np.int64).min, np.int64)
    for g in negated:
        gk = stream.cks[g]
        if len(gk):
            i = search(stream, g, first, w, "right")
            np.maximum(last, np.where(i > 0, gk[np.maximum(i - 1, 0)], last), out=last)
    keys = _closure_factors(stream, closure)[0]
    return np.searchsorted(keys, last, "left")


def _closure_factors(stream, closure: int):
    """A closure's keys (distinct, in order), the running sums of log2 (multiplicity + 1) over them,
    and a function giving, for the first r of ``PRIMES``, the running products of (multiplicity +
    1) and of their inverses modulo each (``R`` of ``count_closure`` and its inverse, after each
    key). Kept on the stream, as ``search``'s positions."""
    kept = getattr(stream, "_closures", None)
    if kept is None:
        kept = stream._closures = {}
    if closure not in kept:
        kept[closure] = _factors(stream.cks[closure])
    return kept[closure]


def key_runs(ck: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs of equal keys of a class's sorted composite keys ``ck``: each run's first
    position and its length, as int64."""
    if not len(ck):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, ck[1:] != ck[:-1]]).astype(np.int64)
    return starts, np.diff(np.r_[starts, len(ck)]).astype(np.int64)


def _factors(ck: np.ndarray):
    """``_closure_factors`` of the composite keys ``ck``."""
    starts, sizes = key_runs(ck)
    keys = ck[starts]
    factors = sizes + 1
    logs = np.zeros(len(keys) + 1)
    np.cumsum(np.log2(factors.astype(np.float64)), out=logs[1:])

    made: list = []
    lock = threading.Lock()  # statements counted on threads ask at once: each prime's table once, in order

    def tables(r: int) -> list:
        from matchrec.operators.cer_shared_kernels import prefix_products
        with lock:
            if len(made) < r:
                distinct, which = np.unique(factors, return_inverse=True)  # most keys hold one event: factor 2
                for m in PRIMES[len(made):r]:
                    inverse = np.array([pow(int(f), m - 2, m) for f in distinct], np.int64)[which]
                    made.append(prefix_products(factors, inverse, m))
            return made[:r]
    return keys, logs, tables


def _primes_for(prefixes: np.ndarray, gain: np.ndarray) -> tuple:
    """The first of ``PRIMES`` whose product exceeds the prefix bounds times 2^gain (the closure's
    largest factor per prefix), summed: their residues give the sum exactly (most counts need two).
    Empty when all four do not suffice."""
    with np.errstate(over="ignore"):
        most = float((prefixes * np.exp2(np.minimum(gain, 1024.0))).sum()) * (1 + 1e-9)
    for r in range(1, len(PRIMES) + 1):
        if most < float(math.prod(PRIMES[:r])):
            return PRIMES[:r]
    return ()


def _walk_positions(stream, classes: list, w: int) -> tuple:
    """The binary searches ``_walks`` reads: per element b from 1, the candidates of
    element b-1 below each of element b's (``below``), below each last event's window (``at0``),
    and element k-2's below each last event (``at1``)."""
    k = len(classes)
    below = [None] + [search(stream, classes[b - 1], classes[b]) for b in range(1, k - 1)]
    at0 = [None] + [search(stream, classes[b - 1], classes[-1], -w) for b in range(1, k)]
    return below, at0, search(stream, classes[k - 2], classes[-1])


def _walk_sum(stream, classes: list, at: tuple) -> int:
    """``int(_walks(stream, classes, at).sum())``, compiled (``cer_shared_kernels.walk_sum``)."""
    from matchrec.operators.cer_shared_kernels import walk_sum
    below, at0, at1 = at
    return walk_sum([len(stream.cks[c]) for c in classes[:-1]], below, at0, at1)


def _walks(stream, classes: list, at: tuple, weights=None, m: int | None = None) -> np.ndarray:
    """Per candidate e of the last element, the chains of the elements before it with keys in
    ``[key(e) - w, key(e))`` (``at``: ``_walk_positions`` for the window ``w``): the walks from state
    0 to k-1 over those keys, ``inverse(P(x0)) @ P(x1)``'s first row read at k-1. ``P[a, b]`` is held
    over element b-1's candidates (``F[a, b][i]``: the walks below its i-th), running sums of
    ``P[a, b-1]`` at each candidate's key. In int64 wrapping modulo 2^64 (the caller certifies the
    total below 2^63), or with ``weights`` (per candidate of the first element, below 2^31: each
    chain weighed by its first event's; or a dict of such weights per element, each chain weighed
    by the product of its events') modulo ``m``. A weight per event is one more step of its
    transfer matrix, still unit upper triangular: the inverse of ``P(x0)`` reads the same."""
    k = len(classes)
    cks = [stream.cks[c] for c in classes]
    below, at0, at1 = at
    weighed = {0: weights} if isinstance(weights, np.ndarray) else dict(weights or {})

    def mod(x):
        if m is not None:
            x %= m
        return x
    F = _running_sums(cks, below, k - 1, m, {j: x for j, x in weighed.items() if j < k - 1})
    # the first row of inverse(P(x0)): q[0] = 1, q[b] = -sum over j < b of q[j] P[j, b](x0)
    q = [np.ones(len(cks[-1]), np.int64)]
    for b in range(1, k):
        s = np.zeros(len(cks[-1]), np.int64)
        for j in range(b):
            s -= mod(q[j] * F[j, b][at0[b]])
        q.append(mod(s))
    total = q[k - 1].copy()
    for j in range(k - 1):
        total += mod(q[j] * F[j, k - 1][at1])
    if k - 1 in weighed:
        total = mod(total) * weighed[k - 1]
    return mod(total)


def _running_sums(cks: list, below: list, top: int, m: int | None = None, weighed: dict | None = None) -> dict:
    """``F[a, b]`` for ``0 <= a < b <= top``: the walks from state a to b below each candidate of
    element b-1 and past the last (``F[a, b][i]``: below its i-th), held over those candidates as
    running sums of ``F[a, b-1]`` at each of them (``below[b]``: element b-1's candidates below each
    of element b's). With ``weighed`` (per element below ``top``, a weight below 2^31 per candidate)
    each walk is weighed by the product of its events' weights, modulo ``m``."""
    weighed = weighed or {}
    F: dict = {}
    for a in range(top):
        F[a, a + 1] = cur = np.zeros(len(cks[a]) + 1, np.int64)
        if a in weighed:
            np.cumsum(weighed[a], out=cur[1:])  # below 2^31 each: no overflow for 2^32 events
        else:
            cur[1:] = np.arange(1, len(cks[a]) + 1)
        if m is not None:
            cur %= m
        for b in range(a + 2, top + 1):
            F[a, b] = cur = np.zeros(len(cks[b - 1]) + 1, np.int64)
            steps = F[a, b - 1][below[b - 1]]
            if b - 1 in weighed:
                steps = steps * weighed[b - 1] % m  # both below m < 2^31
            np.cumsum(steps, out=cur[1:])
            if m is not None:
                cur %= m
    return F


def count_ranked_pair(stream, classes: list, w: int, low: np.ndarray, high: np.ndarray, rank: np.ndarray,
                      distinct: int, cheaper: bool = False, closure: int | None = None,
                      gates: tuple = ()) -> int | None:
    """The matches of ``SEQ(e0, ..., ek-1)`` (as ``count``) with a condition between ``e0`` and
    ``e1`` read as an interval of ranks: the pair holds where the rank of ``e1``'s value
    (``rank``, per candidate of ``classes[1]``; -1 never holds; ``distinct`` ranks in all) lies in
    ``[low, high)`` of ``e0`` (per candidate of ``classes[0]``).

    A pair (x, y) with keys ``x < y <= x + w`` stands for the chains of ``e2..ek-1`` with keys in
    ``(y, x + w]``: the walks from state 2 over ``[y + 1, x + w + 1)``, which the running sums give
    as ``sum over j of q_j(y) p_j(x)`` (``q`` the first row of ``inverse(P(y + 1))``, ``p_j`` the
    column ``P[j, k](x + w + 1)``). So the count is a sum over the pairs of products of a weight of
    each event, found by one sweep in key order: each ``e0`` candidate, while in the window of the
    ``e1`` candidates, adds its weights to the ranks of its interval in a Fenwick tree, and each
    ``e1`` candidate reads the sums at its rank. No pair is built, whatever the window holds.
    int64 wrapping as ``count``: None when no bound certifies the count below 2^63, or (with
    ``cheaper``) when the nodes should cost less.

    With a ``closure`` class, the matches of the sequence followed by ``K+`` as ``count_closure``
    counts them: the same sweep with each ``e0`` candidate's weights times ``R(x + w)`` and each
    chain's last event's times ``1 / R``, modulo each of ``PRIMES``; None where ``count_closure``
    declines.

    ``gates``: the classes of negated elements between ``e0`` and ``e1`` (no event of them with a
    key strictly between the pair's, as ``Node.gates`` reads them): ``x`` not before the last
    such event before ``y``. That bound, like ``y - w``, does not decrease along ``y``, so the
    sweep drops the ``e0`` candidates below it as it goes."""
    k = len(classes)
    if not 2 <= k <= MAX_ELEMENTS - (closure is not None) or not stream.ordered():
        return None
    w = stream.clamp(w)
    kx, ky = stream.cks[classes[0]], stream.cks[classes[1]]
    if not len(kx) or not len(ky):
        return 0
    floor = _pair_floor(stream, classes, w, gates)
    plain = _plain_ranked_pair(stream, classes, w, low, high, rank, distinct, floor, cheaper)
    if plain is None or closure is None:
        return plain
    return _ranked_pair_closure(stream, classes, w, low, high, rank, distinct, closure, plain, floor)


def _pair_floor(stream, classes: list, w: int, gates: tuple) -> np.ndarray:
    """Per candidate ``y`` of ``e1``, the least key of an ``e0`` before it: ``y - w``, or the last
    event of a negated class of ``gates`` before ``y`` (at y's own key: not between)."""
    floor = stream.cks[classes[1]] - w
    for g in gates:
        gk = stream.cks[g]
        if not len(gk):
            continue
        at = search(stream, g, classes[1])
        np.maximum(floor, np.where(at > 0, gk[np.maximum(at - 1, 0)], floor), out=floor)
    return floor


def _plain_ranked_pair(stream, classes: list, w: int, low, high, rank, distinct: int, floor: np.ndarray,
                       cheaper: bool) -> int | None:
    """``count_ranked_pair`` without a closure, the floor found."""
    if _declines(stream, classes, w, cheaper):
        return None
    with np.errstate(over="ignore"):
        return _pair_sums(stream, classes, w, low, high, rank, distinct, floor)


def _declines(stream, classes: list, w: int, cheaper: bool) -> bool:
    """Whether a count from the first element's candidates declines: no bound (the classes' sizes,
    or per first event the binomials of the candidates in its window) certifies it below 2^63,
    or (with ``cheaper``) the nodes should cost less - the matches per first event, estimated on a
    sample, fewer than the work of summing over every element's candidates."""
    k, kx, rest = len(classes), stream.cks[classes[0]], classes[1:]
    if cheaper:
        events = sum(len(stream.cks[c]) for c in set(classes))
        if float(_bound_after(stream, classes[0], rest, w, _sample(len(kx))).mean()) * len(kx) \
                < events * k * (k - 1) / 2:
            return True
    crude = float(len(kx))
    for c in set(rest):
        crude *= math.comb(len(stream.cks[c]), rest.count(c))
    return crude * (1 + 1e-9) >= LIMIT and float(_bound_after(stream, classes[0], rest, w).sum()) * (1 + 1e-9) >= LIMIT


def count_ranked_ends(stream, classes: list, w: int, low: np.ndarray, high: np.ndarray, rank: np.ndarray,
                      distinct: int, cheaper: bool = False, before: tuple = (), after: tuple = ()) -> int | None:
    """The matches of ``SEQ(e0, ..., ek-1)`` (as ``count``) with a condition between the first and
    the last element read as an interval of ranks, as ``count_ranked_pair`` reads one between the
    first two: ``rank`` per candidate of ``classes[-1]``, ``[low, high)`` per candidate of
    ``classes[0]``.

    A pair (x, z) with keys ``x < z <= x + w`` stands for the chains of ``e1..ek-2`` with keys in
    ``(x, z)``: the walks over ``[x + 1, z)``, ``sum over j of q_j(x) p_j(z)`` (``q`` the first
    row of ``inverse(P(x + 1))``, ``p_j`` the column ``P[j, k - 2](z)``), summed by the same sweep.
    None as ``count_ranked_pair``.

    ``before``: classes negated before the first element (no event of them in ``[z - w, x)``):
    the last such event before x, ``c``, must lie below ``z - w``, so x pairs only with the z past
    ``c + w``. ``after``: classes negated after the last (none in ``(z, x + w]``): the first such
    event after z, ``d``, must lie past ``x + w``, so z pairs only with the x below ``d - w``."""
    k = len(classes)
    if not 2 <= k <= MAX_ELEMENTS or not stream.ordered():
        return None
    w = stream.clamp(w)
    kx, kz = stream.cks[classes[0]], stream.cks[classes[-1]]
    if not len(kx) or not len(kz):
        return 0
    if _declines(stream, classes, w, cheaper):
        return None
    start, ceiling = None, None
    for g in before:
        gk = stream.cks[g]
        if len(gk):
            at = search(stream, g, classes[0])  # the negated events below x
            past = np.where(at > 0, gk[np.maximum(at - 1, 0)] + w, kx)
            start = np.maximum(kx if start is None else start, past)
    for g in after:
        gk = stream.cks[g]
        if len(gk):
            at = search(stream, g, classes[-1], 0, "right")  # the negated events up to z
            below_d = np.where(at < len(gk), gk[np.minimum(at, len(gk) - 1)] - w, np.iinfo(np.int64).max)
            ceiling = below_d if ceiling is None else np.minimum(ceiling, below_d)
    mid = classes[1:-1]
    n = len(mid)
    with np.errstate(over="ignore"):
        q = [np.ones(len(kx), np.int64)]
        p = [np.ones(len(kz), np.int64)]
        if n:
            below = [None] + [search(stream, mid[b - 1], mid[b]) for b in range(1, n)]
            F = _running_sums([stream.cks[c] for c in mid], below, n)
            for b in range(1, n + 1):
                at = search(stream, mid[b - 1], classes[0], 0, "right")  # below x + 1
                s = np.zeros(len(kx), np.int64)
                for j in range(b):
                    s -= q[j] * F[j, b][at]
                q.append(s)
            end = search(stream, mid[-1], classes[-1])  # below z
            p = [F[j, n][end] for j in range(n)] + p
        from matchrec.operators.cer_shared_kernels import pair_sweep
        return pair_sweep(kx, low.astype(np.int64), high.astype(np.int64), np.stack(q, axis=1), kz,
                          rank.astype(np.int64), np.stack(p, axis=1), kz - w, distinct, 0, start, ceiling)


def _pair_sums(stream, classes: list, w: int, low, high, rank, distinct: int, floor: np.ndarray,
               first_weights=None, last_weights=None, m: int = 0) -> int:
    """``count_ranked_pair``'s sum: with ``first_weights`` (per ``e0`` candidate) and
    ``last_weights`` (per candidate of the last element) each chain weighed by both, modulo ``m``
    (0: int64 wrapping)."""
    kx, ky = stream.cks[classes[0]], stream.cks[classes[1]]
    mod = m or None
    n = len(classes) - 2  # the elements after the pair
    cks = [stream.cks[c] for c in classes[2:]]
    below = [None] + [search(stream, classes[b + 1], classes[b + 2]) for b in range(1, n)]
    F = _running_sums(cks, below, n, mod, {n - 1: last_weights} if n and last_weights is not None else None)
    # with no element after the pair, its second event is the chain's last
    q = [last_weights if not n and last_weights is not None else np.ones(len(ky), np.int64)]
    for b in range(1, n + 1):
        at = search(stream, classes[b + 1], classes[1], 0, "right")  # below y + 1
        s = np.zeros(len(ky), np.int64)
        for j in range(b):
            s -= q[j] * F[j, b][at]
            if m:
                s %= m
        q.append(s)
    end = search(stream, classes[-1], classes[0], w, "right") if n else None  # below x + w + 1
    p = [F[j, n][end] for j in range(n)] + [np.ones(len(kx), np.int64)]
    if first_weights is not None:
        p = [x * first_weights % m if m else x * first_weights for x in p]
    from matchrec.operators.cer_shared_kernels import pair_sweep
    return pair_sweep(kx, low.astype(np.int64), high.astype(np.int64), np.stack(p, axis=1), ky,
                      rank.astype(np.int64), np.stack(q, axis=1), floor, distinct, m)


def _ranked_pair_closure(stream, classes: list, w: int, low, high, rank, distinct: int, closure: int,
                         plain: int, floor: np.ndarray) -> int | None:
    """``count_ranked_pair`` with a closure after the sequence (``plain``: the count without it)."""
    _, logs, tables = _closure_factors(stream, closure)
    runs = ("runs", closure)
    # per e0 candidate, its prefix matches' bound times the closure's largest factor after it
    to_end = search(stream, runs, classes[0], w, "right")
    gain = logs[to_end] - logs[search(stream, runs, classes[0], 0, "right")]
    primes = _primes_for(_bound_after(stream, classes[0], classes[1:], w), gain)
    if not primes:
        return None
    to_last = search(stream, runs, classes[-1], 0, "right")
    residues = []
    for m, (products, inverses) in zip(primes, tables(len(primes))):
        residues.append(_pair_sums(stream, classes, w, low, high, rank, distinct, floor, products[to_end],
                                   inverses[to_last], m))
    total = _chinese(residues) - plain
    return total if total < LIMIT else None


class Reversed:
    """``stream`` read backwards, for the counts here: each class's composite keys negated, in
    reverse order (its candidates' order reversed). A match of ``SEQ(e0, ..., ek-1)`` is, its
    events taken in reverse, a match of ``SEQ(ek-1, ..., e0)`` here: keys strictly increasing,
    the same span, the same events strictly between each pair."""

    class _Keys(dict):
        def __init__(self, cks):
            super().__init__()
            self.cks = cks

        def __missing__(self, c):
            got = self[c] = -self.cks[c][::-1]
            return got

    def __init__(self, stream):
        self.cks = self._Keys(stream.cks)  # each class's when first read
        self.clamp = stream.clamp
        self.ordered = stream.ordered


def _sample(n: int):
    """An even sample of ``SAMPLE`` of n positions (all of them if fewer)."""
    return np.linspace(0, n - 1, SAMPLE).astype(np.int64) if n > SAMPLE else None


def _bound_after(stream, of: int, classes: list, w: int, pick: np.ndarray | None = None) -> np.ndarray:
    """Per candidate of class ``of`` (a first event; those at ``pick`` only, when given), the
    product over ``classes`` (the elements after it) of the binomial (candidates of the class in
    ``(key, key + w]``, elements of that class)."""
    first = stream.cks[of] if pick is None else stream.cks[of][pick]
    if pick is None:
        return _binomials(classes, len(first), lambda c: search(stream, c, of, w, "right") - search(stream, c, of, 0, "right"))
    return _binomials(classes, len(first), lambda c: np.searchsorted(stream.cks[c], first + w, "right")
                      - np.searchsorted(stream.cks[c], first, "right"))


def _binomials(classes: list, n: int, window) -> np.ndarray:
    """Per event (``n`` of them), the product over the distinct classes ``c`` of ``classes`` of
    the binomial (``window(c)``: the class's candidates in the event's window, how often ``c``
    occurs in ``classes``): a bound of the sequences of those elements in the window."""
    bound = np.ones(n, np.float64)
    for c in set(classes):
        r = classes.count(c)
        within = window(c).astype(np.float64)
        for i in range(r):
            bound *= np.maximum(within - i, 0.0) / (r - i)
    return bound


def _chinese(residues: list) -> int:
    """The integer below the product of the first ``len(residues)`` of ``PRIMES`` with these
    residues."""
    x, mod = 0, 1
    for r, m in zip(residues, PRIMES):
        t = ((r - x) * pow(mod, -1, m)) % m
        x += mod * t
        mod *= m
    return x


def _bound(stream, classes: list, w: int, pick: np.ndarray | None = None) -> np.ndarray:
    """Per candidate of the last element's class (a last event; those at ``pick`` only, when
    given), the product over the other elements' classes of the binomial (candidates of the class
    in its window before it, elements of that class)."""
    last = stream.cks[classes[-1]] if pick is None else stream.cks[classes[-1]][pick]
    if pick is None:
        return _binomials(classes[:-1], len(last), lambda c: search(stream, c, classes[-1]) - search(stream, c, classes[-1], -w))
    return _binomials(classes[:-1], len(last), lambda c: np.searchsorted(stream.cks[c], last, "left")
                      - np.searchsorted(stream.cks[c], last - w, "left"))
