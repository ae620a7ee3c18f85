"""Conditions over a Kleene iteration (``b[i].price > b[i-1].price``): the syntax and its errors,
and the mechanisms that evaluate them (recomputation, the eager NFA, the lazy NFAs) against the
reference matcher on random data and random patterns, at the operator level and through SQL
(COUNT(*) and projections, PARTITION BY, WITHIN, negation next to the closure)."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import matchrec
from matchrec.errors import NotSupportedError, OperationalError, ProgrammingError
from matchrec.operators import cer_mechanisms as M
from matchrec.operators.cer_reference import (And, Condition, Element, Events, IterationCondition, Or, Pattern, Seq,
                                              reference_matches)
from matchrec.parser import sase as S

# ---------------------------------------------------------------- syntax
HEAD = "PATTERN SEQ(A a, B+ b, C c, D+ d) FROM t WHERE "


def test_iteration_columns_parse():
    q = S.parse(HEAD + "b[i].price > b[i-1].price AND b[i].price > a.price AND b[i].v > 3 AND b[1].price < c.price")
    rising, above_a, first = q.conditions
    assert (rising.left.var, rising.left.index, rising.right.index) == ("b", "i", "i-1")
    assert S.iterated(rising) == {"b"} and S.reads_previous(rising)
    assert S.iterated(above_a) == {"b"} and not S.reads_previous(above_a)
    assert isinstance(first.left, S.Call) and first.left.name == "first" and not S.iterated(first)
    # every iteration of b above 3 is every event of b above 3: a filter DuckDB evaluates
    assert [S.iterated(f) for f in q.filters["b"]] == [{"b"}]


@pytest.mark.parametrize("where, message, col", [
    ("b[i+1].price > 1", "indexed by i", 50),
    ("b[j].price > 1", "indexed by i", 50),
    ("b[0].price > 1", "indexed by i", 50),
    ("a[i].price > b.price", "a is a single event", 48),
    ("b[i].price > d[i].price", "one Kleene variable", 61),
    ("b[i].price > avg(b.price)", "cannot also use an aggregate", 61),
    ("b[i].price > b[1].price", "cannot also use an aggregate", 61),
    ("avg(b[i].x) > 1", "aggregate the variable's events", 52),
    ("x[i].price > 1", "Unknown pattern variable x", 48),
])
def test_bad_iteration_columns(where, message, col):
    with pytest.raises(ProgrammingError) as err:
        S.parse(HEAD + where)
    assert message in str(err.value)
    assert f"Line 1, Col {col}." in str(err.value)


def test_iteration_column_outside_where_and_under_next_match():
    with pytest.raises(ProgrammingError, match=r"available in WHERE.*Line 1, Col 38\."):
        S.parse("PATTERN SEQ(A a, B+ b) FROM t RETURN b[i].x")
    with pytest.raises(NotSupportedError, match=r"not skip-till-next-match.*Line 2, Col 7\."):
        S.parse("PATTERN SEQ(A a, B+ b) FROM t USE skip-till-next-match\nWHERE b[i].x > b[i-1].x")


def test_iteration_condition_semantics():
    val = [5, 1, 2, 3, 3, 9]
    rising = IterationCondition({"b"}, "b", lambda b, p, c: val[c] > val[p], True)
    above_a = IterationCondition({"a", "b"}, "b", lambda b, p, c: val[c] > val[b["a"]], False)
    assert rising.fn({"b": (1,)}) and rising.fn({"b": (1, 2, 3, 5)})
    assert not rising.fn({"b": (1, 3, 4)}) and not rising.fn({"b": (0, 1)})
    assert above_a.fn({"a": 1, "b": (2, 5)}) and not above_a.fn({"a": 2, "b": (2,)})


# ---------------------------------------------------------------- operator level
def _events(rng: random.Random, n: int, types: str):
    parts = rng.random() < 0.3
    ties = rng.random() < 0.3
    rows = []
    for p in range(2 if parts else 1):
        m = n if not parts else rng.randint(n // 2, n)
        if ties:
            keys = sorted(rng.randint(0, m) for _ in range(m))
        else:
            keys = list(itertools.accumulate(rng.randint(1, 3) for _ in range(m)))
        rows += [(p, k, rng.choice(types)) for k in keys]
    key = np.array([r[1] for r in rows], np.int64)
    part = np.array([r[0] for r in rows], np.int64) if parts else None
    val = [None if rng.random() < 0.05 else rng.randint(0, 5) for _ in rows]
    return Events(key, [r[2] for r in rows], part), val


def _gt(x, y):
    return None if x is None or y is None else x > y


def _iteration_conditions(rng: random.Random, var: str, others: list, val: list) -> list:
    out = []
    kind = rng.choice(["rise", "rise", "fall_or_equal", "step", "none"])
    if kind == "rise":
        out.append(IterationCondition({var}, var, lambda b, p, c: _gt(val[c], val[p]), True, f"{var} rises"))
    elif kind == "fall_or_equal":
        out.append(IterationCondition({var}, var, lambda b, p, c: not _gt(val[c], val[p]), True))
    elif kind == "step":  # the current event only, every iteration (not a filter: it reads another variable)
        lim = rng.randint(1, 4)
        out.append(IterationCondition({var}, var, lambda b, p, c, lim=lim: val[c] is not None and val[c] <= lim,
                                      False))
    if others and rng.random() < 0.5:
        o = rng.choice(others)
        out.append(IterationCondition({var, o}, var, lambda b, p, c, o=o: _gt(val[c], val[b[o]]), False,
                                      f"{var}[i] > {o}"))
    if others and rng.random() < 0.2:
        o = rng.choice(others)
        out.append(IterationCondition({var, o}, var, lambda b, p, c, o=o: _gt(val[b[o]] or 0, val[c] - val[p]
                                      if val[c] is not None and val[p] is not None else None), True))
    return out


def iteration_case(seed: int):
    """A skip-till-any-match (or strict) pattern with one or two Kleene elements, each with
    iteration conditions, negations next to them, bounds, and now and then an AND or an OR."""
    rng = random.Random(seed)
    ev, val = _events(rng, rng.randint(3, 12), "abc")
    n = rng.randint(1, 4)
    items = []
    for j in range(n):
        k = rng.choice([(1, None)] * 4 + [(2, None), (1, 2), (2, 3)]) if rng.random() < 0.5 else None
        items.append(Element(rng.choice("abc"), f"v{j}", k))
    if not any(e.kleene for e in items):
        items[rng.randrange(n)] = Element(rng.choice("abc"), f"v{rng.randrange(n)}x", (1, None))
    if rng.random() < 0.4:
        items.insert(rng.randint(0, len(items)), Element(rng.choice("abc"), "n", negated=True))
    singles = [e.var for e in items if not e.kleene and not e.negated]
    conditions = []
    for e in items:
        if e.kleene:
            conditions += _iteration_conditions(rng, e.var, singles, val)
    if rng.random() < 0.15 and any(e.negated for e in items):  # a negation that reads the closure
        k = next(e.var for e in items if e.kleene)
        conditions.append(Condition(frozenset({"n", k}), lambda b, k=k: val[b["n"]] == val[b[k][-1]]))
    root = Seq(tuple(items))
    shape = rng.random()
    if shape < 0.1 and len(items) >= 2 and not any(e.negated for e in items):
        root = And((Seq(tuple(items[:-1])), items[-1]))
    elif shape < 0.2:
        root = Or((root, Element(rng.choice("abc"), "z")))
    strategy = "strict" if rng.random() < 0.15 else "any"
    return Pattern(root, rng.choice([2, 4, 7, 100]), strategy, {}, conditions), ev


def check_seeds(seeds) -> dict:
    """Every mechanism that supports each case returns the reference's matches and count; per
    mechanism, how many cases with at least one match it was checked on."""
    checked: dict = {}
    for seed in seeds:
        pattern, ev = iteration_case(seed)
        want = reference_matches(pattern, ev)
        for name in M.MECHANISMS:
            if M.supports(name, pattern):
                continue
            got = M.run(name, pattern, ev)
            assert got == want, f"seed {seed}: {name}\n{pattern}\nwant {want}\ngot  {got}"
            if seed % 10 == 0:  # column-wise too (a tenth of the cases: the default run stays short)
                assert sorted(M.run_columns(name, pattern, ev).tuples()) == want, f"seed {seed}: {name} columns"
            assert M.count(name, pattern, ev) == len(want), f"seed {seed}: {name} count"
            checked[name] = checked.get(name, 0) + bool(want)
    return checked


def test_mechanisms_agree_with_the_reference():
    checked = check_seeds(range(250))
    assert checked.get("rcep", 0) > 20 and checked.get("eager", 0) > 20


@pytest.mark.slow
def test_mechanisms_agree_with_the_reference_more_seeds():
    checked = check_seeds(range(250, 3000))
    assert checked.get("rcep", 0) > 300


def test_rising_run_is_counted_without_listing():
    """SEQ(a, b+, c) with b rising over 60 rising events: 2^58 - 1 runs between the a and the c,
    counted by dynamic programming (listing them would never end)."""
    n = 60
    ev = Events(np.arange(n, dtype=np.int64), ["a"] + ["b"] * (n - 2) + ["c"])
    val = list(range(n))
    rising = IterationCondition({"b"}, "b", lambda b, p, c: val[c] > val[p], True)
    p = Pattern(Seq((Element("a", "a"), Element("b", "b", (1, None)), Element("c", "c"))), 1000, "any", {}, [rising])
    assert M.count("rcep", p, ev) == 2 ** (n - 2) - 1
    val[5:] = [0] * (n - 5)  # rising only over b's first events: runs within rows 1..4, then any single one
    assert M.count("rcep", p, ev) == 2 ** 4 - 1 + (n - 2 - 4)


def enumeration_case(seed: int):
    """A pattern whose matches rcep lists in bulk: single events around one or two closures with
    rising (or no) iteration conditions, the last single event spread over its candidates, now
    and then two alternatives over the same variables (duplicates to drop) or the closure
    holding the trigger."""
    rng = random.Random(seed)
    ev, val = _events(rng, rng.randint(8, 16), "abbbbcd")
    rise = [lambda b, p, c: _gt(val[c], val[p]), lambda b, p, c: _gt(val[p], val[c])]

    def closure(var: str, others: tuple) -> list:
        out = []
        if rng.random() < 0.8:
            out.append(IterationCondition({var}, var, rng.choice(rise), True, f"{var} monotone"))
        if others and rng.random() < 0.3:
            o = rng.choice(others)
            out.append(IterationCondition({var, o}, var, lambda b, p, c, o=o: _gt(val[c], val[b[o]]), False))
        return out
    shape = rng.choice(["abc", "abc", "abcd", "bc", "ab", "or"])
    a, b, c = Element("a", "a"), Element("b", "b", (1, None)), Element("c", "c")
    if shape == "abc":
        root, conds = Seq((a, b, c)), closure("b", ("a", "c"))
    elif shape == "abcd":  # two closures: their sequences are combined
        root, conds = Seq((a, b, c, Element("d", "d", (1, None)))), closure("b", ("a",)) + closure("d", ("c",))
    elif shape == "bc":  # the trigger's element is the closure's next: a leading closure
        root, conds = Seq((b, c)), closure("b", ())
    elif shape == "ab":  # the closure holds the trigger
        root, conds = Seq((a, b)), closure("b", ("a",))
    else:  # two alternatives binding the same variables
        root = Or((Seq((a, b, c)), Seq((Element("d", "a"), b, c))))
        conds = closure("b", ())
    return Pattern(root, rng.choice([6, 12, 100]), "any", {}, conds), ev


def check_enumeration(seeds) -> tuple[int, int]:
    """rcep's listing of each case against the reference, with the limit on the number of
    matches exact; (cases with a match, matches listed)."""
    listed = cases = 0
    for seed in seeds:
        pattern, ev = enumeration_case(seed)
        want = reference_matches(pattern, ev)
        got = M.run("rcep", pattern, ev)
        assert got == want, f"seed {seed}\n{pattern}\nwant {want}\ngot  {got}"
        if seed % 3 == 0:  # column-wise: the products expanded by numpy, the closure's sequences stored once
            assert sorted(M.run_columns("rcep", pattern, ev).tuples()) == want, f"seed {seed}: columns"
        assert M.count("rcep", pattern, ev) == len(want), f"seed {seed}: count"
        if want:
            assert M.run("rcep", pattern, ev, max_matches=len(want)) == want
            with pytest.raises(OperationalError, match="more than"):
                M.run("rcep", pattern, ev, max_matches=len(want) - 1)
        listed += len(want)
        cases += bool(want)
    return cases, listed


def test_bulk_enumeration_agrees_with_the_reference():
    """rcep's listing (sequences shared between matches, the last single event spread over its
    candidates, the matches built as one product) against the reference."""
    cases, listed = check_enumeration(range(120))
    assert cases > 40 and listed > 400


@pytest.mark.slow
def test_bulk_enumeration_agrees_with_the_reference_more_seeds():
    cases, listed = check_enumeration(range(120, 1500))
    assert cases > 500


# ---------------------------------------------------------------- through SQL
def _table(rng: random.Random, n: int):
    rows = []
    for p in range(2):
        t = 0
        for _ in range(n):
            t += rng.randint(1, 3)
            rows.append((rng.choice("ABC"), t, rng.randint(1, 6), p))
    return rows


def _brute(rows, window, negated: bool, above_a: bool):
    """SEQ(A a, B+ b, [~C n,] C c) PARTITION BY p WHERE b[i].price > b[i-1].price
    [AND b[i].price > a.price] WITHIN window, by enumeration: (a.ts, b's ts, c.ts, sum of b.price)."""
    out = []
    for p in (0, 1):
        part = sorted((r for r in rows if r[3] == p), key=lambda r: r[1])
        a_s = [r for r in part if r[0] == "A"]
        b_s = [r for r in part if r[0] == "B"]
        c_s = [r for r in part if r[0] == "C"]
        for a in a_s:
            for c in c_s:
                if not (a[1] < c[1] and c[1] - a[1] <= window):
                    continue
                pool = [b for b in b_s if a[1] < b[1] < c[1]]
                for size in range(1, len(pool) + 1):
                    for bs in itertools.combinations(pool, size):
                        if any(x[2] <= y[2] for y, x in zip(bs, bs[1:])):
                            continue
                        if above_a and any(x[2] <= a[2] for x in bs):
                            continue
                        if negated and any(bs[-1][1] < x[1] < c[1] for x in c_s):
                            continue
                        out.append((a[1], tuple(x[1] for x in bs), c[1], sum(x[2] for x in bs)))
    return sorted(out)


@pytest.mark.parametrize("seed", [0] + [pytest.param(seed, marks=pytest.mark.slow) for seed in (1, 2, 3)])
def test_sql_rcep_and_eager_agree_with_enumeration(seed):
    rng = random.Random(seed)
    rows = _table(rng, 16)
    con = matchrec.connect(":memory:")
    cur = con.cursor()
    cur.execute("CREATE TABLE t(type VARCHAR, ts BIGINT, price INTEGER, p INTEGER)")
    cur.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    for negated, above_a in [(False, False), (True, seed % 2 == 0)]:
        window = rng.choice([6, 10, 15])
        want = _brute(rows, window, negated, above_a)
        neg = "~C n, " if negated else ""
        where = "b[i].price > b[i-1].price" + (" AND b[i].price > a.price" if above_a else "")
        base = f"PATTERN SEQ(A a, B+ b, {neg}C c) FROM t PARTITION BY p WHERE {where} WITHIN {window}"
        for mech in ("rcep", "eager"):
            cur.execute(f"SET matchrec_cer_mechanism = {mech}")
            cur.execute(base + " RETURN COUNT(*)")
            assert cur.fetchall() == [(len(want),)], (mech, base)
            cur.execute(base + " RETURN a.ts, count(b) AS n, first(b.ts) AS f, last(b.ts) AS l, c.ts, "
                        "sum(b.price) AS s")
            got = sorted((r[0], r[1], r[2], r[3], r[4], r[5]) for r in cur.fetchall())
            assert got == sorted((a, len(bs), bs[0], bs[-1], c, s) for a, bs, c, s in want), (mech, base)
    con.close()


def test_auto_choice_is_recomputation_and_explain_shows_the_condition():
    con = matchrec.connect(":memory:")
    cur = con.cursor()
    cur.execute("CREATE TABLE t AS SELECT CASE WHEN i % 10 = 0 THEN 'A' WHEN i % 10 = 9 THEN 'C' ELSE 'B' END "
                "AS type, i AS ts, (i * 7) % 13 AS price FROM range(200) r(i)")
    cur.execute("EXPLAIN PATTERN SEQ(A a, B+ b, C c) FROM t WHERE b[i].price > b[i-1].price WITHIN 9 "
                "RETURN COUNT(*)")
    text = "\n".join(str(x) for r in cur.fetchall() for x in r)
    assert "rcep" in text and "b[i].price > b[i-1].price" in text
    con.close()


def test_run_many_keeps_rising_and_falling_apart():
    """A workload whose statements differ only in b[i] against b[i-1]: each gets its own result."""
    rng = random.Random(5)
    con = matchrec.connect(":memory:")
    cur = con.cursor()
    cur.execute("CREATE TABLE t(type VARCHAR, ts BIGINT, price INTEGER, p INTEGER)")
    rows = _table(rng, 14)
    cur.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    stmts = [f"PATTERN SEQ(A a, B+ b, C c) FROM t PARTITION BY p WHERE {w} WITHIN 12 RETURN COUNT(*)"
             for w in ("b[i].price > b[i-1].price", "b[i-1].price > b[i].price")]
    alone = []
    for s in stmts:
        cur.execute(s)
        alone.append(cur.fetchall()[0][0])
    assert alone[0] == len(_brute(rows, 12, False, False)) and alone[0] != alone[1]
    many = matchrec.run_many(con, stmts)
    assert [t.column(0).to_pylist()[0] for t in many.tables] == alone
    con.close()


# ---------------------------------------------------------------- the result table, column-wise
def test_columns_of_products_are_their_combinations():
    """cer_columns.build against itertools.product: single rows and Kleene sequences fixed or
    chosen, lists shared between products, variables absent from some products, empty products."""
    from matchrec.operators import cer_columns as C
    rng = random.Random(11)
    def seq(most: int) -> tuple:
        return tuple(sorted(rng.sample(range(40), rng.randint(1, most))))
    for _ in range(200):
        shared = [seq(4) for _ in range(rng.randint(1, 4))]
        products, want = [], []
        for _ in range(rng.randint(0, 5)):
            items = {"a": rng.randrange(40)} if rng.random() < 0.7 else {}
            choices = []
            if rng.random() < 0.8:
                choices.append(("b", shared if rng.random() < 0.5 else
                                [seq(3) for _ in range(rng.randint(0, 3))]))
            else:
                items["b"] = rng.choice(shared)
            if rng.random() < 0.6:
                choices.append(("c", rng.sample(range(40), rng.randint(1, 4))))
            products.append((tuple(sorted(items.items())), choices))
            for combo in itertools.product(*(vs for _, vs in choices)):
                want.append(tuple(sorted({**items, **{v: x for (v, _), x in zip(choices, combo)}}.items())))
        tuples = [(("a", rng.randrange(40)), ("b", rng.choice(shared))) for _ in range(rng.randint(0, 3))]
        got = C.build(tuples, products)
        assert sorted(got.tuples()) == sorted(tuples + want)
        assert sorted(got.ordered().tuples()) == sorted(tuples + want)
        assert len(got.seqs.get("b", [])) <= len({x for m in tuples + want for v, x in m if v == "b"})


def _projection_table(rng: random.Random, n: int):
    rows = []
    for p in range(2):
        t = 0
        for _ in range(n):
            t += rng.randint(1, 3)
            v = None if rng.random() < 0.2 else rng.randint(-5, 9)
            f = rng.choice([0.1, 0.25, 1.5, -2.0, 1e16, 3.0])
            rows.append((rng.choice("ABC"), t, rng.randint(1, 6), v, f, p))
    return rows


def _expected_projections(rows, window: int) -> list:
    """SEQ(A a, B+ b, C c) PARTITION BY p WHERE b[i].price > b[i-1].price WITHIN window, per match
    in plain Python with SQL's NULLs: (a.p, a.ts, count(b), b.ts, first(b.v), last(b.v), min(b.v),
    max(b.v), sum(b.v), sum(b.f), avg(b.f), max(b.f), c.v - a.v, 7)."""
    out = []
    for p in (0, 1):
        part = sorted((r for r in rows if r[5] == p), key=lambda r: r[1])
        for a in (r for r in part if r[0] == "A"):
            for c in (r for r in part if r[0] == "C" and a[1] < r[1] and r[1] - a[1] <= window):
                pool = [r for r in part if r[0] == "B" and a[1] < r[1] < c[1]]
                for size in range(1, len(pool) + 1):
                    for bs in itertools.combinations(pool, size):
                        if any(x[2] <= y[2] for y, x in zip(bs, bs[1:])):
                            continue
                        vs = [x[3] for x in bs if x[3] is not None]
                        fs = [x[4] for x in bs]
                        out.append((p, a[1], len(bs), [x[1] for x in bs], bs[0][3], bs[-1][3],
                                    min(vs) if vs else None, max(vs) if vs else None, sum(vs) if vs else None,
                                    sum(fs), sum(fs) / len(fs), max(fs),
                                    None if a[3] is None or c[3] is None else c[3] - a[3], 7))
    return out


@pytest.mark.parametrize("seed", [0, 1] + [pytest.param(seed, marks=pytest.mark.slow) for seed in range(2, 12)])
def test_result_table_is_built_column_wise_as_per_match(seed):
    """Projections over a Kleene variable (its list, count, first, last, min, max and sums over
    a nullable integer and a float column), over two variables and over none, through SQL for
    every mechanism that takes the statement, against a per-match evaluation; rows in the order
    of their first event."""
    rng = random.Random(100 + seed)
    want = []
    while not want:  # draw again until the table has matches, so every seed checks some rows
        rows = _projection_table(rng, rng.randint(8, 14))
        window = rng.choice([5, 8, 12])
        want = sorted(_expected_projections(rows, window), key=repr)
    con = matchrec.connect(":memory:")
    cur = con.cursor()
    cur.execute("CREATE TABLE t(type VARCHAR, ts BIGINT, price INTEGER, v INTEGER, f DOUBLE, p INTEGER)")
    cur.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", rows)
    query = (f"PATTERN SEQ(A a, B+ b, C c) FROM t PARTITION BY p WHERE b[i].price > b[i-1].price WITHIN {window} "
             "RETURN a.p, a.ts, count(b) AS n, b.ts, first(b.v) AS fv, last(b.v) AS lv, min(b.v) AS lo, "
             "max(b.v) AS hi, sum(b.v) AS sv, sum(b.f) AS sf, avg(b.f) AS af, max(b.f) AS mf, c.v - a.v AS d, 7 AS k")
    ran = 0
    for mech in ("eager", "rcep", "chain", "tree"):
        cur.execute(f"SET matchrec_cer_mechanism = {mech}")
        try:
            cur.execute(query)
        except NotSupportedError:
            continue
        got = cur.fetchall()
        assert sorted(got, key=repr) == want, mech
        assert [r[:2] for r in got] == sorted(r[:2] for r in got), mech  # first event order
        ran += 1
    assert ran >= 2 and want
    con.close()


def test_float_sums_round_as_python_sum():
    """A Kleene variable's float sum is added left to right, as the per-match evaluation's sum()
    (numpy's add.reduceat adds pairwise and rounds differently on long segments)."""
    from matchrec.engine.cer_result import _float_sums
    rng = random.Random(3)
    segs = [[rng.choice([0.1, 1e16, -3.3, 2.5e-3, 7.0, 1 / 3]) for _ in range(rng.randint(1, 25))] for _ in range(500)]
    lengths = np.array([len(s) for s in segs])
    flat = np.array([x for s in segs for x in s])
    assert _float_sums(flat, np.r_[0, np.cumsum(lengths)[:-1]], lengths).tolist() == [sum(s) for s in segs]


# ---------------------------------------------------------------- listing as arrays
def block_case(seed: int):
    """SEQ(a, b+, c) with the closure's conditions reading its previous event, the current one
    alone or c's event (never a: then the closure is bound last), filters on a and c now and
    then, over one or two partitions with ties or not: the shape rcep lists as arrays."""
    rng = random.Random(seed)
    ev, val = _events(rng, rng.randint(10, 24), rng.choice(["abc", "abbbc", "aabbbcc"]))
    conds = []
    kind = rng.choice(["rise", "rise", "fall", "none"])
    if kind == "rise":
        conds.append(IterationCondition({"b"}, "b", lambda b, p, c: _gt(val[c], val[p]), True))
    elif kind == "fall":
        conds.append(IterationCondition({"b"}, "b", lambda b, p, c: not _gt(val[c], val[p]), True))
    if rng.random() < 0.3:
        lim = rng.randint(1, 5)
        conds.append(IterationCondition({"b"}, "b", lambda b, p, c: val[c] is not None and val[c] <= lim, False))
    if rng.random() < 0.3:
        conds.append(IterationCondition({"b", "c"}, "b", lambda b, p, c: _gt(val[b["c"]], val[c]), False))
    filters = {}
    if rng.random() < 0.4:
        filters["a"] = np.array([v is not None and v <= 2 for v in val], bool)
    if rng.random() < 0.4:
        filters["c"] = np.array([v is not None and v >= 2 for v in val], bool)
    root = Seq((Element("a", "a"), Element("b", "b", (1, None)), Element("c", "c")))
    if rng.random() < 0.25:  # a second alternative over other variables: blocks of two closures
        root = Or((root, Seq((Element("c", "x"), Element("b", "y", (1, None)), Element("a", "z")))))
        conds.append(IterationCondition({"y"}, "y", lambda b, p, c: _gt(val[p], val[c]), True))
    return Pattern(root, rng.choice([3, 6, 10, 100]), "any", filters, conds), ev


def check_blocks(seeds) -> int:
    """rcep's array listing (tuples and columns) against the eager NFA and the reference; how
    many matches it listed as arrays."""
    from matchrec.operators import cer_common
    listed = [0]
    original = cer_common.Sink.add_block

    def add_block(sink, chain, binding, *args):
        listed[0] += len(args[3])
        original(sink, chain, binding, *args)
    cer_common.Sink.add_block = add_block
    try:
        for seed in seeds:
            pattern, ev = block_case(seed)
            want = reference_matches(pattern, ev)
            assert M.run("eager", pattern, ev) == want, f"seed {seed}: eager"
            assert M.run("rcep", pattern, ev) == want, f"seed {seed}: rcep"
            got = M.run_columns("rcep", pattern, ev)
            assert sorted(got.tuples()) == want, f"seed {seed}: rcep columns"
            assert got.ordered().tuples() == M.run_columns("eager", pattern, ev).ordered().tuples(), f"seed {seed}"
            if want:
                with pytest.raises(OperationalError, match="more than"):
                    M.run("rcep", pattern, ev, max_matches=len(want) - 1)
    finally:
        cer_common.Sink.add_block = original
    return listed[0]


def test_array_listing_agrees_with_eager(monkeypatch):
    assert check_blocks(range(60)) > 300
    from matchrec.operators import cer_kleene
    monkeypatch.setattr(cer_kleene, "_LISTED_AT_ONCE", 0)  # every block sized and charged before it is listed
    assert check_blocks(range(60, 80)) > 50


@pytest.mark.slow
def test_array_listing_agrees_with_eager_more_seeds():
    assert check_blocks(range(60, 1000)) > 5000


def test_sequence_ranks_tie_equal_sequences():
    """Equal sequences (one table may hold a sequence twice) rank equal, whether sorted padded or as tuples."""
    from matchrec.operators import cer_columns as C
    rng = random.Random(5)
    seqs = [tuple(sorted(rng.sample(range(9), rng.randint(1, 4)))) for _ in range(300)]
    flat = np.array([x for s in seqs for x in s], np.int64)
    offsets = np.r_[0, np.cumsum([len(s) for s in seqs])].astype(np.int64)
    distinct = sorted(set(seqs))
    want = [distinct.index(s) for s in seqs]
    assert C._ranks(C.Sequences(flat, offsets)).tolist() == want
    saved = C._PADDED_MAX
    C._PADDED_MAX = 0
    try:
        assert C._ranks(C.Sequences(flat, offsets)).tolist() == want
    finally:
        C._PADDED_MAX = saved
