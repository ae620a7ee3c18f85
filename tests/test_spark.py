"""Spark: the three forms (table function, DataFrame, full SQL), distributed matching, the time
split of unpartitioned WITHIN patterns, interval filtering, errors, EXPLAIN ANALYZE - each
checked against matchrec on DuckDB over the same rows, on a real local[2] Spark."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

import matchrec
import matchrec.spark as ms
from spark_conformance import rows_match, spark_session


@pytest.fixture(scope="module")
def spark():
    session = spark_session()
    yield session
    session.stop()


def _sorted(rows):
    return sorted((tuple(r) for r in rows), key=repr)


def _duck(table: pa.Table, name: str, sql: str, dialect: str = "spark"):
    con = matchrec.connect(dialect=dialect)
    con.register(name, table)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _view(spark, table: pa.Table, name: str):
    df = spark.createDataFrame(table)
    df.createOrReplaceTempView(name)
    return df


def check_interval_filtering(spark, view, where: str) -> None:
    """An unpartitioned WITHIN pattern with rare ends over a Spark view: equal to DuckDB with interval
    filtering on, and EXPLAIN ANALYZE's shuffle bytes at most half of those without it."""
    from spark_conformance import rows_match
    data = events(n=3000, keys=3, seed=7)
    view(spark, data, "evf")
    q = ("SELECT * FROM evf MATCH_RECOGNIZE (ORDER BY ts MEASURES A.ts AS a, B.ts AS b PATTERN (A N*? B) "
         "WITHIN 6 DEFINE A AS type = 'a' AND v < 3, B AS type = 'b' AND v > 47, N AS true)")
    want = _duck(data, "evf", q)
    assert want and rows_match(want, ms.sql(spark, q, interval_filter="on").collect())
    assert ms.last_runs()[0].filtering.used
    lines = [r[0] for r in ms.sql(spark, "EXPLAIN ANALYZE " + q, interval_filter="on").collect()]
    with_f = int(next(x for x in lines if x.strip().startswith("shuffle:")).split()[1])
    without = next(x for x in lines if "without interval filtering" in x)
    print(f"\n{where} EXPLAIN ANALYZE: {with_f} shuffle bytes with interval filtering; {without.strip()}")
    assert f"{len(want)} result rows" in without
    assert int(without.split(": ")[1].split()[0]) > 2 * with_f > 0


def events(n=600, keys=4, seed=1, ties=False) -> pa.Table:
    """Random events over a few partition keys, with strictly increasing keys, or with ``ties``
    repeated ones (the source's order breaks them on both paths) and one NULL key."""
    rng = random.Random(seed)
    ts, t = [], 0
    for _ in range(n):
        t += rng.choice((0, 1, 1, 2, 3)) if ties else rng.randint(1, 4)
        ts.append(t)
    if ties:
        ts[n // 2] = None
    return pa.table({
        "k": pa.array([f"k{rng.randrange(keys)}" for _ in range(n)]),
        "ts": pa.array(ts, pa.int64()),
        "type": pa.array([rng.choice("aabbccdd") for _ in range(n)]),
        "v": pa.array([rng.randint(0, 50) for _ in range(n)], pa.int64()),
        "g": pa.array([rng.randint(0, 3) for _ in range(n)], pa.int32()),
    })


QUERIES = [
    # partitioned, ONE ROW PER MATCH with aggregates and navigation
    "SELECT * FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES FIRST(A.ts) AS s, LAST(B.v) AS lv, "
    "count(B.*) AS nb, avg(B.v) AS ab PATTERN (A B+) DEFINE B AS v > PREV(v))",
    # ALL ROWS PER MATCH, CLASSIFIER, MATCH_NUMBER, RUNNING/FINAL
    "SELECT k, ts, cl, mn, r, f FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES CLASSIFIER() AS cl, "
    "MATCH_NUMBER() AS mn, RUNNING count(*) AS r, FINAL count(*) AS f ALL ROWS PER MATCH "
    "AFTER MATCH SKIP TO NEXT ROW PATTERN (A B{1,3} C?) DEFINE A AS type = 'a', B AS type <> 'a', "
    "C AS type = 'c')",
    # unpartitioned WITHIN: the time split, SKIP PAST LAST ROW
    "SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.ts AS a, LAST(C.ts) AS c, count(*) AS n "
    "PATTERN (A N*? B N*? C) WITHIN 40 DEFINE A AS type = 'a', B AS type = 'b' AND B.g = A.g, C AS type = 'c')",
    # unpartitioned WITHIN with SKIP TO NEXT ROW and ALL ROWS
    "SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES CLASSIFIER() AS cl ALL ROWS PER MATCH "
    "AFTER MATCH SKIP TO NEXT ROW PATTERN (A {- N* -} B) WITHIN 12 DEFINE A AS type = 'a', B AS type = 'b')",
    # without WITHIN: one task; exclusion, alternation, SUBSET
    "SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES FIRST(U.v) AS fu, count(U.*) AS nu "
    "PATTERN ((A | B) C+) SUBSET U = (A, B) DEFINE A AS v < 10, B AS v > 45, C AS v BETWEEN 10 AND 45)",
    # outer query, joins and GROUP BY run by Spark
    "SELECT m.k, count(*) AS c, max(m.n) AS mx FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts "
    "MEASURES count(*) AS n PATTERN (A B* C) DEFINE A AS type = 'a', B AS type = 'b', C AS type = 'c') AS m "
    "GROUP BY m.k",
    # PERMUTE and a CTE as input
    "WITH e2 AS (SELECT k, ts, type FROM ev WHERE type <> 'd') SELECT * FROM e2 MATCH_RECOGNIZE "
    "(PARTITION BY k ORDER BY ts MEASURES CLASSIFIER() AS cl ALL ROWS PER MATCH PATTERN (PERMUTE(A, B)) "
    "DEFINE A AS type = 'a', B AS type = 'b')",
]


@pytest.mark.parametrize("i", range(len(QUERIES)))
def test_sql_equals_duckdb(spark, i):
    data = events()
    _view(spark, data, "ev")
    q = QUERIES[i]
    want = _duck(data, "ev", q)
    got = ms.sql(spark, q).collect()
    assert rows_match(want, got), (q, len(want), len(got))


def test_modes_are_the_expected_ones(spark):
    _view(spark, events(), "ev")
    ms.sql(spark, QUERIES[0])
    assert ms.last_runs()[0].mode.startswith("partitioned")
    ms.sql(spark, QUERIES[2])
    assert ms.last_runs()[0].mode.startswith("time split")
    ms.sql(spark, QUERIES[4])
    assert ms.last_runs()[0].mode == "one task (no PARTITION BY and no WITHIN)"
    anchored = QUERIES[3].replace("PATTERN (A", "PATTERN (^A")
    ms.sql(spark, anchored)
    assert "one task (the pattern has an anchor" in ms.last_runs()[0].mode


def test_dataframe_form(spark):
    data = events(seed=3)
    df = spark.createDataFrame(data)
    body = "PARTITION BY k ORDER BY ts MEASURES A.v AS av, count(*) AS n PATTERN (A B+) DEFINE B AS v < PREV(v)"
    got = ms.match_recognize(df, body).collect()
    want = _duck(data, "t", f"SELECT * FROM t MATCH_RECOGNIZE ({body})")
    assert rows_match(want, got)
    assert ms.match_recognize(df, body).columns == ["k", "av", "n"]


def test_table_function_both_forms(spark):
    data = events(n=300, seed=4)
    _view(spark, data, "evt")
    ms.register(spark)
    body = "PARTITION BY k ORDER BY ts MEASURES A.v AS av, LAST(B.v) AS bv PATTERN (A B+) DEFINE B AS v > PREV(v)"
    want = _duck(data, "t", f"SELECT * FROM t MATCH_RECOGNIZE ({body})")
    got = spark.sql(f"SELECT * FROM match_recognize(TABLE(evt), '{body}')").collect()
    assert rows_match(want, got)
    # the partitioning on the call: the body then has neither PARTITION BY nor ORDER BY
    inner = "MEASURES A.v AS av, LAST(B.v) AS bv PATTERN (A B+) DEFINE B AS v > PREV(v)"
    got = spark.sql(f"SELECT * FROM match_recognize(TABLE(evt) PARTITION BY k ORDER BY (ts), '{inner}')").collect()
    assert rows_match([r[1:] for r in want], got)
    got = spark.sql(f"SELECT * FROM match_recognize(TABLE(evt) PARTITION BY k ORDER BY ts, body => '{inner}')"
                    ).collect()
    assert rows_match([r[1:] for r in want], got)


def test_errors_point_into_the_users_text(spark):
    from pyspark.errors import AnalysisException
    _view(spark, events(n=50), "ev")
    q = "SELECT * FROM ev MATCH_RECOGNIZE (\n  ORDER BY ts\n  MEASURES A.nope AS x\n  PATTERN (A) DEFINE A AS true)"
    with pytest.raises(matchrec.ProgrammingError) as info:
        ms.sql(spark, q)
    assert isinstance(info.value, AnalysisException)
    assert "nope" in str(info.value) and "Line 3, Col 14" in str(info.value)
    with pytest.raises(AnalysisException) as info:
        ms.sql(spark, "SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B DEFINE A AS true)")
    assert "Line 1, Col" in str(info.value)
    df = spark.table("ev")
    with pytest.raises(matchrec.ProgrammingError) as info:
        ms.match_recognize(df, "ORDER BY ts\nPATTERN (A)\nDEFINE A AS zz > 1")
    assert "Line 3, Col 13" in str(info.value)
    ms.register(spark)
    with pytest.raises(AnalysisException) as info:
        spark.sql("SELECT * FROM match_recognize(TABLE(ev), 'ORDER BY ts PATTERN (A) DEFINE A AS zz > 1')")
    assert "zz" in str(info.value) and "Line 1, Col 37" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError, match="Spark cannot read the input"):
        ms.sql(spark, "SELECT * FROM missing_table MATCH_RECOGNIZE (ORDER BY ts PATTERN (A) DEFINE A AS true)")


def test_runtime_errors_come_back_as_matchrec_errors(spark):
    _view(spark, pa.table({"ts": pa.array([1, 2, 3], pa.int64()), "v": pa.array([1, 2, 3], pa.int64())}), "tiny")
    df = ms.sql(spark, "SELECT * FROM tiny MATCH_RECOGNIZE (ORDER BY ts AFTER MATCH SKIP TO B PATTERN (A B?) "
                       "DEFINE A AS true, B AS v > 5)")
    with pytest.raises(Exception) as info:
        df.collect()
    err = ms.matchrec_error(info.value)
    assert isinstance(err, matchrec.DataError) and "SKIP" in str(err)
    assert ms.matchrec_error(ValueError("other")) is None


def test_explain_analyze_reports_shuffle_bytes(spark):
    _view(spark, events(), "ev")
    lines = [r[0] for r in ms.sql(spark, "EXPLAIN ANALYZE " + QUERIES[0]).collect()]
    text = "\n".join(lines)
    assert "partitioned: rows hash-partitioned by k" in text
    shuffle = next(line for line in lines if "shuffle:" in line)
    assert int(shuffle.split()[1]) > 0
    plain = "\n".join(r[0] for r in ms.sql(spark, "EXPLAIN " + QUERIES[4]).collect())
    assert "one task (no PARTITION BY and no WITHIN)" in plain and "Analyze" not in plain


def random_query(rng: random.Random) -> str:
    names = ["A", "B", "C"][: rng.randint(2, 3)]
    items = []
    for i, v in enumerate(names):
        items.append(v + (rng.choice(["", "", "+", "{1,2}", "?"]) if i else ""))
        if i < len(names) - 1:
            items.append(rng.choice(["N*", "{- N* -}", "N*?", ""]))
    pattern = " ".join(x for x in items if x)
    defines = []
    for i, v in enumerate(names):
        cond = f"type = '{rng.choice('abcd')}'"
        if rng.random() < 0.3:
            cond += f" AND v {rng.choice(['<', '>'])} {rng.randint(10, 40)}"
        if i and rng.random() < 0.5:
            cond += f" AND {v}.g = {names[rng.randrange(i)]}.g"
        if rng.random() < 0.15:
            cond += " AND v > PREV(v)"
        defines.append(f"{v} AS {cond}")
    if "N" in pattern:
        defines.append("N AS true")
    measures = rng.sample(["FIRST(A.ts) AS fa", f"LAST({names[-1]}.ts) AS ll", "count(*) AS n",
                           "CLASSIFIER() AS cl", "LAST(ts) - FIRST(ts) AS span", "sum(v) AS sv"], rng.randint(1, 3))
    rows = rng.choice(["ONE ROW PER MATCH", "ONE ROW PER MATCH", "ALL ROWS PER MATCH"])
    skip = rng.choice(["PAST LAST ROW", "PAST LAST ROW", "TO NEXT ROW"])
    within = f"WITHIN {rng.randint(3, 60)}"
    partition = rng.choice(["", "", "PARTITION BY k"])
    return (f"SELECT * FROM ev MATCH_RECOGNIZE ({partition} ORDER BY ts MEASURES {', '.join(measures)} {rows} "
            f"AFTER MATCH SKIP {skip} PATTERN ({pattern}) {within} DEFINE {', '.join(defines)})")


def _differential(spark, seeds, per_seed=2, n=800):
    modes, bad = [], []
    for seed in seeds:
        rng = random.Random(seed)
        data = events(n=n, keys=3, seed=seed)
        _view(spark, data, "ev")
        for _ in range(per_seed):
            q = random_query(rng)
            want = _duck(data, "ev", q)
            for filt in ("off", "on"):
                got = ms.sql(spark, q, interval_filter=filt).collect()
                run = ms.last_runs()[0]
                modes.append((run.mode.split(":")[0].split(" (")[0], filt))
                if filt == "on" and run.filtering.used:
                    modes.append(("filtered", filt))
                if not rows_match(want, got):
                    bad.append((seed, filt, q, len(want), len(got)))
    return modes, bad


def test_differential_spark_equals_duckdb(spark):
    modes, bad = _differential(spark, range(2))
    assert not bad, bad[:3]
    assert ("time split", "off") in modes and ("partitioned", "off") in modes
    assert ("filtered", "on") in modes and ("time split", "on") in modes


@pytest.mark.slow
def test_differential_spark_equals_duckdb_many(spark):
    modes, bad = _differential(spark, range(100, 160), per_seed=3, n=2000)
    assert not bad, bad[:3]


def test_interval_filtering_shuffles_fewer_bytes(spark):
    data = events(n=3000, keys=3, seed=7)
    _view(spark, data, "ev")
    q = ("SELECT * FROM ev MATCH_RECOGNIZE (ORDER BY ts MEASURES A.ts AS a, B.ts AS b PATTERN (A N*? B) WITHIN 6 "
         "DEFINE A AS type = 'a' AND v < 3, B AS type = 'b' AND v > 47, N AS true)")
    want = _duck(data, "ev", q)
    assert want  # the data has matches, so a filter that dropped them would show
    assert rows_match(want, ms.sql(spark, q, interval_filter="on").collect())
    lines = [r[0] for r in ms.sql(spark, "EXPLAIN ANALYZE " + q, interval_filter="on").collect()]
    text = "\n".join(lines)
    assert "pull strategy dfs" in text and "candidates per round" in text
    with_f = int(next(x for x in lines if x.strip().startswith("shuffle:")).split()[1])
    without = next(x for x in lines if "without interval filtering" in x)
    assert int(without.split(": ")[1].split()[0]) > 2 * with_f


def test_example_pipeline_runs_and_agrees_with_duckdb(spark, tmp_path, capsys):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "spark_pipeline.py"
    spec = importlib.util.spec_from_file_location("spark_pipeline", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "matches"
    assert example.main(["--rows", "20000", "--out", str(out)], spark=spark) == 0
    got = spark.read.parquet(str(out)).collect()
    src = tmp_path / "r.parquet"
    example.generate(str(src), 20000)
    con = matchrec.connect()
    want = con.execute(example.QUERY.replace("FROM reports", f"FROM read_parquet('{src}')")).fetchall()
    assert want and rows_match(want, got)
    assert "matches in" in capsys.readouterr().out


def test_local_sessions_run_this_interpreter_and_a_missing_matchrec_is_named(spark):
    import sys
    _view(spark, events(n=50), "ev")
    ms.sql(spark, QUERIES[0])  # the first call prepares the session
    assert spark.sparkContext.pythonExec == sys.executable
    failed = Exception("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                       "ModuleNotFoundError: No module named 'matchrec'")
    err = ms.matchrec_error(failed)
    assert isinstance(err, matchrec.OperationalError) and "ship(" in str(err) and "Traceback" not in str(err)
    err = ms.matchrec_error(Exception('java.io.IOException: Cannot run program "/opt/py/bin/python": error=2'))
    assert isinstance(err, matchrec.OperationalError) and "'/opt/py/bin/python'" in str(err)


def test_window_with_pattern(spark):
    data = events(n=200)
    _view(spark, data, "evw")
    q = ("SELECT k, ts, n OVER w, last_v OVER w FROM evw WHERE g <> 3 WINDOW w AS (PARTITION BY k ORDER BY ts "
         "MEASURES COUNT(*) AS n, LAST(v) AS last_v ROWS BETWEEN CURRENT ROW AND 5 FOLLOWING "
         "AFTER MATCH SKIP PAST LAST ROW PATTERN (A B+) DEFINE A AS type = 'a', B AS v > PREV(v))")
    got = ms.sql(spark, q).collect()
    want = _duck(data, "evw", q)
    assert _sorted(got) == _sorted(want)
    assert len(want) == sum(1 for g in data.column("g").to_pylist() if g != 3)
    assert any(r[2] is not None for r in want) and any(r[2] is None for r in want)
    with pytest.raises(matchrec.NotSupportedError, match="only measures"):
        ms.sql(spark, q.replace("n OVER w", "count(*) OVER w"))
