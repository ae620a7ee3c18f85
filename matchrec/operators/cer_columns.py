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

    def rows(self, k: int) -> tuple:
        return tuple(int(x) for x in self.flat[self.offsets[k]:self.offsets[k + 1]])


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
        if self.n < 2:
            return self
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
            # the sequences' order as tuples of rows: one sort of the distinct sequences
            rank = np.empty(len(seqs), np.int64)
            rank[sorted(range(len(seqs)), key=seqs.rows)] = np.arange(len(seqs))
            keys.append(np.where(ids == ABSENT, ABSENT, rank[np.maximum(ids, 0)] if len(seqs) else ABSENT))
        order = np.lexsort(tuple(reversed(keys)) + (first,)) if keys else np.arange(self.n)
        return self.take(order)


class _Table:
    """Distinct sequences of one variable as they are met: tuple -> id."""

    def __init__(self):
        self.index: dict = {}
        self.flat: list = []
        self.offsets: list = [0]

    def id(self, seq: tuple) -> int:
        k = self.index.get(seq)
        if k is None:
            k = self.index[seq] = len(self.index)
            self.flat.extend(seq)
            self.offsets.append(len(self.flat))
        return k

    def done(self) -> Sequences:
        return Sequences(np.array(self.flat, np.int64), np.array(self.offsets, np.int64))


def from_tuples(matches: list) -> MatchColumns:
    """Matches as sorted (variable, row or tuple of rows) tuples, column-wise."""
    return build(matches, [])


def build(matches: list, products: list, spend=None) -> MatchColumns:
    """``matches``: (variable, value) tuples; ``products``: (binding items, choices) where every
    combination of the choices' values ((variable, values) each) with the binding's other items
    is a match (``Sink.add_product``). ``spend``: the budget's step charge, asked between products."""
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
    for var in kleene:
        tables[var] = _Table()
    n_tuples = len(matches)
    sizes = [math.prod(len(vs) for _, vs in choices) for _, choices in products]
    n = n_tuples + sum(sizes)
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
    at = n_tuples
    coded: dict = {}  # id(values list) -> its values as ids (lists are shared between products)
    for (items, choices), size in zip(products, sizes):
        if spend is not None:
            spend(0)
        if not size:
            continue
        end = at + size
        for var, v in items:
            column(var)[at:end] = tables[var].id(v if type(v) is tuple else (v,)) if var in tables else v
        inner = size
        for var, values in choices:  # itertools.product's order: the last choice varies fastest
            key = (var, id(values))
            arr = coded.get(key)
            if arr is None:
                if var in tables:
                    t = tables[var]
                    arr = np.array([t.id(v if type(v) is tuple else (v,)) for v in values], np.int64)
                else:
                    arr = np.array(values, np.int64)
                coded[key] = arr
            inner //= len(values)
            column(var)[at:end] = np.tile(np.repeat(arr, inner), size // (len(values) * inner))
        at = end
    rows = {v: c for v, c in cols.items() if v not in tables}
    ids = {v: c for v, c in cols.items() if v in tables}
    return MatchColumns(n, rows, ids, {v: t.done() for v, t in tables.items()})
