"""Batch runs of a folder of SQL models, dbt-style: ``matchrec run`` and ``matchrec compile``.

This package owns everything between a project folder and the tables it leaves in a database:
loading the models and the optional project file, the small template language, the
dependency graph and model selection, the scheduling of a run over threads, the sharing of
pattern models in one ``matchrec.run_many`` pass, materialisation and the mapping of errors
back to the model files. The command-line front ends are ``matchrec/run_cli.py`` and
``matchrec/compile_cli.py``.

Decisions, for where a dbt or DuckDB user could expect either way:

- **Models** are the ``.sql`` files under the project folder, recursively, except in hidden
  folders (``.name``) and in the target folder. The model name is the file stem; it must be a
  plain identifier (``[A-Za-z_][A-Za-z0-9_]*``) because it becomes a relation name and a CER
  statement's ``FROM`` takes plain names. Two files with the same stem (compared without case,
  as DuckDB compares names) are an error naming both. A model is one statement: plain DuckDB
  SQL, SQL with ``MATCH_RECOGNIZE``, or a SASE-style ``PATTERN ...`` statement; a trailing
  semicolon is allowed, a second statement is an error.
- **Templates**: ``{{ ref('model') }}``, ``{{ source('table') }}`` or ``{{ source('schema',
  'table') }}`` and ``{{ config(materialized='table'|'view'|'parquet', tags=['a', 'b']) }}``
  (at most once per model, anywhere in the file). ``{# ... #}`` is a comment. As in dbt, ``{{``,
  ``{%`` and ``{#`` always open a template construct, even inside SQL strings; anything else
  (``{% if %}``, ``var()``, filters) is an error with file, line and column. Arguments are
  literals (strings, lists of strings, true/false). ``config`` is replaced by blank lines, so
  line numbers of the compiled SQL equal those of the file; errors of DuckDB or matchrec are
  mapped back to the file's own line and column.
- **Relations**: a model ``x`` becomes the relation ``x`` in the project's ``schema`` (the
  database's default schema unless the project file names one, which is created if missing).
  A name that is a reserved word is double-quoted. ``source()`` names a relation that must
  already exist; with a ``sources`` list in the project file, only the listed ones may be used.
- **Project file** (optional): ``matchrec_project.toml`` in the project folder, read with
  ``tomllib`` (no YAML, to stay free of dependencies): ``name``, ``schema``, ``target-path``
  (default ``target``, relative to the project folder, and inside it: ``..``, an absolute path
  elsewhere or a symbolic link out are errors, as a run writes there) and ``sources`` (list of
  names, each ``table`` or ``schema.table``). Unknown keys are errors.
- **Load errors** are collected, not stopped at: a bad project file, bad file names, duplicate
  names, each model's template errors and every dependency cycle are reported together
  (``ProjectLoadError.errors``), each with its file and, where known, line and column.
- **Materializations**: ``table`` (default) is built under a temporary name and swapped in by a
  transaction (drop the old relation, rename the new table), so a failing model leaves the
  previous table untouched. ``view`` is replaced in one transaction. ``parquet`` writes
  ``<target-path>/<name>.parquet`` through a temporary file renamed over the old one and exposes
  it as a view over the file's absolute path. A pattern model cannot be a view: DuckDB cannot
  evaluate the pattern inside a view.
- **Pattern models** (``MATCH_RECOGNIZE`` or a CER statement) are evaluated by matchrec and
  stored from their Arrow result (so a HUGEINT such as ``sum`` of INTEGER is stored as
  DECIMAL(38,0), which is how it arrives in Arrow). Pattern models that are ready at the same
  moment and read the same single relation are evaluated together by one ``run_many`` call;
  if that call fails, each is run alone so the error belongs to the right model. Other models
  run as ``CREATE TABLE ... AS <sql>`` (or ``CREATE VIEW``, ``COPY``) through matchrec.
- **Runs**: models run in dependency order; with ``threads`` > 1, ready models run
  concurrently, each worker with its own connection to the same database (opened by the
  ``connect`` the caller passes, e.g. ``matchrec.connect``). A model whose dependency failed is
  SKIPPED, the others go on; ``fail_fast`` stops starting new models after
  the first error. A selected model that refers to an unselected one reads whatever relation
  of that name is in the database, and fails with a clear message when there is none.
- **Storage nodes**: on a compute-node connection (``matchrec.connect(db, storage_nodes=...)``,
  ``matchrec run --nodes``) models read the nodes' tables by name; pattern models over one node
  table share a ``run_many`` pass, which pulls the table once (``engine.cer_remote``). Worker
  connections must be attached to the same nodes: checked before the run builds anything.
- **Selection**: ``name`` (shell-style wildcards allowed), ``tag:x``, ``path:dir`` (models under
  a folder of the project), each with ``+`` before (and its ancestors) and/or after (and its
  descendants); space-separated selectors are a union, ``a,b`` an intersection. A selector that
  matches nothing is an error.

The package's modules, one job each: ``models`` (the loaded project and its errors), ``loading``
(the folder and the project file), ``templates`` (the template language and ``compile``),
``graph`` (order, cycles, selection), ``runner`` (scheduling and shared passes),
``materialize`` (tables, views, Parquet) and ``report`` (errors mapped to files, the summary).
"""
from matchrec.engine.project.graph import ancestors, descendants, select
from matchrec.engine.project.loading import load_project
from matchrec.engine.project.models import (BUILD_PREFIX, MATERIALIZATIONS, PROJECT_FILE, Model, Project, ProjectLoadError,
                                            located)
from matchrec.engine.project.report import SUMMARY_COLUMNS, format_errors, summary_rows
from matchrec.engine.project.runner import ModelResult, Progress, RunResult, SharedPass, run_project
from matchrec.engine.project.templates import compile_text

__all__ = ["BUILD_PREFIX", "MATERIALIZATIONS", "PROJECT_FILE", "SUMMARY_COLUMNS", "Model", "ModelResult", "Progress",
           "Project", "ProjectLoadError", "RunResult", "SharedPass", "ancestors", "compile_text", "descendants",
           "format_errors", "load_project", "located", "run_project", "select", "summary_rows"]
