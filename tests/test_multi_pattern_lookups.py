"""The shared operator's position tables, dense ranks and rank searches (``operators.cer_shared``):
each row's position among a class's candidates read from a table instead of a binary search, a
column's ranks among a class's distinct values and the first rank where a ray flips, checked
against binary searches, ``np.unique`` and scans on random streams with ties and partitions, and
whole workloads with the tables against without."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

import matchrec
from matchrec.operators import cer_shared as O
from matchrec.parser import sase
from tests.test_multi_pattern_rays import _built_statement


def _stream(rng: np.random.Generator, n: int, partitioned: bool) -> O.Stream:
    key = np.sort(rng.integers(0, n // 2 + 1, n))
    pid = None
    if partitioned:
        pid = np.sort(rng.integers(0, 4, n))
        key = np.concatenate([np.sort(key[pid == p]) for p in range(4)])
    masks = [rng.random(n) < share for share in (0.5, 0.1, 0.02, 0.0)]
    return O.Stream(key, pid, masks, int(rng.integers(1, 20)))


def test_position_tables_equal_binary_searches(monkeypatch):
    monkeypatch.setattr(O, "LOOKUP_SHARE", 1 << 40)  # a table from the first search on
    rng = np.random.default_rng(5)
    for trial in range(30):
        n = int(rng.integers(1, 400))
        s = _stream(rng, n, bool(trial % 2))
        assert s.ordered()
        for cls in range(len(s.rows)):
            rows = rng.integers(0, n, int(rng.integers(1, 50)))
            for _ in range(2):  # the first call builds the table, the second reads it
                np.testing.assert_array_equal(s.after(cls, rows), np.searchsorted(s.cks[cls], s.ck[rows], "right"))
                np.testing.assert_array_equal(s.before(cls, rows), np.searchsorted(s.cks[cls], s.ck[rows], "left"))
        assert len(s._tables) == 2 * len(s.rows)


def test_no_table_where_keys_decrease_along_the_rows(monkeypatch):
    monkeypatch.setattr(O, "LOOKUP_SHARE", 1 << 40)
    s = O.Stream(np.array([3, 1, 2]), None, [np.array([True, True, True])], 5)
    assert not s.ordered()
    rows = np.array([0, 1, 2])
    np.testing.assert_array_equal(s.after(0, rows), np.searchsorted(s.cks[0], s.ck[rows], "right"))
    assert not s._tables


def test_dense_ranks_equal_unique():
    rng = np.random.default_rng(11)
    for trial in range(40):
        n = int(rng.integers(1, 300))
        floats = bool(trial % 2)
        vals = np.round(rng.normal(0, 3, n), 1) if floats else rng.integers(-5, 5, n).astype(np.int64)
        nulls = rng.random(n) < 0.1
        if floats:
            vals[rng.random(n) < 0.1] = np.nan
        s = O.Stream(np.arange(n), None, [rng.random(n) < 0.6], 5)
        ev = O.Evaluator(s, [], [])
        rays = type("R", (), {"column": "x", "values": vals, "nulls": nulls if trial % 3 else None})()
        rank, rep = ev.ranks(0, rays)
        rows = s.rows[0]
        v = vals[rows]
        bad = (nulls[rows] if rays.nulls is not None else np.zeros(len(rows), bool)) | (
            np.isnan(v) if floats else False)
        uniq, inv = np.unique(v[~bad], return_inverse=True)
        np.testing.assert_array_equal(rank[bad], -1)
        np.testing.assert_array_equal(rank[~bad], inv.reshape(-1))
        np.testing.assert_array_equal(vals[rep], uniq)


def test_workloads_with_position_tables_equal_without(monkeypatch):
    """Random statements with counted Kleene closures, negations, rows returned and rays: every
    table equal with a position table from the first search on and with none."""
    built = 0
    for seed in range(6):
        rng = random.Random(seed)
        con = matchrec.connect()
        try:
            n = rng.randint(150, 400)
            ts = sorted(rng.randint(0, n) for _ in range(n))
            table = pa.table({"ts": pa.array(ts, pa.int64()), "type": pa.array([rng.choice("ABC") for _ in ts]),
                              "x": pa.array([rng.randint(-5, 5) for _ in ts], pa.int64()),
                              "y": pa.array([round(rng.uniform(-5, 5), 1) for _ in ts], pa.float64())})
            con.register("__in", table)
            con.cursor().execute("CREATE TABLE ev AS SELECT * FROM __in")
            stmts = [_built_statement(rng) for _ in range(12)]
            slices = rng.choice([None, 37])
            with monkeypatch.context() as m:
                m.setattr(O, "LOOKUP_ENTRIES", 0)
                want = matchrec.run_many(con, stmts, budget=0.02, slice_events=slices).tables
            tables = O.Stream._position_table

            def counted(self, *args):
                nonlocal built
                built += 1
                return tables(self, *args)
            with monkeypatch.context() as m:
                m.setattr(O, "LOOKUP_SHARE", 1 << 40)
                m.setattr(O.Stream, "_position_table", counted)
                got = matchrec.run_many(con, stmts, budget=0.02, slice_events=slices).tables
            for s, a, b in zip(stmts, want, got):
                assert a.equals(b), f"seed {seed}\n{s}"
        finally:
            con.close()
    assert built > 20


def test_two_counted_kleene_closures_equal_statements_run_alone():
    """Statements with two counted Kleene closures (the weights of each distinct pair of closure
    sizes, counted in one pass) equal the NFA mechanisms' counts."""
    from tests.test_multi_pattern import alone
    rng = random.Random(3)
    con = matchrec.connect()
    try:
        n = 90
        ts = sorted(rng.randint(0, 60) for _ in range(n))
        table = pa.table({"ts": pa.array(ts, pa.int64()), "type": pa.array([rng.choice("ABC") for _ in ts]),
                          "x": pa.array([rng.randint(-5, 5) for _ in ts], pa.int64())})
        con.register("__in", table)
        con.cursor().execute("CREATE TABLE ev AS SELECT * FROM __in")
        stmts = []
        for _ in range(8):
            t = [rng.choice("ABC") for _ in range(5)]
            bounds = [rng.choice(["", "{2,}", "{1,2}"]) for _ in range(2)]
            stmts.append(f"PATTERN SEQ({t[0]} a, {t[1]}+{bounds[0]} k, {t[2]} b, {t[3]}+{bounds[1]} m, {t[4]} c) "
                         f"FROM ev TYPE type ORDER BY ts WHERE b.x - a.x > {rng.randint(-3, 1)} "
                         f"WITHIN {rng.choice([8, 12])} RETURN COUNT(*)")
        got = matchrec.run_many(con, stmts, budget=0.02)
        assert "Kleene closure counted" in "\n".join(got.report)
        for s, t in zip(stmts, got.tables):
            assert t.equals(alone(con, s)), s
    finally:
        con.close()


def test_python_conditions_compiled_when_first_called():
    """A shared statement's Python condition functions are compiled at their first call (the
    numpy forms decide otherwise) and give the eagerly compiled functions' truth."""
    from matchrec.engine.multi_classes import ElementClasses, prepare
    from matchrec.engine.multi_group import Statement
    from matchrec.engine.multi_read import read_group
    from matchrec.planner import cer as P
    con = matchrec.connect()
    try:
        con.cursor().execute("CREATE TABLE ev AS SELECT i AS ts, CASE WHEN i % 2 = 0 THEN 'A' ELSE 'B' END AS type, "
                             "(i * 7 % 11) * 1.0 AS x FROM range(60) t(i)")
        sql = "PATTERN SEQ(A a, B b) FROM ev TYPE type ORDER BY ts WHERE b.x - a.x > 2 AND abs(b.x - a.x) < 8 WITHIN 9"
        session = con.session
        q = sase.parse(sql)
        plan = P.resolve_query(session.duck, q, session.cer_settings, P.describe_source(session.duck, q),
                               P.has_rowid(session.duck, q.source))
        table, filter_cols, _ = read_group(session.duck, session.cer_settings, [plan])
        classes = ElementClasses(table, filter_cols, False)
        item = Statement(0, sql, q, plan)
        prepare([item], classes)
        assert item.shared and item.py_conds.compiled is None
        eager = P.compile_conditions(plan, table)
        for i in range(12):
            binding = {"a": i, "b": i + 1 + i % 5}
            assert [c.fn(binding) for c in item.conds] == [c.fn(binding) for c in eager]
        assert item.py_conds.compiled is not None
    finally:
        con.close()


def test_search_finds_the_first_flip_of_every_ray():
    """The binary search by halving powers of two finds, for up- and down-rays, the rank a scan
    over every rank finds (a binding whose value is NaN: no rank holds an up-ray)."""
    rng = np.random.default_rng(3)
    for trial in range(80):
        n = int(rng.integers(1, 200))
        vals = np.round(rng.normal(0, 4, n), 1)
        vals[rng.random(n) < 0.05] = np.nan
        good = np.flatnonzero(~np.isnan(vals))
        if not len(good):
            continue
        _, first = np.unique(vals[good], return_index=True)
        rep = good[first]  # a row per distinct value, in value order
        u = int(rng.integers(1, 40))
        bound = rng.integers(0, n, u)
        k = float(rng.integers(-3, 4))
        up = bool(trial % 2)

        def vec(b):
            with np.errstate(invalid="ignore"):
                x = vals[b["v"]] - vals[b["w"]]
                return (x > k) if up else (x < k)
        every = vec({"v": np.tile(rep, u), "w": np.repeat(bound, len(rep))}).reshape(u, len(rep))
        flipped = every if up else ~every
        want = np.where(flipped.any(1), flipped.argmax(1), len(rep))
        np.testing.assert_array_equal(O.Evaluator.first_flip(vec, up, "v", rep, {"w": bound}, u), want)
