"""The ACER index of a storage node's shard: its bit-sliced comparisons against brute force, its
answers against the same requests on an unindexed copy (random data with NULLs, negative values,
NaN, strings, dates and timestamps; random range conditions and time covers), and its planner's
choice between the index and DuckDB's scan."""
from __future__ import annotations

import datetime
import random

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from matchrec.connectors import acer
from matchrec.connectors.shard import RequestError, ShardService
from matchrec.operators.intervals import IntervalSet

KEY = 'epoch_us("ts")'
T0 = datetime.datetime(2024, 1, 1)


def _table(rng: np.random.Generator, n: int) -> pa.Table:
    f = np.round(rng.normal(0, 10, n), 2)
    f[rng.random(n) < 0.02] = np.nan
    f[rng.random(n) < 0.01] = -0.0
    ts = np.cumsum(rng.integers(0, 120, n)) * 1_000_000
    return pa.table({
        "id": np.arange(n),
        "ts": pa.array(ts, pa.timestamp("us"), mask=rng.random(n) < 0.01),
        "type": pa.array([None if x == 6 else ["ab", "b", "c", "d", "e", "é"][x] for x in rng.integers(0, 7, n)]),
        "part": rng.integers(0, 5, n),
        "i": pa.array(rng.integers(-50, 50, n), mask=rng.random(n) < 0.05),
        "f": pa.array(f, mask=rng.random(n) < 0.03),
        "s": pa.array([["x", "y", "zz", "", "Y"][k] for k in rng.integers(0, 5, n)], mask=rng.random(n) < 0.05),
        "d": pa.array((rng.integers(0, 60, n)).astype("datetime64[D]").astype("datetime64[s]").astype(object)
                      .tolist(), pa.timestamp("s")).cast(pa.date32()),
        "tsa": pa.array(ts + rng.integers(-10**9, 10**9, n), pa.timestamp("us"), mask=rng.random(n) < 0.02),
    })


def _condition(rng: random.Random) -> str:
    def day():
        return (datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randint(-2, 62))).isoformat()

    def stamp():
        return (T0 + datetime.timedelta(seconds=rng.randint(-100, 200_000))).isoformat(sep=" ")
    atoms = [lambda: f"type = '{rng.choice(['ab', 'b', 'é', 'zz'])}'", lambda: "type IN ('b', 'c')",
             lambda: f"i {rng.choice(['<', '<=', '>', '>=', '='])} {rng.randint(-60, 60)}",
             lambda: f"{rng.randint(-60, 60)} {rng.choice(['<', '>='])} i",
             lambda: f"i BETWEEN {rng.randint(-60, 10)} AND {rng.randint(-10, 60)}",
             lambda: f"i < {rng.randint(-30, 30)}.5", lambda: f"i IN ({rng.randint(-5, 5)}, {rng.randint(-5, 5)})",
             lambda: f"f {rng.choice(['<', '>', '<=', '>=', '='])} {rng.choice(['-', ''])}{rng.uniform(0, 20):.2f}",
             lambda: f"f BETWEEN -{rng.uniform(0, 9):.1f} AND {rng.uniform(0, 9):.1f}", lambda: "f >= 0",
             lambda: "f = 0", lambda: f"f > {rng.choice(['1e30', '-1e400', '0.1'])}",
             lambda: f"s = '{rng.choice(['x', 'y', 'zz', '', 'Y', 'q'])}'", lambda: "s IN ('x', 'zz')",
             lambda: f"d {rng.choice(['<', '>=', '='])} DATE '{day()}'",
             lambda: f"d BETWEEN DATE '{day()}' AND DATE '{day()}'",
             lambda: f"tsa {rng.choice(['<', '>'])} TIMESTAMP '{stamp()}'", lambda: f"tsa >= DATE '{day()}'",
             lambda: "NOT (i < 0)", lambda: "lower(s) = 'y'", lambda: "i % 7 = 1", lambda: "f <> f",
             lambda: f"part = {rng.randint(0, 4)}",
             # as the compute node writes them: casts that keep the values, NULL read as FALSE
             lambda: f"CAST(type AS VARCHAR) = '{rng.choice(['b', 'é'])}'", lambda: "CAST(\"type\" AS TEXT) IN ('c', 'd')",
             lambda: f"coalesce((i > {rng.randint(-40, 40)}), FALSE)", lambda: f"CAST(i AS BIGINT) <= {rng.randint(-9, 9)}",
             lambda: "CAST(f AS DOUBLE) > 1.5", lambda: "coalesce(CAST(s AS VARCHAR) IN ('x', 'zz'), FALSE)",
             # casts that change values, a NULL read as TRUE: left to DuckDB
             lambda: "CAST(i AS VARCHAR) = '3'", lambda: "TRY_CAST(f AS INTEGER) = 2", lambda: "coalesce(i > 0, TRUE)",
             lambda: "TRY_CAST(i AS TINYINT) > 3"]

    def tree(depth):
        if depth == 0 or rng.random() < 0.35:
            return rng.choice(atoms)()
        return f"({tree(depth - 1)}) {rng.choice(['AND', 'AND', 'OR'])} ({tree(depth - 1)})"
    return tree(3)


def _services(data: pa.Table, attributes: list[str], block: int = 1024):
    plain, indexed = duckdb.connect(), duckdb.connect()
    for con in (plain, indexed):
        con.register("d_", data)
        con.execute("CREATE TABLE ev AS SELECT * FROM d_")
        con.unregister("d_")
    a, b = ShardService(plain, 1 << 24), ShardService(indexed, 1 << 24)
    b.answer({"op": "build_index", "table": "ev", "attributes": attributes, "type_column": "type",
              "time_column": "ts", "block_size": block}, [])
    return a, b


def _same(a, b, req, blobs):
    ra, rb = a.answer(dict(req), blobs), b.answer(dict(req), blobs)
    assert rb.schema == ra.schema, req
    assert sorted(map(repr, rb.to_pylist())) == sorted(map(repr, ra.to_pylist())), req


def _requests(cond: str, tis: IntervalSet):
    exact = np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes()
    cover = np.concatenate([tis.lo, tis.hi]).astype(np.int64).tobytes()
    timed = {"filter": {"kind": "exact", "blob": 0}, "cover": 1}
    return [({"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY}, []),
            ({"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY, "quantum": 7, **timed},
             [exact, cover]),
            ({"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY, "partition_sql": ['"part"'],
              "pk_bits": 3, **timed}, [np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes(), cover]),
            ({"op": "pull", "table": "ev", "where": cond}, []),
            ({"op": "pull", "table": "ev", "where": cond, "key_sql": KEY, "columns": ["id", "i", "s"], **timed,
              "range": [int(tis.lo.min()), int(tis.hi.max())]}, [exact, cover])]


@pytest.mark.parametrize("seed, n_conditions, least", [
    (5, 12, 2), pytest.param(6, 200, 40, marks=pytest.mark.slow)])
def test_answers_equal_the_unindexed_node_on_random_conditions(seed, n_conditions, least):
    data = _table(np.random.default_rng(seed + 6), 4000)
    a, b = _services(data, ["i", "f", "s", "d", "tsa"])
    ts = data.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
    ts = np.sort(ts[~np.isnan(ts.astype(float))] if ts.dtype != np.int64 else ts)
    lo_t, hi_t = int(np.nanmin(ts)), int(np.nanmax(ts))
    rng = random.Random(seed)
    narrowed = 0
    for k in range(n_conditions):
        cond = _condition(rng)
        starts = np.sort(np.array([rng.randint(lo_t, hi_t) for _ in range(rng.choice([1, 3, 20]))], np.int64))
        widths = np.array([rng.randint(0, 3 * 10**8) for _ in starts], np.int64)
        tis = IntervalSet._merged(np.zeros(len(starts), np.int64), starts, starts + widths)
        for req, blobs in _requests(cond, tis):
            _same(a, b, req, blobs)
        with b._scope("ev", cond, _requests(cond, tis)[1][0], _requests(cond, tis)[1][1], False) as (_, scope, _c):
            narrowed += scope != "TRUE"
    assert narrowed >= least  # the planner used the index on the selective requests


def test_partition_hashes_and_the_exact_path():
    data = _table(np.random.default_rng(3), 3000)
    a, b = _services(data, ["i", "s"])
    idx = b.indexes.get(b.con, "ev", b._version("ev"))
    # decided by the bitmaps: answered without a scan; a part they do not know: DuckDB
    assert idx.candidates(b.con, "type = 'b' AND i BETWEEN -3 AND 4", KEY, ['"part"'], 32, None) is not None
    assert idx.candidates(b.con, "type = 'b' AND i % 2 = 0", KEY, [], 32, None) is None
    assert idx.candidates(b.con, "f < 1", KEY, [], 32, None) is None  # f is not indexed
    assert idx.candidates(b.con, "i > -40", KEY, [], 32, None) is None  # most rows: DuckDB hands them over
    for key in ['CAST(epoch("ts") AS INTEGER)', '"id"']:  # a key of another type; a key not sorted in the runs
        _same(a, b, {"op": "candidates", "table": "ev", "condition": "type = 'c' AND i < -40", "key_sql": key}, [])
    got = idx.candidates(b.con, "s = 'zz' AND i >= 40 OR type = 'c' AND i < -45", KEY, ['"part"', '"type"'], 32, None)
    want = b.con.sql(f"SELECT CAST(hash(\"part\", \"type\") >> 32 AS BIGINT) AS pk, {KEY} AS t FROM ev "
                     f"WHERE (s = 'zz' AND i >= 40 OR type = 'c' AND i < -45) AND {KEY} IS NOT NULL").to_arrow_table()
    assert sorted(zip(*got.to_pydict().values())) == sorted(zip(*want.to_pydict().values()))


def test_pulls_the_bitmaps_decide_take_the_rows_the_scan_returns(monkeypatch):
    """A pull whose condition the bitmaps decide is answered from the node's column cache: the
    same rows, schema and order as DuckDB's scan of the indexed table, and as the unindexed node's
    rows (time filters by partition, rows without a key, column lists, a cache too small)."""
    data = _table(np.random.default_rng(21), 1500)
    data = data.append_column("r", pa.array(np.arange(data.num_rows)[::-1].copy()))  # the name of a row id alias
    a, b = _services(data, ["i", "f", "s", "d"])
    idx = b.indexes.get(b.con, "ev", b._version("ev"))
    ts = np.sort(np.array([t for t in data.column("ts").cast(pa.int64()).to_pylist() if t is not None]))
    rng = random.Random(8)
    decided = 0
    for k in range(8):
        cond = _condition(rng)
        starts = np.sort(np.array([rng.randint(int(ts[0]), int(ts[-1])) for _ in range(rng.choice([1, 4, 30]))]))
        tis = IntervalSet._merged(np.array([rng.randint(0, 3) for _ in starts], np.int64), starts,
                                  starts + np.array([rng.randint(0, 4 * 10**9) for _ in starts], np.int64))
        order = np.lexsort((tis.lo, tis.pk))
        exact = np.concatenate([tis.pk[order], tis.lo[order], tis.hi[order]]).astype(np.int64).tobytes()
        merged = IntervalSet._merged(np.zeros(len(tis), np.int64), np.sort(tis.lo), np.sort(tis.hi))
        cover = np.concatenate([merged.lo, merged.hi]).astype(np.int64).tobytes()
        reqs = [({"op": "pull", "table": "ev", "where": cond}, []),
                ({"op": "pull", "table": "ev", "where": cond, "columns": ["ID", "s", "ts", "i", "r"]}, []),
                ({"op": "pull", "table": "ev", "where": cond, "key_sql": KEY, "partition_sql": ['"part"'],
                  "pk_bits": 2, "filter": {"kind": "exact", "blob": 0}, "cover": 1,
                  "range": [int(tis.lo.min()), int(np.median(tis.hi))]}, [exact, cover])]
        for req, blobs in reqs:
            _same(a, b, req, blobs)
            decided += idx.decided_rows(b.con, cond, req.get("key_sql", ""), b._cover(req, blobs)) is not None
        got = b.answer(dict(reqs[1][0]), [])
        with b._scope("ev", cond, reqs[1][0], [], True) as (cur, scope, _c):
            want = cur.sql(f'SELECT "ID", s, ts, i, r FROM ev WHERE {scope} AND ({cond})').to_arrow_table()
        assert got.to_pylist() == want.to_pylist(), cond  # in row order, as the scan hands them over
    assert decided >= 4  # many random conditions are ranges and types the bitmaps decide
    assert idx.columns  # and they were answered from the cache
    for cond in ["CAST(type AS VARCHAR) = 'c' AND coalesce((i < -20), FALSE)", "CAST(i AS HUGEINT) BETWEEN 3 AND 5",
                 "TRY_CAST(f AS INTEGER) = 2", "CAST(f AS DOUBLE) < -25", "CAST(type AS VARCHAR) IN ('b', 'ab')",
                 "coalesce(i > 40, TRUE)", "CAST(s AS VARCHAR) = 'Y' AND coalesce(f >= 0, FALSE)"]:
        for req in ({"op": "pull", "table": "ev", "where": cond},
                    {"op": "candidates", "table": "ev", "condition": cond, "key_sql": KEY}):
            _same(a, b, req, [])
    monkeypatch.setattr(acer, "COLUMN_CACHE", 1000)  # a cache too small: DuckDB scans
    b.indexes.forget("ev")
    _same(a, b, {"op": "pull", "table": "ev", "where": "i < -40"}, [])
    assert not b.indexes.get(b.con, "ev", b._version("ev")).columns


def test_planner_scans_unless_the_index_narrows():
    data = _table(np.random.default_rng(7), 6000)
    _, b = _services(data, ["i", "f"])
    idx = b.indexes.get(b.con, "ev", b._version("ev"))
    ts = sorted(t for t in data.column("ts").cast(pa.int64()).to_pylist() if t is not None)
    narrow = (np.array([ts[100]], np.int64), np.array([ts[130]], np.int64))
    assert idx.scope(b.con, "i > -100", KEY, None, False)[0] == "TRUE"  # every row
    assert idx.scope(b.con, "i % 3 = 0", KEY, None, False)[0] == "TRUE"  # nothing the index knows
    assert idx.scope(b.con, "type = 'b'", KEY, None, False)[0].count("rowid BETWEEN") == 1
    sql, seen = idx.scope(b.con, "i > 0", KEY, narrow, False)  # a short interval in every type's run
    assert sql.count("rowid BETWEEN") <= acer.MAX_RANGES and seen["covered"] < 0.1 * len(ts)
    sql, seen = idx.scope(b.con, "type = 'c' AND i = 49", KEY, None, False)  # few rows: bitmaps ran
    assert "bitmaps" in seen and seen["covered"] < 0.25 * len(ts)
    assert idx.scope(b.con, "type = 'zz'", KEY, None, False)[0] == "FALSE"


def test_blocks_whose_codes_miss_the_condition_are_cut_from_the_ranges():
    rng = np.random.default_rng(9)
    n = 8192
    v = np.arange(n) // 10 + rng.integers(0, 3, n)  # in row order: each block holds its own values
    data = pa.table({"ts": np.arange(n), "type": ["a"] * n, "v": v, "w": rng.integers(0, 1000, n)})
    a, b = _services(data, ["v", "w"])
    idx = b.indexes.get(b.con, "ev", b._version("ev"))
    for cond in ["v BETWEEN 150 AND 260 AND w < 900", "v < 5 OR v > 700", "v >= 300 AND v < 305", "w < 3"]:
        starts, ends, _ = idx._phase_one(b.con, idx._tree(cond), '"ts"', None, True)
        s2, e2 = idx._clip_blocks(idx._tree(cond), b.con, starts, ends)
        ids = np.flatnonzero(b.con.sql(f"SELECT ({cond}) AS c FROM ev ORDER BY rowid").to_arrow_table()
                             .column(0).to_numpy(zero_copy_only=False))
        k = np.searchsorted(s2, ids, "right") - 1
        assert ((k >= 0) & (ids <= e2[np.maximum(k, 0)])).all(), cond  # no row that passes is cut
        _same(a, b, {"op": "pull", "table": "ev", "where": cond}, [])
    assert idx.scope(b.con, "v BETWEEN 150 AND 260 AND w < 900", '"ts"', None, False)[0].count("rowid") == 1


def test_phase_one_searches_every_run_at_once_as_run_by_run():
    """Phase one's one search over the position keys finds the ranges the search per type run
    finds (NULL keys at the end of a run kept for pulls, covers outside the keys, empty runs)."""
    data = _table(np.random.default_rng(11), 2000)
    _, b = _services(data, ["i"])
    idx = b.indexes.get(b.con, "ev", b._version("ev"))
    keyed = idx._keys(b.con, KEY)
    assert keyed is not None and keyed[4] is not None
    ts = np.sort(np.array([t for t in data.column("ts").cast(pa.int64()).to_pylist() if t is not None]))
    rng = np.random.default_rng(4)
    for k in range(16):
        m = int(rng.choice([1, 5, 40]))
        lo = np.sort(rng.integers(int(ts[0]) - 10**9, int(ts[-1]) + 10**9, m))
        lo = np.unique(lo)
        hi = np.minimum(lo + rng.integers(0, 10**9, len(lo)), np.r_[lo[1:] - 1, lo[-1] + 10**9])
        cover = (lo.astype(np.int64), hi.astype(np.int64))
        cond = ["type = 'b'", "TRUE", "type IN ('c', 'é') AND i > 0", "type = 'zz'"][k % 4]
        for keyless in (False, True):
            idx.keys[KEY] = keyed
            fast = idx._search_runs(b.con, idx._tree(cond), KEY, cover, keyless)
            idx.keys[KEY] = keyed[:4] + (None,)  # without position keys: the search run by run
            slow = idx._search_runs(b.con, idx._tree(cond), KEY, cover, keyless)
            assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1]), (cond, keyless)
    idx.keys[KEY] = keyed


def test_bit_sliced_comparisons_and_equal_depth_bins(monkeypatch):
    rng = np.random.default_rng(2)
    n = 3000
    v = rng.integers(-1000, 1000, n).astype(np.float64)
    v[rng.random(n) < 0.05] = np.nan
    data = pa.table({"ts": np.arange(n), "type": ["a"] * n, "v": pa.array(v, mask=rng.random(n) < 0.05),
                     "w": rng.integers(-10**12, 10**12, n)})
    monkeypatch.setattr(acer, "MAX_CODES", 32)  # more distinct values than codes: equal-depth bins
    a, b = _services(data, ["v", "w"])
    idx = b.indexes.get(b.con, "ev", b._version("ev"))
    assert not idx.attrs["v"].exact and idx.attrs["v"].nbits == 5
    for k in range(12):
        lo, hi = sorted(rng.integers(-1100, 1100, 2))
        cond = rng.choice([f"v BETWEEN {lo} AND {hi}", f"v > {lo}", f"w < {lo * 10**9}", f"v = {lo}"])
        _same(a, b, {"op": "pull", "table": "ev", "where": cond}, [])
        _same(a, b, {"op": "candidates", "table": "ev", "condition": cond, "key_sql": '"ts"'}, [])
    at = idx.attrs["w"]  # codes <= c over the slices, against the codes themselves
    words = np.arange(idx.words)
    codes = np.searchsorted(at.lo, data.column("w").to_numpy(), "right") - 1
    for c in [-1, 0, 5, 17, 30, 31, 40]:
        got = np.unpackbits(at.le(c, words).view(np.uint8), bitorder="little")[:n].astype(bool)
        assert (got == (codes <= c)).all(), c


def test_refusals():
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT range AS ts, 'a' AS type, range > 3 AS flag, CAST(range AS REAL) AS r "
                "FROM range(2000)")
    s = ShardService(con, 1 << 20)
    for attr, what in (("flag", "BOOLEAN|bool"), ("r", "float")):
        with pytest.raises(RequestError, match=f"{attr} has type ({what})"):
            s.answer({"op": "build_index", "table": "ev", "attributes": [attr]}, [])
    with pytest.raises(RequestError, match="multiple of 64"):
        s.answer({"op": "build_index", "table": "ev", "attributes": ["ts"], "block_size": 1000}, [])


@pytest.mark.parametrize("seed, n_conditions", [(3, 10), pytest.param(4, 150, marks=pytest.mark.slow)])
def test_a_capped_cover_and_a_capped_search_answer_as_the_unindexed_node(monkeypatch, seed, n_conditions):
    """Time sets over several partitions whose cover the caller capped (smallest gaps closed):
    the node searches with the set's own union instead, and merges a cover down when runs times
    ranges would pass the search's bound. Rows equal the unindexed node's."""
    from matchrec.operators.packing import pack_intervals
    monkeypatch.setattr(acer, "MAX_SEARCHES", 24)
    data = _table(np.random.default_rng(seed), 3000)
    a, b = _services(data, ["i", "s"])
    ts = np.sort(data.column("ts").drop_null().cast(pa.int64()).to_numpy())
    pks = np.unique(a.answer({"op": "candidates", "table": "ev", "condition": "TRUE", "key_sql": KEY,
                              "partition_sql": ['"part"'], "pk_bits": 3}, []).column("pk").to_numpy())
    rng = random.Random(seed)
    for _ in range(n_conditions):
        cond = rng.choice(["type IN ('b', 'c', 'd')", "type = 'b'", "i < 10", "type <> 'b'", "s = 'x'",
                           _condition(rng)])
        n = rng.choice([3, 12, 40])
        starts = np.array([ts[rng.randrange(len(ts))] for _ in range(n)], np.int64)
        tis = IntervalSet.around(np.array([rng.choice(pks.tolist()) for _ in range(n)], np.int64), starts, 0,
                                 rng.randint(0, 4 * 10**8))
        lo, hi = acer.union_of(tis.lo, tis.hi)
        keep = max(1, len(lo) // 3)  # the caller's cap: the widest gaps stay open
        lo, hi = acer._merge(lo, hi, keep)
        cover = np.concatenate([lo, hi]).astype(np.int64).tobytes()
        exact = np.concatenate([tis.pk, tis.lo, tis.hi]).astype(np.int64).tobytes()
        base = {"table": "ev", "key_sql": KEY, "partition_sql": ['"part"'], "pk_bits": 3, "cover": 1}
        for kind, blob in (("exact", exact), ("intervals", pack_intervals(tis))):
            timed = {**base, "filter": {"kind": kind, "blob": 0}}
            _same(a, b, {"op": "candidates", "condition": cond, "quantum": 5, **timed}, [blob, cover])
            _same(a, b, {"op": "pull", "where": cond, "columns": ["id", "i", "part"], **timed,
                         "range": [int(tis.lo.min()), int(tis.hi.max())]}, [blob, cover])


def test_range_words_set_exactly_the_bits_of_the_rows_in_the_ranges():
    """A type's row-id bitmap is built per word from its runs: each word's bits are the rows of
    that word inside one of the ranges, for ranges within one word, across word edges, ending
    on a word's last row, and words the ranges skip."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        rows = int(rng.integers(1, 2000))
        cuts = np.sort(rng.choice(rows + 1, size=2 * int(rng.integers(0, 8)), replace=False))
        starts, ends = cuts[0::2].astype(np.int64), cuts[1::2].astype(np.int64) - 1
        keep = ends >= starts
        starts, ends = starts[keep], ends[keep]
        n_words = (rows + 63) // 64
        words = np.flatnonzero(rng.random(n_words) < rng.choice([0.3, 1.0])).astype(np.int64)
        inside = np.zeros(n_words * 64, bool)
        for a, b in zip(starts, ends):
            inside[a:b + 1] = True
        want = np.packbits(inside.reshape(n_words, 64)[words], bitorder="little").view("<u8")
        got = acer._range_words(words, starts, ends)
        assert got.dtype == np.uint64 and np.array_equal(got, want), (trial, starts, ends, words)
