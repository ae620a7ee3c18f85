"""``matchrec spark-env``: the packed environment holds what executors import, and its launcher
runs matchrec from wherever the archive is unpacked, with nothing from this environment."""
from __future__ import annotations

import subprocess
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
