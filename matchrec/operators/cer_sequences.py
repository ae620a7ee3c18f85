"""Counting the matches of a plain sequence in closed form: ``SEQ(e0, ..., ek-1) ... WITHIN w
RETURN COUNT(*)`` under skip-till-any-match, with no condition between elements, no negation and
no Kleene closure (the elements' types and filters are their classes).

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

import numpy as np

__all__ = ["count", "count_closure", "MAX_ELEMENTS"]

MAX_ELEMENTS = 6  # running sums per pattern: k(k-1)/2 arrays the length of an element's candidates
LIMIT = 2.0 ** 62
SAMPLE = 2048  # last events whose bound estimates whether the nodes would cost less
# odd primes below 2^31 (products of two residues fit in int64): a closure's weights are ratios of
# products of (multiplicity + 1), invertible modulo each; the residues give a sum below their
# product, about 2^124, exactly (Chinese remainders)
PRIMES = (2147483647, 2147483629, 2147483587, 2147483579)
MODULUS = math.prod(PRIMES)


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
        pick = np.linspace(0, len(last) - 1, SAMPLE).astype(np.int64) if len(last) > SAMPLE else slice(None)
        if float(_bound(stream, classes, last[pick], w).mean() if len(last) else 0.0) * len(last) \
                < events * k * (k - 1) / 2:
            return None
    # certified below 2^63 first: a match at e takes, for each class, as many distinct candidates
    # of it among those in [key(e) - w, key(e)) as elements before e have that class (in key
    # order), so the product of those binomials bounds e's matches; the classes' whole sizes
    # bound them too, and cost nothing to check
    crude = float(len(last))
    for c in set(classes[:-1]):
        crude *= math.comb(len(stream.cks[c]), classes[:-1].count(c))
    if crude * (1 + 1e-9) >= LIMIT and float(_bound(stream, classes, last, w).sum()) * (1 + 1e-9) >= LIMIT:
        return None
    with np.errstate(over="ignore"):  # int64 wraps modulo 2^64: exact in the ring
        return int(_walks(stream, classes, at or _walk_positions(stream, classes, w)).sum())


def count_closure(stream, classes: list, closure: int, w: int, cheaper: bool = False) -> int | None:
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
    raise the BIGINT error)."""
    k = len(classes)
    if not 1 <= k < MAX_ELEMENTS or not stream.ordered():
        return None
    w = stream.clamp(w)
    at = _walk_positions(stream, classes, w) if k > 1 else None  # searched once for both sums
    plain = count(stream, classes, w, cheaper, at)
    if plain is None:
        return None
    first, last = stream.cks[classes[0]], stream.cks[classes[-1]]
    ck = stream.cks[closure]
    starts = np.flatnonzero(np.r_[True, ck[1:] != ck[:-1]]) if len(ck) else np.zeros(0, np.int64)
    keys = ck[starts]
    factors = np.diff(np.r_[starts, len(ck)]).astype(np.int64) + 1
    logs = np.zeros(len(keys) + 1)
    np.cumsum(np.log2(factors.astype(np.float64)), out=logs[1:])
    to_last = np.searchsorted(keys, last, "right")  # the closure's keys up to each last prefix event
    gain = logs[np.searchsorted(keys, last + w, "right")] - logs[to_last]
    prefixes = _bound(stream, classes, last, w) if k > 1 else np.ones(len(last))
    with np.errstate(over="ignore"):
        most = float((prefixes * np.exp2(np.minimum(gain, 1024.0))).sum())
    if not most * (1 + 1e-9) < float(MODULUS):
        return None
    from matchrec.operators.cer_shared_kernels import prefix_products
    to_end = np.searchsorted(keys, first + w, "right")  # the closure's keys up to each first event's reach
    distinct, which = np.unique(factors, return_inverse=True)  # most keys hold one event: factor 2
    residues = []
    for m in PRIMES:
        inverse = np.array([pow(int(f), m - 2, m) for f in distinct], np.int64)[which]
        products, inverses = prefix_products(factors, inverse, m)
        reach = products[to_end]
        back = inverses[to_last]
        walks = reach if k == 1 else _walks(stream, classes, at, reach, m)
        residues.append(int(((walks * back) % m).sum()) % m)
    total = _chinese(residues) - plain
    return total if total < LIMIT else None


def _walk_positions(stream, classes: list, w: int) -> tuple:
    """The binary searches ``_walks`` reads: per element b from 1, the candidates of
    element b-1 below each of element b's (``below``), below each last event's window (``at0``),
    and element k-2's below each last event (``at1``)."""
    k = len(classes)
    cks = [stream.cks[c] for c in classes]
    last = cks[-1]
    below = [None] + [np.searchsorted(cks[b - 1], cks[b], "left") for b in range(1, k - 1)]
    start = last - w
    at0 = [None] + [np.searchsorted(cks[b - 1], start, "left") for b in range(1, k)]
    return below, at0, np.searchsorted(cks[k - 2], last, "left")


def _walks(stream, classes: list, at: tuple, weights: np.ndarray | None = None, m: int | None = None) -> np.ndarray:
    """Per candidate e of the last element, the chains of the elements before it with keys in
    ``[key(e) - w, key(e))`` (``at``: ``_walk_positions`` for the window ``w``): the walks from state
    0 to k-1 over those keys, ``inverse(P(x0)) @ P(x1)``'s first row read at k-1. ``P[a, b]`` is held
    over element b-1's candidates (``F[a, b][i]``: the walks below its i-th), running sums of
    ``P[a, b-1]`` at each candidate's key. In int64 wrapping modulo 2^64 (the caller certifies the
    total below 2^63), or with ``weights`` (per candidate of the first element, below 2^31: each
    chain weighed by its first event's) modulo ``m``."""
    k = len(classes)
    cks = [stream.cks[c] for c in classes]
    below, at0, at1 = at

    def mod(x):
        if m is not None:
            x %= m
        return x
    F: dict = {}
    for a in range(k - 1):
        F[a, a + 1] = cur = np.zeros(len(cks[a]) + 1, np.int64)
        if a == 0 and weights is not None:
            np.cumsum(weights, out=cur[1:])  # below 2^31 each: no overflow for 2^32 events
        else:
            cur[1:] = np.arange(1, len(cks[a]) + 1)
        mod(cur)
        for b in range(a + 2, k):
            F[a, b] = cur = np.zeros(len(cks[b - 1]) + 1, np.int64)
            np.cumsum(F[a, b - 1][below[b - 1]], out=cur[1:])
            mod(cur)
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
    return mod(total)


def _chinese(residues: list) -> int:
    """The integer below the product of ``PRIMES`` with these residues."""
    x, mod = 0, 1
    for r, m in zip(residues, PRIMES):
        t = ((r - x) * pow(mod, -1, m)) % m
        x += mod * t
        mod *= m
    return x


def _bound(stream, classes: list, last: np.ndarray, w: int) -> np.ndarray:
    """Per last event (its composite key), the product over the other elements' classes of the
    binomial (candidates of the class in its window before it, elements of that class)."""
    bound = np.ones(len(last), np.float64)
    for c in set(classes[:-1]):
        r = classes[:-1].count(c)
        n = (np.searchsorted(stream.cks[c], last, "left")
             - np.searchsorted(stream.cks[c], last - w, "left")).astype(np.float64)
        for i in range(r):
            bound *= np.maximum(n - i, 0.0) / (r - i)
    return bound
