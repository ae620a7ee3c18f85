"""Name resolution of a ``parser.sase.CerQuery`` against the source's schema: the type, key and
partition columns, the columns predicates name, the window in key units, and single-variable
predicates as DuckDB SQL (evaluated in bulk as boolean masks)."""
from __future__ import annotations

from fractions import Fraction

import duckdb

from matchrec.errors import NotSupportedError, ProgrammingError, positioned
from matchrec.parser import sase as S
from matchrec.planner.cer.plan import (NO_WINDOW, UNIT_SECONDS, WINDOW_BEYOND_KEYS, CerPlan, CerSettings, Stats, quote,
                                       sql_literal)


class _Resolver:
    def __init__(self, q: S.CerQuery, columns: dict):
        self.q, self.columns = q, columns

    def column(self, name: str, span, what: str) -> str:
        hit = self.columns.get(name.lower())
        if hit is None:
            known = ", ".join(c for c, _ in self.columns.values())
            if span is None:
                raise ProgrammingError(f"{what} {name} is not a column of {self.q.source} (columns: {known})")
            raise positioned(ProgrammingError, f"{what} {name} is not a column of {self.q.source} (columns: {known})",
                             self.q.text, span[0], span[1])
        return hit[0]

    def col(self, e: S.Col) -> str:
        return self.column(e.name, e.span, "Column")


def describe_source(duck: duckdb.DuckDBPyConnection, q: S.CerQuery) -> dict:
    try:
        rows = duck.execute(f"DESCRIBE SELECT * FROM {q.source}").fetchall()
    except duckdb.Error as err:
        first = str(err).split("\n")[0]
        raise positioned(ProgrammingError, f"Cannot read {q.source}: {first}", q.text, *q.source_span) from None
    return {r[0].lower(): (r[0], r[1]) for r in rows}


def to_sql(e: S.Expr, res: _Resolver) -> str:
    if isinstance(e, S.Lit):
        return sql_literal(e.value)
    if isinstance(e, S.Col):
        return quote(res.col(e))
    if isinstance(e, S.Var):
        raise positioned(ProgrammingError, f"{e.var} is a pattern variable, not a value", res.q.text, *e.span)
    if isinstance(e, S.Call):
        return f"{e.name}({', '.join(to_sql(a, res) for a in e.args)})"
    if isinstance(e, S.Unary):
        return f"(-{to_sql(e.arg, res)})" if e.op == "-" else f"(NOT {to_sql(e.arg, res)})"
    if isinstance(e, S.Cast):
        return f"CAST({to_sql(e.arg, res)} AS {e.type})"
    if isinstance(e, S.Binary):
        return f"({to_sql(e.left, res)} {e.op} {to_sql(e.right, res)})"
    if isinstance(e, S.Logic):
        return "(" + f" {e.op.upper()} ".join(to_sql(i, res) for i in e.items) + ")"
    if isinstance(e, S.Between):
        neg = "NOT " if e.negated else ""
        return f"({to_sql(e.arg, res)} {neg}BETWEEN {to_sql(e.lo, res)} AND {to_sql(e.hi, res)})"
    if isinstance(e, S.IsNull):
        return f"({to_sql(e.arg, res)} IS {'NOT ' if e.negated else ''}NULL)"
    if isinstance(e, S.InList):
        items = ", ".join(to_sql(i, res) for i in e.items)
        return f"({to_sql(e.arg, res)} {'NOT ' if e.negated else ''}IN ({items}))"
    raise TypeError(e)


def window_of(q: S.CerQuery, key_kind: str) -> int:
    w = q.within
    if w is None:
        return NO_WINDOW
    if key_kind == "time":
        if w.unit is None:
            raise positioned(ProgrammingError, "The ORDER BY key is a time: give WITHIN a unit (e.g. WITHIN 10 "
                             "minutes)", q.text, *w.span)
        # exact for integer amounts (a float product would round large windows)
        micros = UNIT_SECONDS[w.unit] * 1_000_000
        window = w.amount * int(micros) if isinstance(w.amount, int) and micros >= 1 else \
            int(round(Fraction(w.amount) * Fraction(micros).limit_denominator(1_000_000)))
    else:
        if w.unit is not None:
            raise positioned(ProgrammingError, "The ORDER BY key is a number: WITHIN takes a plain number of key "
                             "units", q.text, *w.span)
        if w.amount != int(w.amount):
            raise positioned(ProgrammingError, "The ORDER BY key is an integer: WITHIN takes an integer", q.text,
                             *w.span)
        window = int(w.amount)
    if window >= WINDOW_BEYOND_KEYS:
        return NO_WINDOW  # longer than the distance between any two keys: no bound at all
    if window >= NO_WINDOW:
        raise positioned(NotSupportedError, f"A window of 2**62 key units or more is not supported below "
                         f"2**64 (the widest distance of two keys); leave WITHIN out to match without a window",
                         q.text, *w.span)
    return window


def _key_sql(name: str, duck_type: str, q: S.CerQuery, span) -> tuple[str, str]:
    t = duck_type.upper()
    col = quote(name)
    if t.startswith("TIMESTAMP"):
        return f"epoch_us({col})", "time"
    if t == "DATE":
        return f"epoch_us(CAST({col} AS TIMESTAMP))", "time"
    if t in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT"):
        return f"CAST({col} AS BIGINT)", "integer"
    message = f"The ORDER BY key {name} is {duck_type}: CER needs an integer, DATE or TIMESTAMP key"
    if span is None:
        raise ProgrammingError(message + " (set the key column with ORDER BY <column> or SET matchrec_cer_key_column)")
    raise positioned(ProgrammingError, message, q.text, *span)


def resolve_query(duck: duckdb.DuckDBPyConnection, q: S.CerQuery, settings: CerSettings,
                  columns: dict | None = None, rowid: bool | None = None) -> CerPlan:
    """The plan's resolution only: columns, key, window and the SQL of the filters, without statistics
    or a mechanism (``columns`` and ``rowid``: the source's schema and rowid, when already known)."""
    if columns is None:
        columns = describe_source(duck, q)
    res = _Resolver(q, columns)
    type_col = None
    if q.typed:
        if q.type_column is not None:
            type_col = res.column(q.type_column[0], q.type_column[1], "TYPE")
        else:
            type_col = res.column(settings.type_column, None, "The type column (SET matchrec_cer_type_column)")
    if q.key_column is not None:
        key_col = res.column(q.key_column[0], q.key_column[1], "ORDER BY")
        key_span = q.key_column[1]
    else:
        key_col = res.column(settings.key_column, None, "The key column (SET matchrec_cer_key_column)")
        key_span = None
    part_col = None
    if q.partition_column is not None:
        part_col = res.column(q.partition_column[0], q.partition_column[1], "PARTITION BY")
    key_sql, key_kind = _key_sql(key_col, columns[key_col.lower()][1], q, key_span)
    window = window_of(q, key_kind)
    filter_sql = {}
    constants = [to_sql(c, res) for c in q.constants]
    for var in q.elements:
        preds = [to_sql(p, res) for p in q.filters.get(var, [])] + constants
        if preds:
            filter_sql[var] = "coalesce(" + " AND ".join(preds) + ", FALSE)"
    # the Python side resolves the same names: fail here, at planning, on an unknown column
    for e in list(q.conditions) + [p.expr for p in q.projections]:
        for n in S.walk(e):
            if isinstance(n, S.Col):
                res.col(n)
    if rowid is None:
        rowid = has_rowid(duck, q.source)
    return CerPlan(q, columns, type_col, key_col, part_col, key_sql, key_kind, window, filter_sql,
                   f"CAST({quote(type_col)} AS VARCHAR)" if type_col else None, Stats(), "", None, "", [], False, "",
                   rowid)


def has_rowid(duck: duckdb.DuckDBPyConnection, source: str) -> bool:
    """Whether ``source`` has DuckDB's rowid (a stable tie order for equal keys)."""
    try:
        duck.execute(f"SELECT rowid FROM {source} LIMIT 0")
        return True
    except duckdb.Error:
        return False
