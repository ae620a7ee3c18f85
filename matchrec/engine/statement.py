"""Execute one SQL statement that may contain MATCH_RECOGNIZE, on a DuckDB connection.

The statement is split (parser.query); each clause's input relation is computed by DuckDB
(with the CTEs it can see), planned, matched, and registered as an Arrow object; then the
statement, with every clause replaced by its registered result, runs in DuckDB. Clauses
nested in other clauses' inputs run first.
"""
from __future__ import annotations

import dataclasses
import re
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from matchrec.connectors.duckdb_source import DuckDBOracle, FallbackEvaluator, own_change, quote_ident, read_batches
from matchrec.engine.errors import map_duckdb_error
from matchrec.engine.executor import Settings, run_plan
from matchrec.engine import reading
from matchrec.engine.clauses import ClauseRun, cte_prefixes, replace_identifiers  # noqa: F401 (also offered here)
from matchrec.engine.window import run_windows
from matchrec.errors import Error, NotSupportedError, ProgrammingError, positioned
from matchrec.parser import parameters
from matchrec.parser.query import Clause, SplitQuery, split
from matchrec.parser.source import Origin, rewrite
from matchrec.parser.spec import Span
from matchrec.parser.translate import catalog_columns, is_trino, translate_statement
from matchrec.planner.plan import build_plan


@dataclass
class Prepared:
    """A statement ready to run in DuckDB, with the Arrow objects it needs registered."""
    sql: str
    registered: list[str] = field(default_factory=list)
    runs: list[ClauseRun] = field(default_factory=list)
    explain: str | None = None  # None, "plain" or "analyze"


_STORED_OBJECT = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\w*\s+)?(VIEW|MACRO|FUNCTION)\b", re.I)


# ------------------------------------------------------------------ SQL helpers
def to_duckdb(sql: str, dialect: str, origin: Origin, source: str, write: str = "duckdb", con=None,
              tables: dict | None = None) -> str:
    """``sql`` of ``dialect`` in DuckDB's SQL (or ``write``'s); errors point into ``source``; ``con``
    (optional): the DuckDB connection whose catalog (and ``tables``: placeholder -> relation) types
    the columns of stored tables."""
    if dialect == write:
        return sql
    try:
        if is_trino(dialect):  # Trino functions and types that sqlglot does not translate by itself
            schema = (lambda: catalog_columns(con, tables)) if con is not None else None
            out = [translate_statement(t, dialect, schema).sql(write) if t is not None else ""
                   for t in sqlglot.parse(sql, read=dialect)]
        else:
            out = sqlglot.transpile(sql, read=dialect, write=write)
    except sqlglot.errors.ParseError as err:
        info = err.errors[0] if err.errors else {}
        lines = sql.split("\n")
        line = max(1, min(info.get("line", 1), len(lines)))
        width = max(1, len(info.get("highlight", "")))
        offset = sum(len(x) + 1 for x in lines[: line - 1]) + info.get("col", 1) - width
        raise positioned(ProgrammingError, f"Syntax error: {info.get('description', 'invalid SQL')}", source,
                         origin.map(max(0, offset))) from None
    except sqlglot.errors.SqlglotError as err:
        raise ProgrammingError(f"Cannot translate the query from {dialect}: {err}") from None
    if len(out) != 1:
        raise ProgrammingError("Expected exactly one statement")
    return out[0]


# ------------------------------------------------------------------ running clauses
def remote_tables_in(sql: str, names) -> set[str]:
    """Tables of ``names`` that ``sql`` (DuckDB SQL) reads by their bare name."""
    try:
        trees = sqlglot.parse(sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return {n for n in names if n in sql}  # could not tell: assume every mentioned table is read
    found = set()
    for tree in trees:
        if tree is None:
            continue
        ctes = {c.alias for c in tree.find_all(exp.CTE)}
        for t in tree.find_all(exp.Table):
            if not t.args.get("db") and t.name in names and t.name not in ctes:
                found.add(t.name)
    return found


# Plans of recent clauses, kept with the catalog answers they rest on (dropped with them when the
# catalog changes): a statement run again skips the analysis and the physical planning (a few ms).
_PLANS: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_KEPT_PLANS_MAX = 64
_PLANS_LOCK = threading.Lock()


def _kept_plans(oracle: DuckDBOracle) -> dict | None:
    try:
        with _PLANS_LOCK:
            return _PLANS.setdefault(oracle.kept, {})
    except TypeError:  # answers that cannot be referenced weakly are not kept either
        return None


def _catalog_only(oracle: DuckDBOracle) -> bool:
    """Whether every answer the planning used holds while the catalog does (not the value of a
    subquery, nor the type of an expression reading a relation)."""
    return all(sql in oracle.kept.types for sql in oracle._types) and \
        all(sql in oracle.kept.constants for sql in oracle._constants)


class StatementRunner:
    def __init__(self, con: duckdb.DuckDBPyConnection, settings: Settings, dialect: str, remote=None,
                 materialized: set | None = None):
        self.con = con
        self.settings = settings
        self.dialect = dialect
        self.remote = remote  # connectors.remote.RemoteStore of a compute node, else None
        self.materialized = materialized if materialized is not None else set()

    def materialize(self, sql: str) -> None:
        """Pull whole every storage-node table ``sql`` reads other than as a MATCH_RECOGNIZE input."""
        if self.remote is None:
            return
        from matchrec.connectors.remote import PullStats
        for name in sorted(remote_tables_in(sql, self.remote.schemas) - self.materialized):
            self.con.register(name, self.remote.pull_all(name, PullStats()))
            self.materialized.add(name)

    def prepare(self, statement) -> Prepared:
        """Run every MATCH_RECOGNIZE of ``statement`` (a ``parser.classify.Statement`` of kind match
        or explain) and return the DuckDB statement that finishes it.

        Parameters never enter text that the dialect's tokenizer reads: placeholders become
        marker identifiers first, and the values replace them only in the parsed expressions
        and in the DuckDB SQL the statement is translated to (see parser.parameters).
        """
        sql, params, explain = statement.text, statement.parameters, statement.explain
        origin = Origin.identity(len(sql))
        tokens = statement.tokens
        if explain is not None:
            stripped, origin = rewrite(sql, [(0, statement.explain_end, "")])
            tokens = None  # they are the tokens of the text with EXPLAIN
        else:
            stripped = sql
        try:
            marked = parameters.mark(stripped, params, self.dialect) if params else None
        except Error as err:
            raise parameters.unmark_error(err, None, origin, sql) from None
        if marked is None or not marked.values:
            return self._prepare(marked.text if marked else stripped, explain, {}, {},
                                 tokens=tokens if marked is None else None)
        nodes = marked.nodes()
        literals = {marker: parameters.duckdb_sql(node) for marker, node in nodes.items()}
        try:
            return self._prepare(marked.text, explain, nodes, literals)
        except duckdb.Error as err:
            raise parameters.unmark_error(map_duckdb_error(err), marked, marked.origin.compose(origin),
                                          sql) from None
        except Error as err:
            raise parameters.unmark_error(err, marked, marked.origin.compose(origin), sql) from None

    def prepare_clause(self, spec, relation: str) -> Prepared:
        """Run one parsed clause (``parser.spec.MatchSpec``) over the relation named ``relation``;
        ``runs[0].view_sql`` is its result. Errors point into ``spec.source``, the clause's text."""
        prepared = Prepared(sql="")
        source = spec.source or ""
        at = spec.span.start
        clause = Clause(f"__matchrec_{secrets.token_hex(4)}_0", relation, Span(at, at), spec, None)
        query = SplitQuery(source=source, dialect=self.dialect, text=clause.placeholder,
                           origin=Origin.identity(len(clause.placeholder)), clauses=[clause])
        self._run_clause(query, clause, {}, {}, prepared, secrets.token_hex(4), dry=False)
        prepared.sql = f"SELECT * FROM {prepared.runs[0].view_sql}"
        return prepared

    def _prepare(self, sql: str, explain: str | None, nodes: dict, literals: dict[str, str],
                 tokens: list | None = None) -> Prepared:
        prepared = Prepared(sql="", explain=explain)
        tag = secrets.token_hex(4)
        # markers left in the DuckDB SQL of inputs and of the outer statement become the values
        done: dict[str, str] = dict(literals)
        # Windows with PATTERN first: MATCH_RECOGNIZE in a window's table runs inside that
        # window's own input, and a window inside a MATCH_RECOGNIZE input is a placeholder there.
        cut = run_windows(self, sql, prepared, done, tag, dry=(explain == "plain"), nodes=nodes, literals=literals)
        if cut is not sql:
            tokens = None
        query = split(cut, self.dialect, tokens)
        source = query.source
        stored = _STORED_OBJECT.match(query.text)
        if stored:
            raise NotSupportedError(
                f"CREATE {stored.group(1).upper()} cannot store a query with MATCH_RECOGNIZE: DuckDB would have to "
                "re-run it without matchrec. Use CREATE TABLE ... AS to keep the result.")
        if nodes:
            for clause in query.clauses:
                clause.spec = parameters.bind_spec(clause.spec, nodes, literals)
        prefixes = cte_prefixes(query)
        for clause in query.clauses:
            # a plan is kept only for a text without parameters: their values are not in the text
            self._run_clause(query, clause, prefixes, done, prepared, tag, dry=(explain == "plain"),
                             keep_plan=not nodes)
        outer = to_duckdb(query.text, self.dialect, query.origin, source, con=self.con, tables=done)
        # the tokens split read last are the outer statement's when it needs no translation
        same = outer is query.text and self.dialect == "duckdb"
        prepared.sql = replace_identifiers(outer, done, query.tokens if same else None)
        if explain != "plain":
            self.materialize(prepared.sql)
        return prepared

    def _run_clause(self, query: SplitQuery, clause: Clause, prefixes, done, prepared: Prepared, tag: str,
                    dry: bool, keep_plan: bool = False) -> None:
        """Plan (or take the plan kept for the same text, input and settings: ``keep_plan``), read,
        match and register one clause."""
        source = query.source
        input_text = f"SELECT * FROM {clause.input_text}"
        input_sql = to_duckdb(input_text, self.dialect, Origin.identity(len(input_text), clause.input_span.start - 14),
                              source, con=self.con)
        input_sql = prefixes.get(clause.placeholder, "") + input_sql
        input_sql = replace_identifiers(input_sql, done)
        bare = None
        if self.remote is not None:
            bare = self.remote.bare_table(clause.input_text) if not prefixes.get(clause.placeholder) else None
            if bare is None and not dry:
                self.materialize(input_sql)
        oracle = DuckDBOracle(self.con)
        try:
            columns = oracle.columns(input_sql)
        except duckdb.Error as err:
            raise map_duckdb_error(err, source, clause.input_span.start,
                                   "The input of MATCH_RECOGNIZE cannot be read") from None
        title = f"MATCH_RECOGNIZE #{len(prepared.runs) + 1}"
        kept = _kept_plans(oracle) if keep_plan and bare is None else None
        key = (query.source, clause.spec.span, input_sql, tuple(columns), self.dialect,
               dataclasses.astuple(self.settings), title)
        if kept is not None and key in kept:
            plan, physical = kept[key]
        else:
            plan = build_plan(clause.spec, columns, oracle)
            pull_name = f"__matchrec_pulled_{tag}_{len(prepared.registered)}" if bare is not None else ""
            physical = reading.plan_clause(plan, input_sql, self.con, oracle, self.settings, title, pull_table=bare,
                                           pull_name=pull_name)
            if kept is not None and _catalog_only(oracle):
                with _PLANS_LOCK:  # cursors of one connection may run statements at the same time
                    while len(kept) >= _KEPT_PLANS_MAX:
                        kept.pop(next(iter(kept)))
                    kept[key] = (plan, physical)
        # ---- planning is done: execution below only reads ``physical``
        fp = physical.fast
        pull = None
        if physical.pull is not None:
            pull = self._pull(physical.pull, prepared, dry)
        input_sql, read_sql = physical.input_sql, physical.read_sql
        rows_before_filter = None
        if physical.row_filter and prepared.explain == "analyze":  # EXPLAIN ANALYZE reports what the filter dropped
            rows_before_filter = self.con.execute(f"SELECT count(*) FROM ({input_sql})").fetchall()[0][0]
        measure_types = [oracle.arrow_type(m.type) for m in plan.measures]
        try:
            null_row = reading.null_row(plan, self.con)
        except duckdb.Error as err:  # pragma: no cover - null_row catches per expression
            raise map_duckdb_error(err, source, clause.spec.span.start, "Evaluating MATCH_RECOGNIZE failed") from None
        started = time.perf_counter()
        reader = None
        try:
            reader = read_batches(self.con, read_sql if not dry else read_sql + " LIMIT 0")
            input_schema = reader.schema
            lay = reading.layout(plan, input_schema)
            schema_fields = []
            for k, col in enumerate(plan.output):
                typ = input_schema.field(lay.colmap[col.index]).type if col.source == "input" else \
                    pa.bool_() if col.source == "const" else measure_types[col.index]
                schema_fields.append(pa.field(f"c{k}", typ))
            schema = pa.schema(schema_fields)
            compiled = reading.compiled_matcher(plan, fp, self.con, lay, input_schema) if fp is not None else None
            fallback = FallbackEvaluator(self.con.cursor())
            table, stats = run_plan(plan, reader, fallback, measure_types, schema, self.settings, null_row, compiled,
                                    self.con, lay)
        except duckdb.Error as err:
            raise map_duckdb_error(err, source, clause.spec.span.start,
                                   "Evaluating MATCH_RECOGNIZE failed") from None
        finally:
            # An exception kept alive by the caller (pytest, notebooks) must not keep the
            # connection's streaming result open.
            if reader is not None:
                reader.close()
            del reader
        input_seconds = time.perf_counter() - started - stats.seconds
        if rows_before_filter is not None:
            stats.extra["rows before the DuckDB row filter"] = rows_before_filter
        name = f"__matchrec_result_{tag}_{len(prepared.registered)}"
        own_change(self.con, lambda: self.con.register(name, table))  # a new name: kept answers stay valid
        prepared.registered.append(name)
        select = ", ".join(f"CAST(c{k} AS {col.type}) AS {quote_ident(col.name)}" for k, col in enumerate(plan.output))
        view = f"(SELECT {select} FROM {name})"
        done[clause.placeholder] = view
        if pull is not None:
            for i, line in enumerate(pull.lines()):
                stats.extra[f"storage {i}" if i else "storage"] = line
        prepared.runs.append(ClauseRun(clause, plan, stats, name, view, input_seconds, pull))

    def _pull(self, pull, prepared: Prepared, dry: bool):
        """Read a storage-node table for one clause as planned (``planner.physical.PullPlan``) and
        register its rows under the planned name; returns the transfer statistics."""
        from matchrec.connectors.remote import PullStats
        stats = PullStats(strategy=pull.strategy)
        if dry:
            table_data = self.remote.schemas[pull.table].empty_table()
        else:
            table_data = self.remote.pull(pull.table, pull.strategy, list(pull.columns), pull.where, pull.intervals,
                                          self.settings.round_trips, stats)
        self.con.register(pull.registered, table_data)
        prepared.registered.append(pull.registered)
        return stats
