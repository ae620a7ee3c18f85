"""Batch runs of a folder of SQL models, dbt-style: ``matchrec run`` and ``matchrec compile``.

This module owns everything between a project folder and the tables it leaves in a database:
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
  concurrently, each worker with its own connection to the same database. A model whose
  dependency failed is SKIPPED, the others go on; ``fail_fast`` stops starting new models after
  the first error. A selected model that refers to an unselected one reads whatever relation
  of that name is in the database, and fails with a clear message when there is none.
- **Selection**: ``name`` (shell-style wildcards allowed), ``tag:x``, ``path:dir`` (models under
  a folder of the project), each with ``+`` before (and its ancestors) and/or after (and its
  descendants); space-separated selectors are a union, ``a,b`` an intersection. A selector that
  matches nothing is an error.
"""
from __future__ import annotations

import ast
import concurrent.futures as cf
import fnmatch
import heapq
import os
import re
import secrets
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import duckdb

from matchrec import errors as E
from matchrec.engine.errors import map_duckdb_error, strip_location
from matchrec.parser.source import Origin, rewrite

PROJECT_FILE = "matchrec_project.toml"
MATERIALIZATIONS = ("table", "view", "parquet")
BUILD_PREFIX = "__matchrec_build_"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RELATION = re.compile(r'(?:"[^"]+"|[A-Za-z_][\w$]*)(?:\s*\.\s*(?:"[^"]+"|[A-Za-z_][\w$]*))*')
_PROJECT_KEYS = {"name": str, "schema": str, "target-path": str, "sources": list}


# ---------------------------------------------------------------- the project and its models
@dataclass
class Model:
    """One ``.sql`` file: its text as written, the compiled SQL and what the templates said."""
    name: str
    path: Path
    rel: str  # path relative to the project folder, for messages
    text: str
    relation: str = ""  # how other models and the database name it
    sql: str = ""  # compiled: templates expanded
    origin: Origin | None = None  # offsets of ``sql`` -> offsets of ``text``
    materialized: str = "table"
    tags: tuple[str, ...] = ()
    refs: dict[str, int] = field(default_factory=dict)  # model key -> offset of its first ref()
    sources: list[tuple[str, int]] = field(default_factory=list)  # (relation, offset of source())
    config_at: int | None = None
    pattern: bool = False  # MATCH_RECOGNIZE or a CER statement
    pattern_source: str | None = None  # the one relation a pattern model reads, normalised

    @property
    def key(self) -> str:
        return self.name.lower()

    def error(self, message: str, offset: int | None = None, end: int | None = None,
              cls: type[E.Error] = E.ProgrammingError) -> E.Error:
        """An error about this model's file, pointing at ``text[offset:end]`` when an offset is known."""
        err = E.positioned(cls, f"{self.rel}: {message}", self.text if offset is not None else None, offset, end)
        return _in_file(err, self.rel, message, self.text if offset is not None else None, offset)

    def run_error(self, message: str, offset: int | None = None, cls: type[E.Error] = E.ProgrammingError) -> E.Error:
        """An error of this model during a run: names the model and its file."""
        return E.positioned(cls, f"model {self.name} ({self.rel}): {message}",
                            self.text if offset is not None else None, offset)

    @property
    def kind(self) -> str:
        if not self.pattern:
            return "SQL"
        return "pattern" + (f" over {self.pattern_source}" if self.pattern_source else "")


@dataclass
class Project:
    """A loaded project: models by key (lower-case name), their topological order, settings."""
    root: Path
    models: dict[str, Model]
    order: list[str]  # model keys, dependencies first
    name: str = ""
    schema: str | None = None
    target: Path | None = None
    declared_sources: list[str] | None = None

    def parents(self, key: str) -> list[str]:
        return sorted(self.models[key].refs)

    def children(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {k: [] for k in self.models}
        for key, model in self.models.items():
            for parent in model.refs:
                out[parent].append(key)
        return out


class ProjectLoadError(E.ProgrammingError):
    """Every error found while loading a project; ``errors`` holds each one (with ``file``,
    and ``line`` and ``col`` where known)."""

    def __init__(self, errors: list[E.Error]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def _in_file(err: E.Error, file: str, problem: str, source: str | None = None, offset: int | None = None,
             line: int | None = None) -> E.Error:
    """``err`` marked with the file it is about and, when known, its line and column there."""
    err.file, err.bare = file, problem  # type: ignore[attr-defined]
    err.line, err.col = (E.line_col(source, offset) if source is not None and offset is not None  # type: ignore
                         else (line, None))
    return err


def located(err: E.Error) -> str:
    """``err`` as ``file:line:col: problem`` (plus the line and a caret when it points into a file)."""
    file = getattr(err, "file", None)
    if not file:
        return str(err)
    place = ":".join(str(x) for x in (file, getattr(err, "line", None), getattr(err, "col", None)) if x)
    text = f"{place}: {err.bare}"  # type: ignore[attr-defined]
    shown = str(err).split("\n", 1)
    return text + ("\n" + shown[1] if len(shown) > 1 and getattr(err, "col", None) else "")


def load_project(root: str | os.PathLike) -> Project:
    """Read the project folder: project file, models, templates, dependency graph (cycles are errors).
    Every error found is reported together, as one ``ProjectLoadError``."""
    root = Path(root)
    if not root.is_dir():
        raise E.ProgrammingError(f"Project folder {str(root)!r} does not exist or is not a folder")
    errors: list[E.Error] = []
    settings = _read_project_file(root, errors)
    target = _target_folder(root, settings, errors)
    project = Project(root=root, models={}, order=[], name=settings.get("name", root.resolve().name),
                      schema=settings.get("schema"), target=target, declared_sources=settings.get("sources"))
    for path in _model_files(root, target):
        name = path.stem
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            problem = f"not UTF-8 text ({err.reason} at byte {err.start})"
            errors.append(_in_file(E.ProgrammingError(f"{rel}: {problem}"), rel, problem))
            continue
        model = Model(name=name, path=path, rel=rel, text=text)
        if not _IDENT.fullmatch(name):
            problem = (f"a model's file name must be a plain identifier (letters, digits, underscores, not starting "
                       f"with a digit): {name!r} is not")
            errors.append(_in_file(E.ProgrammingError(f"{rel}: {problem}"), rel, problem))
            continue
        other = project.models.get(model.key)
        if other is not None:
            problem = (f"Two models named {name!r}: {other.rel} and {rel} (model names are the file names without "
                       ".sql, compared without case)")
            errors.append(_in_file(E.ProgrammingError(problem), rel, problem))
            continue
        project.models[model.key] = model
    if not project.models and not errors:
        raise E.ProgrammingError(f"No models: no .sql file under {str(root)!r}")
    reserved = _reserved_words()
    for model in project.models.values():
        model.relation = _relation_name(model.name, project.schema, reserved)
    for model in project.models.values():
        try:
            _compile_model(model, project, reserved, errors)
        except E.ProgrammingError as err:
            errors.append(err)
    errors += _cycles(project)
    if errors:
        raise ProjectLoadError(errors)
    project.order = _topological_order(project)
    return project


def _target_folder(root: Path, settings: dict, errors: list[E.Error]) -> Path:
    """The target folder, which must lie inside the project (a run writes and replaces files there)."""
    target = root / settings.get("target-path", "target")
    inside = root.resolve()
    resolved = target.resolve()
    if resolved != inside and inside not in resolved.parents:
        problem = (f"target-path {settings.get('target-path')!r} lies outside the project folder (it resolves to "
                   f"{str(resolved)!r}); a run writes there, so it must be a folder inside the project")
        line = settings.get("_lines", {}).get("target-path")
        errors.append(_in_file(E.ProgrammingError(f"{PROJECT_FILE}: {problem}" + (f" (line {line})" if line else "")),
                               PROJECT_FILE, problem, line=line))
        return root / "target"
    return target


def _read_project_file(root: Path, errors: list[E.Error]) -> dict:
    """The project file's settings; each error in it is added to ``errors`` (the setting is then left out)."""
    def fail(problem: str, line: int | None = None, file: str = PROJECT_FILE, more: str = "") -> None:
        at = f" (line {line})" if line else ""
        errors.append(_in_file(E.ProgrammingError(f"{file}: {problem}{at}{more}"), file, problem + more, line=line))

    for other in ("matchrec_project.yml", "matchrec_project.yaml"):
        if (root / other).exists() and not (root / PROJECT_FILE).exists():
            fail(f"the project file is TOML; write it as {PROJECT_FILE}", file=other)
    path = root / PROJECT_FILE
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as err:
        fail(f"not UTF-8 text ({err.reason} at byte {err.start})")
        return {}
    except tomllib.TOMLDecodeError as err:
        fail(str(err))
        return {}

    def line_of(key: str) -> int | None:
        m = re.search(r"^[ \t]*\"?" + re.escape(key) + r"\"?\s*=", text, re.M)
        return text.count(chr(10), 0, m.start()) + 1 if m else None

    out = {"_lines": {}}
    for key, value in data.items():
        if key not in _PROJECT_KEYS:
            fail(f"unknown key {key!r}", line_of(key), more=f"; known keys: {', '.join(_PROJECT_KEYS)}")
        elif not isinstance(value, _PROJECT_KEYS[key]):
            fail(f"{key} must be a {_PROJECT_KEYS[key].__name__}", line_of(key))
        else:
            out[key] = value
            out["_lines"][key] = line_of(key)
    bad = [s for s in out.get("sources", []) if not isinstance(s, str) or not _RELATION.fullmatch(s.strip())]
    if bad:
        fail(f"sources must be relation names such as 'events' or 'raw.events', got {bad[0]!r}", line_of("sources"))
        del out["sources"]
    if "schema" in out and not _IDENT.fullmatch(out["schema"]):
        fail(f"schema must be a plain identifier, got {out['schema']!r}", line_of("schema"))
        del out["schema"]
    if "sources" in out:
        out["sources"] = [_normalise(s) for s in out["sources"]]
    return out


def _model_files(root: Path, target: Path) -> list[Path]:
    target = target.resolve()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and (here / d).resolve() != target)
        out += [here / f for f in sorted(filenames) if f.endswith(".sql") and not f.startswith(".")]
    return out


def _reserved_words() -> frozenset[str]:
    con = duckdb.connect()
    try:
        rows = con.execute("SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'").fetchall()
    finally:
        con.close()
    return frozenset(r[0].lower() for r in rows)


def _quote(name: str, reserved: frozenset[str]) -> str:
    return f'"{name}"' if name.lower() in reserved else name


def _relation_name(name: str, schema: str | None, reserved: frozenset[str]) -> str:
    return (f"{_quote(schema, reserved)}." if schema else "") + _quote(name, reserved)


def _normalise(relation: str) -> str:
    """A relation name for comparisons: parts unquoted, lower-case, joined by dots."""
    parts = re.findall(r'"([^"]+)"|([^".\s]+)', relation)
    return ".".join((q or p).lower() for q, p in parts)


# ---------------------------------------------------------------- templates
_OPEN = re.compile(r"\{\{|\{%|\{#")


def _compile_model(model: Model, project: Project, reserved: frozenset[str], errors: list[E.Error]) -> None:
    """Expand the templates of ``model`` into ``model.sql``; record refs, sources and config. An
    error in one template construct is added to ``errors`` and the next one is read all the same."""
    text = model.text
    edits: list[tuple[int, int, str]] = []
    found: list[E.Error] = []
    pos = 0
    while True:
        m = _OPEN.search(text, pos)
        if m is None:
            break
        start = m.start()
        kind = m.group()
        close = {"{{": "}}", "{%": "%}", "{#": "#}"}[kind]
        end = text.find(close, m.end())
        if end < 0:
            errors += found + [model.error(f"{kind} is not closed by {close}", start, start + 2)]
            return
        end += 2
        pos = end
        if kind == "{%":
            found.append(model.error("Template statements ({% ... %}) are not supported: only {{ ref() }}, "
                                     "{{ source() }} and {{ config() }}", start, end))
        elif kind == "{#":
            edits.append((start, end, "\n" * text.count("\n", start, end)))
        else:
            try:
                edits.append((start, end, _expand(model, project, reserved, start, end)))
            except E.ProgrammingError as err:
                found.append(err)
    if found:
        errors += found
        return
    sql, origin = rewrite(text, edits)
    model.sql, model.origin = _single_statement(model, sql, origin), origin
    if not model.sql.strip() or _only_comments(model.sql):
        raise model.error("the model has no SQL statement")
    _classify(model)
    if model.pattern and model.materialized == "view":
        raise model.error("a pattern model (MATCH_RECOGNIZE or a CER statement) cannot be materialized as a view: "
                          "DuckDB cannot evaluate the pattern inside a view; use 'table' or 'parquet'",
                          model.config_at)


def _expand(model: Model, project: Project, reserved: frozenset[str], start: int, end: int) -> str:
    """The replacement text of the ``{{ ... }}`` at ``model.text[start:end]``."""
    inner_start = start + 2
    inner = model.text[inner_start:end - 2]
    if inner.startswith("-"):  # whitespace control markers change nothing that matters to SQL
        inner, inner_start = " " + inner[1:], inner_start
    if inner.endswith("-"):
        inner = inner[:-1] + " "
    stripped = inner.strip()
    if not stripped:
        raise model.error("Empty template expression {{ }}", start, end)
    lead = len(inner) - len(inner.lstrip())
    expr_at = inner_start + lead
    try:
        node = ast.parse(stripped, mode="eval").body
    except SyntaxError as err:
        at = expr_at + _char_offset(stripped, err.lineno or 1, (err.offset or 1) - 1)
        raise model.error(f"Cannot read the template expression {stripped!r}: only ref('model'), "
                          "source('table') and config(...) are supported", at) from None

    def at(n: ast.AST) -> tuple[int, int]:
        a = expr_at + _char_offset(stripped, n.lineno, n.col_offset)
        b = expr_at + _char_offset(stripped, n.end_lineno or n.lineno, n.end_col_offset or n.col_offset)
        return a, b

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("ref", "source", "config")):
        a, b = at(node)
        raise model.error(f"Unknown template construct {stripped!r}: only ref('model'), source('table') and "
                          "config(...) are supported", a, b)
    func = node.func.id
    if func == "config":
        return _config(model, node, at, start, end)
    if node.keywords:
        a, b = at(node.keywords[0].value)
        raise model.error(f"{func}() takes no keyword arguments", a, b)
    args = []
    for arg in node.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            a, b = at(arg)
            raise model.error(f"{func}() takes names as quoted strings", a, b)
        args.append(arg.value)
    if func == "ref":
        if len(args) != 1:
            raise model.error("ref() takes one model name: ref('model')", *at(node))
        target = project.models.get(args[0].lower())
        if target is None:
            raise model.error(f"Unknown model {args[0]!r} in ref(); models: {', '.join(sorted(project.models))}",
                              *at(node.args[0]))
        model.refs.setdefault(target.key, start)
        return target.relation
    if len(args) not in (1, 2) or not all(_IDENT.fullmatch(a) for a in args):
        raise model.error("source() takes a table name, or a schema and a table name, each a plain identifier: "
                          "source('events') or source('raw', 'events')", *at(node))
    relation = ".".join(_quote(a, reserved) for a in args)
    if project.declared_sources is not None and _normalise(relation) not in project.declared_sources:
        raise model.error(f"Source {'.'.join(args)!r} is not declared in {PROJECT_FILE} (sources: "
                          f"{', '.join(project.declared_sources) or 'none'})", *at(node))
    model.sources.append((relation, start))
    return relation


def _config(model: Model, node: ast.Call, at, start: int, end: int) -> str:
    if model.config_at is not None:
        raise model.error("config() appears twice in one model", start, end)
    model.config_at = start
    if node.args:
        raise model.error("config() takes keyword arguments: config(materialized='table', tags=['x'])",
                          *at(node.args[0]))
    for kw in node.keywords:
        if kw.arg is None:
            raise model.error("config() takes keyword arguments", *at(kw.value))
        value = _literal(kw.value)
        if kw.arg == "materialized":
            if value not in MATERIALIZATIONS:
                raise model.error(f"materialized must be one of {', '.join(MATERIALIZATIONS)}, got {value!r}",
                                  *at(kw.value))
            model.materialized = value
        elif kw.arg == "tags":
            if isinstance(value, str):
                value = [value]
            if not (isinstance(value, list) and value and all(isinstance(t, str) and t for t in value)):
                raise model.error("tags must be a string or a list of strings", *at(kw.value))
            model.tags = tuple(dict.fromkeys(value))
        else:
            a = at(kw.value)[0] - len(kw.arg) - 1
            raise model.error(f"Unknown config key {kw.arg!r}; known: materialized, tags", max(start, a))
    return "\n" * model.text.count("\n", start, end)


_NOT_LITERAL = object()


def _literal(node: ast.AST):
    """The value of a literal argument (Jinja's true/false/none included); _NOT_LITERAL otherwise."""
    if isinstance(node, ast.Name) and node.id.lower() in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[node.id.lower()]
    if isinstance(node, ast.List):
        items = [_literal(e) for e in node.elts]
        return _NOT_LITERAL if _NOT_LITERAL in items else items
    if isinstance(node, ast.Constant):
        return node.value
    return _NOT_LITERAL


def _char_offset(text: str, lineno: int, byte_col: int) -> int:
    """The character offset in ``text`` of ast's (1-based line, UTF-8 byte column)."""
    lines = text.split("\n")
    before = sum(len(x) + 1 for x in lines[:lineno - 1])
    line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
    return before + len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _single_statement(model: Model, sql: str, origin: Origin) -> str:
    """``sql`` with a trailing semicolon blanked out; a second statement is an error."""
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType
    try:
        tokens = Dialect.get_or_raise("duckdb").tokenize(sql)
    except Exception:  # noqa: BLE001 - the statement's own run reports what is wrong with it
        return sql
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.SEMICOLON:
            if i + 1 < len(tokens):
                raise model.error("A model is one SQL statement; this is a second one", origin.map(tokens[i + 1].start))
            return sql[:tok.start] + " " + sql[tok.end + 1:]
    return sql


def _only_comments(sql: str) -> bool:
    return not re.sub(r"--[^\n]*|/\*.*?\*/|\s+", "", sql, flags=re.S)


def _classify(model: Model) -> None:
    """Is the model a pattern model, and does it read one relation only (then it may share a pass)?

    Decided on tokens, without parsing the pattern (the run parses it and reports its errors).
    """
    from matchrec.parser import sase
    sql = model.sql
    if sase.is_cer_statement(sql):
        model.pattern = True
        m = _SASE_FROM.search(_strip_comments(sql))
        model.pattern_source = _normalise(m.group(1)) if m else None
        return
    if "match_recognize" not in sql.lower():
        return
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType
    try:
        tokens = Dialect.get_or_raise("duckdb").tokenize(sql)
    except Exception:  # noqa: BLE001 - the run reports what is wrong with the statement
        model.pattern = True
        return
    clauses = [i for i, t in enumerate(tokens) if t.text.upper() == "MATCH_RECOGNIZE"
               and t.token_type not in (TokenType.STRING, TokenType.IDENTIFIER)
               and i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.L_PAREN]
    model.pattern = bool(clauses)
    if len(clauses) != 1:
        return
    i = clauses[0]
    j = i - 1  # the table reference before MATCH_RECOGNIZE reaches back to FROM, JOIN or a comma
    while j >= 0 and tokens[j].token_type not in (TokenType.FROM, TokenType.JOIN, TokenType.COMMA,
                                                   TokenType.L_PAREN, TokenType.R_PAREN):
        j -= 1
    if j >= 0 and tokens[j].token_type == TokenType.FROM and j + 1 < i:
        text = sql[tokens[j + 1].start:tokens[i - 1].end + 1].strip()
        if _RELATION.fullmatch(text):
            model.pattern_source = _normalise(text)


_SASE_FROM = re.compile(r"\bFROM\s+([A-Za-z_][\w$]*(?:\s*\.\s*[A-Za-z_][\w$]*)*)", re.I)


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", " ", sql, flags=re.S)


# ---------------------------------------------------------------- the dependency graph
def _topological_order(project: Project) -> list[str]:
    children = project.children()
    waiting = {k: len(m.refs) for k, m in project.models.items()}
    heap = [k for k, n in waiting.items() if n == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        key = heapq.heappop(heap)
        order.append(key)
        for child in children[key]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(heap, child)
    return order


def _cycles(project: Project) -> list[E.Error]:
    """An error for every dependency cycle met by a depth-first walk (a ref that closes a cycle)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    found: list[E.Error] = []

    def visit(key: str) -> None:
        state[key] = 1
        path.append(key)
        for parent in sorted(project.models[key].refs):
            if state.get(parent) == 1:
                cycle = path[path.index(parent):] + [parent]
                first, second = project.models[cycle[0]], project.models[cycle[1]]
                names = " -> ".join(project.models[k].name for k in cycle)
                if len(cycle) == 2:
                    found.append(first.error(f"Model {first.name!r} refers to itself", first.refs[first.key]))
                else:
                    found.append(first.error(f"Dependency cycle: {names} (each model refers to the next)",
                                             first.refs[second.key]))
            elif parent not in state:
                visit(parent)
        path.pop()
        state[key] = 2

    for key in sorted(project.models):
        if key not in state:
            visit(key)
    return found


def ancestors(project: Project, key: str) -> set[str]:
    out: set[str] = set()
    stack = [key]
    while stack:
        for parent in project.models[stack.pop()].refs:
            if parent not in out:
                out.add(parent)
                stack.append(parent)
    return out


def descendants(project: Project, key: str) -> set[str]:
    children = project.children()
    out: set[str] = set()
    stack = [key]
    while stack:
        for child in children[stack.pop()]:
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


# ---------------------------------------------------------------- selection
_SELECTOR = re.compile(r"^(\+?)(?:(tag|path):)?([^+]+?)(\+?)$")


def select(project: Project, selectors: list[str] | None = None, exclude: list[str] | None = None) -> list[str]:
    """Model keys chosen by ``selectors`` minus ``exclude``, in topological order (all without selectors)."""
    chosen = set(project.models) if not selectors else _union(project, selectors)
    if exclude:
        chosen -= _union(project, exclude)
    return [k for k in project.order if k in chosen]


def _union(project: Project, selectors: list[str]) -> set[str]:
    out: set[str] = set()
    for item in selectors:
        for word in item.split():
            parts = [_one(project, part) for part in word.split(",") if part]
            if not parts:
                raise E.ProgrammingError(f"Empty selector {word!r}")
            out |= set.intersection(*parts)
    return out


def _one(project: Project, selector: str) -> set[str]:
    m = _SELECTOR.match(selector)
    if not m:
        raise E.ProgrammingError(f"Cannot read the selector {selector!r}: use name, +name, name+, tag:x or path:dir")
    up, method, value, down = m.groups()
    if method == "tag":
        base = {k for k, mod in project.models.items() if value in mod.tags}
    elif method == "path":
        prefix = value.strip("/").rstrip("/")
        base = {k for k, mod in project.models.items()
                if mod.rel == prefix or mod.rel.startswith(prefix + "/") or prefix in ("", ".")}
    else:
        base = {k for k in project.models if fnmatch.fnmatchcase(k, value.lower())}
    if not base:
        what = {"tag": f"tag {value!r}", "path": f"path {value!r}"}.get(method, f"the name {value!r}")
        raise E.ProgrammingError(f"No model matches {what} (selector {selector!r}); models: "
                                 f"{', '.join(project.models[k].name for k in project.order)}")
    out = set(base)
    for key in base:
        if up:
            out |= ancestors(project, key)
        if down:
            out |= descendants(project, key)
    return out


# ---------------------------------------------------------------- compile
def compile_text(project: Project, keys: list[str]) -> str:
    """The SQL each selected model runs, in dependency order, with a comment header per model."""
    blocks = []
    for i, key in enumerate(keys, 1):
        m = project.models[key]
        where = (f"{project.target / (m.name + '.parquet')}" if m.materialized == "parquet" else m.relation)
        head = [f"-- [{i}/{len(keys)}] {m.name} ({m.rel}): {m.kind}, materialized {m.materialized} as {where}"]
        if m.tags:
            head.append(f"-- tags: {', '.join(m.tags)}")
        if m.refs:
            head.append(f"-- depends on: {', '.join(project.models[k].name for k in project.parents(key))}")
        body = m.sql.strip("\n").rstrip()
        blocks.append("\n".join(head) + "\n" + body + ";")
    return "\n\n".join(blocks) + ("\n" if blocks else "")


# ---------------------------------------------------------------- running
@dataclass
class ModelResult:
    name: str
    status: str  # OK | ERROR | SKIPPED
    materialized: str
    pattern: bool
    rows: int | None = None
    matches: int | None = None
    seconds: float = 0.0
    error: str | None = None
    note: str = ""
    shared_pass: int | None = None  # number of the shared run_many pass it was evaluated in


@dataclass
class SharedPass:
    number: int
    source: str
    models: list[str]
    report: list[str]
    seconds: float


@dataclass
class RunResult:
    results: list[ModelResult]
    passes: list[SharedPass]
    seconds: float
    threads: int

    @property
    def ok(self) -> bool:
        return all(r.status == "OK" for r in self.results)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)


class Progress:
    """Receives run events in the thread that called ``run_project``; the default does nothing."""

    def started(self, names: list[str]) -> None:
        pass

    def finished(self, result: ModelResult) -> None:
        pass

    def done(self) -> None:
        pass


def run_project(project: Project, con, keys: list[str] | None = None, threads: int = 1, fail_fast: bool = False,
                progress: Progress | None = None) -> RunResult:
    """Build the models ``keys`` (default: all) of ``project`` in the matchrec connection ``con``."""
    import matchrec
    if threads < 1:
        raise E.ProgrammingError("threads must be at least 1")
    keys = project.order if keys is None else keys
    progress = progress or Progress()
    started_at = time.perf_counter()
    selected = set(keys)
    order = {k: i for i, k in enumerate(project.order)}
    children = project.children()
    results: dict[str, ModelResult] = {}
    passes: list[SharedPass] = []
    waiting = {k: {p for p in project.models[k].refs if p in selected} for k in keys}
    ready = [k for k in keys if not waiting[k]]
    stop = False

    def skip(key: str, note: str) -> None:
        m = project.models[key]
        results[key] = ModelResult(m.name, "SKIPPED", m.materialized, m.pattern, note=note)
        progress.finished(results[key])

    def settle(result: ModelResult) -> None:
        nonlocal stop
        key = result.name.lower()
        results[key] = result
        progress.finished(result)
        if result.status == "OK":
            for child in children[key]:
                if child in waiting and key in waiting[child]:
                    waiting[child].discard(key)
                    if not waiting[child]:
                        ready.append(child)
            return
        stop = stop or (fail_fast and result.status == "ERROR")
        # Selected models downstream (through selected models) cannot run; others read what exists.
        stack = [key]
        while stack:
            for child in children[stack.pop()]:
                if child in waiting and child not in results:
                    skip(child, f"upstream {result.name} did not build")
                    stack.append(child)

    _prepare(project, con)
    workers = [con] + [matchrec.connect(con.duckdb_connection.cursor())
                       for _ in range(max(1, min(threads, len(keys))) - 1)]
    free = list(workers)
    try:
        with cf.ThreadPoolExecutor(max_workers=len(workers)) as pool:
            running: dict[cf.Future, object] = {}
            while ready or running:
                ready.sort(key=order.get)
                while ready and free and not stop:
                    unit = _take_unit(project, ready)
                    number = None
                    if len(unit) > 1:
                        number = len(passes) + 1
                        passes.append(SharedPass(number, project.models[unit[0]].pattern_source or "",
                                                 [project.models[k].name for k in unit], [], 0.0))
                    progress.started([project.models[k].name for k in unit])
                    worker = free.pop()
                    fut = pool.submit(_run_unit, project, worker, [project.models[k] for k in unit], selected, number)
                    running[fut] = worker
                if stop:
                    for key in list(ready):
                        if key not in results:
                            skip(key, "not started: an earlier model failed (fail-fast)")
                    ready.clear()
                if not running:
                    continue
                try:
                    done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                except KeyboardInterrupt:  # stop the statements running now; their build tables are dropped
                    for fut in running:
                        fut.cancel()
                    for worker in workers:
                        worker.duckdb_connection.interrupt()
                    raise
                for fut in done:
                    free.append(running.pop(fut))
                    unit_results, shared = fut.result()
                    if shared is not None:
                        passes[shared.number - 1] = shared
                    for r in unit_results:
                        settle(r)
    finally:
        for worker in workers[1:]:
            duck = worker.duckdb_connection
            worker.close()
            duck.close()
        progress.done()
    for key in keys:  # what could not start (after fail-fast, below a model that never built)
        if key not in results:
            skip(key, "not started")
    return RunResult([results[k] for k in keys], passes, time.perf_counter() - started_at, len(workers))


def _prepare(project: Project, con) -> None:
    cur = con.cursor()
    try:
        if project.schema:
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {project.schema}")
        # Build tables of a run that was killed half-way.
        cur.execute("SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database() "
                    f"AND NOT temporary AND starts_with(table_name, '{BUILD_PREFIX}')")
        for schema, name in cur.fetchall():
            cur.execute(f'DROP TABLE IF EXISTS "{schema}"."{name}"')
    finally:
        cur.close()


def _take_unit(project: Project, ready: list[str]) -> list[str]:
    """The next piece of work: one model, or every ready pattern model over the same relation."""
    first = project.models[ready.pop(0)]
    unit = [first.key]
    if first.pattern and first.pattern_source:
        for key in list(ready):
            m = project.models[key]
            if m.pattern and m.pattern_source == first.pattern_source:
                unit.append(key)
                ready.remove(key)
    return unit


def _run_unit(project: Project, con, models: list[Model], selected: set[str],
              pass_number: int | None) -> tuple[list[ModelResult], SharedPass | None]:
    """Build ``models`` on the worker connection ``con``; one model's error never stops the others."""
    results: list[ModelResult] = []
    todo: list[Model] = []
    for m in models:
        try:
            _check_inputs(project, con, m, selected)
            todo.append(m)
        except E.Error as err:
            results.append(ModelResult(m.name, "ERROR", m.materialized, m.pattern, error=str(err)))
    if not todo:
        return results, None
    if not todo[0].pattern:
        m = todo[0]
        t0 = time.perf_counter()
        try:
            rows = _materialise_sql(project, con, m)
            results.append(ModelResult(m.name, "OK", m.materialized, False, rows=rows,
                                       seconds=time.perf_counter() - t0))
        except Exception as err:  # noqa: BLE001 - reported as the model's error; the run goes on
            results.append(ModelResult(m.name, "ERROR", m.materialized, False, error=_message(m, err),
                                       seconds=time.perf_counter() - t0))
        return results, None
    return _run_patterns(project, con, todo, results, pass_number)


def _run_patterns(project: Project, con, models: list[Model], results: list[ModelResult],
                  pass_number: int | None) -> tuple[list[ModelResult], SharedPass | None]:
    """Evaluate pattern models with one ``run_many`` call (each alone if it fails), then store them."""
    import matchrec
    shared = None
    tables: dict[str, object] = {}
    failed: dict[str, str] = {}
    seconds: dict[str, float] = {}
    names = [m.name for m in models]
    source = models[0].pattern_source or ""
    t0 = time.perf_counter()
    try:
        many = matchrec.run_many(con, [m.sql for m in models])
        if len(many.tables) != len(models):
            raise E.InternalError(f"run_many returned {len(many.tables)} tables for {len(models)} statements")
        elapsed = time.perf_counter() - t0
        for m, table in zip(models, many.tables):
            tables[m.key], seconds[m.key] = table, elapsed
        if pass_number is not None:
            shared = SharedPass(pass_number, source, names, list(many.report), many.seconds)
    except Exception as err:  # noqa: BLE001 - run each alone, so that each error belongs to its model
        if pass_number is not None:
            shared = SharedPass(pass_number, source, names, [f"the shared pass failed ({type(err).__name__}); "
                                                             "each model was run alone"], time.perf_counter() - t0)
        for m in models:
            t1 = time.perf_counter()
            cur = con.cursor()
            try:
                try:
                    tables[m.key] = cur.execute(m.sql).fetch_arrow_table()
                except E.Error as one:
                    raise _Statement(one, "") from None
            except Exception as one:  # noqa: BLE001
                failed[m.key] = _message(m, one)
            finally:
                cur.close()
                seconds[m.key] = time.perf_counter() - t1
    for m in models:
        if m.key in failed:
            results.append(ModelResult(m.name, "ERROR", m.materialized, True, error=failed[m.key],
                                       seconds=seconds[m.key], shared_pass=pass_number))
            continue
        t1 = time.perf_counter()
        table = tables[m.key]
        try:
            _materialise_arrow(project, con, m, table)
        except Exception as err:  # noqa: BLE001
            results.append(ModelResult(m.name, "ERROR", m.materialized, True, error=_message(m, err),
                                       seconds=seconds[m.key] + time.perf_counter() - t1, shared_pass=pass_number))
            continue
        results.append(ModelResult(m.name, "OK", m.materialized, True, rows=table.num_rows,
                                   matches=_matches(m, table), seconds=seconds[m.key] + time.perf_counter() - t1,
                                   shared_pass=pass_number))
    return results, shared


def _matches(model: Model, table) -> int:
    """Rows of a pattern model's result; for a CER ``RETURN COUNT(*)``, the count it returns."""
    from matchrec.parser import sase
    if sase.is_cer_statement(model.sql) and table.num_rows == 1 and table.num_columns == 1:
        try:
            if sase.parse(model.sql).returns == "count":
                return int(table.column(0)[0].as_py())
        except (E.Error, TypeError, ValueError):
            pass
    return table.num_rows


def _check_inputs(project: Project, con, model: Model, selected: set[str]) -> None:
    """Sources and unselected upstream models must exist before the model runs."""
    checks = [(rel, at, f"Source {rel!r} does not exist in the database") for rel, at in model.sources]
    for key, at in model.refs.items():
        if key not in selected:
            up = project.models[key]
            checks.append((up.relation, at, f"Model {up.name!r} is not selected and not in the database "
                                            f"(select it too, e.g. with +{model.name})"))
    cur = con.cursor()
    try:
        for relation, at, message in checks:
            try:
                cur.execute(f"SELECT * FROM {relation} LIMIT 0")
            except E.Error:
                raise model.run_error(message, at) from None
    finally:
        cur.close()


def _relation_kind(cur, relation: str) -> str | None:
    """'table', 'view' or None for a model's relation (``name`` or ``schema.name``)."""
    parts = _normalise(relation).split(".")
    schema_sql = f"'{parts[0]}'" if len(parts) == 2 else "current_schema()"
    name = parts[-1]
    where = (f"database_name = current_database() AND lower(schema_name) = {schema_sql} "
             f"AND lower({{col}}) = '{name}' AND NOT temporary")
    cur.execute(f"SELECT 'table' FROM duckdb_tables() WHERE {where.format(col='table_name')} "
                f"UNION ALL SELECT 'view' FROM duckdb_views() WHERE {where.format(col='view_name')} AND NOT internal")
    row = cur.fetchone()
    return row[0] if row else None


def _build_name(model: Model, project: Project) -> str:
    name = f"{BUILD_PREFIX}{model.name}_{secrets.token_hex(4)}"
    return (f"{project.schema}." if project.schema else "") + f'"{name}"'


def _swap_in(cur, model: Model, create: Callable[[], None]) -> None:
    """Drop the model's old relation and ``create`` the new one in one transaction (rolled back on error)."""
    cur.execute("BEGIN TRANSACTION")
    try:
        kind = _relation_kind(cur, model.relation)
        if kind is not None:
            cur.execute(f"DROP {kind.upper()} {model.relation}")
        create()
        cur.execute("COMMIT")
    except BaseException:
        try:
            cur.execute("ROLLBACK")
        except E.Error:
            pass
        raise


def _swap_table(cur, model: Model, build: str) -> None:
    _swap_in(cur, model, lambda: cur.execute(f'ALTER TABLE {build} RENAME TO "{model.name}"'))


def _swap_parquet(cur, project: Project, model: Model, write: Callable[[str], None]) -> None:
    """Write the model's Parquet file through a temporary file, then point the model's view at it."""
    path = _parquet_path(project, model)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        write(_sql_string(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _swap_in(cur, model, lambda: cur.execute(
        f"CREATE VIEW {model.relation} AS SELECT * FROM read_parquet({_sql_string(path)})"))


def _count(cur, relation: str) -> int:
    cur.execute(f"SELECT count(*) FROM {relation}")
    return int(cur.fetchone()[0])


class _Statement(Exception):
    """An error of the model's own statement, executed with ``prefix`` before the model's SQL."""

    def __init__(self, err: BaseException, prefix: str):
        super().__init__(str(err))
        self.err, self.prefix = err, prefix


def _run_model_statement(cur, prefix: str, sql: str, suffix: str = "") -> None:
    try:
        cur.execute(prefix + sql + suffix)
    except E.Error as err:
        raise _Statement(err, prefix) from None


def _materialise_sql(project: Project, con, model: Model) -> int | None:
    """Build a plain SQL model with DuckDB (through matchrec); the rows it holds (None for a view)."""
    cur = con.cursor()
    try:
        if model.materialized == "view":
            _swap_in(cur, model, lambda: _run_model_statement(cur, f"CREATE VIEW {model.relation} AS ", model.sql))
            return None
        if model.materialized == "parquet":
            _swap_parquet(cur, project, model, lambda file: _run_model_statement(
                cur, "COPY (", model.sql, f"\n) TO {file} (FORMAT parquet)"))
            return _count(cur, model.relation)
        build = _build_name(model, project)
        try:
            _run_model_statement(cur, f"CREATE TABLE {build} AS ", model.sql)
            rows = _count(cur, build)
            _swap_table(cur, model, build)
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {build}")
        return rows
    finally:
        cur.close()


def _materialise_arrow(project: Project, con, model: Model, table) -> None:
    """Store a pattern model's Arrow result as its table or Parquet file."""
    name = f"__matchrec_result_{secrets.token_hex(6)}"
    con.register(name, table)
    cur = con.cursor()
    try:
        if model.materialized == "parquet":
            _swap_parquet(cur, project, model, lambda file: cur.execute(
                f"COPY (SELECT * FROM {name}) TO {file} (FORMAT parquet)"))
            return
        build = _build_name(model, project)
        try:
            cur.execute(f"CREATE TABLE {build} AS SELECT * FROM {name}")
            _swap_table(cur, model, build)
        finally:
            cur.execute(f"DROP TABLE IF EXISTS {build}")
    finally:
        cur.close()
        con.unregister(name)


def _parquet_path(project: Project, model: Model) -> Path:
    project.target.mkdir(parents=True, exist_ok=True)
    return (project.target / f"{model.name}.parquet").resolve()


def _sql_string(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


# ---------------------------------------------------------------- errors, mapped to the model file
_DUCK_LINE = re.compile(r"\n[ \t]*LINE (\d+): ?(.*)\n([ \t]*)(\^+)")


def _message(model: Model, err: BaseException) -> str:
    """The text of ``err`` as an error of ``model``, with its position in the model file where known."""
    if not isinstance(err, _Statement):  # outside the model's own statement: no position to map
        return str(model.run_error(_plain(err), cls=_class(err)))
    err, prefix = err.err, err.prefix
    offset = _statement_offset(err, prefix + model.sql)
    problem = getattr(err, "problem", None) or strip_location(str(err))
    if offset is None or model.origin is None:
        return str(model.run_error(problem, cls=_class(err)))
    at = model.origin.map(max(0, min(offset - len(prefix), len(model.sql))))
    return str(model.run_error(problem, at, cls=_class(err)))


def _class(err: BaseException) -> type[E.Error]:
    if isinstance(err, E.Error):
        return type(err)
    if isinstance(err, duckdb.Error):
        return type(map_duckdb_error(err))
    if isinstance(err, OSError):
        return E.OperationalError
    return E.InternalError


def _plain(err: BaseException) -> str:
    text = str(err)
    return text if isinstance(err, E.Error) else f"{type(err).__name__}: {text}"


def _statement_offset(err: BaseException, statement: str) -> int | None:
    """Where in the executed ``statement`` the error points: matchrec's offset, or DuckDB's LINE/caret."""
    position = getattr(err, "position", None)
    if isinstance(position, int):
        return position
    m = _DUCK_LINE.search(getattr(err, "duckdb_message", None) or str(err))
    if not m:
        return None
    line_no, excerpt = int(m.group(1)), m.group(2)
    lines = statement.split("\n")
    if not 1 <= line_no <= len(lines):
        return None
    line_start = sum(len(x) + 1 for x in lines[:line_no - 1])
    line = lines[line_no - 1]
    caret = len(m.group(3)) - len(f"LINE {line_no}: ")  # the caret's column in the excerpt
    shown = excerpt
    if shown.startswith("..."):
        shown, caret = shown[3:], caret - 3
    if shown.endswith("..."):
        shown = shown[:-3]
    found = line.find(shown) if shown else 0
    if found < 0:
        return line_start
    return line_start + found + max(0, caret)


def format_errors(result: RunResult) -> list[str]:
    """One message per failed model (already naming the model's file and position)."""
    return [r.error for r in result.results if r.status == "ERROR" and r.error]


def summary_rows(result: RunResult) -> list[tuple]:
    rows = []
    for r in result.results:
        rows.append((r.name, r.status, r.materialized, "" if r.rows is None else f"{r.rows:,}",
                     "" if r.matches is None else f"{r.matches:,}", f"{r.seconds:.2f}",
                     f"#{r.shared_pass}" if r.shared_pass else "", r.note))
    return rows


SUMMARY_COLUMNS = ["model", "status", "materialized", "rows", "matches", "seconds", "pass", "note"]

