"""Spark Connect: every form, the time split, interval filtering and EXPLAIN ANALYZE through the
thin client (``SparkSession.builder.remote``) against a real Connect server started from the
pyspark package, checked against matchrec on DuckDB over the same rows."""
from __future__ import annotations

import pytest

import matchrec
import matchrec.spark as ms
from spark_conformance import rows_match
from spark_deploy import connect_server
from test_spark import QUERIES, _duck, _view, check_interval_filtering, events


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    if active is not None:  # a local session of earlier modules (restarted for later ones when needed)
        active.stop()
    url, procs = connect_server()
    try:
        session = SparkSession.builder.remote(url).getOrCreate()
        yield session
        session.stop()
    finally:
        procs.stop()


def test_the_session_is_a_connect_one(spark):
    from matchrec.connectors.spark_metrics import is_connect
    assert is_connect(spark)


@pytest.mark.parametrize("i", range(len(QUERIES)))
def test_sql_equals_duckdb(spark, i):
    data = events()
    _view(spark, data, "ev")
    want = _duck(data, "ev", QUERIES[i])
    assert rows_match(want, ms.sql(spark, QUERIES[i]).collect())
    if i in (2, 3):  # the unpartitioned WITHIN patterns
        assert ms.last_runs()[0].mode.startswith("time split")


def test_dataframe_form_and_table_function(spark):
    data = events(n=300, seed=4)
    df = _view(spark, data, "evt")
    body = "PARTITION BY k ORDER BY ts MEASURES A.v AS av, LAST(B.v) AS bv PATTERN (A B+) DEFINE B AS v > PREV(v)"
    want = _duck(data, "t", f"SELECT * FROM t MATCH_RECOGNIZE ({body})")
    assert rows_match(want, ms.match_recognize(df, body).collect())
    ms.register(spark)
    assert rows_match(want, spark.sql(f"SELECT * FROM match_recognize(TABLE(evt), '{body}')").collect())


def test_runtime_errors_and_interval_filtering_with_explain_analyze(spark):
    import pyarrow as pa
    _view(spark, pa.table({"ts": pa.array([1, 2, 3], pa.int64()), "v": pa.array([1, 2, 3], pa.int64())}), "tiny")
    df = ms.sql(spark, "SELECT * FROM tiny MATCH_RECOGNIZE (ORDER BY ts AFTER MATCH SKIP TO B PATTERN (A B?) "
                       "DEFINE A AS true, B AS v > 5)")
    with pytest.raises(Exception) as info:
        df.collect()
    assert isinstance(ms.matchrec_error(info.value), matchrec.DataError)

    check_interval_filtering(spark, _view, "Connect")


def test_the_client_started_no_spark_context(spark):
    """Everything above ran through the thin client: DataFrame operations only, no SparkContext, RDDs or
    broadcast variables (none exist in a Connect client; a JVM here would show up as a SparkContext)."""
    from pyspark import SparkContext
    assert SparkContext._active_spark_context is None
    with pytest.raises(Exception):
        spark.sparkContext  # noqa: B018 - Connect sessions have none
