"""Spark standalone cluster: a master and two workers (1 core each) started from the pyspark
package's launcher. matchrec is shipped to the executors as the archive ``matchrec spark-env``
packs (``ms.ship``); every form and the time split return the DuckDB path's rows with tasks on
both workers, the table function's driver-side analysis works, an interpreter the user chose is
kept, and a worker Python without matchrec gives a clear error. Slow: JVMs and a ~190 MB archive."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

import matchrec
import matchrec.spark as ms
from spark_conformance import rows_match
from spark_deploy import standalone
from test_spark import QUERIES, _duck, _view, check_interval_filtering, events

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    url, procs = standalone(workers=2)
    try:
        yield url
    finally:
        procs.stop()


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    from matchrec.cli import main
    out = tmp_path_factory.mktemp("env") / "matchrec-env.tar.gz"
    started = time.perf_counter()
    assert main(["spark-env", str(out)]) == 0
    print(f"\narchive: {out.stat().st_size} bytes, built in {time.perf_counter() - started:.1f} s")
    # what each executor does first: unpack it, and start its interpreter with what the tasks import
    where = out.parent / "unpacked"
    started = time.perf_counter()
    with tarfile.open(out) as tar:
        tar.extractall(where, filter="tar")
    unpacked = time.perf_counter() - started
    started = time.perf_counter()
    done = subprocess.run([str(where / "bin" / "matchrec-python"), "-c", "import matchrec.spark, duckdb, pyarrow, "
                           "numba, pandas"], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"unpacked in {unpacked:.1f} s; its interpreter imports matchrec, duckdb, pyarrow, numba and pandas in "
          f"{time.perf_counter() - started:.1f} s")
    shutil.rmtree(where)
    return out


def _builder(url: str):
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(url).appName("matchrec-cluster-tests")
            .config("spark.executor.memory", "768m").config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "4").config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1"))


def _where_tasks_ran(spark) -> set[tuple[str, str]]:
    """(working directory, interpreter) of the Python workers of a 4-task job."""
    import pyarrow as pa

    def where(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"cwd": [os.getcwd()], "python": [sys.executable]})
    rows = spark.range(0, 400, 1, 4).mapInArrow(where, "cwd string, python string").collect()
    return {(r[0], r[1]) for r in rows}


def test_forms_on_a_standalone_cluster_with_the_shipped_environment(cluster, archive, monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))  # ship() extends it; restored afterwards
    started = time.perf_counter()
    spark = ms.ship(_builder(cluster), str(archive)).getOrCreate()
    try:
        where = _where_tasks_ran(spark)
        print(f"\nsession and first job on the cluster: {time.perf_counter() - started:.1f} s")
        assert len({cwd for cwd, _ in where}) == 2, where  # both workers' executors ran tasks
        assert all(py.startswith(cwd) and "matchrec_env" in py for cwd, py in where), where
        data = events()
        _view(spark, data, "ev")
        modes = []
        for q in QUERIES:  # partitioned, the time split both ways, one task, outer query, CTE input
            assert rows_match(_duck(data, "ev", q), ms.sql(spark, q).collect()), q
            modes.append(ms.last_runs()[0].mode.split(":")[0].split(" (")[0])
        assert modes.count("time split") == 2 and "partitioned" in modes and "one task" in modes, modes
        body = ("PARTITION BY k ORDER BY ts MEASURES A.v AS av, LAST(B.v) AS bv PATTERN (A B+) "
                "DEFINE B AS v > PREV(v)")
        want = _duck(data, "t", f"SELECT * FROM t MATCH_RECOGNIZE ({body})")
        assert rows_match(want, ms.match_recognize(spark.table("ev"), body).collect())
        ms.register(spark)  # its analysis runs in a Python worker of the driver
        assert rows_match(want, spark.sql(f"SELECT * FROM match_recognize(TABLE(ev), '{body}')").collect())

        # interval filtering rounds on the executors, and EXPLAIN ANALYZE's shuffle bytes from the status store
        check_interval_filtering(spark, _view, "cluster")
    finally:
        spark.stop()


def test_an_interpreter_without_matchrec_gives_a_clear_error(cluster, monkeypatch):
    bare = "/usr/bin/python3"  # the system Python: no pyarrow, no matchrec
    assert os.path.exists(bare)
    monkeypatch.setenv("PYSPARK_PYTHON", bare)
    spark = _builder(cluster).getOrCreate()
    try:
        _view(spark, events(n=50), "ev")
        with pytest.raises(matchrec.OperationalError, match=r"ship\(") as info:
            ms.sql(spark, QUERIES[0])
        assert "Traceback" not in str(info.value)
        assert spark.sparkContext.pythonExec == bare  # the user's choice is kept
    finally:
        spark.stop()
