"""What every shard request shares: the errors a request ends with, the check of the SQL fragments
it carries, and the compact encoding of the rows it returns (``connectors.shard`` answers the
requests, ``connectors.partial_matches`` the push-pull baseline's)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

MAX_NESTING = 200  # parentheses in one SQL fragment: deeper would exhaust the parser's recursion


class RequestError(ValueError):
    """A request the node refuses; the message goes back to the caller."""


class RequestCancelled(Exception):
    """The caller of a request timed out or went away; its work was stopped."""


def _nesting(sql: str) -> int:
    """The deepest parenthesis nesting of ``sql`` outside string literals and quoted names."""
    depth = deepest = 0
    quote_char = None
    for ch in sql:
        if quote_char:
            if ch == quote_char:
                quote_char = None
        elif ch in "'\"":
            quote_char = ch
        elif ch in "([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]":
            depth -= 1
    return deepest


def check_fragment(sql: str) -> str:
    """``sql`` if it is a single scalar expression that reads no other relation."""
    if not isinstance(sql, str) or len(sql) > 100_000:
        raise RequestError("SQL fragment must be a string of at most 100000 characters")
    if _nesting(sql) > MAX_NESTING:
        raise RequestError(f"SQL fragment nests more than {MAX_NESTING} parentheses deep")
    try:
        trees = sqlglot.parse(f"SELECT {sql}", read="duckdb")
    except sqlglot.errors.SqlglotError as err:
        raise RequestError(f"SQL fragment does not parse: {str(err).splitlines()[0][:200]}") from None
    except RecursionError:  # deep nesting without parentheses (NOT NOT ..., - - ...)
        raise RequestError("SQL fragment nests too deeply") from None
    if len(trees) != 1 or not isinstance(trees[0], exp.Select) or trees[0].args.get("from_") is not None:
        raise RequestError("SQL fragment must be one expression")
    tree = trees[0]
    if len(tree.expressions) != 1 or any(isinstance(n, (exp.Select, exp.Subquery, exp.Table, exp.Command))
                                         for n in tree.expressions[0].walk()):
        raise RequestError("SQL fragment must be one expression without subqueries")
    return sql


def compact(table: pa.Table) -> pa.Table:
    """Strings with few distinct values travel dictionary-encoded (the compute node decodes)."""
    cols = []
    for col in table.columns:
        if (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) and table.num_rows > 64:
            encoded = pc.dictionary_encode(col)
            if len(encoded.chunk(0).dictionary) * 4 < table.num_rows if encoded.num_chunks else False:
                col = encoded
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)
