"""Architecture checks: matchrec's import graph has no cycles and its lower layers never import upward.

The graph is built from the source with `ast`, so it sees every import wherever it is written: at module
level, inside functions, and `importlib.import_module("...")` calls with a literal name. A function-local
import cannot dodge the check; a cycle is fixed by moving the shared code down a layer, not by hiding it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "matchrec"
PACKAGE = "matchrec"

# Layers that sit below the user-facing API: they may not reach up into it.
LOWER_LAYERS = ("engine", "planner", "operators", "connectors", "parser")
UPPER_MODULES = ("matchrec.dbapi", "matchrec.shell", "matchrec.cli")


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is named by its `__init__`)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = module_files()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _absolute(module: str, level: int, target: str | None) -> str:
    """Resolves a relative `from .x import y` against the importing module."""
    if level == 0:
        return target or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


class Edge:
    """One import statement: who imports what, where, and whether it sits inside a function."""

    def __init__(self, source: str, target: str, line: int, local: bool, names: tuple[str, ...] = ()):
        self.source, self.target, self.line, self.local, self.names = source, target, line, local, names

    def __repr__(self):
        where = "function-local" if self.local else "module-level"
        return f"{self.source}:{self.line} -> {self.target} ({where})"


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module = module
        self.depth = 0
        self.edges: list[Edge] = []

    def _scoped(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scoped

    def _add(self, target: str, line: int, names: tuple[str, ...] = ()):
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            self.edges.append(Edge(self.module, target, line, self.depth > 0, names))

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        base = _absolute(self.module, node.level, node.module)
        plain = []
        for alias in node.names:
            # `from matchrec.x import y` imports the submodule matchrec.x.y when there is one.
            if f"{base}.{alias.name}" in MODULES:
                self._add(f"{base}.{alias.name}", node.lineno)
            else:
                plain.append(alias.name)
        if plain:
            self._add(base, node.lineno, tuple(plain))

    def visit_Call(self, node: ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if (name == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            self._add(node.args[0].value, node.lineno)
        self.generic_visit(node)


def collect_edges() -> list[Edge]:
    edges = []
    for module, path in MODULES.items():
        collector = _Collector(module)
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        edges.extend(collector.edges)
    return edges


EDGES = collect_edges()


def _graph() -> dict[str, set[str]]:
    """Module → modules it imports. Importing `a.b.c` runs `a/__init__` and `a/b/__init__` too, but
    those package inits are empty here except the top one, whose re-exports are checked separately."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for edge in EDGES:
        if edge.target in MODULES and edge.target != edge.source:
            graph[edge.source].add(edge.target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan), shown as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(node: str):
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(node, iter(sorted(graph[node])))]
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[current] = min(low[current], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[current])
            if low[current] == index[current]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == current:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return [_cycle_path(graph, component) for component in components]


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return list(reversed(path)) + [start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return component


def _edge_text(source: str, target: str) -> str:
    lines = [edge for edge in EDGES if edge.source == source and edge.target == target]
    return ", ".join(f"line {edge.line}{' (local)' if edge.local else ''}" for edge in lines)


def test_graph_is_built_from_the_real_package():
    # Guards the checks below from passing on an empty graph.
    assert "matchrec.engine.executor" in MODULES and "matchrec.dbapi" in MODULES
    assert len(EDGES) > 100


def test_no_import_cycles():
    cycles = find_cycles(_graph())
    report = []
    for cycle in cycles:
        steps = [f"  {a} -> {b}  [{_edge_text(a, b)}]" for a, b in zip(cycle, cycle[1:])]
        report.append(" -> ".join(name.removeprefix("matchrec.") for name in cycle) + "\n" + "\n".join(steps))
    print(f"\n{len(cycles)} import cycle(s) among matchrec modules")
    for text in report:
        print(text)
    assert not cycles, "import cycles:\n" + "\n".join(report)


def _is_lower(module: str) -> bool:
    return any(module == f"{PACKAGE}.{layer}" or module.startswith(f"{PACKAGE}.{layer}.")
               for layer in LOWER_LAYERS)


def upward_imports() -> list[Edge]:
    found = []
    for edge in EDGES:
        if not _is_lower(edge.source):
            continue
        if any(edge.target == upper or edge.target.startswith(upper + ".") for upper in UPPER_MODULES):
            found.append(edge)
        elif edge.target == PACKAGE:
            # `import matchrec` or `from matchrec import connect`: both run the whole public API.
            found.append(edge)
    return found


def test_lower_layers_do_not_import_upward():
    found = upward_imports()
    print(f"\n{len(found)} upward import(s) from engine/planner/operators/connectors/parser")
    for edge in found:
        print(f"  {edge}{' names ' + ', '.join(edge.names) if edge.names else ''}")
    assert not found, "upward imports:\n" + "\n".join(map(repr, found))


def test_report_function_local_imports():
    local = [edge for edge in EDGES if edge.local]
    per_module: dict[str, int] = {}
    for edge in local:
        per_module[edge.source] = per_module.get(edge.source, 0) + 1
    print(f"\n{len(local)} function-local import(s) of matchrec modules")
    for module, count in sorted(per_module.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {count:3d}  {module}")


@pytest.mark.parametrize("source, expected", [
    ("import matchrec.engine.output\n", {"matchrec.engine.output"}),
    ("from matchrec.engine import output\n", {"matchrec.engine.output"}),
    ("def f():\n    from matchrec import dbapi\n", {"matchrec.dbapi"}),
    ("import importlib\nimportlib.import_module('matchrec.shell')\n", {"matchrec.shell"}),
    ("from matchrec import connect\n", {"matchrec"}),
    ("from . import output\n", {"matchrec.engine.output"}),
    ("from ..parser.query import parse\n", {"matchrec.parser.query"}),
])
def test_collector_sees_every_import_form(source, expected):
    collector = _Collector("matchrec.engine.executor")
    collector.visit(ast.parse(source))
    assert {edge.target for edge in collector.edges} == expected


def test_cycle_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
