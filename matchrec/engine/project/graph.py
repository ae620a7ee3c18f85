"""The dependency graph of a project's models: order, cycles, ancestors and descendants, and the
selection language (``name``, ``tag:x``, ``path:dir``, ``+`` before/after, unions and intersections)."""
from __future__ import annotations

import fnmatch
import heapq
import re

from matchrec import errors as E
from matchrec.engine.project.models import Project


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
