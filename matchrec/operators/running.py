"""Segmented running reductions for column-wise aggregate MEASURES (numba, no Python per row).

Values are laid out one per match slot (``Matches.labels`` order); every reduction restarts at
the first slot of each match and folds the slots left to right, as the expression evaluator
folds a match's rows, so float sums round exactly as the row-by-row evaluation rounds them.
Each kernel returns, per slot, the reduction of the match's slots up to and including it and
the number of values that went into it (NULLs and slots outside the label set are skipped).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def slot_rows(starts, offsets, lengths, n_slots):
    """The chunk row of every slot, -1 for a slot no match covers."""
    rows = np.full(n_slots, -1, np.int64)
    for i in range(offsets.shape[0]):
        base = offsets[i]
        for j in range(lengths[i]):
            rows[base + j] = starts[i] + j
    return rows


@njit(nogil=True, cache=True)
def running_sum(values, use, offsets, lengths):
    """Sums start from the first value, not from zero: -0.0 alone sums to -0.0."""
    acc = np.zeros(values.shape[0], values.dtype)
    cnt = np.zeros(values.shape[0], np.int64)
    if values.shape[0] == 0:
        return acc, cnt
    for i in range(offsets.shape[0]):
        base = offsets[i]
        total = acc[0]
        c = 0
        for j in range(lengths[i]):
            s = base + j
            if use[s]:
                if c == 0:
                    total = values[s]
                else:
                    total = total + values[s]
                c += 1
            acc[s] = total
            cnt[s] = c
    return acc, cnt


@njit(nogil=True, cache=True)
def running_extreme(values, use, offsets, lengths, largest):
    """min (``largest`` False) or max, keeping the first of equal values (0.0 before -0.0 stays
    0.0), with NaN above every number: max is NaN once a NaN is seen, min is NaN only while
    nothing else has been. The third result marks the slots whose reduction is NaN."""
    acc = np.zeros(values.shape[0], values.dtype)
    cnt = np.zeros(values.shape[0], np.int64)
    nan = np.zeros(values.shape[0], np.bool_)
    if values.shape[0] == 0:
        return acc, cnt, nan
    for i in range(offsets.shape[0]):
        base = offsets[i]
        best = acc[0]
        nan_seen = False
        numbers = 0
        c = 0
        for j in range(lengths[i]):
            s = base + j
            if use[s]:
                v = values[s]
                c += 1
                if v != v:
                    nan_seen = True
                elif numbers == 0:
                    best = v
                    numbers += 1
                else:
                    numbers += 1
                    if largest:
                        if v > best:
                            best = v
                    elif v < best:
                        best = v
            acc[s] = best
            nan[s] = nan_seen and (largest or numbers == 0)
            cnt[s] = c
    return acc, cnt, nan
