"""Compiled listing of a Kleene closure's sequences for ``cer_kleene`` (imported when first needed):
one trigger's sequences as flat rows plus offsets, and its matches as arrays, no tuple per sequence."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def list_block(succ_off, succ_idx, rows, valid, alo, ahi, spread_rows, cap):
    """The sequences that begin with each ``valid`` candidate and the matches they make.

    Candidates are local indices ``0..m-1`` in key order; candidate j's successors are
    ``succ_idx[succ_off[j]:succ_off[j + 1]]`` (larger indices). A sequence from j is j alone or j
    followed by a sequence from one of its successors. Valid candidate j makes one match per pair
    of a row ``spread_rows[alo[j]:ahi[j]]`` and a sequence from j.

    Returns (flat, offsets, match_rows, match_ids, size): the valid candidates' sequences (as
    ``rows``), per match its spread row and the index of its sequence, and the larger of the
    numbers of matches and of rows listed. Sizes are counted in floating point first: when
    one passes ``cap`` nothing is listed (empty arrays) and ``size`` says how large it was."""
    m = rows.shape[0]
    reach = valid.copy()  # the candidates whose sequences some valid candidate's sequences hold
    for j in range(m):
        if reach[j]:
            for p in range(succ_off[j], succ_off[j + 1]):
                reach[succ_idx[p]] = True
    count = np.zeros(m, np.float64)  # sequences from j
    length = np.zeros(m, np.float64)  # their rows in all
    n_seq, n_flat = 0.0, 0.0
    for j in range(m - 1, -1, -1):
        if not reach[j]:
            continue
        c, t = 1.0, 1.0
        for p in range(succ_off[j], succ_off[j + 1]):
            k = succ_idx[p]
            c += count[k]
            t += length[k] + count[k]
        count[j], length[j] = c, t
        n_seq += c
        n_flat += t
    n_match = 0.0
    for j in range(m):
        if valid[j]:
            n_match += (ahi[j] - alo[j]) * count[j]
    size = max(n_match, n_flat)
    if size > cap:
        e = np.zeros(0, np.int64)
        return e, np.zeros(1, np.int64), e, e, size
    return _listed(succ_off, succ_idx, rows, valid, alo, ahi, spread_rows, reach, count.astype(np.int64),
                   length.astype(np.int64), int(n_seq), int(n_flat), int(n_match), size)


@njit(nogil=True, cache=True)
def _listed(succ_off, succ_idx, rows, valid, alo, ahi, spread_rows, reach, count, length, n_seq, n_flat, n_match,
            size):
    m = rows.shape[0]
    # every reachable candidate's sequences, built from its successors' (the larger ones first)
    first = np.zeros(m, np.int64)  # index of candidate j's first sequence
    seq_off = np.zeros(n_seq + 1, np.int64)
    flat = np.empty(n_flat, np.int64)
    s, f = 0, 0
    for j in range(m - 1, -1, -1):
        if not reach[j]:
            continue
        first[j] = s
        flat[f] = rows[j]
        f += 1
        s += 1
        seq_off[s] = f
        for p in range(succ_off[j], succ_off[j + 1]):
            k = succ_idx[p]
            for q in range(first[k], first[k] + count[k]):
                flat[f] = rows[j]
                f += 1
                for x in range(seq_off[q], seq_off[q + 1]):
                    flat[f] = flat[x]
                    f += 1
                s += 1
                seq_off[s] = f
    # the valid candidates' sequences, and their matches
    out_seq, out_flat = 0, 0
    for j in range(m):
        if valid[j]:
            out_seq += count[j]
            out_flat += length[j]
    out_off = np.zeros(out_seq + 1, np.int64)
    out = np.empty(out_flat, np.int64)
    match_rows = np.empty(n_match, np.int64)
    match_ids = np.empty(n_match, np.int64)
    s, f, n = 0, 0, 0
    for j in range(m):
        if not valid[j]:
            continue
        base = s
        for q in range(first[j], first[j] + count[j]):
            for x in range(seq_off[q], seq_off[q + 1]):
                out[f] = flat[x]
                f += 1
            s += 1
            out_off[s] = f
        for r in range(alo[j], ahi[j]):
            row = spread_rows[r]
            for q in range(count[j]):
                match_rows[n] = row
                match_ids[n] = base + q
                n += 1
    return out, out_off, match_rows, match_ids, size
