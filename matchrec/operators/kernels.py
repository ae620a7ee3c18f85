"""Small compiled helpers for column-wise MEASURES (numba, no Python per row)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def label_extents(labels, offsets, lengths, n_labels):
    """Per match and label: the first and the last slot (relative) carrying it, -1 if none."""
    n = offsets.shape[0]
    first = np.full((n, n_labels), -1, np.int64)
    last = np.full((n, n_labels), -1, np.int64)
    for i in range(n):
        base = offsets[i]
        for j in range(lengths[i]):
            label = labels[base + j]
            if first[i, label] < 0:
                first[i, label] = j
            last[i, label] = j
    return first, last
