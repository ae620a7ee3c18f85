"""A CER statement's matches as an Arrow table: the matched events (one row per match, a column per
variable and source column, Kleene variables as lists) or the RETURN projections."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from matchrec.engine.output import int128_array
from matchrec.errors import DataError
from matchrec.parser import sase as S
from matchrec.planner import cer as P


def _ordered(matches: list) -> list[dict]:
    """Matches as dicts, in the order of their first event (rows are in partition, key order)."""
    def first(m):
        return min(r if isinstance(r, int) else min(r) for _, r in m)
    return [dict(m) for m in sorted(matches, key=lambda m: (first(m), m))]


def _take(column: pa.ChunkedArray, rows: list) -> pa.Array:
    return column.take(pa.array(rows, pa.int64())).combine_chunks() if len(column) else \
        pa.nulls(len(rows), column.type)


def _list_column(column: pa.ChunkedArray, groups: list) -> pa.Array:
    offsets, flat = [0], []
    for g in groups:
        if g is not None:
            flat.extend(g)
        offsets.append(len(flat))
    values = _take(column, flat)
    mask = pa.array([g is None for g in groups], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask)


def _var_column(plan: P.CerPlan, table: pa.Table, var: str, name: str, matches: list[dict]) -> pa.Array:
    column = table.column(name)
    if plan.query.elements[var].kleene is not None:
        return _list_column(column, [list(_rows(m[var])) if var in m else None for m in matches])
    return _take(column, [m.get(var) for m in matches])


def _rows(x):
    return x if isinstance(x, tuple) else (x,)


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


def build_result(plan: P.CerPlan, table: pa.Table, matches: list) -> pa.Table:
    q = plan.query
    ms = _ordered(matches)
    names, arrays = [], []
    if q.returns == "events":
        for var in q.positive:
            for name, _ in plan.columns.values():
                names.append(f"{var}_{name}")
                arrays.append(_var_column(plan, table, var, name, ms))
        return pa.table(dict(zip(_unique(names), arrays)))
    res = P._Resolver(q, plan.columns)
    for proj, needs, fn in P.compile_projections(plan, table):
        names.append(proj.name)
        e = proj.expr
        if isinstance(e, S.Col):
            arrays.append(_var_column(plan, table, e.var, res.col(e), ms))
            continue
        values = [_python(fn(m)) if needs <= m.keys() else None for m in ms]
        try:
            arrays.append(pa.array(values))
        except OverflowError:
            # exact integer arithmetic went past 64 bits: HUGEINT, as DuckDB would type it
            if not all(v is None or type(v) is int for v in values):
                raise DataError(f"RETURN {proj.name}: the values do not share one type") from None
            try:
                arrays.append(int128_array(values))
            except OverflowError:
                raise DataError(f"RETURN {proj.name}: a value is out of the range of HUGEINT") from None
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise DataError(f"RETURN {proj.name}: the values do not share one type ({err})") from None
    return pa.table(dict(zip(_unique(names), arrays)))


def _python(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list):
        return [_python(x) for x in v]
    return v
