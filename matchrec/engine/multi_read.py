"""The one read of a group of CER statements over the same source (``run_many``): the union of the
columns its statements need, every distinct single-variable filter as a boolean column, the rows any
element of any statement could take, and filtering before matching for the whole group."""
from __future__ import annotations

import pyarrow as pa

from matchrec.engine.cer_read import event_columns, filter_join, needed_columns, register_intervals, sorted_read
from matchrec.planner import cer as P


def read_group(duck, settings: P.CerSettings, plans: list) -> tuple[pa.Table, dict, str]:
    """(The events of the group's source, sorted by partition and key; the filter columns: filter
    SQL -> column name; what filtering before matching did, for the report)."""
    p0 = plans[0]
    wanted: set = set()
    for plan in plans:
        wanted.update(needed_columns(plan))
    cols = [P.quote(name) for name, _ in p0.columns.values() if name in wanted] + event_columns(p0)
    filter_cols: dict = {}
    for plan in plans:
        for sql in plan.filter_sql.values():
            filter_cols.setdefault(sql, f"__g{len(filter_cols)}")
    cols += [f"{sql} AS {name}" for sql, name in filter_cols.items()]
    where = [f"{p0.key_sql} IS NOT NULL"]
    test = P.rows_test(plans)
    if test is not None:
        where.append(f"({test})")
    body = f"SELECT {', '.join(cols)} FROM {p0.query.source} WHERE {' AND '.join(where)}"
    registered, filtering = group_intervals(duck, settings, plans)
    try:
        if registered is not None:
            body = filter_join(body, registered, bool(p0.partition_column))
        table, _ = sorted_read(duck, body, p0)
        return table, filter_cols, filtering
    finally:
        if registered is not None:
            duck.unregister(registered)


def group_intervals(duck, settings: P.CerSettings, plans: list) -> tuple[str | None, str]:
    """Filtering before matching for the whole group: when every statement has a WITHIN and the
    windows around the candidates of their anchors (per alternative, the element with the fewest
    candidates: every match binds one) cover little of the key range, register those intervals
    (``engine.cer_read.register_intervals``) and return the name, else None; with what was done, for
    the report. Every event of a match, and every event a negation or strict contiguity looks at,
    lies within its statement's window of the match's anchor event, so the other rows cannot change
    any result."""
    mode = settings.filtering
    if mode == "never":
        return None, "off (SET matchrec_cer_filtering = never)"
    if any(p.window >= P.NO_WINDOW for p in plans):
        return None, "off: a statement without WITHIN may match any event"
    p0 = plans[0]
    # candidates per element: one scan grouped by type, each distinct filter counted per type
    filters = list(dict.fromkeys(f for p in plans for f in p.filter_sql.values()))
    rows = duck.execute(
        f"SELECT {p0.type_sql or 'NULL'}, min({p0.key_sql}), max({p0.key_sql}), count(*)"
        + "".join(f", count(*) FILTER (WHERE {f})" for f in filters)
        + f" FROM {p0.query.source} WHERE {p0.key_sql} IS NOT NULL GROUP BY 1").fetchall()
    lows = [r[1] for r in rows if r[1] is not None]
    span = int(max(r[2] for r in rows if r[2] is not None) - min(lows)) if lows else 0
    slot = {f: 4 + i for i, f in enumerate(filters)}

    def count(p, v) -> int:
        t, col = p.query.elements[v].type, slot.get(p.filter_sql.get(v), 3)
        return sum(r[col] for r in rows if t is None or r[0] == t)

    anchors, flat = [], 0.0
    for p in plans:
        vars_ = P.anchors_of(p.query, lambda v, p=p: count(p, v))
        anchors.append((" OR ".join(f"({p.element_test(v)})" for v in vars_), p.window))
        flat += P.interval_cover(sum(count(p, v) for v in vars_), p.window, span)
    if mode != "always":
        cover, what = P.anchor_cover(duck, p0.query.source, p0.key_sql, p0.partition_column, anchors,
                                     min(flat, 1.0))
        if cover > P.FILTER_COVER:
            return None, f"off: the anchors' intervals would cover about {cover:.0%} of the {what}"
    name, found, n = register_intervals(duck, p0.query.source, p0.key_sql, p0.partition_column, anchors)
    return name, (f"{n:,} intervals around {found:,} anchor candidates" +
                  (" (forced by SET matchrec_cer_filtering = always)" if mode == "always" else ""))
