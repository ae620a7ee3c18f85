"""What the statement runner and the window runner share: the record of one clause's run, and
the text helpers that give a clause's input the CTEs it can see and put results in the place of
placeholders. It sits below both runners (``engine.statement`` calls ``engine.window``)."""
from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from matchrec.engine.executor import Stats
from matchrec.parser.query import Clause, SplitQuery, tokenize
from matchrec.parser.source import rewrite
from matchrec.planner.plan import Plan


@dataclass
class ClauseRun:
    clause: Clause
    plan: Plan
    stats: Stats
    registered: str
    view_sql: str
    input_seconds: float = 0.0
    pull: object = None  # connectors.remote.PullStats when the input came from storage nodes
    window: str | None = None  # the window's name when this is a window with PATTERN


def replace_identifiers(sql: str, mapping: dict[str, str], tokens: list | None = None) -> str:
    """Replace whole identifier tokens (placeholders) in DuckDB SQL (``tokens``: its DuckDB tokens, if read)."""
    if not mapping:
        return sql
    if tokens is None:
        tokens = tokenize(sql, "duckdb")
    edits = []
    for tok in tokens:
        text = sql[tok.start:tok.end + 1]
        if text in mapping and tok.token_type in (TokenType.VAR, TokenType.IDENTIFIER):
            edits.append((tok.start, tok.end + 1, mapping[text]))
    return rewrite(sql, edits)[0] if edits else sql


def cte_prefixes(split_query: SplitQuery, write: str = "duckdb") -> dict[str, str]:
    """For each clause placeholder, the WITH clause (SQL of ``write``) its input may need."""
    tokens = getattr(split_query, "tokens", None)
    if tokens is None:
        tokens = tokenize(split_query.text, split_query.dialect)
    if not any(t.token_type == TokenType.WITH for t in tokens):
        return {}
    try:
        tree = sqlglot.parse_one(split_query.text, read=split_query.dialect)
    except sqlglot.errors.SqlglotError:
        return {}  # DuckDB will report what is wrong when the statement runs
    prefixes: dict[str, str] = {}
    for clause in split_query.clauses:
        table = next((t for t in tree.find_all(exp.Table) if t.name == clause.placeholder), None)
        if table is None:
            continue
        try:
            wanted = {t.name.lower() for t in sqlglot.parse_one(f"SELECT * FROM {clause.input_text}",
                                                                 read=split_query.dialect).find_all(exp.Table)}
        except sqlglot.errors.SqlglotError:
            continue
        ctes: list[exp.CTE] = []
        recursive = False
        node, child = table.parent, table
        while node is not None:
            with_ = node.args.get("with_") or node.args.get("with")
            if isinstance(with_, exp.With):
                inside = child if isinstance(child, exp.CTE) else None
                for cte in with_.expressions:
                    if cte is inside:
                        break
                    ctes.append(cte)
                recursive = recursive or bool(with_.args.get("recursive"))
            node, child = node.parent, node
        by_name = {c.alias_or_name.lower(): c for c in ctes}
        needed: list[exp.CTE] = []
        stack = list(wanted)
        while stack:
            name = stack.pop()
            cte = by_name.get(name)
            if cte is None or cte in needed:
                continue
            needed.append(cte)
            stack += [t.name.lower() for t in cte.this.find_all(exp.Table)]
        if needed:
            ordered = [c for c in ctes if c in needed]
            ordered.reverse()  # collected innermost scope first; definitions must precede uses
            ordered.sort(key=lambda c: _cte_order(tree, c))
            body = ", ".join(c.sql(write) for c in ordered)
            prefixes[clause.placeholder] = ("WITH RECURSIVE " if recursive else "WITH ") + body + " "
    return prefixes


def _cte_order(tree, cte) -> int:
    for i, node in enumerate(tree.walk()):
        if node is cte:
            return i
    return 0
