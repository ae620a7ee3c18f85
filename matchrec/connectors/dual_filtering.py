"""Dual filtering over any ``Source``: the pull strategies, the candidate rounds and their cost model.

A strategy reads the input of a MATCH_RECOGNIZE from a source (``connectors.source``):

* ``pull_all``: every row and column of the table;
* ``push_down``: the needed columns, and only rows some non-gap variable can take when that is
  proven safe (planner.prefilter);
* ``dfs``: dual filtering. Variables are taken in order of their candidate counts; each round
  sends the current time interval set (and join filters for equality conditions, probed both
  ways when the source takes one row of a match) and gets back the candidates that pass both
  phases, whose intervals shrink the set. Each payload goes as the paper's filter (shrinking
  window filter, window-wise Bloom filter) or packed exactly (``operators.packing``), whichever
  is smaller; candidates come back packed. A cost model skips rounds whose expected saving is
  below their cost, and keeps the set here when sending it costs more than it filters. The
  final pull reads only rows inside the set, with the push-down filter;
* ``naive_dfs``: the same rounds with exact structures (interval arrays, value sets) instead of
  the filters - larger payloads, no false positives;
* ``dfs_stateful``: the rounds of ``dfs`` in a query session the shards keep state for
  (``connectors.session``): each shard keeps the row ids of every variable's surviving
  candidates and shrinks them with each new set, so a later round touches only those rows and
  never evaluates a condition again. When the push-down filter names only variables that had a
  round, the final pull returns the kept rows inside the final set (a row that failed its
  variable's join filter can only be taken by a gap variable, which the push-down filter
  already proves droppable); otherwise it reads as ``dfs`` does. A source without sessions
  (a local query) runs it as ``dfs``;
* ``push_pull``: the push-pull baseline of CEP over disaggregated storage (Purtzel, Ziehn,
  Weidlich et al.; ``connectors.partial_matches``): each shard evaluates the anchor's predicate
  (the variable that starts every match, else the first with a row-level condition) and the
  push-down filter on its own rows and pushes its partial matches - the anchors and its rows in
  their windows; then the rows the other shards' partial matches still need are pulled. Two
  round trips, exact windows, no statistics and no cost model.

Every request goes to every shard of the source through ``Source.call_all``; the rounds use the
source's ``stats`` for counts and samples, its ``shard_count`` (a payload is paid once per
shard) and its link (``rtt``, ``bandwidth``: none for a local source).
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from matchrec.connectors.shard import unpack_candidates
from matchrec.connectors.source import PullStats, Sample, Source
from matchrec.operators.intervals import IntervalSet, ShrinkingWindowFilter, WindowJoinFilter
from matchrec.operators.packing import SlotJoinSet, pack_intervals, unpack
from matchrec.planner.intervals import IntervalPlan

STRATEGIES = ("auto", "pull_all", "push_down", "naive_dfs", "dfs", "dfs_stateful", "push_pull")
ROUND_TRIPS = ("auto", "always", "never")
_FINGERPRINT_BYTES = 1.5  # the 12-bit fingerprint each window of a shrinking window filter stores


def tis_payload(tis: IntervalSet, window: int, exact: bool) -> tuple[str, bytes]:
    """The TIS as the smaller of a shrinking window filter and its packed exact intervals
    (``naive_dfs``: the plain interval arrays)."""
    if exact:
        return "exact", np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes()
    packed = pack_intervals(tis)
    # every window the set touches holds a hashed fingerprint in the filter, which zstd cannot
    # shrink: when the packed intervals are no larger than those alone, the filter (whose cuckoo
    # table costs far more time to build than the packing) cannot be the smaller
    if len(packed) <= _windows(tis, window) * _FINGERPRINT_BYTES:
        return "intervals", packed
    swf = ShrinkingWindowFilter.build(tis, window).to_bytes()
    return ("swf", swf) if len(swf) < len(packed) else ("intervals", packed)


def _windows(tis: IntervalSet, window: int) -> int:
    """How many (partition, window) entries a window filter of ``tis`` holds: the windows each
    interval spans, less those an interval shares with the one before it (sorted and disjoint
    within a partition, two intervals can share only the window where one ends and the next starts)."""
    first, last = np.floor_divide(tis.lo, window), np.floor_divide(tis.hi, window)
    shared = (tis.pk[1:] == tis.pk[:-1]) & (first[1:] == last[:-1])
    return int((last - first + 1).sum() - shared.sum())


def join_payload(pk, val, slot, quantum: int, window: int, exact: bool) -> tuple[str, bytes]:
    """One variable's candidates as a join filter: the smaller of the window-wise Bloom filter
    and the packed exact set of (partition, value, slot) (``naive_dfs``: plain arrays). A
    candidate is known to a slot: the Bloom filter stores it under the windows of both ends."""
    lo, hi = slot * quantum, slot * quantum + (quantum - 1)
    if exact:
        return "exact", np.concatenate([np.r_[pk, pk], np.r_[val, val], np.r_[lo, hi]]).astype(np.int64).tobytes()
    wjf = WindowJoinFilter.build(np.r_[pk, pk], np.r_[val, val], np.r_[lo, hi], window).to_bytes()
    slots = SlotJoinSet.of_points(pk, val, slot, quantum, window).to_bytes()
    return ("wjf", wjf) if len(wjf) < len(slots) else ("slots", slots)


def join_filters(ip: IntervalPlan, i: int, sources: dict | None) -> list[tuple]:
    """The join filters variable ``i``'s round can apply: (join, direction, source key) for its
    own joins whose source's values arrived ("follow": a source row in ``[t - w, t]``), and
    for the joins that read it, when it takes at most one row of a match, whose consumer's
    values arrived ("precede": a consumer row in ``[t, t + w]``). With ``sources`` None: every
    join filter the round could ever apply."""
    v = ip.variables[i]
    out = []
    for j in v.joins:
        if len(j.sources) == 1:
            key = (next(iter(j.sources)), j.other_sql, j.common_type)
            if sources is None or key in sources:
                out.append((j, "follow", key))
    if v.at_most_once:
        for c in ip.variables:
            for j in c.joins:
                if j.sources == frozenset({v.label}):
                    key = (c.label, j.current_sql, j.common_type)
                    if sources is None or key in sources:
                        out.append((j, "precede", key))
    return out


def skip_join_round(name, round_bytes, final_bytes) -> str | None:
    """A round that ships join values, or applies join filters, pays off only through the
    join's selectivity, which is unknown before it runs; make it only when its own traffic
    (the candidates' replies and the filters sent to every shard) is under a quarter of the
    final pull it may shrink."""
    if round_bytes >= 0.25 * final_bytes:
        return (f"{name}: join round would move ~{round_bytes / 1e6:.1f} MB against a final pull of "
                f"~{final_bytes / 1e6:.1f} MB")
    return None


# The nodes' scan time in a round's cost is measured (the last round's, at the compute node) and
# varies 2-4x from one run to the next on a loaded machine (75-350 ms for the same round of the
# same statement), while the saving is counted in link time only; the round-trip time and the
# bandwidth are measured once per connection and then move little. So that a round near the
# break-even point is not made on one run and skipped on the next (bytes moved 0.063 or 0.077 of
# push_down's on the same statement), the scan counts at 1 / ROUND_MARGIN on a round's first
# decision (the scan makes a round not pay only when it clearly exceeds the round's net saving),
# and a statement run again keeps each round's last decision unless saving and full cost now
# differ by more than ROUND_MARGIN the other way (a changed table, link or load). Near break-even
# either choice costs about the same time; the kept one is the one that repeats. A run again also
# counts the least scan time measured before the same round so far: other work on the machine
# only ever adds to it (and slows the final pull's rows too, which the saving leaves out), so the
# least is the scan's own cost, and it moves far less than the last measurement (27-118 ms).
ROUND_MARGIN = 2.0
_KEPT_CHOICES = 4096  # round identities a source remembers (the oldest are forgotten first)


def skip_round(source: Source, name, round_bytes, own, final_in, row_bytes, candidates_in: float = 0.0,
               busy: float = 0.0, previous: bool | None = None, removed: float | None = None) -> str | None:
    """Why one more round for ``name`` would not pay off (Eq. 2-4 in spirit), or None: its
    traffic, round trip and the nodes' own time for it (``busy``: the scan every round makes,
    which the final pull makes anyway) against the final-pull rows it is expected to remove
    (those in the part of the set no candidate of ``name`` lies near). ``previous``: whether the
    same round was made the last time this statement ran (None: not seen); see ROUND_MARGIN.
    ``removed``: the fraction of ``final_in`` the round removes, when a sample of whole
    partitions could try it out (else it is estimated from ``own``, the chance that a row lies
    near one of the round's candidates, as if they were spread at random)."""
    bw = source.bandwidth or 1e9
    cost = source.rtt + busy + round_bytes / bw
    if removed is not None:
        benefit = final_in * removed * row_bytes / bw
    else:
        benefit = removable(final_in, candidates_in) * (1 - own) * row_bytes / bw
    if previous is None:
        threshold = cost - busy + busy / ROUND_MARGIN
    else:
        threshold = cost / ROUND_MARGIN if previous else cost * ROUND_MARGIN
    if benefit <= threshold:
        why = "" if benefit <= cost else f"; skipped last time and not {ROUND_MARGIN:g}x the cost now"
        return (f"{name}: expected saving {benefit * 1000:.2f} ms <= cost {cost * 1000:.2f} ms "
                f"(bandwidth {bw / 1e6:.1f} MB/s, round trip {source.rtt * 1000:.1f} ms, "
                f"nodes' scan {busy * 1000:.1f} ms{why})")
    return None


def remember_choice(choices: dict, key: tuple, choice: tuple[bool, float]) -> None:
    """Record a round's decision and the scan time it counted under the round's identity,
    forgetting the oldest past the bound."""
    choices.pop(key, None)
    choices[key] = choice
    while len(choices) > _KEPT_CHOICES:
        choices.pop(next(iter(choices)))


def removable(final_in: float, candidates_in: float) -> float:
    """The final-pull rows a round could remove: a candidate lies inside its own interval, so
    the variable's candidates (rows the final pull reads too) always stay; only the others can
    go. When the variable's candidates are nearly all the final pull reads (a frequent first
    element whose rows the row filter keeps anyway), no round of it can help."""
    return max(final_in - min(candidates_in, final_in), 0.0)


@dataclass
class Rounds:
    """What the candidate rounds found: the final pull's request and payloads, the final time
    interval set (None when no round ran) and each variable's surviving candidates."""
    request: dict
    blobs: list[bytes]
    tis: IntervalSet | None = None
    points: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)  # pk, lo, hi
    quantum: int = 1
    pk_bits: int | None = None


class DualFiltering:
    """The pull strategies over one source. ``tis_payload`` and ``join_payload`` encode the
    payloads (the defaults send the smaller of the paper's filter and the exact packing)."""

    def __init__(self, source: Source, tis_payload=tis_payload, join_payload=join_payload):
        self.source = source
        self.tis_payload = tis_payload
        self.join_payload = join_payload

    def pull(self, table: str, strategy: str, columns: list[str], row_filter: str | None,
             ip: IntervalPlan | None, round_trips: str, stats: PullStats) -> pa.Table:
        source = self.source
        stats.strategy = strategy
        t0 = time.perf_counter()
        if strategy == "pull_all":
            out = source.pull_all(table, stats)
            stats.phases["pull"] = time.perf_counter() - t0
        elif strategy == "push_down":
            parts = source.call_all({"op": "pull", "table": table, "columns": columns, "where": row_filter},
                                    stats=stats)
            out = source.concat(table, parts, columns)
            stats.phases["pull"] = time.perf_counter() - t0
        elif strategy == "push_pull":
            out = self.push_pull(table, columns, ip, stats)
        else:
            session = None
            if strategy == "dfs_stateful":
                if source.sessions:
                    session = secrets.token_hex(16)
                else:
                    stats.notes.append("dfs_stateful: this source keeps no query state; the rounds ran as dfs")
            out = self.dual_filter(table, columns, ip, exact=(strategy == "naive_dfs"), round_trips=round_trips,
                                   stats=stats, session=session)
        stats.events_pulled = out.num_rows
        return out

    def dual_filter(self, table: str, columns: list[str], ip: IntervalPlan, exact: bool, round_trips: str,
                    stats: PullStats, session: str | None = None) -> pa.Table:
        """The rounds, then the final pull of the rows inside the time interval set."""
        source = self.source
        try:
            found = self.rounds(table, columns, ip, exact, round_trips, stats, session)
            t2 = time.perf_counter()
            sent0, received0 = stats.bytes_sent, stats.bytes_received
            parts = source.call_all(found.request, found.blobs, stats)
            stats.phases["final pull"] = time.perf_counter() - t2
            stats.phase_bytes["final pull"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
            return source.concat(table, parts, columns)
        except BaseException:
            if session is not None:
                source.end_session(session)
            raise

    def push_pull(self, table: str, columns: list[str], ip: IntervalPlan, stats: PullStats) -> pa.Table:
        """The push-pull baseline (see the module's docstring): the shards' partial matches, then
        the rows the other shards' partial matches need from each (none with a single shard)."""
        source = self.source
        v = ip.variables[push_pull_anchor(ip)]
        base = {"op": "partial_matches", "table": table, "key_sql": ip.key_sql, "partition_sql": ip.partition_sql,
                "anchor": v.condition, "before": v.before, "after": v.after, "where": ip.row_filter,
                "columns": columns}
        t0 = time.perf_counter()
        sent0, received0 = stats.bytes_sent, stats.bytes_received
        parts = source.call_all({**base, "phase": "push"}, [], stats)
        stats.phases["push"] = time.perf_counter() - t0
        stats.phase_bytes["push"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
        pk, t, rows = [], [], []
        for p in parts:
            anchors, ipc = p.column("blob").to_pylist()
            d_pk, d_t = unpack(anchors, source.max_reply, 2)
            pk.append(np.cumsum(d_pk))
            t.append(np.cumsum(d_t))
            rows.append(pa.ipc.open_stream(ipc).read_all())
        matches = IntervalSet.around(np.concatenate(pk), np.concatenate(t), v.before, v.after)
        n_anchors = sum(len(x) for x in t)
        stats.candidates[f"{v.name} (partial matches)"] = n_anchors
        stats.notes.append(f"push_pull: {n_anchors} partial matches anchored at {v.name} "
                           f"([t - {v.before}, t + {v.after}]), {len(matches)} intervals covering "
                           f"{matches.total_length()} key units")
        if source.shard_count > 1 and len(matches):
            t1 = time.perf_counter()
            sent0, received0 = stats.bytes_sent, stats.bytes_received
            blob = pack_intervals(matches)
            stats.filters["pull"] = [f"time intervals {len(blob)} B"]
            request = {**base, "phase": "pull", "filter": {"kind": "intervals", "blob": 0},
                       "range": [int(matches.lo.min()), int(matches.hi.max())]}
            rows += source.call_all(request, [blob], stats)
            stats.phases["pull"] = time.perf_counter() - t1
            stats.phase_bytes["pull"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
        return source.concat(table, rows, columns)

    def filter_rounds(self, table: str, columns: list[str] | None, ip: IntervalPlan, exact: bool, round_trips: str,
                      stats: PullStats, session: str | None = None) -> tuple[dict, list[bytes]]:
        """Make the candidate rounds; returns the final pull's request and payloads (rows inside
        the time interval set). With ``session`` (dfs_stateful) the shards keep each round's candidates."""
        found = self.rounds(table, columns, ip, exact, round_trips, stats, session)
        return found.request, found.blobs

    def rounds(self, table: str, columns: list[str] | None, ip: IntervalPlan, exact: bool, round_trips: str,
               stats: PullStats, session: str | None = None) -> Rounds:
        source = self.source
        shards = source.shard_count
        base = {"table": table, "key_sql": ip.key_sql, "partition_sql": ip.partition_sql}
        kept: list[int] = []  # variables whose candidates the shards keep (dfs_stateful)
        t0 = time.perf_counter()
        if round_trips == "auto":
            source.probe()
        conds = [v.condition for v in ip.variables] + [ip.row_filter or "TRUE"]
        st = source.stats(table, conds, ip.key_sql, ip.partition_sql, columns, sample=round_trips == "auto",
                          stats=stats)
        sample, counts, row_bytes, span, extent = st.sample, st.counts, st.row_bytes, st.span, st.extent
        stats.phases["statistics"] = time.perf_counter() - t0
        final_rows = counts[-1]
        order = _round_order(ip, counts)
        quantum = max(1, ip.window // 20)  # candidates travel as distinct (slot, values)
        if ip.partition_sql:
            base["pk_bits"] = _pk_bits(counts[order[0]], ip.variables[order[0]], quantum, span, st.partitions)
            if sample is not None:
                sample.pk >>= 32 - base["pk_bits"]
        tis: IntervalSet | None = None
        coverage = 1.0  # expected fraction of the time line still in the TIS
        sources: dict[tuple, tuple] = {}  # (label, sql, type) -> pk, value hash, slot of the candidates
        needs_values: dict[int, list[tuple[str, str]]] = {}  # label -> values its round returns
        by_label = {v.label: v for v in ip.variables}
        for v in ip.variables:
            for j in v.joins:
                if len(j.sources) == 1:
                    src = next(iter(j.sources))
                    _want(needs_values, src, (j.other_sql, j.common_type))
                    if src in by_label and by_label[src].at_most_once:  # the source is filtered by v's values
                        _want(needs_values, v.label, (j.current_sql, j.common_type))
        points: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # candidates: pk, earliest, latest key
        joined: dict[int, int] = {}  # variable -> join filters its last round used
        per_candidate = 4.0  # packed bytes per candidate, from the replies seen so far
        busy = 0.0  # the nodes' own time for the last round (its scan), over a measured link
        encoded: tuple = (None, None)  # (the set, its payload): built once per set, held by identity
        # Ascending candidate counts; then a second round for each variable whose join sources
        # (or whose joins' consumers) arrived after its first round.
        plan_rounds = [(i, False) for i in order] + [(i, True) for i in order if join_filters(ip, i, None)]
        # a round's identity across runs: the statement's shape and the rounds made before it
        statement_key = (table, ip.key_sql, tuple(ip.partition_sql or ()), ip.row_filter, exact,
                         tuple((u.condition, u.before, u.after) for u in ip.variables))
        made: list[tuple[int, bool]] = []
        for i, again in plan_rounds:
            v = ip.variables[i]
            usable = join_filters(ip, i, sources)
            if again and (i not in points or len(usable) <= joined.get(i, 0)):
                continue
            final_in = _rows_in(sample, final_rows, None, tis, coverage)
            candidates_in = _rows_in(sample, counts[i], i, tis, coverage)
            # Poisson: the chance that a point of the set lies near one of the round's candidates
            rate = candidates_in / max(tis.total_length(), 1) if tis is not None else counts[i] / extent
            own = 1 - math.exp(-rate * (v.before + v.after + quantum))
            ships_values = any((v.label, *m) not in sources for m in needs_values.get(v.label, []))
            mine = needs_values.get(v.label, [])
            if round_trips == "never":
                stats.rounds_skipped.append(f"{v.name} (round trips off)")
                continue
            twin = None if again or exact or session is not None or usable or mine else next(
                (j for j, was_again in made if not was_again and not joined.get(j)
                 and ip.variables[j].condition == v.condition), None)
            if twin is not None:
                tis = self._twin_round(ip, i, twin, tis, points, quantum, stats)
                made.append((i, again))
                joined[i] = 0
                coverage = min(1.0, tis.total_length() / extent)
                if len(tis) == 0:
                    break
                continue
            if tis is not None and encoded[0] is not tis:
                encoded = (tis, self.tis_payload(tis, ip.window, exact))
            tis_bytes = len(encoded[1][1]) if tis is not None else 0
            # the set goes to every shard: when that costs more than the candidates it would keep
            # back, the round asks for all of them and the set is applied here
            filtered = tis_bytes * shards + candidates_in * per_candidate
            blind = tis is not None and not exact and counts[i] * per_candidate < filtered
            round_bytes = min(filtered, counts[i] * per_candidate)
            if round_trips == "auto":
                if ships_values or usable:
                    join_bytes = sum((48 if exact else 2.5) * len(sources[key][0]) for _, _, key in usable)
                    why = skip_join_round(v.name, round_bytes + join_bytes * shards, final_in * row_bytes)
                else:
                    identity = statement_key + (i, again, tuple(made))
                    previous, least = source.round_choices.get(identity, (None, busy))
                    scan = min(busy, least)
                    # in partitions, where rows lie is not random: try the round on the sample
                    tried = sample.removed_by(i, tis, quantum, v.before, v.after) if sample is not None else None
                    why = skip_round(source, v.name, round_bytes, own, final_in, row_bytes, candidates_in, scan,
                                     previous, tried)
                    remember_choice(source.round_choices, identity, (why is None, scan))
                if why:
                    stats.rounds_skipped.append(why)
                    continue
            made.append((i, again))
            name = f"{v.name}{' (joins)' if again else ''}"
            t1 = time.perf_counter()
            sent0, received0 = stats.bytes_sent, stats.bytes_received
            blobs: list[bytes] = []
            request = {"op": "candidates", "condition": v.condition, "packed": True, "quantum": quantum, **base}
            if blind:
                stats.notes.append(f"round {name}: the time interval set stays here (sending it would cost more "
                                   "than the candidates it keeps back)")
            sent = stats.filters.setdefault(name, [])
            if tis is not None and not blind:
                kind, blob = encoded[1]
                request["filter"] = {"kind": kind, "blob": 0}
                blobs.append(blob)
                sent.append(f"time {kind} {len(blob)} B")
                if table in source.indexed:
                    request["cover"] = len(blobs)
                    blobs.append(_cover(tis))
            joins = []
            for j, direction, key in usable:
                pk, val, slot = sources[key]
                if tis is not None:
                    inside = tis.overlaps(pk, slot * quantum, slot * quantum + (quantum - 1))
                    pk, val, slot = pk[inside], val[inside], slot[inside]
                kind, blob = self.join_payload(pk, val, slot, quantum, ip.window, exact)
                value_sql = j.current_sql if direction == "follow" else j.other_sql
                joins.append({"value_sql": value_sql, "type": j.common_type, "blob": len(blobs), "kind": kind,
                              "direction": direction, "window": ip.window})
                sent.append(f"join {kind} {len(blob)} B ({direction})")
                blobs.append(blob)
            joined[i] = len(usable)
            request["joins"] = joins
            request["values"] = [list(m) for m in mine]
            if session is not None:
                request.update(session=session, var=i, expect=sorted(kept))
            t2 = time.perf_counter()
            parts = source.call_all(request, blobs, stats)
            if source.bandwidth is not None:  # a measured link: what the nodes took beyond the transfer
                moved = sum(p.nbytes for p in parts) + shards * sum(len(b) for b in blobs)
                busy = max(0.0, time.perf_counter() - t2 - source.rtt - moved / source.bandwidth)
            if session is not None and i not in kept:
                kept.append(i)
            names = (["pk"] if ip.partition_sql else []) + [f"v{k}" for k in range(len(mine))] + ["s"]
            got = unpack_candidates(parts, names, source.max_reply)
            slots = got["s"]
            n_rows = len(slots)
            pk = got["pk"] if ip.partition_sql else np.zeros(n_rows, np.int64)
            stats.candidates[name] = n_rows
            if n_rows:
                per_candidate = max(0.5, sum(p.nbytes for p in parts) / n_rows)
            for k, m in enumerate(mine):
                sources[(v.label, *m)] = (pk, got[f"v{k}"], slots)
            lo, hi = slots * quantum, slots * quantum + (quantum - 1)
            new = IntervalSet.around_slots(pk, slots, quantum, v.before, v.after)
            points[i] = (pk, lo, hi)
            tis = new if tis is None else tis.intersect(new)
            tis = _refine(tis, points, ip)
            coverage = min(1.0, tis.total_length() / extent)
            stats.phase_bytes[f"round {name}"] = (stats.bytes_sent - sent0, stats.bytes_received - received0)
            stats.phases[f"round {name}"] = time.perf_counter() - t1
            if len(tis) == 0:
                break
        request = {"op": "pull", "columns": columns, "where": ip.row_filter, **base}
        blobs = []
        if tis is not None:
            kind, blob = encoded[1] if encoded[0] is tis else self.tis_payload(tis, ip.window, exact)
            request["filter"] = {"kind": kind, "blob": 0}
            blobs.append(blob)
            stats.filters["final pull"] = [f"time {kind} {len(blob)} B"]
            if len(tis):
                request["range"] = [int(tis.lo.min()), int(tis.hi.max())]
            else:
                request["range"] = [1, 0]
            if table in source.indexed:
                request["cover"] = len(blobs)
                blobs.append(_cover(tis))
        if session is not None and kept:
            request.update(session=session, expect=sorted(kept))
            labels = {ip.variables[i].label for i in kept}
            if ip.row_filter is not None and ip.filter_labels is not None and set(ip.filter_labels) <= labels:
                request["union"] = sorted(kept)
                stats.notes.append("final pull: the rows the nodes kept for " +
                                   ", ".join(ip.variables[i].name for i in sorted(kept)))
            else:
                stats.notes.append("final pull: by the push-down filter (a variable it names had no round)")
        if tis is not None:
            stats.notes.append(f"time interval set: {len(tis)} intervals covering {tis.total_length()} of {extent} "
                               f"key units (window {ip.window})")
        return Rounds(request, blobs, tis, points, quantum, base.get("pk_bits"))

    @staticmethod
    def _twin_round(ip: IntervalPlan, i: int, twin: int, tis: IntervalSet | None, points: dict, quantum: int,
                    stats: PullStats) -> IntervalSet:
        """The round of variable ``i`` made here, without a round trip: an earlier round of this
        statement (``twin``'s) asked for the same condition (SEQ(A a, A b), a closure over the
        first element's type), with no join filter and no values. Its candidates are a superset
        of what the nodes would return now: they lay inside the set as it stood then (or were
        all of them, when the set stayed here), and the set only shrinks. So the ones inside the
        set now are the candidates an exact filter on the nodes would keep (the window filter
        keeps a few more); their intervals are intersected in as a round's are."""
        v = ip.variables[i]
        pk, lo, hi = points[twin]
        if tis is not None:
            keep = tis.overlaps(pk, lo, hi)
            pk, lo, hi = pk[keep], lo[keep], hi[keep]
        points[i] = (pk, lo, hi)
        new = IntervalSet.around_slots(pk, lo // quantum, quantum, v.before, v.after)
        tis = new if tis is None else tis.intersect(new)
        stats.candidates[v.name] = len(pk)
        stats.notes.append(f"round {v.name}: the candidates of round {ip.variables[twin].name} (the same "
                           "condition) inside the set, no round trip")
        return _refine(tis, points, ip)


def pull(source: Source, table: str, strategy: str, columns: list[str], row_filter: str | None,
         ip: IntervalPlan | None, round_trips: str, stats: PullStats) -> pa.Table:
    """Read ``table`` of ``source`` with one pull strategy (see the module's docstring)."""
    return DualFiltering(source).pull(table, strategy, columns, row_filter, ip, round_trips, stats)


def push_pull_anchor(ip: IntervalPlan) -> int:
    """The variable the push-pull baseline anchors its partial matches at: the first that starts
    every match (its window reaches only forward), else the first with a row-level condition."""
    starts = [i for i, v in enumerate(ip.variables) if v.before == 0]
    return starts[0] if starts else 0


def _refine(tis: IntervalSet, points: dict, ip: IntervalPlan, rounds: int = 3) -> IntervalSet:
    """``refine`` for one statement: ``points`` maps a variable's index to its candidates."""
    return refine(tis, {i: (pk, lo, hi, ip.variables[i]) for i, (pk, lo, hi) in points.items()}, rounds)


def refine(tis: IntervalSet, points: dict, rounds: int = 3) -> IntervalSet:
    """Shrink the TIS without asking the shards: candidates of an earlier round that no longer
    lie in the set cannot be part of a match, so their intervals are dropped and the set is
    intersected again, until nothing changes. ``points``: key -> (partition keys, lows, highs,
    the variable's window reach with ``before``/``after``). The set already lies within the
    intervals around all of a variable's candidates (its round intersected them in), and it only
    shrinks: while a variable keeps as many candidates as at its last intersection, intersecting
    again changes nothing, and is skipped."""
    kept = {key: len(p[0]) for key, p in points.items()}
    for _ in range(rounds):
        changed = False
        for key, (pk, lo, hi, v) in points.items():
            keep = tis.overlaps(pk, lo, hi)
            n = int(keep.sum())
            if n == kept[key]:
                continue
            kept[key], changed = n, True
            tis = tis.intersect(IntervalSet._merged(pk[keep], lo[keep] - v.before, hi[keep] + v.after))
        if not changed:
            break
    return tis


def _rows_in(sample: Sample | None, total: float, variable: int | None, tis: IntervalSet | None,
             coverage: float) -> float:
    """Expected rows (all the final pull reads, or one variable's candidates) inside ``tis``: from
    the sample when it has enough of them, else spread evenly over the partitions' lives."""
    if tis is None:
        return total
    if sample is not None:
        share, n = sample.share(tis, variable)
        if n >= 30:
            return total * share
    return total * coverage


def _pk_bits(first: int, v, quantum: int, span: int, partitions: int) -> int:
    """How many bits of the partition hash the rounds use. Partitions that share a hash value
    share their intervals: a row is then pulled for a bucket-mate's interval, with a chance of
    about (intervals per bucket) x (interval length) / (time span). Fewer bits pack every
    interval's key smaller (the set goes to every shard each round), so take the fewest that keep
    that chance near 1% for the first round's intervals - never more than tell the partitions
    apart."""
    length = v.before + v.after + quantum
    wanted = math.ceil(math.log2(max(first * length / (0.01 * max(span, 1)), 1)))
    return int(min(32, math.ceil(math.log2(partitions + 1)) + 1, max(1, wanted)))


def _want(needs: dict, label: int, value: tuple[str, str]) -> None:
    wanted = needs.setdefault(label, [])
    if value not in wanted:
        wanted.append(value)


def _round_order(ip: IntervalPlan, counts: list[int]) -> list[int]:
    """Variables by ascending candidate count: the rarest shrinks the set first and every later
    round only ships candidates inside it."""
    return sorted(range(len(ip.variables)), key=lambda i: counts[i])


def _cover(tis: IntervalSet, most: int = 1024) -> bytes:
    """The set's intervals over all partitions, merged, as at most ``most`` sorted disjoint
    ranges (the smallest gaps closed): what an ACER index skips clusters with."""
    order = np.argsort(tis.lo, kind="stable")
    lo, hi = tis.lo[order].astype(np.int64), tis.hi[order].astype(np.int64)
    if len(lo):
        reach = np.maximum.accumulate(hi)
        starts = np.r_[0, np.flatnonzero(lo[1:] > reach[:-1] + 1) + 1]
        lo, hi = lo[starts], np.r_[reach[starts[1:] - 1], reach[-1]]
        if len(lo) > most:
            gaps = lo[1:] - hi[:-1]
            cut = np.sort(np.argsort(gaps, kind="stable")[-(most - 1):])
            lo, hi = np.r_[lo[0], lo[cut + 1]], np.r_[hi[cut], hi[-1]]
    return np.concatenate([lo, hi]).astype(np.int64).tobytes()
