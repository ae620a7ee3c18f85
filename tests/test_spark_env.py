"""``matchrec spark-env``: the packed environment holds what executors import, and its launcher
runs matchrec from wherever the archive is unpacked, with nothing from this environment."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile

import pytest

from matchrec import spark_env


def test_the_archive_holds_matchrec_dependencies_without_pyspark():
    names = {d.metadata["Name"].lower() for d in spark_env.distributions()}
    assert {"duckdb", "pyarrow", "numba", "llvmlite", "numpy", "pandas", "sqlglot", "lark"} <= names
    assert "pyspark" not in names and "py4j" not in names


@pytest.mark.slow
def test_the_unpacked_archive_runs_matchrec_anywhere(tmp_path):
    from matchrec.cli import main
    out = tmp_path / "env.tar.gz"
    assert main(["spark-env", "--fast", str(out)]) == 0
    where = tmp_path / "somewhere" / "else"
    where.mkdir(parents=True)
    with tarfile.open(out) as tar:
        tar.extractall(where, filter="tar")
    code = ("import sys, matchrec; con = matchrec.connect(); "
            "print(sys.prefix); print(con.execute(\"SELECT count(*) FROM (VALUES (1),(2),(3)) t(v) MATCH_RECOGNIZE "
            "(ORDER BY v MEASURES A.v AS a PATTERN (A) DEFINE A AS v > 1)\").fetchall())")
    done = subprocess.run([str(where / "bin" / spark_env.LAUNCHER), "-c", code], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [x for x in done.stdout.splitlines() if x.strip()]  # DuckDB may draw a progress bar first
    prefix, rows = (["", ""] + lines)[-2:]
    assert prefix == str(where) and rows == "[(2,)]", (done.stdout, done.stderr[-2000:])


@pytest.fixture
def no_session(monkeypatch):
    """ship() is called before a session starts; a session another test module left running is hidden."""
    from pyspark import SparkContext
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # ship() extends PATH and sets PYSPARK_PYTHON: both restored
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)


def test_ship_keeps_an_interpreter_the_user_chose(tmp_path, monkeypatch, no_session):
    from pyspark.sql import SparkSession

    import matchrec
    import matchrec.spark as ms
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python/bin/python3")
    with pytest.raises(matchrec.ProgrammingError, match="PYSPARK_PYTHON is set to '/opt/python/bin/python3'"):
        ms.ship(SparkSession.Builder(), str(archive))
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python/bin/python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    chosen = SparkSession.Builder().config("spark.pyspark.python", "/opt/python/bin/python3")
    with pytest.raises(matchrec.ProgrammingError, match="spark.pyspark.python is set to"):
        ms.ship(chosen, str(archive))
    assert "PYSPARK_PYTHON" not in os.environ and chosen._options["spark.pyspark.python"] == "/opt/python/bin/python3"


def test_ship_adds_to_the_archives_and_executor_path_the_user_set(tmp_path, no_session):
    from pyspark.sql import SparkSession

    import matchrec.spark as ms
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")  # ship() only names the archive; Spark reads it when the session starts
    builder = (SparkSession.Builder().config("spark.archives", "/data/models.zip#models")
               .config("spark.executorEnv.PATH", "/opt/tools/bin:/usr/bin"))
    options = ms.ship(builder, str(archive))._options
    assert options["spark.archives"] == f"/data/models.zip#models,{archive}#{ms.ARCHIVE_NAME}"
    assert options["spark.executorEnv.PATH"] == f"./{ms.ARCHIVE_NAME}/bin:/opt/tools/bin:/usr/bin"
    assert os.environ["PYSPARK_PYTHON"] == spark_env.LAUNCHER
    # on the driver the launcher's name runs this interpreter (the table function's analysis)
    driver = os.environ["PATH"].split(os.pathsep)[0]
    done = subprocess.run([os.path.join(driver, spark_env.LAUNCHER), "-c", "import sys; print(sys.executable)"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == sys.executable, done.stderr


def test_the_spark_extra_installs_the_connect_client():
    import pathlib
    import tomllib
    from importlib import metadata, util
    project = tomllib.loads((pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["spark"]
    assert any(r.replace(" ", "").startswith("pyspark[connect]") for r in extra), extra
    # what pyspark's connect extra requires (SparkSession.builder.remote needs it) is installed and imports
    needed = [re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower()
              for r in metadata.requires("pyspark") if 'extra == "connect"' in r]
    assert {"grpcio", "grpcio-status", "googleapis-common-protos", "zstandard"} <= set(needed)
    modules = {"grpcio": "grpc", "grpcio-status": "grpc_status", "googleapis-common-protos": "google.rpc"}
    for name in needed:
        assert util.find_spec(modules.get(name, name)) is not None, name
    from pyspark.sql.connect.session import SparkSession  # noqa: F401 - the client itself imports
