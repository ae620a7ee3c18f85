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

__all__ = ["count", "MAX_ELEMENTS"]

MAX_ELEMENTS = 6  # running sums per pattern: k(k-1)/2 arrays the length of an element's candidates
LIMIT = 2.0 ** 62
SAMPLE = 2048  # last events whose bound estimates whether the nodes would cost less


def count(stream, classes: list, w: int, cheaper: bool = False) -> int | None:
    """The matches of the sequence whose element j takes the candidates of class ``classes[j]`` of
    ``stream`` (``cer_shared.Stream``; an event may be a candidate of several elements), the last
    event at most ``w`` after the first; None when the count cannot be certified below 2^63 here
    (or the stream's keys are not in row order), or, with ``cheaper``, when the pattern has so few
    matches for its events that evaluating it by nodes should cost less."""
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
        # per element b >= 1: how many candidates of element b-1 lie below each of element b's
        below = [None] + [np.searchsorted(cks[b - 1], cks[b], "left") for b in range(1, k - 1)]
        # F[a, b]: P[a, b] over element b-1's candidates, F[a, b][i] the walks below its i-th
        F: dict = {}
        for a in range(k - 1):
            F[a, a + 1] = np.arange(len(cks[a]) + 1, dtype=np.int64)
            for b in range(a + 2, k):
                F[a, b] = cur = np.zeros(len(cks[b - 1]) + 1, np.int64)
                np.cumsum(F[a, b - 1][below[b - 1]], out=cur[1:])
        start = last - w
        at0 = [None] + [np.searchsorted(cks[b - 1], start, "left") for b in range(1, k)]
        at1 = np.searchsorted(cks[k - 2], last, "left")  # element k-2's candidates below each last event
        # the first row of inverse(P(x0)): q[0] = 1, q[b] = -sum over m < b of q[m] P[m, b](x0)
        q = [np.ones(len(last), np.int64)]
        for b in range(1, k):
            s = np.zeros(len(last), np.int64)
            for m in range(b):
                s -= q[m] * F[m, b][at0[b]]
            q.append(s)
        total = q[k - 1].copy()
        for m in range(k - 1):
            total += q[m] * F[m, k - 1][at1]
        return int(total.sum())


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
