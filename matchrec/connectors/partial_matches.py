"""The shard's side of the push-pull baseline (``pull_strategy = push_pull``): partial matching
on the rows a shard holds, the request ``partial_matches``.

The push-pull model of CEP over disaggregated storage (Purtzel, Ziehn, Weidlich et al.) lets
each storage node start the matching itself: it evaluates the anchor's predicate (the element
or variable that starts every match, else one in every match) on its own rows, and each anchor
row opens a partial match spanning ``[t - before, t + after]`` of its partition. The node then
extends its partial matches with its own rows (those the single-variable filters keep) and
pushes them; the compute node, which sees every node's partial matches, pulls from each node
the rows the others' partial matches still need.

* ``phase: push``: the anchors ``(partition hash, key)`` packed, and the rows passing ``where``
  inside the node's own partial matches (plus the rows without a key, which the matcher decides
  on), as an Arrow IPC stream: one reply row of two ``blob`` payloads;
* ``phase: pull``: the rows passing ``where`` inside the time filter the request carries (every
  node's partial matches) and outside this node's own, which the push already returned. The
  node finds its own again from the anchor's predicate: requests stay stateless.

Nothing is estimated and no round is skipped: the baseline always makes these two round trips.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from matchrec.connectors.requests import RequestError, check_fragment, compact as _compact
from matchrec.operators.intervals import IntervalSet
from matchrec.operators.packing import pack
from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident

MAX_REACH = 1 << 60  # before / after: the key's units; larger would overflow the interval arithmetic


def answer(service, req: dict, blobs: list[bytes]) -> pa.Table:
    """A ``partial_matches`` request on ``service`` (a ``connectors.shard.ShardService``)."""
    phase = req.get("phase")
    if phase not in ("push", "pull"):
        raise RequestError("partial_matches needs phase push or pull")
    reach = []
    for name in ("before", "after"):
        value = req.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_REACH:
            raise RequestError(f"partial_matches needs {name}: an integer from 0 to {MAX_REACH}")
        reach.append(value)
    columns = req.get("columns")
    if columns is not None and (not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)):
        raise RequestError("columns must be a list of names")
    table = service._table(req.get("table"))
    anchor = check_fragment(req["anchor"]) if isinstance(req.get("anchor"), str) else None
    if anchor is None:
        raise RequestError("partial_matches needs the anchor's condition")
    where = check_fragment(req["where"]) if req.get("where") else "TRUE"
    pk, key = service._select_keys(req)
    cur = service._cursor()
    got = cur.sql(f"SELECT DISTINCT {pk} AS pk, {key} AS t FROM {table} "
                  f"WHERE ({anchor}) AND {key} IS NOT NULL ORDER BY pk, t").to_arrow_table()
    a_pk = got.column("pk").to_numpy().astype(np.int64)
    a_t = got.column("t").to_numpy().astype(np.int64)
    own = IntervalSet.around(a_pk, a_t, reach[0], reach[1])
    cols = ", ".join(quote_ident(c) for c in columns) if columns else "*"
    if phase == "push":
        rows = _rows_inside(cur, table, cols, where, pk, key, own.contains, own, keyless=True)
        anchors = pack([np.diff(a_pk, prepend=np.int64(0)), np.diff(a_t, prepend=np.int64(0))])
        return pa.table({"blob": pa.array([anchors, _ipc(_compact(rows))], pa.large_binary())})
    wanted = service._time_filter(req.get("filter"), blobs)
    if wanted is None:
        raise RequestError("the pull of partial_matches needs the partial matches' time filter")
    hull = IntervalSet(np.zeros(1, np.int64), *(np.array([int(b)], np.int64) for b in req["range"])) \
        if isinstance(req.get("range"), list) and len(req["range"]) == 2 else None

    def missing(p, t):
        return wanted(p, t) & ~own.contains(p, t)
    return _compact(_rows_inside(cur, table, cols, where, pk, key, missing, hull, keyless=False))


def _rows_inside(cur, table: str, cols: str, where: str, pk: str, key: str, keep, hull: IntervalSet | None,
                 keyless: bool) -> pa.Table:
    """The rows passing ``where`` whose (partition hash, key) ``keep`` accepts, read within the
    key range of ``hull`` (None: all), and those without a key when ``keyless``."""
    if hull is not None and len(hull):
        bounds = f"{key} BETWEEN {int(hull.lo.min())} AND {int(hull.hi.max())}"
    else:
        bounds = "TRUE" if hull is None else "FALSE"
    scope = f"({bounds} OR {key} IS NULL)" if keyless else f"({bounds} AND {key} IS NOT NULL)"
    rows = cur.sql(f"SELECT {cols}, {pk} AS {H.PARTITION_HASH}, {key} AS {H.KEY} FROM {table} "
                   f"WHERE {scope} AND ({where})").to_arrow_table()
    t = rows.column(H.KEY)
    valid = np.asarray(t.is_valid())
    mask = ~valid  # rows without a key: only present when ``keyless``
    if valid.any():
        mask[valid] = keep(rows.column(H.PARTITION_HASH).to_numpy()[valid], t.filter(pa.array(valid)).to_numpy())
    return rows.filter(pa.array(mask)).drop_columns([H.PARTITION_HASH, H.KEY])


def _ipc(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue().to_pybytes()
