"""A run: models in dependency order over worker threads, ready pattern models over one relation shared
in one ``run_many`` pass (each alone when the pass fails), results and progress events."""
from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass
from typing import Callable

from matchrec import errors as E
from matchrec.engine.multi import run_many
from matchrec.engine.project.materialize import _materialise_arrow, _materialise_sql, _Statement
from matchrec.engine.project.models import BUILD_PREFIX, Model, Project
from matchrec.engine.project.report import _message


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
                progress: Progress | None = None, connect: Callable | None = None) -> RunResult:
    """Build the models ``keys`` (default: all) of ``project`` in the matchrec connection ``con``.

    With ``threads`` > 1, ``connect`` opens each further worker's connection: it is given a new
    cursor of ``con``'s DuckDB database and returns a matchrec connection on it (``matchrec.connect``
    does). The caller passes it, so that the engine does not reach back up to the package's front door.
    """
    if threads < 1:
        raise E.ProgrammingError("threads must be at least 1")
    if threads > 1 and connect is None:
        raise E.ProgrammingError("a run with threads > 1 needs connect, which opens each worker's connection")
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
    workers = [con]
    try:
        for _ in range(max(1, min(threads, len(keys))) - 1):
            workers.append(connect(con.duckdb_connection.cursor()))
            _check_worker(con, workers[-1])
    except BaseException:
        for worker in workers[1:]:
            duck = worker.duckdb_connection
            worker.close()
            duck.close()
        raise
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


def _check_worker(con, worker) -> None:
    """A worker of a compute-node connection reads the same storage nodes: the tables of the nodes
    are relations only on connections attached to them."""
    mine, theirs = getattr(con, "session", None), getattr(worker, "session", None)
    nodes = getattr(getattr(mine, "remote", None), "nodes", None)
    if not nodes:
        return
    other = getattr(getattr(theirs, "remote", None), "nodes", None) or []
    if sorted(n.uri for n in other) != sorted(n.uri for n in nodes):
        raise E.ProgrammingError("the connection reads storage nodes: connect must open each worker's connection on "
                                 "the same nodes, e.g. lambda duck: matchrec.connect(duck, storage_nodes=[...])")


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
    shared = None
    tables: dict[str, object] = {}
    failed: dict[str, str] = {}
    seconds: dict[str, float] = {}
    names = [m.name for m in models]
    source = models[0].pattern_source or ""
    t0 = time.perf_counter()
    try:
        many = run_many(con, [m.sql for m in models])
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
