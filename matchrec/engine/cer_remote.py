"""CER statements over storage-node tables: pull the rows a match can use, then match locally.

A compute node (``Session`` with a ``RemoteStore``) runs a CER statement whose FROM names a
storage-node table in three steps:

1. resolve the statement against the table's columns (the empty placeholder the session
   registered for it) and derive what the pull needs (``planner.cer_intervals``): the columns
   the statement reads, the row filter (rows some element could take or be blocked by) and the
   time interval plan (the mandatory elements' candidates widened by WITHIN);
2. pull with the session's ``pull_strategy`` (``connectors.dual_filtering``: ``pull_all``,
   ``push_down``, ``naive_dfs``, ``dfs``, ``dfs_stateful``, ``push_pull``; ``auto`` takes ``dfs`` when there is an
   interval plan, else ``push_down``, and the rounds' cost model decides the rest);
3. load the pulled rows into a temporary DuckDB table of the same name, sorted by partition,
   key and then the other pulled columns, and run the local CER engine (``engine.cer``) over it,
   so plans, mechanisms and results are those of a local run over the same rows.

The nodes keep no order among rows of equal keys (``matchrec load`` spreads rows by a hash), so
the tie order is that sort's, not the order the rows were loaded in: results equal a local run
over the original table whenever they do not depend on the order of events with equal keys
(skip-till-any-match and skip-till-next-match never put two such events in sequence; strict
contiguity looks at positions, and does when keys repeat within a partition).

EXPLAIN and EXPLAIN ANALYZE pull too (the CER plan rests on the statistics of the rows) and add
the pull's lines: strategy, interval plan, round trips, bytes per node and per phase.
"""
from __future__ import annotations

import dataclasses
import secrets
import time

import duckdb

from matchrec.connectors.source import PullStats
from matchrec.engine import cer
from matchrec.parser import sase as S
from matchrec.parser.names import quote_ident
from matchrec.planner.cer import CerSettings
from matchrec.planner.cer.resolve import _Resolver, resolve_query
from matchrec.planner.cer_intervals import interval_plan, row_filter

DFS_STRATEGIES = ("dfs", "naive_dfs", "dfs_stateful", "push_pull")


def node_table(remote, source: str) -> str | None:
    """The storage-node table a CER statement's FROM names, or None (a local relation)."""
    if source in remote.schemas:
        return source
    found = [n for n in remote.schemas if n.lower() == source.lower()]
    return found[0] if len(found) == 1 else None


def execute(session, query: S.CerQuery) -> cer.CerRun:
    """Run ``query`` on a compute-node ``session`` (``engine.session.Session`` with ``remote``)."""
    remote, duck = session.remote, session.duck
    table = node_table(remote, query.source)
    if table is None or table in getattr(session, "cer_group_pulled", ()):
        # a local table or view of the compute node, or a node table a run_many group pulled
        return cer.execute(duck, query, session.cer_settings)
    prepared = getattr(session, "cer_group_prepared", None)
    if prepared is not None and prepared[0] == table:  # a run_many group pulled this statement's own rows
        _, data, stats, order = prepared
        run = run_over(duck, query, session.cer_settings, table, data, remote.schemas[table], order)
        run.info["pull"] = stats
        run.info["pull_seconds"] = 0.0
        return run
    settings = session.settings
    started = time.perf_counter()
    pulled, stats, notes, order, columns = pull(remote, duck, query, session.cer_settings, settings.pull_strategy,
                                         settings.round_trips, table)
    pull_seconds = time.perf_counter() - started
    cer_settings = session.cer_settings
    if cer_settings.filtering == "auto" and stats.filters.get("final pull"):
        # the nodes returned only the rows inside the rounds' time interval set: filtering them
        # again around the anchors' candidates would cost a query and a join to drop next to none
        cer_settings = dataclasses.replace(cer_settings, nodes_filtered=True)
    run = run_over(duck, query, cer_settings, table, pulled, remote.schemas[table], order, columns)
    run.info["pull"] = stats
    run.info["pull_seconds"] = pull_seconds
    if run.explain is not None:
        run.explain += "\n" + "\n".join(explain_lines(table, stats, notes, pull_seconds))
    return run


def pull(remote, duck: duckdb.DuckDBPyConnection, query: S.CerQuery, cer_settings: CerSettings, strategy: str,
         round_trips: str, table: str):
    """The rows of ``table`` the statement can use, as Arrow (the table's schema, unread columns
    NULL), the pull's statistics, the notes EXPLAIN shows about the choices, the columns that
    order the rows (key first) and the table's columns as planning describes them."""
    plan = resolve_query(duck, query, cer_settings, rowid=False)
    where, where_why = row_filter(plan)
    notes = [f"row filter: {where}" if where else f"no row filter: {where_why}"]
    ip, why = None, ""
    join_notes: list[str] = []
    if strategy in ("auto",) + DFS_STRATEGIES:
        ip, why = interval_plan(plan, join_notes)
    if strategy == "auto":
        strategy = "dfs" if ip is not None else "push_down"
        notes.append(f"pull strategy auto -> {strategy}" + (f" ({why})" if ip is None else ""))
    elif strategy in DFS_STRATEGIES and ip is None:
        notes.append(f"pull strategy {strategy} cannot filter by time here ({why}): push_down used")
        strategy = "push_down"
    if ip is not None:
        notes += ip.describe() + join_notes
    needed = set(cer.needed_columns(plan)) | filter_columns(plan) | {plan.key_column}
    if plan.type_column:
        needed.add(plan.type_column)
    if plan.partition_column:
        needed.add(plan.partition_column)
    columns = [f.name for f in remote.schemas[table] if f.name in needed]
    stats = PullStats(strategy=strategy)
    data = remote.pull(table, strategy, columns, where, ip, round_trips, stats)
    # the key (and partition) first: the order DuckDB sorts by anyway, then the other columns
    order = [c for c in (plan.partition_column, plan.key_column) if c] + \
        [c for c in columns if c not in (plan.partition_column, plan.key_column)]
    return data, stats, notes, order, plan.columns


def filter_columns(plan) -> set[str]:
    """The columns the elements' one-variable filters read (DuckDB evaluates them locally too)."""
    q = plan.query
    res = _Resolver(q, plan.columns)
    exprs = [e for preds in q.filters.values() for e in preds] + list(q.constants)
    return {res.col(n) for e in exprs for n in S.walk(e) if isinstance(n, S.Col)}


def run_over(duck: duckdb.DuckDBPyConnection, query: S.CerQuery, cer_settings: CerSettings, table: str, data,
             schema, columns: list[str], described: dict | None = None) -> cer.CerRun:
    """The local CER engine over ``data`` standing in for the node table ``table`` (a temporary
    table of that name, so the statement reads it as written; the placeholder comes back after).
    The nodes keep no order among rows of equal keys, and each strategy returns them in its own
    order: the rows are sorted by ``columns`` (partition, key, the rest), so every strategy and
    every run sees one order. ``described``: the placeholder's columns as planning describes
    them, when known (the temporary table has the same schema, and a rowid)."""
    try:
        _swap_in(duck, table, data, columns)
        if described is None:
            return cer.execute(duck, query, cer_settings)
        return cer.execute(duck, query, cer_settings, described, True)
    finally:
        duck.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(table)}")
        duck.register(table, schema.empty_table())


def _order_columns(data, columns: list[str]) -> list[str]:
    """``columns`` DuckDB can sort by (lists and structs order too; a map does not)."""
    import pyarrow as pa
    return [c for c in columns if not pa.types.is_map(data.schema.field(c).type)]


def explain_lines(table: str, stats: PullStats, notes: list[str], seconds: float) -> list[str]:
    lines = [f"Storage nodes: table {table} pulled in {seconds:.3f} s (the event counts above are the pulled rows')"]
    lines += ["  " + n for n in notes]
    lines += ["  " + x for x in stats.lines()]
    return lines


def _swap_in(duck: duckdb.DuckDBPyConnection, table: str, data, columns: list[str]) -> None:
    """Replace the placeholder of ``table`` with a temporary table of ``data``, sorted by ``columns``."""
    arrow_name = f"__matchrec_cer_pulled_{secrets.token_hex(6)}"
    order = ", ".join(f"{quote_ident(c)} NULLS LAST" for c in _order_columns(data, columns))
    duck.unregister(table)
    duck.register(arrow_name, data)
    try:
        duck.execute(f"CREATE TEMP TABLE {quote_ident(table)} AS SELECT * FROM {arrow_name} ORDER BY {order}")
    finally:
        duck.unregister(arrow_name)
