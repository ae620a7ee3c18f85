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

import contextlib
import math
import secrets
import time
from dataclasses import dataclass

import duckdb
import numpy as np

from matchrec.connectors.source import PullStats
from matchrec.engine import cer
from matchrec.operators.intervals import IntervalSet
from matchrec.parser import sase as S
from matchrec.parser.names import quote_ident
from matchrec.planner.cer import CerSettings
from matchrec.planner.cer.resolve import _Resolver, resolve_query
from matchrec.planner.cer_intervals import interval_plan, row_filter
from matchrec.planner.intervals import VariableIntervals

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
    settings = session.settings
    started = time.perf_counter()
    pulled, stats, notes, order = pull(remote, duck, query, session.cer_settings, settings.pull_strategy,
                                settings.round_trips, table)
    pull_seconds = time.perf_counter() - started
    run = run_over(duck, query, session.cer_settings, table, pulled, remote.schemas[table], order)
    run.info["pull"] = stats
    run.info["pull_seconds"] = pull_seconds
    if run.explain is not None:
        run.explain += "\n" + "\n".join(explain_lines(table, stats, notes, pull_seconds))
    return run


def pull(remote, duck: duckdb.DuckDBPyConnection, query: S.CerQuery, cer_settings: CerSettings, strategy: str,
         round_trips: str, table: str):
    """The rows of ``table`` the statement can use, as Arrow (the table's schema, unread columns
    NULL), the pull's statistics, the notes EXPLAIN shows about the choices and the columns that
    order the rows (key first)."""
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
    return data, stats, notes, order


def filter_columns(plan) -> set[str]:
    """The columns the elements' one-variable filters read (DuckDB evaluates them locally too)."""
    q = plan.query
    res = _Resolver(q, plan.columns)
    exprs = [e for preds in q.filters.values() for e in preds] + list(q.constants)
    return {res.col(n) for e in exprs for n in S.walk(e) if isinstance(n, S.Col)}


def run_over(duck: duckdb.DuckDBPyConnection, query: S.CerQuery, cer_settings: CerSettings, table: str, data,
             schema, columns: list[str]) -> cer.CerRun:
    """The local CER engine over ``data`` standing in for the node table ``table`` (a temporary
    table of that name, so the statement reads it as written; the placeholder comes back after).
    The nodes keep no order among rows of equal keys, and each strategy returns them in its own
    order: the rows are sorted by ``columns`` (partition, key, the rest), so every strategy and
    every run sees one order."""
    try:
        _swap_in(duck, table, data, columns)
        return cer.execute(duck, query, cer_settings)
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


# ---------------------------------------------------------------- run_many over storage nodes
@contextlib.contextmanager
def group_pull(session, statements: list[str], parse):
    """While the block runs, each storage-node table the CER ``statements`` of a ``run_many`` flush
    (parsed by ``parse``) read is a temporary table holding the rows all of them can use, pulled once: the union of
    their columns, the OR of their row filters, and the union of their time interval sets found
    by one set of candidate rounds for all of them (``shared_rounds``). The local multi-pattern evaluation then reads it as a
    local table. Yields the pulls' (table, statistics, notes)."""
    remote, duck = session.remote, session.duck
    if session.materialized:  # tables a plain statement pulled whole: placeholders again, as a statement does
        session._placeholders()
    by_table: dict[str, list] = {}
    for text in statements:
        try:
            q = parse(text)
            table = node_table(remote, q.source)
            if table is None:
                continue
            by_table.setdefault(table, []).append(resolve_query(duck, q, session.cer_settings, rowid=False))
        except Exception:  # noqa: BLE001 - the statement reports its error when it runs alone
            continue
    pulled: list = []
    done: list[str] = []
    session.cer_group_pulled = set()
    try:
        for table, plans in by_table.items():
            data, stats, notes, order = _pull_plans(remote, plans, session.settings.pull_strategy,
                                                    session.settings.round_trips, table)
            done.append(table)
            _swap_in(duck, table, data, order)
            session.cer_group_pulled.add(table)
            pulled.append((table, stats, notes))
        yield pulled
    finally:
        session.cer_group_pulled = set()
        for table in done:
            duck.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(table)}")
            duck.register(table, remote.schemas[table].empty_table())


def _pull_plans(remote, plans: list, strategy: str, round_trips: str, table: str, shared: bool = True):
    """One pull of ``table`` for several statements (``plans``): the union of their columns, the
    OR of their row filters and, for the dual-filtering strategies, the union of the statements'
    own time interval sets, sent once with the final pull. Each set holds every row its
    statement's matches look at (``planner.cer_intervals``), so the union holds every row any of
    them looks at. The sets come from one set of rounds for the whole group (``shared_rounds``);
    with ``shared`` False each statement makes its own rounds (what the group saves is measured
    against that)."""
    rows = [row_filter(p)[0] for p in plans]
    where = None if any(r is None for r in rows) else " OR ".join(f"({r})" for r in dict.fromkeys(rows))
    notes = [f"row filter: {where}" if where else "no row filter: some statement looks at every row"]
    needed: set[str] = set()
    order: list[str] = []
    for plan in plans:
        needed |= set(cer.needed_columns(plan)) | filter_columns(plan) | {plan.key_column}
        needed |= {c for c in (plan.type_column, plan.partition_column) if c}
        order += [c for c in (plan.partition_column, plan.key_column) if c and c not in order]
    columns = [f.name for f in remote.schemas[table] if f.name in needed]
    order += [c for c in columns if c not in order]
    ips, why = [], ""
    if strategy in ("auto",) + DFS_STRATEGIES:
        for plan in plans:
            ip, why = interval_plan(plan)
            if ip is None:
                ips = None
                break
            ips.append(ip)
        if ips and len({ip.key_sql for ip in ips}) != 1:
            ips, why = None, "the statements order the table by different keys"
    if strategy == "auto":
        strategy = "dfs" if ips else "push_down"
        notes.append(f"pull strategy auto -> {strategy}" + (f" ({why})" if not ips else ""))
    elif strategy in DFS_STRATEGIES and not ips:
        notes.append(f"pull strategy {strategy} cannot filter by time here ({why}): push_down used")
        strategy = "push_down"
    stats = PullStats(strategy=strategy)
    if strategy not in DFS_STRATEGIES:
        return remote.pull(table, strategy, columns, where, None, round_trips, stats), stats, notes, order
    if strategy in ("dfs_stateful", "push_pull"):
        notes.append(f"{strategy}: one pull for several statements is made by the rounds of dfs")
    for ip in ips:
        notes += ip.describe()
    started = time.perf_counter()
    filtering = remote.filtering()
    exact = strategy == "naive_dfs"
    # statements partitioned differently: their sets merged over all partitions (a superset of each)
    same = len({tuple(ip.partition_sql) for ip in ips}) == 1
    request = {"op": "pull", "table": table, "columns": columns, "where": where, "key_sql": ips[0].key_sql,
               "partition_sql": ips[0].partition_sql if same else []}
    if shared:
        sets, bits = shared_rounds(remote, table, columns, ips, where, exact, round_trips, stats, same)
        found = [_Found(t, bits) for t in sets]
    else:
        found = [filtering.rounds(table, columns, ip, exact, round_trips, stats) for ip in ips]
    blobs: list[bytes] = []
    if all(f.tis is not None for f in found):
        tis, bits = _union([f.tis for f in found], [f.pk_bits for f in found], same)
        if bits is not None:
            request["pk_bits"] = bits
        kind, blob = filtering.tis_payload(tis, max(ip.window for ip in ips), exact)
        request["filter"] = {"kind": kind, "blob": 0}
        blobs.append(blob)
        stats.filters["final pull"] = [f"time {kind} {len(blob)} B"]
        stats.notes.append(f"union of the {len(found)} statements' time interval sets: {len(tis)} intervals "
                           f"covering {tis.total_length()} key units")
    else:
        stats.notes.append("a statement's rounds were all skipped: the final pull has no time interval set")
    sent0, received0 = stats.bytes_sent, stats.bytes_received
    t0 = time.perf_counter()
    data = remote.concat(table, remote.call_all(request, blobs, stats), columns)
    stats.phases["final pull"] = time.perf_counter() - t0
    stats.phase_bytes["final pull"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
    stats.phases["all"] = time.perf_counter() - started
    stats.events_pulled = data.num_rows
    return data, stats, notes, order


@dataclass
class _Found:
    tis: IntervalSet | None
    pk_bits: int | None


@dataclass
class _User:
    """One element of one statement that a shared round serves."""
    statement: int
    variable: VariableIntervals


def shared_rounds(remote, table: str, columns: list[str], ips: list, where: str | None, exact: bool,
                  round_trips: str, stats: PullStats, same_partitions: bool) -> tuple[list, int | None]:
    """The time interval sets of several statements over one table (``ips``, one key), found by
    one set of candidate rounds: one round per distinct element condition, however many
    statements have it, rarest first. A round asks only for the candidates inside the union of
    the current sets of the statements it serves (each of those needs only its own), then each
    of them intersects its set with the intervals around the candidates its element admits
    (its own ``before``/``after``), as ``connectors.dual_filtering`` does for one statement, and
    drops intervals around candidates of its earlier rounds that left the set. A statement
    none of whose rounds ran has no set (None). Join filters are left out: a join source's values
    would be shipped for one statement's sake in a round several share (each statement still
    gets them when run alone). Returns the sets and the partition-hash bits they are keyed by
    (None: one line, no partitions)."""
    from matchrec.connectors.dual_filtering import skip_round, tis_payload
    from matchrec.connectors.shard import unpack_candidates

    partition_sql = ips[0].partition_sql if same_partitions else []
    key_sql = ips[0].key_sql
    window = max(ip.window for ip in ips)
    quantum = max(1, min(ip.window for ip in ips) // 20)
    users: dict[str, list[_User]] = {}
    for k, ip in enumerate(ips):
        for v in ip.variables:
            users.setdefault(v.condition, []).append(_User(k, v))
    if any(v.joins for ip in ips for v in ip.variables):
        stats.notes.append("shared rounds: join filters are left out (they serve one statement each)")
    conds = list(users)
    t0 = time.perf_counter()
    if round_trips == "auto":
        remote.probe()
    st = remote.stats(table, conds + [where or "TRUE"], key_sql, partition_sql, columns, stats=stats)
    stats.phases["statistics"] = time.perf_counter() - t0
    counts, final_rows = st.counts[:-1], st.counts[-1]
    bits = None
    base = {"table": table, "key_sql": key_sql, "partition_sql": partition_sql}
    if partition_sql:
        # enough bits to tell the partitions apart: a shared hash only merges intervals (never loses rows)
        bits = int(min(32, math.ceil(math.log2(st.partitions + 1)) + 1))
        base["pk_bits"] = bits
    sets: list[IntervalSet | None] = [None] * len(ips)
    points: list[dict] = [{} for _ in ips]
    per_candidate = 4.0
    one_by_one = 0  # the rounds' bytes paid again for every statement a round serves
    for c in sorted(range(len(conds)), key=lambda i: counts[i]):
        cond, served = conds[c], users[conds[c]]
        name = ", ".join(dict.fromkeys(u.variable.name for u in served))
        name = f"{name} ({len({u.statement for u in served})} statements)" if len(served) > 1 else name
        if round_trips == "never":
            stats.rounds_skipped.append(f"{name} (round trips off)")
            continue
        interest = None
        if all(sets[u.statement] is not None for u in served):
            interest = IntervalSet._merged(*(np.concatenate(x) for x in zip(
                *[(sets[k].pk, sets[k].lo, sets[k].hi) for k in {u.statement for u in served}])))
        if round_trips == "auto":
            span = max(st.extent, 1)
            coverage = 1.0 if interest is None else min(1.0, interest.total_length() / span)
            reach = max(u.variable.before + u.variable.after for u in served) + quantum
            own = 1 - math.exp(-counts[c] / span * reach)
            why = skip_round(remote, name, counts[c] * coverage * per_candidate, own,
                             final_rows * coverage, st.row_bytes)
            if why:
                stats.rounds_skipped.append(why)
                continue
        t1 = time.perf_counter()
        sent0, received0 = stats.bytes_sent, stats.bytes_received
        request = {"op": "candidates", "condition": cond, "packed": True, "quantum": quantum, "joins": [],
                   "values": [], **base}
        blobs: list[bytes] = []
        sent = stats.filters.setdefault(name, [])
        if interest is not None:
            kind, blob = tis_payload(interest, window, exact)
            request["filter"] = {"kind": kind, "blob": 0}
            blobs.append(blob)
            sent.append(f"time {kind} {len(blob)} B")
        parts = remote.call_all(request, blobs, stats)
        got = unpack_candidates(parts, (["pk"] if partition_sql else []) + ["s"], remote.max_reply)
        slots = got["s"]
        pk = got["pk"] if partition_sql else np.zeros(len(slots), np.int64)
        stats.candidates[name] = len(slots)
        if len(slots):
            per_candidate = max(0.5, sum(p.nbytes for p in parts) / len(slots))
        for u in served:
            v, k = u.variable, u.statement
            new = IntervalSet.around_slots(pk, slots, quantum, v.before, v.after)
            points[k][id(v)] = (pk, slots * quantum, slots * quantum + (quantum - 1), v)
            sets[k] = new if sets[k] is None else sets[k].intersect(new)
            sets[k] = _refine(sets[k], points[k])
        moved = (stats.bytes_sent - sent0, stats.bytes_received - received0)
        one_by_one += sum(moved) * len({u.statement for u in served})
        stats.phase_bytes[f"round {name}"] = moved
        stats.phases[f"round {name}"] = time.perf_counter() - t1
    rounds_bytes = sum(s + r for k, (s, r) in stats.phase_bytes.items() if k.startswith("round "))
    ran = sum(1 for k in stats.phase_bytes if k.startswith("round "))
    stats.notes.append(f"shared rounds: {ran} round(s) for {len(ips)} statements and {sum(map(len, users.values()))} "
                       f"element rounds, {rounds_bytes} bytes; one statement at a time the same rounds would move "
                       f"about {one_by_one} bytes")
    return sets, bits


def _refine(tis: IntervalSet, points: dict, rounds: int = 3) -> IntervalSet:
    """Drop the intervals around a statement's earlier candidates that no longer lie in its set
    (they can be part of no match), until nothing changes."""
    for _ in range(rounds):
        before = (len(tis), tis.total_length())
        for pk, lo, hi, v in points.values():
            keep = tis.overlaps(pk, lo, hi)
            tis = tis.intersect(IntervalSet._merged(pk[keep], lo[keep] - v.before, hi[keep] + v.after))
        if (len(tis), tis.total_length()) == before:
            break
    return tis


def _union(sets: list, bits: list, same_partitions: bool) -> tuple:
    """The union of interval sets whose partitions are known by the top ``bits`` bits of their
    hash (None: no partitions): at the fewest bits of any, so that one partition key names the
    same partitions in all (a shorter prefix of the same hash); over all partitions at once
    (key 0) when the sets partition by different columns."""
    least = None if not same_partitions or any(b is None for b in bits) else min(bits)
    pk, lo, hi = [], [], []
    for s, b in zip(sets, bits):
        pk.append(s.pk >> (b - least) if least is not None else np.zeros(len(s.pk), np.int64))
        lo.append(s.lo)
        hi.append(s.hi)
    return IntervalSet._merged(np.concatenate(pk), np.concatenate(lo), np.concatenate(hi)), least


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


def pull_report(pulls) -> list[str]:
    """``run_many``'s report lines of the tables a group pulled."""
    out = []
    for table, stats, notes in pulls:
        out.append(f"storage nodes: table {table} pulled once for the CER statements reading it")
        out += ["  " + n for n in notes] + ["  " + x for x in stats.lines()]
    return out
