"""Storage nodes without processes: the filter structures the compute node sends (interval sets,
shrinking window filters, window-join filters, the packed encodings and their refusal of bad
payloads), dfs_stateful sessions and the ACER index, each on a ``ShardService`` over a local DuckDB
connection - checked against brute force or against the same request without the index.

The tests that start real nodes are in test_storage_nodes.py.
"""
from __future__ import annotations

import random

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matchrec.operators.intervals import (FilterPayloadError, IntervalSet, ShrinkingWindowFilter,
                                          WindowJoinFilter)
from matchrec.operators.packing import SlotJoinSet, pack, pack_intervals, unpack, unpack_intervals


# -- the filter structures

def _brute_cover(pk, t, before, after, qpk, qt):
    return np.array([any(p == x and s - before <= y <= s + after for p, s in zip(pk, t)) for x, y in zip(qpk, qt)],
                    bool)


points = st.lists(st.tuples(st.integers(0, 2), st.integers(-300, 3000)), max_size=40)


@settings(max_examples=120, deadline=None)
@given(a=points, b=points, w=st.integers(1, 200), before=st.integers(0, 200), after=st.integers(0, 200),
       seed=st.integers(0, 10_000))
def test_interval_sets_and_filters_against_brute_force(a, b, w, before, after, seed):
    rng = np.random.default_rng(seed)
    qpk, qt = rng.integers(0, 3, 600), rng.integers(-600, 3300, 600)
    apk, at = (np.array([p for p, _ in a], np.int64), np.array([t for _, t in a], np.int64))
    bpk, bt = (np.array([p for p, _ in b], np.int64), np.array([t for _, t in b], np.int64))
    sa = IntervalSet.around(apk, at, before, after)
    sb = IntervalSet.around(bpk, bt, w, w)
    want_a = _brute_cover(apk, at, before, after, qpk, qt)
    want_b = _brute_cover(bpk, bt, w, w, qpk, qt)
    assert (sa.contains(qpk, qt) == want_a).all()
    both = sa.intersect(sb)
    assert (both.contains(qpk, qt) == (want_a & want_b)).all()
    lo = qt - rng.integers(0, 50, 600)
    want_overlap = np.array([(both.contains(np.full(h - l + 1, p), np.arange(l, h + 1))).any()
                             for p, l, h in zip(qpk[:60], lo[:60], qt[:60])])
    assert (both.overlaps(qpk[:60], lo[:60], qt[:60]) == want_overlap).all()
    swf = ShrinkingWindowFilter.build(both, w)
    got = swf.contains(qpk, qt)
    assert not (want_a & want_b & ~got).any(), "the window filter lost a point of the set"
    again = ShrinkingWindowFilter.from_bytes(swf.to_bytes(), 1 << 30)
    assert (again.contains(qpk, qt) == got).all()
    vals = rng.integers(0, 4, len(bt))
    wjf = WindowJoinFilter.build(bpk, vals, bt, w)
    qv = rng.integers(0, 4, 600)
    truth = np.array([any(p == x and v == y and 0 <= z - s <= w for p, v, s in zip(bpk, vals, bt))
                      for x, y, z in zip(qpk, qv, qt)], bool)
    assert not (truth & ~wjf.may_follow(qpk, qv, qt)).any(), "the join filter lost a pair"
    assert (WindowJoinFilter.from_bytes(wjf.to_bytes(), 1 << 30).may_follow(qpk, qv, qt)
            == wjf.may_follow(qpk, qv, qt)).all()


FAR_KEYS = [-(1 << 62), -7, 0, 12345, 1 << 61]
far_points = st.lists(st.tuples(st.sampled_from(FAR_KEYS), st.integers(0, 3), st.integers(-300, 3000)), max_size=40)


@settings(max_examples=80, deadline=None)
@given(a=far_points, b=far_points, w=st.integers(1, 200), seed=st.integers(0, 10_000))
def test_interval_sets_on_one_line_equal_the_per_partition_loops(a, b, w, seed):
    """Partitions whose times lie far apart (2^59 between partitions here, more than one line of
    2^60 could hold for all of them, as hashed keys and long histories give) still share one
    line; the answers equal the per-partition loops'."""
    import matchrec.operators.intervals as I
    home = {p: i * (1 << 59) for i, p in enumerate(FAR_KEYS + [99])}

    def arrays(pts):
        return (np.array([p for p, _, _ in pts], np.int64),
                np.array([home[p] + k * (1 << 40) + t for p, k, t in pts], np.int64))

    rng = np.random.default_rng(seed)
    qpk = rng.choice(np.array(FAR_KEYS + [99], np.int64), 400)
    qt = (np.array([home[p] for p in qpk.tolist()], np.int64) + rng.integers(0, 4, 400) * (1 << 40)
          + rng.integers(-600, 3300, 400))
    (apk, at), (bpk, bt) = arrays(a), arrays(b)

    def answers():
        sa = IntervalSet.around(apk, at, 0, w)
        both = sa.intersect(IntervalSet.around(bpk, bt, w, w))
        return (sa.contains(qpk, qt), both.contains(qpk, qt), both.overlaps(qpk, qt - 40, qt),
                (both.pk, both.lo, both.hi))

    on_line = answers()
    original = I._Line.of
    try:
        I._Line.of = classmethod(lambda cls, pairs: None)
        looped = answers()
    finally:
        I._Line.of = original
    for x, y in zip(on_line[:3], looped[:3]):
        assert (x == y).all()
    for x, y in zip(on_line[3], looped[3]):
        assert (x == y).all()
    if len(apk):  # the line was really used: its segments fit however far apart the spans are
        assert I._Line.of([(apk, at)]) is not None


def test_filter_false_positive_rates_are_small():
    rng = np.random.default_rng(7)
    t = np.sort(rng.integers(0, 10_000_000, 2000))
    tis = IntervalSet.around(np.zeros(len(t), np.int64), t, 0, 1000)
    swf = ShrinkingWindowFilter.build(tis, 1000)
    q = rng.integers(0, 10_000_000, 200_000)
    inside = tis.contains(np.zeros(len(q), np.int64), q)
    fp = (swf.contains(np.zeros(len(q), np.int64), q) & ~inside).sum() / max((~inside).sum(), 1)
    assert fp < 0.05
    vals = rng.integers(0, 1 << 30, len(t))
    wjf = WindowJoinFilter.build(np.zeros(len(t), np.int64), vals, t, 1000, eps=0.02)
    qv = rng.integers(1 << 30, 1 << 31, 50_000)  # values never inserted
    rate = wjf.may_follow(np.zeros(len(qv), np.int64), qv, rng.integers(0, 10_000_000, len(qv))).mean()
    assert rate < 0.06  # two probes of a 2% filter


@settings(max_examples=150, deadline=None)
@given(a=far_points, w=st.integers(0, 500), quantum=st.integers(1, 60), seed=st.integers(0, 10_000))
def test_packed_interval_sets_and_join_sets_against_brute_force(a, w, quantum, seed):
    """The packed encodings are exact: intervals come back bound for bound, and the slot join
    set answers 'a member may lie in [t - w, t]' / '... in [t, t + w]' as a scan of the members
    does, a member being anywhere in its slot."""
    rng = np.random.default_rng(seed)
    pk = np.array([p for p, _, _ in a], np.int64)
    t = np.array([k * 1000 + x for _, k, x in a], np.int64)
    tis = IntervalSet.around(pk, t * quantum, int(rng.integers(0, 3)) * quantum, w)
    back = unpack_intervals(pack_intervals(tis), 1 << 30)
    for x, y in zip((back.pk, back.lo, back.hi), (tis.pk, tis.lo, tis.hi)):
        assert (x == y).all()
    vals = rng.integers(0, 3, len(t))
    slots = np.floor_divide(t, 7)
    joins = SlotJoinSet.from_bytes(SlotJoinSet.of_points(pk, vals, slots, quantum, w).to_bytes(), 1 << 30)
    qpk = rng.choice(np.array(FAR_KEYS, np.int64), 300)
    qv, qt = rng.integers(0, 3, 300), rng.integers(-800, 4000, 300) * quantum // 7
    lo, hi = slots * quantum, slots * quantum + quantum - 1
    for got, (a_lo, a_hi) in ((joins.may_follow(qpk, qv, qt), (qt - w, qt)),
                              (joins.may_precede(qpk, qv, qt), (qt, qt + w))):
        want = np.array([((pk == p) & (vals == v) & (hi >= x) & (lo <= y)).any()
                         for p, v, x, y in zip(qpk, qv, a_lo, a_hi)], bool)
        assert (got == want).all()


@pytest.mark.parametrize("blob", [b"", b"SWF2" + b"\0" * 10, b"x" * 100])
def test_malformed_filter_payloads_are_refused(blob):
    with pytest.raises(FilterPayloadError):
        ShrinkingWindowFilter.from_bytes(blob, 1 << 20)
    with pytest.raises(FilterPayloadError):
        WindowJoinFilter.from_bytes(blob, 1 << 20)
    with pytest.raises(FilterPayloadError):
        unpack_intervals(blob, 1 << 20)
    with pytest.raises(FilterPayloadError):
        SlotJoinSet.from_bytes(blob, 1 << 20)


def test_packed_payloads_that_lie_are_refused():
    tis = IntervalSet.around(np.zeros(3, np.int64), np.array([0, 100, 200]), 0, 10)
    good = pack_intervals(tis)
    with pytest.raises(FilterPayloadError):  # a decompressed size over the limit: refused before decompressing
        unpack_intervals(good, 16)
    overlapping = b"\1\0\0\0\0\0\0\0" + pack([np.zeros(2, np.int64), np.array([0, 1]), np.array([5, 5])])
    with pytest.raises(FilterPayloadError):
        unpack_intervals(overlapping, 1 << 20)
    bomb = pack([np.zeros(1000, np.int64)] * 3)
    with pytest.raises(FilterPayloadError):
        unpack(bomb[:20] + b"junk", 1 << 20)


# -- dfs_stateful sessions

def test_dfs_stateful_sessions_expire_are_bounded_and_see_table_changes():
    from matchrec.connectors.session import SessionLost
    from matchrec.connectors.shard import RequestError, ShardService
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT range AS ts, range % 3 AS v FROM range(100)")
    svc = ShardService(con, 1 << 20)
    base = {"op": "candidates", "table": "ev", "key_sql": "ts", "condition": "v = 1"}

    def round_(sid, var, expect):
        return svc.answer({**base, "session": sid, "var": var, "expect": expect}, [])
    sid = "ab" * 8
    assert round_(sid, 0, []).num_rows == 33
    assert round_(sid, 1, [0]).num_rows == 33
    kept = svc.sessions.open(sid, "ev", svc._version("ev"), [0, 1]).variables
    assert kept[0].rows.column("r").to_pylist() == list(range(1, 100, 3))
    pulled = svc.answer({"op": "pull", "table": "ev", "key_sql": "ts", "session": sid, "expect": [0, 1],
                         "union": [0]}, [])
    assert sorted(pulled.column("ts").to_pylist()) == list(range(1, 100, 3))
    with pytest.raises(SessionLost, match="not known here"):  # the final pull ended it
        round_(sid, 1, [0])
    svc.sessions.max_sessions = 2
    for k in range(3):
        round_(f"{k:016x}", 0, [])
    assert len(svc.sessions) == 2
    with pytest.raises(SessionLost):
        round_(f"{0:016x}", 1, [0])  # evicted: the oldest
    round_(f"{2:016x}", 1, [0])
    con.execute("INSERT INTO ev VALUES (100, 1)")
    with pytest.raises(SessionLost, match="changed"):
        round_(f"{2:016x}", 1, [0, 1])
    svc.sessions.ttl = 0.0
    round_("cd" * 8, 0, [])
    import time
    time.sleep(0.01)
    with pytest.raises(SessionLost):
        round_("cd" * 8, 1, [0])
    with pytest.raises(RequestError, match="session id"):
        round_("not hex!", 0, [])


# -- the ACER index

def _index_table(rng: np.random.Generator, n: int) -> pa.Table:
    v = rng.integers(-5, 200, n)
    f = rng.normal(0, 10, n)
    f[rng.random(n) < 0.01] = np.nan
    return pa.table({
        "id": np.arange(n), "ts": np.cumsum(rng.integers(0, 3, n)),
        "type": pa.array([None if x == 6 else "abcdef"[x] for x in rng.integers(0, 7, n)]),
        "v": pa.array(v, mask=rng.random(n) < 0.05), "f": f,
        "g": pa.array(rng.integers(0, 4, n), pa.int32(), mask=np.arange(n) < 2000),  # one block all NULL
    })


def _random_condition(rng: random.Random) -> str:
    atoms = [lambda: f"type = '{rng.choice('abcdefz')}'", lambda: f"type IN ('{rng.choice('ab')}', 'c')",
             lambda: f"v {rng.choice(['<', '<=', '>', '>=', '='])} {rng.randint(-10, 210)}",
             lambda: f"{rng.randint(-10, 210)} {rng.choice(['<', '>='])} v",
             lambda: f"v BETWEEN {rng.randint(-10, 100)} AND {rng.randint(50, 210)}",
             lambda: f"f {rng.choice(['<', '>', '<=', '>='])} {rng.uniform(-20, 20):.3f}",
             lambda: f"g = {rng.randint(0, 4)}", lambda: f"v < {rng.randint(0, 100)}.5",
             lambda: "NOT (v < 50)", lambda: "lower(type) = 'b'", lambda: "v % 7 = 1", lambda: "f <> f",
             lambda: f"v > -{rng.randint(0, 3)}"]

    def tree(depth):
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(atoms)()
        return f"({tree(depth - 1)}) {rng.choice(['AND', 'AND', 'OR'])} ({tree(depth - 1)})"
    return tree(3)


def test_acer_index_answers_exactly_as_without_it():
    from matchrec.connectors.shard import ShardService
    data = _index_table(np.random.default_rng(4), 9000)
    plain, indexed = duckdb.connect(), duckdb.connect()
    for con in (plain, indexed):
        con.register("d", data)
        con.execute("CREATE TABLE ev AS SELECT * FROM d")
    a, b = ShardService(plain, 1 << 24), ShardService(indexed, 1 << 24)
    summary = b.answer({"op": "build_index", "table": "ev", "attributes": ["v", "f", "g"], "block_size": 2048}, [])
    assert summary.column("blocks")[0].as_py() == 5 and summary.column("clusters")[0].as_py() == 7  # 6 types, NULL
    assert b.answer({"op": "tables"}, []).to_pylist() and b._tables().column("indexed").to_pylist() == [True]
    rng = random.Random(8)
    ts = np.sort(data.column("ts").to_numpy())
    key = 'CAST("ts" AS BIGINT)'
    skipped = 0
    for k in range(40):
        cond = _random_condition(rng)
        lo = rng.randint(0, 9000)
        intervals = np.array([[lo, lo + rng.randint(0, 400)], [lo + 2000, lo + 2100]], np.int64)
        if k % 2:  # intervals ending or starting exactly where a block's events begin or end
            edge = int(ts[2048 * rng.randint(1, 4) - rng.randint(0, 1)])
            intervals = np.array([[edge - 60, edge], [edge + 3000, edge + 3000]], np.int64)
        tis = IntervalSet(np.zeros(2, np.int64), intervals[:, 0].copy(), intervals[:, 1].copy())
        exact = np.concatenate([tis.pk, tis.lo, tis.hi]).tobytes()
        cover = np.concatenate([tis.lo, tis.hi]).tobytes()
        reqs = [({"op": "candidates", "table": "ev", "condition": cond, "key_sql": key}, []),
                ({"op": "candidates", "table": "ev", "condition": cond, "key_sql": key, "quantum": 5,
                  "filter": {"kind": "exact", "blob": 0}, "cover": 1}, [exact, cover]),
                ({"op": "pull", "table": "ev", "where": cond}, []),
                ({"op": "pull", "table": "ev", "where": cond, "key_sql": key, "columns": ["id", "v"],
                  "filter": {"kind": "exact", "blob": 0}, "cover": 1, "range": [int(tis.lo[0]), int(tis.hi[1])]},
                 [exact, cover])]
        for req, blobs in reqs:
            want = sorted(map(repr, a.answer(dict(req), blobs).to_pylist()))
            got = sorted(map(repr, b.answer(dict(req), blobs).to_pylist()))
            assert got == want, (k, cond, req)
        with b._scope("ev", cond, reqs[1][0], [exact, cover], False) as (_, scope, _left):
            skipped += scope != "TRUE"
    assert skipped > 20  # the index narrowed the rows of most requests


# -- the push-pull baseline's partial matches

def _spread(data: pa.Table, rng, shards: int = 3) -> list:
    """In-memory DuckDB connections holding table ``ev``: ``data``'s rows spread at random."""
    shard_of = rng.integers(0, shards, data.num_rows)
    cons = []
    for k in range(shards):
        c = duckdb.connect()
        c.register("data", data.filter(pa.array(shard_of == k)))
        c.execute("CREATE TABLE ev AS SELECT * FROM data")
        cons.append(c)
    return cons


class _Shards:
    """A source whose shards are ``ShardService``s over DuckDB connections of this process."""

    def __init__(self, cons, schema):
        from matchrec.connectors.shard import ShardService
        from matchrec.connectors.source import Source

        class Over(Source):
            sessions = False
            schemas = {"ev": schema}
            indexed: set = set()
            services = [ShardService(c, 1 << 26) for c in cons]
            shard_count = len(cons)

            def call_all(self, request, blobs=None, stats=None):
                import json
                replies = [s.answer(json.loads(json.dumps(request)), list(blobs or [])) for s in self.services]
                if stats is not None:
                    stats.round_trips += 1
                return replies
        self.source = Over()


def test_push_pull_partial_matches_return_every_row_of_their_windows_once():
    from matchrec.connectors.dual_filtering import DualFiltering
    from matchrec.connectors.shard import RequestError
    from matchrec.connectors.source import PullStats
    from matchrec.planner.intervals import IntervalPlan, VariableIntervals

    rng = np.random.default_rng(3)
    n = 3000
    data = pa.table({"id": np.arange(n), "ts": np.sort(rng.integers(0, 20000, n)),
                     "p": rng.integers(0, 4, n).astype(np.int32),
                     "type": rng.choice(["a", "b", "c", "d"], n, p=[0.03, 0.3, 0.3, 0.37])})
    data = data.set_column(1, "ts", pa.array([None if i % 97 == 0 else t for i, t in
                                              enumerate(data.column("ts").to_pylist())], pa.int64()))
    whole = duckdb.connect()
    whole.register("data", data)
    shards = _Shards(_spread(data, rng), data.schema)  # random spreading: a match's rows lie on every shard
    for partition, before, after, where in (([], 0, 40, "type IN ('a', 'c')"), (['"p"'], 25, 25, None)):
        anchor = VariableIntervals(0, "A", "type = 'a'", before, after)
        other = VariableIntervals(1, "C", "type = 'c'", max(before, after), max(before, after))
        # the anchor: the variable that starts every match (window [t, t + w]), else the first
        ip = IntervalPlan("ts", "ts", max(before, after), partition, [other, anchor] if not before else [anchor, other],
                          where)
        stats = PullStats()
        got = DualFiltering(shards.source).pull("ev", "push_pull", ["id", "ts", "p", "type"], where, ip,
                                                "auto", stats)
        pk = "hash(p) >> 32" if partition else "0"
        want = whole.sql(f"""
            SELECT d.id FROM data d WHERE ({where or 'TRUE'}) AND (d.ts IS NULL OR EXISTS (
              SELECT 1 FROM data a WHERE a.type = 'a' AND {pk.replace('p', 'a.p')} = {pk.replace('p', 'd.p')}
              AND d.ts BETWEEN a.ts - {before} AND a.ts + {after})) ORDER BY d.id""").fetchall()
        ids = sorted(got.column("id").to_pylist())
        assert ids == [r[0] for r in want]  # every row once: pushed by its shard or pulled, never both
        assert stats.round_trips == 2 and stats.candidates["A (partial matches)"] > 0
        assert 0 < len(ids) < n
    with pytest.raises(RequestError, match="phase"):
        shards.source.services[0].answer({"op": "partial_matches", "table": "ev"}, [])
    with pytest.raises(RequestError, match="before"):
        shards.source.services[0].answer({"op": "partial_matches", "table": "ev", "phase": "push", "before": -1,
                                          "after": 3, "anchor": "true", "key_sql": "ts"}, [])


def test_cost_model_makes_no_round_whose_candidates_are_what_the_final_pull_reads():
    from types import SimpleNamespace

    from matchrec.connectors.dual_filtering import removable, skip_round
    link = SimpleNamespace(bandwidth=12.5e6, rtt=0.002)  # 100 Mbit/s
    # a rare variable: most final-pull rows are others' and lie far from its candidates
    assert skip_round(link, "A", 4_000, 0.05, 1_000_000, 30, 1_000) is None
    # a frequent first element whose rows are what the row filter keeps: nothing to remove
    why = skip_round(link, "A", 4_000, 0.05, 1_000_000, 30, 999_950)
    assert why is not None and "expected saving" in why
    assert removable(100.0, 250.0) == 0.0 and removable(100.0, 40.0) == 60.0


def test_time_payload_is_the_smaller_encoding_without_always_building_the_window_filter():
    """The interval payload skips building the window filter when the packed intervals are no
    larger than its fingerprints alone; the choice must stay the one building both would make."""
    from matchrec.connectors.dual_filtering import _windows, tis_payload
    rng = np.random.default_rng(7)
    shortcuts = 0
    for _ in range(60):
        n, w = int(rng.integers(1, 800)), int(rng.integers(10, 3000))
        pk, t = rng.integers(0, int(rng.integers(1, 60)), n), rng.integers(0, int(rng.integers(1000, 10**6)), n)
        tis = IntervalSet.around(pk, t, int(rng.integers(0, w)), int(rng.integers(0, w)))
        packed, swf = pack_intervals(tis), ShrinkingWindowFilter.build(tis, w).to_bytes()
        kind, blob = tis_payload(tis, w, False)
        assert (kind, blob) == (("swf", swf) if len(swf) < len(packed) else ("intervals", packed))
        windows = len(ShrinkingWindowFilter._window_bitmaps(tis, w, 20)[0])
        assert _windows(tis, w) == windows
        shortcuts += len(packed) <= 1.5 * windows
    assert 0 < shortcuts < 60  # both ways were taken


def test_node_statistics_kept_per_table_version_equal_fresh_ones():
    """A storage node keeps a table version's statistics: its answers equal those of a shard that
    keeps none, and a changed table (another version) or a forgotten one is counted again."""
    from matchrec.connectors.shard import ShardService
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT i AS id, i * 7 AS ts, i % 13 AS g, i % 5 AS v FROM range(20000) t(i)")
    kept, fresh = ShardService(con, 1 << 24, keep_stats=True), ShardService(con, 1 << 24)

    def request(conds):
        return {"op": "stats", "table": "ev", "conditions": conds, "columns": ["id", "ts", "v"],
                "key_sql": "ts", "partition_sql": ["g"], "sample": True}

    def same(a, b):
        fixed = ["n", "parts", "kmin", "kmax", "active"] + [c for c in a.column_names if c.startswith("c")]
        assert {c: a.column(c).to_pylist() for c in fixed} == {c: b.column(c).to_pylist() for c in fixed}

    for conds in (["v = 1", "v < 3"], ["v < 3", "g = 2", "TRUE"], ["v = 1", "v < 3"]):
        same(kept.answer(request(conds), []), fresh.answer(request(conds), []))
    stored = kept.kept_stats.of("ev", kept._version("ev"))
    assert ("count", "v = 1") in stored and ("count", "g = 2") in stored and "sample" in stored
    stored[("count", "v = 1")] = -1  # what is kept is what is answered
    assert kept.answer(request(["v = 1"]), []).column("c0").to_pylist() == [-1]
    con.execute("INSERT INTO ev SELECT i, i * 7, i % 13, 1 FROM range(20000, 21000) t(i)")  # a new version
    same(kept.answer(request(["v = 1"]), []), fresh.answer(request(["v = 1"]), []))
    assert kept.answer(request(["v = 1"]), []).column("n").to_pylist() == [21000]
    kept.kept_stats.of("ev", kept._version("ev"))[("count", "v = 1")] = -1
    kept.kept_stats.forget("ev")
    assert kept.answer(request(["v = 1"]), []).column("c0").to_pylist() == [4000 + 1000]


def test_time_sets_joined_in_the_scan_answer_as_tested_row_by_row(monkeypatch):
    """An exact time set with many partitions is semi-joined in the node's scan; candidates and
    pulls (rows without a key included) equal those of the row-by-row test it replaces."""
    from matchrec.connectors import shard
    from matchrec.operators.packing import pack_intervals as packed
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT i AS id, CASE WHEN i % 97 = 0 THEN NULL ELSE (i * 37) % 50000 END AS ts, "
                "i % 300 AS g, i % 7 AS v FROM range(30000) t(i)")
    service = shard.ShardService(con, 1 << 24)
    rng = np.random.default_rng(5)
    pks = con.execute("SELECT DISTINCT CAST(hash(g) >> 44 AS BIGINT) FROM ev").fetchnumpy()
    pk_all = np.sort(next(iter(pks.values())).astype(np.int64))
    pick = rng.choice(pk_all, 200)
    tis = IntervalSet.around(pick, rng.integers(0, 50000, 200), 300, 500)
    base = {"table": "ev", "key_sql": "ts", "partition_sql": ["g"], "pk_bits": 20}
    for kind, blob in (("intervals", packed(tis)),
                       ("exact", np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes())):
        for req in ({"op": "candidates", "condition": "v < 3", "quantum": 10, **base},
                    {"op": "pull", "columns": ["id", "ts", "g"], "where": "v <> 2", **base}):
            req = {**req, "filter": {"kind": kind, "blob": 0}}
            assert service._joinable(service._time_set(req["filter"], [blob])) is not None
            joined = service.answer(dict(req), [blob])
            monkeypatch.setattr(shard, "JOIN_INTERVALS_PER_PARTITION", 0)
            tested = service.answer(dict(req), [blob])
            monkeypatch.undo()
            key = [(c, "ascending") for c in joined.column_names]
            assert joined.sort_by(key).equals(tested.sort_by(key)) and joined.num_rows > 0
            if req["op"] == "pull":
                assert joined.column("ts").null_count > 0


def test_round_decision_is_kept_unless_its_estimate_moves_past_the_margin():
    from types import SimpleNamespace

    from matchrec.connectors.dual_filtering import ROUND_MARGIN, skip_round
    link = SimpleNamespace(bandwidth=12.5e6, rtt=0.0)
    benefit = 1_000_000 * 30 / 12.5e6  # seconds the round's removable rows would take on the link

    def made(ratio, previous):  # ``ratio``: expected saving / cost, the cost all nodes' scan
        return skip_round(link, "B", 0, 0.0, 1_000_000, 30, 0, benefit / ratio, previous) is None
    for ratio in (0.3, 0.45, 0.55, 0.9, 1.1, 3.0):
        assert made(ratio, None) == (ratio > 1 / ROUND_MARGIN)  # a first decision: the scan must clearly dominate
    # near break-even the last decision stays; past the margin either way it changes
    assert made(0.7, True) and not made(1.5, False)
    assert not made(0.9 / ROUND_MARGIN, True) and made(1.1 * ROUND_MARGIN, False)
    why = skip_round(link, "B", 0, 0.0, 1_000_000, 30, 0, benefit / 1.5, False)
    assert "skipped last time" in why


def _rare_anchor_source(seed: int):
    """Three in-process shards of random events: rare ``a``, less rare ``b``, frequent ``c``,
    filler ``d``; and the interval plan of SEQ(a, b, c) WITHIN 40 over them."""
    from matchrec.planner.intervals import IntervalPlan, VariableIntervals
    rng = np.random.default_rng(seed)
    n = 30000
    data = pa.table({"id": np.arange(n), "ts": np.cumsum(rng.integers(1, 4, n)),
                     "type": rng.choice(["a", "b", "c", "d"], n, p=[0.003, 0.01, 0.3, 0.687])})
    source = _Shards(_spread(data, rng), data.schema).source
    source.bandwidth, source.rtt = 1.25e6, 0.0005  # a 10 Mbit/s link: rounds pay on a table this small
    variables = [VariableIntervals(0, "A", "type = 'a'", 0, 40), VariableIntervals(1, "B", "type = 'b'", 40, 40),
                 VariableIntervals(2, "C", "type = 'c'", 40, 0)]
    where = "type IN ('a', 'b', 'c')"
    return source, IntervalPlan("ts", "ts", 40, [], variables, where), where


def test_rounds_decide_alike_when_the_measured_node_time_varies(monkeypatch):
    """A statement run again on one source keeps each round's decision while the measured time
    of the nodes' scan (what varies from run to run) moves it by less than the margin."""
    import matchrec.connectors.dual_filtering as dual
    from matchrec.connectors.source import PullStats
    source, ip, where = _rare_anchor_source(5)
    plain = dual.skip_round
    seen = {}

    def with_cost(cost_ratio):  # B's whole cost over its expected saving, the scan as if measured
        def skip(src, name, round_bytes, own, final_in, row_bytes, candidates_in=0.0, busy=0.0, previous=None,
                 removed=None):
            if name == "B":
                kept_out = dual.removable(final_in, candidates_in) * (1 - own) if removed is None else final_in * removed
                saving = kept_out * row_bytes / src.bandwidth
                fixed = src.rtt + round_bytes / src.bandwidth
                seen["B"] = saving > fixed
                busy = max(saving * cost_ratio - fixed, 0.0)
            return plain(src, name, round_bytes, own, final_in, row_bytes, candidates_in, busy, previous, removed)
        monkeypatch.setattr(dual, "skip_round", skip)
        stats = PullStats()
        got = dual.DualFiltering(source).pull("ev", "dfs", ["id", "ts", "type"], where, ip, "auto", stats)
        return "B" in stats.candidates, sorted(got.column("id").to_pylist())

    made, rows = with_cost(0.0)
    assert made and seen["B"], seen  # B's round pays when the scan is free
    # as the scan time varies (a plain comparison would flip the decision at every step): whether
    # B's round is made
    for cost_ratio, want in ((0.8, True), (1.4, True), (0.8, True), (2.5, False), (1.4, False), (0.8, False),
                             (0.3, True)):
        made, got = with_cost(cost_ratio)
        assert made == want, cost_ratio
        assert got == rows or not want  # the same rows whenever the same rounds are made


def test_a_round_run_again_counts_the_least_scan_time_measured_before_it(monkeypatch):
    """Other work only adds to the nodes' measured scan time: a statement run again counts the
    least time measured before the same round, not the last one."""
    import time

    import matchrec.connectors.dual_filtering as dual
    from matchrec.connectors.source import PullStats
    source, ip, where = _rare_anchor_source(5)
    answer = source.call_all
    plain = dual.skip_round
    delay, counted = [0.0], []

    def slow(request, blobs=None, stats=None):  # the nodes' scan of a candidates request takes ``delay``
        if request.get("op") == "candidates":
            time.sleep(delay[0])
        return answer(request, blobs, stats)

    def skip(src, name, *args):
        if name == "B":
            counted.append(args[5])  # the scan time it counts
        return plain(src, name, *args)
    source.call_all = slow
    monkeypatch.setattr(dual, "skip_round", skip)
    for d in (0.06, 0.02, 0.08):
        delay[0] = d
        dual.DualFiltering(source).pull("ev", "dfs", ["id", "ts", "type"], where, ip, "auto", PullStats())
    assert counted[0] >= 0.06 and counted[1] < 0.06 and counted[2] == counted[1]


def test_node_catalogue_and_statistics_answers_kept_until_forgotten():
    """A storage node alone changes its tables and forgets a table after each load or index
    build: until then it answers from the catalogue entry and statistics it kept (a statement run
    again gets the very answer it got before), and afterwards from the table as it is."""
    from matchrec.connectors.shard import ShardService
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT i AS id, i * 7 AS ts, i % 13 AS g, i % 5 AS v FROM range(20000) t(i)")
    node, fresh = ShardService(con, 1 << 24, keep_stats=True, keep_catalog=True), ShardService(con, 1 << 24)
    request = {"op": "stats", "table": "ev", "conditions": ["v = 1", "g < 3"], "columns": ["id", "v"],
               "key_sql": "ts", "partition_sql": ["g"], "sample": True}
    first = node.answer(dict(request), [])
    assert node.answer(dict(request), []).equals(first)
    assert first.drop_columns(["row_bytes", "sample"]).equals(fresh.answer(dict(request), []).drop_columns(
        ["row_bytes", "sample"]))
    con.execute("INSERT INTO ev SELECT i, i * 7, i % 13, 1 FROM range(20000, 21000) t(i)")
    assert node.answer(dict(request), []).column("c0").to_pylist() == [4000]  # kept: not forgotten yet
    node.forget("ev")
    assert node.answer(dict(request), []).column("c0").to_pylist() == [5000]
    assert node.answer(dict(request), []).column("n").to_pylist() == [21000]
    with pytest.raises(Exception, match="no table nope"):
        node.answer({**request, "table": "nope"}, [])


def test_one_watcher_thread_asks_for_every_running_request_and_never_after_one_ended():
    """The callers of running requests are polled by one thread per poll interval, not one thread
    per request; a request that ended is never asked about again, and a caller that left has its
    request's DuckDB work interrupted."""
    import threading
    import time
    from matchrec.connectors.requests import RequestCancelled
    from matchrec.connectors.shard import ShardService
    service = ShardService(duckdb.connect(), 1 << 24)
    ended, asked_after = threading.Event(), []

    def caller_waits():
        if ended.is_set():
            asked_after.append(True)
        return False
    threads = threading.active_count()
    for _ in range(30):
        with service.cancellable(caller_waits, 0.002):
            time.sleep(0.001)
        assert threading.active_count() <= threads + 1
    ended.set()
    time.sleep(0.02)
    assert not asked_after
    gone = threading.Event()
    started = time.perf_counter()
    with pytest.raises(RequestCancelled):
        with service.cancellable(gone.is_set, 0.002):
            gone.set()
            service._cursor().execute("SELECT sum(i * i % 7) FROM range(20000000000) t(i)").fetchall()
    assert time.perf_counter() - started < 5


def _jobs_source(late_share: float, seed: int = 3):
    """Three in-process shards of jobs (the cluster trace's shape): each job's SUBMIT, its
    SCHEDULE 20 units later, or ``late_share`` of them 5,000 later (outside the window), and an
    outcome 3,000 after that; jobs arrive every 10 units. The plan is SEQ(SUBMIT s, SCHEDULE c)
    PARTITION BY job WITHIN 600."""
    from matchrec.planner.intervals import IntervalPlan, VariableIntervals
    rng = np.random.default_rng(seed)
    jobs = 12000
    start = np.arange(jobs) * 10
    late = rng.random(jobs) < late_share
    sched = start + np.where(late, 5000, 20)
    data = pa.table({"job": np.tile(np.arange(jobs), 3), "ts": np.concatenate([start, sched, sched + 3000]),
                     "type": np.repeat(["SUBMIT", "SCHEDULE", "FINISH"], jobs)})
    source = _Shards(_spread(data, rng), data.schema).source
    source.bandwidth, source.rtt = 1.25e6, 0.0005
    variables = [VariableIntervals(0, "S", "type = 'SUBMIT'", 0, 600),
                 VariableIntervals(1, "C", "type = 'SCHEDULE'", 600, 0)]
    where = "type IN ('SUBMIT', 'SCHEDULE')"
    return source, IntervalPlan("ts", "ts", 600, ["job"], variables, where), where


@pytest.mark.parametrize("late_share, pays", [(0.0, False), (0.6, True)])
def test_rounds_over_partitions_are_tried_on_a_sample_of_whole_partitions(late_share, pays):
    """Where every SCHEDULE follows its job's SUBMIT, no round can remove a row, though the
    candidates look sparse on the jobs' time lines (a random spread would say a round removes
    most SCHEDULEs): the nodes sample whole partitions and the round is tried on the sample.
    When most SCHEDULEs come too late, the same round pays and is made."""
    import matchrec.connectors.dual_filtering as dual
    from matchrec.connectors.source import PullStats
    source, ip, where = _jobs_source(late_share)
    st = source.stats("ev", [v.condition for v in ip.variables] + [where], "ts", ["job"], sample=True)
    assert st.sample.complete and 300 < len(st.sample.t) <= 24000 // 4  # a quarter of the jobs (12,000 rows a node)
    per_job = np.unique(st.sample.pk, return_counts=True)[1]
    assert (per_job == 2).all()  # both rows of every sampled job, from whichever nodes hold them
    stats = PullStats()
    got = dual.DualFiltering(source).pull("ev", "dfs", ["job", "ts", "type"], where, ip, "auto", stats)
    assert (len(stats.candidates) > 0) == pays, stats.rounds_skipped
    want = source.pull_rows("ev", ["job", "ts", "type"], where)
    keep = lambda t: sorted(zip(t.column("job").to_pylist(), t.column("ts").to_pylist()))  # noqa: E731
    if pays:
        assert set(keep(got)) < set(keep(want))
    else:
        assert keep(got) == keep(want)


@pytest.mark.parametrize("keep_order", [True, False])
def test_pulled_rows_are_stored_in_the_order_of_their_columns(keep_order):
    """The rows a CER statement pulled become a temporary table whose rowid follows the order of
    partition, key and the other columns (the tie order of equal keys, whatever order the nodes
    sent them in), with NaN, NULL and list columns among them, and with DuckDB allowed to
    reorder scans (preserve_insertion_order off)."""
    from matchrec.engine.cer_remote import _swap_in
    rng = random.Random(3)
    n = 400
    data = pa.table({
        "p": pa.array([rng.choice(["x", "y", None]) for _ in range(n)]),
        "k": pa.array([rng.choice([1, 2, 3, None]) for _ in range(n)], pa.int64()),
        "f": pa.array([rng.choice([0.5, float("nan"), -1.0, None]) for _ in range(n)]),
        "s": pa.array([rng.choice(["a", "b", "ab", ""]) for _ in range(n)]),
        "l": pa.array([[rng.randint(0, 2)] for _ in range(n)]),
    })
    for columns in (["p", "k", "f", "s"], ["p", "k", "l", "f", "s"]):
        duck = duckdb.connect()
        duck.execute(f"SET preserve_insertion_order = {str(keep_order).lower()}")
        duck.register("t", data.slice(0, 0))
        _swap_in(duck, "t", data, columns)
        got = duck.sql("SELECT * FROM t ORDER BY rowid").to_arrow_table()
        duck.register("d", data)
        order = ", ".join(f"{c} NULLS LAST" for c in columns)
        want = duck.sql(f"SELECT * FROM d ORDER BY {order}").to_arrow_table()
        keyed = [tuple(r[c] for c in columns) for r in got.to_pylist()]
        assert [repr(r) for r in keyed] == [repr(tuple(r[c] for c in columns)) for r in want.to_pylist()]
        assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, data.to_pylist()))
        duck.close()
