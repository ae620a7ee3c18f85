"""The SASE-style CER language: parser, DB-API execution, planner and EXPLAIN, filtering before
matching, limits and the STRATEGY clause of MATCH_RECOGNIZE.

End-to-end results are compared with ``reference_matches`` on a pattern built independently in
Python (filters and conditions written as Python functions over the same rows), so the parser,
the SQL and Python compilation of predicates, the reading from DuckDB and the mechanisms are all
checked against the reference semantics.
"""
from __future__ import annotations

import re

import io
import itertools
import random

import numpy as np
import pyarrow as pa
import pytest

import matchrec
from matchrec.operators.cer_reference import (And, Condition, Element, Events, Or, Pattern, Seq,
                                              reference_matches)
from matchrec.parser import sase as S
from matchrec.shell import Shell


@pytest.fixture
def con():
    c = matchrec.connect()
    yield c
    c.close()


def rows(con, sql):
    return con.cursor().execute(sql).fetchall()


def explain(con, sql):
    return rows(con, sql)[0][1]


# ---------------------------------------------------------------- parser
def test_parse_every_construct():
    q = S.parse("PATTERN SEQ(MSFT v1, AND(GOOG v2, OR(IBM v3, 'ibm x' v4)), ~MSFT n, GOOG+{2,5} b, IBM+ c, "
                "\"Q\"+{3} d, IBM+{2,} e) FROM db.nasdaq TYPE symbol PARTITION BY venue ORDER BY t "
                "USE strict-contiguity WHERE v1.open > 3 AND 1 < v2.x <= 5 AND avg(b.price) > v1.open "
                "AND count(c) >= 2 AND 1 = 1 WITHIN 90 seconds RETURN v1.t AS start, b.price, last(b.price) end_")
    b = Element("GOOG", "b", (2, 5))
    assert q.root == Seq((Element("MSFT", "v1"), And((Element("GOOG", "v2"), Or((Element("IBM", "v3"),
                                                                                  Element("ibm x", "v4"))))),
                          Element("MSFT", "n", negated=True), b, Element("IBM", "c", (1, None)),
                          Element("Q", "d", (3, 3)), Element("IBM", "e", (2, None))))
    assert q.source == "db.nasdaq" and q.strategy == "strict"
    assert (q.type_column[0], q.partition_column[0], q.key_column[0]) == ("symbol", "venue", "t")
    assert sorted(q.filters) == ["v1", "v2"]
    assert [(c.op, c.left.value if isinstance(c.left, S.Lit) else c.right.value) for c in q.filters["v2"]] == \
        [("<", 1), ("<=", 5)]  # the chained comparison becomes two conjuncts
    assert [S.variables(c) for c in q.conditions] == [{"b", "v1"}, {"c"}]
    assert len(q.constants) == 1
    assert (q.within.amount, q.within.unit) == (90, "seconds")
    assert q.returns == "project" and [p.name for p in q.projections] == ["start", "b.price", "end_"]
    assert q.positive == ["v1", "v2", "v3", "v4", "b", "c", "d", "e"]
    assert S.describe(q.root).startswith("SEQ(MSFT v1, AND(GOOG v2, OR(IBM v3, ibm x v4)), ~MSFT n, GOOG+{2,5} b")


@pytest.mark.parametrize("text,strategy", [("strict-contiguity", "strict"), ("skip-till-next-match", "next"),
                                           ("SKIP_TILL_ANY_MATCH", "any"), (None, "any")])
def test_strategies(text, strategy):
    use = f" USE {text}" if text else ""
    assert S.parse(f"PATTERN SEQ(A a, B b) FROM t{use}").strategy == strategy


def test_return_forms_explain_and_windows():
    assert S.parse("PATTERN A a FROM t RETURN COUNT ( * )").returns == "count"
    assert S.parse("PATTERN A a FROM t RETURN *").returns == "events"
    assert S.parse("PATTERN A a FROM t").returns == "events"
    assert S.parse("EXPLAIN PATTERN A a FROM t").explain == "explain"
    assert S.parse("explain analyze pattern A a from t;").explain == "analyze"
    w = S.parse("PATTERN A a FROM t WITHIN INTERVAL '10' MINUTE").within
    assert (w.amount, w.unit) == (10, "minute")
    w = S.parse("PATTERN A a FROM t WITHIN INTERVAL '2 hours'").within
    assert (w.amount, w.unit) == (2, "hours")
    assert S.parse("PATTERN A a FROM t WITHIN 12").within.unit is None
    q = S.parse("PATTERN SEQ(A a, B b) FROM t WHERE a.x NOT BETWEEN 1 AND 2 AND b.y IS NULL AND a.z IN (1, 2) "
                "AND NOT (a.x = b.x OR a.x <> 3)")
    assert len(q.filters["a"]) == 2 and len(q.filters["b"]) == 1 and len(q.conditions) == 1


def test_statement_detection():
    assert S.is_cer_statement("PATTERN SEQ(A a) FROM t")
    assert S.is_cer_statement("  -- c\n explain analyze pattern A a from t")
    assert not S.is_cer_statement("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A) DEFINE A AS true)")
    assert S.has_strategy_clause("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A) STRATEGY "
                                 "skip-till-any-match DEFINE A AS true)")


@pytest.mark.parametrize("text,message,line,col", [
    ("PATTERN SEQ(A a, B a) FROM t", "Variable a is bound twice", 1, 20),
    ("PATTERN SEQ(A a,\n  B b FROM t", "Unexpected 'FROM'", 2, 7),
    ("PATTERN SEQ(A a, B b) FROM t\nWHERE c.x > 1", "Unknown pattern variable c", 2, 7),
    ("PATTERN SEQ(A a, B+ b) FROM t WHERE b.x > a.x", "b is a Kleene variable", 1, 37),
    ("PATTERN SEQ(A a, ~B+ b) FROM t", "negated element cannot be a Kleene", 1, 20),
    ("PATTERN SEQ(A a, B+{3,2} b) FROM t", "upper bound is below", 1, 20),
    ("PATTERN SEQ(A a, B+{0,2} b) FROM t", "at least one event", 1, 20),
    ("PATTERN SEQ(A a, B b)", "needs FROM", 1, 22),
    ("PATTERN SEQ(A a) FROM t USE fastest", "expected a strategy", 1, 29),
    ("PATTERN SEQ(~A a) FROM t", "at least one element that is not negated", 1, 9),
    ("PATTERN SEQ(A a, B b) FROM t WHERE avg(a.x, b.x) > 1", "takes one argument", 1, 36),
    ("PATTERN SEQ(A a, B b) FROM t WHERE avg(a.x + b.x) > 1", "exactly one pattern variable", 1, 36),
    ("PATTERN SEQ(A a, ~B n) FROM t RETURN n.x", "n is negated", 1, 38),
    ("PATTERN SEQ(A a, B+ b) FROM t RETURN b.x + 1", "b is a Kleene variable", 1, 38),
    ("PATTERN SEQ(A a) FROM t WHERE a > 1", "a is a pattern variable", 1, 31),
    ("PATTERN SEQ(A a) FROM t WITHIN 3 WITHIN 4", "WITHIN is given twice", 1, 34),
])
def test_parse_errors_point_at_the_problem(text, message, line, col):
    with pytest.raises(matchrec.ProgrammingError) as info:
        S.parse(text)
    assert message in str(info.value)
    assert f"Line {line}, Col {col}." in str(info.value)


# ---------------------------------------------------------------- a stock-like table
def _nasdaq(con):
    con.cursor().execute("""CREATE TABLE nasdaq AS SELECT TIMESTAMP '2024-01-01' + INTERVAL (i) MINUTE AS ts,
        CASE WHEN i % 3 = 0 THEN 'MSFT' WHEN i % 3 = 1 THEN 'GOOG' ELSE 'IBM' END AS symbol,
        300 + (i * 7 % 40) AS open, i AS id FROM range(90) t(i)""")


def _by_hand(q, symbols, opens, ids, within_minutes):
    """The example query's matches, from the Python lists (skip-till-any-match)."""
    out = []
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            for c in range(b + 1, len(ids)):
                for d in range(c + 1, len(ids)):
                    if [symbols[i] for i in (a, b, c, d)] != ["MSFT", "GOOG", "MSFT", "GOOG"]:
                        continue
                    if d - a > within_minutes or not (326 <= opens[a] <= 334) or not opens[c] >= opens[a] * 1.003:
                        continue
                    out.append((ids[a], ids[b], ids[c], ids[d]))
    return out


def test_example_query_against_a_hand_count(con):
    _nasdaq(con)
    cur = con.cursor()
    cur.execute("SET matchrec_cer_type_column = symbol")
    data = rows(con, "SELECT symbol, open, id FROM nasdaq ORDER BY ts")
    symbols, opens, ids = ([r[i] for r in data] for i in range(3))
    q = ("PATTERN SEQ(MSFT v1, GOOG v2, MSFT v3, GOOG v4) FROM nasdaq WHERE 326 <= v1.open <= 334 AND "
         "v3.open >= v1.open * 1.003 WITHIN 12 minutes")
    expected = _by_hand(q, symbols, opens, ids, 12)
    assert len(expected) > 3
    assert rows(con, q + " RETURN COUNT(*)") == [(len(expected),)]
    got = rows(con, q + " RETURN v1.id, v2.id, v3.id AS c, v4.id")
    assert sorted(got) == sorted(expected)
    cur.execute(q + " RETURN v1.id, v3.open - v1.open AS gain")
    assert [d[0] for d in cur.description] == ["v1.id", "gain"]
    assert all(g >= 0 for _, g in cur.fetchall())
    table = cur.execute(q).fetch_arrow_table()
    assert table.column_names[:4] == ["v1_ts", "v1_symbol", "v1_open", "v1_id"]
    assert table.num_rows == len(expected) and table.schema.field("v1_ts").type == pa.timestamp("us")
    # next-match keeps only the first GOOG after each MSFT
    nxt = rows(con, q.replace("WHERE", "USE skip-till-next-match WHERE") + " RETURN v1.id, v2.id, v3.id, v4.id")
    assert set(nxt) < set(expected) and all(b == a + 1 for a, b, _, _ in nxt)


def test_kleene_aggregates_and_lists(con):
    _nasdaq(con)
    got = rows(con, "PATTERN SEQ(MSFT a, GOOG+{2,3} b, IBM c) FROM nasdaq TYPE symbol WHERE avg(b.open) > a.open "
                    "AND count(b) = 2 WITHIN 6 minutes RETURN a.id, b.id, avg(b.open), count(b), first(b.id), "
                    "last(b.id) AS l, max(b.open) - min(b.open)")
    assert got
    data = dict(rows(con, "SELECT id, open FROM nasdaq"))
    for a, bs, avg, n, first, last, spread in got:
        assert len(bs) == 2 == n and (first, last) == (bs[0], bs[-1]) and bs[-1] - a <= 6
        vals = [data[i] for i in bs]
        assert avg == pytest.approx(sum(vals) / 2) and avg > data[a] and spread == max(vals) - min(vals)


def test_settings_for_columns_and_errors_with_positions(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE ev AS SELECT i AS t, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS kind, i AS v "
                "FROM range(10) r(i)")
    with pytest.raises(matchrec.ProgrammingError, match="matchrec_cer_type_column"):
        cur.execute("PATTERN SEQ(a x, b y) FROM ev")
    cur.execute("SET matchrec_cer_type_column = kind")
    cur.execute("SET matchrec_cer_key_column = 't'")
    assert rows(con, "PATTERN SEQ(a x, b y) FROM ev USE strict-contiguity RETURN COUNT(*)") == [(5,)]
    cur.execute("RESET matchrec_cer_key_column")
    with pytest.raises(matchrec.ProgrammingError, match="matchrec_cer_key_column"):
        cur.execute("PATTERN SEQ(a x, b y) FROM ev")
    with pytest.raises(matchrec.ProgrammingError) as info:
        cur.execute("PATTERN SEQ(a x, b y) FROM ev ORDER BY t\nWHERE x.nope > 1")
    assert "nope is not a column of ev" in str(info.value) and "Line 2, Col 7." in str(info.value)
    with pytest.raises(matchrec.ProgrammingError, match="Cannot read missing"):
        cur.execute("PATTERN SEQ(a x, b y) FROM missing ORDER BY t")
    with pytest.raises(matchrec.ProgrammingError, match="WITHIN takes a plain number"):
        cur.execute("PATTERN SEQ(a x, b y) FROM ev ORDER BY t WITHIN 3 minutes")
    with pytest.raises(matchrec.ProgrammingError, match="takes one of"):
        cur.execute("SET matchrec_cer_mechanism = fastest")
    with pytest.raises(matchrec.ProgrammingError, match="Unknown setting"):
        cur.execute("SET matchrec_cer_nothing = 1")
    with pytest.raises(matchrec.ProgrammingError, match="Function md5"):
        cur.execute("PATTERN SEQ(a x, b y) FROM ev ORDER BY t WHERE md5(x.v) = y.v")
    # any DuckDB function works in a predicate over one variable
    assert rows(con, "PATTERN SEQ(a x, b y) FROM ev ORDER BY t USE strict-contiguity "
                     "WHERE md5(CAST(x.v AS VARCHAR)) = md5('4') RETURN y.v") == [(5,)]


def test_time_keys_need_units_and_nulls_never_match(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE e AS SELECT * FROM (VALUES (TIMESTAMP '2024-01-01 00:00:00', 'a', 1), "
                "(TIMESTAMP '2024-01-01 00:00:30', 'b', NULL), (NULL, 'b', 3), "
                "(TIMESTAMP '2024-01-01 00:02:00', 'b', 4)) v(ts, type, x)")
    with pytest.raises(matchrec.ProgrammingError, match="give WITHIN a unit"):
        cur.execute("PATTERN SEQ(a p, b q) FROM e WITHIN 10")
    assert rows(con, "PATTERN SEQ(a p, b q) FROM e WITHIN 1 minute RETURN q.x") == [(None,)]
    assert rows(con, "PATTERN SEQ(a p, b q) FROM e WITHIN 2 minutes RETURN q.x") == [(None,), (4,)]
    # NULL is false in a filter and in a condition
    assert rows(con, "PATTERN SEQ(a p, b q) FROM e WHERE q.x > 0 RETURN q.x") == [(4,)]
    assert rows(con, "PATTERN SEQ(a p, b q) FROM e WHERE q.x > p.x RETURN q.x") == [(4,)]
    assert rows(con, "PATTERN SEQ(a p, b q) FROM e WHERE NOT (q.x < p.x) RETURN q.x") == [(4,)]


def test_through_the_shell(con):
    _nasdaq(con)
    out, err = io.StringIO(), io.StringIO()
    sh = Shell(con, out=out, err=err)
    assert sh.run_script("PATTERN SEQ(MSFT a, GOOG b) FROM nasdaq TYPE symbol USE strict-contiguity "
                         "WITHIN 1 minute RETURN COUNT(*);\nEXPLAIN PATTERN SEQ(MSFT a, GOOG b) FROM nasdaq "
                         "TYPE symbol;\n")
    assert "30" in out.getvalue() and "mechanism" in out.getvalue() and not err.getvalue()
    assert not sh.run_script("PATTERN SEQ(MSFT a, GOOG b FROM nasdaq;\n")
    assert "Unexpected" in err.getvalue()


# ---------------------------------------------------------------- the differential test
def statement_text(case, pattern: str, table: str, returns: str) -> str:
    """The CER statement of a random case: its pattern over ``table`` ordered by ts, its partitioning,
    strategy, WHERE and WITHIN, returning ``returns``."""
    out = f"PATTERN {pattern} FROM {table} ORDER BY ts"
    if case.partitioned:
        out += " PARTITION BY p"
    out += f" USE {S.STRATEGY_NAMES[case.strategy]}"
    if case.where:
        out += f" WHERE {case.where}"
    if case.window is not None:
        out += f" WITHIN {case.window}"
    return out + f" RETURN {returns}"


class _Case:
    """A random table and a random query, both as text for matchrec and as an independent Python pattern."""

    TYPES = "abc"

    def __init__(self, rng: random.Random):
        self.rng = rng
        n = rng.randint(6, 16)
        ts = sorted(rng.randint(0, 14) for _ in range(n))
        self.data = {"id": list(range(n)), "ts": ts, "type": [rng.choice(self.TYPES) for _ in range(n)],
                     "x": [None if rng.random() < 0.1 else rng.randint(0, 9) for _ in range(n)],
                     "p": [rng.randint(0, 1) for _ in range(n)]}
        self.partitioned = rng.random() < 0.3
        parts = self.data["p"] if self.partitioned else [0] * n
        self.order = sorted(range(n), key=lambda i: (parts[i], ts[i], i))  # reference row -> id
        self.x = [self.data["x"][i] for i in self.order]
        self.vars: dict[str, Element] = {}
        self.texts: list[str] = []
        self.filters: dict = {}
        self.conditions: list = []
        self.root, text = self.node(0, top=True)
        if not any(not e.negated for e in self.vars.values()):
            first = next(iter(self.vars.values()))
            self.vars[first.var] = Element(first.type, first.var)
            self.root, text = self.rebuild(self.root, first.var), text.replace("~", "", 1)
        self.pattern_text = text
        self.predicates()
        self.strategy = rng.choice(["strict", "next", "any", "any"])
        self.window = rng.choice([None, 2, 4, 6, 9])

    def rebuild(self, node, var):
        if isinstance(node, Element):
            return self.vars[var] if node.var == var else node
        return type(node)(tuple(self.rebuild(i, var) for i in node.items))

    def element(self):
        rng = self.rng
        var = f"v{len(self.vars)}"
        t = rng.choice(self.TYPES)
        kind = rng.random()
        if kind < 0.2:
            lo = rng.randint(1, 2)
            hi = rng.choice([None, lo, lo + 1])
            e = Element(t, var, (lo, hi))
            bounds = "" if (lo, hi) == (1, None) else f"{{{lo},{'' if hi is None else hi}}}"
            text = f"{t}+{bounds} {var}"
        elif kind < 0.35:
            e, text = Element(t, var, negated=True), f"~{t} {var}"
        else:
            e, text = Element(t, var), f"{t} {var}"
        self.vars[var] = e
        return e, text

    def node(self, depth, top=False):
        rng = self.rng
        if not top and (depth >= 2 or rng.random() < 0.7):
            return self.element()
        op = "SEQ" if top or rng.random() < 0.4 else rng.choice(["AND", "OR"])
        k = rng.randint(2, 3) if op == "SEQ" else 2
        items = [self.node(depth + 1) for _ in range(k)]
        cls = {"SEQ": Seq, "AND": And, "OR": Or}[op]
        return cls(tuple(i for i, _ in items)), f"{op}({', '.join(t for _, t in items)})"

    def predicates(self):
        rng = self.rng
        x = self.x
        where = []
        for var, e in self.vars.items():
            if rng.random() < 0.4:
                c = rng.randint(1, 8)
                form = rng.randrange(4)
                if form == 0:
                    where.append(f"{var}.x > {c}")
                    f = [v is not None and v > c for v in x]
                elif form == 1:
                    where.append(f"{c - 1} <= {var}.x <= {c + 1}")
                    f = [v is not None and c - 1 <= v <= c + 1 for v in x]
                elif form == 2:
                    where.append(f"{var}.x % 2 = {c % 2}")
                    f = [v is not None and v % 2 == c % 2 for v in x]
                else:
                    where.append(f"({var}.x IS NULL OR {var}.x <> {c})")
                    f = [v is None or v != c for v in x]
                self.filters[var] = np.array(f, bool)
        plain = [v for v, e in self.vars.items() if e.kleene is None]
        kleene = [v for v, e in self.vars.items() if e.kleene is not None and not e.negated]
        if len(plain) >= 2 and rng.random() < 0.6:
            a, b = rng.sample(plain, 2)
            form = rng.random()
            if form < 0.35:
                where.append(f"{a}.x < {b}.x")
                fn = (lambda bd, a=a, b=b: None if x[bd[a]] is None or x[bd[b]] is None else x[bd[a]] < x[bd[b]])
            elif form < 0.6:
                where.append(f"{a}.x = {b}.x")
                fn = (lambda bd, a=a, b=b: None if x[bd[a]] is None or x[bd[b]] is None else x[bd[a]] == x[bd[b]])
            else:
                c = rng.randint(4, 14)
                where.append(f"{a}.x + {b}.x >= {c}")
                fn = (lambda bd, a=a, b=b, c=c: None if x[bd[a]] is None or x[bd[b]] is None
                      else x[bd[a]] + x[bd[b]] >= c)
            self.conditions.append(Condition(frozenset({a, b}), fn))
        if kleene and rng.random() < 0.6:
            k = rng.choice(kleene)

            def vals(bd, k=k):
                return [x[r] for r in bd[k] if x[r] is not None]
            form = rng.randrange(4)
            if form == 0:
                c = rng.randint(2, 7)
                where.append(f"avg({k}.x) > {c}")
                fn = (lambda bd, c=c: bool(vals(bd)) and sum(vals(bd)) / len(vals(bd)) > c)
                self.conditions.append(Condition(frozenset({k}), fn))
            elif form == 1:
                where.append(f"count({k}) >= 2")
                self.conditions.append(Condition(frozenset({k}), lambda bd, k=k: len(bd[k]) >= 2))
            elif form == 2:
                c = rng.randint(2, 8)
                where.append(f"max({k}.x) - min({k}.x) < {c}")
                fn = (lambda bd, c=c: bool(vals(bd)) and max(vals(bd)) - min(vals(bd)) < c)
                self.conditions.append(Condition(frozenset({k}), fn))
            elif plain:
                a = rng.choice(plain)
                where.append(f"last({k}.x) >= {a}.x")
                fn = (lambda bd, k=k, a=a: None if x[bd[k][-1]] is None or x[bd[a]] is None
                      else x[bd[k][-1]] >= x[bd[a]])
                self.conditions.append(Condition(frozenset({k, a}), fn))
        self.where = " AND ".join(where)

    def table(self) -> pa.Table:
        return pa.table({k: pa.array(v, pa.int64() if k != "type" else pa.string()) for k, v in self.data.items()})

    def text(self, returns: str) -> str:
        return statement_text(self, self.pattern_text, "ev", returns)

    def expected(self) -> list:
        ts = [self.data["ts"][i] for i in self.order]
        parts = np.array([self.data["p"][i] for i in self.order]) if self.partitioned else None
        ev = Events(np.array(ts, np.int64), [self.data["type"][i] for i in self.order], parts)
        window = self.window if self.window is not None else 1 << 40
        pattern = Pattern(self.root, window, self.strategy, self.filters, self.conditions)
        out = []
        for m in reference_matches(pattern, ev):
            out.append(tuple(sorted((v, tuple(self.order[r] for r in b) if isinstance(b, tuple) else self.order[b])
                                    for v, b in m)))
        return sorted(out)

    def positive(self) -> list[str]:
        return [v for v, e in self.vars.items() if not e.negated]


def _got(con, case: _Case) -> list:
    pos = case.positive()
    got = rows(con, case.text(", ".join(f"{v}.id" for v in pos)))
    out = []
    for r in got:
        out.append(tuple(sorted((v, tuple(x) if isinstance(x, list) else x) for v, x in zip(pos, r)
                                if x is not None)))
    return sorted(out)


def _load(con, case: _Case) -> None:
    con.register("ev_src", case.table())
    con.cursor().execute("CREATE OR REPLACE TABLE ev AS SELECT * FROM ev_src")
    con.unregister("ev_src")


def _differential(con, seed: int, cases: int) -> int:
    rng = random.Random(seed)
    matched = 0
    for i in range(cases):
        case = _Case(rng)
        _load(con, case)
        cur = con.cursor()
        cur.execute(f"SET matchrec_cer_filtering = {rng.choice(['auto', 'always', 'never'])}")
        forced = ["auto", "eager", "chain", "tree"] + (["rcep", "batch"] if case.strategy == "any" else [])
        cur.execute(f"SET matchrec_cer_mechanism = {rng.choice(forced)}")
        expected = case.expected()
        got = _got(con, case)
        assert got == expected, (i, case.text("..."))
        assert rows(con, case.text("COUNT(*)")) == [(len(expected),)], (i, case.text("COUNT(*)"))
        matched += bool(expected)
    return matched


def test_differential_random_queries(con):
    assert _differential(con, 20240611, 120) > 25  # many cases must actually match something (37 do)


@pytest.mark.slow
def test_differential_random_queries_many(con):
    assert _differential(con, 77, 3000) > 600


# ---------------------------------------------------------------- filtering before matching
def _sparse(con, seed=5, n=3000):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.choice(10 * n, n, replace=False))
    types = rng.choice(["a", "b", "c"], n, p=[0.02, 0.49, 0.49])
    con.register("src", pa.table({"ts": ts, "type": types, "x": rng.integers(0, 10, n),
                                  "p": rng.integers(0, 3, n)}))
    con.cursor().execute("CREATE OR REPLACE TABLE sparse AS SELECT * FROM src")
    con.unregister("src")


@pytest.mark.parametrize("query", [
    "PATTERN SEQ(b x, a y, c z) FROM sparse WHERE z.x > x.x WITHIN 12",
    "PATTERN SEQ(~c n, a y, b z) FROM sparse WITHIN 8",
    "PATTERN SEQ(a y, b z, ~c n) FROM sparse PARTITION BY p WITHIN 25",
    "PATTERN SEQ(b x, ~c n, a y) FROM sparse USE skip-till-next-match WHERE n.x > x.x WITHIN 15",
    "PATTERN OR(SEQ(a y, b z), SEQ(c u, c w)) FROM sparse USE strict-contiguity WHERE u.x = 9 AND w.x = 9 "
    "WITHIN 10",
    "PATTERN SEQ(a y, b+{1,2} z) FROM sparse PARTITION BY p WHERE avg(z.x) > y.x WITHIN 20",
])
def test_filtering_before_matching_returns_the_same(con, query):
    _sparse(con)
    cur = con.cursor()
    cur.execute("SET matchrec_cer_filtering = never")
    full = rows(con, query + " RETURN *")
    plain = explain(con, "EXPLAIN ANALYZE " + query)
    cur.execute("SET matchrec_cer_filtering = always")
    filtered = rows(con, query + " RETURN *")
    text = explain(con, "EXPLAIN ANALYZE " + query)
    assert filtered == full and len(full) > 0
    read = int(text.split("events read ")[1].split()[0])
    read_all = int(plain.split("events read ")[1].split()[0])
    assert read < read_all / 2, text
    assert "filtering before matching: on, anchors y" in text or "anchors y, u" in text or "anchors u, y" in text


def test_filtering_reads_negated_events_inside_the_intervals(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE n AS SELECT * FROM (VALUES (0, 'c'), (100, 'a'), (101, 'c'), (102, 'b'), "
                "(200, 'a'), (203, 'b'), (300, 'c')) v(ts, type)")
    cur.execute("SET matchrec_cer_filtering = always")
    q = "PATTERN SEQ(a x, ~c n, b y) FROM n WITHIN 5 RETURN x.ts, y.ts"
    assert rows(con, q) == [(200, 203)]
    text = explain(con, "EXPLAIN ANALYZE " + q)
    assert "events read 5 of 7" in text and "2 anchor candidates -> 2 intervals" in text


def test_filtering_auto_turns_itself_off_when_intervals_cover_the_stream(con):
    _sparse(con)
    text = explain(con, "EXPLAIN PATTERN SEQ(b x, c z) FROM sparse WITHIN 500")
    assert "filtering before matching: off" in text and "cover" in text
    text = explain(con, "EXPLAIN PATTERN SEQ(b x, a y) FROM sparse WITHIN 5")
    assert "filtering before matching: on, anchors y" in text
    assert "filtering before matching: off, no WITHIN" in explain(con, "EXPLAIN PATTERN SEQ(b x, a y) FROM sparse")


def test_filtering_auto_counts_the_rows_of_each_partition(con):
    """200 cards with an event every 200 key units each and one rare event per card: over the whole
    key range the 200 intervals of 2 x 1,000 seem to cover everything twice, but each covers only
    about 1% of its own card's rows."""
    cur = con.cursor()
    cur.execute("""CREATE TABLE cards AS SELECT i AS ts, i % 200 AS card,
        CASE WHEN i // 200 = 3 * (i % 200) + 100 THEN 'r' ELSE 'n' END AS type FROM range(200000) t(i)""")
    q = "PATTERN SEQ(r x, n y) FROM cards PARTITION BY card WITHIN 1000"
    text = explain(con, "EXPLAIN ANALYZE " + q)
    assert "filtering before matching: on" in text and "of the rows (per partition)" in text, text
    assert int(text.split("events read ")[1].split()[0]) < 200000 / 20, text
    filtered = rows(con, q + " RETURN x.ts, y.ts")
    cur.execute("SET matchrec_cer_filtering = never")
    assert rows(con, q + " RETURN x.ts, y.ts") == filtered and len(filtered) == 1000
    cur.execute("SET matchrec_cer_filtering = auto")
    # without PARTITION BY the same candidates' windows do cover the key range: no filtering
    assert "filtering before matching: off" in explain(con, "EXPLAIN PATTERN SEQ(r x, n y) FROM cards WITHIN 1000")


# ---------------------------------------------------------------- planner and EXPLAIN
def test_explain_shows_the_plan(con):
    _sparse(con)
    text = explain(con, "EXPLAIN PATTERN SEQ(b x, a y, c z) FROM sparse WHERE x.x > 4 AND z.x > y.x WITHIN 12")
    assert "CER pattern SEQ(b x, a y, c z)" in text
    assert "strategy: skip-till-any-match" in text and "window: 12 key units" in text
    assert "events 3000; per type" in text and "a 5" in text or "a 6" in text
    assert "filter selectivity" in text and 'DuckDB: coalesce(("x" > 4), FALSE)' in text
    assert "condition z.x > y.x: selectivity" in text
    assert "matcher: mechanism batch\n    reason: skip-till-any-match: batch operator" in text
    con.cursor().execute("SET matchrec_cer_mechanism = chain")  # rarest element first
    text = explain(con, "EXPLAIN PATTERN SEQ(b x, a y, c z) FROM sparse WHERE x.x > 4 AND z.x > y.x WITHIN 12")
    assert "matcher: mechanism chain, order y, x, z\n    reason: forced by SET matchrec_cer_mechanism" in text


def test_mechanism_choice(con):
    _sparse(con)
    assert "mechanism rcep" in explain(con, "EXPLAIN PATTERN SEQ(a x, b+ y) FROM sparse WITHIN 9")
    assert "mechanism eager" in explain(con, "EXPLAIN PATTERN SEQ(a x, b y) FROM sparse USE skip-till-next-match")
    assert "mechanism eager" in explain(con, "EXPLAIN PATTERN SEQ(a x, b y) FROM sparse USE strict-contiguity")
    # a type whose rate changes between the halves of the stream: the batch operator, told so
    con.cursor().execute("CREATE TABLE drift AS SELECT i AS ts, CASE WHEN i < 500 AND i % 2 = 0 THEN 'a' "
                         "WHEN i % 10 = 0 THEN 'a' ELSE 'b' END AS type FROM range(1000) r(i)")
    text = explain(con, "EXPLAIN PATTERN SEQ(a x, b y) FROM drift WITHIN 3")
    assert "mechanism batch" in text and "rates vary over time (a: 250 then 50)" in text
    # AND: the NFAs search it as one partial order (the batch operator would take its permutations)
    text = explain(con, "EXPLAIN PATTERN AND(a x, b y) FROM drift WITHIN 3")
    assert "matcher: mechanism tree, order x, y\n    reason: AND, event rates vary" in text
    text = explain(con, "EXPLAIN PATTERN SEQ(a x, AND(b y, c z)) FROM sparse WITHIN 9")
    assert re.search(r"matcher: mechanism chain, order [^\n]+\n    reason: AND, stable event rates: lazy chain NFA", text)
    cur = con.cursor()
    cur.execute("SET matchrec_cer_mechanism = eager")
    text = explain(con, "EXPLAIN PATTERN SEQ(a x, b y) FROM drift WITHIN 3")
    assert "matcher: mechanism eager\n    reason: forced by SET matchrec_cer_mechanism" in text
    forced = rows(con, "PATTERN SEQ(a x, b y) FROM drift WITHIN 3 RETURN COUNT(*)")
    cur.execute("RESET matchrec_cer_mechanism")
    assert rows(con, "PATTERN SEQ(a x, b y) FROM drift WITHIN 3 RETURN COUNT(*)") == forced


def test_forcing_a_mechanism_that_does_not_support_the_pattern(con):
    _sparse(con)
    con.cursor().execute("SET matchrec_cer_mechanism = rcep")
    with pytest.raises(matchrec.NotSupportedError, match="matchrec_cer_mechanism = rcep: .*skip-till-any-match"):
        con.cursor().execute("PATTERN SEQ(a x, b+ y) FROM sparse USE skip-till-next-match WITHIN 9")
    con.cursor().execute("SET matchrec_cer_mechanism = batch")
    with pytest.raises(matchrec.NotSupportedError, match="= batch: .*skip-till-any-match only, not strict"):
        con.cursor().execute("PATTERN SEQ(a x, b y) FROM sparse USE strict-contiguity WITHIN 9")


def test_the_batch_operator_reports_its_plan_and_matches_as_the_nfas_do(con):
    _sparse(con)
    q = "PATTERN SEQ(b x, a y, ~b n, c z) FROM sparse WHERE x.x > 2 AND z.x > y.x WITHIN 40"
    text = explain(con, "EXPLAIN ANALYZE " + q)
    assert "mechanism batch" in text and "batch operator: 1 pattern(s) as 1 unit(s)" in text, text
    assert "statement 0: order " in text and "evaluation: " in text and "partial matches" in text, text
    got = rows(con, q + " RETURN x.ts, y.ts, z.ts")
    assert got and rows(con, q + " RETURN COUNT(*)") == [(len(got),)]
    for name in ("chain", "tree", "eager"):
        con.cursor().execute(f"SET matchrec_cer_mechanism = {name}")
        assert rows(con, q + " RETURN x.ts, y.ts, z.ts") == got, name


def test_explain_analyze_reports_reading_and_matches(con):
    _sparse(con)
    text = explain(con, "EXPLAIN ANALYZE PATTERN SEQ(a y, b z) FROM sparse WITHIN 4")
    n = rows(con, "PATTERN SEQ(a y, b z) FROM sparse WITHIN 4 RETURN COUNT(*)")[0][0]
    assert f"matches {n}" in text and "events read" in text and " of 3000" in text


# ---------------------------------------------------------------- limits
def test_match_limit_and_counting_past_it(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE many AS SELECT i AS ts, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS type "
                "FROM range(40) r(i)")
    q = "PATTERN SEQ(a x, b y) FROM many"
    assert rows(con, q + " RETURN COUNT(*)") == [(210,)]
    cur.execute("SET matchrec_cer_max_matches = 100")
    with pytest.raises(matchrec.OperationalError, match="matchrec_cer_max_matches"):
        cur.execute(q)
    assert rows(con, q + " RETURN COUNT(*)") == [(210,)]  # counting keeps no matches
    cur.execute("SET matchrec_cer_max_matches = 210")
    assert len(rows(con, q)) == 210
    with pytest.raises(matchrec.ProgrammingError, match="integer >= 1"):
        cur.execute("SET matchrec_cer_max_matches = 0")


def test_partial_match_limit_of_the_eager_nfa(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE many AS SELECT i AS ts, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS type "
                "FROM range(40) r(i)")
    q = "PATTERN SEQ(a x, b y) FROM many RETURN COUNT(*)"
    cur.execute("SET matchrec_cer_mechanism = eager")
    cur.execute("SET matchrec_cer_max_partial_matches = 19")
    with pytest.raises(matchrec.OperationalError, match="matchrec_cer_max_partial_matches"):
        cur.execute(q)
    cur.execute("SET matchrec_cer_max_partial_matches = 20")  # one waiting instance per a
    assert rows(con, q) == [(210,)]
    cur.execute("SET matchrec_cer_max_partial_matches = 1")
    cur.execute("SET matchrec_cer_mechanism = chain")  # lazy: buffers events, no partial matches
    assert rows(con, q) == [(210,)]
    cur.execute("RESET matchrec_cer_max_partial_matches")
    cur.execute("SET matchrec_cer_mechanism = eager")
    assert rows(con, q) == [(210,)]
    with pytest.raises(matchrec.ProgrammingError, match="integer >= 1"):
        cur.execute("SET matchrec_cer_max_partial_matches = -3")


# ---------------------------------------------------------------- MATCH_RECOGNIZE ... STRATEGY
MR_TABLE = """CREATE TABLE ticks AS SELECT * FROM (VALUES
    (1, 'x', 10), (2, 'x', 8), (3, 'x', 9), (4, 'x', 7), (5, 'x', 12), (6, 'x', 13),
    (1, 'y', 5), (2, 'y', 6), (4, 'y', 4), (7, 'y', 9)) v(t, sym, price)"""


def test_match_recognize_strategy_clause(con):
    cur = con.cursor()
    cur.execute(MR_TABLE)
    mr = ("SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY sym ORDER BY t MEASURES A.t AS s, last(B.t) AS e, "
          "count(B.*) AS n PATTERN (A B+ C) WITHIN 4 STRATEGY skip-till-any-match "
          "DEFINE A AS price >= 9, B AS B.price < 10, C AS C.price > A.price)")
    got = rows(con, mr)
    # by hand, skip-till-any-match: every A, every non-empty set of B rows between A and C, every C
    x = {1: 10, 2: 8, 3: 9, 4: 7, 5: 12, 6: 13}  # sym y never has a price >= 9 before its last row
    expected = []
    for a in x:
        for c in x:
            if not (x[a] >= 9 and c > a and c - a <= 4 and x[c] > x[a]):
                continue
            mids = [t for t in x if a < t < c and x[t] < 10]
            for k in range(1, len(mids) + 1):
                expected += [(a, bs[-1], k) for bs in itertools.combinations(mids, k)]
    assert len(expected) > 5 and sorted(got) == sorted(expected)
    nxt = rows(con, mr.replace("skip-till-any-match", "skip-till-next-match"))
    assert set(nxt) <= set(got) and (1, 4, 3) in nxt and (1, 2, 1) not in nxt
    strict = rows(con, mr.replace("skip-till-any-match", "strict-contiguity"))
    assert (3, 4, 1) in strict and all(e == s + n for s, e, n in strict)


def test_match_recognize_strategy_defaults_to_the_matched_rows_and_explains(con):
    cur = con.cursor()
    cur.execute(MR_TABLE)
    base = ("SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY sym ORDER BY t PATTERN (A B{2,2}) "
            "STRATEGY strict-contiguity DEFINE A AS price > 9, B AS price < 10)")
    table = cur.execute(base).fetch_arrow_table()
    assert table.column_names == ["A_t", "A_sym", "A_price", "B_t", "B_sym", "B_price"]
    assert table.to_pylist() == [{"A_t": 1, "A_sym": "x", "A_price": 10, "B_t": [2, 3], "B_sym": ["x", "x"],
                                  "B_price": [8, 9]}]
    text = explain(con, "EXPLAIN " + base)
    assert "CER pattern SEQ(A, B+{2,2})" in text and "strategy: strict-contiguity" in text


@pytest.mark.parametrize("statement,problem", [
    ("SELECT * FROM ticks MATCH_RECOGNIZE (ORDER BY t PATTERN (A B*) STRATEGY skip-till-any-match "
     "DEFINE A AS price > 1)", "unexpected '*'"),
    ("SELECT * FROM ticks MATCH_RECOGNIZE (ORDER BY t ALL ROWS PER MATCH PATTERN (A B) "
     "STRATEGY skip-till-any-match DEFINE A AS price > 1)", "unexpected 'ALL'"),
    ("SELECT s FROM ticks MATCH_RECOGNIZE (ORDER BY t PATTERN (A B) STRATEGY skip-till-any-match "
     "DEFINE A AS price > 1)", "unexpected 's'"),
    ("SELECT * FROM ticks MATCH_RECOGNIZE (ORDER BY t PATTERN (A B) STRATEGY skip-till-any-match "
     "DEFINE B AS price > PREV(price))", "PREV() is not available"),
    ("SELECT * FROM ticks MATCH_RECOGNIZE (ORDER BY t PATTERN (A B A) STRATEGY skip-till-any-match)",
     "appears twice"),
])
def test_match_recognize_strategy_rejects_other_forms(con, statement, problem):
    con.cursor().execute(MR_TABLE)
    with pytest.raises((matchrec.NotSupportedError, matchrec.ProgrammingError)) as info:
        con.cursor().execute(statement)
    assert problem in str(info.value)
    if "unexpected" in problem:
        assert isinstance(info.value, matchrec.NotSupportedError) and "supports the form" in str(info.value)


def test_ordinary_match_recognize_is_untouched(con):
    con.cursor().execute(MR_TABLE)
    got = rows(con, "SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY sym ORDER BY t MEASURES A.t AS s "
                    "PATTERN (A B) DEFINE B AS price < PREV(price)) ORDER BY sym, s")
    assert got == [("x", 1), ("x", 3), ("y", 2)]
