"""What a MATCH_RECOGNIZE reads from DuckDB, and how the matchers find it in the batches; the
planning of one clause's physical plan (``plan_clause``: matcher, row filter, storage-node pull,
the read query) before anything is read.

The read query selects, sorted by partition and order keys, only the columns the output,
the MEASURES and the chosen matcher need: input columns by their names, pushed expressions
as ``__mr_e{i}``, the WITHIN bound as ``__mr_wkey``/``__mr_wend`` and the values of register
comparisons as ``__mr_c{k}``/``__mr_o{k}`` (the names are ``parser.hidden``'s). ``Layout`` maps
the plan's column numbers (input columns, then pushed expressions) to the positions of the batches.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from matchrec.connectors.duckdb_source import _NUMBER, TEXT_CARRIED, DuckDBOracle
from matchrec.engine.fast import CompiledMatcher, compare_kind, numeric_kind, program_kinds, to_numpy
from matchrec.errors import ProgrammingError, positioned
from matchrec.parser import hidden as H
from matchrec.parser.names import quote_ident
from matchrec.operators import expr as ir
from matchrec.planner.fastpath import FastPlan, fast_plan
from matchrec.planner.intervals import interval_plan
from matchrec.planner.physical import (PhysicalPlan, PullPlan, Section, Semantics, choose_matcher, decide_fast_path,
                                       probe_columns)
from matchrec.planner.plan import Plan
from matchrec.planner.prefilter import row_filter


@dataclass
class Layout:
    colmap: dict[int, int]  # plan column -> batch column
    within: tuple[int, int] | None  # batch columns of the WITHIN key and bound
    names: list[str]  # batch column names


def _name(plan: Plan, i: int) -> str:
    n_in = len(plan.input_columns)
    return plan.input_columns[i][0] if i < n_in else H.pushed(i - n_in)


def needed_columns(plan: Plan, fp: FastPlan | None) -> set[int]:
    """Plan columns the output, the MEASURES and the matchers read."""
    need = {c.index for c in plan.output if c.source == "input"} | set(plan.partition_by)
    need |= ir.columns_of(m.node for m in plan.measures)
    # the reference matcher evaluates DEFINE itself (also for a chunk whose sums the compiled one cannot keep)
    if fp is None or not fp.exact or fp.may_hand_back:
        need |= ir.columns_of(plan.defines)
    if fp is not None:
        names = [n for n, _ in plan.input_columns]
        need |= {names.index(n) for n in fp.row_columns}
    return need


def within_type(plan: Plan, oracle: DuckDBOracle) -> str:
    key_idx = plan.order_by[0][0]
    name, typ = plan.input_columns[key_idx]
    try:
        return oracle.type_of(f"CAST(NULL AS {typ}) + ({plan.within_sql})")
    except Exception as err:  # noqa: BLE001 - reported with the WITHIN position
        span = plan.spec.within.span
        raise positioned(ProgrammingError, f"WITHIN {plan.spec.within.sql} cannot be added to ORDER BY column "
                         f"{name} ({typ}): {err}", plan.spec.source, span.start, span.end) from None


def input_query(plan: Plan, input_sql: str, oracle: DuckDBOracle, fp: FastPlan | None,
                needed: set[int] | None, where: str | None = None) -> str:
    """The sorted input; ``needed`` limits the plan columns read (None: all of them), ``where``
    is a row filter proven not to change the result (planner.prefilter)."""
    cols = [quote_ident(n) for n, _ in plan.input_columns]
    n_in = len(cols)
    select = [_carried(cols[i], t, cols[i]) for i, (_, t) in enumerate(plan.input_columns)
              if needed is None or i in needed]
    for j, (sql, t) in enumerate(plan.pushed):
        if needed is None or n_in + j in needed:
            select.append(_carried(f"({sql})", t, H.pushed(j)))
    if plan.within_sql is not None:
        key_idx, desc, _ = plan.order_by[0]
        key = cols[key_idx]
        typ = within_type(plan, oracle)
        select.append(f"CAST({key} AS {typ}) AS {H.WITHIN_KEY}")
        select.append(f"{key} {'-' if desc else '+'} ({plan.within_sql}) AS {H.WITHIN_END}")
    if fp is not None:
        terms, constant = [], 0
        for label, cond in enumerate(fp.read_sql):
            if cond is None:
                constant |= 1 << label
            else:
                terms.append(f"(CASE WHEN {cond} THEN {1 << label} ELSE 0 END)")
        select.append(f"CAST({' + '.join(terms + [str(constant)])} AS BIGINT) AS {H.ROW_MASK}")
        for k, c in enumerate(fp.compares):
            select.append(f"({c.current_sql}) AS {H.compare_current(k)}")
            select.append(f"({c.other_sql}) AS {H.compare_other(k)}")
        for k, leaf in enumerate(leaf for prog in fp.programs for leaf in prog.leaves):
            select.append(f"({leaf.sql}) AS {H.leaf(k)}")
    if not select:
        select = ["NULL AS " + H.NOTHING]
    # the input's own columns, not the selected ones (a number carried as text sorts as text)
    order = [f"{H.INPUT}.{cols[i]} ASC NULLS LAST" for i in plan.partition_by]
    order += [f"{H.INPUT}.{cols[i]} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if nulls_first else 'LAST'}"
              for i, desc, nulls_first in plan.order_by]
    sql = f"SELECT {', '.join(select)} FROM ({input_sql}) AS {H.INPUT}"
    if where:
        sql += f" WHERE {where}"
    if order:
        sql += " ORDER BY " + ", ".join(order)
    return sql


def _carried(sql: str, duck_type: str, name: str) -> str:
    """A read column: BIGNUM values travel as text (DuckDB's Arrow form for them is opaque bytes);
    the matcher leaves their operations to DuckDB and the output casts them back."""
    if duck_type.upper() in ("BIGNUM", "VARINT"):
        return f"CAST({sql} AS VARCHAR) AS {name}"
    return sql if sql == name else f"{sql} AS {name}"


def layout(plan: Plan, schema: pa.Schema) -> Layout:
    names = schema.names
    index = {n: i for i, n in enumerate(names)}
    n_cols = len(plan.input_columns) + len(plan.pushed)
    colmap = {i: index[_name(plan, i)] for i in range(n_cols) if _name(plan, i) in index}
    within = (index[H.WITHIN_KEY], index[H.WITHIN_END]) if H.WITHIN_KEY in index else None
    return Layout(colmap, within, names)


def plan_clause(plan: Plan, input_sql: str, con: duckdb.DuckDBPyConnection, oracle: DuckDBOracle, settings,
                title: str, *, window: bool = False, compilable: bool = True, pull_table: str | None = None,
                pull_name: str = "") -> PhysicalPlan:
    """Plan how one clause runs, whole, before anything runs: the compiled matcher's type decisions
    (a DESCRIBE of a type probe), the matcher, the row filter, the storage-node pull when
    ``pull_table`` names one (its rows are registered as ``pull_name`` when execution pulls them),
    and the read query, built once from the decided fast plan. The result is attached to the plan
    (``plan.physical``) and returned; execution only reads it."""
    fp, not_compiled = None, ""
    if not settings.fast_path:
        not_compiled = "SET matchrec_fast_path = 0"
    elif compilable:
        candidate = fast_plan(plan)
        if candidate is not None:
            fp, not_compiled = decide_fast_path(plan, candidate, probe_types(plan, candidate, con, input_sql, oracle),
                                                 KindRules)
    logical = plan.logical_plan("window" if window else "match_recognize")
    matcher = choose_matcher(Semantics(logical.form, tuple(plan.labels), fp,
                                       not_compiled, estimates=_NO_ESTIMATES))
    where, filtering = None, Section("none: the reference matcher reads every row")
    if fp is not None and settings.prefilter:
        where, why = row_filter(plan, fp)
        filtering = Section(f"row filter in DuckDB: {where}  ({why})" if where else f"no row filter: {why}")
    elif fp is not None:
        filtering = Section("no row filter: SET matchrec_prefilter = 0")
    if window:
        where, filtering = None, Section("none: every row is a start row of its own frame")
    pushed = tuple(f"pushed to DuckDB: {H.pushed(i)} := {sql} ({typ})" for i, (sql, typ) in enumerate(plan.pushed))
    pull = None
    read_from = input_sql
    if pull_table is not None:
        pull, pull_notes, interval_lines = plan_pull(plan, fp, oracle, settings, pull_table, pull_name)
        read_from = f"SELECT * FROM {pull_name}"
        access = Section(f"storage-node pull of {pull_table}, strategy {pull.strategy}, columns "
                         f"{', '.join(pull.columns)}", tuple(pull_notes) + pushed)
        if interval_lines:
            filtering = Section(filtering.summary, filtering.details + tuple(interval_lines))
    else:
        access = Section("local DuckDB read of the input, sorted by partition and order keys", pushed)
    read_sql = input_query(plan, read_from, oracle, fp, None if window else needed_columns(plan, fp), where)
    output = Section("an Arrow table registered with DuckDB; the rest of the statement runs in DuckDB")
    trailer = ("  program:",) + tuple("    " + line for line in plan.program.dump().splitlines())
    physical = PhysicalPlan(title, logical, access, filtering, matcher, output, fp, read_sql,
                            read_from, where, pull, trailer)
    plan.physical = physical
    return physical


_NO_ESTIMATES = ("none used: the choice rests on the forms of DEFINE and the types of the values compared",)


class KindRules:
    """The compiled matcher's rules (``engine.fast``) for ``planner.physical.decide_fast_path``."""

    @staticmethod
    def within(key: pa.DataType, end: pa.DataType) -> str | None:
        kinds = {numeric_kind(key), numeric_kind(end)}
        return None if None in kinds or len(kinds) != 1 else kinds.pop()

    @staticmethod
    def compare(current: pa.DataType, other: pa.DataType) -> str | None:
        return compare_kind(current, other)

    @staticmethod
    def program(prog, types: list[pa.DataType], aggregates) -> list[str] | None:
        return program_kinds(prog, types, aggregates)


def probe_types(plan: Plan, fp: FastPlan, con: duckdb.DuckDBPyConnection, input_sql: str,
                oracle: DuckDBOracle) -> dict[str, pa.DataType]:
    """The Arrow types of the values the compiled matcher compares (the WITHIN key and bound,
    ``planner.physical.probe_columns``). When every one is an input column read as it is, its
    type is the input's (known since the plan was built): no query. Otherwise from the schema of
    the probe over the input with LIMIT 0: planning time, nothing is read, one round trip."""
    probed = probe_columns(plan, fp)
    if plan.within_sql is None:
        known = {name: _input_column_type(plan, sql, oracle) for name, sql in probed}
        if all(t is not None for t in known.values()):
            return known
    schema = con.sql(f"SELECT * FROM ({input_query(plan, input_sql, oracle, fp, None)}) LIMIT 0").to_arrow_table(
    ).schema
    names = [H.WITHIN_KEY, H.WITHIN_END] + [name for name, _ in probed]
    return {name: schema.field(name).type for name in names if schema.get_field_index(name) >= 0}


def _input_column_type(plan: Plan, sql: str, oracle: DuckDBOracle) -> pa.DataType | None:
    """The Arrow type of ``sql`` when it is an input column read as it is (in parentheses or not,
    naming exactly one column) or a number literal; else None (the probe answers)."""
    while sql.startswith("(") and sql.endswith(")"):
        sql = sql[1:-1]
    if _NUMBER.fullmatch(sql):
        return oracle.arrow_type(oracle.type_of(sql))
    if _BARE_COLUMN.fullmatch(sql):
        name = sql[1:-1].replace('""', '"').lower()  # DuckDB matches quoted names case-insensitively too
    elif _WORD.fullmatch(sql) and sql.lower() not in _SPECIAL_WORDS:
        name = sql.lower()
    else:
        return None
    types = [t for n, t in plan.input_columns if n.lower() == name]
    if len(types) != 1 or types[0].upper() in TEXT_CARRIED:
        return None
    return oracle.arrow_type(types[0])


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# unquoted words DuckDB may read as something other than a column of the same name
_SPECIAL_WORDS = frozenset({"true", "false", "null", "current_date", "current_time", "current_timestamp", "localtime",
                            "localtimestamp", "current_user", "session_user", "user", "current_role",
                            "current_schema", "current_catalog", "default"})


def plan_pull(plan: Plan, fp: FastPlan | None, oracle: DuckDBOracle, settings, table: str, name: str):
    """The pull of a storage-node table for one clause: strategy, columns, row filter and interval
    plan; returns (PullPlan, notes on the strategy, the interval filter's lines)."""
    ifp = fast_plan(plan)  # conditions as the planner derived them, whatever matcher runs
    strategy = settings.pull_strategy
    notes: list[str] = []
    ip, why = None, ""
    if strategy in ("auto", "dfs", "naive_dfs", "dfs_stateful", "push_pull"):
        ip, why = interval_plan(plan, ifp, oracle)
    if strategy == "auto":
        strategy = "dfs" if ip is not None else "push_down"
        notes.append(f"pull strategy auto -> {strategy}" + (f" ({why})" if ip is None else ""))
    elif strategy in ("dfs", "naive_dfs", "dfs_stateful", "push_pull") and ip is None:
        notes.append(f"pull strategy {strategy} cannot filter by time here ({why}): push_down used")
        strategy = "push_down"
    interval_lines: list[str] = []
    if ip is not None:
        if not settings.prefilter:
            ip.row_filter = None
        interval_lines = ip.describe()
    where = row_filter(plan, ifp)[0] if ifp is not None and settings.prefilter else None
    n_in = len(plan.input_columns)
    need = needed_columns(plan, fp) | {i for i, _, _ in plan.order_by}
    if any(i >= n_in for i in need) or fp is None:
        need |= set(range(n_in))  # pushed expressions and the reference matcher may read any column
    else:  # and whatever the read query computes from the input (conditions, compared values)
        probe = input_query(plan, "SELECT 1", oracle, fp, need, where)
        used = {c.name for c in sqlglot.parse_one(probe, read="duckdb").find_all(exp.Column)}
        need |= {i for i, (n, _) in enumerate(plan.input_columns) if n in used}
    columns = tuple(plan.input_columns[i][0] for i in range(n_in) if i in need)
    return PullPlan(table, strategy, columns, where, ip, name), notes, interval_lines


def compiled_matcher(plan: Plan, fp: FastPlan, con, lay: Layout, schema: pa.Schema) -> CompiledMatcher:
    index = {n: i for i, n in enumerate(lay.names)}
    duck = con
    con = con.cursor()  # the input is streaming on the main connection meanwhile
    compare_cols, nulls = [], []
    nulls_sql = ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(n)}" for n, t in plan.input_columns)
    for k, c in enumerate(fp.compares):
        try:
            value = con.sql(f"SELECT ({c.other_sql}) AS v FROM (SELECT {nulls_sql})").to_arrow_table()
            values, valid = to_numpy(value.column(0), c.kind)
            null = values[0].item() if valid[0] else None
        except duckdb.Error:
            null = None
        compare_cols.append((index[H.compare_current(k)], index[H.compare_other(k)], c.kind))
        nulls.append(null)
    within = None
    if lay.within is not None:
        within = (lay.within[0], lay.within[1], numeric_kind(schema.field(lay.within[0]).type))
    leaf_cols, leaf_nulls = [], []
    for k, leaf in enumerate(leaf for prog in fp.programs for leaf in prog.leaves):
        leaf_cols.append(index[H.leaf(k)])
        null = None
        if leaf.register >= 0:
            try:
                value = con.sql(f"SELECT ({leaf.sql}) AS v FROM (SELECT {nulls_sql})").to_arrow_table()
                values, valid = to_numpy(value.column(0), leaf.kind)
                null = values[0].item() if valid[0] else None
            except duckdb.Error:
                null = None
        leaf_nulls.append(null)
    row_columns = {name: index[name] for name in fp.row_columns}
    con.close()
    return CompiledMatcher(plan, fp, duck, compare_cols, nulls, within, row_columns, index[H.ROW_MASK],
                           leaf_cols, leaf_nulls)


_BARE_COLUMN = re.compile(r'"(?:[^"]|"")+"')  # a quoted column name (unquoted words may be keywords: TRUE)


def null_row(plan: Plan, con: duckdb.DuckDBPyConnection) -> list:
    """Input columns and pushed expressions evaluated on a row of NULLs.

    Navigation that finds no row (``A.x`` before any A) reads this row, so that
    ``A.x IS NULL`` is true there, exactly as if the value were NULL.
    """
    values: list = [None] * len(plan.input_columns)
    if not plan.pushed:
        return values
    if all(_BARE_COLUMN.fullmatch(sql) for sql, _ in plan.pushed):
        return values + [None] * len(plan.pushed)  # a column of the NULL row is NULL: no query needed
    nulls = ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(n)}" for n, t in plan.input_columns)
    exprs = ", ".join(f"({sql}) AS {H.pushed(i)}" for i, (sql, _) in enumerate(plan.pushed))
    try:
        return values + list(con.execute(f"SELECT {exprs} FROM (SELECT {nulls})").fetchall()[0])
    except duckdb.Error:
        pass
    # Some expression cannot take NULL inputs (MAP([NULL], ...)); that one reads as NULL.
    for sql, _ in plan.pushed:
        try:
            values.append(con.execute(f"SELECT ({sql}) FROM (SELECT {nulls})").fetchall()[0][0])
        except duckdb.Error:
            values.append(None)
    return values
