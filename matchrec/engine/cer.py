"""Execute a planned CER query over DuckDB and build its result (rows or EXPLAIN text).

Planning ends with the query's physical plan (``physical_plan``, in ``planner.physical``'s
layout shared with MATCH_RECOGNIZE); execution reads the events and runs the mechanism it names.

This module owns the run of a CER statement: plan it (``planner.cer``), read its events
(``engine.cer_read``: columns, rows, filtering before matching), call the evaluation mechanism
chosen (``engine.mechanisms``; the batch operator through ``engine.multi_group``, as
``run_many`` evaluates one statement), and turn the matches into an Arrow table: COUNT(*) here,
the matched events or the RETURN projections by ``engine.cer_result``; and EXPLAIN's text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from matchrec import budget as work
from matchrec.engine.cer_read import filter_join, needed_columns, read_events, register_intervals
from matchrec.engine.cer_result import build_result, count_table
from matchrec.engine.mechanisms import mechanisms
from matchrec.engine.multi_group import evaluate_read
from matchrec.errors import OperationalError
from matchrec.operators.cer_reference import Events, Pattern
from matchrec.parser import sase as S
from matchrec.planner import cer as P
from matchrec.planner.cer import CerSettings
from matchrec.planner.logical import LogicalPlan
from matchrec.planner.physical import MatcherChoice, PhysicalPlan, Section, Semantics, choose_matcher

# ``needed_columns``, ``register_intervals``, ``filter_join``, ``build_result``: also used as engine.cer.<name>
__all__ = ["CerSettings", "build_result", "execute", "filter_join", "mechanisms", "needed_columns", "read_events",
           "register_intervals"]


@dataclass
class CerRun:
    plan: P.CerPlan
    physical: PhysicalPlan | None = None  # built whole by planning, before any event is read
    table: pa.Table | None = None
    explain: str | None = None
    info: dict = field(default_factory=dict)


def execute(duck: duckdb.DuckDBPyConnection, query: S.CerQuery, settings: CerSettings,
            columns: dict | None = None, rowid: bool | None = None) -> CerRun:
    """Plan and run ``query`` (``columns`` and ``rowid``: its source's schema and rowid, when the
    caller knows them: no query asks for them)."""
    # floating-point overflow gives infinity (and 0 * inf NaN) as DuckDB's DOUBLE does: no warnings;
    # the work budget is the caller's when it has one (the session's settings: engine.session)
    with work.statement(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _execute(duck, query, settings, columns, rowid)


def _execute(duck: duckdb.DuckDBPyConnection, query: S.CerQuery, settings: CerSettings,
             columns: dict | None = None, rowid: bool | None = None) -> CerRun:
    m = mechanisms()
    started = time.perf_counter()
    plan = P.plan_query(duck, query, settings, m, columns, rowid)
    plan.mechanism_source = getattr(m, "label", "") if plan.mechanism != "batch" else ""
    run = CerRun(plan, physical_plan(plan))
    run.info["plan_seconds"] = time.perf_counter() - started
    if query.explain == "explain":
        run.explain = explain_text(run)
        return run
    t0 = time.perf_counter()
    table = read_events(duck, plan, run.info)
    run.info["read_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if plan.mechanism == "batch":
        # the batch operator's preparation is run_many's, for one statement
        n, matches, run.info["batch"] = evaluate_read(duck, settings, plan, table)
    else:
        events, pattern = build_pattern(plan, table)
        opts = {"order": plan.order} if plan.order is not None else {}
        opts["max_partial"] = settings.max_partial_matches
        if query.returns == "count":
            n = m.count(plan.mechanism, pattern, events, **opts) if len(events) else 0
        else:
            matches = m.run_columns(plan.mechanism, pattern, events, max_matches=settings.max_matches, **opts) \
                if len(events) else []
    if query.returns == "count":
        run.info["matches"] = n
        result = count_table(n)
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



def build_pattern(plan: P.CerPlan, table: pa.Table) -> tuple[Events, Pattern]:
    q = plan.query
    key = table.column("__key").to_numpy().astype(np.int64)
    types = table.column("__type").to_pylist()
    part = table.column("__pid").to_numpy().astype(np.int64) if plan.partition_column else None
    filters = {var: np.asarray(table.column("__f_" + var).to_numpy(zero_copy_only=False), bool)
               for var in plan.filter_sql}
    conditions = P.compile_conditions(plan, table)
    return Events(key, types, part), Pattern(q.root, plan.window, q.strategy, filters, conditions)


# ---------------------------------------------------------------- physical plan and EXPLAIN
def physical_plan(plan: P.CerPlan) -> PhysicalPlan:
    """The CER plan in the layout every form shares (``planner.physical``): what the query means,
    then how it is read, filtered and matched, with the estimates behind the mechanism."""
    q, st = plan.query, plan.stats
    src = f"{q.source}: order key {plan.key_column} ({plan.key_kind})"
    if plan.type_column:
        src += f", type column {plan.type_column}"
    conditions = [f"{var}: {sql}" for var, sql in plan.filter_sql.items()]
    conditions += [f"condition {q.text[c.span[0]:c.span[1]]}" for c in q.conditions]
    window = "none" if plan.window == P.NO_WINDOW else \
        f"{plan.window}" + (" microseconds" if plan.key_kind == "time" else " key units")
    ret = {"count": "COUNT(*)", "events": "the matched events"}.get(q.returns) or \
        ", ".join(p.name for p in q.projections)
    logical = LogicalPlan("cer", source=(src,),
                          partition=(plan.partition_column,) if plan.partition_column else (),
                          order=(f"key {plan.key_column}" + (", then rowid" if plan.rowid else ""),),
                          pattern=(S.describe(q.root),),
                          conditions=tuple(conditions),
                          window=(window,),
                          strategy=(S.STRATEGY_NAMES[q.strategy],),
                          output=(f"returns {ret}",))
    row_test = plan.row_test()
    access = Section(f"local DuckDB read of {q.source}: the columns the conditions and RETURN read, sorted by "
                     "partition and key", (f"columns: {', '.join(needed_columns(plan)) or 'none'}",
                                           "predicates over one variable evaluated by DuckDB as boolean masks"))
    if plan.filtering:
        first = (f"filtering before matching: on, anchors {', '.join(plan.anchors)} "
                 f"(rarest element of each alternative); {plan.filtering_reason}")
        more = ("interval join: the events within the window of the anchors' candidates",)
    else:
        first, more = f"filtering before matching: off, {plan.filtering_reason}", ()
    filtering = Section(first, more + ((f"row filter in DuckDB: {row_test}",) if row_test else ()))
    counts = ", ".join(f"{t if t is not None else 'NULL'} {n} ({a} + {b})"
                       for t, (n, a, b) in sorted(st.types.items(), key=lambda x: str(x[0]))
                       if q.typed and t in {e.type for e in q.elements.values()})
    estimates = [f"events {st.total}" + (f"; per type (first half + second half of the key range): {counts}"
                                         if counts else "")]
    for var, e in q.elements.items():
        text = f"{S.describe(e)}: about {st.estimates.get(var, 0):.0f} candidates"
        if var in plan.filter_sql:
            text += f", filter selectivity {st.filter_selectivity.get(var, 1):.3f} (DuckDB: {plan.filter_sql[var]})"
        crowd = st.crowding.get(e.type, 1.0) if e.kleene is not None else 1.0
        if var in st.reach:
            got = st.reach[var]
            text += (f"; in reach around {len(got)} sampled candidates of {st.reach_anchor}: "
                     f"{sum(b for b, _ in got) / len(got):.1f} before and {sum(a for _, a in got) / len(got):.1f} after "
                     f"on average, up to {max(b + a for b, a in got)} (its sets counted from these)")
        elif crowd > 1.05:
            text += f"; its events see {crowd:.1f}x the average rate in their own partitions (its sets counted so)"
        estimates.append(text)
    for c, sel in zip(q.conditions, st.condition_selectivity):
        sel_text = "not estimated" if sel is None else f"selectivity {sel:.3f} on a {st.sample_rows}-event sample"
        estimates.append(f"condition {q.text[c.span[0]:c.span[1]]}: {sel_text}")
    for name, cost, what in plan.candidates:
        mark = " (chosen)" if name == plan.mechanism else ""
        if cost is None:
            estimates.append(f"mechanism {name}{mark}: excluded, {what}")
        else:
            secs = "unbounded" if cost >= P.MAX_COST else f"{cost * 1000:.3g} ms"
            estimates.append(f"mechanism {name}{mark}: estimated cost {secs} ({what})")
    chosen = choose_matcher(Semantics(logical.form, mechanism=plan.mechanism, order=tuple(plan.order) if plan.order else None,
                                      mechanism_reason=plan.reason, estimates=tuple(estimates)))
    if plan.mechanism_source:
        chosen = MatcherChoice(chosen.name, chosen.summary, chosen.reason, chosen.estimates,
                               (f"evaluated by {plan.mechanism_source}",))
    output = Section("COUNT(*) as one row" if q.returns == "count" else
                     "an Arrow table of the matches registered with DuckDB, served by DuckDB")
    return PhysicalPlan(f"CER pattern {S.describe(q.root)}", logical, access, filtering, chosen, output)


def explain_text(run: CerRun) -> str:
    info, q = run.info, run.plan.query
    lines = [run.physical.explain()]
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
