"""A CER statement's matches as an Arrow table: the matched events (one row per match, a column per
variable and source column, Kleene variables as lists) or the RETURN projections.

Built column-wise from ``operators.cer_columns.MatchColumns`` (every mechanism's matches go
through it; a list of match tuples is converted first): a variable's column is one Arrow take of
its rows, a Kleene variable's list column one take of its distinct sequences' lists; a projection
reading one variable is evaluated once per distinct row or sequence (an aggregate over a Kleene
variable once per sequence, however many matches share it) and spread by a take; only a
projection reading several variables is evaluated match by match."""
from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.engine.output import int128_array
from matchrec.errors import DataError
from matchrec.operators.cer_columns import ABSENT, MatchColumns, Sequences, from_tuples
from matchrec.parser import sase as S
from matchrec.planner import cer as P


BIGINT_MAX = (1 << 63) - 1


def count_table(n: int) -> pa.Table:
    """COUNT(*)'s one-row result. Counts are exact Python integers (a Kleene closure under
    skip-till-any-match has a number of matches exponential in its window); COUNT(*) is a BIGINT, as
    in DuckDB and Trino, so a larger one is an error rather than a wrapped or rounded number."""
    if n > BIGINT_MAX:
        raise DataError(f"COUNT(*) is {n:.3e}, more than a BIGINT holds (9.2e18): the pattern has that many matches. "
                        "Narrow the WITHIN window or bound the Kleene closure (e.g. b+{1,3}) to count fewer")
    return pa.table({"count": pa.array([n], pa.int64())})


def _indices(idx: np.ndarray) -> pa.Array:
    """Take indices, NULL where the variable is unbound."""
    if not len(idx) or int(idx.min()) > ABSENT:  # every row bound (ABSENT is the least value)
        return pa.array(idx, pa.int64())
    return pa.array(idx, pa.int64(), mask=idx == ABSENT)


# The result's columns are allocated by the system allocator: pyarrow's default pool (mimalloc
# in pyarrow 26) took 3-4 times as long for the same gathers until a process had made several
# large results (a run_many of 100 statements and 6 M rows: 0.38 s against 0.09 s).
RESULT_POOL = pa.system_memory_pool()


def _take(column: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    if not len(column):
        return pa.nulls(len(rows), column.type)
    if column.num_chunks == 1:
        return pc.take(column.chunk(0), _indices(rows), memory_pool=RESULT_POOL)
    return pc.take(column, _indices(rows), memory_pool=RESULT_POOL).combine_chunks(memory_pool=RESULT_POOL)


def _lists(column: pa.ChunkedArray, seqs: Sequences) -> pa.Array:
    """The distinct sequences' values as one list array."""
    values = _take(column, seqs.flat)
    return pa.ListArray.from_arrays(pa.array(seqs.offsets, pa.int32()), values)


def _kleene(ms: MatchColumns, var: str) -> tuple[np.ndarray, Sequences] | None:
    """(sequence id per match, the sequences) of Kleene variable ``var``, or None when no match binds it."""
    if var in ms.ids:
        return ms.ids[var], ms.seqs[var]
    if var in ms.rows:  # bound by single rows: sequences of one event
        r = ms.rows[var]
        u, inv = np.unique(r[r != ABSENT], return_inverse=True)
        ids = np.full(ms.n, ABSENT, np.int64)
        ids[r != ABSENT] = inv
        return ids, Sequences(u.astype(np.int64), np.arange(len(u) + 1, dtype=np.int64))
    return None


class _InOrder:
    """Matches in the result's order (``MatchColumns.order``), taken only as far as read: a single
    variable's rows one at a time (a column of the result is then one gather of another), the
    whole ``MatchColumns`` for what reads more."""

    def __init__(self, ms: MatchColumns):
        self.n = ms.n
        self.base, self.order = ms.arranged()
        self._rows: dict = {}
        self._all = None

    def rows(self, var: str) -> np.ndarray:
        got = self._rows.get(var)
        if got is None:
            r = self.base.rows.get(var)
            if r is None:
                got = np.full(self.n, ABSENT, np.int64)
            else:
                got = r if self.order is None else r[self.order]
            self._rows[var] = got
        return got

    def all(self) -> MatchColumns:
        if self._all is None:
            self._all = self.base if self.order is None else self.base.take(self.order)
        return self._all


def _var_column(plan: P.CerPlan, table: pa.Table, var: str, name: str, ms: _InOrder) -> pa.Array:
    column = table.column(name)
    if plan.query.elements[var].kleene is not None:
        got = _kleene(ms.all(), var)
        if got is None:
            return pa.nulls(ms.n, pa.list_(column.type))
        ids, seqs = got
        return _lists(column, seqs).take(_indices(ids))
    return _take(column, ms.rows(var))


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            n = f"{n}_{seen[n]}"
        seen.setdefault(n, 0)
        out.append(n)
    return out


def build_result(plan: P.CerPlan, table: pa.Table, matches) -> pa.Table:
    """``matches``: a ``MatchColumns`` or a list of match tuples (``reference_matches``' format).
    Rows come in the order of each match's first event, then its events variable by variable."""
    q = plan.query
    ms = _InOrder(matches if isinstance(matches, MatchColumns) else from_tuples(matches))
    names, arrays = [], []
    if q.returns == "events":
        for var in q.positive:
            for name, _ in plan.columns.values():
                names.append(f"{var}_{name}")
                arrays.append(_var_column(plan, table, var, name, ms))
        return pa.table(dict(zip(_unique(names), arrays)))
    res = P._Resolver(q, plan.columns)
    # A column is taken from the read and an aggregate over a closure computed by numpy where it
    # can be: only the other items are compiled (compiling converts the columns they read).
    arrays = [None] * len(q.projections)
    for i, proj in enumerate(q.projections):
        e = proj.expr
        if isinstance(e, S.Col):
            arrays[i] = _var_column(plan, table, e.var, res.col(e), ms)
        else:
            arrays[i] = _aggregate(e, res, table, ms)
    rest = {i for i, a in enumerate(arrays) if a is None}
    if rest:
        for i, (proj, needs, fn) in enumerate(P.compile_projections(plan, table, rest)):
            if i in rest:
                arrays[i] = _projection(proj.name, needs, fn, ms.all())
    names = [proj.name for proj in q.projections]
    return pa.table(dict(zip(_unique(names), arrays)))


_REDUCE = {"min": np.minimum, "max": np.maximum, "sum": np.add}


def _aggregate(e: S.Expr, res, table: pa.Table, matches: _InOrder) -> pa.Array | None:
    """An aggregate over a Kleene variable's column by numpy over its sequences (segments of the
    flat rows: lengths, first and last by offsets, min / max / integer sum by ``reduceat``), or
    None where the Python evaluation must decide: NULLs or NaN in the column, other types, a
    an integer sum that could pass 64 bits, an integer average. A float sum is added left to right
    as Python's ``sum`` does (``_float_sums``)."""
    if not (isinstance(e, S.Call) and e.name in ("count", "first", "last", "min", "max", "sum", "avg")
            and len(e.args) == 1):
        return None
    arg = e.args[0]
    if isinstance(arg, S.Var):
        var, column = arg.var, None
    elif isinstance(arg, S.Col) and arg.index is None:
        var, column = arg.var, table.column(res.col(arg))
    else:
        return None
    if var not in matches.base.ids:
        return None
    ms = matches.all()
    seqs = ms.seqs[var]
    lengths = np.diff(seqs.offsets)
    if not len(seqs) or not lengths.all():
        return None
    if e.name == "count" and (column is None or column.null_count == 0):
        out = lengths
    else:
        if column is None or column.null_count or not (pa.types.is_integer(column.type)
                                                        or pa.types.is_floating(column.type)):
            return None
        if pa.types.is_uint64(column.type):
            return None
        values = column.to_numpy()[seqs.flat]
        floats = values.dtype.kind == "f"
        if floats:
            if np.isnan(values).any():
                return None
            values = values.astype(np.float64)
        else:
            values = values.astype(np.int64)
        starts = seqs.offsets[:-1]
        if floats and e.name in ("sum", "avg"):
            if sys.version_info >= (3, 12):  # Python's float sum compensates its rounding from 3.12 on
                return None
            out = _float_sums(values, starts, lengths)
            if e.name == "avg":
                out = out / lengths
        elif e.name == "avg":
            return None
        elif e.name == "first":
            out = values[starts]
        elif e.name == "last":
            out = values[seqs.offsets[1:] - 1]
        else:
            if e.name == "sum" and max(-int(values.min()), int(values.max())) * int(lengths.max()) >= 2 ** 63:
                return None
            out = _REDUCE[e.name].reduceat(values, starts)
    out = pa.array(out.astype(np.float64 if out.dtype.kind == "f" else np.int64))
    return out.take(_indices(ms.ids[var]))


def _float_sums(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each segment's sum added left to right, as Python's ``sum`` rounds it (numpy's reductions
    add pairwise): one vectorized addition per position, over the segments that long."""
    acc = values[starts].copy()
    order = np.argsort(-lengths, kind="stable")  # the segments longer than t are a prefix of this order
    longest = int(lengths[order[0]]) if len(order) else 0
    sorted_len = lengths[order]
    for t in range(1, longest):
        live = order[:int(np.searchsorted(-sorted_len, -t, side="left"))]
        acc[live] += values[starts[live] + t]
    return acc


def _projection(name: str, needs: frozenset, fn, ms: MatchColumns) -> pa.Array:
    if len(needs) == 1:
        (var,) = needs
        if var in ms.ids:  # once per distinct sequence
            seqs = ms.seqs[var]
            values = [_python(fn({var: rows})) for rows in seqs.all_rows()]
            return _array(name, values).take(_indices(ms.ids[var]))
        if var in ms.rows:  # once per distinct row
            r = ms.rows[var]
            bound = r != ABSENT
            u, inv = np.unique(r[bound], return_inverse=True)
            values = [_python(fn({var: x})) for x in u.tolist()]
            idx = np.full(ms.n, ABSENT, np.int64)
            idx[bound] = inv
            return _array(name, values).take(_indices(idx))
        return _array(name, [None] * ms.n)
    if not needs:
        return _array(name, [_python(fn({}))]).take(pa.array(np.zeros(ms.n, np.int64)))
    # several variables: one binding per match, of the variables read only
    columns = []
    for var in sorted(needs):
        if var in ms.ids:
            seqs = ms.seqs[var]
            rows = seqs.all_rows()
            columns.append((var, [None if k == ABSENT else rows[k] for k in ms.ids[var].tolist()]))
        elif var in ms.rows:
            columns.append((var, [None if x == ABSENT else x for x in ms.rows[var].tolist()]))
        else:
            return _array(name, [None] * ms.n)
    values = []
    for vals in zip(*(c for _, c in columns)):
        if None in vals:
            values.append(None)
        else:
            values.append(_python(fn({var: v for (var, _), v in zip(columns, vals)})))
    return _array(name, values)


def _array(name: str, values: list) -> pa.Array:
    try:
        return pa.array(values)
    except OverflowError:
        # exact integer arithmetic went past 64 bits: HUGEINT, as DuckDB would type it
        if not all(v is None or type(v) is int for v in values):
            raise DataError(f"RETURN {name}: the values do not share one type") from None
        try:
            return int128_array(values)
        except OverflowError:
            raise DataError(f"RETURN {name}: a value is out of the range of HUGEINT") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
        raise DataError(f"RETURN {name}: the values do not share one type ({err})") from None


def _python(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list):
        return [_python(x) for x in v]
    return v
