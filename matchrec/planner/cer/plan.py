"""The plan of a CER query and what it rests on: the session settings (``SET matchrec_cer_...``),
the statistics, the resolved columns and SQL tests, and the planner's constants."""
from __future__ import annotations

import datetime
import decimal
import math
from dataclasses import dataclass, field

from matchrec.parser import sase as S
from matchrec.parser.names import quote_ident as quote  # noqa: F401 (planner.cer.quote)


SAMPLE_ROWS = 5000
REACH_SAMPLE = 64  # anchor candidates around which a Kleene element's reach is counted
SAMPLE_TRIALS = 400  # random bindings tried per condition to estimate its selectivity
RATE_CHANGE = 2.0  # a type whose count differs this much between the halves makes rates "vary"
MECHANISMS = ("batch", "eager", "chain", "tree", "rcep")
UNIT_SECONDS = {"microsecond": 1e-6, "microseconds": 1e-6, "us": 1e-6, "millisecond": 1e-3, "milliseconds": 1e-3,
                "ms": 1e-3, "second": 1, "seconds": 1, "sec": 1, "secs": 1, "s": 1, "minute": 60, "minutes": 60,
                "min": 60, "mins": 60, "m": 60, "hour": 3600, "hours": 3600, "h": 3600, "day": 86400,
                "days": 86400, "d": 86400, "week": 604800, "weeks": 604800}
NO_WINDOW = 1 << 62
WINDOW_BEYOND_KEYS = 1 << 64  # more than the distance between any two BIGINT keys (or microseconds)
FILTER_COVER = 0.5  # filtering before matching pays while the intervals cover at most this share


@dataclass
class CerSettings:
    """Session settings of CER statements (``SET matchrec_cer_...``)."""
    type_column: str = "type"
    key_column: str = "ts"
    mechanism: str = "auto"  # auto | batch | eager | chain | tree | rcep
    max_matches: int = 10_000_000
    # partial matches the eager NFA may hold at once (some 200 bytes each); lazy mechanisms hold none
    max_partial_matches: int = 5_000_000
    # auto | always | never: read only events near the rarest element's candidates
    filtering: str = "auto"
    # the rows come from storage nodes that kept only those inside their rounds' time interval set:
    # set by the compute node for one statement, never by SET (``settable``)
    nodes_filtered: bool = field(default=False, metadata={"settable": False})


CER_CHOICES = {"mechanism": ("auto",) + MECHANISMS, "filtering": ("auto", "always", "never")}


def sql_literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and not math.isfinite(value):  # 1e400 is read as infinity, as DuckDB does
        return f"CAST('{value}' AS DOUBLE)"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (decimal.Decimal, datetime.date, datetime.time)):  # bound parameters' values
        from matchrec.parser.parameters import duckdb_sql, literal
        return duckdb_sql(literal(value))
    return "'" + str(value).replace("'", "''") + "'"


@dataclass
class Stats:
    total: int = 0  # events with a key
    types: dict = field(default_factory=dict)  # type -> (count, first half, second half)
    key_span: int = 0  # largest minus smallest key
    part_span: int = 0  # the same summed over the partitions (key_span without PARTITION BY)
    parts: int = 1  # partitions
    sample_rows: int = 0
    filter_selectivity: dict = field(default_factory=dict)  # var -> fraction of its type passing its filter
    condition_selectivity: list = field(default_factory=list)  # per condition, None when not estimable
    estimates: dict = field(default_factory=dict)  # var -> expected candidate events
    # type -> the rate of the type an event sees in its own partition over the average rate (>= 1)
    crowding: dict = field(default_factory=dict)
    # Kleene var -> (candidates before, after) within the window of each sampled anchor candidate
    reach: dict = field(default_factory=dict)
    reach_anchor: str | None = None


@dataclass
class CerPlan:
    query: S.CerQuery
    columns: dict  # lower-case name -> (name, DuckDB type)
    type_column: str | None
    key_column: str
    partition_column: str | None
    key_sql: str
    key_kind: str  # integer | time
    window: int  # in key units (microseconds for times); NO_WINDOW without WITHIN
    filter_sql: dict  # var -> SQL of its predicates (without the type test)
    type_sql: str | None  # the type column as VARCHAR
    stats: Stats
    mechanism: str
    order: list | None
    reason: str
    anchors: list  # variables whose candidates bound the events read (filtering before matching)
    filtering: bool
    filtering_reason: str
    rowid: bool  # the source has DuckDB's rowid (a stable tie order for equal keys)
    mechanism_source: str = ""
    # per mechanism considered: (name, estimated seconds or None when excluded, what the cost
    # counts or why it is excluded), in the order of MECHANISMS
    candidates: list = field(default_factory=list)

    def element_test(self, var: str) -> str:
        """SQL: the row is a candidate of ``var`` (type and its own predicates)."""
        e = self.query.elements[var]
        parts = []
        if e.type is not None:
            parts.append(f"{self.type_sql} = {sql_literal(e.type)}")
        if var in self.filter_sql:
            parts.append(self.filter_sql[var])
        return " AND ".join(parts) if parts else "TRUE"

    def row_test(self) -> str | None:
        """SQL keeping the rows any element could take or be blocked by; None: every row counts
        (strict contiguity looks at all rows, and an element without type or filter takes any)."""
        return rows_test([self])


def rows_test(plans: list) -> str | None:
    """SQL keeping the rows some element of some of ``plans`` (one type column) could take or be
    blocked by; None: every row counts. The types of elements without a filter go into one IN list:
    DuckDB scans it about ten times faster than the same equalities joined by OR (a workload of a
    hundred statements has hundreds of them). A filtered element whose type is in that list adds
    no row: its test is left out, which spared DuckDB a third of a workload's read."""
    types: dict = {}
    others: dict = {}
    for plan in plans:
        if plan.query.strategy == "strict":
            return None
        for v, e in plan.query.elements.items():
            if v in plan.filter_sql:
                others[plan.element_test(v)] = e.type
            elif e.type is None:
                return None
            else:
                types[e.type] = None
    parts = []
    if types:
        parts.append(f"{plans[0].type_sql} IN ({', '.join(sql_literal(t) for t in types)})")
    parts += [f"({t})" for t, kind in others.items() if kind is None or kind not in types]
    return " OR ".join(parts) if parts else None
