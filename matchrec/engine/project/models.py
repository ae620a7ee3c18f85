"""The loaded project: its models, relation names and the errors that point into a model's file."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from matchrec import errors as E
from matchrec.parser.source import Origin

PROJECT_FILE = "matchrec_project.toml"
MATERIALIZATIONS = ("table", "view", "parquet")
BUILD_PREFIX = "__matchrec_build_"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RELATION = re.compile(r'(?:"[^"]+"|[A-Za-z_][\w$]*)(?:\s*\.\s*(?:"[^"]+"|[A-Za-z_][\w$]*))*')


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
