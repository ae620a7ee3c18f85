"""Counting the matches of a plain sequence in closed form: ``SEQ(e0, ..., ek-1) ... WITHIN w
RETURN COUNT(*)`` under skip-till-any-match, with no condition between elements, no negation and
no Kleene closure (the elements' types and filters are their classes).

This module owns that count, used by the shared operator's caller (``engine.multi_eval``) for
such units instead of a plan of nodes. The events of the pattern's classes are grouped by
composite key (``cer_shared.Stream``; a match takes at most one event per key, its keys strictly
increasing). Reading the groups in order, a chain is a walk through the states 0..k (elements
matched so far); a group moves a walk from state j to j+1 in as many ways as it holds candidates
of element j, or leaves it. ``P[a][b][x]``, the walks from state a to state b over the first x
groups, are running sums (one per pair a <= b); they are unit upper-triangular matrices, so the
walks over the groups ``[x0, x1)`` are ``inverse(P[x0]) @ P[x1]``, and the inverse's first row
follows from ``P[x0]`` alone. A match is counted at its last event e: the walks from state 0 to
k-1 over the groups with a key in ``[key(e) - w, key(e))``. Every pattern costs a few passes
over its classes' events, whatever the window holds.

The counts are computed in int64 arithmetic, which numpy wraps modulo 2^64: sums and products of
the ring are exact there, so the total is exact when it is below 2^63. A bound certifies that
first (per last event, the product of the other elements' candidates in its window); where it
cannot, ``count`` returns None and the caller evaluates the pattern by nodes (which raises the
BIGINT error of a count past it).
"""
from __future__ import annotations

import numpy as np

__all__ = ["count", "MAX_ELEMENTS"]

MAX_ELEMENTS = 6  # running sums per pattern: k(k+1)/2 arrays the length of its events
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
    last = stream.cks[classes[-1]]
    if k == 1:
        return int(len(last))
    if cheaper and len(last) > SAMPLE:  # (the events of the classes: at least their groups)
        pick = np.linspace(0, len(last) - 1, SAMPLE).astype(np.int64)
        events = sum(len(stream.cks[c]) for c in set(classes))
        if float(_bound(stream, classes, last[pick], w).mean()) * len(last) < events * k * (k - 1) / 2:
            return None  # few matches for many events: see below
    gid, keys = stream.key_groups()
    # the groups (the stream's runs of equal composite keys) holding a candidate of some element
    mark = np.zeros(len(keys), bool)
    for c in set(classes):
        mark[gid[stream.rows[c]]] = True
    at = np.cumsum(mark) - 1
    keys = keys[mark]
    g = len(keys)
    # certified below 2^63 first: a match at e takes, for each class, as many distinct candidates
    # of it among those in [key(e) - w, key(e)) as elements before e have that class (in key
    # order), so the product of those binomials bounds e's matches
    most = float(_bound(stream, classes, last, w).sum())
    if most * (1 + 1e-9) >= LIMIT:
        return None
    if cheaper and most < g * k * (k - 1) / 2:
        # few matches for many events (short partitions, narrow windows): the nodes, which build
        # about as many partial matches as there are matches, cost less than the running sums
        return None
    # cnt[j][x]: candidates of element j in group x
    cnt = [np.bincount(at[gid[stream.rows[c]]], minlength=g).astype(np.int64) for c in classes]
    # P[a, b]: walks from state a to state b (a < b <= k - 1) over the first x groups, x = 0..g
    P: dict = {}
    with np.errstate(over="ignore"):  # int64 wraps modulo 2^64: exact in the ring
        for a in range(k - 1):
            prev = np.ones(g + 1, np.int64)
            for b in range(a + 1, k):
                cur = np.zeros(g + 1, np.int64)
                np.cumsum(cnt[b - 1] * prev[:-1], out=cur[1:])
                P[a, b] = prev = cur
        x0 = np.searchsorted(keys, last - w, "left")  # the first group inside the window
        x1 = at[gid[stream.rows[classes[-1]]]]  # the groups before the last event's
        # the first row of inverse(P[x0]): q[0] = 1, q[b] = -sum over m < b of q[m] P[m, b]
        q = [np.ones(len(last), np.int64)]
        for b in range(1, k):
            s = np.zeros(len(last), np.int64)
            for m in range(b):
                s -= q[m] * P[m, b][x0]
            q.append(s)
        total = q[k - 1].copy()
        for m in range(k - 1):
            total += q[m] * P[m, k - 1][x1]
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
