"""The statistics a plan's choices rest on: per-type counts (and their change between the two
halves of the key range) from DuckDB, predicate selectivity from a sample of events, and the
share of the key range (or of the rows, per partition) the anchors' intervals could cover."""
from __future__ import annotations

import collections
import random

import duckdb
import numpy as np
import pyarrow as pa

from matchrec.errors import DataError
from matchrec.parser import sase as S
from matchrec.planner.cer.codegen import PyCompiler
from matchrec.planner.cer.costs import DEFAULT_SELECTIVITY, Model, subsets
from matchrec.planner.cer.plan import (FILTER_COVER, NO_WINDOW, RATE_CHANGE, REACH_SAMPLE, SAMPLE_ROWS, SAMPLE_TRIALS,
                                       CerPlan, quote, sql_literal)
from matchrec.planner.cer.resolve import _Resolver


def gather_stats(duck: duckdb.DuckDBPyConnection, plan: CerPlan, conditions: bool = True) -> None:
    """Fill ``plan.stats``; without ``conditions`` the conditions' selectivity is not estimated
    (it serves only the mechanism's cost), and no sample is read when no element has a filter
    and there is no condition to estimate."""
    q, st = plan.query, plan.stats
    src = q.source
    type_expr = plan.type_sql or "NULL"
    rows = duck.execute(
        f"WITH s AS (SELECT {type_expr} AS t, {plan.key_sql} AS k FROM {src} WHERE {plan.key_sql} IS NOT NULL), "
        f"m AS (SELECT min(k) AS lo, max(k) AS hi FROM s) "
        f"SELECT t, count(*), count(*) FILTER (WHERE k <= (SELECT lo + (hi - lo) // 2 FROM m)), "
        f"any_value((SELECT hi - lo FROM m)) FROM s GROUP BY t").fetchall()
    for t, n, first, span in rows:
        st.types[t] = (n, first, n - first)
        st.key_span = int(span or 0)
    st.total = sum(n for n, _, _ in st.types.values())
    st.part_span, st.parts = st.key_span, 1
    if plan.partition_column:
        # rates are per partition: a window around an event reaches only its own partition's events.
        # For the types of Kleene elements also the rate an event sees in its own partition,
        # averaged over the events: busy partitions hold most events, so it is above the average
        # rate (sum n / sum span) when the partitions differ, and a closure's event sets grow
        # exponentially with it (``Stats.crowding``)
        kleene = sorted({e.type for v, e in q.elements.items() if e.kleene is not None and v in q.positive},
                        key=str)
        counts = [f"count(*) FILTER (WHERE {type_expr} = {sql_literal(t)}) AS k{i}" if t is not None else
                  f"count(*) AS k{i}" for i, t in enumerate(kleene)]
        rates = [f"sum(CAST(k{i} AS DOUBLE) * n / span) FILTER (WHERE span > 0), sum(k{i}) FILTER (WHERE span > 0)"
                 for i in range(len(kleene))]
        row = duck.execute(
            f"SELECT count(*), sum(span), sum(n) FILTER (WHERE span > 0){''.join(', ' + r for r in rates)} FROM "
            f"(SELECT count(*) AS n, max({plan.key_sql}) - min({plan.key_sql}) AS span"
            f"{''.join(', ' + c for c in counts)} FROM {src} WHERE {plan.key_sql} IS NOT NULL "
            f"GROUP BY {quote(plan.partition_column)})").fetchall()[0]
        parts, span, events = row[:3]
        st.parts, st.part_span = int(parts or 0), int(span or 0)
        for i, t in enumerate(kleene):
            weighted, n_spanned = row[3 + 2 * i], row[4 + 2 * i]
            if weighted and n_spanned and span and events:
                # (the rate in an event's own partition) / (the rate over all partitions)
                st.crowding[t] = max(1.0, (weighted / events) / (n_spanned / span))
    if (not conditions or not q.conditions) and not plan.filter_sql:
        # without a filter every event of an element's type is its candidate: a sample would say 1.0
        # (and with no condition either it has nothing else to estimate)
        for var, e in q.elements.items():
            st.filter_selectivity[var] = 1.0
            st.estimates[var] = float(st.total if e.type is None else st.types.get(e.type, (0, 0, 0))[0])
        st.condition_selectivity = [None] * len(q.conditions)
        return
    # a sample of events for the predicates' selectivity
    res = _Resolver(q, plan.columns)
    needed = {res.col(n) for e in q.conditions for n in S.walk(e) if isinstance(n, S.Col)} if conditions else set()
    cols = [quote(c) for c in sorted(needed)]
    for var, e in q.elements.items():
        cols.append(f"{plan.element_test(var)} AS {quote('__t_' + var)}")
        type_test = "TRUE" if e.type is None else f"{plan.type_sql} = {sql_literal(e.type)}"
        cols.append(f"{type_test} AS {quote('__y_' + var)}")
    sample = duck.sql(
        f"SELECT {', '.join(cols)} FROM (SELECT * FROM {src} WHERE {plan.key_sql} IS NOT NULL) "
        f"USING SAMPLE reservoir({SAMPLE_ROWS} ROWS) REPEATABLE (7)").to_arrow_table()
    st.sample_rows = len(sample)
    for var, e in q.elements.items():
        hits = np.asarray(sample.column("__t_" + var).to_numpy(zero_copy_only=False), bool)
        of_type = np.asarray(sample.column("__y_" + var).to_numpy(zero_copy_only=False), bool)
        base = st.total if e.type is None else st.types.get(e.type, (0, 0, 0))[0]
        sel = float(hits[of_type].mean()) if of_type.any() else 1.0
        st.filter_selectivity[var] = sel
        st.estimates[var] = base * sel
    st.condition_selectivity = estimate_conditions(plan, sample) if conditions else [None] * len(q.conditions)


def sample_reach(duck: duckdb.DuckDBPyConnection, plan: CerPlan) -> None:
    """``plan.stats.reach``: per positive Kleene element, the candidates within the window before and
    after each of up to ``REACH_SAMPLE`` sampled candidates of the pattern's rarest single element,
    in its partition. A closure's event sets grow exponentially with these counts, and where the
    events come in bursts (delays in bad weather) their spread, not their average, makes the
    sets: counted around real anchors, the bursts are in the sample. Only with WITHIN and a
    single element to stand as the anchor."""
    q, st = plan.query, plan.stats
    kleene = [v for v in q.positive if q.elements[v].kleene is not None]
    singles = [v for v in q.positive if q.elements[v].kleene is None]
    if not kleene or not singles or plan.window >= NO_WINDOW:
        return
    anchor = min(singles, key=lambda v: (st.types.get(q.elements[v].type, (st.total, 0, 0))[0]
                                         if q.elements[v].type is not None else st.total, q.positive.index(v)))
    part = quote(plan.partition_column) if plan.partition_column else "0"
    tests = ", ".join(f"{plan.element_test(v)} AS {quote('__r_' + v)}" for v in kleene)
    counts = ", ".join(f"count(*) FILTER (WHERE b.{quote('__r_' + v)} AND b.k < a.k), "
                       f"count(*) FILTER (WHERE b.{quote('__r_' + v)} AND b.k > a.k)" for v in kleene)
    key = plan.key_sql
    rows = duck.execute(
        f"WITH a AS (SELECT {part} AS p, {key} AS k, row_number() OVER () AS i FROM (SELECT * FROM {q.source} "
        f"WHERE {key} IS NOT NULL AND ({plan.element_test(anchor)})) USING SAMPLE reservoir({REACH_SAMPLE} ROWS) "
        f"REPEATABLE (7)), b AS (SELECT {part} AS p, {key} AS k, {tests} FROM {q.source} WHERE {key} IS NOT NULL "
        f"AND ({' OR '.join(plan.element_test(v) for v in kleene)})) "
        f"SELECT a.i, {counts} FROM a LEFT JOIN b ON a.p IS NOT DISTINCT FROM b.p AND b.k BETWEEN "
        f"CAST(a.k AS HUGEINT) - {plan.window} AND CAST(a.k AS HUGEINT) + {plan.window} GROUP BY a.i").fetchall()
    if not rows:
        return
    for j, v in enumerate(kleene):
        st.reach[v] = [(int(r[1 + 2 * j]), int(r[2 + 2 * j])) for r in rows]
    st.reach_anchor = anchor


def estimate_conditions(plan: CerPlan, sample: pa.Table) -> list:
    q = plan.query
    if not q.conditions or len(sample) == 0:
        return [None] * len(q.conditions)
    cands = {v: np.flatnonzero(np.asarray(sample.column("__t_" + v).to_numpy(zero_copy_only=False), bool)).tolist()
             for v in q.elements}
    comp = PyCompiler(sample, _Resolver(q, plan.columns), {v for v, e in q.elements.items() if e.kleene})
    rng = random.Random(11)
    out = []
    for c in q.conditions:
        vs = sorted(S.variables(c))
        if any(len(cands[v]) == 0 for v in vs):
            out.append(None)
            continue
        fn = comp.function(c)
        hits = 0
        for _ in range(SAMPLE_TRIALS):
            b = {}
            for v in vs:
                e = q.elements[v]
                if e.kleene:
                    size = min(len(cands[v]), max(e.kleene[0], rng.randint(1, 3)))
                    b[v] = tuple(sorted(rng.sample(cands[v], size)))
                else:
                    b[v] = rng.choice(cands[v])
            try:
                value = fn(b)
            except DataError:
                value = None
            hits += value is not None and bool(value)
        out.append(hits / SAMPLE_TRIALS)
    return out


def cost_model(plan: CerPlan) -> Model:
    """The statistics as the cost model reads them (``costs.Model``): per half of the key range each
    variable's candidates and its candidates within one window of a point (its rate per key unit
    of one partition times W), the conditions' selectivity, the events read."""
    q, st = plan.query, plan.stats
    span = max(st.part_span, 0)
    reach = 1.0 if span <= 0 or plan.window >= span else 2.0 * plan.window / span  # half the span per half
    n: tuple = ({}, {})
    lam: tuple = ({}, {})
    share = {}
    for var, e in q.elements.items():
        total = float(st.estimates.get(var, 0.0))
        if e.type is None:
            halves = (0.5, 0.5)
        else:
            c, first, second = st.types.get(e.type, (0, 0, 0))
            halves = (first / c, second / c) if c else (0.5, 0.5)
        for h in range(2):
            n[h][var] = total * halves[h]
            lam[h][var] = n[h][var] * min(1.0, reach)
        share[var] = total / st.total if st.total else 0.0
    conditions, step = [], {}
    for c, sel in zip(q.conditions, st.condition_selectivity or [None] * len(q.conditions)):
        sel = DEFAULT_SELECTIVITY if sel is None else max(sel, 1e-4)
        vs = frozenset(S.variables(c))
        if len(vs) == 1 and S.reads_previous(c):  # b[i] against b[i-1]: holds or not per consecutive pair
            (var,) = vs
            step[var] = step.get(var, 1.0) * sel
        else:
            conditions.append((vs, sel))
    conditions = tuple(conditions)
    if q.strategy == "strict" or any(e.type is None and var not in plan.filter_sql for var, e in q.elements.items()):
        read = float(st.total)
    else:
        types = {e.type for e in q.elements.values() if e.type is not None}
        read = float(sum(st.types.get(t, (0, 0, 0))[0] for t in types))
        read += sum(st.estimates.get(v, 0.0) for v, e in q.elements.items() if e.type is None)
    crowd = {var: st.crowding.get(e.type, 1.0) for var, e in q.elements.items() if e.kleene is not None}
    sampled = {}
    for var, counts in st.reach.items():  # the sets in reach of one side of the window, and of both
        e = q.elements[var]
        one = [subsets(max(b, a), e.kleene, step.get(var, 1.0)) for b, a in counts]
        both = [subsets(b + a, e.kleene, step.get(var, 1.0)) for b, a in counts]
        sampled[var] = (sum(one) / len(one), sum(both) / len(both))
    return Model(n, lam, share, conditions, read, q.strategy, q.returns == "count", crowd, step, sampled)


def rate_changes(plan: CerPlan) -> list[str]:
    out = []
    types = {plan.query.elements[v].type for v in plan.query.positive}
    for t in sorted(x for x in types if x is not None):
        n, first, second = plan.stats.types.get(t, (0, 0, 0))
        if n < 20:
            continue  # too few events to speak of a rate
        lo, hi = sorted((first, second))
        if hi > RATE_CHANGE * max(lo, 1):
            out.append(f"{t}: {first} then {second}")
    return out


def interval_cover(candidates: float, window: int, span: int) -> float:
    """The share of a key range of length ``span`` that intervals ``[t - window, t + window]``
    around ``candidates`` points could cover (at most)."""
    return 1.0 if span <= 0 else min(1.0, candidates * (2 * window + 1) / span)


def anchor_cover(duck: duckdb.DuckDBPyConnection | None, source: str, key_sql: str, partition_column: str | None,
                 anchors: list[tuple[str, int]], flat: float) -> tuple[float, str]:
    """(The share the intervals around the anchors' candidates could cover, of what), from ``flat``,
    their cover of the whole key range. With PARTITION BY, when ``flat`` is too large to filter,
    it is counted again per partition (``partitioned_cover``): over the whole key range a few
    candidates in each of many partitions seem to cover everything, although each covers only its
    own partition's rows."""
    if partition_column and duck is not None and flat > FILTER_COVER:
        return min(1.0, partitioned_cover(duck, source, key_sql, partition_column, anchors)), "rows (per partition)"
    return flat, "key range"


def partitioned_cover(duck: duckdb.DuckDBPyConnection, source: str, key_sql: str, partition_column: str,
                      anchors: list[tuple[str, int]]) -> float:
    """The share of the rows the intervals of each (anchor test, window) could cover, summed over
    the anchors: per partition, ``interval_cover`` over the partition's own key range, weighted by
    its rows."""
    if not anchors:
        return 0.0
    tests = list(dict.fromkeys(t for t, _ in anchors))  # statements of a workload share anchors: one count each
    inner = ", ".join(f"count(*) FILTER (WHERE {t}) AS c{i}" for i, t in enumerate(tests))
    pairs = collections.Counter((t, int(w)) for t, w in anchors)
    outer = " + ".join(f"{m} * sum(least(n, CAST(c{tests.index(t)} AS DOUBLE) * {2 * w + 1} * n / (hi - lo + 1)))"
                       for (t, w), m in pairs.items())
    n, covered = duck.execute(
        f"SELECT sum(n), {outer} FROM (SELECT count(*) AS n, min({key_sql}) AS lo, max({key_sql}) AS hi, {inner} "
        f"FROM {source} WHERE {key_sql} IS NOT NULL GROUP BY {quote(partition_column)})").fetchall()[0]
    return float(covered or 0.0) / float(n) if n else 0.0
