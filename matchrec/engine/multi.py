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
    condition reads it and none of its candidates share a key (``countable``); the other queries
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
import pyarrow.compute as pc

from matchrec import budget as work
from matchrec.engine import cer as E
from matchrec.engine import interrupts
from matchrec.errors import Error, check_text
from matchrec.operators import cer_shared as O
from matchrec.operators.cer_reference import Events, Pattern, alternatives
from matchrec.parser import sase as S
from matchrec.planner import cer as P
from matchrec.planner import sharing as SH
from matchrec.planner.cer_vector import VectorColumns, compile_condition

__all__ = ["ManyResult", "run_many", "evaluate_read"]

SLICE_EVENTS = 20_000  # events per slice of the stream: rates re-estimated, plan searched again on a drift
REPLAN_SHARE = 0.25  # a re-plan's budget, as a share of the group's (all re-plans: at most the budget)
SECONDS_PER_COST = 2.5e-8  # evaluation seconds per unit of estimated plan cost (measured on bench.multi)
SEARCH_SHARE = 0.2  # the plan search takes at most this share of the start plan's expected evaluation time
SEARCH_MIN = 0.02  # ... but at least this many seconds (within the caller's budget)
DRIFT_MIN_EVENTS = 20  # a class with fewer candidates in both the slice and the plan's rates never drifts
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
    # threads sharing the connection wait until the whole run is done (``claim``).
    with getattr(con, "session", con).claim() as session, \
            interrupts.forwarding(session.duck), \
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


# ---------------------------------------------------------------- one statement of a group
@dataclass
class _Item:
    index: int
    sql: str
    query: S.CerQuery
    plan: P.CerPlan
    shared: bool = False
    why: str = ""
    count: int = 0
    matches: list | None = None
    units: list = field(default_factory=list)  # indexes of its units in the group


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
                      "nodes": 0, "partial_matches": 0, "candidates": 0}
        self._schemas: dict = {}
        self._count_schema: pa.Schema | None = None
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
            if session.remote is not None or session.cer_settings.mechanism != "auto" or \
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
            item = _Item(i, statements[i], q, plan)
            key = (q.source.lower(), plan.type_column, plan.key_column, plan.key_sql, plan.partition_column,
                   plan.rowid) if self.share else (i,)
            groups.setdefault(key, []).append(item)
        total_units = sum(max(1, len(g)) for g in groups.values())
        for items in groups.values():
            budget = self.budget * len(items) / total_units if self.reorder or self.share else 0.0
            _Group(self, items, budget).run()
            for item in items:
                tables[item.index] = self.result(item)
                self.grouped.add(item.index)

    def result(self, item: _Item) -> pa.Table:
        if item.query.returns == "count":
            table = pa.table({"count": pa.array([item.count], pa.int64())})
            # Every count comes back from DuckDB with the same schema: learn it once and build the
            # other tables with it (a round trip per statement cost about a millisecond).
            if self._count_schema is None:
                self._count_schema = self._through_duckdb(table).schema
            return pa.Table.from_arrays([table.column(0)], schema=self._count_schema)
        return self._through_duckdb(E.build_result(item.plan, self.table_of[id(item)], item.matches))

    def _through_duckdb(self, table: pa.Table) -> pa.Table:
        """``table`` as DuckDB returns it to a cursor (types and values as a statement run alone gets)."""
        name = f"__matchrec_many_{secrets.token_hex(6)}"
        self.con.register(name, table)
        try:
            return self.alone(f"SELECT * FROM {name}")
        finally:
            self.con.unregister(name)


class _Group:
    """Statements over one source: one read, the shared operator for the patterns it evaluates,
    the usual mechanisms for the others."""

    def __init__(self, run: _Run, items: list, budget: float):
        self.run_, self.items, self.budget = run, items, budget
        self.duck, self.settings = run.duck_and_settings()
        self.lines: list = []
        self.filtering = ""  # what filtering before matching did, for the report

    def run(self) -> None:
        # one group is one statement's work for the step and memory budget (the connection's settings)
        with work.statement(getattr(self.run_.con, "settings", None)):
            self._run()

    def _run(self) -> None:
        r = self.run_
        r.stats["groups"] += 1
        t0 = time.perf_counter()
        table = self.read()
        r.stats["read_seconds"] += time.perf_counter() - t0
        r.stats["events_read"] += len(table)
        for item in self.items:
            r.table_of[id(item)] = table
        p0 = self.items[0].plan
        src = f"source {p0.query.source}: key {p0.key_column}"
        if p0.type_column:
            src += f", type {p0.type_column}"
        if p0.partition_column:
            src += f", partition by {p0.partition_column}"
        head = (f"group {r.stats['groups']}: {src}; statements {_list(i.index for i in self.items)}; "
                f"{len(table):,} events read once in {time.perf_counter() - t0:.3f} s (filtering before matching: "
                f"{self.filtering})")
        self.lines.append(head)
        t1 = time.perf_counter()
        self.prepare(table)
        self.evaluate_alone()
        self.evaluate_shared()
        r.stats["match_seconds"] += time.perf_counter() - t1
        r.report.extend(self.lines)

    # ------------------------------------------------------------ reading
    def read(self) -> pa.Table:
        plans = [i.plan for i in self.items]
        p0 = plans[0]
        wanted: set = set()
        for plan in plans:
            wanted.update(E.needed_columns(plan))
        cols = [P.quote(name) for name, _ in p0.columns.values() if name in wanted]
        cols.append(f"{p0.type_sql or 'CAST(NULL AS VARCHAR)'} AS __type")
        cols.append(f"{p0.key_sql} AS __key")
        if p0.partition_column:
            cols.append(f"{P.quote(p0.partition_column)} AS __part")
        if p0.rowid:
            cols.append("rowid AS __rid")
        self.filter_cols: dict = {}
        for plan in plans:
            for sql in plan.filter_sql.values():
                self.filter_cols.setdefault(sql, f"__g{len(self.filter_cols)}")
        cols += [f"{sql} AS {name}" for sql, name in self.filter_cols.items()]
        where = [f"{p0.key_sql} IS NOT NULL"]
        test = P.rows_test(plans)
        if test is not None:
            where.append(f"({test})")
        body = f"SELECT {', '.join(cols)} FROM {p0.query.source} WHERE {' AND '.join(where)}"
        order = (["__part NULLS LAST"] if p0.partition_column else []) + ["__key"] + (["__rid"] if p0.rowid else [])
        pid = ", dense_rank() OVER (ORDER BY __part NULLS LAST) - 1 AS __pid" if p0.partition_column else ""
        registered = self.intervals(plans)
        try:
            if registered is not None:
                body = E.filter_join(body, registered, bool(p0.partition_column))
            return self.duck.sql(f"SELECT *{pid} FROM ({body}) ORDER BY {', '.join(order)}").to_arrow_table()
        finally:
            if registered is not None:
                self.duck.unregister(registered)

    def intervals(self, plans: list) -> str | None:
        """Filtering before matching for the whole group: when every statement has a WITHIN and the
        windows around the candidates of their anchors (per alternative, the element with the fewest
        candidates: every match binds one) cover little of the key range, register those intervals
        (``engine.cer.register_intervals``) and return the name, else None. Every event of a match,
        and every event a negation or strict contiguity looks at, lies within its statement's window
        of the match's anchor event, so the other rows cannot change any result."""
        mode = self.settings.filtering
        if mode == "never":
            self.filtering = "off (SET matchrec_cer_filtering = never)"
            return None
        if any(p.window >= P.NO_WINDOW for p in plans):
            self.filtering = "off: a statement without WITHIN may match any event"
            return None
        p0 = plans[0]
        # candidates per element: one scan grouped by type, each distinct filter counted per type
        filters = list(dict.fromkeys(f for p in plans for f in p.filter_sql.values()))
        rows = self.duck.execute(
            f"SELECT {p0.type_sql or 'NULL'}, min({p0.key_sql}), max({p0.key_sql}), count(*)"
            + "".join(f", count(*) FILTER (WHERE {f})" for f in filters)
            + f" FROM {p0.query.source} WHERE {p0.key_sql} IS NOT NULL GROUP BY 1").fetchall()
        lows = [r[1] for r in rows if r[1] is not None]
        span = int(max(r[2] for r in rows if r[2] is not None) - min(lows)) if lows else 0
        slot = {f: 4 + i for i, f in enumerate(filters)}

        def count(p, v) -> int:
            t, col = p.query.elements[v].type, slot.get(p.filter_sql.get(v), 3)
            return sum(r[col] for r in rows if t is None or r[0] == t)

        anchors, flat = [], 0.0
        for p in plans:
            vars_ = P.anchors_of(p.query, lambda v, p=p: count(p, v))
            anchors.append((" OR ".join(f"({p.element_test(v)})" for v in vars_), p.window))
            flat += P.interval_cover(sum(count(p, v) for v in vars_), p.window, span)
        if mode != "always":
            cover, what = P.anchor_cover(self.duck, p0.query.source, p0.key_sql, p0.partition_column, anchors,
                                         min(flat, 1.0))
            if cover > P.FILTER_COVER:
                self.filtering = f"off: the anchors' intervals would cover about {cover:.0%} of the {what}"
                return None
        name, found, n = E.register_intervals(self.duck, p0.query.source, p0.key_sql, p0.partition_column, anchors)
        self.filtering = (f"{n:,} intervals around {found:,} anchor candidates" +
                          (" (forced by SET matchrec_cer_filtering = always)" if mode == "always" else ""))
        return name

    # ------------------------------------------------------------ classes, conditions, units
    def prepare(self, table: pa.Table) -> None:
        self.table = table
        n = len(table)
        self.key = table.column("__key").to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
        p0 = self.items[0].plan
        self.pid = table.column("__pid").to_numpy().astype(np.int64) if p0.partition_column and n else None
        self.types = table.column("__type")
        self.codes, self.code_of = self.type_codes(self.types)
        self.classes: dict = {}  # (type, filter sql) -> id
        self.masks: list = []
        self.class_labels: list = []
        vcols = VectorColumns(table)
        converted: dict = {}  # columns converted once for every statement's conditions
        for item in self.items:
            q, plan = item.query, item.plan
            item.class_of = {v: self.class_id(e.type, plan.filter_sql.get(v)) for v, e in q.elements.items()}
            item.py_conds = P.compile_conditions(plan, table, converted)
            kleene = {v for v, e in q.elements.items() if e.kleene}
            res = P._Resolver(q, plan.columns)
            item.conds = []
            item.templates = []
            for expr, c in zip(q.conditions, item.py_conds):
                vec = compile_condition(expr, res.col, vcols, kleene)
                item.conds.append(O.Cond(c.vars, c.fn, vec, c.text))
                item.templates.append(SH.condition_template(expr, res.col))
            if q.strategy != "any":
                item.why = f"{S.STRATEGY_NAMES[q.strategy]} decides each event as it arrives"
            elif any(q.elements[v].kleene for v in q.positive):
                item.why = self.countable(item)
                item.shared = not item.why
            else:
                item.shared = True

    def countable(self, item: _Item) -> str:
        """'' when the shared operator can count the pattern's Kleene closures (``cer_shared.Kleene``),
        else why not."""
        q = item.query
        if q.returns != "count":
            return "Kleene closure (matches returned)"
        chains = alternatives(q.root)
        if len(chains) != 1:
            return "Kleene closure in OR / AND"
        chain = chains[0]
        kvars = {e.var for e in chain if e.kleene is not None}
        for i, e in enumerate(chain):
            if e.kleene is None:
                continue
            near = [chain[j] for j in (i - 1, i + 1) if 0 <= j < len(chain)]
            if len(near) < 2 or any(x.negated or x.kleene is not None for x in near):
                return "Kleene closure not between two single events"
        if any(c.vars & kvars for c in item.conds):
            return "Kleene closure read by a condition"
        for v in kvars:
            rows = np.flatnonzero(self.masks[item.class_of[v]])
            same = self.key[rows][1:] == self.key[rows][:-1]
            if self.pid is not None:
                same &= self.pid[rows][1:] == self.pid[rows][:-1]
            if same.any():
                return "Kleene closure over events with equal keys"
        return ""

    def class_id(self, type_, filter_sql) -> int:
        k = (type_, filter_sql)
        got = self.classes.get(k)
        if got is not None:
            return got
        n = len(self.table)
        if type_ is None:
            m = np.ones(n, bool)
        else:
            m = self.codes == self.code_of[type_] if type_ in self.code_of else np.zeros(n, bool)
        label = type_ if type_ is not None else "*"
        if filter_sql is not None:
            name = self.filter_cols[filter_sql]
            if n:
                f = self.table.column(name)
                m = m & np.asarray(f.fill_null(False).to_numpy(zero_copy_only=False), bool)
            label += f"[{filter_sql}]"
        got = self.classes[k] = len(self.masks)
        self.masks.append(m)
        self.class_labels.append(label)
        return got

    @staticmethod
    def type_codes(types) -> tuple[np.ndarray, dict]:
        """Each row's type as an integer code (-1: NULL) and the code of each type: one pass over the
        type column instead of one comparison of every row per class."""
        if not len(types):
            return np.zeros(0, np.int64), {}
        enc = pc.dictionary_encode(types.combine_chunks())
        codes = np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
        return codes, {t: i for i, t in enumerate(enc.dictionary.to_pylist())}

    # ------------------------------------------------------------ patterns evaluated alone
    def evaluate_alone(self) -> None:
        rest = [i for i in self.items if not i.shared]
        if not rest:
            return
        m = E.mechanisms()
        types = self.types.to_pylist()
        events = Events(self.key, types, self.pid)
        said = []
        for item in rest:
            q, plan = item.query, item.plan
            filters = {v: self.masks[c] for v, c in item.class_of.items() if plan.filter_sql.get(v) is not None}
            pattern = Pattern(q.root, plan.window, q.strategy, filters, item.py_conds)
            kleene = any(q.elements[v].kleene for v in q.positive)
            name = ("rcep" if kleene else "chain") if q.strategy == "any" else "eager"
            if m.supports(name, pattern):
                name = "eager"
            limit = self.settings.max_partial_matches
            if q.returns == "count":
                item.count = m.count(name, pattern, events, max_partial=limit) if len(events) else 0
            else:
                item.matches = m.run(name, pattern, events, max_matches=self.settings.max_matches,
                                     max_partial=limit) if len(events) else []
                if len(item.matches) > self.settings.max_matches:
                    raise O.too_many(self.settings.max_matches)
                item.count = len(item.matches)
            said.append(f"{item.index} ({item.why}: {name})")
        self.lines.append(f"  evaluated one by one over the shared read: statements {', '.join(said)}")

    # ------------------------------------------------------------ the shared operator
    def evaluate_shared(self) -> None:
        items = [i for i in self.items if i.shared]
        if not items:
            return
        r = self.run_
        units, models, sinks = [], [], []
        for k, item in enumerate(items):
            self.units_of(item, k, units, models)
            varsets = [frozenset(units[u].vars) for u in item.units]
            shared = {v for v in varsets if varsets.count(v) > 1}
            sinks.append(O.PatternSink(item.query.returns == "count", self.settings.max_matches, shared))
        if not units:
            for item in items:
                item.count, item.matches = 0, ([] if item.query.returns != "count" else None)
            return
        wmax = max(u.window for u in units)
        try:
            stream = O.Stream(self.key, self.pid, self.masks, wmax)
        except O.Unshareable as err:
            for item in items:
                item.shared, item.why = False, str(err)
            self.evaluate_alone()
            return
        for m in models:
            m.window = stream.clamp(m.window)
        self.estimate(stream, units, models)
        work = SH.Workload(models)
        slices = stream.slices(r.slice_events)
        r.stats["slices"] += len(slices)
        first = slices[0] if slices else (0, 0, 0, 1)
        rates = self.rates(stream, first)
        scale = stream.n / max(1, first[1] - first[0])  # the model costs one slice; the stream has this many
        model = SH.CostModel(work, rates)
        start = SH.start_plan(work, model, share=r.share, reorder=r.reorder)
        plan, info = SH.optimise(work, model, start, share=r.share, reorder=r.reorder,
                                 budget=self.search_budget(model.cost(start) * scale, self.budget),
                                 seconds_per_cost=SECONDS_PER_COST * scale)
        r.stats["optimiser_seconds"] += info.seconds
        r.stats["start_cost"] += info.start_cost
        r.stats["cost"] += info.cost
        roots = SH.build_nodes(work, plan, units, self.class_labels)
        self.describe(items, units, work, plan, info, roots, slices)
        ev = O.Evaluator(stream, units, sinks)
        replans = skipped = kept = 0
        plan_rates, planned_at = rates, 0
        size = len(list(SH.walk(roots)))
        allowance = self.budget  # the re-plans together take at most the budget once more
        pending = None  # consecutive slices under one plan run as one range (fewer, larger batch steps)
        for n, sl in enumerate(slices):
            if n and r.reorder:
                now = self.rates(stream, sl)
                if self.drifted(now, plan_rates, units):
                    if allowance <= 0:
                        skipped += 1
                    else:
                        t_plan = time.perf_counter()
                        model = SH.CostModel(work, now)
                        greedy = SH.start_plan(work, model, share=r.share, reorder=True)
                        held, other = model.cost(plan), model.cost(greedy)
                        begin, found_cost = (plan, held) if held <= other else (greedy, other)
                        # A re-plan is expected to hold as long as the plan before it did (rates that
                        # drifted once drift again), so its search is worth that many slices' evaluation,
                        # not the rest of the stream's.
                        ahead = min(n - planned_at, len(slices) - n)
                        worth = SEARCH_SHARE * found_cost * ahead * SECONDS_PER_COST
                        found = begin
                        if worth >= SEARCH_MIN:  # else no search: the cheaper of the plan and the greedy one
                            left = min(worth, allowance, self.budget * REPLAN_SHARE)
                            found, info2 = SH.optimise(work, model, begin, share=r.share, reorder=True, budget=left,
                                                       seed=n, seconds_per_cost=SECONDS_PER_COST * ahead)
                            found_cost = info2.cost
                        spent = time.perf_counter() - t_plan  # the whole decision, not only the search
                        allowance -= spent
                        r.stats["optimiser_seconds"] += spent
                        plan_rates, planned_at = now, n
                        # A new plan ends the range evaluated so far: every node then runs once more.
                        # It is taken only when it saves more than that over the slices it should hold.
                        if (held - found_cost) * ahead > SH.NODE_COST * size:
                            if pending is not None:
                                ev.run(roots, *pending)
                                pending = None
                            plan = found
                            roots = SH.build_nodes(work, plan, units, self.class_labels)
                            size = len(list(SH.walk(roots)))
                            replans += 1
                        else:
                            kept += 1
            pending = (pending[0], sl[3]) if pending is not None else (sl[2], sl[3])
        if pending is not None:
            ev.run(roots, *pending)
        r.stats["replans"] += replans
        if len(slices) > 1:
            more = [f"{kept} searches after a drift kept the plan (too little to gain)"] if kept else []
            more += [f"{skipped} more drifts after the re-planning budget was spent"] if skipped else []
            self.lines.append(f"  {len(slices)} slices of about {r.slice_events:,} events; re-plans after a rate "
                              f"drift: {replans}" + (f" ({'; '.join(more)})" if more else ""))
        w = ev.work
        r.stats["partial_matches"] += w["partial_matches"]
        r.stats["candidates"] += w["candidates"]
        self.lines.append(f"  evaluation: {w['partial_matches']:,} partial matches, {w['searches']:,} searches, "
                          f"{w['candidates']:,} candidates examined, {w['matches']:,} unit matches")
        for item, sink in zip(items, sinks):
            item.count, item.matches = sink.finish()

    @staticmethod
    def search_budget(cost: float, budget: float) -> float:
        """Seconds the plan search may take: ``SEARCH_SHARE`` of the time the plan it starts from is
        expected to take (its estimated cost at ``SECONDS_PER_COST``), at least ``SEARCH_MIN`` and at
        most ``budget``. A search can at best remove what the evaluation costs, so on a short stream
        a long search loses more than it wins."""
        return min(budget, max(SEARCH_MIN, SEARCH_SHARE * cost * SECONDS_PER_COST))

    def units_of(self, item: _Item, k: int, units: list, models: list) -> None:
        q, plan = item.query, item.plan
        chains = alternatives(q.root)
        for alt, chain in enumerate(chains):
            pos = [e for e in chain if not e.negated and e.kleene is None]
            if not pos:
                continue
            names = [e.var for e in pos]
            varset = set(names)
            at = {v: i for i, v in enumerate(names)}
            conds, cmodels = [], []
            for c, t in zip(item.conds, item.templates):
                if c.vars <= varset:
                    conds.append(c)
                    cmodels.append(SH.CondModel(frozenset(at[v] for v in c.vars),
                                                tuple(("var", at[p[1]]) if not isinstance(p, str) else p for p in t)))
            negs, kleene = [], []
            for i, e in enumerate(chain):
                if e.kleene is not None:  # counted: its neighbours are single events (``countable``)
                    kleene.append(O.Kleene(item.class_of[e.var], at[chain[i - 1].var], at[chain[i + 1].var],
                                           e.kleene[0], e.kleene[1]))
                if not e.negated:
                    continue
                before = [at[x.var] for x in chain[:i] if not x.negated and x.kleene is None]
                after = [at[x.var] for x in chain[i + 1:] if not x.negated and x.kleene is None]
                linked = [c for c in item.conds if e.var in c.vars and c.vars <= varset | {e.var}]
                negs.append(O.Neg(item.class_of[e.var], e.var, before[-1] if before else None,
                                  after[0] if after else None, linked))
            label = f"statement {item.index}" + (f" alternative {alt + 1}" if len(chains) > 1 else "")
            item.units.append(len(units))
            units.append(O.Unit(k, names, [item.class_of[v] for v in names], conds, negs, plan.window, label, kleene))
            models.append(SH.UnitModel([item.class_of[v] for v in names], cmodels, plan.window, label))

    def estimate(self, stream: O.Stream, units: list, models: list) -> None:
        """Condition selectivities on bindings drawn around a sample of the stream's events."""
        rng = np.random.default_rng(7)
        n = stream.n
        sample = np.sort(rng.choice(n, min(n, P.SAMPLE_ROWS), replace=False)) if n else np.zeros(0, np.int64)
        cache: dict = {}
        pools: dict = {}  # class -> its candidates among the sample, found once
        for unit, model in zip(units, models):
            for c, cm in zip(unit.conds, model.conds):
                names = {p: f"{model.classes[p]}:{i}" for i, p in enumerate(sorted(cm.vars))}
                key = (SH.render(cm.template, names), unit.window)
                sel = cache.get(key)
                if sel is None:
                    classes = {v: unit.classes[unit.vars.index(v)] for v in c.vars}
                    sel = cache[key] = SH.estimate_selectivity(stream, c, classes, unit.window, rng, sample,
                                                               P.SAMPLE_TRIALS, pools)
                cm.sel = sel

    @staticmethod
    def rates(stream: O.Stream, sl) -> SH.Rates:
        q0, q1, lo, hi = sl
        span = float(stream.real[q1 - 1] - stream.real[q0] + 1) if q1 > q0 else 1.0
        return SH.Rates(stream.counts(lo, hi), span)

    @staticmethod
    def drifted(now: SH.Rates, then: SH.Rates, units: list) -> bool:
        used = {c for u in units for c in u.classes}
        for c in used:
            a, b = now.counts[c], then.counts[c]
            if max(a, b) < DRIFT_MIN_EVENTS:
                continue
            ra, rb = (a + 0.5) / now.span, (b + 0.5) / then.span
            if max(ra, rb) > P.RATE_CHANGE * min(ra, rb):
                return True
        return False

    def describe(self, items, units, work, plan, info, roots, slices) -> None:
        r = self.run_
        lines = self.lines
        lines.append(f"  shared operator: {len(items)} pattern(s) as {len(units)} unit(s) (alternatives), "
                     f"{len(self.masks)} element class(es)")
        if info.details:
            how = "; ".join(f"{m} {c:,.0f} in {s} moves" for m, c, s in info.details)
            lines.append(f"  plan: estimated cost {info.start_cost:,.0f} -> {info.cost:,.0f} (start: "
                         f"{'greedy lazy orders' if r.reorder else 'written orders'}); optimiser {info.seconds:.3f} s "
                         f"of {info.budget:.3f} s allowed ({how}; a search may take {SEARCH_SHARE:.0%} of the start "
                         f"plan's expected evaluation time, at most the budget)")
        else:
            lines.append(f"  plan: estimated cost {info.cost:,.0f} ({'greedy lazy' if r.reorder else 'written'} "
                         f"orders, {'sharing every common prefix' if r.share else 'no sharing'}; no search)")
        for u, unit in enumerate(units):
            order = " > ".join(unit.vars[p] for p in plan.orders[u])
            counted = "".join(f"; Kleene closure counted between {unit.vars[k.prev]} and {unit.vars[k.next]}"
                              for k in unit.kleene)
            lines.append(f"    {unit.label}: order {order}{counted}")
        nodes = list(SH.walk(roots))
        shared = [n for n in nodes if len({units[u].pattern for u in n.users}) > 1 or len(n.users) > 1]
        r.stats["nodes"] += len(nodes)
        r.stats["shared_nodes"] += len(shared)
        lines.append(f"  nodes: {len(nodes)} for {sum(len(u.vars) for u in units)} unit steps; shared nodes: "
                     f"{len(shared)}")
        for n in shared[:40]:
            users = _list(sorted({items[units[u].pattern].index for u in n.users}))
            lines.append(f"    [{n.label}] window {n.window}: units {len(n.users)}, statements {users}")
        if len(shared) > 40:
            lines.append(f"    ... {len(shared) - 40} more")


def evaluate_read(duck, settings: P.CerSettings, plan: P.CerPlan, table: pa.Table,
                  budget: float = 1.0) -> tuple[int, list | None, list[str]]:
    """One skip-till-any-match statement over the table the single-statement path read
    (``engine.cer.read_events``: filters as ``__f_<var>`` columns): the shared operator with one
    unit per alternative, without sharing, each unit in its best order alone (the batch mechanism).
    Returns (number of matches, the matches - None when counting - and the report's lines)."""
    run = _Run(None, share=False, reorder=True, budget=budget, slice_events=SLICE_EVENTS, duck=duck,
               settings=settings)
    item = _Item(0, plan.query.text, plan.query, plan)
    group = _Group(run, [item], budget)
    group.filter_cols = {sql: f"__f_{var}" for var, sql in plan.filter_sql.items()}
    group.prepare(table)
    group.evaluate_alone()
    group.evaluate_shared()
    return item.count, item.matches, group.lines


@functools.lru_cache(maxsize=512)
def _parse(sql: str) -> S.CerQuery:
    """Parsed pattern queries, kept: a workload is often run again (the query objects are never changed)."""
    return S.parse(sql)


def _list(xs) -> str:
    return ", ".join(str(x) for x in xs)
