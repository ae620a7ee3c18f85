"""run_many over storage nodes: the CER statements of one group that read the same node table share
one pull (one set of candidate rounds, then the final pulls the cost model finds cheapest).

It owns the group's side of ``engine.cer_remote``: ``group_pull`` (the context in which the group's
statements read the pulled rows as a local table), ``_pull_plans`` (the rows, columns and row
filters of several statements pulled together), ``shared_rounds`` (one round per distinct element
condition for all statements), the final-pull cost model (``_choose_final``: one shared pull, one
per statement, or a split) and the final pulls themselves (``_final_pull``), and ``pull_report``
(``run_many``'s report lines). One statement alone is pulled by ``engine.cer_remote.pull``.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import numpy as np

from matchrec.connectors.source import PullStats
from matchrec.engine import cer
from matchrec.engine.cer_remote import DFS_STRATEGIES, _swap_in, filter_columns, node_table
from matchrec.operators.intervals import IntervalSet
from matchrec.parser.names import quote_ident
from matchrec.planner.cer.resolve import resolve_query
from matchrec.planner.cer_intervals import interval_plan, row_filter
from matchrec.planner.intervals import VariableIntervals

# A run_many group's final pulls may move at most this many times the bytes of one pull per statement.
BYTES_BOUND = 1.05


class GroupPulls(list):
    """What ``group_pull`` yields: (table, statistics, notes) per table pulled, and ``alone``,
    the results of the statements the final-pull cost model gave a pull of their own (statement
    text -> result table): they ran over their own rows, as a statement alone does, and the
    group's local evaluation leaves them out."""

    def __init__(self):
        super().__init__()
        self.alone: dict[str, object] = {}


@contextlib.contextmanager
def group_pull(session, statements: list[str], parse):
    """While the block runs, each storage-node table the CER ``statements`` of a ``run_many`` flush
    (parsed by ``parse``) read is a temporary table holding the rows the statements sharing its
    final pull can use: one set of candidate rounds for all of them (``shared_rounds``), then the
    final pull the cost model finds cheapest (``_choose_final``): one pull for all (the union of
    their columns, the OR of their row filters, the union of their time interval sets), one per
    statement, or one for the statements that gain by sharing it and one for each other. A
    statement with a pull of its own runs over its own rows here (``GroupPulls.alone``); the local
    multi-pattern evaluation reads the shared pull as a local table. Yields a ``GroupPulls``."""
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
            by_table.setdefault(table, []).append((text, resolve_query(duck, q, session.cer_settings, rowid=False)))
        except Exception:  # noqa: BLE001 - the statement reports its error when it runs alone
            continue
    pulled = GroupPulls()
    done: list[str] = []
    session.cer_group_pulled = set()
    try:
        for table, items in by_table.items():
            got = _pull_plans(remote, [p for _, p in items], session.settings.pull_strategy,
                              session.settings.round_trips, table)
            for k, (data, order) in got.alone.items():
                pulled.alone[items[k][0]] = _run_alone(session, table, items[k][0], data, got.stats, order)
            if got.data is not None:
                done.append(table)
                _swap_in(duck, table, got.data, got.order)
                session.cer_group_pulled.add(table)
            pulled.append((table, got.stats, got.notes))
        yield pulled
    finally:
        session.cer_group_pulled = set()
        session.cer_group_prepared = None
        for table in done:
            duck.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(table)}")
            duck.register(table, remote.schemas[table].empty_table())


def _run_alone(session, table: str, text: str, data, stats: PullStats, order: list[str]):
    """The result of ``text`` run by the session over ``data``, the rows its own final pull got
    (``execute`` takes them instead of pulling)."""
    session.cer_group_prepared = (table, data, stats, order)
    try:
        return session.table(text)
    finally:
        session.cer_group_prepared = None


@dataclass
class _GroupPlan:
    """What ``_pull_plans`` pulled: the shared pull (None when no statement reads it) with the
    columns that order it, and the pulls of the statements that got their own (index -> rows, order)."""
    data: object
    stats: PullStats
    notes: list[str]
    order: list[str]
    alone: dict


def _pull_plans(remote, plans: list, strategy: str, round_trips: str, table: str, shared: bool = True,
                final="auto") -> _GroupPlan:
    """The pulls of ``table`` for several statements (``plans``). Without a time interval plan:
    one pull of the union of their columns and the OR of their row filters. With the dual-filtering
    strategies, the statements' time interval sets come from one set of rounds for the whole group
    (``shared_rounds``; with ``shared`` False each statement makes its own rounds, what the group
    saves is measured against that); each set holds every row its statement's matches look at
    (``planner.cer_intervals``). Then the final pull: ``final`` "shared" sends the union of the
    sets once, with the union of the columns and the OR of the row filters; "each" gives every
    statement its own pull (its set, columns and row filter); "auto" lets ``_choose_final`` pick
    the cheapest split from the estimated bytes and round trips; a set of statement indices gives
    those their own pulls."""
    rows = [row_filter(p)[0] for p in plans]
    where = None if any(r is None for r in rows) else " OR ".join(f"({r})" for r in dict.fromkeys(rows))
    notes = [f"row filter: {where}" if where else "no row filter: some statement looks at every row"]
    schema = remote.schemas[table]
    needed: set[str] = set()
    order: list[str] = []
    own_columns: list[list[str]] = []
    own_order: list[list[str]] = []
    for plan in plans:
        mine = set(cer.needed_columns(plan)) | filter_columns(plan) | {plan.key_column}
        mine |= {c for c in (plan.type_column, plan.partition_column) if c}
        needed |= mine
        own_columns.append([f.name for f in schema if f.name in mine])
        head = [c for c in (plan.partition_column, plan.key_column) if c]
        own_order.append(head + [c for c in own_columns[-1] if c not in head])
        order += [c for c in head if c not in order]
    columns = [f.name for f in schema if f.name in needed]
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
        return _GroupPlan(remote.pull(table, strategy, columns, where, None, round_trips, stats), stats, notes,
                          order, {})
    if strategy in ("dfs_stateful", "push_pull"):
        notes.append(f"{strategy}: one pull for several statements is made by the rounds of dfs")
    for ip in ips:
        notes += ip.describe()
    started = time.perf_counter()
    filtering = remote.filtering()
    exact = strategy == "naive_dfs"
    # statements partitioned differently: their sets merged over all partitions (a superset of each)
    same = len({tuple(ip.partition_sql) for ip in ips}) == 1
    partition_sql = ips[0].partition_sql if same else []
    estimate = None
    if shared:
        sets, bits, estimate = shared_rounds(remote, table, columns, ips, where, exact, round_trips, stats, same,
                                             rows if final == "auto" and len(plans) > 1 else None)
        found = [_Found(t, bits) for t in sets]
    else:
        found = [filtering.rounds(table, columns, ip, exact, round_trips, stats) for ip in ips]
    mine: list[int] = []  # statements with a final pull of their own
    if final == "each" and shared:
        mine = list(range(len(plans)))
    elif not isinstance(final, str) and shared:  # the statements named get their own (tests, benchmarks)
        mine = sorted(k for k in final if 0 <= k < len(plans))
    elif estimate is not None:
        full = max(_width(schema, columns), 1.0)

        def width_of(members):  # the share of the group's row bytes the members' columns take
            return _width(schema, [c for c in columns if any(c in own_columns[k] for k in members)]) / full

        mine, lines = _choose_final(remote, estimate, sets, bits, ips, exact, rows, width_of,
                                    [p.query.text for p in plans])
        notes += lines
    alone: dict = {}
    for k in mine:
        alone[k] = (_final_pull(remote, table, own_columns[k], rows[k], ips[k].key_sql, ips[k].window, partition_sql,
                                sets[k], bits, exact, stats, f"final pull {k + 1}"), own_order[k])
    rest = [k for k in range(len(plans)) if k not in mine]
    data = None
    if rest:
        if mine:  # the shared pull serves the other statements only
            columns = [f.name for f in schema if any(f.name in own_columns[k] for k in rest)]
            where = None if any(rows[k] is None for k in rest) else \
                " OR ".join(f"({r})" for r in dict.fromkeys(rows[k] for k in rest))
            order = [c for c in order if c in columns]
        tis = least = None
        if all(found[k].tis is not None for k in rest):
            tis, least = _union([found[k].tis for k in rest], [found[k].pk_bits for k in rest], same)
            stats.notes.append(f"union of the {len(rest)} statements' time interval sets: {len(tis)} intervals "
                               f"covering {tis.total_length()} key units")
        else:
            stats.notes.append("a statement's rounds were all skipped: the final pull has no time interval set")
        data = _final_pull(remote, table, columns, where, ips[0].key_sql, max(ips[k].window for k in rest),
                           partition_sql, tis, least, exact, stats, "final pull")
    stats.phases["all"] = time.perf_counter() - started
    stats.events_pulled = (data.num_rows if data is not None else 0) + sum(d.num_rows for d, _ in alone.values())
    return _GroupPlan(data, stats, notes, order, alone)


def _final_pull(remote, table: str, columns: list[str], where: str | None, key_sql: str, window: int,
                partition_sql: list[str], tis: IntervalSet | None, bits: int | None, exact: bool, stats: PullStats,
                phase: str):
    """One final pull of a group: ``columns`` of the rows meeting ``where`` inside ``tis`` (every
    row the matches of the statements it serves look at; None: no time filter), the set's
    partitions known by the top ``bits`` bits of their hash. A statement's own pull is what it
    would pull alone after its rounds; the shared pull sends the union of the statements' sets."""
    request = {"op": "pull", "table": table, "columns": columns, "where": where, "key_sql": key_sql,
               "partition_sql": partition_sql}
    blobs: list[bytes] = []
    if tis is not None:
        if bits is not None:
            request["pk_bits"] = bits
        kind, blob = remote.filtering().tis_payload(tis, window, exact)
        request["filter"] = {"kind": kind, "blob": 0}
        blobs.append(blob)
        request["range"] = [int(tis.lo.min()), int(tis.hi.max())] if len(tis) else [1, 0]
        stats.filters[phase] = [f"time {kind} {len(blob)} B"]
    sent0, received0 = stats.bytes_sent, stats.bytes_received
    t0 = time.perf_counter()
    data = remote.concat(table, remote.call_all(request, blobs, stats), columns)
    stats.phases[phase] = time.perf_counter() - t0
    stats.phase_bytes[phase] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
    return data


def _width(schema, columns: list[str]) -> float:
    """Bytes a row of ``columns`` takes on the wire, roughly (fixed widths; 16 for the others)."""
    out = 0.0
    for name in columns:
        t = schema.field(name).type
        try:
            out += max(1, t.bit_width // 8)
        except ValueError:
            out += 16
    return out


@dataclass
class _Estimate:
    """What the final-pull cost model reads: the sample of the rows the shared pull would read
    (partition hash at 32 bits, key, which conditions hold), the condition index of each
    statement's row filter in the marks, and the statistics."""
    stats: object  # SourceStats
    filter_bit: list[int]
    counts: list[int]  # rows meeting each statement's row filter


def _choose_final(remote, est: _Estimate, sets: list, bits: int | None, ips: list, exact: bool,
                  rows: list, width_of, texts: list[str]) -> tuple[list[int], list[str]]:
    """Which statements get a final pull of their own; the others share one. Each candidate pull
    is costed as the per-statement cost model costs a round: a round trip plus its bytes at the
    link's rate. Its bytes: the rows it would read (the sampled rows that meet one of its
    statements' row filters and lie in the union of their time interval sets, scaled to the rows
    of the table meeting any row filter) times the bytes per row of its columns, plus its time
    interval payload sent to every node. A shared pull reads every row any of its statements
    needs once, but also each statement's rows inside the other statements' sets, and the union
    of the columns for all of them. The split searched: all shared, each alone, and greedy moves
    of one statement from there. A split whose bytes exceed ``BYTES_BOUND`` times those of the
    pulls per statement (about what the statements move one by one) is taken only when no split
    stays under it: on a fast link the round trips would otherwise always win, and the group must
    not move materially more than its statements alone. Ties go to fewer pulls (the group
    evaluates the statements sharing a pull together). Returns the statements pulled alone and
    the report's lines about the choice."""
    st = est.stats
    n = len(sets)
    sample = st.sample
    shards = max(1, remote.shard_count)
    bw = remote.bandwidth or 1e9
    pk = (sample.pk >> (32 - bits)) if bits is not None else np.zeros(len(sample.t), np.int64)
    t = sample.t
    final_rows = st.counts[-1]
    use_sample = len(t) >= 30
    passes = [((sample.m >> b) & 1 == 1) if rows[k] is not None else np.ones(len(t), bool)
              for k, b in enumerate(est.filter_bit)]
    inside = [s.contains(pk, t) if s is not None else np.ones(len(t), bool) for s in sets]
    payload = []
    for k, s in enumerate(sets):
        payload.append(len(remote.filtering().tis_payload(s, ips[k].window, exact)[1]) if s is not None else 0)
    cache: dict[frozenset, float] = {}

    def pull_bytes(group: frozenset) -> float:
        if group not in cache:
            members = sorted(group)
            if use_sample:
                union = [s for s in (sets[k] for k in members)]
                within = np.ones(len(t), bool) if any(s is None for s in union) else np.logical_or.reduce(
                    [inside[k] for k in members])
                hit = np.logical_or.reduce([passes[k] for k in members]) & within
                read = final_rows * float(hit.mean())
            else:  # too few sampled rows: the rows spread evenly over time, each statement's counted apart
                read = min(final_rows, sum(est.counts[k] * (1.0 if sets[k] is None else
                                                           min(1.0, sets[k].total_length() / max(st.extent, 1)))
                                           for k in members))
            cache[group] = read * st.row_bytes * width_of(members) + shards * (sum(payload[k] for k in members) + 256)
        return cache[group]

    def split(together: frozenset) -> list[frozenset]:
        pulls = [together] if len(together) > 1 else []
        return pulls + [frozenset({k}) for k in range(n) if len(together) <= 1 or k not in together]

    each = sum(pull_bytes(frozenset({k})) for k in range(n))

    def total(together: frozenset) -> tuple[float, float, int]:
        pulls = split(together)
        moved = sum(pull_bytes(g) for g in pulls)
        # bytes over BYTES_BOUND x the pulls per statement first, then the time at the link's rate
        return (max(0.0, moved / max(each, 1.0) - BYTES_BOUND), sum(remote.rtt + pull_bytes(g) / bw for g in pulls),
                -len(together))

    everyone = frozenset(range(n))
    best = everyone
    for start in (everyone, frozenset()):
        current = start
        while True:
            move = min((current - {k} if k in current else current | {k} for k in range(n)), key=total)
            if total(move) >= total(current):
                break
            current = move
        if total(current) < total(best):
            best = current
    together = best if len(best) > 1 else frozenset()
    alone = [k for k in range(n) if k not in together]
    name = lambda k: f"{k + 1} ({texts[k][:40].strip()}{'...' if len(texts[k]) > 40 else ''})"  # noqa: E731
    lines = [f"final pull cost model ({'sampled rows' if use_sample else 'rows spread evenly'}, "
             f"{bw / 1e6:.1f} MB/s, round trip {remote.rtt * 1000:.1f} ms, at most {BYTES_BOUND}x the bytes of "
             f"pulls per statement): one shared pull ~{pull_bytes(everyone):,.0f} B, one per statement ~{each:,.0f} B"]
    if not alone:
        lines.append("final pull: one for all statements (the cheapest within the bytes bound)")
    elif not together:
        lines.append("final pull: one per statement (each reads only its own rows and columns; the rows and "
                     "columns other statements add to a shared pull cost more than it saves)")
    else:
        lines.append(f"final pull: one for statements {', '.join(str(k + 1) for k in sorted(together))} "
                     f"~{pull_bytes(together):,.0f} B, and one each for the others")
    lines += [f"  statement {name(k)}: {'own pull' if k in alone else 'shared pull'}" for k in range(n)]
    return alone, lines


@dataclass
class _Found:
    tis: IntervalSet | None
    pk_bits: int | None


@dataclass
class _User:
    """One element of one statement that a shared round serves."""
    statement: int
    variable: VariableIntervals


def _join_key(j) -> tuple:
    return (j.current_sql, j.other_sql, j.common_type, j.source_condition)


def shared_rounds(remote, table: str, columns: list[str], ips: list, where: str | None, exact: bool,
                  round_trips: str, stats: PullStats, same_partitions: bool,
                  row_filters: list | None = None) -> tuple[list, int | None, _Estimate | None]:
    """The time interval sets of several statements over one table (``ips``, one key), found by
    one set of candidate rounds: one round per distinct element condition, however many
    statements have it, rarest first. A round asks only for the candidates inside the union of
    the current sets of the statements it serves (each of those needs only its own), then each
    of them intersects its set with the intervals around the candidates its element admits
    (its own ``before``/``after``), as ``connectors.dual_filtering`` does for one statement, and
    drops intervals around candidates of its earlier rounds that left the set. A statement
    none of whose rounds ran has no set (None).

    Join filters (``planner.cer_intervals``): a round applies the window-wise join filter of an
    equality ``x.k = y.k`` when every element it serves has that join (same columns, type and
    source condition) and the source's round ran before it and returned the source's values. The
    filter then drops only candidates that bind in no match of any statement served (each admits
    it; the window is the largest of theirs, a weaker filter for the others). Joins that some
    element of the round lacks are left out: the filter would drop that statement's candidates.
    The other way: a round whose elements each take one row and are each the source of a join on
    one column is made again, after the first pass, with a "precede" filter holding the values of
    every served statement's consumers (an equal value within the window after the row), as a
    statement alone repeats its source's round.

    With ``row_filters`` (each statement's, None: every row) the statistics also sample where the
    rows of each lie, for the final pull's cost model (``_choose_final``). Returns the sets, the
    partition-hash bits they are keyed by (None: one line, no partitions) and that estimate."""
    from matchrec.connectors.dual_filtering import join_payload, refine, skip_join_round, skip_round, tis_payload
    from matchrec.connectors.shard import unpack_candidates

    partition_sql = ips[0].partition_sql if same_partitions else []
    key_sql = ips[0].key_sql
    window = max(ip.window for ip in ips)
    quantum = max(1, min(ip.window for ip in ips) // 20)
    users: dict[str, list[_User]] = {}
    for k, ip in enumerate(ips):
        for v in ip.variables:
            users.setdefault(v.condition, []).append(_User(k, v))
    conds = list(users)
    asked = conds
    filter_bit: list[int] = []
    if row_filters is not None:
        distinct = list(dict.fromkeys(r or "TRUE" for r in row_filters))
        if len(conds) + len(distinct) < 62:  # the sample marks at most 62 conditions
            asked = conds + distinct
            filter_bit = [len(conds) + distinct.index(r or "TRUE") for r in row_filters]
    t0 = time.perf_counter()
    if round_trips == "auto":
        remote.probe()
    st = remote.stats(table, asked + [where or "TRUE"], key_sql, partition_sql, columns, sample=bool(filter_bit),
                      stats=stats)
    stats.phases["statistics"] = time.perf_counter() - t0
    counts, final_rows = st.counts[:len(conds)], st.counts[-1]
    estimate = _Estimate(st, filter_bit, [st.counts[b] for b in filter_bit]) if filter_bit else None
    rarest = sorted(range(len(conds)), key=lambda i: counts[i])
    position = {conds[c]: p for p, c in enumerate(rarest)}
    # the join filters each round may apply: those every element it serves has, whose source's
    # round comes earlier; and the values each source round returns for them
    joins_of: dict[str, list[tuple]] = {}
    values_of: dict[str, list[tuple[str, str]]] = {}
    left_out = 0
    for cond, served in users.items():
        keys = [{_join_key(j) for j in u.variable.joins if len(j.sources) == 1} for u in served]
        common = set.intersection(*keys) if keys else set()
        left_out += len(set.union(*keys) - common) if keys else 0
        usable = sorted(key for key in common if key[3] in position and position[key[3]] < position[cond])
        joins_of[cond] = usable
        for key in usable:
            wanted = values_of.setdefault(key[3], [])
            if (key[1], key[2]) not in wanted:
                wanted.append((key[1], key[2]))
    if left_out:
        stats.notes.append(f"shared rounds: {left_out} join filter(s) left out (not every statement a round "
                           "serves has them)")
    # the other way ("precede"): a round whose elements each take one row and are the source of a
    # join is made again once the consumers' values arrived, probing the source's own column for an
    # equal consumer value after it. Every element served must have such a join on that column; the
    # filter holds the consumers' values of all of them (a weaker filter for each, still true of
    # every match it binds in)
    precede_of: dict[str, list[tuple]] = {}
    for cond, served in users.items():
        by_column: dict[tuple, list[set]] = {}
        for u in served:
            if not u.variable.at_most_once:
                by_column = {}
                break
            mine: dict[tuple, set] = {}
            for cv in ips[u.statement].variables:
                for j in cv.joins:
                    if j.sources == frozenset({u.variable.label}) and cv.condition in position:
                        mine.setdefault((j.other_sql, j.common_type), set()).add((cv.condition, j.current_sql))
            for column, keys in mine.items():
                by_column.setdefault(column, []).append(keys)
        for column, per_user in by_column.items():
            if len(per_user) == len(served):
                precede_of.setdefault(cond, []).append((column, per_user))
                for consumer, current_sql in set.union(*per_user):
                    wanted = values_of.setdefault(consumer, [])
                    if (current_sql, column[1]) not in wanted:
                        wanted.append((current_sql, column[1]))
    # the elements that take part in a join filter of their statement (as consumer or source)
    joined = [{v.label for v in ip.variables if v.joins} | {s for v in ip.variables for j in v.joins
                                                              for s in j.sources} for ip in ips]
    bits = None
    base = {"table": table, "key_sql": key_sql, "partition_sql": partition_sql}
    if partition_sql:
        # enough bits to tell the partitions apart: a shared hash only merges intervals (never loses rows)
        bits = int(min(32, math.ceil(math.log2(st.partitions + 1)) + 1))
        base["pk_bits"] = bits
    sets: list[IntervalSet | None] = [None] * len(ips)
    points: list[dict] = [{} for _ in ips]
    sources: dict[tuple, tuple] = {}  # (source condition, value SQL, type) -> pk, value hash, slot
    per_candidate = 4.0
    one_by_one = 0  # the rounds' bytes paid again for every statement a round serves
    made: set[str] = set()
    for c, again in [(c, False) for c in rarest] + [(c, True) for c in rarest if conds[c] in precede_of]:
        cond, served = conds[c], users[conds[c]]
        name = ", ".join(dict.fromkeys(u.variable.name for u in served))
        name = f"{name} ({len({u.statement for u in served})} statements)" if len(served) > 1 else name
        precede = []
        if again:  # the columns whose consumers' values arrived for every element served
            if cond not in made:
                continue
            for (value_sql, common), per_user in precede_of[cond]:
                arrived = [[(consumer, current) for consumer, current in keys if (consumer, current, common) in sources]
                           for keys in per_user]
                if all(arrived):
                    precede.append((value_sql, common, sorted(set().union(*arrived))))
            if not precede:
                continue
            name += " (joins)"
        if round_trips == "never":
            stats.rounds_skipped.append(f"{name} (round trips off)")
            continue
        mine_stmts = {u.statement for u in served}
        interest = None
        if all(sets[k] is not None for k in mine_stmts):
            interest = IntervalSet._merged(*(np.concatenate(x) for x in zip(
                *[(sets[k].pk, sets[k].lo, sets[k].hi) for k in mine_stmts])))
        usable = [key for key in joins_of[cond] if (key[3], key[1], key[2]) in sources] if not again else []
        values = values_of.get(cond, []) if not again else []
        if round_trips == "auto":
            span = max(st.extent, 1)
            coverage = 1.0 if interest is None else min(1.0, interest.total_length() / span)
            if usable or values or precede or any(u.variable.label in joined[u.statement] for u in served):
                # judged as a statement alone judges its join rounds (by their bytes against the
                # final pull): a shared round must not be skipped where the statement alone makes it
                join_bytes = sum(2.5 * len(sources[(k[3], k[1], k[2])][0]) for k in usable)
                why = skip_join_round(name, counts[c] * coverage * per_candidate + join_bytes * remote.shard_count,
                                      final_rows * coverage * st.row_bytes)
            else:
                reach = max(u.variable.before + u.variable.after for u in served) + quantum
                own = 1 - math.exp(-counts[c] / span * reach)
                tried = None  # in partitions, rows do not lie at random: try the round on the sample
                if estimate is not None and st.sample is not None:
                    tried = st.sample.removed_by(c, interest, quantum, max(u.variable.before for u in served),
                                                 max(u.variable.after for u in served), 32 - (bits or 32))
                why = skip_round(remote, name, counts[c] * coverage * per_candidate, own,
                                 final_rows * coverage, st.row_bytes, removed=tried)
            if why:
                stats.rounds_skipped.append(why)
                continue
        t1 = time.perf_counter()
        sent0, received0 = stats.bytes_sent, stats.bytes_received
        request = {"op": "candidates", "condition": cond, "packed": True, "quantum": quantum, "joins": [],
                   "values": [list(v) for v in values], **base}
        blobs: list[bytes] = []
        sent = stats.filters.setdefault(name, [])
        if interest is not None:
            kind, blob = tis_payload(interest, window, exact)
            request["filter"] = {"kind": kind, "blob": 0}
            blobs.append(blob)
            sent.append(f"time {kind} {len(blob)} B")
        reach = max(ips[k].window for k in mine_stmts)

        def add_join(value_sql, common, pk, val, slot, direction):
            if interest is not None:  # a source outside every served set binds in no match of theirs
                inside = interest.overlaps(pk, slot * quantum, slot * quantum + (quantum - 1))
                pk, val, slot = pk[inside], val[inside], slot[inside]
            kind, blob = join_payload(pk, val, slot, quantum, reach, exact)
            request["joins"].append({"value_sql": value_sql, "type": common, "blob": len(blobs), "kind": kind,
                                     "direction": direction, "window": reach})
            sent.append(f"join {kind} {len(blob)} B ({direction})")
            blobs.append(blob)

        for current_sql, other_sql, common, source in usable:
            add_join(current_sql, common, *sources[(source, other_sql, common)], "follow")
        for value_sql, common, keys in precede:
            add_join(value_sql, common, *(np.concatenate(x) for x in zip(*[sources[(consumer, current, common)]
                                                                           for consumer, current in keys])),
                     "precede")
        parts = remote.call_all(request, blobs, stats)
        got = unpack_candidates(parts, (["pk"] if partition_sql else []) + [f"v{i}" for i in range(len(values))]
                                + ["s"], remote.max_reply)
        slots = got["s"]
        pk = got["pk"] if partition_sql else np.zeros(len(slots), np.int64)
        stats.candidates[name] = len(slots)
        if len(slots):
            per_candidate = max(0.5, sum(p.nbytes for p in parts) / len(slots))
        made.add(cond)
        for i, (value_sql, common) in enumerate(values):
            sources[(cond, value_sql, common)] = (pk, got[f"v{i}"], slots)
        for u in served:
            v, k = u.variable, u.statement
            new = IntervalSet.around_slots(pk, slots, quantum, v.before, v.after)
            points[k][id(v)] = (pk, slots * quantum, slots * quantum + (quantum - 1), v)
            sets[k] = new if sets[k] is None else sets[k].intersect(new)
            sets[k] = refine(sets[k], points[k])
        moved = (stats.bytes_sent - sent0, stats.bytes_received - received0)
        one_by_one += sum(moved) * len(mine_stmts)
        stats.phase_bytes[f"round {name}"] = moved
        stats.phases[f"round {name}"] = time.perf_counter() - t1
    rounds_bytes = sum(s + r for k, (s, r) in stats.phase_bytes.items() if k.startswith("round "))
    ran = sum(1 for k in stats.phase_bytes if k.startswith("round "))
    stats.notes.append(f"shared rounds: {ran} round(s) for {len(ips)} statements and {sum(map(len, users.values()))} "
                       f"element rounds, {rounds_bytes} bytes; one statement at a time the same rounds would move "
                       f"about {one_by_one} bytes")
    return sets, bits, estimate


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


def pull_report(pulls) -> list[str]:
    """``run_many``'s report lines of the tables a group pulled."""
    out = []
    for table, stats, notes in pulls:
        finals = sum(1 for k in stats.phase_bytes if k.startswith("final pull"))
        out.append(f"storage nodes: table {table} pulled once for the CER statements reading it" if finals <= 1 else
                   f"storage nodes: table {table} pulled for the CER statements reading it: one set of rounds, "
                   f"{finals} final pulls")
        out += ["  " + n for n in notes] + ["  " + x for x in stats.lines()]
    return out
