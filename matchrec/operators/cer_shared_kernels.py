"""Compiled loops of the shared operator (``operators.cer_shared``), imported when first needed."""
from __future__ import annotations

import numpy as np
from numba import njit


def count_ranked(rank, a, b, which, lo, hi, per=None):
    """The candidates ``j`` in ``[a[p], b[p])`` with ``lo[c, q] <= rank[c, j] < hi[c, q]`` for every
    column ``c``, where ``q = which[p]`` (the partial match's distinct binding), summed over ``p``;
    ``per``: also each range's own count, written into it."""
    none = np.empty(0, np.int64)
    if per is None:
        return _ranked(rank, a, b, which, lo, hi, none, none, False)
    return _ranked(rank, a, b, which, lo, hi, per, none, True, True)


def list_ranked(rank, a, b, which, lo, hi, parent, at):
    """As ``count_ranked``, but writes each candidate found: its range's index ``p`` into ``parent``
    and ``j`` into ``at`` (both at least as long as the ranges' total). Returns how many."""
    return _ranked(rank, a, b, which, lo, hi, parent, at, True)


@njit(nogil=True, cache=True)
def _ranked(rank, a, b, which, lo, hi, parent, at, write, per_range=False):
    n = 0
    k = rank.shape[0]
    for p in range(a.shape[0]):
        q = which[p]
        n0 = n
        empty = False
        for c in range(k):
            if lo[c, q] >= hi[c, q]:
                empty = True
                break
        if not empty:
            for j in range(a[p], b[p]):
                ok = True
                for c in range(k):
                    r = rank[c, j]
                    if r < lo[c, q] or r >= hi[c, q]:
                        ok = False
                        break
                if ok:
                    if write and not per_range:
                        parent[n] = p
                        at[n] = j
                    n += 1
        if per_range:
            parent[p] = n - n0
    return n
