"""Arrow evaluation of chunk conditions against DuckDB evaluating the same SQL.

The compiled matcher evaluates simple PREV/NEXT conditions with Arrow compute; what it accepts
must mean exactly what DuckDB means, NULLs, NaN and mixed number types included. Random
expressions over random columns are evaluated both ways; anything Arrow refuses must be
refused at compile time, never answered differently.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import matchrec
from matchrec.engine import arrow_eval

N = 64


def _table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)

    def with_nulls(values, typ):
        mask = rng.random(N) < 0.15
        return pa.array([None if m else v for m, v in zip(mask, values.tolist())], typ)

    floats = rng.choice([-1.5, 0.0, 1.0, 2.5, np.nan, np.inf, -np.inf], N)
    return pa.table({
        "i": with_nulls(rng.integers(-3, 4, N), pa.int64()),
        "j": with_nulls(rng.integers(-3, 4, N), pa.int32()),
        "f": with_nulls(floats, pa.float64()),
        "g": with_nulls(rng.choice([-1.5, 1.0, np.nan], N), pa.float64()),
        "h": with_nulls(rng.choice([-1.5, 1.0, np.nan], N), pa.float32()),
        "s": with_nulls(rng.choice(["a", "b", "ab", ""], N), pa.string()),
        "b": with_nulls(rng.random(N) < 0.5, pa.bool_()),
    })


numbers = st.sampled_from(["i", "j", "f", "g", "h", "1", "0", "2.5", "-1", "(i + 1)", "(f - g)", "(i * 2)",
                           "(-f)", "(f + 1)"])
strings = st.sampled_from(["s", "'a'", "'ab'"])
ops = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])


@st.composite
def comparison(draw):
    if draw(st.integers(0, 3)) == 0:
        return f"({draw(strings)} {draw(ops)} {draw(strings)})"
    return f"({draw(numbers)} {draw(ops)} {draw(numbers)})"


def condition(depth: int = 3):
    leaf = st.one_of(comparison(), st.sampled_from(["b", "(b = true)", "(f IS NULL)", "(i IS NOT NULL)"]))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda c: f"(NOT {c})")), max_leaves=6)


def _duckdb_values(table: pa.Table, sql: str) -> list:
    con = duckdb.connect()
    con.register("t", table)
    return [r[0] for r in con.execute(f"SELECT {sql} FROM t").fetchall()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sql=condition(), seed=st.integers(0, 20))
def test_arrow_agrees_with_duckdb(sql, seed):
    table = _table(seed)
    fn = arrow_eval.compile_condition(sql, {name: table.schema.field(name).type for name in table.column_names})
    if fn is None:
        return  # refused: DuckDB evaluates it; see test_accepts_the_common_shapes for coverage
    columns = {name: table.column(name) for name in table.column_names}
    try:
        got = fn(columns)
    except pa.ArrowInvalid:  # overflow: the engine falls back to DuckDB
        return
    got = [got.as_py()] * N if isinstance(got, pa.Scalar) else got.to_pylist()
    assert got == _duckdb_values(table, sql), sql


def test_accepts_the_common_shapes():
    types = {"i": pa.int64(), "f": pa.float64(), "s": pa.string(), "__mr_s0": pa.float64(), "j": pa.int32()}
    for sql in ("f < __mr_s0", "(f > __mr_s0) AND (i = 3)", "NOT (f <= __mr_s0 + 1.5)", "s = 'x' OR f IS NULL",
                "i * 2 >= -1", "j < 4"):
        assert arrow_eval.compile_condition(sql, types) is not None, sql
    # outside what Arrow reproduces exactly: left to DuckDB
    for sql in ("f / 2 > 1", "i > 1.5", "j + 1 > 2", "lower(s) = 'a'", "s < 1", "CAST(i AS DOUBLE) > f"):
        assert arrow_eval.compile_condition(sql, types) is None, sql


@pytest.mark.parametrize("fast_path", [0, 1])
def test_nan_is_ordered_as_duckdb_orders_it(fast_path):
    """NaN equals NaN and is above every other number, in DEFINE and in MEASURES, on both matchers."""
    con = matchrec.connect()
    cur = con.cursor()
    cur.execute(f"SET matchrec_fast_path = {fast_path}")
    cur.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 1.0), (2, 'nan'::DOUBLE), (3, 'nan'::DOUBLE), "
                "(4, 5.0), (5, 6.0), (6, 'nan'::DOUBLE)) v(i, x)")
    cur.execute("""SELECT * FROM t MATCH_RECOGNIZE (ORDER BY i
        MEASURES count(*) AS n, max(x) AS mx, min(x) AS mn, LAST(x) > FIRST(x) AS up
        ONE ROW PER MATCH PATTERN (A B+) DEFINE B AS B.x >= PREV(B.x))""")
    rows = cur.fetchall()
    assert [(n, str(mx), mn, up) for n, mx, mn, up in rows] == [(3, "nan", 1.0, True), (3, "nan", 5.0, True)]
    cur.execute("""SELECT * FROM t MATCH_RECOGNIZE (ORDER BY i MEASURES count(*) AS n ONE ROW PER MATCH
        PATTERN (A B+) DEFINE B AS B.x >= LAST(A.x))""")
    assert cur.fetchall() == [(6,)]
    cur.execute("""SELECT * FROM t MATCH_RECOGNIZE (ORDER BY i MEASURES count(*) AS n ONE ROW PER MATCH
        PATTERN (A B+) DEFINE B AS B.x = LAST(A.x))""")
    assert cur.fetchall() == [(2,)]  # rows 2-3: NaN = NaN
