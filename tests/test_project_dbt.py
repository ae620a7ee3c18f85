"""dbt-duckdb runs the example dbt project whose Python model calls matchrec (examples/dbt_duckdb).

It needs dbt in the environment that runs the tests (``pip install -e '.[dbt]'``), so it is marked
slow: ``.venv/bin/python -m pytest -m slow tests/test_project_dbt.py``. Without dbt it fails and
says how to install it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import matchrec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "dbt_duckdb"


def _dbt() -> str:
    found = shutil.which("dbt", path=str(Path(sys.executable).parent)) or shutil.which("dbt")
    if found is None:
        pytest.fail("dbt is not installed in this environment: pip install -e '.[dbt]'")
    return found


@pytest.mark.slow
def test_dbt_run_with_a_matchrec_python_model(tmp_path):
    project = tmp_path / "dbt_duckdb"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("target", "logs", "*.duckdb"))
    db = tmp_path / "dbt.duckdb"
    env = {**os.environ, "MATCHREC_DBT_DB": str(db), "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([_dbt(), "run", "--profiles-dir", ".", "--project-dir", "."], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS=2" in proc.stdout

    # The table dbt built equals the model's CER statement run by hand over dbt's transactions table.
    spec = importlib.util.spec_from_file_location("card_testing_model", EXAMPLE / "models" / "card_testing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    con = matchrec.connect(str(db))
    cur = con.cursor()
    cur.execute("CREATE TEMP VIEW card_testing_input AS SELECT * FROM transactions")
    expected = cur.execute(module.CARD_TESTING).fetch_arrow_table()
    got = cur.execute("SELECT * FROM card_testing").fetch_arrow_table()
    con.close()
    assert expected.num_rows > 0
    order = [(c, "ascending") for c in expected.column_names]
    assert got.sort_by(order).equals(expected.sort_by(order))
