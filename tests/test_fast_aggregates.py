"""DEFINEs with running aggregates and FIRST/LAST of other variables: compiled vs reference.

Seeded random inputs (integers, floats and DECIMALs with NULLs, NaN, -0.0) and random patterns
whose DEFINEs draw aggregates (count, sum, avg, min, max over a variable, a subset or the whole
match), arithmetic over them (``sum(A.d) - A.d <= sum(B.d)``, division, unary minus, integer
with DECIMAL and with float operands), CLASSIFIER() and MATCH_NUMBER(), string and DECIMAL
comparisons between the current row and another variable's, FIRST/LAST of any variable (with PREV/NEXT around them),
FIRST/LAST with logical offsets (``FIRST(A.v, 2)``, ``LAST(U.f, 1)``), bool_and/bool_or,
PREV/NEXT(CLASSIFIER(), n), DISTINCT aggregates (a reference-path form) and plain row conditions;
MEASURES draw RUNNING/FINAL forms of the same.
Each query runs on the reference matcher (``SET matchrec_fast_path = 0``) with every measure row
by row (``output.ROW_BY_ROW``) and on the fast path with column-wise measures; the results must be
equal, and most cases must run on the compiled matcher alone.

  pytest tests/test_fast_aggregates.py              60 cases
  pytest tests/test_fast_aggregates.py -m slow      2,000 more (MATCHREC_AGG_CASES)
"""
from __future__ import annotations

import os
import random

import pytest

import matchrec
from matchrec.engine import output

FAST_CASES = 30
REFERENCE_THREADS = 5000
SLOW_CASES = int(os.environ.get("MATCHREC_AGG_CASES", "2000"))
LABELS = ["A", "B", "C"]
PATTERNS = ["A+ B", "A B+ C?", "(A | B)+ C", "A* B+", "A{1,3} B+ C*", "(A B)+", "A+? B", "A (B | C)+",
            "A+ B+", "PERMUTE(A, B) C*", "A B* C+?", "A+"]
OPS = ["<", "<=", ">", ">=", "=", "<>"]


@pytest.fixture(scope="module")
def con():
    c = matchrec.connect()
    rnd = random.Random(7)
    drnd = random.Random(8)  # the DECIMAL column draws apart, so v and f are as before
    brnd = random.Random(9)  # and the boolean
    rows = []
    for i in range(600):
        v = None if rnd.random() < 0.12 else rnd.randint(-20, 60)
        r = rnd.random()
        f = None if r < 0.1 else float("nan") if r < 0.13 else -0.0 if r < 0.16 else round(rnd.uniform(-5, 25), 2)
        d = None if drnd.random() < 0.1 else f"{drnd.randint(-500, 3000) / 100:.2f}"
        s = None if drnd.random() < 0.1 else drnd.choice(["", "a", "b", "ab", "B", "é", "ba", "a "])
        b = None if brnd.random() < 0.1 else brnd.random() < 0.7
        rows.append((i // 25 if i < 400 else 16 + (i - 400) // 7, i, v, f, d, s, b))
    cur = c.cursor()
    cur.execute("CREATE TABLE t (p INTEGER, id INTEGER, v BIGINT, f DOUBLE, d DECIMAL(9, 2), s VARCHAR, b BOOLEAN)")
    cur.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    cur.close()
    yield c
    c.close()


def _var(rnd, labels, universal=True) -> str:
    return rnd.choice(labels + ["U"] + ([""] if universal else []))


def _col(var: str, name: str) -> str:
    return f"{var}.{name}" if var else name


def _operand(rnd, label: str, labels: list[str], col: str) -> str:
    """An aggregate, a value of the current row or a constant, for arithmetic."""
    kind = rnd.randrange(5)
    if kind == 0:
        return f"{label}.{col}"
    if kind == 1:
        return rnd.choice(["3", "-2", "0", "2.5", "0.25", "1e1"])
    if kind == 2:
        return f"count({_var(rnd, labels, False)}.*)"
    func = rnd.choice(["sum", "avg", "min", "max", "count"])
    return f"{func}({_col(_var(rnd, labels), col)})"


def _arithmetic(rnd, label: str, labels: list[str]) -> str:
    """Arithmetic over aggregates (``sum(A.d) - A.d <= sum(B.d)``), mostly of one column's type."""
    col = rnd.choice(["v", "f", "d", "d"])
    op = rnd.choice(OPS)
    left = f"{_operand(rnd, label, labels, col)} {rnd.choice(['+', '-', '*', '/'])} " \
           f"{_operand(rnd, label, labels, col if rnd.random() < 0.8 else rnd.choice(['v', 'f', 'd']))}"
    if rnd.random() < 0.2:
        left = f"-({left})"
    right = _operand(rnd, label, labels, col)
    if rnd.random() < 0.3:
        right = f"{right} {rnd.choice(['+', '-', '*'])} {_operand(rnd, label, labels, col)}"
    return f"{left} {op} {right}"


def _special(rnd, label: str, labels: list[str]) -> str:
    """CLASSIFIER() and MATCH_NUMBER() in a DEFINE (some forms stay on the reference path)."""
    kind = rnd.randrange(6)
    if kind == 0:
        return f"CLASSIFIER() {rnd.choice(['=', '<>', '<'])} '{rnd.choice(labels)}'"
    if kind == 1:
        names = ", ".join(f"'{x}'" for x in rnd.sample(labels + ["Z"], 2))
        return f"CLASSIFIER(){rnd.choice(['', ' NOT'])} IN ({names})"
    if kind == 2:
        return f"MATCH_NUMBER() {rnd.choice(OPS)} {rnd.randint(1, 6)}"
    if kind == 3:
        return f"{label}.v {rnd.choice(OPS)} MATCH_NUMBER() * {rnd.randint(1, 4)} - {rnd.randint(0, 10)}"
    if kind == 4:
        return f"count(*) + MATCH_NUMBER() {rnd.choice(OPS)} {rnd.randint(2, 9)}"
    nav = rnd.choice(["PREV(CLASSIFIER())", "PREV(CLASSIFIER())", "PREV(CLASSIFIER(), 2)"])
    return f"{nav} {rnd.choice(['=', '<>'])} '{rnd.choice(labels + ['Z'])}'"


def _between_rows(rnd, label: str, labels: list[str]) -> str:
    """The current row against the last row of a variable, on strings or DECIMALs (and integers)."""
    col, other = rnd.choice([("s", "s"), ("d", "d"), ("d", "v"), ("v", "d"), ("d", "d * 2"), ("s", "s || 'a'")])
    var = rnd.choice(labels + ["U"])
    off = ", 1" if var in (label, "U") else ""
    value = f"LAST({var}.{other}{off})"
    if rnd.random() < 0.3:
        value = f"PREV({value})"
    if rnd.random() < 0.2:
        value = f"coalesce({value}, {repr('b') if col == 's' else '3.5'})"
    return f"{label}.{col} {rnd.choice(OPS)} {value}"


def _logical(rnd, label: str, labels: list[str]) -> str:
    """bool_and/bool_or, FIRST/LAST with logical offsets, CLASSIFIER of rows before or after (Trino's every
    is bool_and; DuckDB has no every)."""
    kind = rnd.randrange(6)
    var = _var(rnd, labels)
    if kind == 0:
        func = rnd.choice(["bool_and", "bool_or"])
        arg = _col(var, "b") if rnd.random() < 0.6 else f"{_col(var, 'v')} > {rnd.randint(0, 40)}"
        out = f"{func}({arg})"
        return rnd.choice([out, f"NOT {out}", f"{out} IS NULL", f"{out} = {rnd.choice(['TRUE', 'FALSE'])}"])
    if kind in (1, 2):
        col = rnd.choice(["v", "f", "d", "v"])
        nav = f"{rnd.choice(['FIRST', 'LAST'])}({_col(var, col)}, {rnd.randint(0, 3)})"
        if rnd.random() < 0.25:
            nav = f"{rnd.choice(['PREV', 'NEXT'])}({nav}{rnd.choice(['', ', 2'])})"
        other = f"{label}.{col}" if rnd.random() < 0.7 else str(rnd.randint(-5, 40))
        if rnd.random() < 0.2:
            return f"{nav} IS {rnd.choice(['', 'NOT '])}NULL"
        return f"{other} {rnd.choice(OPS)} {nav}"
    if kind == 3:
        nav = rnd.choice(["PREV", "PREV", "NEXT"])
        return f"{nav}(CLASSIFIER(), {rnd.randint(1, 3)}) {rnd.choice(['=', '<>'])} '{rnd.choice(labels + ['Z'])}'"
    if kind == 4:
        return f"count(DISTINCT {_col(var, 'v')}) {rnd.choice(OPS)} {rnd.randint(1, 4)}"  # the reference path
    return f"{label}.v {rnd.choice(OPS)} FIRST({_col(var, 'v')}, {rnd.randint(1, 2)}) + LAST({_col(var, 'v')}, 1)"


def _measures(rnd, labels: list[str]) -> str:
    """A few RUNNING/FINAL measures of the same forms (ALL ROWS shows RUNNING row by row)."""
    forms = [lambda v: f"bool_and({_col(v, 'b')})", lambda v: f"bool_or({_col(v, 'v')} > 30)",
             lambda v: f"FIRST({_col(v, 'v')}, {rnd.randint(1, 3)})", lambda v: f"LAST({_col(v, 'f')}, 1)",
             lambda v: "PREV(CLASSIFIER(), 2)", lambda v: "NEXT(CLASSIFIER())", lambda v: f"count(DISTINCT {_col(v, 'v')})",
             lambda v: f"max({_col(v, 'd')})"]
    out = []
    for k in range(rnd.randint(1, 3)):
        sem = rnd.choice(["RUNNING ", "FINAL ", ""])
        out.append(f"{sem}{rnd.choice(forms)(_var(rnd, labels))} AS m{k}")
    return ", ".join(out)


def _term(rnd, label: str, labels: list[str]) -> str:
    kind = rnd.randrange(15)
    if kind >= 13:
        return _logical(rnd, label, labels)
    if kind == 12:
        return _between_rows(rnd, label, labels)
    if kind == 11:
        return _special(rnd, label, labels)
    if kind >= 9:
        return _arithmetic(rnd, label, labels)
    col = rnd.choice(["v", "f", "d"])
    op = rnd.choice(OPS)
    if kind == 0:
        return f"count({_var(rnd, labels, False)}.*) {op} {rnd.randint(0, 5)}" if rnd.random() < 0.7 else \
            f"count(*) {op} {rnd.randint(1, 7)}"
    if kind in (1, 2):
        func = rnd.choice(["count", "sum", "avg", "min", "max"])
        bound = rnd.randint(-10, 200) if func in ("sum", "count") else rnd.randint(-5, 50)
        return f"{func}({_col(_var(rnd, labels), col)}) {op} {bound}"
    if kind == 3:
        func = rnd.choice(["sum", "avg", "min", "max"])
        return f"{func}({_col(_var(rnd, labels), col)}) {op} {label}.{col}"
    if kind == 4:
        return f"{label}.{col} {op} FIRST({_col(_var(rnd, labels), col)}) + {rnd.randint(-20, 20)}"
    if kind == 5:
        nav = rnd.choice(["FIRST", "LAST"])
        var = rnd.choice(labels + ["U"])
        off = ", 1" if nav == "LAST" and var in (label, "U") else ""
        return f"{label}.{col} {op} {nav}({var}.{col}{off})"
    if kind == 6:
        return f"FIRST({_col(_var(rnd, labels), col)}) IS {rnd.choice(['', 'NOT '])}NULL"
    if kind == 7:
        return f"PREV(FIRST({rnd.choice(labels)}.{col})) {op} {label}.{col}"
    return f"{label}.v {op} {rnd.randint(0, 40)}"


def random_query(seed: int) -> str:
    rnd = random.Random(seed)
    pattern = rnd.choice(PATTERNS)
    labels = [x for x in LABELS if x in pattern]
    defines = []
    for label in labels:
        if rnd.random() < 0.15:
            continue  # an undefined variable is TRUE
        terms = [_term(rnd, label, labels) for _ in range(rnd.randint(1, 2))]
        glue = " AND " if rnd.random() < 0.7 else " OR "
        expr = glue.join(terms)
        if rnd.random() < 0.1:
            expr = f"NOT ({expr})"
        defines.append(f"{label} AS {expr}")
    if not defines:
        defines = ["A AS count(*) < 4"]
    rows = rnd.choice(["ONE ROW PER MATCH", "ALL ROWS PER MATCH"])
    skip = rnd.choice(["PAST LAST ROW", "TO NEXT ROW"])
    return (f"SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY p ORDER BY id "
            f"MEASURES FIRST(id) AS fid, LAST(id) AS lid, count(*) AS n, sum(v) AS sv, sum(d) AS sd, "
            f"{_measures(rnd, labels)} "
            f"{rows} AFTER MATCH SKIP {skip} PATTERN ({pattern}) SUBSET U = ({', '.join(labels[:2])}) "
            f"DEFINE {', '.join(defines)})")


def run(con, sql: str, fast: int):
    cur = con.cursor()
    output.ROW_BY_ROW = not fast  # the reference: every measure by the defining evaluation
    try:
        cur.execute(f"SET matchrec_fast_path = {fast}")
        # the reference keys its threads on whole label histories: bound what a case may cost
        cur.execute(f"SET matchrec_max_threads = {REFERENCE_THREADS}")
        cur.execute(sql)
        # NaN is not equal to itself: compare it by name
        rows = sorted((tuple("NaN" if isinstance(x, float) and x != x else x for x in row) for row in cur.fetchall()),
                      key=repr)
        matcher = cur.stats[0][1].matcher if cur.stats else None
        return rows, matcher
    except matchrec.Error as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0]}", None
    finally:
        output.ROW_BY_ROW = False
        cur.close()


def check(con, seed: int) -> str | None:
    sql = random_query(seed)
    reference, _ = run(con, sql, 0)
    fast, matcher = run(con, sql, 1)
    if isinstance(reference, str) and "simultaneous threads" in reference:
        return None  # the reference gave up; the compiled matcher keeps far fewer threads
    assert fast == reference, f"seed {seed}: {sql}\nreference: {reference!r:.2000}\nfast: {fast!r:.2000}"
    return matcher


def test_random_aggregate_and_navigation_defines(con):
    compiled = 0
    for seed in range(FAST_CASES):
        compiled += check(con, seed) == "compiled"
    # most random DEFINEs are within what the compiled matcher keeps per thread
    assert compiled >= FAST_CASES * 0.6, compiled


@pytest.mark.slow
def test_random_aggregate_and_navigation_defines_many(con):
    for seed in range(100_000, 100_000 + SLOW_CASES):
        check(con, seed)


@pytest.mark.parametrize("define, compiled", [
    ("A AS sum(A.v) < 150", True),
    ("A AS count(A.*) <= 4 AND count(*) < 6", True),
    ("B AS B.v >= FIRST(A.v) - 10", True),
    ("A AS avg(A.f) > 2 OR min(U.v) IS NULL, B AS max(f) >= B.f", True),
    ("A AS count(A.v) < 3 AND PREV(FIRST(v)) IS NOT NULL", True),
    ("A AS sum(A.v) * 2 < 150", True),  # arithmetic on an aggregate
    ("A AS sum(A.d) - A.d <= sum(B.d) OR count(B.*) = 0", True),  # DECIMALs as scaled integers
    ("A AS count(*) < 4 AND sum(A.d) < 100.5", True),
    ("A AS avg(A.d) / 2 >= -min(U.v) + 0.5e0", True),
    ("A AS avg(A.d) / 2 >= -min(U.v) + 0.5", False),  # a float (avg) compared with a DECIMAL: reference
    ("A AS sum(A.d) < 1e3", False),  # a DECIMAL compared with a float: reference
    ("A AS sum(A.d) + A.f < 100", False),  # DECIMAL and float arithmetic: reference
    ("A AS count(DISTINCT A.v) < 3", False),
    ("B AS B.v > FIRST(A.v, 1)", True),  # a logical offset: the thread keeps the set's count and second row
    ("B AS B.v >= LAST(A.v, 2) AND LAST(U.v, 3) IS NOT NULL", True),  # the set's last rows
    ("A AS bool_and(A.v > 0) AND NOT bool_or(U.v > 50)", True),  # every/any: min/max of booleans
    ("A AS string_agg(A.s, ',') <> 'x'", False),  # array and string aggregates in DEFINE: reference
    ("A AS CLASSIFIER() = 'A' AND sum(A.v) < 100", True),  # the current row's label: a constant
    ("B AS CLASSIFIER() IN ('A', 'C') OR MATCH_NUMBER() * 2 <= count(*)", True),
    ("B AS PREV(CLASSIFIER()) = 'A' AND count(*) > 1", True),  # the label of the thread's last row
    ("B AS PREV(CLASSIFIER(), 2) = 'A'", True),  # labels further back: the thread's last labels
    ("B AS NEXT(CLASSIFIER()) = 'B' OR count(*) > 2", True),  # NULL in a DEFINE: no later row is labelled
    ("B AS count(A.v) FILTER (WHERE A.v > 3) < 3", False),  # FILTER: reference
    ("A AS MATCH_NUMBER() < 3 AND count(DISTINCT A.v) < 3", False),  # beside a residual part: reference
])
def test_which_path_and_explain(con, define, compiled):
    sql = (f"SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY p ORDER BY id "
           f"MEASURES count(*) AS n ONE ROW PER MATCH PATTERN (A+ B*) SUBSET U = (A, B) DEFINE {define})")
    reference, _ = run(con, sql, 0)
    fast, matcher = run(con, sql, 1)
    assert fast == reference and len(fast) > 5
    assert (matcher == "compiled") == compiled, matcher
    cur = con.cursor()
    cur.execute("SET matchrec_fast_path = 1")
    cur.execute("EXPLAIN " + sql)
    text = cur.fetchall()[0][1]
    cur.close()
    if compiled:
        assert "matcher: compiled (numba Pike VM)\n" in text + "\n" and "residual" not in text
        if "sum" in define or "count" in define or "avg" in define or "max" in define:
            assert "per-thread running aggregate" in text
    else:
        assert "residual (reference matcher)" in text


def test_running_sum_is_linear():
    """A running sum over one long partition: each row costs the same, whatever the match length."""
    import time
    c = matchrec.connect()
    cur = c.cursor()
    times = []
    for n in (20_000, 80_000):
        cur.execute(f"CREATE OR REPLACE TABLE s AS SELECT i AS id, i % 7 AS v FROM range({n}) r(i)")
        sql = ("SELECT * FROM s MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n ONE ROW PER MATCH "
               "PATTERN (A+) DEFINE A AS sum(A.v) < 1e12)")
        cur.execute(sql)  # warm (compiles the kernels once)
        started = time.perf_counter()
        cur.execute(sql)
        assert cur.fetchall() == [(n,)]
        times.append(time.perf_counter() - started)
        assert cur.stats[0][1].matcher == "compiled"
    # quadratic would be 16x; linear is 4x plus fixed costs (noisy shared machine: generous bound)
    assert times[1] < times[0] * 10, times
    c.close()


def test_integer_sum_beyond_exact_range_falls_back_to_the_reference():
    c = matchrec.connect()
    cur = c.cursor()
    cur.execute("CREATE TABLE h AS SELECT i AS id, 4000000000000000 AS v FROM range(10) r(i)")
    cur.execute("SELECT * FROM h MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n ONE ROW PER MATCH "
                "PATTERN (A+) DEFINE A AS sum(A.v) > 0)")
    assert cur.fetchall() == [(10,)]
    c.close()


@pytest.mark.parametrize("define", ["B AS B.v * FIRST(A.v) > 0",  # a product past 2**53, no aggregate
                                    "B AS B.d * MATCH_NUMBER() <= FIRST(A.d)"])
def test_exact_arithmetic_beyond_its_range_hands_the_chunk_to_the_reference(define):
    c = matchrec.connect()
    cur = c.cursor()
    cur.execute("CREATE TABLE h AS SELECT i AS id, 4000000000000000 + i AS v, "
                "(999999999999999.99 - i)::DECIMAL(17, 2) AS d FROM range(12) r(i)")
    sql = (f"SELECT * FROM h MATCH_RECOGNIZE (ORDER BY id MEASURES count(*) AS n, MATCH_NUMBER() AS m "
           f"ONE ROW PER MATCH PATTERN (A B+) DEFINE {define})")
    results = []
    for fast in (0, 1):
        cur.execute(f"SET matchrec_fast_path = {fast}")
        cur.execute(sql)
        results.append(cur.fetchall())
    assert results[0] == results[1] and results[0]
    c.close()


def test_logical_offsets_and_boolean_aggregates_in_measures_are_column_wise(con):
    """FIRST/LAST with logical offsets over a variable set and bool_and/bool_or, RUNNING and FINAL:
    computed a column at a time (of a column; an expression argument stays row by row), equal to the
    row-by-row evaluation."""
    sql = ("SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY p ORDER BY id MEASURES FINAL bool_and(A.b) AS fa, "
           "RUNNING bool_or(U.b) AS ro, RUNNING FIRST(A.v, 1) AS f1, FINAL LAST(U.f, 2) AS l2, "
           "LAST(B.d, 1) AS lb, PREV(CLASSIFIER(), 2) AS pc ALL ROWS PER MATCH PATTERN (A+ B* C?) "
           "SUBSET U = (A, B) DEFINE A AS count(A.*) <= 4, B AS B.v > FIRST(A.v, 1) - 5)")
    reference, _ = run(con, sql, 0)
    cur = con.cursor()
    cur.execute("SET matchrec_fast_path = 1")
    cur.execute(sql)
    fast = sorted((tuple("NaN" if isinstance(x, float) and x != x else x for x in row) for row in cur.fetchall()),
                  key=repr)
    stats = cur.stats[0][1]
    cur.close()
    assert fast == reference and len(fast) > 50
    assert stats.matcher == "compiled"
    assert stats.extra["measures computed row by row"] == 0, stats.extra
