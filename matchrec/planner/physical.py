"""The physical plan of one statement, MATCH_RECOGNIZE clause, window with PATTERN or CER query.

Planning builds it whole before anything runs - how the source is read (local read with the
columns and expressions pushed to DuckDB, storage-node pull strategy, Spark partitions), what is
filtered before matching (row filter, interval sets, join filters), which matcher runs with the
reason and the estimates behind the choice, and what the output is - and execution only reads it.
The type decisions of the compiled matcher are made here too (``decide_fast_path``: a pure
function of the plan, the fast plan and the kinds of the read columns, which planning obtains
with a DESCRIBE), so the read query is built once, from the decided fast plan.

EXPLAIN renders every form through ``PhysicalPlan.explain`` with the same section headings:
``logical:`` (source, partition, order, pattern, conditions, window, strategy, output) then
``physical:`` (source access, filtering, matcher with its reason and estimates, output).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol

from matchrec.parser import hidden as H
from matchrec.planner.fastpath import FastPlan
from matchrec.planner.logical import LogicalPlan

PHYSICAL_HEADINGS = ("source access", "filtering", "matcher", "output")


@dataclass(frozen=True)
class Section:
    """One heading of the physical part: a one-line summary and indented detail lines."""
    summary: str = ""
    details: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        return ([self.summary] if self.summary else []) + list(self.details)


@dataclass(frozen=True)
class MatcherChoice:
    """The matcher chosen, why, and the estimates the choice rests on.

    ``name`` is one of the compiled VM (``compiled``, ``compiled pre-filter``), ``reference``,
    the windows' per-row attempts (``window compiled``, ``window reference``), and the CER
    mechanisms (``batch``, ``chain``, ``tree``, ``rcep``, ``eager``)."""
    name: str
    summary: str  # what EXPLAIN shows after "matcher:"
    reason: str
    estimates: tuple[str, ...] = ()
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class PullPlan:
    """How a storage-node table is read for one clause: decided at planning, run at execution."""
    table: str
    strategy: str
    columns: tuple[str, ...]
    where: str | None
    intervals: Any  # planner.intervals.IntervalPlan or None
    registered: str  # the name the pulled rows are registered under


@dataclass(frozen=True)
class PhysicalPlan:
    """Everything execution needs to know about how a clause or a CER query runs; frozen once built."""
    title: str
    logical: LogicalPlan  # what the statement means (planner.logical)
    source_access: Section
    filtering: Section
    matcher: MatcherChoice
    output: Section
    fast: FastPlan | None = None  # the decided fast plan of the compiled matcher (MATCH_RECOGNIZE)
    read_sql: str | None = None  # the read query, built once from the decided plan
    input_sql: str | None = None  # the relation the read query reads (the pulled rows for a storage node)
    row_filter: str | None = None
    pull: PullPlan | None = None
    trailer: tuple[str, ...] = ()  # form-specific listings after the sections (the compiled program)

    def notes(self) -> list[str]:
        """The physical decisions as plain lines (source access, filtering, matcher)."""
        m = self.matcher
        return self.source_access.lines() + self.filtering.lines() + [f"matcher: {m.summary}"] + \
            ["  " + d for d in m.details]

    def explain(self) -> str:
        lines = [self.title, "logical:"]
        for heading, body in self.logical.sections():
            lines += _section(heading, body, 2)
        lines.append("physical:")
        lines += _section("source access", self.source_access.lines(), 2)
        lines += _section("filtering", self.filtering.lines(), 2)
        m = self.matcher
        lines.append(f"  matcher: {m.summary}")
        if m.reason:
            lines.append(f"    reason: {m.reason}")
        if m.estimates:
            lines.append(f"    estimates: {m.estimates[0]}")
            lines += [f"      {e}" for e in m.estimates[1:]]
        lines += [f"    {d}" for d in m.details]
        lines += _section("output", self.output.lines(), 2)
        lines += list(self.trailer)
        return "\n".join(lines)


def _section(heading: str, body, indent: int) -> list[str]:
    pad = " " * indent
    body = list(body)
    if not body:
        return [f"{pad}{heading}: none"]
    return [f"{pad}{heading}: {body[0]}"] + [f"{pad}  {b}" for b in body[1:]]


# ---------------------------------------------------------------- the compiled matcher's types
def probe_columns(plan, fp: FastPlan) -> list[tuple[str, str]]:
    """(name, DuckDB SQL) of the values whose types ``decide_fast_path`` needs besides the WITHIN key
    and bound: both sides of every register comparison, every register program's leaves."""
    cols = []
    for k, c in enumerate(fp.compares):
        cols.append((H.compare_current(k), c.current_sql))
        cols.append((H.compare_other(k), c.other_sql))
    for k, leaf in enumerate(leaf for prog in fp.programs for leaf in prog.leaves):
        cols.append((H.leaf(k), leaf.sql))
    return cols


class KindRules(Protocol):
    """How the compiled matcher compares values of given Arrow types (``engine.fast``'s rules):
    each answers the kind ('int', 'float', ...) it compares them as, or None when it cannot."""

    def within(self, key: Any, end: Any) -> str | None: ...

    def compare(self, current: Any, other: Any) -> str | None: ...

    def program(self, prog: Any, types: list, aggregates: list) -> list | None: ...


def decide_fast_path(plan, fp: FastPlan, types: dict[str, Any], rules: KindRules) -> tuple[FastPlan | None, str]:
    """The fast plan with the comparisons and programs the compiled matcher cannot evaluate moved
    to the residual, and the kind of every value it compares set; ``types`` maps the probed columns
    (``probe_columns``, and ``H.WITHIN_KEY``/``H.WITHIN_END`` under WITHIN) to their Arrow types,
    ``rules`` says how the matcher compares them. ``fp`` itself is not changed.

    Returns (None, why) when the compiled matcher cannot run at all (a WITHIN bound it cannot
    compare)."""
    if plan.within_sql is not None and rules.within(types[H.WITHIN_KEY], types[H.WITHIN_END]) is None:
        return None, "the WITHIN bound is not an integer, float or time"
    out = copy.deepcopy(fp)
    kept = []
    for k, c in enumerate(out.compares):
        kind = rules.compare(types[H.compare_current(k)], types[H.compare_other(k)])
        if kind is None:
            out.residual.append(f"{plan.labels[c.label]}: {c.current_sql} vs {c.other_sql} (types not compared exactly)")
        else:
            c.kind = kind
            kept.append(c)
    out.compares = kept
    programs, k = [], 0
    for prog in out.programs:
        kinds = rules.program(prog, [types[H.leaf(k + j)] for j in range(len(prog.leaves))], out.aggregates)
        k += len(prog.leaves)
        if kinds is None:
            out.residual.append(f"{plan.labels[prog.label]}: {prog.text} (reads values that are not numbers or times, "
                                "or mixes DECIMALs with floats)")
            continue
        for leaf, kind in zip(prog.leaves, kinds):
            leaf.kind = kind
        programs.append(prog)
    out.programs = programs
    return out, ""


# ---------------------------------------------------------------- the matcher choice
@dataclass(frozen=True)
class Semantics:
    """What the matcher choice rests on, whatever the statement's form."""
    form: str  # "match_recognize", "window" or "cer"
    labels: tuple[str, ...] = ()  # MATCH_RECOGNIZE: the pattern variables
    compiled: FastPlan | None = None  # MATCH_RECOGNIZE: the decided fast plan (None: not compilable)
    not_compiled: str = ""  # why not, when known
    mechanism: str = ""  # CER: the mechanism the CER planner chose
    order: tuple[str, ...] | None = None
    mechanism_reason: str = ""
    estimates: tuple[str, ...] = field(default_factory=tuple)


def choose_matcher(sem: Semantics) -> MatcherChoice:
    """The matcher of a statement from its semantics and estimates (not from the door it came by).

    MATCH_RECOGNIZE and windows: the compiled Pike VM whenever the decided fast plan exists (as
    the exact matcher without residual conditions, else as a pre-filter of start rows), the
    reference matcher otherwise. CER: the mechanism its planner chose from the estimates
    (``planner.cer.choice``), shown with its order."""
    if sem.form == "cer":
        order = f", order {', '.join(sem.order)}" if sem.order else ""
        return MatcherChoice(sem.mechanism, f"mechanism {sem.mechanism}{order}", sem.mechanism_reason,
                             sem.estimates)
    fp = sem.compiled
    if sem.form == "window":
        if fp is None:
            return MatcherChoice("window reference", "reference",
                                 "one match attempt per row, in its frame" +
                                 (f"; {sem.not_compiled}" if sem.not_compiled else ""), sem.estimates)
        return MatcherChoice("window compiled", "compiled, each start bounded by its frame end (the reference decides what SEEK cannot reuse)",
                             "one match attempt per row, in its frame", sem.estimates)
    if fp is None:
        return MatcherChoice("reference", "reference" + (f" ({sem.not_compiled})" if sem.not_compiled else ""),
                             "the compiled matcher cannot run this clause" if sem.not_compiled else
                             "DEFINE or the pattern uses forms the compiled matcher does not have", sem.estimates)
    lines = fp_lines(fp, sem)
    if fp.exact:
        return MatcherChoice("compiled", lines[0], "every DEFINE compiles to per-row conditions in DuckDB, register "
                             "comparisons and register programs", sem.estimates, tuple(lines[1:]))
    shown = "; ".join(fp.residual[:3]) + ("; ..." if len(fp.residual) > 3 else "")
    return MatcherChoice("compiled pre-filter", lines[0], f"some conditions are residual ({shown}): the compiled "
                         "matcher finds the start rows where a match is possible, the reference matcher decides there",
                         sem.estimates, tuple(lines[1:]))


def fp_lines(fp: FastPlan, sem: Semantics) -> list[str]:
    """The fast plan's own description: its matcher line without the heading, then its parts."""
    lines = fp.describe(list(sem.labels))
    return [lines[0].removeprefix("matcher: ")] + [line.removeprefix("  ") for line in lines[1:]]
