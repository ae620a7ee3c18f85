"""Rewrites of dialect functions that sqlglot does not translate to DuckDB by itself.

Applied to MEASURES/DEFINE expression trees right after parsing. Each entry replaces a
function call by an equivalent DuckDB expression built from the call's arguments.
"""
from __future__ import annotations

import sqlglot
from sqlglot import exp

from matchrec.parser import hidden as H

# dialect family -> function name -> DuckDB template over $1, $2, ...
_TEMPLATES = {
    "trino": {
        # Trino's map aggregates; DuckDB builds maps from lists of entries.
        "map_union": "MAP_FROM_ENTRIES(FLATTEN(LIST(MAP_ENTRIES($1))))",
        "every": "BOOL_AND($1)",
        "set_union": "LIST_DISTINCT(FLATTEN(LIST($1)))",
    },
}
_FAMILY = {"trino": "trino", "presto": "trino", "athena": "trino"}

# Trino aggregates whose DuckDB form needs lambdas: MATCH_RECOGNIZE's analysis keeps them as
# calls (an aggregate DuckDB evaluates over the matched rows' values) and expands them in the
# SQL DuckDB runs (expand_aggregates).
LAMBDA_AGGREGATES = {
    # key -> array of its values: each distinct key collects its values
    "multimap_agg": (f"MAP_FROM_ENTRIES(LIST_TRANSFORM(LIST_DISTINCT(LIST($1)), lambda {H.LAMBDA_KEY}: "
                     f"{{'k': {H.LAMBDA_KEY}, 'v': LIST_TRANSFORM(LIST_FILTER(LIST({{'k': $1, 'v': $2}}), "
                     f"lambda {H.LAMBDA_ENTRY}: {H.LAMBDA_ENTRY}.k = {H.LAMBDA_KEY}), "
                     f"lambda {H.LAMBDA_ENTRY}: {H.LAMBDA_ENTRY}.v)}}))"),
    # key -> value; Trino keeps one value of a key given twice, where DuckDB's map rejects the duplicate
    "map_agg": (f"MAP_FROM_ENTRIES(LIST_TRANSFORM(LIST_DISTINCT(LIST($1)), lambda {H.LAMBDA_KEY}: "
                f"{{'k': {H.LAMBDA_KEY}, 'v': LIST_FILTER(LIST({{'k': $1, 'v': $2}}), "
                f"lambda {H.LAMBDA_ENTRY}: {H.LAMBDA_ENTRY}.k = {H.LAMBDA_KEY})[1].v}}))"),
    # the $1 most frequent values of $2 with their counts (exact counts are a valid approximation)
    "approx_most_frequent": (f"MAP_FROM_ENTRIES(LIST_TRANSFORM(LIST_SLICE(LIST_SORT(LIST_TRANSFORM("
                             f"MAP_ENTRIES(HISTOGRAM($2)), lambda {H.LAMBDA_ENTRY}: "
                             f"{{'c': CAST({H.LAMBDA_ENTRY}.value AS BIGINT), 'k': {H.LAMBDA_ENTRY}.key}}), 'DESC'), 1, $1), "
                             f"lambda {H.LAMBDA_ENTRY}: {{'k': {H.LAMBDA_ENTRY}.k, 'v': {H.LAMBDA_ENTRY}.c}}))"),
}


def expand_aggregates(tree: exp.Expression) -> exp.Expression:
    """``tree`` with the calls of LAMBDA_AGGREGATES replaced by their DuckDB form."""
    return _apply(tree, LAMBDA_AGGREGATES)


def is_trino(dialect: str) -> bool:
    return _FAMILY.get(dialect, "") == "trino"


def date_difference(left: exp.Expression, right: exp.Expression) -> exp.Expression:
    """Trino's ``date - date`` (an INTERVAL DAY TO SECOND) in DuckDB, where it is a number of days."""
    days = exp.Cast(this=exp.Sub(this=left, expression=right), to=exp.DataType.build("INTEGER"))
    return exp.Anonymous(this="TO_DAYS", expressions=[days])


def translate_statement(tree: exp.Expression, dialect: str, schema=None) -> exp.Expression:
    """A whole statement of ``dialect``: its functions as ``translate`` does, and (Trino) a
    difference of two values sqlglot can type as DATE as an interval. ``schema``: a callable
    giving the catalog's columns ({table: {column: type}}) for columns of stored tables,
    asked only when a subtraction's operands are not typed without it."""
    tree = translate(tree, dialect)
    if is_trino(dialect):
        tree = expand_aggregates(tree)
    subs = [n for n in tree.walk() if isinstance(n, exp.Sub)] if is_trino(dialect) else []
    if not subs:
        return tree
    for k, node in enumerate(subs):
        node.meta[_SUB_ID] = k
    dates = _date_differences(tree, None)
    if dates is None and schema is not None:
        try:
            tables = schema()
        except Exception:  # noqa: BLE001 - typing is best effort; the statement runs untyped
            tables = None
        if tables:
            dates = _date_differences(tree, tables)
    for k, node in enumerate(subs):
        node.meta.pop(_SUB_ID, None)
        if dates and k in dates:
            node.replace(date_difference(node.this.copy(), node.expression.copy()))
    return tree


_SUB_ID = "matchrec_sub"


def _date_differences(tree: exp.Expression, tables: dict | None) -> set[int] | None:
    """Ids of the subtractions of two DATE values; None when some subtraction's operands stay untyped."""
    # the type annotator loads sqlglot's optimizer: only Trino statements with a subtraction need it
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify
    try:
        typed = qualify(tree.copy(), schema=tables, dialect="trino", validate_qualify_columns=False,
                        quote_identifiers=False, identify=False)
        typed = annotate_types(typed, schema=tables)
    except Exception:  # noqa: BLE001 - typing is best effort; the statement runs untyped
        return set() if tables is not None else None
    dates, unknown = set(), False
    for node in typed.walk():
        if isinstance(node, exp.Sub) and _SUB_ID in node.meta:
            left, right = node.this.type, node.expression.type
            if node.this.is_type(exp.DataType.Type.DATE) and node.expression.is_type(exp.DataType.Type.DATE):
                dates.add(node.meta[_SUB_ID])
            elif left is None or right is None or left.this == exp.DataType.Type.UNKNOWN \
                    or right.this == exp.DataType.Type.UNKNOWN:
                unknown = True
    return None if unknown and tables is None else dates


def catalog_columns(con, tables: dict | None = None) -> dict:
    """{table: {column: type}} of the tables and views DuckDB's catalog holds (for
    translate_statement), and of ``tables`` (placeholder -> relation SQL: the results of
    MATCH_RECOGNIZE and windows a statement reads)."""
    found = con.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE NOT internal").fetchall()
    for name, relation in (tables or {}).items():
        if name.startswith((H.CLAUSE_PREFIX, H.WINDOW_PREFIX)) and not name.endswith("_star"):
            try:
                found += [(name, c, t) for c, t, *_ in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()]
            except Exception:  # noqa: BLE001 - a relation that cannot be described stays untyped
                pass
    out: dict = {}
    for table, column, kind in found:
        try:
            exp.DataType.build(kind, dialect="duckdb")
        except Exception:  # noqa: BLE001 - a type sqlglot cannot read is left untyped
            kind = "UNKNOWN"
        out.setdefault(table, {})[column] = kind
    return out


def translate(tree: exp.Expression, dialect: str) -> exp.Expression:
    return _apply(tree, _TEMPLATES.get(_FAMILY.get(dialect, ""), {}))


def _apply(tree: exp.Expression, templates: dict) -> exp.Expression:
    if not templates:
        return tree

    def expand(node: exp.Anonymous) -> exp.Expression:
        template = templates[str(node.this).lower()]
        args = list(node.expressions)
        text = template
        for i in range(len(args), 0, -1):
            text = text.replace(f"${i}", f"{H.TRANSLATE_ARG}{i}")
        new = sqlglot.parse_one(text, read="duckdb")
        for col in list(new.find_all(exp.Column)):
            if col.name.startswith(H.TRANSLATE_ARG):
                k = int(col.name[len(H.TRANSLATE_ARG):]) - 1
                if k < len(args):
                    col.replace(args[k].copy())
        return new

    def rewrite(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Window) and _templated(node.this, templates):
            # f(...) OVER (...): each aggregate of f's DuckDB form runs over that window
            new = expand(node.this)
            spec = {k: v for k, v in node.args.items() if k != "this" and v is not None}
            for agg in [n for n in new.walk() if _is_aggregate(n)]:
                agg.replace(exp.Window(this=agg.copy(), **{k: v.copy() if isinstance(v, exp.Expression) else v
                                                            for k, v in spec.items()}))
            return new
        if _templated(node, templates):
            return expand(node)
        return node

    return tree.transform(rewrite)


def _templated(node, templates: dict) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).lower() in templates


def _is_aggregate(node: exp.Expression) -> bool:
    return isinstance(node, exp.AggFunc) or (isinstance(node, exp.Anonymous)
                                             and str(node.this).lower() == "histogram")
