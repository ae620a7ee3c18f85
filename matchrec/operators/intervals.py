"""Time interval sets and the two filters that carry them over the wire.

A *time interval set* (TIS) is the set of instants at which a match can still have rows:
sorted, disjoint, closed integer intervals per partition-key hash (0 when the query has no
PARTITION BY). Intervals come from candidate events of a pattern variable - ``[t, t + w]``
around a variable that starts every match, ``[t - w, t]`` around one that ends every match,
``[t - w, t + w]`` otherwise - and the sets of several variables are intersected.

``ShrinkingWindowFilter`` stores a TIS compactly: time is cut into windows of length ``w``,
each window into ``slices`` slices, and a cuckoo-style table keyed by (partition, window id)
holds a fingerprint and a slice bitmap per window (``d`` entries per bucket). A slice is set
when any part of it lies in the TIS, so lookups have no false negatives; false positives come
from coarse slices and fingerprint collisions.

``WindowJoinFilter`` is a Bloom filter over (partition, value hash, window id): built from the
events of one variable, probed by the events of another that must equal it within ``w``.

Everything here is numpy on whole arrays; nothing does I/O.
"""
from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix(*parts: np.ndarray) -> np.ndarray:
    """A 64-bit hash of equal-length int arrays (splitmix64 over a running combination)."""
    h = np.zeros(len(parts[0]), np.uint64)
    with np.errstate(over="ignore"):
        for p in parts:
            h = h * np.uint64(0x9E3779B97F4A7C15) + np.asarray(p).astype(np.int64).view(np.uint64)
            h ^= h >> np.uint64(30)
            h *= _M1
            h ^= h >> np.uint64(27)
            h *= _M2
            h ^= h >> np.uint64(31)
    return h


def distinct(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values. (numpy 2's np.unique hashes, which is many times slower on large
    integer arrays than sorting.)"""
    x = np.sort(x)
    return x[np.r_[True, x[1:] != x[:-1]]] if len(x) else x


def _group_starts(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys of a sorted array and the index where each starts."""
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if len(sorted_keys) else \
        np.zeros(0, np.int64)
    return sorted_keys[starts], starts


class _Line:
    """Partitions laid end to end on one integer line: (pk, t) -> offset(pk) + t - base(pk) + 1.

    Each partition gets a segment as long as its own time span plus a gap of at least two, so
    intervals of different partitions never touch or overlap and every operation on sets becomes
    one vectorized pass, however far apart the partitions' spans lie. ``of`` returns None when the
    line would not fit in 62 bits (then the per-partition loops run)."""

    def __init__(self, keys: np.ndarray, base: np.ndarray, top: np.ndarray):
        self.keys, self.base, self.top = keys, base, top
        stride = top - base + 4
        self.offset = np.r_[np.int64(0), np.cumsum(stride)[:-1]].astype(np.int64)

    @classmethod
    def of(cls, pairs: list[tuple[np.ndarray, np.ndarray]]) -> "_Line | None":
        """The line for the points ``(pk, t)`` of every pair (each pair: two equal-length arrays)."""
        pk = np.concatenate([np.asarray(p, np.int64) for p, _ in pairs])
        t = np.concatenate([np.asarray(x, np.int64) for _, x in pairs])
        if not len(t):
            return None
        if (pk[1:] < pk[:-1]).any():
            order = np.argsort(pk, kind="stable")
            pk, t = pk[order], t[order]
        keys, starts = _group_starts(pk)
        base, top = np.minimum.reduceat(t, starts), np.maximum.reduceat(t, starts)
        span = top.astype(np.float64) - base.astype(np.float64)  # in floats: no int64 overflow here
        if span.max() > (1 << 60) or span.sum() + 4 * len(keys) >= (1 << 61):
            return None
        return cls(keys, base, top)

    def _rank(self, pk: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.keys, np.asarray(pk, np.int64))

    def known(self, pk: np.ndarray) -> np.ndarray:
        idx = np.minimum(self._rank(pk), len(self.keys) - 1)
        return self.keys[idx] == pk

    def put(self, pk: np.ndarray, t: np.ndarray, clip: bool = False) -> np.ndarray:
        """Positions of the points; ``clip`` moves times outside their partition's span to just
        outside it (queries), which keeps them inside the partition's segment."""
        rank = self._rank(pk)
        t = np.asarray(t, np.int64)
        if clip:
            t = np.clip(t, self.base[rank] - 1, self.top[rank] + 1)
        return self.offset[rank] + (t - self.base[rank] + 1)

    def take(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rank = np.searchsorted(self.offset, c, side="right") - 1
        return self.keys[rank], c - self.offset[rank] + self.base[rank] - 1


# -- time interval sets

@dataclass
class IntervalSet:
    """Disjoint closed intervals, sorted by (pk, lo)."""
    pk: np.ndarray  # int64 partition-key hash
    lo: np.ndarray  # int64
    hi: np.ndarray  # int64

    @classmethod
    def empty(cls) -> "IntervalSet":
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), z.copy())

    @classmethod
    def around(cls, pk: np.ndarray, t: np.ndarray, before: int, after: int) -> "IntervalSet":
        """The union of ``[t - before, t + after]`` over the points, per partition."""
        return cls._merged(np.asarray(pk, np.int64), np.asarray(t, np.int64) - before,
                           np.asarray(t, np.int64) + after)

    @classmethod
    def around_slots(cls, pk: np.ndarray, slot: np.ndarray, quantum: int, before: int, after: int) -> "IntervalSet":
        """Like ``around`` for points known only to lie in ``[slot * quantum, (slot + 1) * quantum)``."""
        start = np.asarray(slot, np.int64) * quantum
        return cls._merged(np.asarray(pk, np.int64), start - before, start + (quantum - 1) + after)

    @classmethod
    def _merged(cls, pk: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> "IntervalSet":
        if len(lo) == 0:
            return cls.empty()
        line = _Line.of([(pk, lo), (pk, hi)])
        if line is not None:  # every partition on one line: one sort, one running maximum
            c_lo, c_hi = line.put(pk, lo), line.put(pk, hi)
            if (c_lo[1:] < c_lo[:-1]).any():
                order = np.argsort(c_lo, kind="stable")
                c_lo, c_hi = c_lo[order], c_hi[order]
            run = np.maximum.accumulate(c_hi)
            opens = np.r_[True, c_lo[1:] > run[:-1] + 1]  # integer intervals that touch are merged
            idx = np.flatnonzero(opens)
            ends = np.r_[idx[1:], len(c_lo)] - 1
            out_pk, out_lo = line.take(c_lo[idx])
            return cls(out_pk, out_lo, line.take(run[ends])[1])
        order = np.lexsort((lo, pk))
        pk, lo, hi = pk[order], lo[order], hi[order]
        new_group = np.r_[True, pk[1:] != pk[:-1]]
        hi_run = hi.copy()
        starts = np.flatnonzero(new_group)
        for s, e in zip(starts, np.r_[starts[1:], len(hi)]):  # running maximum within each partition
            hi_run[s:e] = np.maximum.accumulate(hi[s:e])
        opens = new_group.copy()
        opens[1:] |= lo[1:] > hi_run[:-1] + 1
        idx = np.flatnonzero(opens)
        ends = np.r_[idx[1:], len(lo)] - 1
        return cls(pk[idx], lo[idx], hi_run[ends])

    def __len__(self) -> int:
        return len(self.lo)

    @staticmethod
    def _intersect_line(alo, ahi, blo, bhi):
        """Intersection of two sorted disjoint interval lists on one line (as pairs of arrays)."""
        # every pair that overlaps: for each a, the b's between the first b ending at or after
        # a.lo and the last b starting at or before a.hi
        first = np.searchsorted(bhi, alo, side="left")
        last = np.searchsorted(blo, ahi, side="right")
        counts = np.maximum(last - first, 0)
        ai = np.repeat(np.arange(len(alo)), counts)
        bi = np.repeat(first, counts) + (np.arange(len(ai)) - np.repeat(np.cumsum(counts) - counts, counts))
        lo = np.maximum(alo[ai], blo[bi])
        hi = np.minimum(ahi[ai], bhi[bi])
        keep = lo <= hi
        return lo[keep], hi[keep]

    def intersect(self, other: "IntervalSet") -> "IntervalSet":
        if not len(self) or not len(other):
            return IntervalSet.empty()
        line = _Line.of([(self.pk, self.lo), (self.pk, self.hi), (other.pk, other.lo), (other.pk, other.hi)])
        if line is not None:
            lo, hi = self._intersect_line(line.put(self.pk, self.lo), line.put(self.pk, self.hi),
                                          line.put(other.pk, other.lo), line.put(other.pk, other.hi))
            pk, lo = line.take(lo)
            return IntervalSet._merged(pk, lo, line.take(hi)[1])
        out_pk, out_lo, out_hi = [], [], []
        for key, (a0, a1) in self._groups().items():
            b = other._groups().get(key)
            if b is None:
                continue
            lo, hi = self._intersect_line(self.lo[a0:a1], self.hi[a0:a1], other.lo[b[0]:b[1]], other.hi[b[0]:b[1]])
            out_pk.append(np.full(len(lo), key, np.int64))
            out_lo.append(lo)
            out_hi.append(hi)
        if not out_lo:
            return IntervalSet.empty()
        return IntervalSet._merged(np.concatenate(out_pk), np.concatenate(out_lo), np.concatenate(out_hi))

    def _groups(self) -> dict[int, tuple[int, int]]:
        if not hasattr(self, "_group_cache"):
            keys, starts = _group_starts(self.pk)  # pk is sorted
            ends = np.r_[starts[1:], len(self.pk)]
            self._group_cache = {int(k): (int(s), int(e)) for k, s, e in zip(keys, starts, ends)}
        return self._group_cache

    def contains(self, pk: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether each point ``t`` of partition ``pk`` lies in the set (``overlaps`` of ``[t, t]``:
        one search for the partitions instead of three, the set placed on its line once)."""
        pk = np.asarray(pk, np.int64)
        t = np.asarray(t, np.int64)
        if not len(self) or not len(t):
            return np.zeros(len(t), bool)
        placed = self._placed()
        if placed is None:
            return self.overlaps(pk, t, t)
        line, slo, shi = placed
        rank = np.minimum(line._rank(pk), len(line.keys) - 1)
        known = line.keys[rank] == pk
        # on its own partition's segment (clipped as in overlaps); points of other partitions are
        # placed somewhere and then dropped
        base = line.base[rank]
        q = line.offset[rank] + (np.clip(t, base - 1, line.top[rank] + 1) - base + 1)
        idx = np.searchsorted(shi, q, side="left")
        ok = known & (idx < len(shi))
        ok[ok] = slo[idx[ok]] <= q[ok]
        return ok

    def _placed(self):
        """(line, lo, hi) of the set on one line, or None when it does not fit; kept."""
        if not hasattr(self, "_placed_cache"):
            line = _Line.of([(self.pk, self.lo), (self.pk, self.hi)])
            self._placed_cache = None if line is None else (line, line.put(self.pk, self.lo),
                                                             line.put(self.pk, self.hi))
        return self._placed_cache

    def overlaps(self, pk: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Whether each closed interval ``[lo, hi]`` of partition ``pk`` meets the set."""
        pk = np.asarray(pk, np.int64)
        lo = np.asarray(lo, np.int64)
        hi = np.asarray(hi, np.int64)
        out = np.zeros(len(lo), bool)
        if not len(self) or not len(lo):
            return out
        line = _Line.of([(self.pk, self.lo), (self.pk, self.hi)])
        if line is not None:
            known = line.known(pk)
            # queries are clipped to just outside their partition's extent, which keeps them on it
            qlo = line.put(pk[known], lo[known], clip=True)
            qhi = line.put(pk[known], hi[known], clip=True)
            slo, shi = line.put(self.pk, self.lo), line.put(self.pk, self.hi)
            idx = np.searchsorted(shi, qlo, side="left")  # first set interval ending at or after lo
            ok = idx < len(shi)
            ok[ok] = slo[idx[ok]] <= qhi[ok]
            out[known] = ok
            return out
        groups = self._groups()
        order = np.argsort(pk, kind="stable")
        spk = pk[order]
        keys, starts = _group_starts(spk)
        ends = np.r_[starts[1:], len(spk)]
        for key, s, e in zip(keys, starts, ends):
            g = groups.get(int(key))
            if g is None:
                continue
            rows = order[s:e]
            glo, ghi = self.lo[g[0]:g[1]], self.hi[g[0]:g[1]]
            idx = np.searchsorted(ghi, lo[rows], side="left")
            ok = idx < len(ghi)
            ok[ok] = glo[idx[ok]] <= hi[rows][ok]
            out[rows] = ok
        return out

    def total_length(self) -> int:
        return int((self.hi - self.lo + 1).sum())


# -- shrinking window filter

_FP_BITS = 12


class FilterPayloadError(ValueError):
    """A filter received over the wire is malformed or too large."""


class ShrinkingWindowFilter:
    """A TIS as (partition, window id) -> fingerprint + slice bitmap, cuckoo-hashed.

    Defaults follow the dual-filtering paper: 4 entries per bucket, 12-bit fingerprints, 20
    slices per window. An entry is one 32-bit cell: the fingerprint in the top 12 bits, the
    slice bitmap in the low 20 (0 marks an empty cell). On the wire the cells are compressed
    with zstd, so the empty cells of a table that shrank cost almost nothing. Lookups never
    miss a point of the TIS it was built from.
    """

    MAX_BUCKETS = 1 << 26
    MAX_SLICES = 32 - _FP_BITS

    def __init__(self, window: int, slices: int = 20, per_bucket: int = 4, buckets: int = 1):
        if window <= 0 or not 1 <= slices <= self.MAX_SLICES or not 1 <= per_bucket <= 64:
            raise FilterPayloadError("window filter parameters out of range")
        self.window, self.slices, self.d = int(window), int(slices), int(per_bucket)
        self.cells = np.zeros((buckets, self.d), np.uint32)

    # hashing of (pk, window id)
    def _keys(self, pk: np.ndarray, wid: np.ndarray):
        h = mix(pk, wid)
        fp = (h >> np.uint64(64 - _FP_BITS)).astype(np.uint32)
        fp[fp == 0] = 1
        mask = np.uint64(len(self.cells) - 1)
        i1 = (h & mask).astype(np.int64)
        i2 = ((i1.astype(np.uint64) ^ mix(fp.astype(np.int64))) & mask).astype(np.int64)
        return fp, i1, i2

    def _slice_of(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        wid = np.floor_divide(t, self.window)
        pos = t - wid * self.window
        return wid, (pos * self.slices) // self.window

    @classmethod
    def build(cls, tis: IntervalSet, window: int, slices: int = 20, per_bucket: int = 4,
              load: float = 0.85) -> "ShrinkingWindowFilter":
        pk, wid, bm = cls._window_bitmaps(tis, window, slices)
        n = len(wid)
        buckets = 1
        while buckets * per_bucket * load < n:
            buckets *= 2
        while True:
            f = cls(window, slices, per_bucket, buckets)
            if f._insert(pk, wid, bm):
                return f
            buckets *= 2  # a cuckoo cycle: rebuild into a bigger table
            if buckets > cls.MAX_BUCKETS:
                raise FilterPayloadError("time interval set too large for a window filter")

    @staticmethod
    def _window_bitmaps(tis: IntervalSet, window: int, slices: int):
        """(pk, window id, slice bitmap) of every window the TIS touches."""
        if len(tis) == 0:
            z = np.zeros(0, np.int64)
            return z, z, np.zeros(0, np.uint32)
        w0 = np.floor_divide(tis.lo, window)
        w1 = np.floor_divide(tis.hi, window)
        counts = (w1 - w0 + 1).astype(np.int64)
        rep = np.repeat(np.arange(len(tis)), counts)
        step = np.arange(len(rep)) - np.repeat(np.cumsum(counts) - counts, counts)
        wid = w0[rep] + step
        start = np.maximum(tis.lo[rep], wid * window) - wid * window
        end = np.minimum(tis.hi[rep], wid * window + window - 1) - wid * window
        s0 = (start * slices) // window
        s1 = (end * slices) // window
        bm = ((np.left_shift(np.uint64(1), (s1 + 1).astype(np.uint64)) - np.uint64(1))
              ^ (np.left_shift(np.uint64(1), s0.astype(np.uint64)) - np.uint64(1))).astype(np.uint32)
        pk = tis.pk[rep]
        order = np.lexsort((wid, pk))
        pk, wid, bm = pk[order], wid[order], bm[order]
        first = np.r_[True, (pk[1:] != pk[:-1]) | (wid[1:] != wid[:-1])]
        idx = np.flatnonzero(first)
        return pk[idx], wid[idx], np.bitwise_or.reduceat(bm, idx)

    def _insert(self, pk, wid, bm) -> bool:
        fp, i1, i2 = self._keys(pk, wid)
        cell = (fp << np.uint32(self.MAX_SLICES)) | bm
        fill = np.zeros(len(self.cells), np.int64)
        # first and second choice for everyone at once; what is left goes through cuckoo kicks
        left = np.arange(len(cell))
        for target in (i1, i2):
            if not len(left):
                break
            order = left[np.argsort(target[left], kind="stable")]
            b = target[order]
            rank = np.arange(len(b)) - np.searchsorted(b, b, side="left") + fill[b]
            ok = rank < self.d
            self.cells[b[ok], rank[ok]] = cell[order][ok]
            np.add.at(fill, b[ok], 1)
            left = order[~ok]
        if not len(left):
            return True
        # the kicks run one item at a time: a kicked cell's other bucket comes from a table of
        # its fingerprint's hash, not from ``mix`` on one-element arrays
        mask = len(self.cells) - 1
        alt_of = (mix(np.arange(1 << _FP_BITS)) & np.uint64(mask)).astype(np.int64).tolist()
        rng = random.Random(0)
        d, shift = self.d, self.MAX_SLICES
        for j in left.tolist():
            c, a, alt = int(cell[j]), int(i1[j]), int(i2[j])
            for _ in range(500):
                bucket = a if fill[a] < d else alt if fill[alt] < d else -1
                if bucket >= 0:
                    self.cells[bucket, fill[bucket]] = c
                    fill[bucket] += 1
                    break
                bucket = alt if rng.random() < 0.5 else a
                slot = rng.randrange(d)
                c, self.cells[bucket, slot] = int(self.cells[bucket, slot]), c
                a, alt = bucket, bucket ^ alt_of[c >> shift]
            else:
                return False
        return True

    def contains(self, pk: np.ndarray, t: np.ndarray) -> np.ndarray:
        pk = np.asarray(pk, np.int64)
        t = np.asarray(t, np.int64)
        if len(t) == 0:
            return np.zeros(0, bool)
        wid, sl = self._slice_of(t)
        if (pk == pk[0]).all():
            lo, hi = int(wid.min()), int(wid.max())
            if hi - lo < 4 * len(t) + 1024:  # hash each window once, not each row
                table = self._window_bits(np.full(hi - lo + 1, pk[0], np.int64), np.arange(lo, hi + 1))
                bits = table[wid - lo]
                return ((bits >> sl.astype(np.uint32)) & 1).astype(bool)
        bits = self._window_bits(pk, wid)
        return ((bits >> sl.astype(np.uint32)) & 1).astype(bool)

    def _window_bits(self, pk: np.ndarray, wid: np.ndarray) -> np.ndarray:
        """The slice bitmap stored for each (pk, window) - 0 when there is none."""
        fp, i1, i2 = self._keys(pk, wid)
        bits = np.zeros(len(wid), np.uint32)
        low = np.uint32((1 << self.MAX_SLICES) - 1)
        shift = np.uint32(self.MAX_SLICES)
        for idx in (i1, i2):
            cells = self.cells[idx]
            hit = (cells >> shift) == fp[:, None]
            masked = np.where(hit, cells & low, np.uint32(0))
            for j in range(self.d):  # OR across the bucket's entries, column by column
                bits |= masked[:, j]
        return bits

    @property
    def entries(self) -> int:
        return int((self.cells != 0).sum())

    def to_bytes(self) -> bytes:
        raw = self.cells.tobytes()
        packed = _ZSTD.compress(raw, asbytes=True)
        return struct.pack(_SWF_HEAD, b"SWF2", self.window, self.slices, self.d, len(self.cells), len(raw)) + packed

    @classmethod
    def from_bytes(cls, data: bytes, max_bytes: int) -> "ShrinkingWindowFilter":
        size = struct.calcsize(_SWF_HEAD)
        if len(data) < size:
            raise FilterPayloadError("window filter payload is truncated")
        magic, window, slices, d, buckets, raw = struct.unpack_from(_SWF_HEAD, data)
        if magic != b"SWF2" or buckets < 1 or buckets & (buckets - 1) or buckets > cls.MAX_BUCKETS:
            raise FilterPayloadError("window filter payload is malformed")
        f = cls(window, slices, d, 1)
        if raw != buckets * d * 4:
            raise FilterPayloadError("window filter payload has the wrong length")
        if raw > max_bytes:
            raise FilterPayloadError(f"window filter of {raw} bytes exceeds the limit of {max_bytes}")
        try:
            cells = _ZSTD.decompress(data[size:], decompressed_size=raw, asbytes=True)
        except Exception:  # noqa: BLE001 - any decoding failure is a malformed payload
            raise FilterPayloadError("window filter payload does not decompress") from None
        f.cells = np.frombuffer(cells, np.uint32).reshape(buckets, d)
        return f


_SWF_HEAD = "<4sqiiiq"
_ZSTD = pa.Codec("zstd")


# -- window-wise join filter

class WindowJoinFilter:
    """Bloom filter over (partition, value hash, window id), sized for false-positive rate ``eps``."""

    MAX_BITS = 1 << 33

    def __init__(self, window: int, bits: int, hashes: int):
        if window <= 0 or bits < 64 or not 1 <= hashes <= 32 or bits > self.MAX_BITS:
            raise FilterPayloadError("join filter parameters out of range")
        self.window, self.n_bits, self.k = int(window), int(bits), int(hashes)
        self.words = np.zeros((self.n_bits + 63) // 64, np.uint64)

    @classmethod
    def build(cls, pk: np.ndarray, value: np.ndarray, t: np.ndarray, window: int,
              eps: float = 0.02) -> "WindowJoinFilter":
        wid = np.floor_divide(np.asarray(t, np.int64), window)
        # one key per (partition, value, window): many events share them
        keys = distinct(mix(pk, value, wid)) if len(t) else np.zeros(0, np.uint64)
        n = max(len(keys), 1)
        bits = max(64, int(math.ceil(-n * math.log(eps) / (math.log(2) ** 2))))
        k = max(1, int(round(bits / n * math.log(2))))
        f = cls(window, bits, min(k, 32))
        f.inserted = len(keys)
        if len(keys):
            f._set(distinct(f._positions_of(keys).ravel()))
        return f

    def _set(self, pos: np.ndarray) -> None:
        """Set the bits at sorted, distinct positions (one OR per word, not per bit)."""
        word = pos >> 6
        bit = np.left_shift(np.uint64(1), (pos & 63).astype(np.uint64))
        starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
        self.words[word[starts]] |= np.bitwise_or.reduceat(bit, starts)

    def _positions(self, pk, value, wid) -> np.ndarray:
        return self._positions_of(mix(pk, value, wid))

    def _positions_of(self, h: np.ndarray) -> np.ndarray:
        h1 = h & np.uint64(0xFFFFFFFF)
        h2 = (h >> np.uint64(32)) | np.uint64(1)
        i = np.arange(self.k, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return ((h1[:, None] + i[None, :] * h2[:, None]) % np.uint64(self.n_bits)).astype(np.int64)

    def _has(self, pk, value, wid) -> np.ndarray:
        pos = self._positions(pk, value, wid)
        bit = (self.words[pos >> 6] >> (pos & 63).astype(np.uint64)) & np.uint64(1)
        return bit.all(axis=1)

    def may_follow(self, pk: np.ndarray, value: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether an inserted event with the same partition and value may lie in ``[t - w, t]``:
        its window is this one or the one before."""
        pk = np.asarray(pk, np.int64)
        value = np.asarray(value, np.int64)
        if len(pk) == 0:
            return np.zeros(0, bool)
        wid = np.floor_divide(np.asarray(t, np.int64), self.window)
        return self._has(pk, value, wid) | self._has(pk, value, wid - 1)

    def may_precede(self, pk: np.ndarray, value: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether an inserted event with the same partition and value may lie in ``[t, t + w]``:
        its window is this one or the next."""
        pk = np.asarray(pk, np.int64)
        value = np.asarray(value, np.int64)
        if len(pk) == 0:
            return np.zeros(0, bool)
        wid = np.floor_divide(np.asarray(t, np.int64), self.window)
        return self._has(pk, value, wid) | self._has(pk, value, wid + 1)

    def expected_fpr(self, inserted: int) -> float:
        return (1 - math.exp(-self.k * inserted / self.n_bits)) ** self.k

    def to_bytes(self) -> bytes:
        return struct.pack("<4sqqi", b"WJF1", self.window, self.n_bits, self.k) + self.words.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, max_bytes: int) -> "WindowJoinFilter":
        if len(data) > max_bytes:
            raise FilterPayloadError(f"join filter of {len(data)} bytes exceeds the limit of {max_bytes}")
        size = struct.calcsize("<4sqqi")
        if len(data) < size:
            raise FilterPayloadError("join filter payload is truncated")
        magic, window, bits, k = struct.unpack_from("<4sqqi", data)
        if magic != b"WJF1":
            raise FilterPayloadError("join filter payload is malformed")
        f = cls(window, bits, k)
        if len(data) != size + len(f.words) * 8:
            raise FilterPayloadError("join filter payload has the wrong length")
        f.words = np.frombuffer(data, np.uint64, len(f.words), size)
        return f
