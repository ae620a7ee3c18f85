"""Rewrites of dialect functions that sqlglot does not translate to DuckDB by itself.

Applied to MEASURES/DEFINE expression trees right after parsing. Each entry replaces a
function call by an equivalent DuckDB expression built from the call's arguments.
"""
from __future__ import annotations

import sqlglot
from sqlglot import exp

# dialect family -> function name -> DuckDB template over $1, $2, ...
_TEMPLATES = {
    "trino": {
        # Trino's map aggregates; DuckDB builds maps from lists of entries.
        "map_agg": "MAP_FROM_ENTRIES(LIST({'k': $1, 'v': $2}))",
        "map_union": "MAP_FROM_ENTRIES(FLATTEN(LIST(MAP_ENTRIES($1))))",
    },
}
_FAMILY = {"trino": "trino", "presto": "trino", "athena": "trino"}


def translate(tree: exp.Expression, dialect: str) -> exp.Expression:
    templates = _TEMPLATES.get(_FAMILY.get(dialect, ""), {})
    if not templates:
        return tree

    def rewrite(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Anonymous) and str(node.this).lower() in templates:
            template = templates[str(node.this).lower()]
            args = list(node.expressions)
            text = template
            for i in range(len(args), 0, -1):
                text = text.replace(f"${i}", f"__mr_arg{i}")
            new = sqlglot.parse_one(text, read="duckdb")
            for col in list(new.find_all(exp.Column)):
                if col.name.startswith("__mr_arg"):
                    k = int(col.name[len("__mr_arg"):]) - 1
                    if k < len(args):
                        col.replace(args[k].copy())
            return new
        return node

    return tree.transform(rewrite)
