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
def _empty(lo, hi, q):
    """Whether binding ``q``'s rank interval is empty in some column."""
    for c in range(lo.shape[0]):
        if lo[c, q] >= hi[c, q]:
            return True
    return False


@njit(nogil=True, cache=True)
def _inside(rank, lo, hi, q, j):
    """Whether candidate ``j``'s ranks lie in binding ``q``'s intervals in every column."""
    for c in range(rank.shape[0]):
        r = rank[c, j]
        if r < lo[c, q] or r >= hi[c, q]:
            return False
    return True


@njit(nogil=True, cache=True)
def _ranked(rank, a, b, which, lo, hi, parent, at, write, per_range=False):
    n = 0
    for p in range(a.shape[0]):
        q = which[p]
        n0 = n
        if not _empty(lo, hi, q):
            for j in range(a[p], b[p]):
                if _inside(rank, lo, hi, q, j):
                    if write and not per_range:
                        parent[n] = p
                        at[n] = j
                    n += 1
        if per_range:
            parent[p] = n - n0
    return n


def ranked_then_counted(rank, a, b, which, lo, hi, ck, first, after, end, pm_lo, pm_hi, window, slice_lo,
                        slice_first, steps, base, sums, floored_sums, cut, floored_cut, stop, per):
    """A ranked step followed by ``steps`` (1 or 2) plain steps ending in a counted leaf, without
    building what follows the partial matches: per partial match ``p``, over its candidates ``j`` in
    ``[a[p], b[p])`` whose ranks pass (as ``count_ranked``), the next step's candidates from
    ``after[j - first]`` to ``end[p]`` - counted (one step), or each weighed by the last step's
    candidates from its own start to ``stop[p]`` (two steps: ``sums`` are running sums of those
    starts over the middle candidates from ``base`` on, ``cut[p]`` the first middle candidate whose
    range is empty; ``floored_*`` the same with the starts not before ``slice_first``) - summed into
    ``per[p]``. A pair whose span (``pm_lo[p]`` to ``max(pm_hi[p], ck[j])``) exceeds ``window``
    counts nothing; a pair ending before ``slice_lo`` counts only last events from ``slice_first``
    on (one step: the floor; two: the floored sums)."""
    _ranked_then_counted(rank, a, b, which, lo, hi, ck, first, after, end, pm_lo, pm_hi, np.int64(window),
                         np.int64(slice_lo), np.int64(slice_first), steps, np.int64(base), sums, floored_sums,
                         cut, floored_cut, stop, per)


@njit(nogil=True, cache=True)
def _ranked_then_counted(rank, a, b, which, lo, hi, ck, first, after, end, pm_lo, pm_hi, window, slice_lo,
                         slice_first, steps, base, sums, floored_sums, cut, floored_cut, stop, per):
    for p in range(a.shape[0]):
        q = which[p]
        total = 0
        if not _empty(lo, hi, q):
            e = end[p]
            low = pm_lo[p]
            high = pm_hi[p]
            for j in range(a[p], b[p]):
                if not _inside(rank, lo, hi, q, j):
                    continue
                h = ck[j] if ck[j] > high else high
                if h - low > window:
                    continue
                start = after[j - first]
                if steps == 1:
                    if h < slice_lo and start < slice_first:
                        start = slice_first
                    if e > start:
                        total += e - start
                elif h < slice_lo:
                    t = floored_cut[p] if floored_cut[p] < e else e
                    if t > start:
                        total += (t - start) * stop[p] - (floored_sums[t - base] - floored_sums[start - base])
                else:
                    t = cut[p] if cut[p] < e else e
                    if t > start:
                        total += (t - start) * stop[p] - (sums[t - base] - sums[start - base])
        per[p] = total


def prefix_products(factors, inverses, m):
    """Running products modulo ``m`` of ``factors`` and of their ``inverses`` (modulo ``m``), each
    starting at 1: both arrays one longer than ``factors``."""
    n = factors.shape[0]
    products = np.ones(n + 1, np.int64)
    back = np.ones(n + 1, np.int64)
    _prefix_products(factors, inverses, np.int64(m), products, back)
    return products, back


@njit(nogil=True, cache=True)
def _prefix_products(factors, inverses, m, products, back):
    for i in range(factors.shape[0]):
        products[i + 1] = products[i] * (factors[i] % m) % m
        back[i + 1] = back[i] * inverses[i] % m


def tied_runs(sizes):
    """Prefix tables over a class's runs of equal keys (``sizes``: candidates per run) for
    ``tied_any_size``: per prefix of runs, the exponent of 2 and the odd part (modulo 2^64) of the
    product of (size + 1), the inverse of that odd part modulo 2^64, and the sum of log2 (size + 1)."""
    n = sizes.shape[0]
    twos = np.zeros(n + 1, np.int64)
    odd = np.ones(n + 1, np.uint64)
    inv = np.ones(n + 1, np.uint64)
    logs = np.zeros(n + 1, np.float64)
    _tied_runs(sizes, twos, odd, inv, logs)
    return twos, odd, inv, logs


@njit(nogil=True, cache=True)
def _tied_runs(sizes, twos, odd, inv, logs):
    two = np.uint64(2)
    for r in range(sizes.shape[0]):
        f = sizes[r] + 1
        e = 0
        while f % 2 == 0:
            f //= 2
            e += 1
        o = np.uint64(f)
        y = o  # an odd number is its own inverse modulo 8; each Newton step doubles the bits
        for _ in range(5):
            y = y * (two - o * y)
        twos[r + 1] = twos[r] + e
        odd[r + 1] = odd[r] * o
        inv[r + 1] = inv[r] * y
        logs[r + 1] = logs[r] + np.log2(sizes[r] + 1.0)


def tied_any_size(rid, starts, sizes, twos, odd, inv, logs, a, b, out, bits):
    """Sets of any size, at most one candidate per key, of each range ``[a[i], b[i])`` of a class's
    candidates (``rid``: each candidate's run of equal keys; ``starts``, ``sizes``: the runs'; the
    rest ``tied_runs``): the product over the runs the range meets of (its candidates in the range
    + 1), less one, into ``out``, and an upper bound of its log2 into ``bits``. The runs wholly
    inside the range are one product of prefixes: the powers of 2 by their exponents, the odd
    parts by the inverse modulo 2^64 of the prefix before - exact, since only products below 2^60
    (by the logs) are computed; elsewhere ``out`` 0 and ``bits`` infinity (the caller counts those
    exactly)."""
    _tied_any_size(rid, starts, sizes, twos, odd, inv, logs, a, b, out, bits)


@njit(nogil=True, cache=True)
def _tied_any_size(rid, starts, sizes, twos, odd, inv, logs, a, b, out, bits):
    for i in range(a.shape[0]):
        lo = a[i]
        hi = b[i]
        if hi <= lo:
            out[i] = 0
            bits[i] = 0.0
            continue
        r0 = rid[lo]
        r1 = rid[hi - 1]
        if r0 == r1:
            out[i] = hi - lo
            bits[i] = np.log2(hi - lo + 1.0) + 1e-6
            continue
        m0 = starts[r0] + sizes[r0] - lo + 1
        m1 = hi - starts[r1] + 1
        est = logs[r1] - logs[r0 + 1] + np.log2(m0 * 1.0) + np.log2(m1 * 1.0)
        if est >= 60.0:
            out[i] = 0
            bits[i] = np.inf
            continue
        mid = np.int64(odd[r1] * inv[r0 + 1]) << (twos[r1] - twos[r0 + 1])
        out[i] = m0 * m1 * mid - 1
        bits[i] = est + 1e-6


def pair_sweep(kx, low, high, bw, ky, rank, aw, floor, distinct, m=0, start=None, ceiling=None):
    """The sum over pairs (x, y) - ``x`` a candidate with key ``kx[x]`` and rank interval
    ``[low[x], high[x])``, ``y`` one with key ``ky[y]`` and rank ``rank[y]`` (-1: none) - with
    ``floor[y] <= kx[x] < ky[y]`` (``floor`` not decreasing) and ``rank[y]`` in x's interval, of
    ``sum over c of bw[x, c] * aw[y, c]``, in int64 wrapping: one pass in key order, the x in the window of the current y
    held in a Fenwick tree over the ranks (``distinct`` of them) as their weights added at
    ``low`` and taken back at ``high``. With ``m`` (below 2^31, the weights reduced modulo it), the
    sum modulo ``m``: the tree's sums stay below 2^62 unreduced (fewer than 2^31 weights below
    2^31), so only each read is reduced. Where every interval holds one rank at most (an
    equality), the tree is a plain array: one add and one read each.

    ``start`` (per x, not decreasing, at least ``kx``): x pairs only with the y past it, not just
    past ``kx[x]``; ``ceiling`` (per y, not decreasing): y pairs only with the x below it. Both
    keep the pass in key order: an x enters once the current y passes its start and its key lies
    below the current y's ceiling, which later y do not lower."""
    point = bool(((high - low) <= 1).all())
    start = kx if start is None else start
    ceiling = np.full(len(ky), np.iinfo(np.int64).max, np.int64) if ceiling is None else ceiling
    return int(_pair_sweep(kx, low, high, bw, ky, rank, aw, floor, np.int64(distinct), np.int64(m), point,
                           start, ceiling))


@njit(nogil=True, cache=True)
def _fenwick_add(tree, at, weights, x, sign, size, point):
    if point:
        for c in range(weights.shape[1]):
            tree[at + 1, c] += sign * weights[x, c]
        return
    i = at + 1
    while i <= size:
        for c in range(weights.shape[1]):
            tree[i, c] += sign * weights[x, c]
        i += i & -i


@njit(nogil=True, cache=True)
def _pair_sweep(kx, low, high, bw, ky, rank, aw, floor, distinct, m, point, start, ceiling):
    tree = np.zeros((distinct + 1, bw.shape[1]), np.int64)
    nx = kx.shape[0]
    entered = 0
    left = 0
    total = 0
    for j in range(ky.shape[0]):
        y = ky[j]
        while entered < nx and start[entered] < y and kx[entered] < ceiling[j]:
            if low[entered] < high[entered]:
                _fenwick_add(tree, low[entered], bw, entered, 1, distinct, point)
                if not point:
                    _fenwick_add(tree, high[entered], bw, entered, -1, distinct, point)
            entered += 1
        while left < entered and kx[left] < floor[j]:
            if low[left] < high[left]:
                _fenwick_add(tree, low[left], bw, left, -1, distinct, point)
                if not point:
                    _fenwick_add(tree, high[left], bw, left, 1, distinct, point)
            left += 1
        r = rank[j]
        if r < 0:
            continue
        for c in range(aw.shape[1]):
            if point:
                s = tree[r + 1, c]
            else:
                s = 0
                i = r + 1
                while i > 0:
                    s += tree[i, c]
                    i -= i & -i
            if m:
                total = (total + (s % m) * aw[j, c]) % m
            else:
                total += s * aw[j, c]
    return total


def sorted_search(a: np.ndarray, v: np.ndarray, side: str = "left") -> np.ndarray:
    """``np.searchsorted(a, v, side)``, faster where ``v`` does not decrease (the composite keys of a
    class's candidates, moved by a window): each search gallops on from the one before, a few steps
    through ``a`` instead of a whole binary search (about twice as fast as numpy's on 20,000 to
    300,000 keys). Other inputs go to numpy."""
    if len(v) < 64 or len(a) < 64 or a.dtype != np.int64 or v.dtype != np.int64 or bool((v[1:] < v[:-1]).any()):
        return np.searchsorted(a, v, side)
    if side == "right" and v[-1] == np.iinfo(np.int64).max:
        return np.searchsorted(a, v, side)  # "right" gallops below v + 1
    return _gallop(a, v, side == "right")


@njit(nogil=True, cache=True)
def _gallop(a, v, right):
    n = a.shape[0]
    out = np.empty(v.shape[0], np.int64)
    i = 0
    for j in range(v.shape[0]):
        x = v[j] + 1 if right else v[j]  # on integers, at most v is below v + 1
        k = 0
        while i < n and a[i] < x and k < 8:  # most answers lie a few steps on
            i += 1
            k += 1
        if k == 8 and i < n and a[i] < x:
            lo, step = i, 8  # a[lo] < x: double the step until past x, then halve back
            hi = lo + step
            while hi < n and a[hi] < x:
                lo = hi
                step *= 2
                hi = lo + step
            hi = min(hi, n)
            lo += 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if a[mid] < x:
                    lo = mid + 1
                else:
                    hi = mid
            i = lo
        out[j] = i
    return out


def walk_sum(sizes, below: list, at0: list, at1) -> int:
    """``cer_sequences._walks(...).sum()`` without weights, in one compiled pass and no temporary
    arrays: ``sizes`` the candidates of the elements before the last, ``below[b]`` (b from 1)
    element b-1's candidates below each of element b's, ``at0[b]`` (b from 1) element b-1's below
    each last event's window, ``at1`` element k-2's below each last event. int64 wraps modulo
    2^64, as numpy's does (the caller certifies the total)."""
    k1 = len(sizes)
    flat = np.concatenate([np.asarray(x, np.int64) for x in below[1:]]) if k1 > 1 else np.zeros(0, np.int64)
    starts = np.zeros(max(k1, 1), np.int64)
    for b in range(1, k1 - 1):
        starts[b + 1] = starts[b] + len(below[b])
    return int(_walk_sum(np.asarray(sizes, np.int64), flat, starts,
                         np.stack([np.asarray(x, np.int64) for x in at0[1:]]), np.asarray(at1, np.int64)))


@njit(nogil=True, cache=True)
def _walk_get(F, a, b, pos):
    return pos if b == a + 1 else F[a, b, pos]  # one element: the candidates below pos


@njit(nogil=True, cache=True)
def _walk_sum(sizes, below, starts, at0, at1):
    k1 = sizes.shape[0]
    most = 0
    for b in range(k1):
        most = max(most, sizes[b])
    F = np.empty((k1, k1 + 1, most + 1), np.int64)
    for b in range(2, k1 + 1):  # F[a, b] over element b-1's candidates: running sums of F[a, b-1]
        n, s0 = sizes[b - 1], starts[b - 1]
        for a in range(b - 1):
            F[a, b, 0] = 0
            acc = np.int64(0)
            for i in range(n):
                acc += _walk_get(F, a, b - 1, below[s0 + i])
                F[a, b, i + 1] = acc
    q = np.empty(k1 + 1, np.int64)
    total = np.int64(0)
    for e in range(at1.shape[0]):
        q[0] = 1
        for b in range(1, k1 + 1):
            s = np.int64(0)
            pos = at0[b - 1, e]
            for j in range(b):
                s -= q[j] * _walk_get(F, j, b, pos)
            q[b] = s
        t = q[k1]
        for j in range(k1):
            t += q[j] * _walk_get(F, j, k1, at1[e])
        total += t
    return total
