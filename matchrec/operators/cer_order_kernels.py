"""Compiled loops that put CER matches in the result's order (``cer_columns.MatchColumns.order``),
imported when first needed. ``keys`` is a tuple of equal-length int64 arrays, one per variable,
each at least ``ABSENT``; one pass over them replaces several numpy passes and their temporaries."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def scan(keys, absent):
    """(Each key's maximum, whether ``keys[0]`` is bound and at most every other key in every row)."""
    k = len(keys)
    n = len(keys[0])
    top = np.full(k, absent, np.int64)
    first_least = True
    for i in range(n):
        k0 = keys[0][i]
        if k0 == absent:
            first_least = False
        for c in range(k):
            v = keys[c][i]
            if v > top[c]:
                top[c] = v
            if v < k0:
                first_least = False
    return top, first_least


@njit(nogil=True, cache=True)
def pack(keys, bits, absent):
    """(Each row's keys packed into one integer, ``keys[0]`` in the highest bits, each as
    ``key - absent`` in ``bits[c]`` bits; whether the packed keys do not decrease)."""
    k = len(keys)
    n = len(keys[0])
    out = np.empty(n, np.int64)
    ordered = True
    prev = np.int64(-1)
    for i in range(n):
        p = np.int64(0)
        for c in range(k):
            p = (p << bits[c]) | (keys[c][i] - absent)
        out[i] = p
        if p < prev:
            ordered = False
        prev = p
    return out, ordered


@njit(nogil=True, cache=True)
def unpack(packed, bits, absent):
    """The keys ``pack`` packed, back out of (sorted) ``packed``: a row per key."""
    k = len(bits)
    n = len(packed)
    out = np.empty((k, n), np.int64)
    for i in range(n):
        p = packed[i]
        for c in range(k - 1, -1, -1):
            out[c, i] = (p & ((np.int64(1) << bits[c]) - 1)) + absent
            p >>= bits[c]
    return out
