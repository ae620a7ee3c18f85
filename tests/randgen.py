"""Seeded random MATCH_RECOGNIZE cases for the differential tests.

This module owns the random generators: patterns over the variables A..D using every
construct of the pattern AST, tiny tables ``(id, c)`` (optionally ``(p, id, c)``, with
PARTITION BY p) where ``c`` is a subset of the letters 'ABCD', DEFINE conditions written
twice (DuckDB SQL and an equivalent Python function with SQL's three-valued logic), the
ROWS PER MATCH / AFTER MATCH SKIP / SUBSET options, and ``Case``, which renders the query
and computes the expected rows with the brute force of ``bruteforce.py``.

API
  random_case(seed_or_rng) -> Case        Case.sql(), Case.expected(budget), Case.columns
  random_pattern(rng, depth)              a pattern AST (render with pattern_to_text)
  random_rows(rng, partitioned)           [(p, id, c)], p is 1 when not partitioned
  random_condition(rng, var, names)       a Cond(sql, fn)
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

from bruteforce import run_partition
from matchrec.parser.spec import (Alternation, Anchor, Concat, EmptyPattern, Exclusion, Label,
                                  PatternNode, Permute, Quantified, Span, pattern_labels,
                                  pattern_to_text)

S = Span(0, 0)
LETTERS = "ABCD"


# ---------------------------------------------------------------- patterns
def random_quantifier(rng: random.Random) -> tuple[int, int | None]:
    """(min, max); max >= 1 always, as Trino rejects an upper bound of 0."""
    kind = rng.choice(["*", "+", "?", "{n}", "{n,}", "{,m}", "{n,m}"])
    if kind == "*":
        return 0, None
    if kind == "+":
        return 1, None
    if kind == "?":
        return 0, 1
    if kind == "{n}":
        n = rng.randint(1, 3)
        return n, n
    if kind == "{n,}":
        return rng.randint(0, 3), None
    if kind == "{,m}":
        return 0, rng.randint(1, 3)
    lo = rng.randint(0, 2)
    return lo, max(lo + rng.randint(0, 2), 1)


def random_pattern(rng: random.Random, depth: int = 3, *, in_exclusion: bool = False,
                   loops: int = 0) -> PatternNode:
    """``loops`` counts enclosing quantifiers: at most two are nested, which keeps the
    brute force's backtracking (exponential in nesting) affordable."""
    if depth <= 0 or rng.random() < 0.3:
        r = rng.random()
        if r < 0.06:
            return EmptyPattern(span=S)
        if r < 0.1:
            return Anchor(span=S, kind=rng.choice(["start", "end"]))
        return Label(span=S, name=rng.choice(LETTERS))
    kinds = ["concat"] * 3 + ["alt"] * 2 + ["permute"]
    kinds += ["quant"] * 3 if loops < 2 else []
    kinds += [] if in_exclusion else ["excl"]
    kind = rng.choice(kinds)

    def sub(**kw) -> PatternNode:
        return random_pattern(rng, depth - 1, in_exclusion=kw.get("in_exclusion", in_exclusion),
                              loops=kw.get("loops", loops))

    if kind == "quant":
        lo, hi = random_quantifier(rng)
        body = sub(loops=loops + 1)
        if hi is None and nullable(body) and _prefers_skipping(body):
            # Trino's matcher drops a thread that reaches an instruction a thread of the same
            # row already reached; in a loop whose body can match nothing, the second visit can
            # come from a *higher*-priority path (the next iteration) than the first. Trino, and
            # matchrec after it, then keep the lower-priority labelling, which pure priority
            # order (the brute force) does not; e.g. (A? D??)+ over rows where the second A
            # fails. Keep the generated patterns clear of that corner: bound such a loop.
            hi = lo + 2 if lo else 2
        return Quantified(span=S, body=body, min=lo, max=hi, greedy=rng.random() < 0.7)
    if kind == "excl":
        return Exclusion(span=S, body=sub(in_exclusion=True))
    items = tuple(sub() for _ in range(rng.randint(2, 3)))
    if kind == "concat":
        return Concat(span=S, items=items)
    if kind == "alt":
        return Alternation(span=S, items=items)
    return Permute(span=S, items=items)


def nullable(node: PatternNode) -> bool:
    """Whether the pattern can match zero rows."""
    if isinstance(node, Label):
        return False
    if isinstance(node, (EmptyPattern, Anchor)):
        return True
    if isinstance(node, Quantified):
        return node.min == 0 or nullable(node.body)
    if isinstance(node, Exclusion):
        return nullable(node.body)
    if isinstance(node, Alternation):
        return any(nullable(i) for i in node.items)
    return all(nullable(i) for i in node.items)  # Concat, Permute


def _prefers_skipping(node: PatternNode) -> bool:
    """Whether some consuming branch has lower priority than a branch that consumes less."""
    if isinstance(node, Quantified) and not node.greedy:
        return True
    if isinstance(node, (Alternation, Permute)):
        return True
    children = list(getattr(node, "items", ()) or ())
    if getattr(node, "body", None) is not None:
        children.append(node.body)
    return any(_prefers_skipping(c) for c in children)


def has_exclusion(node: PatternNode) -> bool:
    if isinstance(node, Exclusion):
        return True
    children = list(getattr(node, "items", ()) or ())
    if getattr(node, "body", None) is not None:
        children.append(node.body)
    return any(has_exclusion(c) for c in children)


# ---------------------------------------------------------------- data
def random_rows(rng: random.Random, partitioned: bool = False) -> list[tuple[int, int, str]]:
    n = rng.choice([0, 1] + list(range(2, 11)) * 2)
    return [(rng.randint(1, 3) if partitioned else 1, i + 1,
             "".join(x for x in LETTERS if rng.random() < 0.6)) for i in range(n)]


# ---------------------------------------------------------------- DEFINE conditions
# fn(rows, labels, start, row) -> True | False | None (SQL NULL); rows are the partition's
# (id, c) in order, labels those of rows start..row (the current row included).
Fn = Callable[[list, tuple, int, int], "bool | None"]


@dataclass(frozen=True)
class Cond:
    sql: str
    fn: Fn = field(compare=False)


def _cmp(a, b, op: str):
    if a is None or b is None:
        return None
    return {"=": a == b, "<>": a != b, "<=": a <= b, ">=": a >= b, ">": a > b, "<": a < b}[op]


def _contains(value, letter):
    return None if value is None else letter in value


def _not(c: Cond) -> Cond:
    return Cond(f"NOT ({c.sql})", lambda *a: None if (v := c.fn(*a)) is None else not v)


def _and(x: Cond, y: Cond) -> Cond:
    def fn(*a):
        u, v = x.fn(*a), y.fn(*a)
        return False if u is False or v is False else None if u is None or v is None else True
    return Cond(f"({x.sql}) AND ({y.sql})", fn)


def _or(x: Cond, y: Cond) -> Cond:
    def fn(*a):
        u, v = x.fn(*a), y.fn(*a)
        return True if u is True or v is True else None if u is None or v is None else False
    return Cond(f"({x.sql}) OR ({y.sql})", fn)


def _rows_of(names: frozenset | None, labels: tuple, start: int) -> list[int]:
    """Row indexes of the match so far labelled with one of ``names`` (None: every row)."""
    return [start + i for i, label in enumerate(labels) if names is None or label in names]


def random_atom(rng: random.Random, names: dict[str, frozenset]) -> Cond:
    """One condition; ``names`` maps each pattern variable / subset name to its members."""
    x = rng.choice(LETTERS)
    var = rng.choice(sorted(names))
    members = names[var]
    k = rng.randint(0, 2)
    kind = rng.randrange(13)
    if kind == 0:
        return Cond(f"contains(c, '{x}')", lambda rows, l, s, r: x in rows[r][1])
    if kind == 1:  # physical navigation may leave the match, never the partition
        back = max(k, 1)
        sql = "PREV(c)" if back == 1 else f"PREV(c, {back})"
        return Cond(f"contains({sql}, '{x}')",
                    lambda rows, l, s, r: _contains(rows[r - back][1] if r >= back else None, x))
    if kind == 2:
        return Cond(f"contains(NEXT(c), '{x}')",
                    lambda rows, l, s, r: _contains(rows[r + 1][1] if r + 1 < len(rows) else None, x))
    if kind == 3:
        op = rng.choice(["=", "<>"])
        return Cond(f"PREV(c) {op} c",
                    lambda rows, l, s, r: _cmp(rows[r - 1][1] if r > 0 else None, rows[r][1], op))
    if kind == 4:
        op = rng.choice(["<=", ">=", "="])
        return Cond(f"count({var}.*) {op} {k + 1}",
                    lambda rows, l, s, r: _cmp(len(_rows_of(members, l, s)), k + 1, op))
    if kind == 5:
        op = rng.choice(["<=", ">="])
        return Cond(f"count(*) {op} {k + 2}", lambda rows, l, s, r: _cmp(len(l), k + 2, op))
    if kind == 6:
        def after_last(rows, l, s, r):
            hits = _rows_of(members, l, s)
            return _cmp(rows[r][0], rows[hits[-1]][0] + k if hits else None, ">")
        return Cond(f"id > LAST({var}.id) + {k}", after_last)
    if kind == 7:
        neg = rng.random() < 0.5
        return Cond(f"{var}.id IS {'NOT ' if neg else ''}NULL",
                    lambda rows, l, s, r: bool(_rows_of(members, l, s)) == neg)
    if kind == 8:  # logical navigation, running semantics: only rows up to the current one
        first = rng.random() < 0.5
        target = var if rng.random() < 0.7 else None  # None: the universal variable
        ref = f"{target}.c" if target else "c"

        def nav(rows, l, s):
            hits = _rows_of(members if target else None, l, s)
            return None if k >= len(hits) else rows[hits[k] if first else hits[-1 - k]][1]
        return Cond(f"contains({'FIRST' if first else 'LAST'}({ref}, {k}), '{x}')",
                    lambda rows, l, s, r: _contains(nav(rows, l, s), x))
    if kind == 9:
        return Cond(f"id - FIRST(id) <= {k + 1}",
                    lambda rows, l, s, r: rows[r][0] - rows[s][0] <= k + 1)
    if kind == 10:
        v = rng.choice(sorted(n for n, m in names.items() if m == frozenset([n])))
        op = rng.choice(["=", "<>"])
        return Cond(f"PREV(CLASSIFIER()) {op} '{v}'",
                    lambda rows, l, s, r: _cmp(l[-2] if len(l) >= 2 else None, v, op))
    if kind == 11:
        return Cond("PREV(CLASSIFIER()) IS NULL", lambda rows, l, s, r: len(l) == 1)
    value = "".join(y for y in LETTERS if rng.random() < 0.4)
    return Cond(f"c = '{value}'", lambda rows, l, s, r: rows[r][1] == value)


def random_condition(rng: random.Random, var: str, names: dict[str, frozenset]) -> Cond:
    """A DEFINE condition for ``var``; usually 'row has the letter of var' and more."""
    own = Cond(f"contains(c, '{var}')", lambda rows, l, s, r: var in rows[r][1])
    r = rng.random()
    if r < 0.25:
        return own
    other = random_atom(rng, names)
    if rng.random() < 0.15:
        other = _not(other)
    if rng.random() < 0.2:
        other = (_and if rng.random() < 0.5 else _or)(other, random_atom(rng, names))
    if r < 0.6:
        return _and(own, other)
    return other if r < 0.85 else _or(own, other)


# ---------------------------------------------------------------- whole cases
@dataclass
class Case:
    pattern: PatternNode
    rows: list[tuple[int, int, str]]  # (p, id, c), ids unique
    defines: dict[str, Cond]
    subsets: dict[str, tuple[str, ...]]
    rows_per_match: str  # "one" | "all"
    empty_matches: str  # "show" | "omit" | "unmatched"; "" for the default of ALL ROWS
    skip: tuple[str, str | None]  # ("past_last"|"next_row"|"to_first"|"to_last"|"to", var)
    partitioned: bool
    short_braces: bool = False  # spell {0,m} as {,m}

    @property
    def columns(self) -> list[str]:
        cols = ["mn", "cls"] if self.rows_per_match == "one" else ["id", "mn", "cls"]
        return (["p"] if self.partitioned else []) + cols

    def pattern_sql(self) -> str:
        text = pattern_to_text(self.pattern)
        return re.sub(r"\{0,(\d+)\}", r"{,\1}", text) if self.short_braces else text

    def sql(self) -> str:
        if self.rows:
            values = ", ".join((f"({p}, {i}, '{c}')" if self.partitioned else f"({i}, '{c}')")
                               for p, i, c in self.rows)
        else:
            values = "SELECT * FROM (VALUES (1, 1, 'x')) v(p, id, c) WHERE false" \
                if self.partitioned else "SELECT * FROM (VALUES (1, 'x')) v(id, c) WHERE false"
        source = f"(VALUES {values})" if self.rows else f"({values})"
        source += " t(p, id, c)" if self.partitioned else " t(id, c)"
        per_match = "ONE ROW PER MATCH" if self.rows_per_match == "one" else "ALL ROWS PER MATCH" + {
            "": "", "show": " SHOW EMPTY MATCHES", "omit": " OMIT EMPTY MATCHES",
            "unmatched": " WITH UNMATCHED ROWS"}[self.empty_matches]
        kind, var = self.skip
        skip = {"past_last": "PAST LAST ROW", "next_row": "TO NEXT ROW", "to_first": f"TO FIRST {var}",
                "to_last": f"TO LAST {var}", "to": f"TO {var}"}[kind]
        lines = [f"SELECT {', '.join(self.columns)} FROM {source} MATCH_RECOGNIZE ("]
        if self.partitioned:
            lines.append("  PARTITION BY p")
        lines += ["  ORDER BY id", "  MEASURES MATCH_NUMBER() AS mn, CLASSIFIER() AS cls",
                  f"  {per_match}", f"  AFTER MATCH SKIP {skip}", f"  PATTERN ({self.pattern_sql()})"]
        if self.subsets:
            lines.append("  SUBSET " + ", ".join(f"{name} = ({', '.join(members)})"
                                                 for name, members in self.subsets.items()))
        lines.append("  DEFINE " + ",\n         ".join(f"{v} AS {c.sql}" for v, c in self.defines.items()))
        lines.append(") AS m")
        return "\n".join(lines)

    def expected(self, budget: int | None = None) -> list[tuple]:
        """The rows the query must return (sorted); raises bruteforce.SkipError when the
        query must fail, BudgetExceeded when the brute force gives up."""
        kind, var = self.skip
        skip = (("to_last" if kind == "to" else kind), var)
        empty = self.empty_matches or "show"
        out = []
        for p in sorted({p for p, _, _ in self.rows}):
            part = [(i, c) for q, i, c in self.rows if q == p]  # already ordered by id

            def cond(v, labels, start, row, part=part):
                c = self.defines.get(v)
                return c is None or c.fn(part, labels, start, row) is True
            for row, mn, cls in run_partition(self.pattern, len(part), cond, self.rows_per_match,
                                              empty, skip, self.subsets, budget):
                values = (mn, cls) if self.rows_per_match == "one" else (part[row][0], mn, cls)
                out.append(((p,) if self.partitioned else ()) + values)
        return sort_rows(out)


def sort_rows(rows) -> list[tuple]:
    return sorted((tuple(r) for r in rows), key=lambda r: [(x is None, x) for x in r])


def random_case(seed: int | random.Random) -> Case:
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)
    pattern = random_pattern(rng)
    while not pattern_labels(pattern):  # DEFINE needs at least one variable
        pattern = random_pattern(rng)
    labels = pattern_labels(pattern)
    subsets: dict[str, tuple[str, ...]] = {}
    for name in ("U", "V")[:rng.choice([0, 0, 1, 2])]:
        subsets[name] = tuple(sorted(rng.sample(labels, rng.randint(1, len(labels)))))
    names = {v: frozenset([v]) for v in labels} | {n: frozenset(m) for n, m in subsets.items()}
    defined = [v for v in labels if rng.random() < 0.8] or [rng.choice(labels)]
    defines = {v: random_condition(rng, v, names) for v in defined}
    rows_per_match = "one" if rng.random() < 0.25 else "all"
    empty = rng.choice(["", "show", "omit", "unmatched"])
    if empty == "unmatched" and has_exclusion(pattern):  # disallowed by the standard
        empty = "show"
    r = rng.random()
    if r < 0.4:
        skip = ("past_last", None)
    elif r < 0.7:
        skip = ("next_row", None)
    else:
        skip = (rng.choice(["to_first", "to_last", "to"]), rng.choice(sorted(names)))
    partitioned = rng.random() < 0.3
    return Case(pattern, random_rows(rng, partitioned), defines, subsets, rows_per_match,
                empty if rows_per_match == "all" else "", skip, partitioned,
                short_braces=rng.random() < 0.5)
