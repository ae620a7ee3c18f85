"""Execute a planned CER query over DuckDB and build its result (rows or EXPLAIN text).

This module owns the run of a CER statement: reading the events (only the columns and rows
the query needs, sorted by partition and key, predicates over one variable evaluated by DuckDB
as boolean masks), filtering before matching (the events within the window of the anchors'
candidates, pushed into the read query as a join against intervals), calling the evaluation
mechanism chosen by ``planner.cer``, and turning matches into an Arrow table: COUNT(*), the
matched events (one row per match, a column per variable and source column, Kleene variables
as lists) or the RETURN projections.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from matchrec import budget as work
from matchrec.engine.output import int128_array
from matchrec.errors import DataError, OperationalError
from matchrec.operators import cer_mechanisms
from matchrec.operators.cer_reference import Events, Pattern
from matchrec.operators.intervals import IntervalSet
from matchrec.parser import sase as S
from matchrec.planner import cer as P
from matchrec.planner.cer import CerSettings, quote

__all__ = ["CerSettings", "execute", "mechanisms"]


def mechanisms():
    """The evaluation mechanisms (``operators.cer_mechanisms``)."""
    return cer_mechanisms


@dataclass
class CerRun:
    plan: P.CerPlan
    table: pa.Table | None = None
    explain: str | None = None
    info: dict = field(default_factory=dict)


def execute(duck: duckdb.DuckDBPyConnection, query: S.CerQuery, settings: CerSettings) -> CerRun:
    # floating-point overflow gives infinity (and 0 * inf NaN) as DuckDB's DOUBLE does: no warnings;
    # the work budget is the caller's when it has one (the cursor's settings)
    with work.statement(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _execute(duck, query, settings)


def _execute(duck: duckdb.DuckDBPyConnection, query: S.CerQuery, settings: CerSettings) -> CerRun:
    m = mechanisms()
    started = time.perf_counter()
    plan = P.plan_query(duck, query, settings, m)
    plan.mechanism_source = getattr(m, "label", "") if plan.mechanism != "batch" else ""
    run = CerRun(plan)
    run.info["plan_seconds"] = time.perf_counter() - started
    if query.explain == "explain":
        run.explain = explain_text(run)
        return run
    t0 = time.perf_counter()
    table = read_events(duck, plan, run.info)
    run.info["read_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if plan.mechanism == "batch":
        from matchrec.engine import multi  # the batch operator's preparation is run_many's, one statement

        n, matches, run.info["batch"] = multi.evaluate_read(duck, settings, plan, table)
    else:
        events, pattern = build_pattern(plan, table)
        opts = {"order": plan.order} if plan.order is not None else {}
        opts["max_partial"] = settings.max_partial_matches
        if query.returns == "count":
            n = m.count(plan.mechanism, pattern, events, **opts) if len(events) else 0
        else:
            matches = m.run(plan.mechanism, pattern, events, max_matches=settings.max_matches, **opts) \
                if len(events) else []
    if query.returns == "count":
        run.info["matches"] = n
        result = pa.table({"count": pa.array([n], pa.int64())})
    else:
        if len(matches) > settings.max_matches:
            raise OperationalError(f"The pattern has more than {settings.max_matches} matches; raise SET "
                                   f"matchrec_cer_max_matches, or RETURN COUNT(*) to count them without keeping them")
        run.info["matches"] = len(matches)
        run.info["match_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = build_result(plan, table, matches)
        run.info["output_seconds"] = time.perf_counter() - t0
    run.info.setdefault("match_seconds", time.perf_counter() - t0)
    if query.explain == "analyze":
        run.explain = explain_text(run)
    else:
        run.table = result
    return run


# ---------------------------------------------------------------- reading
def needed_columns(plan: P.CerPlan) -> list[str]:
    q = plan.query
    if q.returns == "events":
        return [name for name, _ in plan.columns.values()]
    res = P._Resolver(q, plan.columns)
    exprs = list(q.conditions) + ([p.expr for p in q.projections] if q.returns == "project" else [])
    names = {res.col(n) for e in exprs for n in S.walk(e) if isinstance(n, S.Col)}
    return [name for name, _ in plan.columns.values() if name in names]


def read_events(duck: duckdb.DuckDBPyConnection, plan: P.CerPlan, info: dict) -> pa.Table:
    q = plan.query
    cols = [quote(c) for c in needed_columns(plan)]
    cols.append(f"{plan.type_sql or 'CAST(NULL AS VARCHAR)'} AS __type")
    cols.append(f"{plan.key_sql} AS __key")
    if plan.partition_column:
        cols.append(f"{quote(plan.partition_column)} AS __part")
    if plan.rowid:
        cols.append("rowid AS __rid")
    for var, sql in plan.filter_sql.items():
        cols.append(f"{sql} AS {quote('__f_' + var)}")
    where = [f"{plan.key_sql} IS NOT NULL"]
    row_test = plan.row_test()
    if row_test:
        where.append(f"({row_test})")
    body = f"SELECT {', '.join(cols)} FROM {q.source} WHERE {' AND '.join(where)}"
    info["events_total"] = plan.stats.total
    registered = None
    try:
        if plan.filtering:
            registered = _intervals(duck, plan, info)
            body = filter_join(body, registered, bool(plan.partition_column))
        order = (["__part NULLS LAST"] if plan.partition_column else []) + ["__key"] + \
            (["__rid"] if plan.rowid else [])
        pid = ", dense_rank() OVER (ORDER BY __part NULLS LAST) - 1 AS __pid" if plan.partition_column else ""
        sql = f"SELECT *{pid} FROM ({body}) ORDER BY {', '.join(order)}"
        info["read_sql"] = sql
        table = duck.sql(sql).to_arrow_table()
    finally:
        if registered is not None:
            duck.unregister(registered)
    info["events_read"] = len(table)
    return table


def _intervals(duck: duckdb.DuckDBPyConnection, plan: P.CerPlan, info: dict) -> str:
    """Register the intervals ``[t - W, t + W]`` around the anchors' candidates; every event of a
    match lies within W of the match's anchor event, negated events' ranges included."""
    test = " OR ".join(f"({plan.element_test(v)})" for v in plan.anchors)
    name, candidates, intervals = register_intervals(duck, plan.query.source, plan.key_sql, plan.partition_column,
                                                     [(test, plan.window)])
    info["anchor_candidates"] = candidates
    info["intervals"] = intervals
    return name


def register_intervals(duck: duckdb.DuckDBPyConnection, source: str, key_sql: str, partition_column: str | None,
                       anchors: list[tuple[str, int]]) -> tuple[str, int, int]:
    """Register with DuckDB the union of ``[t - w, t + w]`` around the key ``t`` of every row of
    ``source`` that meets one of the ``anchors`` (SQL test, window ``w``; the largest window where a
    row meets several), per partition: columns ``lo``, ``hi`` (and ``p``, the partition value).
    Returns (the registered name, rows meeting a test, intervals); ``filter_join`` reads a query through it."""
    part = quote(partition_column) if partition_column else "NULL"
    if len({w for _, w in anchors}) == 1:
        width = str(int(anchors[0][1]))
    else:
        width = "greatest(" + ", ".join(f"CASE WHEN {t} THEN {int(w)} END" for t, w in anchors) + ")"
    test = " OR ".join(f"({t})" for t, _ in anchors)
    cand = duck.sql(
        f"SELECT p, dense_rank() OVER (ORDER BY p NULLS LAST) AS g, k, w FROM (SELECT {part} AS p, {key_sql} AS k, "
        f"{width} AS w FROM {source} WHERE {key_sql} IS NOT NULL AND ({test})) ORDER BY g, k").to_arrow_table()
    g = cand.column("g").to_numpy().astype(np.int64)
    k = cand.column("k").to_numpy().astype(np.int64)
    w = cand.column("w").to_numpy().astype(np.int64)
    iv = IntervalSet.around(g, k, w, w)
    columns = {"lo": pa.array(iv.lo, pa.int64()), "hi": pa.array(iv.hi, pa.int64())}
    if partition_column:
        first = np.searchsorted(g, iv.pk)
        columns["p"] = cand.column("p").take(pa.array(first, pa.int64()))
    name = f"__matchrec_cer_intervals_{secrets.token_hex(6)}"
    duck.register(name, pa.table(columns))
    return name, len(cand), len(iv)


def filter_join(body: str, registered: str, partitioned: bool) -> str:
    """``body`` (a query with ``__key`` and, when ``partitioned``, ``__part``) keeping only the rows
    inside the intervals ``register_intervals`` registered as ``registered`` (they never overlap, so
    no row comes twice)."""
    on = "s.__key BETWEEN iv.lo AND iv.hi"
    if partitioned:
        on += " AND iv.p IS NOT DISTINCT FROM s.__part"
    return f"SELECT s.* FROM ({body}) s JOIN {registered} iv ON {on}"


def build_pattern(plan: P.CerPlan, table: pa.Table) -> tuple[Events, Pattern]:
    q = plan.query
    key = table.column("__key").to_numpy().astype(np.int64)
    types = table.column("__type").to_pylist()
    part = table.column("__pid").to_numpy().astype(np.int64) if plan.partition_column else None
    filters = {var: np.asarray(table.column("__f_" + var).to_numpy(zero_copy_only=False), bool)
               for var in plan.filter_sql}
    conditions = P.compile_conditions(plan, table)
    return Events(key, types, part), Pattern(q.root, plan.window, q.strategy, filters, conditions)


# ---------------------------------------------------------------- results
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


# ---------------------------------------------------------------- EXPLAIN
def explain_text(run: CerRun) -> str:
    plan, info = run.plan, run.info
    q, st = plan.query, plan.stats
    lines = [f"CER pattern {S.describe(q.root)}"]
    lines.append(f"  strategy {S.STRATEGY_NAMES[q.strategy]}; window "
                 + ("none" if plan.window == P.NO_WINDOW else f"{plan.window}"
                    + (" microseconds" if plan.key_kind == "time" else " key units")))
    src = f"  source {q.source}: order key {plan.key_column} ({plan.key_kind})"
    if plan.type_column:
        src += f", type column {plan.type_column}"
    if plan.partition_column:
        src += f", partition by {plan.partition_column}"
    lines.append(src)
    counts = ", ".join(f"{t if t is not None else 'NULL'} {n} ({a} + {b})"
                       for t, (n, a, b) in sorted(st.types.items(), key=lambda x: str(x[0]))
                       if q.typed and t in {e.type for e in q.elements.values()})
    lines.append(f"  events {st.total}" + (f"; per type (first half + second half of the key range): {counts}"
                                           if counts else ""))
    for var, e in q.elements.items():
        text = f"  {S.describe(e)}: about {st.estimates.get(var, 0):.0f} candidates"
        if var in plan.filter_sql:
            text += f", filter selectivity {st.filter_selectivity.get(var, 1):.3f} (DuckDB: {plan.filter_sql[var]})"
        lines.append(text)
    for c, sel in zip(q.conditions, st.condition_selectivity):
        sel_text = "not estimated" if sel is None else f"selectivity {sel:.3f} on a {st.sample_rows}-event sample"
        lines.append(f"  condition {q.text[c.span[0]:c.span[1]]}: {sel_text}")
    order = f", order {', '.join(plan.order)}" if plan.order else ""
    lines.append(f"  mechanism {plan.mechanism}{order}: {plan.reason}")
    if plan.mechanism_source:
        lines.append(f"  evaluated by {plan.mechanism_source}")
    if plan.filtering:
        lines.append(f"  filtering before matching: on, anchors {', '.join(plan.anchors)} "
                     f"(rarest element of each alternative); {plan.filtering_reason}")
    else:
        lines.append(f"  filtering before matching: off, {plan.filtering_reason}")
    ret = {"count": "COUNT(*)", "events": "the matched events"}.get(q.returns) or \
        ", ".join(p.name for p in q.projections)
    lines.append(f"  returns {ret}")
    if q.explain == "analyze":
        read, total = info.get("events_read", 0), info.get("events_total", 0)
        share = f" ({read / total:.1%})" if total else ""
        lines.append(f"Analyze: events read {read} of {total}{share}; matches {info.get('matches', 0)}")
        if "intervals" in info:
            lines.append(f"  {info['anchor_candidates']} anchor candidates -> {info['intervals']} intervals")
        lines.append(f"  plan {info.get('plan_seconds', 0):.3f} s, read {info.get('read_seconds', 0):.3f} s, "
                     f"match {info.get('match_seconds', 0):.3f} s, output {info.get('output_seconds', 0):.3f} s")
        lines += ["  " + x.replace("shared operator:", "batch operator:", 1) for x in info.get("batch", [])]
    return "\n".join(lines)
