"""CER multi-pattern evaluation: many skip-till-any-match patterns over one stream, sharing
sub-patterns (Kolchinsky & Schuster, "Real-time multi-pattern detection over event streams",
SIGMOD'19).

This module owns the shared operator. Its input is one stream (rows sorted by partition and key)
read once for a workload, the element *classes* of the workload (a type and a filter: the rows an
element can take, as a boolean mask), the *units* (one per alternative of each pattern: a linear
chain of single-event elements, the conditions among them, its negations and window) and a plan
built by ``planner.sharing``: a forest of nodes, each binding one more element. A node's partial
matches are the bindings of the elements bound along its path that satisfy their types, filters,
the strict key order the chain puts between them, the conditions among them and the largest
window of the units that use the node. Under skip-till-any-match that set depends on nothing
else, so units whose plans start with the same sub-pattern share the nodes of that prefix; each
unit then applies its own window, checks its negations and hands its matches to its pattern's
sink, where alternatives binding the same variables are deduplicated.

Evaluation is in batch over numpy arrays. Every partition is laid on one integer axis (the
*composite key*: a partition's keys shifted past the previous partition by more than any window,
so a window search never crosses a partition), each class keeps its candidate rows and their
composite keys in order, and a node extends its parent's partial matches by one binary search
per partial match for the range of candidates allowed by the window and by the nearest bound
neighbours in the sequence (once a class has been searched for a share of the stream's rows, a
table of every row's position among its candidates answers the searches by a neighbour's row),
expanding ranges into new partial matches in blocks of at most ``BLOCK`` rows. Conditions are
evaluated on whole blocks (compiled to numpy where the expression
allows, else the single-statement path's Python function per binding). A leaf whose extensions
are only counted builds none: without conditions each range is its count; where every condition
is monotone in a column of the new event (``engine.multi_rays``), a binary search over the
column's distinct values per distinct binding of the other events gives an interval of ranks,
and a compiled loop (``cer_shared_kernels``) counts the candidates of each range inside it. A node
whose extensions are built (inner nodes; leaves finishing a counted Kleene closure, a negation or
rows to return) and whose conditions are all such rays lists its surviving candidates the same
way when the binary searches cost less than evaluating the conditions on every candidate. Such a
node followed by one or two plain steps (no condition, gate or unit of their own) that end in a
counted leaf builds neither its pairs nor their extensions (``Evaluator.count_through``): a
compiled loop over the survivors adds up each one's extensions, the next step's range or a
difference of running sums of the last step's range starts.

Where every unit below a node only counts its matches, the partial matches are aggregated
(``Evaluator.aggregate_extend``): a step that extends the bound events at one end of the sequence
and whose search neighbour no later step reads builds one partial match per group (the far end's
key and the slots later steps read) and candidate, weighed by how many partial matches it stands
for, so SEQ(A, B, C, D) finds C per first key and C, not per pair of A and B. A negated element
between two bound events that no condition reads is a *gate* of the node binding the later of
them (``Node.gates``): the candidate range ends at the first negated event after the neighbour,
and the unit's matches need no check.

``Evaluator.run(roots, lo, hi)`` finds the matches whose last event has a composite key in
``[lo, hi)``; a workload may use a different plan for each such slice of the stream (re-planning)
and still finds every match exactly once. The same holds for parts of one range, and each root's
tree finds its matches alone: with ``threads``, the roots' trees - over parts of the range cut at
keys when it is long - are tasks that forks of the evaluator (each with its own sinks and counters,
the plan's caches shared) take in threads of their own, the costliest first; numpy and the compiled
loops release the GIL for much of the work. The forks' matches are merged into the evaluator's.
"""
from __future__ import annotations

import collections
import math
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from matchrec import budget
from matchrec.operators.cer_columns import ABSENT, MatchColumns
from matchrec.errors import DataError
from matchrec.operators.cer_common import too_many

__all__ = ["BLOCK", "Cond", "Neg", "Kleene", "Unit", "Node", "Stream", "PatternSink", "Evaluator", "Unshareable",
           "subsets"]

BLOCK = 1 << 18  # partial matches built at once by one extension
LIMIT_KEY = 1 << 62
STEP_CALLS = 256  # a binary search step's numpy calls cost about as much as comparing this many candidates
LOOKUP_SHARE = 8  # a class's position table is built once its searches have looked up this share of the rows
LOOKUP_ENTRIES = 1 << 24  # rows of position tables a stream keeps at most (4 bytes each)
PART_ROWS = 200_000  # each thread of a parallel run takes at least this many rows of the range (below
# about 150,000 rows a part, measured on flights-3m, two parts ran slower than one: twice the numpy
# calls on arrays half as long, and the GIL held for each call's Python side)
THREAD_ROWS = 100_000  # a read of at least this many rows runs its trees (and its closed-form counts) on
# threads: power's monitoring rules took 0.54 s on one thread and 0.42 s on two at 300,000 rows, 0.27 s
# and 0.26 s at 100,000, and 0.19 s against 0.20 s at 60,000; flights-3m's (159,890 rows read) 0.51 s
# against 0.38 s


class Unshareable(Exception):
    """The stream cannot be laid on one integer axis (keys and windows too large)."""


@dataclass
class Cond:
    """A condition over several variables: ``fn`` on one binding (var -> row), as the single-statement
    path compiles it; ``vec`` on a binding of arrays, when the expression compiles to numpy."""
    vars: frozenset
    fn: Callable[[dict], object]
    vec: Callable[[dict], np.ndarray] | None = None
    text: str = ""
    rays: object = field(default_factory=dict)  # .get(var): the condition as rays of a column (engine.multi_rays)

    def holds(self, b: dict) -> np.ndarray:
        """Truth per element of a binding of equal-length row arrays (NULL is false)."""
        if self.vec is not None:
            try:
                return self.vec(b)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError, FloatingPointError):
                pass  # the Python function decides (and raises what the single-statement path raises)
        names = sorted(self.vars)
        cols = [b[v].tolist() for v in names]
        n = len(cols[0]) if cols else 0
        out = np.zeros(n, bool)
        d: dict = {}
        fn = self.fn
        for i, vals in enumerate(zip(*cols)):
            for v, x in zip(names, vals):
                d[v] = x
            r = fn(d)
            out[i] = r is not None and bool(r)
        return out


@dataclass
class Neg:
    """A negated element of a unit: no event of class ``cls`` between its positive neighbours
    (``prev``/``next``: indexes into the unit's variables; None: the window before the first /
    after the last event) for which every ``linked`` condition holds."""
    cls: int
    var: str
    prev: int | None
    next: int | None
    linked: list = field(default_factory=list)


@dataclass
class Kleene:
    """A Kleene element counted, not bound: between the unit's variables ``prev`` and ``next``
    (adjacent in the sequence), any set of ``lo`` to ``hi`` (None: unbounded) candidates of class
    ``cls`` with keys strictly between theirs, at most one per key (``tied_subsets``). A closure
    that ends the sequence has no ``next``: its candidates lie after ``prev`` and at most the window
    after the match's first event; one that starts it has no ``prev``: they lie before ``next`` and
    at most the window before the match's last event. Valid when no condition reads the element;
    negations beside it (on one side) are its ``gate``, not ``Neg``s of the unit."""
    cls: int
    prev: int | None
    next: int | None
    lo: int
    hi: int | None
    # Negated elements (their classes; no conditions) between the closure and ``prev`` (``gate_after``
    # False: no event of any of them between ``prev`` and the set's first candidate) or ``next``
    # (True: between the set's last candidate and ``next``), instead of ``Neg``s of the unit.
    gate: tuple = ()
    gate_after: bool = False


@dataclass
class Unit:
    """One alternative of a pattern: its positive single-event elements in sequence order (and,
    for a counted pattern, its Kleene elements as factors)."""
    pattern: int
    vars: list  # positive single-event variables in sequence order
    classes: list  # class id per variable
    conds: list  # Cond over the positive variables
    negs: list  # Neg
    window: int  # in key units (unclamped)
    label: str = ""
    kleene: list = field(default_factory=list)  # Kleene: each match stands for that many matches
    # Neg between two bound variables, read by no condition: applied by the node binding the later
    # of the two (``Node.gates``), not checked on the unit's matches
    gates: list = field(default_factory=list)


@dataclass
class Node:
    """A step of the plan: binds slot ``depth - 1`` to a candidate of class ``cls``."""
    cls: int
    depth: int
    pred: int | None  # slot of the bound element just before this one in the sequence
    succ: int | None  # slot of the bound element just after it
    window: int  # the largest window of the units using the node (unclamped)
    conds: list = field(default_factory=list)  # (Cond, {var: slot}) decided at this step
    children: list = field(default_factory=list)
    finishing: list = field(default_factory=list)  # (unit index, slot per unit variable)
    users: list = field(default_factory=list)  # unit indexes using the node
    label: str = ""
    # (class, True): no event of the class between ``pred`` and the new event - the range ends at
    # the first one after ``pred`` (an event at the new one's key is not between them); (class,
    # False): none between the new event and ``succ``
    gates: list = field(default_factory=list)


class Stream:
    """The rows of a workload's read on one integer axis, and each class's candidates on it."""

    def __init__(self, key: np.ndarray, pid: np.ndarray | None, masks: list, wmax: int):
        key = np.asarray(key, np.int64)
        n = len(key)
        self.n = n
        pid = np.zeros(n, np.int64) if pid is None else np.asarray(pid, np.int64)
        if n:
            starts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
            ends = np.r_[starts[1:], n]
            kmin = key[starts]
            spans = key[ends - 1] - kmin
        else:
            starts = ends = kmin = spans = np.zeros(0, np.int64)
        maxspan = int(spans.max()) if len(spans) else 0
        self.cap = maxspan + 1  # a window at least this long allows every pair in a partition
        gap = min(int(wmax), self.cap) + 2
        total = int(spans.astype(object).sum()) + len(spans) * gap if len(spans) else 0
        if total >= LIMIT_KEY:
            raise Unshareable("the partitions' key ranges do not fit one 62-bit axis")
        offsets = np.zeros(len(spans), np.int64)
        if len(spans) > 1:
            offsets[1:] = np.cumsum(spans[:-1] + gap)
        part_of = np.repeat(np.arange(len(starts)), ends - starts)
        self.ck = key - kmin[part_of] + offsets[part_of] if n else np.zeros(0, np.int64)
        # time covered, without the gaps between partitions (for rates)
        self.real = self.ck - part_of.astype(np.int64) * gap if n else np.zeros(0, np.int64)
        self.rows = []
        self.cks = []
        for m in masks:
            r = np.flatnonzero(m)
            self.rows.append(r)
            self.cks.append(self.ck[r])
        self._tables: dict = {}  # (class, right) -> each row's position among the class's candidates
        self._lock = threading.Lock()
        self._looked_up: dict = {}  # (class, right) -> rows searched before its table was built
        self._ties = None  # per row: the first and the end row of the rows sharing its composite key
        self._groups = None  # ``key_groups``
        self._table_rows = 0
        # (class, column) -> (the column's values, ``Evaluator.ranks`` of them): a workload's
        # closed-form counts and its shared nodes rank the same columns in separate evaluators
        self.ranked: dict = {}

    def after(self, cls: int, rows: np.ndarray) -> np.ndarray:
        """Per row: how many candidates of class ``cls`` have a composite key at most the row's
        (``np.searchsorted(cks[cls], ck[rows], "right")``)."""
        return self._positions(cls, rows, True)

    def before(self, cls: int, rows: np.ndarray) -> np.ndarray:
        """Per row: how many candidates of class ``cls`` have a composite key below the row's
        (``np.searchsorted(cks[cls], ck[rows], "left")``)."""
        return self._positions(cls, rows, False)

    def _positions(self, cls: int, rows: np.ndarray, right: bool) -> np.ndarray:
        # A node extends many partial matches by binary searches whose keys are rows' keys: once a
        # class has been searched for a share of the stream's rows, a table of every row's position
        # (one pass over the stream) makes each further search a gather, several times faster.
        key = (cls, right)
        table = self._tables.get(key)
        if table is None:
            looked = self._looked_up[key] = self._looked_up.get(key, 0) + len(rows)
            if looked * LOOKUP_SHARE < self.n or self._table_rows + self.n > LOOKUP_ENTRIES or not self.ordered():
                return np.searchsorted(self.cks[cls], self.ck[rows], "right" if right else "left")
            with self._lock:  # built once when parts of a parallel run ask at once
                table = self._tables.get(key)
                if table is None:
                    table = self._tables[key] = self._position_table(cls, right)
                    self._table_rows += self.n
        return table[rows].astype(np.int64)

    def ordered(self) -> bool:
        """Whether the composite keys do not decrease along the rows (as the read sorts them)."""
        if self._ties is None:
            ck, n = self.ck, self.n
            if n > 1 and not bool((ck[1:] >= ck[:-1]).all()):
                self._ties = False
                return False
            change = np.ones(n, bool)
            np.not_equal(ck[1:], ck[:-1], out=change[1:])
            starts = np.flatnonzero(change)
            group = np.cumsum(change) - 1
            ends = np.append(starts[1:], n)
            self._ties = (starts[group], ends[group])
        return self._ties is not False

    def key_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(per row, the index of its run of equal composite keys; each run's key), the keys in row
        order (``ordered``)."""
        got = self._groups
        if got is None:
            change = np.ones(self.n, bool)
            np.not_equal(self.ck[1:], self.ck[:-1], out=change[1:])
            got = self._groups = (np.cumsum(change) - 1, self.ck[change])
        return got

    def _position_table(self, cls: int, right: bool) -> np.ndarray:
        # The candidates with a key at most a row's are the class's rows before the end of that
        # row's run of equal keys (below it: before the run's start), the keys being in row order.
        dtype = np.int32 if self.n < 1 << 31 else np.int64
        mark = np.zeros(self.n, dtype)
        mark[self.rows[cls]] = 1
        before = np.zeros(self.n + 1, dtype)
        np.cumsum(mark, out=before[1:])
        first, end = self._ties
        return before[end if right else first]

    def clamp(self, w: int) -> int:
        return min(int(w), self.cap)

    def slices(self, events: int) -> list[tuple[int, int, int, int]]:
        """The stream cut into slices of about ``events`` rows, never between equal composite keys:
        (first row, end row, lo, hi) with the slice's composite keys in [lo, hi)."""
        n = self.n
        out = []
        q = 0
        while q < n:
            q1 = min(n, q + max(1, events))
            if q1 < n:
                q1 = int(np.searchsorted(self.ck, self.ck[q1 - 1], "right"))
            lo = int(self.ck[q])
            hi = int(self.ck[q1]) if q1 < n else int(self.ck[-1]) + 1
            out.append((q, q1, lo, hi))
            q = q1
        return out

    def counts(self, lo: int, hi: int) -> list[int]:
        """Candidates of each class with composite key in [lo, hi)."""
        return [int(np.searchsorted(c, hi, "left") - np.searchsorted(c, lo, "left")) for c in self.cks]


def _subtree(node: Node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


def on_threads(take: Callable[[int], None], n: int, stop: threading.Event, name: str) -> None:
    """``take(i)`` for i in 1..n-1 on threads named ``name`` and ``take(0)`` on the calling thread,
    each taking work until there is none or ``stop`` is set. The first error any of them raises
    sets ``stop`` and is raised here once every thread has ended; an interrupt of the calling
    thread while it waits (Ctrl-C, the memory watcher) sets ``stop`` too: no thread outlives the
    call."""
    errors: list = []

    def guarded(i: int) -> None:
        try:
            take(i)
        except BaseException as err:  # re-raised by the calling thread once every thread ended
            errors.append(err)
            stop.set()
    workers = [threading.Thread(target=guarded, args=(i,), name=name, daemon=True) for i in range(1, n)]
    for t in workers:
        t.start()
    try:
        guarded(0)
    finally:
        try:
            for t in workers:
                t.join()
        except BaseException:
            stop.set()
            for t in workers:
                t.join()
            raise
    if errors:
        raise errors[0]


def each_on_threads(fn, todo: list, threads: int, name: str, keep_errors: bool = False) -> list:
    """``[fn(x) for x in todo]``, on up to ``threads`` threads taking the items in turn (numpy, Arrow
    and the compiled loops release the interpreter while they work on long arrays). An error in
    any thread stops the others after their current item and is raised here; with
    ``keep_errors``, each item's error is its result instead and every item runs."""
    if keep_errors:
        def fn(x, fn=fn):
            try:
                return fn(x)
            except Exception as err:  # noqa: BLE001 - handed back to the caller in the item's place
                return Failed(err)
    if threads <= 1 or len(todo) < 2:
        return [fn(x) for x in todo]
    out: list = [None] * len(todo)
    queue = collections.deque(range(len(todo)))
    stop = threading.Event()

    def take(_: int) -> None:
        while not stop.is_set():
            try:
                j = queue.popleft()
            except IndexError:
                return
            out[j] = fn(todo[j])
    on_threads(take, min(threads, len(todo)), stop, name)
    return out


@dataclass
class Failed:
    """An item's error, in its place in ``each_on_threads``' results (``keep_errors``)."""
    error: Exception


class _Stopped(BaseException):
    """A thread of a parallel run stops: another failed or was interrupted (``Evaluator.run``)."""


class PatternSink:
    """The matches (or their number) of one pattern, from all its units; alternatives binding the
    same variables are deduplicated."""

    def __init__(self, counting: bool, max_matches: int | None, shared_varsets: set):
        self.counting = counting
        self.max = max_matches
        self.shared = shared_varsets  # varsets bound by more than one unit of the pattern
        self.n = 0
        self.blocks: dict = {}

    def add(self, names: list, rows: list, repeats: np.ndarray | None = None) -> None:
        """Matches binding ``names`` to ``rows`` (an array per name); ``repeats``: how many times each
        one is a match (a Kleene closure's sets the result does not read)."""
        if repeats is not None:
            rows = [np.repeat(r, repeats) for r in rows]
        m = len(rows[0]) if rows else 0
        if m == 0:
            return
        key = frozenset(names)
        dedupe = key in self.shared
        if self.counting and not dedupe:
            self.n += m
            return
        # kept column by column, in the variables' name order: ``finish`` concatenates each
        # variable's arrays (a matrix per block cost a stack here and a strided copy there)
        order = sorted(range(len(names)), key=lambda i: names[i])
        self.blocks.setdefault(key, []).append([np.asarray(rows[i], np.int64) for i in order])
        if not dedupe:
            self.n += m
            if not self.counting and self.max is not None and self.n > self.max:
                raise too_many(self.max)

    def add_count(self, n: int) -> None:
        """``n`` matches that need neither keeping nor deduplication (counted Kleene closures)."""
        self.n += n

    def merge(self, other: "PatternSink") -> None:
        """The matches ``other`` (another thread's sink of the same pattern) found, after this
        one's; ``finish`` checks the limit on them all."""
        self.n += other.n
        for key, cols in other.blocks.items():
            self.blocks.setdefault(key, []).extend(cols)

    def finish(self) -> tuple[int, MatchColumns | None]:
        """(number of matches, the matches as ``MatchColumns`` or None when counting)."""
        if not self.counting:
            return self._columns()
        n = self.n
        for key, cols in self.blocks.items():  # only the shared varsets are kept when counting
            n += len(self._distinct(cols))
        return n, None

    @staticmethod
    def _joined(cols: list) -> list:
        """One array per variable of the blocks ``cols`` (each a list of arrays, one per variable)."""
        if len(cols) == 1:
            return cols[0]
        return [np.concatenate([c[j] for c in cols]) for j in range(len(cols[0]))]

    @classmethod
    def _distinct(cls, cols: list) -> np.ndarray:
        """The distinct matches of the blocks ``cols`` as a matrix (a column per variable)."""
        return np.unique(np.stack(cls._joined(cols), axis=1), axis=0)

    def _columns(self) -> tuple[int, MatchColumns]:
        parts = []  # (variables in order, an array of rows per variable)
        for key, cols in self.blocks.items():
            if key in self.shared:
                m = self._distinct(cols)
                parts.append((sorted(key), [m[:, j] for j in range(m.shape[1])]))
            else:
                parts.append((sorted(key), self._joined(cols)))
        lengths = [len(arrays[0]) for _, arrays in parts]
        n = sum(lengths)
        if self.max is not None and n > self.max:
            raise too_many(self.max)
        if len(parts) == 1:  # one set of variables: its arrays are the columns
            names, arrays = parts[0]
            return n, MatchColumns(n, {v: np.ascontiguousarray(a) for v, a in zip(names, arrays)}, {}, {})
        rows: dict = {}
        at = 0
        for (names, arrays), m in zip(parts, lengths):
            for var, a in zip(names, arrays):
                if var not in rows:
                    rows[var] = np.full(n, ABSENT, np.int64)
                rows[var][at:at + m] = a
            at += m
        return n, MatchColumns(n, rows, {}, {})


class _PMs:
    """Partial matches: a row array per bound slot, and the smallest / largest composite key.
    Aggregated ones (``Evaluator.aggregate_extend``) also carry ``w``, how many partial matches
    each stands for, and None for the slots no later step reads."""
    __slots__ = ("rows", "lo", "hi", "w")

    def __init__(self, rows, lo, hi, w=None):
        self.rows, self.lo, self.hi, self.w = rows, lo, hi, w

    def __len__(self):
        return len(self.lo)

    def take(self, sel) -> "_PMs":
        return _PMs([None if r is None else r[sel] for r in self.rows], self.lo[sel], self.hi[sel],
                    None if self.w is None else self.w[sel])

    def weight(self, at: np.ndarray) -> int:
        """How many partial matches those at the positions ``at`` stand for."""
        return len(at) if self.w is None else _exact_sum(self.w[at])


def _search_runs(ck: np.ndarray, keys: np.ndarray, shift: int, side: str) -> np.ndarray:
    """``np.searchsorted(ck, keys + shift, side)``, one search per run of equal keys: partial
    matches come in runs sharing their first (last) key - a parent's extensions, an aggregated
    group's candidates."""
    n = len(keys)
    if n < 256:
        return np.searchsorted(ck, keys + shift, side)
    new = np.empty(n, bool)
    new[0] = True
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    if len(starts) * 2 > n:
        return np.searchsorted(ck, keys + shift, side)
    found = np.searchsorted(ck, keys[starts] + shift, side)
    return np.repeat(found, np.diff(np.append(starts, n)))


def _dense_ids(parts: list, n: int, exact: bool = False) -> tuple[np.ndarray, int, np.ndarray]:
    """Equal tuples of the arrays ``parts`` (values in ``[0, n]``) numbered densely: (the id of each
    element, how many ids, an element of each id). One array: by a mark per value when the
    elements are many (no sort); several: packed into one integer and sorted once. Tuples too wide
    to pack get an id each, unless ``exact`` (then a sort of the rows)."""
    m = len(parts[0])
    base = n + 1
    if len(parts) == 1 and m * 16 > n:
        mark = np.zeros(base, bool)
        mark[parts[0]] = True
        rank = np.cumsum(mark) - 1
        ids = rank[parts[0]]
        count = int(rank[-1]) + 1
    elif len(parts) == 1 or base ** len(parts) < 1 << 62:
        packed = parts[0].astype(np.int64)
        for r in parts[1:]:
            packed = packed * base + r
        _, inverse = np.unique(packed, return_inverse=True)
        ids = inverse.reshape(-1)
        count = int(ids.max()) + 1 if m else 0
    elif exact:
        _, inverse = np.unique(np.stack(parts, axis=1), axis=0, return_inverse=True)
        ids = inverse.reshape(-1)
        count = int(ids.max()) + 1 if m else 0
    else:
        ids, count = np.arange(m), m
    first = np.empty(count, np.int64)
    first[ids] = np.arange(m)
    return ids.astype(np.int64), count, first


def _exact_sum(x: np.ndarray, by: np.ndarray | None = None) -> int:
    """``sum(x)`` (times ``by`` elementwise) as a Python int, exact past int64."""
    f = x.astype(np.float64) if by is None else x.astype(np.float64) * by.astype(np.float64)
    if float(f.sum()) < 2.0 ** 62:
        return int(x.sum()) if by is None else int(np.dot(x.astype(np.int64), by.astype(np.int64)))
    if by is None:
        return sum(x.tolist())
    return sum(a * b for a, b in zip(x.tolist(), by.tolist()))


def _sum_by(ids: np.ndarray, w: np.ndarray, size: int) -> np.ndarray:
    """Per id in ``range(size)``, the sum of the int64 weights ``w`` of the elements with it (exact)."""
    total = float(w.astype(np.float64).sum())
    if total < 2.0 ** 52:  # float sums of integers below 2^53 are exact
        return np.rint(np.bincount(ids, weights=w, minlength=size)).astype(np.int64)
    out = np.zeros(size, np.int64 if total < 2.0 ** 62 else object)
    np.add.at(out, ids, w if total < 2.0 ** 62 else w.astype(object))
    return out


class Evaluator:
    """Runs plans of shared nodes over a stream, sending each unit's matches to its pattern's sink."""

    aggregate = True  # extend into aggregated partial matches where that builds fewer (``aggregate_extend``)

    def __init__(self, stream: Stream, units: list, sinks: list, block: int = BLOCK):
        self.s = stream
        self.units = units
        self.sinks = sinks
        self.block = max(1, int(block))
        self.work = {"partial_matches": 0, "searches": 0, "candidates": 0, "matches": 0, "aggregated": 0}
        self._tied: dict = {}  # class -> whether two of its candidates share a key
        self._counted: dict = {}  # id(node) -> (node, whether its extensions are only counted)
        self._weighed: dict = {}  # id(node) -> (node, whether they are counted with Kleene weights)
        self._rays: dict = {}  # id(node) -> (node, its conditions as rays or None: ``ray_spec``)
        self._runs: dict = {}  # class -> its candidates' runs of equal keys (``_tied_arrays``)
        self._scratch = None  # a position per stream row (``_scattered_ids``)
        self._needs: dict = {}  # id(node) -> (node, the parent's slots it and the steps below read: ``_reads``)
        self._plain: dict = {}  # id(node) -> (node, ``plain_leaf``)
        # the statement's step budget: a candidate tried in a block is one step (numpy, as compiled)
        self.spend = budget.current().spend

    def run(self, roots: list, lo: int, hi: int, threads: int = 1) -> None:
        """Every match whose last event has a composite key in [lo, hi); with ``threads`` above one,
        the roots' trees (and the parts of a long range) run at once (see the module's docstring)."""
        tasks = self._tasks(roots, lo, hi, threads)
        if len(tasks) <= 1:
            self._run(roots, lo, hi)
            return
        stop = threading.Event()
        lock = threading.Lock()
        own = self.spend

        def spend(steps: int, own=own) -> None:  # one budget for every thread, and a stop for all
            if stop.is_set():
                raise _Stopped()
            with lock:
                own(steps)
        queue = collections.deque(tasks)  # taken from by every thread: the costliest first
        forks = [self._fork(spend) for _ in range(min(threads, len(tasks)) - 1)]
        evaluators = [self] + forks

        def take(i: int) -> None:
            ev = evaluators[i]
            try:
                while not stop.is_set():
                    try:
                        root, a, b = queue.popleft()
                    except IndexError:
                        return
                    ev._run([root], a, b)
            except _Stopped:
                pass
        self.spend = spend
        try:
            on_threads(take, len(evaluators), stop, "matchrec-shared")
        finally:
            self.spend = own
        for f in forks:
            for mine, theirs in zip(self.sinks, f.sinks):
                mine.merge(theirs)
            for k, v in f.work.items():
                self.work[k] += v

    def _tasks(self, roots: list, lo: int, hi: int, threads: int) -> list:
        """(root, lo, hi) per root's tree and part of [lo, hi), the costliest first (its class's
        candidates in the range times its tree's nodes); a range is cut at keys into parts of
        about equal rows, at least ``PART_ROWS`` each, only when it is long."""
        s = self.s
        if threads <= 1:
            return [(r, lo, hi) for r in roots]
        cuts = [lo, hi]
        if s.ordered():
            i0, i1 = (int(i) for i in np.searchsorted(s.ck, [lo, hi], "left"))
            parts = min(int(threads), (i1 - i0) // PART_ROWS)
            if parts > 1:
                cuts = [lo] + sorted({int(s.ck[i0 + (i1 - i0) * k // parts]) for k in range(1, parts)} - {lo}) + [hi]
        tasks = []
        for r in roots:
            size = sum(1 for _ in _subtree(r))
            ck = s.cks[r.cls]
            w = s.clamp(r.window)
            for a, b in zip(cuts, cuts[1:]):
                n = int(np.searchsorted(ck, b, "left") - np.searchsorted(ck, a - w, "left"))
                tasks.append((n * size, len(tasks), (r, a, b)))
        return [t for _, _, t in sorted(tasks, key=lambda x: (-x[0], x[1]))]

    def _fork(self, spend) -> "Evaluator":
        """An evaluator of the same plan over the same stream with its own sinks, counters and
        scratch; the caches of the plan's nodes, ranks and runs are shared (each entry is the same
        whoever computes it)."""
        other = Evaluator.__new__(Evaluator)
        other.__dict__.update(self.__dict__)
        other.sinks = [PatternSink(k.counting, k.max, k.shared) for k in self.sinks]
        other.work = dict.fromkeys(self.work, 0)
        other._scratch = None
        other.spend = spend
        return other

    def _run(self, roots: list, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        s = self.s
        self.cap_hi = [int(np.searchsorted(c, hi, "left")) for c in s.cks]
        for root in roots:
            w = s.clamp(root.window)
            ck = s.cks[root.cls]
            a = int(np.searchsorted(ck, lo - w, "left"))
            b = self.cap_hi[root.cls]
            rows = s.rows[root.cls]
            for q in range(a, b, self.block):
                q1 = min(b, q + self.block)
                c = ck[q:q1]
                pm = _PMs([rows[q:q1]], c, c)
                pm = self.check(root, pm)
                if len(pm):
                    self.process(root, pm)

    # ---------------------------------------------------------------- nodes
    def check(self, node: Node, pm: _PMs) -> _PMs:
        for cond, slots in node.conds:
            if not len(pm):
                break
            keep = cond.holds({v: pm.rows[j] for v, j in slots.items()})
            if not keep.all():
                pm = pm.take(keep)
        return pm

    def process(self, node: Node, pm: _PMs) -> None:
        self.work["partial_matches"] += len(pm)
        for u, slots in node.finishing:
            self.emit(node, u, slots, pm)
        for child in node.children:
            self.extend(child, pm)

    def extend(self, node: Node, pm: _PMs) -> None:
        s = self.s
        ck, rows = s.cks[node.cls], s.rows[node.cls]
        w = s.clamp(node.window)
        self.work["searches"] += len(pm)
        # A bound neighbour lies within [lo, hi] of the partial match, so where the span is at most
        # the window (the others are dropped below) it bounds the range at least as tightly as the
        # window does: one binary search instead of two.
        if node.pred is not None:
            a = s.after(node.cls, pm.rows[node.pred])
        else:
            a = _search_runs(ck, pm.hi, -w, "left")
        if node.succ is not None:
            b = s.before(node.cls, pm.rows[node.succ])
        else:
            b = _search_runs(ck, pm.lo, w, "right")
        np.minimum(b, self.cap_hi[node.cls], out=b)
        np.maximum(a, int(np.searchsorted(ck, self.lo - w, "left")), out=a)
        for g, binds_next in node.gates:
            gk = s.cks[g]
            if not len(gk):
                continue
            if binds_next:
                at = s.after(g, pm.rows[node.pred])  # the first negated event after pred
                cut = np.searchsorted(ck, gk[np.minimum(at, len(gk) - 1)], "right")
                np.minimum(b, np.where(at < len(gk), cut, b), out=b)
            else:
                at = s.before(g, pm.rows[node.succ])  # the last negated event before succ
                cut = np.searchsorted(ck, gk[np.maximum(at - 1, 0)], "left")
                np.maximum(a, np.where(at > 0, cut, a), out=a)
        counts = b - a
        np.maximum(counts, 0, out=counts)
        counts[(pm.hi - pm.lo) > w] = 0  # the parent keeps a larger window than this node's units
        if not counts.any():
            return
        counted = self.counted_leaf(node)
        if counted and not node.conds:
            self.count_ranges(node, pm, a, counts)
            return
        if counted and self.count_ranked(node, pm, a, counts):
            return
        weighed = not counted and self.weighed_leaf(node)
        live = np.flatnonzero(counts)
        if len(live) < len(counts):
            pm, a, counts = pm.take(live), a[live], counts[live]
        if not counted and self.aggregate and self.aggregate_extend(node, pm, a, counts):
            return
        cum = np.cumsum(counts)
        bounds = self.rank_bounds(node, pm, int(cum[-1])) if node.conds else None
        if bounds is not None and self.count_through(node, pm, a, counts, bounds):
            return
        start = 0
        m = len(counts)
        while start < m:
            base = int(cum[start - 1]) if start else 0
            end = max(start + 1, int(np.searchsorted(cum, base + self.block, "right")))
            cnt = counts[start:end]
            tot = int(cum[end - 1]) - base
            self.work["candidates"] += tot
            self.spend(tot)
            if bounds is not None:
                idx, j = self.ranked_survivors(bounds, a[start:end], cnt, start, tot)
            else:
                idx = np.repeat(np.arange(start, end), cnt)
                # candidate positions: each range's start, less where its run begins, plus the run position
                j = np.repeat(a[start:end] - (cum[start:end] - cnt - base), cnt)
                j += np.arange(tot)
                if node.conds:
                    idx, j = self.survivors(node, pm, idx, rows[j], j)
            if counted or weighed:
                if len(idx):
                    late = (pm.hi[idx] < self.lo) & (ck[j] < self.lo)  # the match ends before this range
                    if counted:
                        self.add_counted(node, pm.weight(idx) - pm.weight(idx[late]))
                    else:
                        if late.any():
                            idx, j = idx[~late], j[~late]
                        self.add_weighed(node, pm, idx, rows[j])
            elif len(idx) and pm.w is None and self.plain_leaf(node):
                self.emit_leaf(node, pm, idx, rows[j], ck, j)
            elif len(idx):
                new_ck = ck[j]
                self.process(node, _PMs([None if r is None else r[idx] for r in pm.rows] + [rows[j]],
                                        np.minimum(pm.lo[idx], new_ck), np.maximum(pm.hi[idx], new_ck),
                                        None if pm.w is None else pm.w[idx]))
            start = end

    # ---------------------------------------------------------------- aggregated partial matches
    def aggregate_extend(self, node: Node, pm: _PMs, a: np.ndarray, counts: np.ndarray) -> bool:
        """Extend ``pm`` (ranges ``[a, a + counts)`` of ``node``'s candidates, none empty) into
        aggregated partial matches when no later step reads the bound neighbour that orders the
        search: the node extends the sequence at its end (``pred`` bound, ``succ`` not; then the
        match's last key is the new event's, its first key the parent's) or at its start (the
        mirror), every unit below counts its matches, and neither this node's conditions nor a
        later step reads ``pred`` (``succ``). The partial matches that agree on the slots read
        later and on the far end's key are a group: each candidate in the union of their ranges
        becomes one partial match standing for the sum of the weights of the group's partial
        matches whose range holds it (running sums), instead of one per partial match and
        candidate. A sequence's third element is found for each first event's key and candidate,
        not for each pair of the first two. False (nothing done) where that would not build at
        most half the partial matches."""
        if (node.pred is None) == (node.succ is None):
            return False
        reads = self._below(node)
        if reads is None:
            return False
        right = node.pred is not None
        near = node.pred if right else node.succ
        reads = reads - {node.depth - 1}
        if near in reads:
            return False
        kept = sorted(reads)
        far = pm.lo if right else pm.hi
        gid, ng, first = self._groups(pm, far, kept)
        end = a + counts
        lo_g = np.full(ng, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(lo_g, gid, a)
        hi_g = np.zeros(ng, np.int64)
        np.maximum.at(hi_g, gid, end)
        sizes = hi_g - lo_g
        built = int(sizes.sum())
        if built * 2 > int(counts.sum()):
            return False
        w = np.ones(len(pm), np.int64) if pm.w is None else pm.w
        per_group = np.bincount(gid, weights=w.astype(np.float64), minlength=ng)
        if float((per_group * sizes).sum()) >= 2.0 ** 62:
            raise DataError("more than 2^62 partial matches: the windows hold too many events of the "
                            "pattern's elements to count its matches; narrow the WITHIN window")
        # A group's candidates [lo_g, hi_g) laid one group after another: each partial match adds its
        # weight where its range begins and takes it off where it ends, and running sums within each
        # group give every candidate the weight of the partial matches whose range holds it.
        offs = np.zeros(ng + 1, np.int64)
        np.cumsum(sizes, out=offs[1:])
        acc = _sum_by(offs[gid] + (a - lo_g[gid]), w, built + 1)
        inside = end < hi_g[gid]  # the others end with their group
        acc -= _sum_by(offs[gid[inside]] + (end[inside] - lo_g[gid[inside]]), w[inside], built + 1)
        run = np.cumsum(acc[:built])
        run -= np.repeat(np.r_[0, run[offs[1:-1] - 1]], sizes)
        gapped = bool(node.gates)
        ck, rows = self.s.cks[node.cls], self.s.rows[node.cls]
        g0 = 0
        while g0 < ng:
            g1 = max(g0 + 1, int(np.searchsorted(offs, offs[g0] + self.block, "right")) - 1)
            g1 = min(g1, ng)
            n = int(offs[g1] - offs[g0])
            self.work["candidates"] += n
            self.work["aggregated"] += n
            self.spend(n)
            grp = np.repeat(np.arange(g0, g1), sizes[g0:g1])
            j = np.arange(n, dtype=np.int64) + np.repeat(lo_g[g0:g1] - (offs[g0:g1] - offs[g0]), sizes[g0:g1])
            src = first[grp]
            new_rows = rows[j]
            new_ck = ck[j]
            out_rows = [pm.rows[i][src] if i in reads else None for i in range(len(pm.rows))] + [new_rows]
            fk = far[src]
            out = _PMs(out_rows, fk if right else new_ck, new_ck if right else fk, run[offs[g0]:offs[g1]])
            if gapped:  # candidates no partial match's range holds (ranges cut short by a gate)
                out = out.take(out.w > 0)
            out = self.check(node, out)
            if len(out):
                self.process(node, out)
            g0 = g1
        return True

    def _groups(self, pm: _PMs, far: np.ndarray, kept: list) -> tuple[np.ndarray, int, np.ndarray]:
        """The partial matches grouped by the rows of the ``kept`` slots and the ``far`` key: (group
        of each, how many groups, a member of each). Rows and keys are numbered densely by marks
        over the stream where that can be (a sort of many partial matches costs far more)."""
        s = self.s
        n = len(pm)
        parts = [pm.rows[j] for j in kept]
        if not any(np.array_equal(s.ck[r], far) for r in parts):  # else a kept row fixes the key
            if not parts and bool((far[1:] >= far[:-1]).all()):  # as partial matches from roots in key order
                new = np.ones(n, bool)
                np.not_equal(far[1:], far[:-1], out=new[1:])
                gid = np.cumsum(new) - 1
                return gid, int(gid[-1]) + 1, np.flatnonzero(new)
            if s.ordered():  # the first row with the key stands for it
                parts.append(np.searchsorted(s.ck, far, "left"))
            else:
                _, inverse = np.unique(far, return_inverse=True)
                parts.append(inverse.reshape(-1))
        return _dense_ids(parts, s.n, exact=True)

    def _reads(self, node: Node) -> set | None:
        """The slots of its parent's partial matches that ``node`` and every step below it read
        (besides the first and last keys), or None when a unit below needs its matches' rows
        (it returns them, or deduplicates them against another alternative)."""
        below = self._below(node)
        if below is None:
            return None
        return (below | {j for j in (node.pred, node.succ) if j is not None}) - {node.depth - 1}

    def _below(self, node: Node) -> set | None:
        """The slots of ``node``'s partial matches (its new one included) that its conditions, the
        units it finishes and the steps below it read; None as ``_reads``."""
        got = self._needs.get(id(node))
        if got is not None and got[0] is node:
            return got[1]
        reads: set | None = set()
        for _, sl in node.conds:
            reads.update(sl.values())
        for u, slots in node.finishing:
            unit = self.units[u]
            sink = self.sinks[unit.pattern]
            if not sink.counting or frozenset(unit.vars) in sink.shared:
                reads = None
                break
            for g in unit.negs:
                reads.update(slots[i] for i in (g.prev, g.next) if i is not None)
                linked = set().union(*(c.vars for c in g.linked)) if g.linked else set()
                reads.update(slots[i] for i, v in enumerate(unit.vars) if v in linked)
            for k in unit.kleene:
                reads.update(slots[i] for i in (k.prev, k.next) if i is not None)
        for child in node.children if reads is not None else ():
            below = self._reads(child)
            if below is None:
                reads = None
                break
            reads |= below
        self._needs[id(node)] = (node, reads)
        return reads

    # ---------------------------------------------------------------- leaves counted
    def counted_leaf(self, node: Node) -> bool:
        """Whether ``node``'s extensions need only be counted: it has no children, and every unit it
        finishes counts its matches (COUNT(*)) with nothing left to check on them - no negation, no
        counted Kleene closure, no deduplication against another alternative, its pattern's window
        the node's own. Its partial matches are then never built."""
        got = self._counted.get(id(node))
        if got is not None and got[0] is node:
            return got[1]
        s = self.s
        counted = not node.children and bool(node.finishing)
        for u, _ in node.finishing if counted else ():
            unit = self.units[u]
            sink = self.sinks[unit.pattern]
            if (not sink.counting or frozenset(unit.vars) in sink.shared or unit.negs or unit.kleene
                    or s.clamp(unit.window) != s.clamp(node.window)):
                counted = False
                break
        self._counted[id(node)] = (node, counted)  # the node kept: a re-plan's new node may reuse an id
        return counted

    def weighed_leaf(self, node: Node) -> bool:
        """Whether ``node``'s extensions need only be counted, each weighed by the counted Kleene
        closures of the units it finishes (``kleene_count``): as ``counted_leaf``, but a unit may
        count Kleene closures. Their partial matches are then never built: the weights read only
        the rows of the closures' neighbours."""
        got = self._weighed.get(id(node))
        if got is not None and got[0] is node:
            return got[1]
        s = self.s
        weighed = not node.children and bool(node.finishing)
        for u, _ in node.finishing if weighed else ():
            unit = self.units[u]
            sink = self.sinks[unit.pattern]
            if (not sink.counting or frozenset(unit.vars) in sink.shared or unit.negs
                    or s.clamp(unit.window) != s.clamp(node.window)):
                weighed = False
                break
        self._weighed[id(node)] = (node, weighed)
        return weighed

    def add_weighed(self, node: Node, pm: _PMs, idx: np.ndarray, new_rows: np.ndarray) -> None:
        """The extensions (parent ``idx``, candidate row ``new_rows``) of a ``weighed_leaf``: each
        finishing unit's matches, every one standing for its Kleene closures' number of sets."""
        n = len(idx)
        if not n:
            return
        new = len(pm.rows)
        gathered: dict = {new: new_rows}
        weights = None if pm.w is None else pm.w[idx]
        self.work["partial_matches"] += n
        for u, slots in node.finishing:
            unit = self.units[u]
            self.work["matches"] += n
            if not unit.kleene:
                self.sinks[unit.pattern].add_count(n if weights is None else _exact_sum(weights))
                continue
            rows = {}
            for k in unit.kleene:
                for i in (k.prev, k.next):
                    if i is None:
                        continue
                    slot = slots[i]
                    got = gathered.get(slot)
                    if got is None:
                        got = gathered[slot] = pm.rows[slot][idx]
                    rows[i] = got
            lo = hi = None
            if any(k.prev is None or k.next is None for k in unit.kleene):  # a closure at an end reads the span
                new_ck = self.s.ck[new_rows]
                lo, hi = np.minimum(pm.lo[idx], new_ck), np.maximum(pm.hi[idx], new_ck)
            self.sinks[unit.pattern].add_count(self.kleene_count(unit, rows, lo, hi, self.s.clamp(unit.window),
                                                                 weights))

    def add_counted(self, node: Node, n: int) -> None:
        if n <= 0:
            return
        self.work["partial_matches"] += n
        self.work["matches"] += n * len(node.finishing)
        for u, _ in node.finishing:
            self.sinks[self.units[u].pattern].add_count(n)

    def count_ranges(self, node: Node, pm: _PMs, a: np.ndarray, counts: np.ndarray) -> None:
        """A counted leaf without conditions: each partial match's candidate range is its number of
        extensions, less the candidates before the slice when the match would end before it."""
        ck = self.s.cks[node.cls]
        self.work["candidates"] += int(counts.sum())
        early = pm.hi < self.lo
        if early.any():
            first = int(np.searchsorted(ck, self.lo, "left"))
            b = a + counts
            counts = np.where(early, np.maximum(b - np.maximum(a, first), 0), counts)
        self.add_counted(node, _exact_sum(counts) if pm.w is None else _exact_sum(counts, pm.w))

    def count_ranked(self, node: Node, pm: _PMs, a: np.ndarray, counts: np.ndarray) -> bool:
        """A counted leaf whose conditions are rays of columns of its new variable (``Cond.rays``):
        the candidates in each partial match's range with every rank in its binding's interval
        (``rank_bounds``), counted by a compiled loop. False when the conditions are not all rays
        (the extensions are then built and checked)."""
        live = np.flatnonzero(counts)
        bounds = self.rank_bounds(node, pm.take(live) if len(live) < len(counts) else pm)
        if bounds is None:
            return False
        ranks, lows, highs, which = bounds
        a, b = a[live], a[live] + counts[live]
        tried = int(counts.sum())
        early = pm.hi[live] < self.lo  # such a match ends in this slice only with a candidate in it
        if early.any():
            first = int(np.searchsorted(self.s.cks[node.cls], self.lo, "left"))
            a = np.where(early, np.maximum(a, first), a)
        from matchrec.operators.cer_shared_kernels import count_ranked
        self.work["candidates"] += tried
        self.spend(tried)
        if pm.w is None:
            n = int(count_ranked(ranks, a.astype(np.int64), b.astype(np.int64), which, lows, highs))
        else:  # aggregated partial matches: each range's count times the partial matches it stands for
            per = np.empty(len(a), np.int64)
            count_ranked(ranks, a.astype(np.int64), b.astype(np.int64), which, lows, highs, per)
            n = _exact_sum(per, pm.w[live])
        self.add_counted(node, n)
        return True

    def count_through(self, node: Node, pm: _PMs, a: np.ndarray, counts: np.ndarray, bounds) -> bool:
        """A ranked step followed by one or two plain steps ending in a counted leaf: the pairs
        (partial match, ranked survivor) and what follows them are never built. Each plain step has
        no condition, gate or unit finishing at it, is reached from the step before (``pred`` the
        new slot) and ends at the window. For one step, a pair's extensions are the child's range
        [first candidate after the survivor, end of the partial match's window); for two, the sum
        over the middle step's range of the last step's ranges, a difference of running sums (the
        last step's range starts are monotone in the middle candidate). A compiled loop over the
        survivors adds them up (``ranked_then_counted``; the bounds, slice and span checks as
        ``extend`` and ``count_ranges`` make them on the built steps). A sequence's last elements
        after a condition between the two before them cost one check per pair instead of building
        every pair and every extension. False where the shape does not fit (nothing done)."""
        chain = self._plain_chain(node, len(pm.rows))
        if chain is None:
            return False
        s = self.s
        ck, rows = s.cks[node.cls], s.rows[node.cls]
        wins = [s.clamp(c.window) for c in chain]
        a = a.astype(np.int64)
        b = a + counts
        first, last = int(a.min()), int(b.max())
        lo_keys = pm.lo.astype(np.int64)
        # the first plain step's range: from the first candidate after the survivor (not before the
        # slice's reach) to the end of the partial match's window; the survivor follows ``pred``,
        # so the partial match's first key stays
        c2 = chain[0]
        ck2 = s.cks[c2.cls]
        after = s.after(c2.cls, rows[first:last]).astype(np.int64)
        np.maximum(after, int(np.searchsorted(ck2, self.lo - wins[0], "left")), out=after)
        end = _search_runs(ck2, lo_keys, min(wins), "right").astype(np.int64)
        np.minimum(end, self.cap_hi[c2.cls], out=end)
        slice_first = int(np.searchsorted(s.cks[chain[-1].cls], self.lo, "left"))
        none = np.zeros(1, np.int64)
        if len(chain) == 1:
            bound = counts.astype(np.float64) * np.maximum(end - int(after.min()), 0)
            starts = floored = sums = floored_sums = cut = floored_cut = stop = none
            base = 0
        else:
            c3 = chain[1]
            ck3 = s.cks[c3.cls]
            base, top = int(after.min()), int(end.max())
            if top <= base:
                self._spent_through(pm, counts)
                return True
            # per middle candidate, where the last step's range starts: raw, and where the whole
            # match would otherwise lie before the slice (it counts only last events inside it)
            starts = s.after(c3.cls, s.rows[c2.cls][base:top]).astype(np.int64)
            np.maximum(starts, int(np.searchsorted(ck3, self.lo - wins[1], "left")), out=starts)
            floored = np.maximum(starts, slice_first)
            sums, floored_sums = np.zeros(top - base + 1, np.int64), np.zeros(top - base + 1, np.int64)
            np.cumsum(starts, out=sums[1:])
            np.cumsum(floored, out=floored_sums[1:])
            stop = _search_runs(ck3, lo_keys, wins[1], "right").astype(np.int64)
            np.minimum(stop, self.cap_hi[c3.cls], out=stop)
            # middle candidates whose last-step range is empty (it starts at or past the end) end
            # the sum: the starts do not decrease
            cut = np.searchsorted(starts, stop, "left").astype(np.int64) + base
            floored_cut = np.searchsorted(floored, stop, "left").astype(np.int64) + base
            bound = (counts.astype(np.float64) * np.maximum(end - base, 0)
                     * np.maximum(stop - int(starts[0]), 0))
        if len(bound) and float(bound.max()) >= 2.0 ** 62:
            return False  # a range's count might not fit in int64: the steps are built instead
        self._spent_through(pm, counts)
        ranks, lows, highs, which = bounds
        from matchrec.operators.cer_shared_kernels import ranked_then_counted
        per = np.empty(len(a), np.int64)
        ranked_then_counted(ranks, a, b, which, lows, highs, ck, first, after, end, lo_keys, pm.hi.astype(np.int64),
                            min(wins), self.lo, slice_first, len(chain), base, sums, floored_sums, cut,
                            floored_cut, stop, per)
        self.add_counted(chain[-1], _exact_sum(per) if pm.w is None else _exact_sum(per, pm.w))
        return True

    def _spent_through(self, pm: _PMs, counts: np.ndarray) -> None:
        tried = int(counts.sum())
        self.work["searches"] += len(pm)
        self.work["candidates"] += tried
        self.spend(tried)

    def _plain_chain(self, node: Node, slot: int) -> list | None:
        """The one or two plain steps below ``node`` (whose new event takes ``slot``) that
        ``count_through`` counts without building, the last a counted leaf; None if there are none."""
        if node.finishing or len(node.children) != 1 or node.pred is None:
            return None
        chain = []
        step = node
        while len(chain) < 2 and not step.finishing and len(step.children) == 1:
            child = step.children[0]
            if child.conds or child.gates or child.succ is not None or child.pred != slot + len(chain):
                return None
            chain.append(child)
            if self.counted_leaf(child):
                return chain
            step = child
        return None

    def rank_bounds(self, node: Node, pm: _PMs, candidates: int | None = None):
        """When every condition of ``node`` is rays of a column of its new variable (``Cond.rays``):
        per distinct binding of the other variables they read and per column, the interval of ranks
        (the column's distinct values among the class's candidates, in order) where the column's
        conditions hold, by binary search. Returns (rank per column and candidate, lows, highs: per
        column and binding, the binding of each partial match) or None: not rays, the compiled
        comparison refused these values, or (given the ``candidates`` to check) the searches would
        cost more than evaluating the conditions on each candidate (``ranks_pay``)."""
        spec = self.ray_spec(node, len(pm.rows))
        if spec is None:
            return None
        var, columns = spec
        # Each condition is searched over the distinct bindings of the slots it reads only: where
        # two conditions read different slots, their joint bindings are about as many as the partial
        # matches and finding them took a sort of all of them.
        reads = [[tuple(sorted(j for v, j in sl.items() if v != var)) for _, sl in conds] for conds in columns]
        groups = {slots: self.distinct_bindings(pm, slots) for per in reads for slots in per}
        if candidates is not None and not self.ranks_pay(node, columns, [[groups[g][2] for g in per] for per in reads],
                                                         candidates):
            return None
        joint = len(groups) == 1
        if joint:
            _, inverse, u = next(iter(groups.values()))
        else:
            u = len(pm)
        ranks, lows, highs = [], [], []
        for conds, per in zip(columns, reads):
            rank, rep = self.ranks(node.cls, conds[0][0])
            low, high = np.zeros(u, np.int64), np.full(u, len(rep), np.int64)
            for (ray_set, sl), slots in zip(conds, per):
                rows, at, size = groups[slots]
                names = {j: v for v, j in sl.items() if v != var}
                binding = {names[j]: r for j, r in zip(slots, rows)}
                if not self.narrow_ranks(ray_set, var, rep, binding, size, low, high, None if joint else at):
                    return None
            ranks.append(rank)
            lows.append(low)
            highs.append(high)
        which = inverse if joint else np.arange(len(pm), dtype=np.int64)
        return np.stack(ranks), np.stack(lows), np.stack(highs), which

    def distinct_bindings(self, pm: _PMs, slots: tuple):
        """The distinct bindings of ``slots`` among the partial matches: (a row array per slot, the
        binding of each partial match, how many)."""
        rows = [pm.rows[j] for j in slots]
        if not slots:
            return [], np.zeros(len(pm), np.int64), 1
        if len(rows) == 1 and len(rows[0]) * 16 <= self.s.n:
            ids, count, first = self._scattered_ids(rows[0])
        else:
            ids, count, first = _dense_ids(rows, self.s.n)
        return [r[first] for r in rows], ids, count

    def _scattered_ids(self, x: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
        """``_dense_ids`` of one array of rows, in no particular order, without a sort: each row's
        slot in a scratch array over the stream takes the position of one of its occurrences,
        and the positions that won their slot are the distinct rows. The scratch array is never
        cleared: a slot is read only after this call wrote it."""
        m = len(x)
        if self._scratch is None:
            self._scratch = np.empty(self.s.n, np.int64)
        scratch = self._scratch
        pos = np.arange(m, dtype=np.int64)
        scratch[x] = pos
        rep = scratch[x]
        won = rep == pos
        rank = np.cumsum(won) - 1
        return rank[rep], int(rank[-1]) + 1 if m else 0, np.flatnonzero(won)

    def ranks_pay(self, node: Node, columns: list, bindings: list, candidates: int) -> bool:
        """Whether checking ``node``'s candidates by ranks should cost less than evaluating its
        conditions on each: the binary searches cost about a comparison per distinct binding
        (``bindings``: per column and condition, of the slots it reads), ray and halving step, plus
        each step's few numpy calls (``STEP_CALLS``), the candidates' check next to nothing;
        evaluating costs one comparison per candidate (and gathering every candidate's bound rows)."""
        searches = 0
        for conds, per in zip(columns, bindings):
            bits = max(1, len(self.ranks(node.cls, conds[0][0])[1]).bit_length())
            searches += sum(len(r.rays) * (u + STEP_CALLS) for (r, _), u in zip(conds, per)) * bits
        return candidates > searches

    @staticmethod
    def ranked_survivors(bounds, a: np.ndarray, counts: np.ndarray, start: int, total: int):
        """The extensions (parent index, candidate position) of ranges ``[a, a + counts)`` (partial
        matches ``start`` on) whose ranks lie in their binding's intervals (``rank_bounds``)."""
        from matchrec.operators.cer_shared_kernels import list_ranked
        ranks, lows, highs, which = bounds
        a = a.astype(np.int64)
        parent, at = np.empty(total, np.int64), np.empty(total, np.int64)
        n = list_ranked(ranks, a, a + counts, which[start:start + len(a)], lows, highs, parent, at)
        parent = parent[:n]
        parent += start
        return parent, at[:n]

    @classmethod
    def narrow_ranks(cls, ray_set, var: str, rep: np.ndarray, binding: dict, size: int, low: np.ndarray,
                     high: np.ndarray, at: np.ndarray | None = None) -> bool:
        """Narrows ``[low, high)`` (ranks of ``rep``, the ranked column's representative rows) to
        where every ray of ``ray_set`` holds, per binding (``size`` of them; ``at``: the binding of
        each interval, when they are not one to one). False when the compiled comparison refused
        the values."""
        guesses = ray_set.guesses or [None] * len(ray_set.rays)
        repv = ray_set.values[rep].astype(np.float64) if any(g is not None for g in guesses) else None
        for (vec, up), guess in zip(ray_set.rays, guesses):
            k = cls.first_flip(vec, up, var, rep, binding, size, guess, repv)
            if k is None:
                return False
            if at is not None:
                k = k[at]
            if up:
                np.maximum(low, k, out=low)
            else:
                np.minimum(high, k, out=high)
        return True

    @staticmethod
    def first_flip(vec, up: bool, var: str, rep: np.ndarray, binding: dict, u: int, guess=None,
                   repv: np.ndarray | None = None):
        """Per binding of the other variables, the first rank where an up-ray turns true (a
        down-ray false), or None when the compiled comparison refused the values. With the ray's
        ``guess`` (``multi_rays``: its threshold, ``repv`` the ranks' values as floats), the guessed
        rank is kept where the ray has flipped there and not at the rank below - two evaluations -
        and only the other bindings are searched."""
        d = len(rep)
        if not d or guess is None:
            return Evaluator._halving(vec, up, var, rep, binding, u)
        b = dict(binding)
        try:
            threshold, side = guess
            with np.errstate(all="ignore"):  # a NaN or infinite guess only misses
                guessed = np.broadcast_to(threshold(binding), (u,))
            pos = np.searchsorted(repv, guessed, side).astype(np.int64)
            b[var] = rep[np.minimum(pos, d - 1)]
            t = vec(b)
            ok = (pos == d) | (t if up else ~t)
            b[var] = rep[np.maximum(pos - 1, 0)]
            t = vec(b)
            ok &= (pos == 0) | ~(t if up else ~t)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError, FloatingPointError):
            return None
        missed = np.flatnonzero(~ok)
        if len(missed):
            got = Evaluator._halving(vec, up, var, rep, {k: v[missed] for k, v in binding.items()}, len(missed))
            if got is None:
                return None
            pos[missed] = got
        return pos

    @staticmethod
    def _halving(vec, up: bool, var: str, rep: np.ndarray, binding: dict, u: int):
        """``first_flip`` by a binary search over the ranks, all bindings at once, by steps of
        halving powers of two (a binding moves past a probed rank while the ray has not flipped
        there), so a step is a few numpy calls. Every step takes every binding: the searches all
        take about as many steps, and gathering the open ones cost more than evaluating them all."""
        d = len(rep)
        pos = np.zeros(u, np.int64)  # the ranks below it have not flipped
        if not d:
            return pos
        b = dict(binding)
        step = 1 << (d.bit_length() - 1)
        while step:
            at = pos + (step - 1)  # the last rank of the next step
            within = pos <= d - step
            np.minimum(at, d - 1, out=at)
            b[var] = rep[at]
            try:
                t = vec(b)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError, FloatingPointError):
                return None
            move = np.greater(within, t) if up else np.logical_and(within, t)
            np.add(pos, step, out=pos, where=move)
            step >>= 1
        return pos

    def ray_spec(self, node: Node, new: int):
        """(new variable, [[(Rays, slots)] per column]) when every condition of ``node`` is rays of
        a column of the variable the node binds (slot ``new``), else None."""
        got = self._rays.get(id(node))
        if got is not None and got[0] is node:
            return got[1]
        by_column: dict = {}
        var = None
        for cond, slots in node.conds:
            names = [v for v, j in slots.items() if j == new]
            r = cond.rays.get(names[0]) if len(names) == 1 and cond.vec is not None else None
            if r is None or (var is not None and r.var != var):
                by_column = {}
                break
            var = r.var
            by_column.setdefault(r.column, []).append((r, slots))
        got = (var, list(by_column.values())) if by_column else None
        self._rays[id(node)] = (node, got)
        return got

    def ranks(self, cls: int, r) -> tuple[np.ndarray, np.ndarray]:
        """Each candidate of class ``cls``: the rank of its value of the column of ``r`` (``Rays``)
        among the class's distinct values (-1: NULL or NaN, never counted), and a row holding each
        distinct value."""
        key = (cls, r.column)
        kept = self.s.ranked.get(key)
        got = kept[1] if kept is not None and kept[0] is r.values else None
        if got is None:
            rows = self.s.rows[cls]
            vals = r.values[rows]
            bad = r.nulls[rows] if r.nulls is not None else np.zeros(len(rows), bool)
            if vals.dtype.kind == "f":
                bad = bad | np.isnan(vals)
            good = np.flatnonzero(~bad)
            # Dense ranks from one unstable sort (np.unique's stable sort took several times longer):
            # any row holding a value stands for it, since the rays read no other column of the row.
            order = good[np.argsort(vals[good])]
            ordered = vals[order]
            new = np.ones(len(order), bool)
            np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
            rank = np.full(len(rows), -1, np.int64)
            rank[order] = np.cumsum(new) - 1
            got = (rank, rows[order[new]])
            self.s.ranked[key] = (r.values, got)
        return got

    @staticmethod
    def survivors(node: Node, pm: _PMs, idx: np.ndarray, new_rows: np.ndarray, j: np.ndarray):
        """The candidate extensions (parent ``idx``, candidate position ``j``) whose conditions at
        ``node`` hold, each condition on the survivors of the ones before. Only the slots a condition
        reads are gathered, and only for those survivors: the others are gathered once, afterwards."""
        new = len(pm.rows)  # the slot the node binds
        cols = {new: new_rows}
        last = len(node.conds) - 1
        for n, (cond, slots) in enumerate(node.conds):
            b = {}
            for v, slot in slots.items():
                c = cols.get(slot)
                if c is None:
                    c = cols[slot] = pm.rows[slot][idx]
                b[v] = c
            keep = cond.holds(b)
            if not keep.all():
                idx, j = idx[keep], j[keep]
                if not len(idx):
                    break
                if n < last:  # the gathered columns serve the next conditions only
                    cols = {slot: c[keep] for slot, c in cols.items()}
        return idx, j

    # ---------------------------------------------------------------- complete matches
    def plain_leaf(self, node: Node) -> bool:
        """Whether ``node`` only finishes units that read nothing of a match but its rows: no step
        below it, no negation, no Kleene closure, no window narrower than the node's (then
        ``emit_leaf`` needs no first and last key per match)."""
        got = self._plain.get(id(node))
        if got is None:
            w = self.s.clamp(node.window)
            plain = not node.children and all(
                not self.units[u].negs and not self.units[u].kleene and self.s.clamp(self.units[u].window) >= w
                for u, _ in node.finishing)
            got = self._plain[id(node)] = (node, plain)
        return got[1]

    def emit_leaf(self, node: Node, pm: _PMs, idx: np.ndarray, new_rows: np.ndarray, ck: np.ndarray,
                  j: np.ndarray) -> None:
        """``emit`` of the extensions ``(pm[idx], candidate j)`` of a ``plain_leaf`` node, without
        building them as partial matches: a match is kept when its last key is in the range, which
        holds for all of them when every parent's last key is."""
        self.work["partial_matches"] += len(idx)
        if len(pm) and int(pm.hi.min()) < self.lo:
            keep = (pm.hi[idx] >= self.lo) | (ck[j] >= self.lo)
            if not keep.all():
                idx, new_rows = idx[keep], new_rows[keep]
                if not len(idx):
                    return
        gathered: dict = {len(pm.rows): new_rows}
        for u, slots in node.finishing:
            unit = self.units[u]
            rows = []
            for slot in slots:
                got = gathered.get(slot)
                if got is None:
                    got = gathered[slot] = pm.rows[slot][idx]
                rows.append(got)
            self.work["matches"] += len(idx)
            self.sinks[unit.pattern].add(unit.vars, rows)

    def emit(self, node: Node, u: int, slots: list, pm: _PMs) -> None:
        unit = self.units[u]
        s = self.s
        w = s.clamp(unit.window)
        keep = pm.hi >= self.lo
        if w < s.clamp(node.window):
            keep &= (pm.hi - pm.lo) <= w
        if not keep.all():
            pm = pm.take(keep)
        if not len(pm):
            return
        rows = [pm.rows[j] for j in slots]
        lo, hi, weights = pm.lo, pm.hi, pm.w
        for g in unit.negs:
            ok = self.negation(unit, g, rows, lo, hi, w)
            if not ok.all():
                rows = [None if r is None else r[ok] for r in rows]
                lo, hi = lo[ok], hi[ok]
                weights = None if weights is None else weights[ok]
            if not len(lo):
                return
        self.work["matches"] += len(lo)
        if unit.kleene:
            sink = self.sinks[unit.pattern]
            if sink.counting:
                sink.add_count(self.kleene_count(unit, rows, lo, hi, w, weights))
            else:  # rows returned that read no closure: a row per set, the skeleton's rows repeated
                most = sink.max - sink.n if sink.max is not None else 1 << 62
                sink.add(unit.vars, rows, self.kleene_repeats(unit, rows, lo, hi, w, most))
            return
        if weights is not None:  # aggregated: only counted patterns (``_reads``)
            self.sinks[unit.pattern].add_count(_exact_sum(weights))
            return
        self.sinks[unit.pattern].add(unit.vars, rows)

    def kleene_count(self, unit: Unit, rows, lo: np.ndarray | None = None, hi: np.ndarray | None = None,
                     w: int = 0, mult: np.ndarray | None = None) -> int:
        """The matches the skeleton matches stand for: per match the product over the Kleene
        elements of the number of candidate sets between their neighbours (a set takes at most one
        candidate per key, as the single-statement mechanisms count it). ``lo`` and ``hi``: the
        skeleton matches' first and last composite keys, read (with the window ``w``) by a closure
        at an end of the sequence, whose sets reach as far as the window allows. ``mult``: how
        many skeleton matches each one stands for (aggregated partial matches)."""
        prod, fast, slow = self._kleene_products(unit, rows, lo, hi, w, mult)
        if fast.all():
            return _exact_sum(prod)
        return _exact_sum(prod[fast]) + sum(slow(i) for i in np.flatnonzero(~fast).tolist())

    def kleene_repeats(self, unit: Unit, rows, lo: np.ndarray | None, hi: np.ndarray | None, w: int,
                       most: int) -> np.ndarray:
        """Per skeleton match, the matches it stands for (``kleene_count`` match by match), as int64;
        more than ``most`` in all raises ``too_many``."""
        prod, fast, _ = self._kleene_products(unit, rows, lo, hi, w, None)
        if not fast.all() or _exact_sum(prod) > most:
            raise too_many(most)
        return prod

    def _kleene_products(self, unit: Unit, rows, lo, hi, w: int, mult):
        """Per skeleton match, the product of its closures' counts (times ``mult``) as int64, where
        it is exact (``fast``), and the exact product of one match as a Python int."""
        s = self.s
        # Per Kleene element: its count per match as int64 (exact where ``bits`` is below 62), an
        # upper bound of the count's log2, and the exact count of one match as a Python int.
        small, bits, exact = [], [], []
        for k in unit.kleene:
            ck = s.cks[k.cls]
            if k.prev is not None:
                a = s.after(k.cls, rows[k.prev])
            else:  # its first candidate is the match's first event: at most the window before the last
                a = np.searchsorted(ck, hi - w, "left")
            if k.next is not None:
                b = s.before(k.cls, rows[k.next])
            else:  # its last candidate is the match's last event: at most the window after the first
                b = np.searchsorted(ck, lo + w, "right")
            a = np.asarray(a, np.int64)
            b = np.maximum(a, b).astype(np.int64, copy=False)
            if k.gate:
                ids, table = self._gated(k, rows, ck, a, b, lo, hi, w)
                got = _table_arrays(table)
                small.append(got[0][ids])
                bits.append(got[1][ids])
                exact.append(lambda i, ids=ids, table=table: table[ids[i]])
            elif not self.tied(k.cls):
                counts, b2, one = _subset_arrays(b - a, k.lo, k.hi)
                small.append(counts)
                bits.append(b2)
                exact.append(one)
            else:  # equal keys among the candidates: each distinct one counted once
                counts, b2 = self._tied_arrays(k, a, b)
                small.append(counts)
                bits.append(b2)
                exact.append(lambda i, a=a, b=b, k=k, ck=ck: tied_subsets(ck[a[i]:b[i]], k.lo, k.hi))
        # Most products fit in int64 (numpy multiplies them); the rest, or a match whose bound says
        # it might not fit, are Python integers, one match at a time.
        n = len(small[0])  # a unit counted here has a closure
        # one bound for all first (the largest of each factor's logs): mostly every product fits
        widest = sum(float(b2.max()) for b2 in bits if len(b2))
        if mult is not None and len(mult):
            widest += math.log2(max(1, int(np.max(mult)))) + 1e-9
        if widest < 62:
            fast = np.ones(n, bool)
        else:
            total_bits = sum(bits) if mult is None else \
                sum(bits) + np.log2(np.maximum(mult, 1).astype(np.float64)) + 1e-9
            zero = np.zeros(len(total_bits), bool)
            for c, b2 in zip(small, bits):
                zero |= (c == 0) & (b2 < 62)
            fast = (total_bits < 62) | zero
        prod = np.ones(len(fast), np.int64) if mult is None else np.asarray(mult, np.int64).copy()
        for c in small:
            prod *= c

        def slow(i: int) -> int:
            v = 1 if mult is None else int(mult[i])
            for one in exact:
                v *= one(i)
                if not v:
                    break
            return v
        return prod, fast, slow

    def _gated(self, k: Kleene, rows, ck: np.ndarray, a: np.ndarray, b: np.ndarray, lo, hi,
               w: int) -> tuple[np.ndarray, list]:
        """A closure with negated elements at one side (``Kleene.gate``): the sets of its
        candidates ``[a, b)`` less those the negated elements' events exclude - every set whose
        first candidate lies after the first negated event (of any of them) following ``prev``
        (``gate_after``: whose last lies before the last negated event preceding ``next``). An
        event of them at the same key as the set's end is not between them. A closure that starts
        (ends) the match, its gate leading (trailing), reads the negated events from the window's
        start, the last key ``hi`` less ``w`` (up to its end, the first key ``lo`` plus ``w``), as
        a leading (trailing) negation of a chain does. Returns an id per match and the count of
        each id."""
        s = self.s
        a = a.astype(np.int64)
        b = np.maximum(a, b).astype(np.int64)
        if not k.gate_after:
            cut = b
            for g in k.gate:
                xk = s.cks[g]
                if k.prev is not None:
                    first = s.after(g, rows[k.prev])  # the negated events up to prev's key come before it
                else:
                    first = np.searchsorted(xk, hi - w, "left")
                has = first < len(xk)
                cut = np.minimum(cut, np.where(has, np.searchsorted(ck, xk[np.minimum(first, len(xk) - 1)], "right"), b))
            a2, b2 = np.clip(cut, a, b), b  # sets only in [cut, b) start after the first such event
        else:
            cut = a
            for g in k.gate:
                xk = s.cks[g]
                if k.next is not None:
                    last = s.before(g, rows[k.next])  # the negated events before next's key
                else:
                    last = np.searchsorted(xk, lo + w, "right")
                has = last > 0
                cut = np.maximum(cut, np.where(has, np.searchsorted(ck, xk[np.maximum(last - 1, 0)], "left"), a))
            a2, b2 = a, np.clip(cut, a, b)  # sets only in [a, cut) end before the last such event
        span = int(len(ck)) + 1
        whole, i1 = np.unique(a * span + b, return_inverse=True)
        lost, i2 = np.unique(a2 * span + b2, return_inverse=True)
        pair, inverse = np.unique(i1.reshape(-1).astype(np.int64) * len(lost) + i2.reshape(-1), return_inverse=True)
        w1, w2 = self._range_weights(k, whole // span, whole % span), self._range_weights(k, lost // span, lost % span)
        return inverse.astype(np.int64).reshape(-1), [w1[p // len(lost)] - w2[p % len(lost)] for p in pair.tolist()]

    def _range_weights(self, k: Kleene, a: np.ndarray, b: np.ndarray) -> list:
        """The closure's number of sets over each range ``[a, b)`` of its class's candidates."""
        if self.tied(k.cls):
            return self._tied_weights(k, a, b)
        return [subsets(max(int(x), 0), k.lo, k.hi) for x in (b - a).tolist()]

    def _tied_weights(self, k: Kleene, a: np.ndarray, b: np.ndarray) -> list:
        """``tied_subsets`` of the candidates ``[a, b)`` of ``k``'s class, per range, as Python ints."""
        ck = self.s.cks[k.cls]
        counts, bits = self._tied_arrays(k, a, b)
        values = counts.tolist()
        for i in np.flatnonzero(bits >= 62).tolist():
            values[i] = tied_subsets(ck[int(a[i]):int(b[i])], k.lo, k.hi)
        return values

    def _tied_arrays(self, k: Kleene, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``tied_subsets`` of the candidates ``[a, b)`` of ``k``'s class, per range, as int64 where
        it stays below 2^60 (elsewhere 0) and an upper bound of its log2 (infinite or 62 or more:
        not in the int64). Sets of any size (``+``) are the product of (multiplicity + 1) over the
        keys in the range, less one: per range a constant number of steps over prefix tables of
        the class's runs of equal keys (``cer_shared_kernels.tied_any_size``, below 2^60); bounded
        sizes one distinct range at a time."""
        ck = self.s.cks[k.cls]
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        if k.lo > 1 or k.hi is not None or not len(a):
            span = int(len(ck)) + 1
            counts, bits, _, _ = _per_distinct(a * span + np.maximum(a, b),
                                               lambda x: tied_subsets(ck[x // span:x % span], k.lo, k.hi))
            return counts, bits
        runs = self._runs.get(k.cls)
        if runs is None:
            from matchrec.operators.cer_shared_kernels import tied_runs
            from matchrec.operators.cer_sequences import key_runs
            starts, sizes = key_runs(ck)
            rid = np.repeat(np.arange(len(starts), dtype=np.int64), sizes)
            runs = self._runs[k.cls] = (rid, starts, sizes) + tied_runs(sizes)
        from matchrec.operators.cer_shared_kernels import tied_any_size
        out = np.empty(len(a), np.int64)
        bits = np.empty(len(a), np.float64)
        tied_any_size(*runs, a, b, out, bits)
        return out, bits

    def tied(self, cls: int) -> bool:
        """Whether two candidates of class ``cls`` share a key (on the composite axis: in a partition)."""
        got = self._tied.get(cls)
        if got is None:
            ck = self.s.cks[cls]
            got = self._tied[cls] = bool(len(ck) > 1 and (ck[1:] == ck[:-1]).any())
        return got

    def negation(self, unit: Unit, g: Neg, rows: list, lo: np.ndarray, hi: np.ndarray, w: int) -> np.ndarray:
        """Per match, whether no event of the negated element lies in its range."""
        s = self.s
        ck, crow = s.cks[g.cls], s.rows[g.cls]
        if g.prev is not None:
            a = s.after(g.cls, rows[g.prev])
        else:
            a = np.searchsorted(ck, hi - w, "left")
        if g.next is not None:
            b = s.before(g.cls, rows[g.next])
        else:
            b = np.searchsorted(ck, lo + w, "right")
        counts = np.maximum(b - a, 0)
        if not g.linked:
            return counts == 0
        ok = np.ones(len(lo), bool)
        read = set().union(*(c.vars for c in g.linked))  # only these elements' rows are gathered
        live = np.flatnonzero(counts)
        if not len(live):
            return ok
        cum = np.cumsum(counts[live])
        start = 0
        while start < len(live):
            base = int(cum[start - 1]) if start else 0
            end = max(start + 1, int(np.searchsorted(cum, base + self.block, "right")))
            ids = live[start:end]
            cnt = counts[ids]
            tot = int(cnt.sum())
            idx = np.repeat(ids, cnt)
            j = np.repeat(a[ids] - (np.cumsum(cnt) - cnt), cnt)
            j += np.arange(tot)
            b_ = {v: r[idx] for v, r in zip(unit.vars, rows) if v in read}
            b_[g.var] = crow[j]
            hit = np.ones(tot, bool)
            for c in g.linked:
                hit &= c.holds(b_)
            ok[idx[hit]] = False
            start = end
        return ok


def _table_arrays(table: list) -> tuple[np.ndarray, np.ndarray]:
    """Python int counts as int64 where below 2^62 (elsewhere 0) and their bit lengths (an upper
    bound of their log2)."""
    bits = np.array([v.bit_length() for v in table], np.float64)
    counts = np.array([v if v < 1 << 62 else 0 for v in table], np.int64)
    return counts, bits


def _subset_arrays(sizes: np.ndarray, lo: int, hi: int | None):
    """``subsets(m, lo, hi)`` per ``m`` in ``sizes`` as ``_table_arrays`` gives them, and the exact
    count of one position as a function of it."""
    if hi is None and lo <= 1:  # 2^m - 1 sets of any size, below 2^m
        fit = sizes < 62
        counts = np.where(fit, (np.int64(1) << np.minimum(sizes, 61)) - 1, 0).astype(np.int64)
        return counts, sizes.astype(np.float64), lambda i: subsets(int(sizes[i]), lo, hi)
    counts, bits, table, inverse = _per_distinct(sizes, lambda m: subsets(m, lo, hi))
    return counts, bits, lambda i: table[inverse[i]]


def _per_distinct(keys: np.ndarray, value):
    """``value(key)`` (a Python int) computed once per distinct key, then per element as
    ``_table_arrays`` gives it: (counts, bits, the table of values, each element's index in it)."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    table = [value(x) for x in distinct.tolist()]
    counts, bits = _table_arrays(table)
    inverse = inverse.reshape(-1)
    return counts[inverse], bits[inverse], table, inverse


def tied_subsets(keys: np.ndarray, lo: int, hi: int | None) -> int:
    """Sets of ``lo`` to ``hi`` (None: any number) of the events with these sorted keys taking at most
    one event per key: the elementary symmetric polynomials of the keys' multiplicities."""
    lo = max(1, lo)
    if not len(keys):
        return 0
    _, mult = np.unique(keys, return_counts=True)
    mult = mult.tolist()
    if hi is None and lo == 1:
        out = 1
        for m in mult:
            out *= m + 1
        return out - 1
    top = len(mult) if hi is None else min(hi, len(mult))
    if top < lo:
        return 0
    sizes = [1] + [0] * top  # sizes[j]: sets of j events among the keys seen so far (j <= top)
    for m in mult:
        for j in range(top, 0, -1):
            sizes[j] += sizes[j - 1] * m
    return sum(sizes[lo:top + 1])


def subsets(m: int, lo: int, hi: int | None) -> int:
    """Sets of ``lo`` to ``hi`` (None: any number) of ``m`` events (``lo`` below 1 counts as 1)."""
    lo = max(1, lo)
    top = m if hi is None else min(hi, m)
    if top < lo:
        return 0
    if top == m and lo == 1:
        return (1 << m) - 1
    return sum(math.comb(m, j) for j in range(lo, top + 1))
