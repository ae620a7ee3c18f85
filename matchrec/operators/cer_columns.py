"""CER matches column-wise: per variable, the row of each match (single events) or the id of its
event sequence in a table of distinct sequences (Kleene variables, flat rows + offsets).

This module owns ``MatchColumns`` and how it is built from what the mechanisms hand the sink:
matches as sorted (variable, value) tuples (``from_tuples``: a loop per match, no object kept
per match) and products of one binding with lists of choices (``from_products``: numpy repeats
and tiles, a cost per product and per distinct sequence, none per match). A Kleene sequence is
stored once however many matches hold it, so the result builder (``engine.cer_result``)
evaluates what reads one Kleene variable once per sequence and spreads it with one take.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

ABSENT = -1  # the variable is not bound in this match (an alternative without it)


@dataclass
class Sequences:
    """The distinct event sequences of one Kleene variable: sequence k is
    ``flat[offsets[k]:offsets[k + 1]]`` (row positions, in key order)."""
    flat: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    tuples: list | None = None  # sequence k as a tuple of rows, when the builder kept them

    def rows(self, k: int) -> tuple:
        if self.tuples is not None:
            return self.tuples[k]
        return tuple(int(x) for x in self.flat[self.offsets[k]:self.offsets[k + 1]])

    def all_rows(self) -> list:
        """Every sequence as a tuple of rows, in id order."""
        if self.tuples is None:
            flat, off = self.flat.tolist(), self.offsets.tolist()
            self.tuples = [tuple(flat[off[k]:off[k + 1]]) for k in range(len(self))]
        return self.tuples


@dataclass
class MatchColumns:
    """``n`` matches. ``rows[var]``: the row bound to a single variable per match (ABSENT when
    unbound); ``ids[var]``: the sequence of a Kleene variable per match, an index into
    ``seqs[var]`` (ABSENT when unbound). A variable is in ``rows`` or in ``ids``, not both."""
    n: int
    rows: dict
    ids: dict
    seqs: dict

    def __len__(self) -> int:
        return self.n

    @property
    def variables(self) -> list[str]:
        return sorted(self.rows.keys() | self.ids.keys())

    def binding(self, j: int) -> dict:
        """Match j as the mechanisms' binding (variable -> row, Kleene variable -> tuple of rows)."""
        out = {}
        for var, r in self.rows.items():
            if r[j] != ABSENT:
                out[var] = int(r[j])
        for var, ids in self.ids.items():
            if ids[j] != ABSENT:
                out[var] = self.seqs[var].rows(int(ids[j]))
        return out

    def tuples(self) -> list[tuple]:
        """The matches in ``cer_reference.reference_matches``' format (for tests and small results)."""
        return [tuple(sorted(self.binding(j).items())) for j in range(self.n)]

    def take(self, order: np.ndarray) -> "MatchColumns":
        return MatchColumns(len(order), {v: r[order] for v, r in self.rows.items()},
                            {v: i[order] for v, i in self.ids.items()}, self.seqs)

    def ordered(self) -> "MatchColumns":
        """The matches in the order of their first event, then variable by variable (a single
        variable by its row, a Kleene one by its sequence compared as a tuple of rows)."""
        order = self.order()
        return self if order is None else self.take(order)

    def arranged(self) -> tuple["MatchColumns", np.ndarray | None]:
        """(matches, permutation): ``ordered()`` as ``matches.take(permutation)``, the permutation
        None when nothing is left to permute. Where ``_plain_keys`` applies and the rows fit one
        63-bit integer, the packed keys are sorted themselves and each variable unpacked from them
        into new columns: a sort of integers is 2-3 times faster than their argsort, and no
        gathers follow."""
        if self.n < 2:
            return self, None
        plain = self._plain_keys()
        if plain is None:
            return self, self._general_order()
        names, keys, top = plain
        bits = _key_bits(top)
        if sum(bits) > 63:
            return self, _lex_order(keys, bits=bits)
        from matchrec.operators.cer_order_kernels import pack, unpack
        bits = np.array(bits, np.int64)
        packed, ordered = pack(tuple(keys), bits, ABSENT)
        if ordered:
            return self, None
        packed.sort()
        rows = unpack(packed, bits, ABSENT)
        return MatchColumns(self.n, {v: rows[c] for c, v in enumerate(names)}, {}, {}), None

    def order(self) -> np.ndarray | None:
        """The permutation ``ordered`` takes, or None when the matches are in that order already."""
        if self.n < 2:
            return None
        plain = self._plain_keys()
        return self._general_order() if plain is None else _lex_order(plain[1], plain[2])

    def _plain_keys(self) -> tuple[list, list, np.ndarray] | None:
        """(variables, their rows, each one's maximum) in the common case, checked in one pass:
        every variable a single row and the first binding every match's first event (then no
        variable is ABSENT: ABSENT sorts below any row); else None."""
        if self.ids or not self.rows:
            return None
        from matchrec.operators.cer_order_kernels import scan
        names = self.variables
        keys = [np.ascontiguousarray(self.rows[v], np.int64) for v in names]
        top, first_least = scan(tuple(keys), ABSENT)
        return (names, keys, top) if first_least else None

    def _general_order(self) -> np.ndarray | None:
        """``order`` by the first event of each match, then variable by variable (Kleene variables
        by their sequences' ranks)."""
        keys = []
        first = np.full(self.n, np.iinfo(np.int64).max, np.int64)
        for var in self.variables:
            if var in self.rows:
                r = self.rows[var]
                first = np.minimum(first, np.where(r == ABSENT, first, r))
                keys.append(r)
                continue
            seqs, ids = self.seqs[var], self.ids[var]
            starts = seqs.flat[seqs.offsets[:-1]] if len(seqs.flat) else np.zeros(len(seqs), np.int64)
            heads = starts[np.maximum(ids, 0)] if len(seqs) else np.zeros(self.n, np.int64)
            first = np.minimum(first, np.where(ids == ABSENT, first, heads))
            rank = _ranks(seqs)
            keys.append(np.where(ids == ABSENT, ABSENT, rank[np.maximum(ids, 0)] if len(seqs) else ABSENT))
        if not keys:
            return None
        if np.array_equal(first, keys[0]):  # the first variable binds the first event of every match
            return _lex_order(keys)
        return _lex_order([first] + keys)


@dataclass
class Block:
    """Matches as arrays (``Sink.add_block``): match m binds ``spread_var`` to ``spread_rows[m]``,
    ``kleene_var`` to sequence ``ids[m]`` of ``flat``/``offsets`` (not necessarily distinct
    sequences) and the variables of ``items`` to their values."""
    items: tuple
    spread_var: str
    spread_rows: np.ndarray
    kleene_var: str
    ids: np.ndarray
    flat: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def tuples(self) -> list[tuple]:
        """The matches in ``cer_reference.reference_matches``' format."""
        flat, off = self.flat.tolist(), self.offsets.tolist()
        seqs = [tuple(flat[off[k]:off[k + 1]]) for k in range(len(off) - 1)]
        items = self.items
        return [tuple(sorted(items + ((self.spread_var, r), (self.kleene_var, seqs[k]))))
                for r, k in zip(self.spread_rows.tolist(), self.ids.tolist())]


def _key_bits(top) -> list[int]:
    """The bits each key takes above ABSENT, from its maximum (at least one)."""
    return [max(1, (int(t) - ABSENT).bit_length()) for t in top]


def _lex_order(keys: list, top=None, bits: list | None = None) -> np.ndarray | None:
    """An order of the rows by ``keys[0]``, then ``keys[1]``, ... (each at least ABSENT), or None
    when they are in that order already; ``top``: each key's maximum, or ``bits`` (``_key_bits``
    of them), when known. Keys that fit
    in 63 bits together are packed into one integer: one sort of a packed key is several times
    faster than ``np.lexsort`` over the arrays it packs. Equal packed keys are equal matches
    (every variable's row or sequence rank is a key), so the sort need not be stable."""
    from matchrec.operators.cer_order_kernels import pack
    keys = [np.ascontiguousarray(k, np.int64) for k in keys]
    if bits is None:
        bits = _key_bits([int(k.max()) for k in keys] if top is None else top)
    groups, used = [], 64
    for i, b in enumerate(bits):
        if used + b > 63:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += b
    packs = [pack(tuple(keys[i] for i in g), np.array([bits[i] for i in g], np.int64), ABSENT) for g in groups]
    if len(packs) > 1:
        order = np.lexsort(tuple(p for p, _ in reversed(packs)))
        return None if bool((order[1:] > order[:-1]).all()) else order
    packed, ordered = packs[0]
    return None if ordered else np.argsort(packed)


def _ranks(seqs: Sequences) -> np.ndarray:
    """Each sequence's rank in the order of tuples of rows, equal sequences ranked equal."""
    s = len(seqs)
    if not s:
        return np.zeros(0, np.int64)
    lengths = np.diff(seqs.offsets)
    width = int(lengths.max())
    if s * width <= _PADDED_MAX:
        # rows padded with -1 on the right (a prefix sorts first), sorted column by column
        grid = np.full((s, width), -1, np.int64)
        grid[np.repeat(np.arange(s), lengths), np.arange(len(seqs.flat)) - np.repeat(seqs.offsets[:-1], lengths)] = \
            seqs.flat
        order = np.lexsort(grid.T[::-1])
        ordered = grid[order]
        differs = np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]
    else:
        rows = seqs.all_rows()
        order = np.array(sorted(range(s), key=rows.__getitem__), np.int64)
        differs = np.r_[True, [rows[x] != rows[y] for x, y in zip(order[1:].tolist(), order[:-1].tolist())]]
    rank = np.empty(s, np.int64)
    rank[order] = np.cumsum(differs) - 1
    return rank


_PADDED_MAX = 1 << 24  # cells of the padded grid ``_ranks`` sorts; larger tables are sorted as tuples


class _Table:
    """Distinct sequences of one variable as they are met: tuple -> id."""

    def __init__(self):
        self.index: dict = {}
        self.flat: list = []
        self.offsets: list = [0]
        self.raw: list = []  # (flat, offsets) of sequences added as arrays, after the distinct ones
        self.n_raw = 0

    def add_raw(self, flats: list, offsets: list) -> np.ndarray:
        """Append chunks of sequences given as arrays (flat rows, offsets from 0), without looking
        for them among the known ones (so no distinct sequence may be added after): the id of
        each chunk's first sequence."""
        counts = np.fromiter((len(o) - 1 for o in offsets), np.int64, len(offsets))
        bases = len(self.index) + self.n_raw + np.cumsum(counts) - counts
        self.raw.append((flats, offsets))
        self.n_raw += int(counts.sum())
        return bases

    def id(self, seq: tuple) -> int:
        k = self.index.get(seq)
        if k is None:
            k = self.index[seq] = len(self.index)
            self.flat.extend(seq)
            self.offsets.append(len(self.flat))
        return k

    def ids(self, seqs: list) -> np.ndarray:
        """The ids of many sequences at once (new ones added), without a Python step per sequence
        already known."""
        index = self.index
        missing = [t for t in dict.fromkeys(seqs) if t not in index]
        if missing:
            start = len(index)
            index.update(zip(missing, range(start, start + len(missing))))
            self.flat.extend(itertools.chain.from_iterable(missing))
            self.offsets.extend(itertools.accumulate(map(len, missing), initial=self.offsets[-1]))
            del self.offsets[-len(missing) - 1]  # accumulate repeated the last offset first
        return np.fromiter(map(index.__getitem__, seqs), np.int64, len(seqs))

    def done(self) -> Sequences:
        flat, offsets = np.array(self.flat, np.int64), np.array(self.offsets, np.int64)
        if not self.raw:
            return Sequences(flat, offsets, list(self.index))
        flats = [flat] + [f for chunk, _ in self.raw for f in chunk]
        tails = [o[1:] for _, chunk in self.raw for o in chunk]
        sizes = np.fromiter(map(len, flats), np.int64, len(flats))
        # each chunk's offsets start at 0: shifted by the rows before the chunk
        shift = np.repeat((np.cumsum(sizes) - sizes)[1:], np.fromiter(map(len, tails), np.int64, len(tails)))
        offs = [offsets, np.concatenate(tails) + shift]
        return Sequences(np.concatenate(flats), np.concatenate(offs))


def from_tuples(matches: list) -> MatchColumns:
    """Matches as sorted (variable, row or tuple of rows) tuples, column-wise."""
    return build(matches, [])


def build(matches: list, products: list, spend=None, blocks: list = ()) -> MatchColumns:
    """``matches``: (variable, value) tuples; ``products``: (binding items, choices) where every
    combination of the choices' values ((variable, values) each) with the binding's other items
    is a match (``Sink.add_product``); ``blocks``: matches as arrays (``Block``). ``spend``: the
    budget's step charge, asked between products."""
    tables: dict = {}
    kleene: set = set()
    for m in matches:  # which variables hold sequences: a tuple anywhere makes the variable Kleene
        for var, v in m:
            if type(v) is tuple:
                kleene.add(var)
    for items, choices in products:
        for var, v in items:
            if type(v) is tuple:
                kleene.add(var)
        for var, values in choices:
            if values and type(values[0]) is tuple:
                kleene.add(var)
    for block in blocks:
        kleene.add(block.kleene_var)
        for var, v in block.items:
            if type(v) is tuple:
                kleene.add(var)
    for var in kleene:
        tables[var] = _Table()
    n_tuples = len(matches)
    sizes = [math.prod(len(vs) for _, vs in choices) for _, choices in products]
    n = n_tuples + sum(sizes) + sum(map(len, blocks))
    cols: dict = {}

    def column(var):
        c = cols.get(var)
        if c is None:
            c = cols[var] = np.full(n, ABSENT, np.int64)
        return c

    if matches:
        lists: dict = {}
        for j, m in enumerate(matches):
            for var, v in m:
                lst = lists.get(var)
                if lst is None:
                    lst = lists[var] = [ABSENT] * n_tuples
                if var in tables:
                    lst[j] = tables[var].id(v if type(v) is tuple else (v,))
                else:
                    lst[j] = v
        for var, lst in lists.items():
            column(var)[:n_tuples] = lst
    if products:
        _expand(products, sizes, tables, column, n_tuples, spend)
    if blocks:
        _fill(blocks, tables, column, n_tuples + sum(sizes))
    rows = {v: c for v, c in cols.items() if v not in tables}
    ids = {v: c for v, c in cols.items() if v in tables}
    return MatchColumns(n, rows, ids, {v: t.done() for v, t in tables.items()})


def _expand(products: list, sizes: list, tables: dict, column, at: int, spend) -> None:
    """Every product's matches into the columns from row ``at`` on, vectorized over the products:
    match m of a product takes, for a choice of length L repeated ``inner`` times per value
    (itertools.product's order: the last choice varies fastest), the value (m // inner) % L."""
    p = len(products)
    fixed: dict = {}  # var -> its value (row or sequence id) per product
    chosen: dict = {}  # var -> ([inner], [length], [base into the var's coded values]) per product
    coded: dict = {}  # (var, id(values)) -> base: a values list shared between products is coded once
    pools: dict = {}  # var -> [coded arrays], their total length
    for k, ((items, choices), size) in enumerate(zip(products, sizes)):
        if not k & 1023 and spend is not None:
            spend(0)
        for var, v in items:
            f = fixed.get(var)
            if f is None:
                f = fixed[var] = [ABSENT] * p
            f[k] = tables[var].id(v if type(v) is tuple else (v,)) if var in tables else v
        inner = size
        for var, values in choices:
            length = len(values)
            if not length:
                break
            inner //= length
            c = chosen.get(var)
            if c is None:
                c = chosen[var] = ([1] * p, [1] * p, [ABSENT] * p)
                pools[var] = [[], 0]
            key = (var, id(values))
            base = coded.get(key)
            if base is None:
                pool = pools[var]
                if var in tables and type(values[0]) is not tuple:
                    values = [v if type(v) is tuple else (v,) for v in values]
                base = coded[key] = pool[1]
                pool[0].append(values)
                pool[1] += length
            c[0][k], c[1][k], c[2][k] = inner, length, base
    sizes_a = np.asarray(sizes, np.int64)
    total = int(sizes_a.sum())
    if not total:
        return
    owner = np.repeat(np.arange(p), sizes_a)  # the product of each match
    starts = np.cumsum(sizes_a) - sizes_a
    local = np.arange(total, dtype=np.int64) - starts[owner]
    end = at + total
    for var, f in fixed.items():
        column(var)[at:end] = np.asarray(f, np.int64)[owner]
    for var, (inner, length, base) in chosen.items():
        flat = itertools.chain.from_iterable(pools[var][0])
        values = tables[var].ids(list(flat)) if var in tables else np.fromiter(flat, np.int64, pools[var][1])
        b = np.asarray(base, np.int64)[owner]
        idx = (local // np.asarray(inner, np.int64)[owner]) % np.asarray(length, np.int64)[owner] + b
        target = column(var)
        target[at:end] = np.where(b == ABSENT, target[at:end], values[np.maximum(idx, 0)])


def _fill(blocks: list, tables: dict, column, at: int) -> None:
    """Every block's matches into the columns from row ``at`` on, a few numpy calls per variable
    rather than per block. The distinct sequences a block's other variables hold are coded
    first: the blocks' own sequences come after them."""
    nb = len(blocks)
    lengths = np.fromiter(map(len, blocks), np.int64, nb)
    end = at + int(lengths.sum())
    fixed: dict = {}  # var -> its value per block
    spread: dict = {}  # var -> [(block index, rows)]
    for k, block in enumerate(blocks):
        for var, v in block.items:
            f = fixed.get(var)
            if f is None:
                f = fixed[var] = [ABSENT] * nb
            f[k] = tables[var].id(v if type(v) is tuple else (v,)) if var in tables else v
        spread.setdefault(block.spread_var, []).append(k)
    for var, f in fixed.items():
        column(var)[at:end] = np.repeat(np.asarray(f, np.int64), lengths)
    starts = np.cumsum(lengths) - lengths + at
    for var, ks in spread.items():
        target = column(var)
        if var in tables:
            for k in ks:
                rows = [(r,) for r in blocks[k].spread_rows.tolist()]
                target[starts[k]:starts[k] + lengths[k]] = tables[var].ids(rows)
        elif len(ks) == nb:
            target[at:end] = np.concatenate([b.spread_rows for b in blocks])
        else:
            for k in ks:
                target[starts[k]:starts[k] + lengths[k]] = blocks[k].spread_rows
    by_var: dict = {}
    for k, block in enumerate(blocks):
        by_var.setdefault(block.kleene_var, []).append(k)
    for var, ks in by_var.items():
        bases = tables[var].add_raw([blocks[k].flat for k in ks], [blocks[k].offsets for k in ks])
        ids = np.concatenate([blocks[k].ids for k in ks]) + np.repeat(bases, lengths[ks])
        if len(ks) == nb:
            column(var)[at:end] = ids
        else:
            target = column(var)
            target[np.concatenate([np.arange(starts[k], starts[k] + lengths[k]) for k in ks])] = ids
