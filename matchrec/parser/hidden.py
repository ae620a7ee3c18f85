"""Hidden names: every column, table, function and placeholder name matchrec generates, named once.

matchrec writes SQL of its own around the user's (rewritten expressions, read queries, views of
results, relations it registers in DuckDB). The names it invents start with ``PREFIX`` (``__mr_``)
or, for whole clauses and results, ``CLAUSE_PREFIX`` (``__matchrec_``); a user name cannot clash
with them in practice, and ``matchrec.errors`` removes names of both forms from DuckDB's messages.
Windows with PATTERN use ``WINDOW_PREFIX`` (``__mrw_``). The module imports nothing, so every layer
uses it; a function gives a numbered name, a constant a fixed one.
"""
from __future__ import annotations

PREFIX = "__mr_"  # every generated name of an expression, column or helper relation starts with it
CLAUSE_PREFIX = "__matchrec_"  # placeholders of clauses, tables of results
WINDOW_PREFIX = "__mrw_"  # placeholders and helper columns of windows with PATTERN

# ---------------------------------------------------------------- pattern functions (parser.expressions)
# PREV(, NEXT(, FIRST(, LAST(, CLASSIFIER(, MATCH_NUMBER(, RUNNING and FINAL become functions named
# FUNCTION_PREFIX + the lower-case word, so sqlglot parses them as ordinary (anonymous) calls.
FUNCTION_PREFIX = PREFIX


def function(word: str) -> str:
    """The rewritten name of a pattern function or of RUNNING/FINAL (``prev`` → ``__mr_prev``)."""
    return FUNCTION_PREFIX + word.lower()


# ---------------------------------------------------------------- evaluation templates
# A template evaluated by DuckDB reads its arguments as columns ARG(0)..ARG(n-1) of the relation
# ARGS: one row per call (connectors.duckdb_source), or one row per output row when a measure is
# evaluated over a whole column (engine.output), kept in order by ROW_INDEX.
ARGS = "__mr_args"
ROW_INDEX = "__mr_i"  # row numbers of a column-wise evaluation (engine.output, engine.fast)
CHUNK = "__mr_chunk"  # a chunk's columns, registered for the compiled matcher's row conditions


def arg(k: int) -> str:
    """Column of argument ``k`` in ARGS."""
    return f"__mr_a{k}"


def unnested(k: int) -> str:
    """Argument ``k`` unnested, for an aggregate over a Kleene variable's values (planner.analysis)."""
    return f"__mr_u{k}"


TYPE_MARK = "__mr_t_"  # planner.analysis: typed NULL stand-ins while the type of a part is worked out
PROBE = "__mr_c"  # connectors.duckdb_source: the alias of a probed constant or type


# ---------------------------------------------------------------- the read query (engine.reading)
INPUT = "__mr_input"  # the MATCH_RECOGNIZE input as a subquery
NOTHING = "__mr_nothing"  # the one column of a read that needs no column
WITHIN_KEY = "__mr_wkey"  # the ORDER BY key, cast to the type WITHIN is compared in
WITHIN_END = "__mr_wend"  # the key plus (or minus) the WITHIN bound: where a match must end
ROW_MASK = "__mr_rmask"  # bits of the row conditions the compiled matcher reads per row


def pushed(i: int) -> str:
    """Expression ``i`` the planner pushed to DuckDB (computed once per row by the read query)."""
    return f"__mr_e{i}"


def compare_current(k: int) -> str:
    """Register comparison ``k``: its side on the current row."""
    return f"__mr_c{k}"


def compare_other(k: int) -> str:
    """Register comparison ``k``: its side on the remembered row."""
    return f"__mr_o{k}"


def leaf(k: int) -> str:
    """Leaf ``k`` of a condition program of the compiled matcher."""
    return f"__mr_p{k}"


# ---------------------------------------------------------------- fast path (planner.fastpath)
SHIFT_PREFIX = "__mr_s"  # columns of other rows (PREV/NEXT) as window functions: a condition over them


def shifted(k: int) -> str:
    return f"{SHIFT_PREFIX}{k}"


# ---------------------------------------------------------------- placeholders in statements
def clause(tag: str, n: int) -> str:
    """Placeholder of MATCH_RECOGNIZE clause ``n`` of a statement (parser.query)."""
    return f"{CLAUSE_PREFIX}{tag}_{n}"


def result(tag: str, n: int) -> str:
    """Table of a clause's (or window's) result registered in DuckDB."""
    return f"{CLAUSE_PREFIX}result_{tag}_{n}"


def window(tag: str, k: int) -> str:
    """Placeholder of window ``k`` with PATTERN of a statement (parser.window)."""
    return f"{WINDOW_PREFIX}{tag}_{k}"


def parameter(tag: str, n: int) -> str:
    """Marker of query parameter ``n`` (parser.parameters)."""
    return f"{PREFIX}param_{tag}_{n}"


ROW_MARK = "__matchrec_row"  # planner.plan: the constant column ONE ROW PER MATCH emits without measures


# ---------------------------------------------------------------- translated functions (parser.translate)
TRANSLATE_ARG = "__mr_arg"  # $1, $2 ... of a translation template, as columns sqlglot can parse
LAMBDA_KEY = "__mr_key"  # lambda variables inside translation templates
LAMBDA_ENTRY = "__mr_e"

# ---------------------------------------------------------------- storage nodes and Spark filtering
PARTITION = "__mr_part"  # a Spark partition's rows, registered to load the shard's table
LOAD = "__mr_load"  # rows a storage node loads into one of its tables
SPREAD = "__mr_spread"  # the loader's input with the node each row goes to
NODE = "__mr_node"  # that node
BLOCK = "__mr_b"  # ACER: the block number of a row
SYNOPSIS = "__mr_syn"  # ACER: the blocks' time bounds, to compute their keys
PARTITION_HASH = "__mr_pk"  # shard: a row's partition hash
KEY = "__mr_t"  # shard: a row's ORDER BY key
MARKS = "__mr_m"  # shard: which variables' conditions a row satisfies, as bits
FINAL = "__mr_f"  # shard: whether a row passes the final filter


def ids_view(ident: int) -> str:
    """Shard: a view of row ids sent in a request."""
    return f"__mr_ids_{ident}"
