"""Aggregated partial matches in the shared operator (``Evaluator.aggregate_extend``).

Counted workloads over dense random streams, where several events of each type lie in a window
(so partial matches that later steps cannot tell apart are many): ``run_many``'s counts, with
the aggregation on, equal the NFA mechanisms' (lazy chain, recomputation, eager) and the shared
operator's with it off; both directions of extension (at the sequence's end and at its start)
and the paths that read the weights (counted leaves, ranked conditions, negations, counted
Kleene closures) are taken. Plain sequences, which are counted in closed form
(``operators.cer_sequences``) otherwise, go through the nodes here; the closed form has its own
tests at the end.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pytest

import matchrec
from matchrec.engine import multi_eval
from matchrec.operators import cer_shared as O
from tests.test_multi_pattern import alone, by_nodes

TYPES = "ABCDE"


@pytest.fixture(autouse=True)
def nodes_only(request, monkeypatch):
    """Every test but the closed form's evaluates plain sequences by nodes too."""
    if "closed_form" not in request.node.name:
        by_nodes(monkeypatch)


def dense_table(con, rng: random.Random) -> None:
    n = rng.randint(250, 450)
    weights = [rng.uniform(0.3, 3) for _ in TYPES]  # skewed: a rare type draws the plan's first step
    if rng.random() < 0.5:
        ts = sorted(rng.randint(0, n // 2) for _ in range(n))  # many equal keys
    else:
        ts = list(range(0, 2 * n, 2))
    table = pa.table({
        "ts": pa.array(ts, pa.int64()),
        "type": pa.array(rng.choices(TYPES, weights, k=n), pa.string()),
        "price": pa.array([None if rng.random() < 0.04 else rng.randint(0, 40) for _ in range(n)], pa.int64()),
        "p": pa.array([rng.randint(0, 1) for _ in range(n)], pa.int64()),
    })
    con.register("__arrow_in", table)
    con.cursor().execute("CREATE OR REPLACE TABLE ev AS SELECT * FROM __arrow_in")
    con.unregister("__arrow_in")


def statement(rng: random.Random) -> str:
    k = rng.choice([3, 4, 4, 5])
    names = [f"e{j}" for j in range(k)]
    parts, where = [], []
    kleene = False
    for j, v in enumerate(names):
        t = rng.choice(TYPES)
        r = rng.random()
        if j == k - 1 and r < 0.2:
            parts.append(f"{t}+ {v}")
            kleene = True
        elif j == 0 and r < 0.1:
            parts.append(f"{t}+ {v}")
            kleene = True
        elif 0 < j < k - 1 and r < 0.15:
            parts.append(f"~{t} {v}")
        else:
            parts.append(f"{t} {v}")
    plain = [v for p, v in zip(parts, names) if "+" not in p and "~" not in p]
    if len(plain) >= 2 and rng.random() < 0.5:
        a, b = sorted(rng.sample(plain, 2), key=plain.index)
        where.append(rng.choice([f"{b}.price > {a}.price", f"{b}.price - {a}.price < 10", f"{a}.p = {b}.p"]))
    if plain and rng.random() < 0.2:
        where.append(f"{rng.choice(plain)}.price < 30")
    w = f" WHERE {' AND '.join(where)}" if where else ""
    within = rng.choice([6, 8] if kleene else [12, 20, 30])
    part = " PARTITION BY p" if rng.random() < 0.2 else ""
    return f"PATTERN SEQ({', '.join(parts)}) FROM ev TYPE type{part} ORDER BY ts{w} WITHIN {within} RETURN COUNT(*)"


def record_aggregations(monkeypatch) -> list:
    """Each aggregated extension from now on: (the end it extends, whether its parents were
    aggregated themselves)."""
    taken = []
    real = O.Evaluator.aggregate_extend

    def spy(self, node, pm, a, counts):
        done = real(self, node, pm, a, counts)
        if done:
            taken.append(("end" if node.pred is not None else "start", pm.w is not None))
        return done
    monkeypatch.setattr(O.Evaluator, "aggregate_extend", spy)
    return taken


@pytest.mark.parametrize("seed", range(4))
def test_aggregated_counts_equal_the_nfa_mechanisms_and_the_operator_without_it(seed, monkeypatch):
    rng = random.Random(seed)
    con = matchrec.connect()
    taken = record_aggregations(monkeypatch)
    # The plan search stops after a share of the evaluation time it expects, at least SEARCH_MIN
    # seconds: in a cold process (the kernels compiled on first use) that cut it short on some
    # seeds and left a plan with nothing to aggregate. A longer floor lets it finish.
    monkeypatch.setattr(multi_eval, "SEARCH_MIN", 5.0)
    try:
        dense_table(con, rng)
        stmts = [statement(rng) for _ in range(25)]
        want = [alone(con, s) for s in stmts]
        for share, reorder in [(True, True), (False, False)]:
            got = matchrec.run_many(con, stmts, share=share, reorder=reorder)
            for s, g, x in zip(stmts, got.tables, want):
                assert g.equals(x), f"seed {seed} share={share}: {s}\ngot {g.to_pylist()} want {x.to_pylist()}"
        monkeypatch.setattr(O.Evaluator, "aggregate", False)
        off = matchrec.run_many(con, stmts)
        assert [t.to_pylist() for t in off.tables] == [t.to_pylist() for t in want]
    finally:
        con.close()
    assert taken, "no extension was aggregated: the test would not check the aggregation"


def test_both_directions_and_aggregated_parents_are_taken(monkeypatch):
    """Over the seeds above and a few more, the aggregation extends at the sequence's end and at its
    start, and from parents that were themselves aggregated."""
    taken = record_aggregations(monkeypatch)
    aggregated = 0
    for seed in range(10, 16):
        rng = random.Random(seed)
        con = matchrec.connect()
        try:
            dense_table(con, rng)
            stmts = [statement(rng) for _ in range(25)]
            got = matchrec.run_many(con, stmts)
            want = [alone(con, s) for s in stmts]
            assert [t.to_pylist() for t in got.tables] == [t.to_pylist() for t in want]
            aggregated += got.stats["aggregated"]
        finally:
            con.close()
    assert aggregated > 0
    assert {d for d, _ in taken} == {"end", "start"}, taken
    assert any(w for _, w in taken), taken


def test_a_sequence_of_four_builds_pairs_of_first_key_and_third_event_not_triples():
    """SEQ(A, B, C, D) in sequence order: the third step is found per first event's key and C, its
    weight the number of B between; the count equals the Python count over every quadruple."""
    rng = np.random.default_rng(3)
    n = 600
    types = rng.choice(list("ABCD"), n)
    ts = np.arange(n) * 2
    con = matchrec.connect()
    try:
        con.register("__t", pa.table({"ts": ts, "type": types}))
        con.cursor().execute("CREATE TABLE ev AS SELECT * FROM __t")
        stmt = "PATTERN SEQ(A a, B b, C c, D d) FROM ev TYPE type ORDER BY ts WITHIN 60 RETURN COUNT(*)"
        got = matchrec.run_many(con, [stmt], reorder=False)
        pos = {t: np.flatnonzero(types == t) for t in "ABCD"}
        want = 0
        for a in pos["A"].tolist():
            for b in pos["B"][(pos["B"] > a) & (ts[pos["B"]] - ts[a] <= 60)].tolist():
                for c in pos["C"][(pos["C"] > b) & (ts[pos["C"]] - ts[a] <= 60)].tolist():
                    want += int(((pos["D"] > c) & (ts[pos["D"]] - ts[a] <= 60)).sum())
        assert got.tables[0].column(0).to_pylist() == [want]
        triples = sum(1 for a in pos["A"].tolist() for b in pos["B"].tolist() for c in pos["C"].tolist()
                      if a < b < c and ts[c] - ts[a] <= 60)
        assert 0 < got.stats["aggregated"] < triples / 2
    finally:
        con.close()


@pytest.mark.parametrize("rare", ["A", "C"])
def test_a_negation_between_two_events_bounds_the_later_ones_candidates(rare):
    """SEQ(A, ~B, C, D): the negation is a gate on the node binding the second of A and C, whichever
    the plan binds first (the rare type is bound first), equal keys included; the unit then has
    no negation left to check on its matches, and the counts equal the NFA mechanisms'."""
    rng = random.Random(5)
    con = matchrec.connect()
    try:
        n = 500
        types = [rare if rng.random() < 0.05 else rng.choice("ABCD".replace(rare, "")) for _ in range(n)]
        ts = sorted(rng.randint(0, n) for _ in range(n))
        con.register("__t", pa.table({"ts": pa.array(ts, pa.int64()), "type": pa.array(types)}))
        con.cursor().execute("CREATE TABLE ev AS SELECT * FROM __t")
        stmts = ["PATTERN SEQ(A a, ~B b, C c, D d) FROM ev TYPE type ORDER BY ts WITHIN 30 RETURN COUNT(*)",
                 "PATTERN SEQ(A a, ~B b, C c) FROM ev TYPE type ORDER BY ts WITHIN 40 RETURN COUNT(*)",
                 "PATTERN SEQ(D d, A a, ~B b, ~D x, C c) FROM ev TYPE type ORDER BY ts WITHIN 40 RETURN COUNT(*)"]
        got = matchrec.run_many(con, stmts)
        for s, g in zip(stmts, got.tables):
            assert g.equals(alone(con, s)), s
        text = "\n".join(got.report)
        assert "no B between" in text, text
        first = text.split("statement 0: order ")[1].split(";")[0].split("\n")[0]
        assert first.startswith("a" if rare == "A" else "c"), first
    finally:
        con.close()


def plain_statement(rng: random.Random) -> str:
    k = rng.choice([1, 2, 3, 4, 5, 6])
    parts = [f"{rng.choice(TYPES)} e{j}" for j in range(k)]
    where = []
    if rng.random() < 0.4:  # a filter on one element: its own class
        where.append(f"e{rng.randrange(k)}.price {rng.choice(['<', '>='])} {rng.randint(5, 35)}")
    windows = [5, 12, 30, 80]
    ends = k >= 2 and rng.random() < 0.2  # negations before the first and after the last element
    if k < 6 and rng.random() < 0.35:  # a closure at the end: counted with the sequence before it
        parts.append(f"{rng.choice(TYPES)}{rng.choice(['+', '+', '+{2,}'])} k")
        k += 1
        windows = [5, 8, 12]  # the single-statement mechanisms enumerate the closures' sets
    plain = len([p for p in parts if not p.endswith(" k")])
    if plain >= 2 and rng.random() < 0.5:  # a condition between the first two, the last two, or the ends
        a, b = rng.choice([(0, 1), (plain - 2, plain - 1), (0, plain - 1)])
        where.append(rng.choice(["b.price > a.price", "b.price <= a.price", "b.price = a.price",
                                 "b.price - a.price > 6", "abs(b.price - a.price) < 5",
                                 "b.price BETWEEN a.price - 8 AND a.price + 2", "a.price * 2 < b.price",
                                 "a.price > b.price"]).replace("a.", f"e{a}.").replace("b.", f"e{b}."))
        if rng.random() < 0.3:
            where.append(f"e{b}.price < 30")
    if plain >= 2 and rng.random() < 0.35:  # a negation between two events: the first or last two's is counted
        parts.insert(rng.choice([1, plain - 1, rng.randrange(1, plain)]), f"~{rng.choice(TYPES)} n")
    elif plain < len(parts) and rng.random() < 0.4:  # a negation before the closure
        parts.insert(len(parts) - 1, f"~{rng.choice(TYPES)} n")
    if ends:
        parts = [f"~{rng.choice(TYPES)} m"] * (rng.random() < 0.6) + parts
        parts += [f"~{rng.choice(TYPES)} o"] * (rng.random() < 0.6 or not parts[0].startswith("~"))
    w = f" WHERE {' AND '.join(where)}" if where else ""
    part = " PARTITION BY p" if rng.random() < 0.3 else ""
    pattern = parts[0] if k == 1 else f"SEQ({', '.join(parts)})"
    return (f"PATTERN {pattern} FROM ev TYPE type{part} ORDER BY ts{w} WITHIN {rng.choice(windows)} "
            "RETURN COUNT(*)")


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_counts_of_plain_sequences_equal_the_nfa_mechanisms_and_the_nodes(seed, monkeypatch):
    check_closed_forms(seed, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 40))
def test_closed_form_counts_equal_the_nfa_mechanisms_and_the_nodes_many_seeds(seed, monkeypatch):
    check_closed_forms(seed, monkeypatch)


def check_closed_forms(seed: int, monkeypatch) -> None:
    """Twenty statements of ``plain_statement`` over a dense table: ``run_many``'s counts equal
    the NFA mechanisms' with the closed forms where they should pay, everywhere they apply, and
    nowhere (the nodes). A statement whose reference runs past the step budget (six elements and
    a long window over a dense draw) is left out."""
    rng = random.Random(100 + seed)
    con = matchrec.connect()
    try:
        dense_table(con, rng)
        stmts, want = [], []
        for s in (plain_statement(rng) for _ in range(20)):
            try:
                want.append(alone(con, s))
            except matchrec.OperationalError as err:
                assert "steps" in str(err)
                continue
            stmts.append(s)
        got = matchrec.run_many(con, stmts)
        assert "counted in closed form" in "\n".join(got.report)
        for s, g, x in zip(stmts, got.tables, want):
            assert g.equals(x), f"{s}\ngot {g.to_pylist()} want {x.to_pylist()}"
        # the closed forms on every statement they can count, not only where they should cost less
        # than the nodes (on these small tables, few)
        from matchrec.operators import cer_sequences
        taken = []
        for name in ("count_closure", "count_ranked_pair", "count_ranked_ends"):
            def every(*args, _fn=getattr(cer_sequences, name), _name=name, **kw):
                n = _fn(*args, **{**kw, "cheaper": False})
                taken.append((_name, n is not None))
                return n
            monkeypatch.setattr(cer_sequences, name, every)
        forced = matchrec.run_many(con, stmts)
        assert [t.to_pylist() for t in forced.tables] == [t.to_pylist() for t in want]
        assert ("count_ranked_pair", True) in taken
        monkeypatch.undo()
        by_nodes(monkeypatch)
        nodes = matchrec.run_many(con, stmts)
        assert [t.to_pylist() for t in nodes.tables] == [t.to_pylist() for t in want]
    finally:
        con.close()


def test_closed_form_is_exact_past_2_to_the_53_and_leaves_a_count_past_bigint_to_the_nodes():
    """Counts above float64's exact range come out exact (int64 running sums, wrapping modulo 2^64
    on the way); a count past BIGINT is not certified, so the nodes raise their DataError."""
    from matchrec.operators import cer_sequences
    key = np.arange(3000, dtype=np.int64)
    stream = O.Stream(key, None, [np.ones(3000, bool)], 3000)
    # every 6-subset of 3,000 distinct keys: C(3000, 6), about 1.0e18, below 2^63 but far past 2^53
    assert cer_sequences.count(stream, [0] * 6, 3000) == math.comb(3000, 6)
    assert cer_sequences.count(stream, [0] * 6, 10) == sum(math.comb(min(10, 2999 - i), 5) for i in range(3000))
    key = np.arange(6000, dtype=np.int64)
    stream = O.Stream(key, None, [np.ones(6000, bool)], 6000)
    assert cer_sequences.count(stream, [0] * 6, 6000) is None  # C(6000, 6) > 2^63
    con = matchrec.connect()
    try:
        con.cursor().execute("CREATE TABLE big AS SELECT i AS ts, 'A' AS type FROM range(6000) t(i)")
        with pytest.raises(matchrec.DataError, match="BIGINT"):
            matchrec.run_many(con, ["PATTERN SEQ(A a, A b, A c, A d, A e, A f) FROM big TYPE type ORDER BY ts "
                                    "WITHIN 6000 RETURN COUNT(*)"])
    finally:
        con.close()


def test_the_compiled_walk_sum_equals_the_running_sums_in_numpy():
    """``count``'s compiled sum of the walks (``cer_shared_kernels.walk_sum``) against the numpy
    running sums the weighted counts keep (``cer_sequences._walks``): random classes and windows,
    sequences of 2 to 6 elements, empty classes."""
    from matchrec.operators import cer_sequences as C
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(0, 400))
        key = np.sort(rng.integers(0, 300, n))
        masks = [rng.random(n) < share for share in rng.uniform(0, 0.8, int(rng.integers(1, 4)))]
        stream = O.Stream(key, None, masks, 400)
        classes = [int(c) for c in rng.integers(0, len(masks), int(rng.integers(2, 7)))]
        at = C._walk_positions(stream, classes, int(rng.integers(1, 400)))
        with np.errstate(over="ignore"):
            want = int(C._walks(stream, classes, at).sum())
        assert C._walk_sum(stream, classes, at) == want, trial


@pytest.mark.parametrize("seed", range(12))
def test_closed_form_equals_counting_every_chain(seed):
    """The running sums over each element's candidates against every chain enumerated: random
    streams with equal keys, partitions, an event a candidate of several elements, the same class
    at several elements, windows from nothing to the whole stream."""
    from matchrec.operators import cer_sequences
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 32))
    pid = np.sort(rng.integers(0, int(rng.integers(1, 4)), n))
    key = np.concatenate([np.sort(rng.integers(0, n // 2, int((pid == p).sum()))) for p in np.unique(pid)])
    masks = [rng.random(n) < share for share in (0.3, 0.5, 0.7)]
    stream = O.Stream(key, pid, masks, 20)
    for _ in range(12):
        k = int(rng.integers(1, 5))
        classes = [int(c) for c in rng.integers(0, 3, k)]
        w = int(rng.integers(0, 21))
        got = cer_sequences.count(stream, classes, w)
        ck = stream.ck
        want = 0
        # a match: one candidate per element, composite keys strictly increasing, within the window
        for rows in __import__("itertools").product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            if all(x < y for x, y in zip(keys, keys[1:])) and keys[-1] - keys[0] <= stream.clamp(w):
                want += 1
        assert got == want, (classes, w)
        # the same chains followed by a closure: one or more candidates of its class after the last
        # event and within the window of the first, at most one per key
        closure = int(rng.integers(0, 3))
        got = cer_sequences.count_closure(stream, classes, closure, w)
        inside = ck[masks[closure]]
        want = 0
        for rows in __import__("itertools").product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            if all(x < y for x, y in zip(keys, keys[1:])) and keys[-1] - keys[0] <= stream.clamp(w):
                _, mult = np.unique(inside[(inside > keys[-1]) & (inside <= keys[0] + stream.clamp(w))],
                                    return_counts=True)
                want += math.prod(int(x) + 1 for x in mult) - 1
        assert got == want, ("closure", classes, closure, w)
        # negated classes before the closure: no event of them between the last event and the set's
        # first candidate (one at the first candidate's key is not between)
        gates = tuple(int(g) for g in rng.integers(0, 3, int(rng.integers(1, 3))))
        got = cer_sequences.count_closure(stream, classes, closure, w, gates=gates)
        negated = np.concatenate([ck[masks[g]] for g in gates])
        want = 0
        for rows in __import__("itertools").product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            if all(x < y for x, y in zip(keys, keys[1:])) and keys[-1] - keys[0] <= stream.clamp(w):
                at, mult = np.unique(inside[(inside > keys[-1]) & (inside <= keys[0] + stream.clamp(w))],
                                     return_counts=True)
                for i, first in enumerate(at.tolist()):  # sets by their first key
                    if not ((negated > keys[-1]) & (negated < first)).any():
                        want += int(mult[i]) * math.prod(int(x) + 1 for x in mult[i + 1:])
        assert got == want, ("gated closure", classes, closure, gates, w)
        # the same classes negated after the closure: no event of them after the set's last candidate
        # up to the window's end (one at the last candidate's key is not after it)
        got = cer_sequences.count_closure(stream, classes, closure, w, trailing=gates)
        want = 0
        for rows in __import__("itertools").product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            if all(x < y for x, y in zip(keys, keys[1:])) and keys[-1] - keys[0] <= stream.clamp(w):
                end = keys[0] + stream.clamp(w)
                at, mult = np.unique(inside[(inside > keys[-1]) & (inside <= end)], return_counts=True)
                for i, last in enumerate(at.tolist()):  # sets by their last key
                    if not ((negated > last) & (negated <= end)).any():
                        want += int(mult[i]) * math.prod(int(x) + 1 for x in mult[:i])
        assert got == want, ("closure before negations", classes, closure, gates, w)
        if k < 2:
            continue
        # the closure between elements j and j+1 instead: its sets strictly between their keys
        j = int(rng.integers(0, k - 1))
        got = cer_sequences.count_between(stream, classes, j, closure, w)
        want = 0
        for rows in __import__("itertools").product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            if all(x < y for x, y in zip(keys, keys[1:])) and keys[-1] - keys[0] <= stream.clamp(w):
                _, mult = np.unique(inside[(inside > keys[j]) & (inside < keys[j + 1])], return_counts=True)
                want += math.prod(int(x) + 1 for x in mult) - 1
        assert got == want, ("closure between", classes, j, closure, w)


@pytest.mark.parametrize("seed", range(6))
def test_closed_form_of_a_ranked_first_pair_equals_counting_every_chain(seed):
    """The sweep over the pairs of the first two elements whose condition is an interval of ranks
    (``count_ranked_pair``) against every chain enumerated, on the streams of the test above:
    random intervals (empty ones too) and ranks (-1 among them), negated classes between the two,
    equal keys, partitions; then the same chains followed by a closure."""
    import itertools

    from matchrec.operators import cer_sequences
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(12, 32))
    pid = np.sort(rng.integers(0, int(rng.integers(1, 4)), n))
    key = np.concatenate([np.sort(rng.integers(0, n // 2, int((pid == p).sum()))) for p in np.unique(pid)])
    masks = [rng.random(n) < share for share in (0.3, 0.5, 0.7)] + [np.zeros(n, bool)]
    stream = O.Stream(key, pid, masks, 20)
    ck = stream.ck
    for _ in range(16):
        k = int(rng.integers(2, 6))
        classes = [int(c) for c in rng.integers(0, 3, k)]
        w = int(rng.integers(0, 21))
        distinct = int(rng.integers(1, 6))
        first, second = stream.rows[classes[0]], stream.rows[classes[1]]
        rank = rng.integers(-1, distinct, len(second))
        low, high = rng.integers(0, distinct + 1, len(first)), rng.integers(0, distinct + 1, len(first))
        if rng.random() < 0.4:  # one rank or none each, as an equality gives them
            high = low + rng.integers(0, 2, len(first))
        # no event of them between e0 and e1; class 3 has no events
        gates = tuple(int(g) for g in rng.integers(0, 4, int(rng.integers(0, 3))))
        got = cer_sequences.count_ranked_pair(stream, classes, w, low, high, rank, distinct, gates=gates)
        at0 = {int(r): i for i, r in enumerate(first)}
        at1 = {int(r): i for i, r in enumerate(second)}
        negated = np.concatenate([ck[masks[g]] for g in gates] + [np.zeros(0, np.int64)])

        def holds(rows, keys):
            x, y = at0[int(rows[0])], at1[int(rows[1])]
            return (all(a < b for a, b in zip(keys, keys[1:])) and keys[-1] - keys[0] <= stream.clamp(w)
                    and low[x] <= rank[y] < high[x] and not ((negated > keys[0]) & (negated < keys[1])).any())
        want = 0
        for rows in itertools.product(*[np.flatnonzero(masks[c]) for c in classes]):
            if holds(rows, [int(ck[r]) for r in rows]):
                want += 1
        assert got == want, (classes, w, gates)
        if k == 5:
            continue
        closure = int(rng.integers(0, 3))
        got = cer_sequences.count_ranked_pair(stream, classes, w, low, high, rank, distinct, closure=closure,
                                              gates=gates)
        inside = ck[masks[closure]]
        want = 0
        for rows in itertools.product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            if holds(rows, keys):
                _, mult = np.unique(inside[(inside > keys[-1]) & (inside <= keys[0] + stream.clamp(w))],
                                    return_counts=True)
                want += math.prod(int(x) + 1 for x in mult) - 1
        assert got == want, ("closure", classes, closure, w)


@pytest.mark.parametrize("seed", range(12))
def test_closed_form_of_a_ranked_pair_of_ends_equals_counting_every_chain(seed):
    """The sweep over the pairs of the first and the last element (``count_ranked_ends``: the
    chains between them, a condition between the two as an interval of ranks, negated classes
    before the first and after the last) against every chain enumerated: random intervals, ranks
    of -1, equal keys, partitions, a class with no event."""
    import itertools

    from matchrec.operators import cer_sequences
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(12, 32))
    pid = np.sort(rng.integers(0, int(rng.integers(1, 4)), n))
    key = np.concatenate([np.sort(rng.integers(0, n // 2, int((pid == p).sum()))) for p in np.unique(pid)])
    masks = [rng.random(n) < share for share in (0.3, 0.5, 0.7)] + [np.zeros(n, bool)]
    stream = O.Stream(key, pid, masks, 20)
    ck = stream.ck
    for _ in range(16):
        k = int(rng.integers(2, 6))
        classes = [int(c) for c in rng.integers(0, 4 if rng.random() < 0.1 else 3, k)]
        # no event of them in [z - w, x) (before) or in (z, x + w] (after); class 3 has no events
        before = tuple(int(g) for g in rng.integers(0, 4, int(rng.integers(0, 3))))
        after = tuple(int(g) for g in rng.integers(0, 4, int(rng.integers(0, 3))))
        earlier = np.concatenate([ck[masks[g]] for g in before] + [np.zeros(0, np.int64)])
        later = np.concatenate([ck[masks[g]] for g in after] + [np.zeros(0, np.int64)])
        w = int(rng.integers(0, 21))
        distinct = int(rng.integers(1, 6))
        first, last = stream.rows[classes[0]], stream.rows[classes[-1]]
        rank = rng.integers(-1, distinct, len(last))
        low, high = rng.integers(0, distinct + 1, len(first)), rng.integers(0, distinct + 1, len(first))
        if rng.random() < 0.4:
            high = low + rng.integers(0, 2, len(first))
        got = cer_sequences.count_ranked_ends(stream, classes, w, low, high, rank, distinct, before=before,
                                              after=after)
        span = stream.clamp(w)
        at0 = {int(r): i for i, r in enumerate(first)}
        at1 = {int(r): i for i, r in enumerate(last)}
        want = 0
        for rows in itertools.product(*[np.flatnonzero(masks[c]) for c in classes]):
            keys = [int(ck[r]) for r in rows]
            x, z = at0[int(rows[0])], at1[int(rows[-1])]
            if (all(a < b for a, b in zip(keys, keys[1:])) and keys[-1] - keys[0] <= span
                    and low[x] <= rank[z] < high[x]
                    and not ((earlier >= keys[-1] - span) & (earlier < keys[0])).any()
                    and not ((later > keys[-1]) & (later <= keys[0] + span)).any()):
                want += 1
        assert got == want, (classes, w, before, after)


def test_closed_form_of_a_closure_is_exact_far_past_one_prime():
    """Counts of a closure at the end far above the primes its residues are taken modulo (and
    above 2^53) come out exact; past the certified bound the nodes take the pattern."""
    from matchrec.operators import cer_sequences
    key = np.arange(120, dtype=np.int64)
    stream = O.Stream(key, None, [np.ones(120, bool)], 120)
    # SEQ(A a, K+ k) WITHIN 50: each a at x stands for 2^(closure events in (x, x + 50]) - 1
    want = sum(2 ** min(50, 119 - x) - 1 for x in range(120))
    assert want > 2 ** 55 and cer_sequences.count_closure(stream, [0], 0, 50) == want
    # SEQ(A a, A b, K+ k) WITHIN 40
    want = sum(2 ** (min(x + 40, 119) - y) - 1 for x in range(120) for y in range(x + 1, min(x + 40, 119) + 1))
    assert want > 2 ** 40 and cer_sequences.count_closure(stream, [0, 0], 0, 40) == want
    # about 2^59 matches, where the bound (each pair's closure as long as its last event's window)
    # says about 2^64: the residues still give it exactly
    want = sum(2 ** (min(x + 53, 119) - y) - 1 for x in range(120) for y in range(x + 1, min(x + 53, 119) + 1))
    assert 2 ** 59 < want < 2 ** 62 and cer_sequences.count_closure(stream, [0, 0], 0, 53) == want
    assert cer_sequences.count_closure(stream, [0], 0, 70) is None  # about 50 * 2^70: past 2^62, to the nodes


def test_closed_form_leaves_patterns_with_few_matches_for_their_events_to_the_nodes():
    """Short partitions (a job's few events) hold few matches for many events: the running sums
    over every group would cost more than the nodes, so ``cheaper`` declines; the count itself
    is the same either way."""
    from matchrec.operators import cer_sequences
    rng = np.random.default_rng(4)
    jobs = 3000
    pid = np.repeat(np.arange(jobs), 4)  # four events a job: A, B, C in some order
    key = np.tile(np.arange(4), jobs) * 10
    kinds = rng.integers(0, 3, len(key))
    stream = O.Stream(key, pid, [kinds == 0, kinds == 1, kinds == 2], 100)
    exact = cer_sequences.count(stream, [0, 1, 2], 100)
    assert exact == cer_sequences.count(stream, [0, 1, 2], 100, cheaper=False)
    assert cer_sequences.count(stream, [0, 1, 2], 100, cheaper=True) is None
    per_job = 0
    for j in range(jobs):
        k = kinds[j * 4:(j + 1) * 4].tolist()
        per_job += sum(1 for a in range(4) for b in range(a + 1, 4) for c in range(b + 1, 4)
                       if (k[a], k[b], k[c]) == (0, 1, 2))
    assert exact == per_job
    # one long stream of the same events: many matches per event, the closed form is taken
    dense = O.Stream(np.arange(len(key)), None, [kinds == 0, kinds == 1, kinds == 2], 400)
    assert cer_sequences.count(dense, [0, 1, 2], 400, cheaper=True) is not None


def test_a_drift_decision_waits_while_a_re_plan_could_save_less_than_deciding_costs(con, monkeypatch):
    """Rates that flip every 1,000 events drift at every other slice. Priced so that no re-plan can
    pay for the decision's own time, every drift after the first waits; priced high, each one is
    decided. The counts stay those of the statements alone."""
    con.cursor().execute("""CREATE TABLE flips AS SELECT i AS ts,
        CASE WHEN (i // 1000) % 2 = 0 THEN (CASE WHEN i % 40 = 0 THEN 'A' WHEN i % 2 = 0 THEN 'B' ELSE 'C' END)
             ELSE (CASE WHEN i % 40 = 0 THEN 'C' WHEN i % 2 = 0 THEN 'B' ELSE 'A' END) END AS type,
        (i * 13 % 17) AS price FROM range(8000) t(i)""")
    stmts = ["PATTERN SEQ(A a, B b, C c) FROM flips WHERE c.price > a.price WITHIN 12 RETURN COUNT(*)",
             "PATTERN SEQ(C c, B b, A a) FROM flips WHERE b.price < c.price WITHIN 9 RETURN COUNT(*)"]
    want = [alone(con, s) for s in stmts]
    monkeypatch.setattr(multi_eval, "SECONDS_PER_COST", 1e-15)
    cheap = matchrec.run_many(con, stmts, slice_events=1000, budget=0.5)
    text = "\n".join(cheap.report)
    assert "drifts with too few slices ahead to pay for deciding" in text, text
    monkeypatch.setattr(multi_eval, "SECONDS_PER_COST", 1.0)
    dear = matchrec.run_many(con, stmts, slice_events=1000, budget=0.5)
    assert "too few slices ahead" not in "\n".join(dear.report)
    for r in (cheap, dear):
        assert [t.to_pylist() for t in r.tables] == [t.to_pylist() for t in want]


@pytest.mark.parametrize("seed", range(4))
def test_sorted_search_equals_numpys(seed):
    """The closed forms' galloping search (``cer_shared_kernels.sorted_search``) against
    ``np.searchsorted``: ties, empty and one-sided inputs, long gaps, unsorted queries."""
    from matchrec.operators.cer_shared_kernels import sorted_search
    rng = np.random.default_rng(seed)
    for _ in range(150):
        n, m = (int(x) for x in rng.integers(0, 2500, 2))
        spread = int(rng.choice([3, 100, 10**6]))
        a = np.sort(rng.integers(-spread, spread, n))
        v = np.sort(rng.integers(-2 * spread, 2 * spread, m)) + int(rng.choice([0, spread // 2]))
        if rng.random() < 0.2:
            v = rng.permutation(v)
        if rng.random() < 0.1 and m:  # the largest key last, after keys below every one of ``a``
            v = np.append(np.sort(v)[:-1] - 5 * spread, np.iinfo(np.int64).max)
        for side in ("left", "right"):
            assert (sorted_search(a, v, side) == np.searchsorted(a, v, side)).all(), (side, n, m, spread)
