"""The example notebook: valid nbformat, and its code cells run in order in an IPython shell (the kernel's
interpreter, magics included) without error."""
from __future__ import annotations

import json
import pathlib

import nbformat
import pytest

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "examples" / "notebook" / "matches.ipynb"


@pytest.fixture
def shell(monkeypatch, tmp_path):
    from sqlalchemy.dialects import registry
    registry.register("matchrec", "matchrec.sqlalchemy_dialect", "MatchrecDialect")
    monkeypatch.setenv("PLOOMBER_STATS_ENABLED", "false")
    monkeypatch.chdir(tmp_path)
    from IPython.core.interactiveshell import InteractiveShell
    instance = InteractiveShell.instance()
    yield instance
    if "sql" in instance.magics_manager.magics["line"]:
        instance.run_line_magic("sql", "--close-all")
    InteractiveShell.clear_instance()


def test_notebook_is_valid_and_runs(shell, tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    sources = "\n".join(c.source for c in cells)
    for shown in ("matchrec.connect", "MATCH_RECOGNIZE", "cur.df()", "plot.timeline", "%sql matchrec:///"):
        assert shown in sources
    assert all(not c.outputs for c in cells), "the notebook is stored without outputs"
    for number, cell in enumerate(cells, 1):
        result = shell.run_cell(cell.source, store_history=True)
        assert result.success, f"code cell {number} failed: {result.error_in_exec or result.error_before_exec}"
    names = shell.user_ns
    assert len(names["matches"]) > 0
    assert names["timeline"].matches == len(names["matches"])
    assert "<svg" in names["timeline"]._repr_html_()
    assert int(names["per_ticker"]["v_shapes"].sum()) == len(names["matches"])
    assert (tmp_path / "matches_demo.duckdb").exists()
    json.loads(NOTEBOOK.read_text())  # plain JSON as stored
