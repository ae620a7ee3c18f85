"""A brute-force reference implementation of SQL:2016 row pattern matching (Trino semantics).

This module owns the *oracle* the differential tests compare matchrec against. It is
deliberately naive: the preferred match at a start row is the first complete path of a
depth-first, backtracking search over the pattern AST of ``matchrec.parser.spec``, written
as recursive generators in continuation-passing style (a generator yields in preference
order, so "the first result" is "the preferred match"). Inputs are tiny (about ten rows),
so exponential search is fine.

API
  find_match(pattern, n, start, cond) -> (labels, excluded) | None
  run_partition(pattern, n, cond, rows_per_match, empty_matches, skip, subsets) -> outputs
  letter_cond(rows)      a ``cond`` for hand-written tests: row i satisfies the letters rows[i]
  parse_pattern(text)    PATTERN text -> AST, so tests can be written as text
  SkipError              the runtime errors of AFTER MATCH SKIP TO
  BudgetExceeded         raised when an optional step budget runs out

``cond(var, labels, start, row) -> bool`` evaluates the DEFINE condition of ``var`` at
``row``; ``labels`` are the labels of rows start..row, the current row tentatively labelled
``var`` (running semantics).

EMPTY ITERATIONS. Backtracking alone never ends on ``(A*)*``, so iterations of a quantifier
that consume no row need a rule; the observable results depend on it. ``empty_iterations``:

  "trino" (default) - what Trino computes. Trino unrolls a bounded quantifier into copies
      and compiles ``X{m,}`` as m copies of X (one copy when m = 0) whose last copy loops
      back to itself; its matcher drops a thread that reaches an instruction already reached
      at the same row with the same labels. In terms of iterations: bounded quantifiers may
      have any number of empty iterations; in an unbounded one, let p = max(min, 1):
      iterations before the p-th may be empty, an empty p-th iteration ends the loop (only
      "stop" remains), and an empty iteration after the p-th is a failed path.
      (Checked against a Pike VM with Trino's program layout on 25,000 random patterns.)
  "fail" - an optional iteration (count > min) that consumes no row is a failed path,
      mandatory ones may be empty. Simpler, but differs from Trino (letter_cond data):
      ``(A? | B)*`` on "BA" matches B A, not an empty match at row 0 and then A;
      ``(D*?)+`` on "DDD" matches D D D, not three empty matches;
      ``(A? | B){1,3}`` on "AB" matches A B, not A and then an empty match.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable, Iterator

from matchrec.parser.spec import (Alternation, Anchor, Concat, EmptyPattern,
                                  Exclusion, Label, PatternNode, Permute, Quantified, Span)

Cond = Callable[[str, tuple, int, int], bool]
Result = tuple[tuple[str, ...], frozenset]  # (labels of rows start.., excluded row indexes)
S = Span(0, 0)


class SkipError(Exception):
    """AFTER MATCH SKIP TO <var> found no target row, or would skip to the match's first row."""


class BudgetExceeded(Exception):
    """The search took more than ``budget`` steps (pathological patterns such as ((A|A)*)*)."""


def find_match(pattern: PatternNode, n: int, start: int, cond: Cond | None = None,
               budget: int | None = None, empty_iterations: str = "trino") -> Result | None:
    """The preferred match of ``pattern`` starting at row ``start`` of an n-row partition.

    ``budget`` bounds the number of search steps (BudgetExceeded beyond it);
    ``empty_iterations`` is "trino" or "fail" (see the module docstring)."""
    cond = cond or (lambda var, labels, start, row: True)
    Cont = Callable[[tuple, frozenset], Iterator[Result]]
    steps = 0

    # Every path state is (labels, excluded); the current position is start + len(labels).
    def match(node: PatternNode, labels: tuple, excl: frozenset, k: Cont) -> Iterator[Result]:
        nonlocal steps
        steps += 1
        if budget is not None and steps > budget:
            raise BudgetExceeded(f"more than {budget} steps")
        pos = start + len(labels)
        if isinstance(node, Label):
            if pos < n and cond(node.name, labels + (node.name,), start, pos):
                yield from k(labels + (node.name,), excl)
        elif isinstance(node, EmptyPattern):
            yield from k(labels, excl)
        elif isinstance(node, Anchor):
            if pos == (0 if node.kind == "start" else n):
                yield from k(labels, excl)
        elif isinstance(node, Concat):
            yield from sequence(node.items, labels, excl, k)
        elif isinstance(node, Alternation):
            for item in node.items:
                yield from match(item, labels, excl, k)
        elif isinstance(node, Permute):
            for order in itertools.permutations(node.items):
                yield from sequence(order, labels, excl, k)
        elif isinstance(node, Exclusion):
            def exclude(l2: tuple, e2: frozenset) -> Iterator[Result]:
                return k(l2, e2 | {start + i for i in range(len(labels), len(l2))})
            yield from match(node.body, labels, excl, exclude)
        elif isinstance(node, Quantified):
            yield from loop(node, 0, labels, excl, k)
        else:
            raise TypeError(node)

    def sequence(items, labels, excl, k: Cont) -> Iterator[Result]:
        if not items:
            yield from k(labels, excl)
        else:
            yield from match(items[0], labels, excl,
                             lambda l2, e2: sequence(items[1:], l2, e2, k))

    def loop(node: Quantified, count: int, labels, excl, k: Cont,
             exit_only: bool = False) -> Iterator[Result]:
        """``count`` iterations are done; ``exit_only``: the loop may not iterate again."""
        def more() -> Iterator[Result]:
            if exit_only or (node.max is not None and count >= node.max):
                return

            def next_iteration(l2: tuple, e2: frozenset) -> Iterator[Result]:
                it = count + 1  # the iteration just completed
                if len(l2) > len(labels):
                    return loop(node, it, l2, e2, k)
                if empty_iterations == "fail":
                    return loop(node, it, l2, e2, k) if it <= node.min else iter(())
                # "trino", see EMPTY ITERATIONS above
                pivot = max(node.min, 1)
                if node.max is not None or it < pivot:
                    return loop(node, it, l2, e2, k)
                return loop(node, it, l2, e2, k, exit_only=True) if it == pivot else iter(())
            yield from match(node.body, labels, excl, next_iteration)

        def stop() -> Iterator[Result]:
            if count >= node.min:
                yield from k(labels, excl)

        for option in ((more, stop) if node.greedy else (stop, more)):
            yield from option()

    done = lambda labels, excl: iter([(labels, excl)])  # noqa: E731
    return next(match(pattern, (), frozenset(), done), None)


def run_partition(pattern: PatternNode, n: int, cond: Cond | None = None,
                  rows_per_match: str = "all", empty_matches: str = "show",
                  skip: tuple[str, str | None] | str = "past_last",
                  subsets: dict[str, tuple[str, ...]] | None = None,
                  budget: int | None = None, empty_iterations: str = "trino") -> list[tuple]:
    """Output rows of one partition: (row index | None, match number | None, classifier | None).

    rows_per_match: "one" | "all"; empty_matches: "show" | "omit" | "unmatched";
    skip: "past_last" | "next_row" | ("to_first", var) | ("to_last", var).
    ONE ROW PER MATCH outputs (None, match number, label of the match's last row).
    Raises SkipError like the engine must fail the query; ``budget`` is per start row.
    """
    kind, var = (skip, None) if isinstance(skip, str) else skip
    out: list[tuple] = []
    number, pos, last_matched = 1, 0, -1
    while pos < n:
        found = find_match(pattern, n, pos, cond, budget, empty_iterations)
        if found is None:
            if rows_per_match == "all" and empty_matches == "unmatched" and pos > last_matched:
                out.append((pos, None, None))
            pos += 1
            continue
        labels, excluded = found
        if rows_per_match == "one":
            out.append((None, number, labels[-1] if labels else None))
        elif not labels:
            if empty_matches != "omit":
                out.append((pos, number, None))
        else:
            out.extend((pos + i, number, label) for i, label in enumerate(labels)
                       if pos + i not in excluded)
        number += 1
        if not labels:
            pos += 1
            continue
        end = pos + len(labels) - 1
        last_matched = max(last_matched, end)
        pos = _skip_target(kind, var, pos, end, labels, subsets or {})
    return out


def _skip_target(kind, var, start, end, labels, subsets) -> int:
    if kind == "past_last":
        return end + 1
    if kind == "next_row":
        return start + 1
    names = set(subsets.get(var, (var,)))
    rows = [start + i for i, label in enumerate(labels) if label in names]
    if not rows:
        raise SkipError("pattern variable is not present in match")
    target = rows[0] if kind == "to_first" else rows[-1]
    if target == start:
        raise SkipError("cannot skip to first row of match")
    return target


def letter_cond(rows) -> Cond:
    """``cond`` for compact tests: ``rows[i]`` (e.g. "AABBC" or ["AB", "", "C"]) lists the
    variables row i satisfies; variables not mentioned anywhere in ``rows`` are always true."""
    mentioned = set("".join(rows))
    return lambda var, labels, start, row: var not in mentioned or var in rows[row]


# ---------------------------------------------------------------- pattern text -> AST
_TOKEN = re.compile(r"\s*(PERMUTE|\{-|-\}|\{\s*\d*\s*(?:,\s*\d*\s*)?\}|[A-Za-z_]\w*|[()|^$*+?,])")


def parse_pattern(text: str) -> PatternNode:
    """Parse PATTERN text (no outer parentheses) into the spec AST. Test convenience only."""
    tokens, at = [], 0
    while text[at:].strip():
        m = _TOKEN.match(text, at)
        if not m:
            raise ValueError(f"bad pattern at {text[at:]!r}")
        tokens.append(m.group(1))
        at = m.end()
    tokens.append("<end>")
    i = 0

    def peek() -> str:
        return tokens[i]

    def take(expected: str | None = None) -> str:
        nonlocal i
        tok = tokens[i]
        if expected is not None and tok != expected:
            raise ValueError(f"expected {expected!r}, got {tok!r} in {text!r}")
        i += 1
        return tok

    def alternation() -> PatternNode:
        items = [concat()]
        while peek() == "|":
            take()
            items.append(concat())
        return items[0] if len(items) == 1 else Alternation(span=S, items=tuple(items))

    def concat() -> PatternNode:
        items = []
        while peek() not in ("|", ")", "-}", ",", "<end>"):
            items.append(quantified())
        if not items:
            return EmptyPattern(span=S)
        return items[0] if len(items) == 1 else Concat(span=S, items=tuple(items))

    def quantified() -> PatternNode:
        node = primary()
        while peek() in ("*", "+", "?") or peek().startswith("{") and peek() != "{-":
            tok = take()
            if tok == "*":
                lo, hi = 0, None
            elif tok == "+":
                lo, hi = 1, None
            elif tok == "?":
                lo, hi = 0, 1
            else:
                parts = [p.strip() for p in tok[1:-1].split(",")]
                lo = int(parts[0] or 0)
                hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
            greedy = True
            if peek() == "?":
                take()
                greedy = False
            node = Quantified(span=S, body=node, min=lo, max=hi, greedy=greedy)
        return node

    def primary() -> PatternNode:
        tok = take()
        if tok == "(":
            node = alternation()
            take(")")
            return node
        if tok == "{-":
            node = alternation()
            take("-}")
            return Exclusion(span=S, body=node)
        if tok in ("^", "$"):
            return Anchor(span=S, kind="start" if tok == "^" else "end")
        if tok == "PERMUTE":
            take("(")
            items = [alternation()]
            while peek() == ",":
                take()
                items.append(alternation())
            take(")")
            return Permute(span=S, items=tuple(items))
        if re.fullmatch(r"[A-Za-z_]\w*", tok):
            return Label(span=S, name=tok.upper())
        raise ValueError(f"unexpected {tok!r} in {text!r}")

    node = alternation()
    take("<end>")
    return node
