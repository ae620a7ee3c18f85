"""The CER planner's choice of mechanism by estimated cost (planner.cer.costs / choice), EXPLAIN's
list of candidates, forced mechanisms against auto on random data, and the tree NFA's plan per
instance against the reference matcher."""
from __future__ import annotations

import random
import re

import numpy as np
import pyarrow as pa
import pytest

from matchrec.operators import cer_lazy as L
from matchrec.operators import cer_mechanisms as M
from matchrec.operators.cer_common import Prepared
from matchrec.operators.cer_reference import And, Condition, Element, Events, Pattern, Seq, reference_matches
from matchrec.planner.cer import costs as C
from matchrec.planner.cer.plan import MECHANISMS


def table(con, name: str, n: int, rates: dict, seed: int = 1, segments: list | None = None) -> None:
    rng = np.random.default_rng(seed)
    parts = segments or [rates]
    cuts = np.linspace(0, n, len(parts) + 1).astype(int)
    types = []
    for (lo, hi), r in zip(zip(cuts, cuts[1:]), parts):
        names = sorted(r)
        p = np.array([r[t] for t in names], float)
        types.append(np.array(names, object)[rng.choice(len(names), hi - lo, p=p / p.sum())])
    con.register("__src", pa.table({"ts": np.cumsum(rng.integers(1, 10, n)), "type": np.concatenate(types).tolist(),
                                    "g": rng.integers(0, 10, n), "v": rng.integers(0, 100, n),
                                    "p": rng.integers(0, 2, n)}))
    con.cursor().execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM __src")
    con.unregister("__src")


def explain(con, sql: str) -> str:
    return con.cursor().execute("EXPLAIN " + sql).fetchall()[0][1]


def chosen(text: str) -> str:
    return re.search(r"matcher: mechanism (\w+)", text).group(1)


def candidates(text: str) -> dict:
    """mechanism -> estimated seconds (None: excluded), from EXPLAIN's estimates."""
    out = {}
    for m, rest in re.findall(r"\n +mechanism (\w+)(?: \(chosen\))?: (.*)", text):
        hit = re.match(r"estimated cost ([0-9.e+]+) ms", rest)
        out[m] = float(hit.group(1)) / 1000 if hit else None
    return out


# ---------------------------------------------------------------- the choice follows the estimates
def test_every_mechanism_is_listed_with_its_cost_or_why_not(con):
    table(con, "uni", 20_000, {t: 1 for t in "ABCDE"})
    text = explain(con, "PATTERN SEQ(A a, B b, C c) FROM uni WHERE a.g = c.g WITHIN 60")
    cands = candidates(text)
    assert set(cands) == set(MECHANISMS) and all(c is not None for c in cands.values()), text
    assert text.count("(chosen)") == 1 and f"mechanism {chosen(text)} (chosen): estimated cost" in text
    # many partial matches at uniform rates: the batch operator's arrays are estimated cheapest
    assert chosen(text) == "batch" and cands["batch"] == min(cands.values())
    assert min(cands[m] for m in ("chain", "tree", "eager", "rcep")) > 3 * cands["batch"], text
    # strict contiguity: the batch operator and recomputation say why they cannot run it
    text = explain(con, "PATTERN SEQ(A a, B b, C c) FROM uni USE strict-contiguity WITHIN 60")
    assert re.search(r"mechanism batch: excluded, evaluates skip-till-any-match only, not strict", text), text
    assert re.search(r"mechanism rcep: excluded, .*skip-till-any-match", text), text
    cands = candidates(text)
    assert chosen(text) == "eager" and cands["eager"] == min(c for c in cands.values() if c is not None), text


def test_an_and_of_rare_types_goes_to_a_lazy_nfa(con):
    # the batch operator expands AND into its 24 permutations; the lazy NFAs search one partial order
    table(con, "rare", 40_000, {"A": 1, "B": 1, "C": 1, "D": 1, "E": 246})
    text = explain(con, "PATTERN AND(A a, B b, C c, D d) FROM rare WITHIN 400")
    cands = candidates(text)
    assert chosen(text) in ("chain", "tree"), text
    assert cands[chosen(text)] == min(c for c in cands.values() if c is not None)
    assert cands["batch"] > 3 * cands["chain"] and "over 24 alternative(s)" in text, text
    assert "least estimated cost" in text


def test_a_kleene_closure_returned_goes_to_recomputation(con):
    table(con, "uni", 20_000, {t: 1 for t in "ABCDE"})
    text = explain(con, "PATTERN SEQ(A a, B+ b, C c) FROM uni WITHIN 25")
    assert chosen(text) == "rcep", text
    assert "mechanism batch: excluded, Kleene closure with its matches returned" in text
    # counted between two single events, the batch operator counts the closure itself
    text = explain(con, "PATTERN SEQ(A a, B+ b, C c) FROM uni WITHIN 25 RETURN COUNT(*)")
    assert candidates(text)["batch"] is not None, text


def test_a_counted_closure_in_crowded_partitions_goes_to_recomputation(con):
    """One busy partition (12,000 events, a B nearly every key unit, values rising with time) among
    400 quiet ones of three events: the average rate puts few B in a window, but the B of the busy
    partition have about 14 in reach, and the event sets a chain NFA enumerates grow exponentially
    with them (2^14 sets between an A and a C there). With the average rate the chain was estimated
    cheapest and took seconds; the planner now sees the rate in each event's own partition
    (EXPLAIN says how crowded), so the count goes to recomputation, which does not enumerate the
    sets. The forced mechanisms count the same on a smaller window."""
    rng = np.random.default_rng(3)
    busy, quiet = 12_000, 400
    part = np.r_[np.zeros(busy, int), np.repeat(np.arange(1, quiet + 1), 3)]
    bts = np.sort(rng.integers(0, busy, busy))
    ts = np.r_[bts, rng.integers(0, 6000, 3 * quiet)]
    types = np.r_[rng.choice(["A", "B", "C"], busy, p=[0.05, 0.9, 0.05]), np.tile(["A", "B", "C"], quiet)]
    v = np.r_[bts * 10 + rng.integers(0, 5, busy), rng.integers(0, 100, 3 * quiet)]
    con.register("__src", pa.table({"ts": ts, "type": types.tolist(), "p": part, "v": v}))
    con.cursor().execute("CREATE OR REPLACE TABLE crowd AS SELECT * FROM __src")
    con.unregister("__src")
    sql = "PATTERN SEQ(A a, B+ b, C c) FROM crowd PARTITION BY p WHERE b[i].v > b[i-1].v WITHIN {} RETURN COUNT(*)"
    text = explain(con, sql.format(16))
    assert chosen(text) == "rcep", text
    crowd = float(re.search(r"B\+ b: .*its events see (\d+\.\d)x the average rate", text).group(1))
    assert crowd > 10, text
    cands = candidates(text)
    assert cands["chain"] > 2 * cands["rcep"], text
    counts = set()
    for m in ("rcep", "chain", "auto"):
        con.cursor().execute(f"SET matchrec_cer_mechanism = {m}")
        counts.add(con.cursor().execute(sql.format(6)).fetchall()[0][0])
    assert len(counts) == 1 and counts.pop() > 500


def test_a_closure_in_bursts_around_its_anchors_is_counted_from_a_sample(con):
    """No partitions, but the B come in bursts of 16 around each of 2,000 A: the average rate puts
    0.7 B in a window, so the chain NFA looks cheapest, but each A has about 2^16 sets of B in reach.
    Having chosen a mechanism that enumerates the closure for a count, the planner counts the B
    within the window of 64 sampled A (EXPLAIN shows it), and the count goes to recomputation."""
    rng = np.random.default_rng(5)
    anchors = np.sort(rng.choice(np.arange(100, 999_900, 50), 2000, replace=False))
    bursts = (anchors[:, None] + rng.integers(-5, 6, (2000, 16))).ravel()
    ts = np.r_[anchors, bursts, rng.integers(0, 1_000_000, 100)]
    types = ["A"] * 2000 + ["B"] * len(bursts) + ["C"] * 100
    con.register("__src", pa.table({"ts": ts, "type": types, "v": rng.integers(0, 100, len(ts))}))
    con.cursor().execute("CREATE OR REPLACE TABLE bursts AS SELECT * FROM __src")
    con.unregister("__src")
    sql = "PATTERN AND(A a, B+ b) FROM bursts WITHIN {} RETURN COUNT(*)"
    text = explain(con, sql.format(10))
    assert chosen(text) == "rcep", text
    got = re.search(r"B\+ b: .*in reach around (\d+) sampled candidates of a: ([0-9.]+) before and ([0-9.]+) after", text)
    assert got and int(got.group(1)) == 64 and float(got.group(2)) + float(got.group(3)) > 12, text
    # returning rows, every mechanism enumerates the sets: the choice stays with the rates
    assert "sampled candidates" not in explain(con, sql.format(10).replace("COUNT(*)", "a.ts"))
    counts = set()
    for m in ("rcep", "chain", "auto"):
        con.cursor().execute(f"SET matchrec_cer_mechanism = {m}")
        counts.add(con.cursor().execute(sql.format(1)).fetchall()[0][0])
    con.cursor().execute("SET matchrec_cer_mechanism = auto")
    assert len(counts) == 1 and counts.pop() > 50


def test_cost_model_orders():
    """The cost functions on a model: rarest-first beats the written order, a wider window costs
    more, AND's permutations cost the batch operator more than one partial order costs the chain."""
    a, b, c = Element("A", "a"), Element("B", "b"), Element("C", "c")
    n = ({"a": 5000.0, "b": 5000.0, "c": 10.0}, {"a": 5000.0, "b": 5000.0, "c": 10.0})

    def model(w, strategy="any"):
        lam = tuple({v: x * w for v, x in h.items()} for h in n)
        return C.Model(n, lam, {"a": .5, "b": .5, "c": .001}, (), 10_010.0, strategy, True)
    seq = Seq((a, b, c))
    chain = C.cost_chain(model(0.01), seq)[0]
    eager = C.cost_eager(model(0.01), seq)[0]
    assert chain < eager / 5  # 20 instances of c against 10,000 of a
    assert C.cost_chain(model(0.02), seq)[0] > chain  # a wider window reaches more events
    conj = And((a, b, c))
    assert C.cost_batch(model(0.01), conj, True)[1].endswith("over 6 alternative(s), cheapest order each")
    assert C.cost_batch(model(0.01), conj, True)[0] > C.cost_batch(model(0.01), seq, True)[0]
    assert C.subsets(3.0, (1, None)) == pytest.approx(7.0) and C.subsets(4.0, (2, 2)) == pytest.approx(6.0)
    # iteration conditions holding for half the consecutive pairs: sets of k events pass with 0.5^(k-1)
    assert C.subsets(3.0, (1, None), 0.5) == pytest.approx(3 + 3 * 0.5 + 0.25)
    assert C.subsets(4.0, (2, 3), 0.5) == pytest.approx(6 * 0.5 + 4 * 0.25)


def test_forced_mechanism_is_reported_with_the_estimates(con):
    table(con, "uni", 5_000, {t: 1 for t in "ABC"})
    con.cursor().execute("SET matchrec_cer_mechanism = tree")
    text = explain(con, "PATTERN SEQ(A a, B b) FROM uni WITHIN 20")
    assert "matcher: mechanism tree" in text and "reason: forced by SET matchrec_cer_mechanism" in text
    assert "mechanism tree (chosen): estimated cost" in text and len(candidates(text)) == 5


def test_explain_analyze_keeps_the_candidates(con):
    table(con, "uni", 5_000, {t: 1 for t in "ABC"})
    text = explain(con, "ANALYZE PATTERN SEQ(A a, B b) FROM uni WITHIN 20")
    assert "Analyze: events read" in text and len(candidates(text)) == 5 and "(chosen)" in text


def test_a_forced_mechanism_plans_without_the_condition_sample(con):
    """Forced, the conditions' selectivity (only the costs read it) is not sampled and nothing is
    costed; the estimates the run reads (candidates, order, filtering) stay those of auto, and
    EXPLAIN of the forced statement still shows the sampled selectivity."""
    from matchrec.engine.mechanisms import mechanisms
    from matchrec.parser import sase
    from matchrec.planner.cer import CerSettings, plan_query
    table(con, "uni", 5_000, {"A": 1, "B": 5, "C": 2})
    duck = con.session.duck
    for sql in ("PATTERN SEQ(A a, B b, C c) FROM uni WHERE a.v < c.v WITHIN 40",
                "PATTERN AND(A a, B b, C c) FROM uni WHERE a.v < 50 AND b.v > a.v WITHIN 30"):
        auto = plan_query(duck, sase.parse(sql), CerSettings(), mechanisms())
        forced = plan_query(duck, sase.parse(sql), CerSettings(mechanism="chain"), mechanisms())
        assert all(s is not None for s in auto.stats.condition_selectivity)
        assert forced.stats.condition_selectivity == [None] * len(auto.stats.condition_selectivity)
        assert all(c is None for _, c, _ in forced.candidates) and forced.mechanism == "chain"
        assert forced.stats.estimates == pytest.approx(auto.stats.estimates)
        assert forced.stats.filter_selectivity == pytest.approx(auto.stats.filter_selectivity)
        assert (forced.anchors, forced.filtering) == (auto.anchors, auto.filtering)
        cur = con.cursor()
        cur.execute("SET matchrec_cer_mechanism = chain")
        text = explain(con, sql)
        cur.execute("SET matchrec_cer_mechanism = auto")
        assert "not estimated" not in text and len(candidates(text)) == 5, text
        assert all(c is not None for c in candidates(text).values()), text


def test_the_rows_test_leaves_out_filtered_elements_of_a_type_read_whole(con):
    """A filtered element whose type another element reads unfiltered adds no row to the read:
    its test is left out; a filtered element of a type read nowhere else keeps its test, and the
    rows kept are the same as with every test."""
    from matchrec.engine.mechanisms import mechanisms
    from matchrec.parser import sase
    from matchrec.planner.cer import CerSettings, plan_query
    from matchrec.planner.cer.plan import rows_test
    table(con, "rt", 3_000, {"A": 1, "B": 2, "C": 3, "D": 1})
    duck = con.session.duck
    plans = [plan_query(duck, sase.parse(sql), CerSettings(), mechanisms()) for sql in (
        "PATTERN SEQ(A a, B b) FROM rt WHERE b.v > 90 AND a.v < 5 WITHIN 40",
        "PATTERN SEQ(B b, C c) FROM rt WHERE c.v > 50 WITHIN 40")]
    test = rows_test(plans)
    assert "'B'" in test and "'A'" in test and "> 90" not in test and "< 5" in test and "> 50" in test, test
    every = " OR ".join(f"({p.element_test(v)})" for p in plans for v in p.query.elements)
    count = "SELECT count(*) FROM rt WHERE {}"
    assert duck.execute(count.format(test)).fetchall() == duck.execute(count.format(every)).fetchall()


# ---------------------------------------------------------------- forced mechanisms agree with auto
QUERIES = [
    "PATTERN SEQ(A a, B b, C c) FROM r WHERE a.g = c.g WITHIN 30",
    "PATTERN SEQ(A a, ~B n, C c) FROM r PARTITION BY p WITHIN 25",
    "PATTERN AND(A a, B b, C c) FROM r WHERE a.v < b.v WITHIN 20",
    "PATTERN SEQ(A a, B+ b, C c) FROM r WITHIN 12",
    "PATTERN SEQ(A a, OR(B b, C c), D d) FROM r WITHIN 25",
    "PATTERN SEQ(A a, B b) FROM r USE skip-till-next-match WITHIN 30",
    "PATTERN SEQ(A a, B b, C c) FROM r USE strict-contiguity WITHIN 40",
]


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_forced_mechanisms_return_what_auto_returns(con, seed):
    rng = random.Random(seed)
    rates = {t: rng.choice([1, 1, 3, 10]) for t in "ABCD"}
    table(con, "r", 400, rates, seed=seed)
    cur = con.cursor()
    for q in QUERIES:
        strategy_any = "USE" not in q
        cur.execute("SET matchrec_cer_mechanism = auto")
        want = sorted(cur.execute(q + " RETURN a.ts").fetchall())
        count = cur.execute(q + " RETURN COUNT(*)").fetchall()[0][0]
        assert count == len(want)
        for m in MECHANISMS:
            if m in ("batch", "rcep") and not strategy_any:
                continue
            cur.execute(f"SET matchrec_cer_mechanism = {m}")
            assert sorted(cur.execute(q + " RETURN a.ts").fetchall()) == want, (q, m)
    cur.execute("SET matchrec_cer_mechanism = auto")


# ---------------------------------------------------------------- the tree's plan per instance
def bursty(rng: random.Random, n: int, segment: int) -> Events:
    """Types whose rates swap every ``segment`` events: b rare then c rare; a rare throughout."""
    key, typ, k = [], [], 0
    for i in range(n):
        k += rng.randint(1, 2)
        key.append(k)
        rare_b = (i // segment) % 2 == 0
        x = rng.random()
        typ.append("a" if x < 0.08 else ("b" if (x < 0.12) == rare_b else "c"))
    return Events(np.array(key, np.int64), typ)


def test_the_tree_plans_each_instance_from_its_window():
    rng = random.Random(4)
    ev = bursty(rng, 600, 100)
    a, b, c = Element("a", "x"), Element("b", "y"), Element("c", "z")
    p = Pattern(And((a, b, c)), 12, "any")
    prep = Prepared(p, ev, partial=True)
    chain, part = prep.chains[0], prep.parts[0]
    anchor = 0  # a: the rarest overall
    keys = part.cands(chain.elements[anchor]).keys
    counts = L.instance_counts(prep, chain, part, anchor, keys)
    plans = [tuple(L.instance_order(chain, anchor, {i: int(counts[i][j]) for i in counts})) for j in range(len(keys))]
    # b's and c's rates swap between segments: the second element follows what is rare around each a
    assert {pl[1] for pl in plans} == {1, 2}
    for j, pl in enumerate(plans):
        assert counts[pl[1]][j] <= counts[pl[2]][j]
    want = reference_matches(p, ev)
    assert want and M.run("tree", p, ev) == want and M.count("tree", p, ev) == len(want)


@pytest.mark.parametrize("block", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_tree_per_instance_equals_the_reference(block):
    for seed in range(block * 40, block * 40 + 40):
        rng = random.Random(seed)
        ev = bursty(rng, rng.randint(15, 45), rng.randint(3, 12))
        items = [Element(t, f"v{i}", (1, 3) if rng.random() < 0.15 else None) for i, t in
                 enumerate(rng.choice(["abc", "acb", "cab", "ab", "abca"]))]
        if rng.random() < 0.3:
            items.insert(1, Element(rng.choice("abc"), "n", negated=True))
        root = And(tuple(items)) if rng.random() < 0.4 and not any(e.negated for e in items) else Seq(tuple(items))
        val = np.array([rng.randint(0, 3) for _ in range(len(ev))])
        conds = []
        if rng.random() < 0.5:
            vs = sorted(e.var for e in items if not e.negated and e.kleene is None)[:2]
            if len(vs) == 2:
                conds.append(Condition(frozenset(vs), lambda bd, x=vs[0], y=vs[1]: val[bd[x]] <= val[bd[y]]))
        p = Pattern(root, rng.choice([4, 8, 14]), rng.choice(["any", "any", "next", "strict"]), {}, conds)
        want = reference_matches(p, ev)
        for options in (None, {"seed": seed}):
            assert M.run("tree", p, ev, options=options) == want, (seed, options, p)
            assert M.count("tree", p, ev, options=options) == len(want), (seed, options)


def test_a_tree_of_kleene_elements_only_plans_per_partition():
    ev = Events(np.arange(10, dtype=np.int64), list("abababbaab"), np.array([0] * 5 + [1] * 5))
    p = Pattern(Seq((Element("a", "x", (1, None)), Element("b", "y", (1, 2)))), 4, "any")
    assert M.run("tree", p, ev) == reference_matches(p, ev)
