"""Tests of dbt-style project runs: ``matchrec run`` / ``matchrec compile`` (matchrec.engine.project)."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import matchrec
from matchrec.cli import main
from matchrec.engine import project as P
from matchrec.run_cli import ProgressBar

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fraud_project"

EVENTS = """{{ config(materialized='table', tags=['base']) }}
SELECT i AS ts, (i % 5)::INTEGER AS v, ['A', 'B', 'C'][(1 + i % 3)::BIGINT] AS type, (i % 2)::INTEGER AS k
FROM range(60) t(i)
"""
SEQ_AB = """{{ config(tags=['patterns']) }}
PATTERN SEQ(A a, B b) FROM {{ ref('events') }} ORDER BY ts WITHIN 3 RETURN a.ts AS a_ts, b.ts AS b_ts
"""
SEQ_AC = """PATTERN SEQ(A a, C c) FROM {{ ref('events') }} ORDER BY ts WHERE c.v > a.v WITHIN 5 RETURN *
"""
RISES = """{{ config(tags=['patterns']) }}
SELECT * FROM {{ ref('events') }} MATCH_RECOGNIZE (
    PARTITION BY k ORDER BY ts
    MEASURES FIRST(ts) AS start_ts, LAST(ts) AS end_ts, COUNT(*) AS n
    PATTERN (S U+) DEFINE U AS v > PREV(v))
"""
SUMMARY = """{{ config(materialized='view', tags=['marts']) }}
SELECT count(*) AS pairs, min(a_ts) AS first_a FROM {{ ref('seq_ab') }}
"""
EXPORT = """{{ config(materialized='parquet', tags=['marts']) }}
SELECT r.*, s.pairs FROM {{ ref('rises') }} r, {{ ref('summary') }} s ORDER BY k, start_ts
"""
BASIC = {"models/events.sql": EVENTS, "models/p/seq_ab.sql": SEQ_AB, "models/p/seq_ac.sql": SEQ_AC,
         "models/p/rises.sql": RISES, "models/m/summary.sql": SUMMARY, "models/m/export.sql": EXPORT}


def make(tmp_path: Path, files: dict[str, str], name: str = "proj") -> Path:
    root = tmp_path / name
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def load_error(tmp_path: Path, files: dict[str, str]) -> str:
    with pytest.raises(matchrec.ProgrammingError) as info:
        P.load_project(make(tmp_path, files))
    return str(info.value)


def position(text: str, needle: str) -> tuple[int, int]:
    """1-based line and column of the first ``needle`` in ``text``."""
    at = text.index(needle)
    return text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1


def table_of(con, relation: str) -> pa.Table:
    cur = con.cursor()
    t = cur.execute(f"SELECT * FROM {relation}").fetch_arrow_table()
    cur.close()
    return t.sort_by([(c, "ascending") for c in t.column_names]) if t.num_rows else t


def run(root: Path, con=None, selectors=None, threads=1, **kw) -> P.RunResult:
    project = P.load_project(root)
    con = con or matchrec.connect()
    return P.run_project(project, con, P.select(project, selectors), threads=threads, connect=matchrec.connect, **kw)


def status(result: P.RunResult) -> dict[str, str]:
    return {r.name: r.status for r in result.results}


# ---------------------------------------------------------------- templates
def test_templates_compile_to_relations_and_keep_lines(tmp_path):
    root = make(tmp_path, {**BASIC, "matchrec_project.toml": 'sources = ["raw.things"]\n',
                           "models/uses_source.sql": "{{ config(\n  materialized='view'\n) }}\n"
                                                     "SELECT * FROM {{ source('raw', 'things') }} "
                                                     "JOIN {{ ref('events') }} USING (ts)\n"})
    project = P.load_project(root)
    m = project.models["uses_source"]
    assert m.materialized == "view" and m.sources == [("raw.things", m.text.index("{{ source"))]
    assert "{{" not in m.sql and "raw.things" in m.sql and "JOIN events USING" in m.sql
    assert m.sql.count("\n") == m.text.count("\n")  # config leaves blank lines behind
    assert list(m.refs) == ["events"]
    assert project.models["seq_ab"].tags == ("patterns",) and project.models["export"].materialized == "parquet"
    assert project.models["events"].materialized == "table" and project.models["seq_ac"].tags == ()


def test_pattern_models_and_their_source_are_recognised(tmp_path):
    project = P.load_project(make(tmp_path, BASIC))
    kinds = {k: (m.pattern, m.pattern_source) for k, m in project.models.items()}
    assert kinds == {"events": (False, None), "seq_ab": (True, "events"), "seq_ac": (True, "events"),
                     "rises": (True, "events"), "summary": (False, None), "export": (False, None)}


@pytest.mark.parametrize("text, needle, expected", [
    ("SELECT *\nFROM {{ ref('nope') }}\n", "'nope'", "Unknown model 'nope' in ref()"),
    ("SELECT 1 {% if true %} x {% endif %}", "{% if", "Template statements"),
    ("SELECT {{ var('x') }}", "var(", "Unknown template construct"),
    ("SELECT 1\n  {{ ref('events')\n", "{{", "is not closed by }}"),
    ("{{ config(materialized='incremental') }}\nSELECT 1", "'incremental'", "materialized must be one of"),
    ("{{ config(materialized='table', colour='red') }}\nSELECT 1", "colour", "Unknown config key 'colour'"),
    ("{{ config(tags=[1]) }}\nSELECT 1", "[1]", "tags must be"),
    ("{{ config() }}\n{{ config() }}\nSELECT 1", "{{ config() }}\nSELECT", "config() appears twice"),
    ("SELECT * FROM {{ ref('events', 'x') }}", "ref(", "ref() takes one model name"),
    ("SELECT * FROM {{ ref(events) }}", "events)", "takes names as quoted strings"),
    ("SELECT 1;\nSELECT 2", "SELECT 2", "A model is one SQL statement"),
    ("{{ config(materialized='view') }}\nSELECT * FROM {{ ref('events') }} MATCH_RECOGNIZE (ORDER BY ts "
     "PATTERN (A) DEFINE A AS v > 1)", "{{ config", "cannot be materialized as a view"),
])
def test_template_errors_name_file_line_and_column(tmp_path, text, needle, expected):
    message = load_error(tmp_path, {"models/events.sql": EVENTS, "models/sub/bad.sql": text})
    line, col = position(text, needle)
    assert message.startswith("models/sub/bad.sql: ") and expected in message
    assert f"Line {line}, Col {col}." in message, message


def test_project_level_errors(tmp_path):
    assert "Two models named 'events': a/events.sql and b/events.sql" in load_error(
        tmp_path, {"a/events.sql": "SELECT 1", "b/events.sql": "SELECT 2"})
    assert "plain identifier" in load_error(tmp_path / "n", {"my-model.sql": "SELECT 1"})
    assert "no SQL statement" in load_error(tmp_path / "e", {"empty.sql": "{{ config() }}\n-- nothing\n"})
    message = load_error(tmp_path / "k", {"matchrec_project.toml": 'name = "x"\n\ncolour = "red"\n',
                                          "a.sql": "SELECT 1"})
    assert "unknown key 'colour' (line 3)" in message
    message = load_error(tmp_path / "s", {"matchrec_project.toml": 'sources = ["events"]\n',
                                          "a.sql": "SELECT * FROM {{ source('other') }}"})
    assert "Source 'other' is not declared" in message and "Line 1, Col 18." in message  # at source(
    assert "TOML" in load_error(tmp_path / "y", {"matchrec_project.yml": "name: x\n", "a.sql": "SELECT 1"})
    with pytest.raises(matchrec.ProgrammingError, match="does not exist"):
        P.load_project(tmp_path / "no_such_folder")
    with pytest.raises(matchrec.ProgrammingError, match="No models"):
        P.load_project(make(tmp_path, {"notes.txt": "SELECT 1"}, "empty"))
    latin = make(tmp_path, {"models/a.sql": "SELECT 1"}, "latin")
    (latin / "models" / "a.sql").write_bytes(b"SELECT 'caf\xe9'")
    with pytest.raises(matchrec.ProgrammingError, match="models/a.sql: not UTF-8"):
        P.load_project(latin)


# ---------------------------------------------------------------- graph and selection
def test_order_follows_dependencies(tmp_path):
    project = P.load_project(make(tmp_path, BASIC))
    order = project.order
    for key, model in project.models.items():
        for parent in model.refs:
            assert order.index(parent) < order.index(key)
    assert order[0] == "events" and set(order) == set(project.models)


def test_cycles_are_named(tmp_path):
    files = {"a.sql": "SELECT * FROM {{ ref('c') }}", "b.sql": "SELECT * FROM {{ ref('a') }}",
             "c.sql": "SELECT * FROM\n  {{ ref('b') }}", "d.sql": "SELECT 1"}
    message = load_error(tmp_path, files)
    m = re.search(r"Dependency cycle: (\w+) -> (\w+) -> (\w+) -> (\w+)", message)
    assert m and m.group(1) == m.group(4) and {m.group(1), m.group(2), m.group(3)} == {"a", "b", "c"}
    # each model refers to the next: the error points at the first model's ref to the second
    first, second = m.group(1), m.group(2)
    assert f"ref('{second}')" in files[f"{first}.sql"]
    line, col = position(files[f"{first}.sql"], "{{ ref")
    assert message.startswith(f"{first}.sql: ") and f"Line {line}, Col {col}." in message
    assert "refers to itself" in load_error(tmp_path / "self", {"x.sql": "SELECT * FROM {{ ref('x') }}"})


def test_selection_syntax(tmp_path):
    project = P.load_project(make(tmp_path, BASIC))

    def sel(*selectors, exclude=None):
        return set(P.select(project, list(selectors), exclude))

    assert P.select(project) == project.order
    assert sel("seq_ab") == {"seq_ab"}
    assert sel("seq_ab+") == {"seq_ab", "summary", "export"}
    assert sel("+summary") == {"events", "seq_ab", "summary"}
    assert sel("+export") == {"events", "seq_ab", "rises", "summary", "export"}
    assert sel("tag:patterns") == {"seq_ab", "rises"}
    assert sel("tag:marts", "events") == {"summary", "export", "events"}
    assert sel("+tag:marts") == {"events", "seq_ab", "rises", "summary", "export"}
    assert sel("path:models/p") == {"seq_ab", "seq_ac", "rises"}
    assert sel("seq_*") == {"seq_ab", "seq_ac"}
    assert sel("events+,tag:patterns") == {"seq_ab", "rises"}
    assert sel("events+", exclude=["tag:marts"]) == {"events", "seq_ab", "seq_ac", "rises"}
    assert sel("events seq_ab") == {"events", "seq_ab"}
    assert P.select(project, ["export", "events"]) == [k for k in project.order if k in ("export", "events")]
    for bad in ("nope", "tag:nope", "path:nowhere"):
        with pytest.raises(matchrec.ProgrammingError, match="No model matches"):
            P.select(project, [bad])


# ---------------------------------------------------------------- runs
def test_run_builds_every_materialization(tmp_path):
    root = make(tmp_path, BASIC)
    con = matchrec.connect()
    result = run(root, con)
    assert result.ok and status(result) == {m: "OK" for m in ("events", "seq_ab", "seq_ac", "rises", "summary",
                                                              "export")}
    cur = con.cursor()
    kinds = dict(cur.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
    assert kinds == {"events": "BASE TABLE", "seq_ab": "BASE TABLE", "seq_ac": "BASE TABLE", "rises": "BASE TABLE",
                     "summary": "VIEW", "export": "VIEW"}
    parquet = root / "target" / "export.parquet"
    assert parquet.exists()
    assert pq.read_table(parquet).to_pylist() == cur.execute("SELECT * FROM export").fetch_arrow_table().to_pylist()
    # the view follows its table; rows and matches are counted
    rows = {r.name: (r.rows, r.matches) for r in result.results}
    n_ab = cur.execute("SELECT count(*) FROM seq_ab").fetchone()[0]
    assert n_ab > 0 and rows["seq_ab"] == (n_ab, n_ab)
    assert rows["events"] == (60, None) and rows["summary"] == (None, None)
    assert cur.execute("SELECT pairs FROM summary").fetchone()[0] == n_ab
    assert rows["export"][0] == cur.execute("SELECT count(*) FROM rises").fetchone()[0]
    assert not cur.execute("SELECT * FROM duckdb_tables() WHERE table_name LIKE '__matchrec%'").fetchall()


def test_pattern_models_over_one_source_share_a_pass(tmp_path):
    files = {**BASIC, "models/other.sql": "SELECT * FROM {{ ref('events') }} WHERE v > 0",
             "models/p/on_other.sql": "PATTERN SEQ(B b, C c) FROM {{ ref('other') }} ORDER BY ts WITHIN 4 RETURN *"}
    result = run(make(tmp_path, files))
    assert result.ok and len(result.passes) == 1
    shared = result.passes[0]
    assert shared.source == "events" and sorted(shared.models) == ["rises", "seq_ab", "seq_ac"] and shared.report
    passes = {r.name: r.shared_pass for r in result.results}
    assert passes["seq_ab"] == passes["rises"] == 1 and passes["on_other"] is None


def test_pattern_tables_equal_the_statements_run_alone(tmp_path):
    root = make(tmp_path, BASIC)
    con = matchrec.connect()
    assert run(root, con).ok
    project = P.load_project(root)
    for key in ("seq_ab", "seq_ac", "rises"):
        cur = con.cursor()
        alone = cur.execute(project.models[key].sql).fetch_arrow_table()
        assert alone.num_rows > 0
        assert table_of(con, key).equals(alone.sort_by([(c, "ascending") for c in alone.column_names]))


def test_a_failing_shared_pass_falls_back_to_one_by_one(tmp_path, monkeypatch):
    def broken(con, statements, **kw):
        raise matchrec.InternalError("sharing broke")

    monkeypatch.setattr("matchrec.engine.project.runner.run_many", broken)
    bad = "PATTERN SEQ(A a, B b) FROM {{ ref('events') }} ORDER BY ts WHERE a.nope > 1 WITHIN 3 RETURN *"
    result = run(make(tmp_path, {**BASIC, "models/p/bad_pattern.sql": bad}))
    st = status(result)
    assert st["seq_ab"] == st["seq_ac"] == st["rises"] == "OK" and st["bad_pattern"] == "ERROR"
    assert "failed (InternalError); each model was run alone" in result.passes[0].report[0]
    error = next(r.error for r in result.results if r.name == "bad_pattern")
    line, col = position(bad, "a.nope")
    assert "model bad_pattern (models/p/bad_pattern.sql)" in error and f"Line {line}, Col {col}." in error


def test_failure_keeps_built_tables_and_skips_descendants(tmp_path):
    root = make(tmp_path, BASIC)
    db = str(tmp_path / "t.duckdb")
    assert main(["run", str(root), "--db", db]) == 0
    con = matchrec.connect(db)
    before = {name: table_of(con, name) for name in ("events", "seq_ab", "summary", "rises", "export")}
    con.close()
    # seq_ab now fails at run time (in DuckDB, after the ref on the same line changed the column offsets)
    bad = ("{{ config(tags=['patterns']) }}\nSELECT a_ts, {{ ref('events') }}.nope\n"
           "FROM {{ ref('seq_ac') }}, {{ ref('events') }}")
    (root / "models/p/seq_ab.sql").write_text(bad)
    result = run(root, matchrec.connect(db))
    st = status(result)
    assert st["seq_ab"] == "ERROR" and st["summary"] == st["export"] == "SKIPPED"
    assert st["events"] == st["seq_ac"] == st["rises"] == "OK"
    error = next(r.error for r in result.results if r.name == "seq_ab")
    line, col = position(bad, "{{ ref('events') }}.nope")
    assert "model seq_ab (models/p/seq_ab.sql)" in error and "nope" in error and f"Line {line}," in error
    con = matchrec.connect(db)
    for name, table in before.items():  # nothing half-built replaced a good table
        assert table_of(con, name).equals(table), name
    assert not con.cursor().execute("SELECT * FROM duckdb_tables() WHERE table_name LIKE '__matchrec%'").fetchall()
    con.close()


def test_cli_exit_status_and_message_on_failure(tmp_path, capsys):
    text = "SELECT ts, {{ ref('events') }}.v / 0 AS x,\n       missing_column\nFROM {{ ref('events') }}"
    root = make(tmp_path, {"models/events.sql": EVENTS, "models/bad.sql": text,
                           "models/after_bad.sql": "SELECT * FROM {{ ref('bad') }}",
                           "models/fine.sql": "SELECT count(*) AS n FROM {{ ref('events') }}"})
    assert main(["run", str(root), "--db", str(tmp_path / "x.duckdb")]) == 1
    out, err = capsys.readouterr()
    assert re.search(r"bad\s+ERROR", out) and re.search(r"after_bad\s+SKIPPED", out) and re.search(r"fine\s+OK", out)
    assert "2 OK, 1 ERROR, 1 SKIPPED" in out
    line, col = position(text, "missing_column")
    assert err.startswith("Error: model bad (models/bad.sql): Binder Error")
    assert f"Line {line}, Col {col}." in err and "Traceback" not in err
    assert err.rstrip().splitlines()[-2].strip() == "missing_column"


def test_fail_fast_starts_nothing_after_an_error(tmp_path):
    files = {"a.sql": "SELECT nope", "b.sql": "SELECT 1 AS x", "c.sql": "SELECT * FROM {{ ref('b') }}"}
    result = run(make(tmp_path, files), fail_fast=True)
    assert status(result) == {"a": "ERROR", "b": "SKIPPED", "c": "SKIPPED"}
    assert status(run(make(tmp_path, files, "again"))) == {"a": "ERROR", "b": "OK", "c": "OK"}


def test_missing_sources_and_unselected_models_are_clear_errors(tmp_path):
    text = "SELECT *\nFROM {{ source('raw_events') }}"
    root = make(tmp_path, {"uses.sql": text, "down.sql": "SELECT * FROM {{ ref('uses') }}"})
    result = run(root)
    error = result.results[0].error
    assert status(result) == {"uses": "ERROR", "down": "SKIPPED"}
    assert "Source 'raw_events' does not exist" in error and "Line 2, Col 6." in error
    result = run(root, selectors=["down"])
    assert "Model 'uses' is not selected and not in the database" in result.results[0].error
    con = matchrec.connect()
    con.cursor().execute("CREATE TABLE raw_events AS SELECT 42 AS x")
    assert run(root, con).ok and table_of(con, "down").to_pylist() == [{"x": 42}]


def test_materialization_changes_replace_the_old_relation(tmp_path):
    root = make(tmp_path, {"m.sql": "{{ config(materialized='view') }} SELECT 1 AS x"})
    con = matchrec.connect()
    cur = con.cursor()
    for kind, expected in (("view", "VIEW"), ("table", "BASE TABLE"), ("parquet", "VIEW"), ("table", "BASE TABLE")):
        (root / "m.sql").write_text(f"{{{{ config(materialized='{kind}') }}}} SELECT 2 AS x, '{kind}' AS k")
        assert run(root, con).ok
        assert cur.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'm'").fetchall() == [
            (expected,)]
        assert cur.execute("SELECT k FROM m").fetchall() == [(kind,)]


def test_threads_give_the_same_tables(tmp_path):
    files = {**BASIC, **{f"models/w/wide_{i}.sql": f"SELECT v, count(*) AS n, {i} AS i FROM {{{{ ref('events') }}}} "
                                                     "GROUP BY v" for i in range(4)}}
    root = make(tmp_path, files)
    one, two = matchrec.connect(), matchrec.connect()
    r1, r2 = run(root, one, threads=1), run(root, two, threads=3)
    assert r1.ok and r2.ok and r2.threads == 3
    for key in P.load_project(root).order:
        assert table_of(one, key).equals(table_of(two, key)), key


def test_threads_on_a_database_file(tmp_path):
    root = make(tmp_path, BASIC)
    db = str(tmp_path / "file.duckdb")
    con = matchrec.connect(db)
    assert run(root, con, threads=2).ok
    con.close()
    con = matchrec.connect(db)
    assert con.cursor().execute("SELECT count(*) FROM events").fetchone()[0] == 60


def test_threads_need_a_way_to_open_worker_connections(tmp_path):
    project = P.load_project(make(tmp_path, BASIC))
    with pytest.raises(matchrec.ProgrammingError, match="needs connect"):
        P.run_project(project, matchrec.connect(), threads=2)


def test_schema_from_the_project_file(tmp_path):
    root = make(tmp_path, {"matchrec_project.toml": 'schema = "analytics"\n', **BASIC})
    con = matchrec.connect()
    assert run(root, con).ok
    assert con.cursor().execute("SELECT count(*) FROM analytics.events").fetchone()[0] == 60
    assert table_of(con, "analytics.seq_ab").num_rows > 0


def test_progress_bar_counts_models():
    out = io.StringIO()
    bar = ProgressBar(out, 2)
    bar.started(["a", "b"])
    bar.finished(P.ModelResult("a", "OK", "table", False))
    assert "1/2 models  running: b" in out.getvalue()
    bar.finished(P.ModelResult("b", "OK", "table", False))
    bar.done()
    assert "2/2 models" in out.getvalue() and out.getvalue().endswith("\r\x1b[K")


def test_compile_prints_models_in_order(tmp_path, capsys):
    root = make(tmp_path, BASIC)
    assert main(["compile", str(root), "--select", "+summary"]) == 0
    out = capsys.readouterr().out
    heads = re.findall(r"^-- \[(\d)/3\] (\w+) \(([^)]+)\): ([^,]+), materialized (\w+)", out, re.M)
    assert [(h[1], h[2], h[4]) for h in heads] == [("events", "models/events.sql", "table"),
                                                   ("seq_ab", "models/p/seq_ab.sql", "table"),
                                                   ("summary", "models/m/summary.sql", "view")]
    assert heads[1][3] == "pattern over events" and heads[0][3] == "SQL"
    assert "{{" not in out and "FROM events ORDER BY ts WITHIN 3" in out and "FROM seq_ab" in out
    assert main(["compile", str(root), "--select", "nope"]) == 1
    assert "No model matches" in capsys.readouterr().err


# ---------------------------------------------------------------- the example project
def _by_hand(root: Path) -> dict[str, pa.Table]:
    """Each model of the project run by hand: templates replaced with regular expressions, in file order
    until every model has run, each result stored as a table for the models after it."""
    texts = {p.stem: p.read_text() for p in root.rglob("*.sql") if "target" not in p.parts}
    con = matchrec.connect()
    out: dict[str, pa.Table] = {}
    while len(out) < len(texts):
        progress = False
        for name, text in texts.items():
            refs = re.findall(r"\{\{\s*ref\('(\w+)'\)\s*\}\}", text)
            if name in out or any(r not in out for r in refs):
                continue
            sql = re.sub(r"\{\{\s*config\(.*?\)\s*\}\}", "", text, flags=re.S)
            sql = re.sub(r"\{\{\s*ref\('(\w+)'\)\s*\}\}", r"\1", sql)
            table = con.cursor().execute(sql).fetch_arrow_table()
            con.register("t", table)
            con.cursor().execute(f"CREATE TABLE {name} AS SELECT * FROM t")
            con.unregister("t")
            out[name] = table_of(con, name)
            progress = True
        assert progress, "the by-hand run found no runnable model"
    return out


def test_example_project_runs_end_to_end(tmp_path):
    example = tmp_path / "fraud_project"  # a copy, so the Parquet output stays out of the source tree
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("target"))
    db = tmp_path / "fraud.duckdb"
    env = {**os.environ, "MATCHREC_HISTORY": ""}
    proc = subprocess.run([sys.executable, "-m", "matchrec", "run", str(example), "--db", str(db), "--threads", "2"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal
    assert "7 OK, 0 ERROR, 0 SKIPPED" in proc.stdout and "pass #1 over transactions, one run_many call" in proc.stdout
    con = matchrec.connect(str(db))
    expected = _by_hand(example)
    assert set(expected) == {"raw_transactions", "transactions", "card_testing", "atm_after_foreign", "spend_spikes",
                             "fraud_alerts", "card_risk"}
    for name, table in expected.items():
        assert table.num_rows > 0, name
        assert table_of(con, name).equals(table), name
    assert pq.read_table(example / "target" / "card_risk.parquet").num_rows == expected["card_risk"].num_rows


@pytest.mark.parametrize("text, needle", [
    ("{{ config(materialized='table') }}SELECT {{ ref('events') }}.v, nope FROM {{ ref('events') }}", "nope"),
    ("{{ config(materialized='view') }}SELECT {{ ref('events') }}.v, nope FROM {{ ref('events') }}", "nope"),
    ("{{ config(materialized='parquet') }}SELECT {{ ref('events') }}.v,\n nope FROM {{ ref('events') }}", "nope"),
    ("SELECT * FROM {{ ref('events') }} MATCH_RECOGNIZE (ORDER BY ts PATTERN (A) DEFINE B AS v > 1)", "B AS"),
    ("{# a comment #}PATTERN SEQ(A a, B b) FROM {{ ref('events') }} ORDER BY ts WHERE b.nope > 1 WITHIN 3 RETURN *",
     "b.nope"),
])
def test_run_errors_point_into_the_model_file(tmp_path, text, needle):
    result = run(make(tmp_path, {"events.sql": EVENTS, "bad.sql": text}))
    error = next(r.error for r in result.results if r.name == "bad")
    line, col = position(text, needle)
    assert error.startswith("model bad (bad.sql): ") and f"Line {line}, Col {col}." in error, error
    assert error.rstrip().splitlines()[-2].strip() == text.splitlines()[line - 1].strip()


# ---------------------------------------------------------------- a target folder outside; every load error
def test_target_path_outside_the_project_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cases = {"up": '"../stolen"', "absolute": repr(str(elsewhere)).replace("'", '"'), "linked": '"out/parquet"'}
    for name, value in cases.items():
        root = make(tmp_path, {"a.sql": "SELECT 1 AS x"}, name)
        (root / "out").symlink_to(elsewhere, target_is_directory=True)
        (root / "matchrec_project.toml").write_text(f'name = "p"\ntarget-path = {value}\n')
        with pytest.raises(matchrec.ProgrammingError) as info:
            P.load_project(root)
        message = str(info.value)
        assert message.startswith("matchrec_project.toml: target-path") and "outside the project folder" in message
        assert "(line 2)" in message, message
    inside = make(tmp_path, {"a.sql": "{{ config(materialized='parquet') }} SELECT 1 AS x",
                             "matchrec_project.toml": 'target-path = "build/../out2"\n'}, "inside")
    project = P.load_project(inside)
    assert project.target.resolve() == (inside / "out2").resolve()
    assert run(inside).ok and (inside / "out2" / "a.parquet").exists()
    assert not list(elsewhere.iterdir())


BROKEN = {
    "matchrec_project.toml": 'name = "broken"\ncolour = "red"\n',
    "bad-name.sql": "SELECT 1",
    "x/dup.sql": "SELECT 1",
    "y/dup.sql": "SELECT 2",
    "unknown.sql": "SELECT *\nFROM {{ ref('nowhere') }}",
    "two_faults.sql": "SELECT {{ var('x') }},\n  {% if true %} 1 {% endif %}",
    "a.sql": "SELECT * FROM {{ ref('b') }}",
    "b.sql": "SELECT * FROM {{ ref('a') }}",
    "c.sql": "SELECT * FROM {{ ref('d') }}",
    "d.sql": "SELECT * FROM {{ ref('e') }}",
    "e.sql": "SELECT * FROM\n  {{ ref('c') }}",
    "fine.sql": "SELECT 42 AS answer",
}


def test_every_load_error_is_reported(tmp_path):
    root = make(tmp_path, BROKEN)
    with pytest.raises(P.ProjectLoadError) as info:
        P.load_project(root)
    errors = info.value.errors
    where = sorted(f"{e.file}:{e.line}:{e.col}" if e.col else f"{e.file}:{e.line}" for e in errors)
    unknown_at = position(BROKEN["unknown.sql"], "'nowhere'")
    var_at = position(BROKEN["two_faults.sql"], "var(")
    if_at = position(BROKEN["two_faults.sql"], "{% if")
    endif_at = position(BROKEN["two_faults.sql"], "{% endif")
    expected = ["matchrec_project.toml:2", "bad-name.sql:None", "y/dup.sql:None", f"unknown.sql:{unknown_at[0]}:"
                f"{unknown_at[1]}", f"two_faults.sql:{var_at[0]}:{var_at[1]}", f"two_faults.sql:{if_at[0]}:{if_at[1]}",
                f"two_faults.sql:{endif_at[0]}:{endif_at[1]}"]
    for place in expected:
        assert place in where, (place, where)
    text = str(info.value)
    assert "unknown key 'colour'" in text and "plain identifier" in text and "Two models named 'dup'" in text
    assert "Unknown model 'nowhere'" in text and "Unknown template construct" in text
    assert len(re.findall(r"Dependency cycle: (\w+) -> (\w+) -> \1\b", text)) == 1
    assert len(re.findall(r"Dependency cycle: (\w+) -> (\w+) -> (\w+) -> \1\b", text)) == 1
    assert len(errors) == 9, [str(e).splitlines()[0] for e in errors]


def test_cli_prints_every_load_error_with_its_place(tmp_path, capsys):
    root = make(tmp_path, BROKEN)
    assert main(["run", str(root)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    line, col = position(BROKEN["unknown.sql"], "'nowhere'")
    assert f"Error: unknown.sql:{line}:{col}: Unknown model 'nowhere' in ref()" in err
    assert "Error: matchrec_project.toml:2: unknown key 'colour'; known keys:" in err
    assert "Error: y/dup.sql: Two models named 'dup'" in err
    assert err.count("Error: two_faults.sql:") == 3 and "9 errors in the project; nothing was built" in err
    assert main(["compile", str(root)]) == 1
    assert "9 errors in the project" in capsys.readouterr().err


# ---------------------------------------------------------------- storage nodes
NODE_MODELS = {
    "models/recent.sql": "SELECT id, ts, type, v, g FROM {{ source('proj_ev') }} WHERE v >= 20",
    "models/p/alarm_reset.sql": "PATTERN SEQ(alarm a, reset r) FROM {{ source('proj_ev') }} WITHIN 40 "
                                "RETURN a.id AS a_id, r.id AS r_id",
    "models/p/quiet.sql": "PATTERN SEQ(alarm a, ~tick t, reset r) FROM {{ source('proj_ev') }} PARTITION BY g "
                          "WHERE a.g = r.g WITHIN 60 RETURN a.id AS a_id, r.id AS r_id",
    "models/p/mr.sql": "SELECT * FROM {{ source('proj_ev') }} MATCH_RECOGNIZE (ORDER BY ts MEASURES A.id AS a, "
                       "C.id AS c PATTERN (A C) WITHIN 30 STRATEGY skip-till-any-match "
                       "DEFINE A AS type = 'alarm', C AS type = 'reset')",
    "models/p/on_recent.sql": "PATTERN SEQ(alarm a, reset r) FROM {{ ref('recent') }} WITHIN 80 RETURN a.id, r.id",
    "models/pairs.sql": "SELECT count(*) AS n FROM {{ ref('alarm_reset') }}",
}


def _events(n: int = 3000):
    import random
    rng = random.Random(5)
    t, rows = 0, []
    for i in range(n):
        t += rng.randint(1, 5)
        r = rng.random()
        rows.append((i, t, "alarm" if r < 0.01 else "reset" if r < 0.05 else rng.choice(["tick", "tock"]),
                     rng.randint(0, 100), rng.randint(0, 2)))
    return pa.table({name: pa.array(col) for name, col in zip(["id", "ts", "type", "v", "g"], zip(*rows))})


def test_a_run_on_storage_nodes_equals_the_local_run(tmp_path, node_cluster, capsys):
    import duckdb

    from matchrec.connectors.loader import load
    from nodes import TOKEN
    events = _events()
    src = duckdb.connect()
    src.register("src", events)
    load(node_cluster, "proj_ev", "SELECT * FROM src", src, "random", token=TOKEN)
    src.close()
    root = make(tmp_path, NODE_MODELS)
    db = str(tmp_path / "built.duckdb")
    nodes = ",".join(u.removeprefix("grpc://") for u in node_cluster)  # host:port is enough
    assert main(["run", str(root), "--db", db, "--threads", "2", "--nodes", nodes, "--token", TOKEN]) == 0
    out = capsys.readouterr().out
    # one set of rounds for the group; its final pulls (one shared, or split) are the cost model's choice,
    # which reads the measured link
    assert "6 OK, 0 ERROR" in out and "storage nodes: table proj_ev pulled" in out, out
    assert ("pulled once" in out or "one set of rounds" in out) and "shared rounds:" in out, out
    local = matchrec.connect()
    local.session.duck.register("src", events)
    local.cursor().execute("CREATE TABLE proj_ev AS SELECT * FROM src")
    assert run(root, local).ok
    built = matchrec.connect(db)
    for key in P.load_project(root).order:
        assert table_of(built, key).equals(table_of(local, key)), key
    assert table_of(built, "alarm_reset").num_rows > 0 and table_of(built, "quiet").num_rows > 0
    # worker connections must read the same nodes
    con = matchrec.connect(storage_nodes=node_cluster, token=TOKEN)
    with pytest.raises(matchrec.ProgrammingError, match="same nodes"):
        P.run_project(P.load_project(root), con, threads=2, connect=matchrec.connect)
    con.close()
