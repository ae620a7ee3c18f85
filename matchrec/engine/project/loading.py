"""Reading a project folder: the project file, the model files, and the checks that run before any model does."""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from matchrec import errors as E
from matchrec.engine.project.graph import _cycles, _topological_order
from matchrec.engine.project.models import (_IDENT, _RELATION, PROJECT_FILE, Model, Project, ProjectLoadError, _in_file,
                                            _normalise, _relation_name, _reserved_words)
from matchrec.engine.project.templates import _compile_model

_PROJECT_KEYS = {"name": str, "schema": str, "target-path": str, "sources": list}


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
