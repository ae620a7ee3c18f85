"""Which rows of a MATCH_RECOGNIZE input may be left where they are: time interval filtering.

With ``WITHIN w`` every row of a match lies within ``w`` of every other row of it. For a
variable that occurs in every match (a *mandatory* variable), every match therefore lies inside
``[t - w, t + w]`` around some candidate row of that variable (a row where its row-level
condition holds); inside ``[t, t + w]`` when the variable always starts the match, ``[t - w, t]``
when it always ends it. Intersecting these sets over the mandatory variables gives a time
interval set (TIS) that holds every row of every match, together with all rows between them.

Reading only the rows inside the TIS keeps the result when the rows outside cannot be observed:

* no PREV/NEXT (they see physical neighbours, which may lie outside) and no anchors;
* no empty matches and no WITH UNMATCHED ROWS (they output rows that belong to no match);
* the rows dropped contain no row of any match, so every match of the full input is a match
  of the filtered input with the same rows; and every match of the filtered input spans rows
  that are all inside the TIS, so it is one of the full input too. Preferment compares label
  sequences over the same rows, so the chosen matches and their order are the same.

An equality ``M.x = B.y`` in M's condition (``B.y`` read at the last B row, which precedes the
current row in the match) is a necessary condition of each M row: some B row with the same
value lies in ``[t - w, t]``. The window-wise join filter checks exactly that, without false
negatives, when the comparison fails for a match without a B row (the register's null value
makes it false). When B takes at most one row of a match and M is in every match, the converse
holds too: every M row of the match reads that one B row, so a B row needs some M row with the
same value in ``[t, t + w]`` - the same filter probed the other way (``at_most_once``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from matchrec.operators import expr as ir
from matchrec.operators import vm
from matchrec.operators.program import DONE, MATCH
from matchrec.parser import hidden as H
from matchrec.parser import spec as S
from matchrec.parser.names import quote_ident
from matchrec.planner.fastpath import FastPlan
from matchrec.planner.plan import Plan
from matchrec.planner.prefilter import always_true, has_anchor, row_filter


@dataclass
class JoinCondition:
    """``current = other``, ``other`` read at the last row of ``sources``."""
    current_sql: str
    other_sql: str
    sources: frozenset[int]  # labels whose rows give the other side
    common_type: str
    source_condition: str  # row-level condition every row of those labels meets


@dataclass
class VariableIntervals:
    label: int
    name: str
    condition: str  # DuckDB SQL over the input columns: the row-level part of the DEFINE
    before: int  # a match can start this long before a candidate row
    after: int  # ... and end this long after it
    joins: list[JoinCondition] = field(default_factory=list)
    at_most_once: bool = False  # takes at most one row of a match


@dataclass
class IntervalPlan:
    key_sql: str  # the first ORDER BY key as a BIGINT (epoch microseconds for times)
    key_name: str
    window: int  # WITHIN in the units of key_sql
    partition_sql: list[str]  # partition columns (quoted)
    variables: list[VariableIntervals]  # mandatory variables with a row-level condition
    row_filter: str | None  # rows only gap variables can take are dropped too (planner.prefilter)
    filter_labels: list[int] | None = None  # the variables whose conditions row_filter ORs

    def describe(self) -> list[str]:
        lines = [f"time interval filter on {self.key_name} (window {self.window})"]
        for v in self.variables:
            joins = "".join(f"; join filter {j.current_sql} = {j.other_sql} of rows where {j.source_condition}"
                            for j in v.joins)
            lines.append(f"  {v.name}: {v.condition} -> [t - {v.before}, t + {v.after}]{joins}")
        return lines


def _mandatory(node: S.PatternNode) -> set[str]:
    if isinstance(node, S.Label):
        return {node.name}
    if isinstance(node, (S.Concat, S.Permute)):
        out: set[str] = set()
        for item in node.items:
            out |= _mandatory(item)
        return out
    if isinstance(node, S.Alternation):
        sets = [_mandatory(i) for i in node.items]
        return set.intersection(*sets) if sets else set()
    if isinstance(node, S.Quantified):
        return _mandatory(node.body) if node.min >= 1 else set()
    if isinstance(node, S.Exclusion):
        return _mandatory(node.body)
    return set()


def _max_rows(node: S.PatternNode, name: str) -> float:
    """The most rows ``name`` can take in one match of ``node``."""
    if isinstance(node, S.Label):
        return 1 if node.name == name else 0
    if isinstance(node, (S.Concat, S.Permute)):
        return sum(_max_rows(i, name) for i in node.items)
    if isinstance(node, S.Alternation):
        return max((_max_rows(i, name) for i in node.items), default=0)
    if isinstance(node, S.Quantified):
        inner = _max_rows(node.body, name)
        return inner * (float("inf") if node.max is None else node.max) if inner else 0
    if isinstance(node, S.Exclusion):
        return _max_rows(node.body, name)
    return 0


def _physical(node: ir.Node) -> bool:
    """Whether ``node`` uses PREV/NEXT somewhere."""
    if isinstance(node, ir.At):
        return node.nav.physical_offset != 0 or _physical(node.expr)
    if isinstance(node, ir.Agg):
        parts = list(node.args) + ([node.filter] if node.filter is not None else [])
        return any(_physical(a) for a in parts)
    if isinstance(node, (ir.Op, ir.Fallback)):
        return any(_physical(a) for a in node.args)
    return False


def _edge_labels(plan: Plan) -> tuple[set[int], set[int]]:
    """Labels that can take the first row of a match, and labels that can take its last."""
    code = plan.program.code
    first = {code[p].a for p in plan.program.waits(0) if code[p].op == MATCH}
    last = set()
    for pc, ins in enumerate(code):
        if ins.op == MATCH and any(code[p].op == DONE for p in plan.program.waits(pc + 1)):
            last.add(ins.a)
    return first, last


def key_and_window(plan: Plan, oracle) -> tuple[str, int] | str:
    """(BIGINT SQL of the ORDER BY key, WITHIN in its units), or why there is none."""
    if plan.within_sql is None:
        return "no WITHIN bounds the matches"
    key_idx, desc, _ = plan.order_by[0]
    if desc:
        return "the ORDER BY key is descending"
    name, typ = plan.input_columns[key_idx]
    quoted = quote_ident(name)
    t = typ.upper()
    try:
        if t in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"):
            value, vtype = oracle.constant(f"CAST(({plan.within_sql}) AS BIGINT) = ({plan.within_sql})")
            if value is not True:
                return "WITHIN is not a whole number"
            window = oracle.constant(f"CAST(({plan.within_sql}) AS BIGINT)")[0]
            key = f"CAST({quoted} AS BIGINT)"
        elif t.startswith("TIMESTAMP") or t == "DATE":
            # months have no fixed length: the bound must be the same from two different dates
            a = oracle.constant(f"epoch_us(TIMESTAMP '2001-02-01' + ({plan.within_sql})) - "
                                f"epoch_us(TIMESTAMP '2001-02-01')")[0]
            b = oracle.constant(f"epoch_us(TIMESTAMP '2004-07-01' + ({plan.within_sql})) - "
                                f"epoch_us(TIMESTAMP '2004-07-01')")[0]
            if a != b:
                return "WITHIN has no fixed length (months or years)"
            window = a
            key = f"epoch_us(CAST({quoted} AS TIMESTAMP))" if t == "DATE" else f"epoch_us({quoted})"
        else:
            return f"the ORDER BY key has type {typ}"
    except Exception as err:  # noqa: BLE001 - the filter is an optimisation: no filter, say why
        return f"the WITHIN bound cannot be measured ({err})"
    if window is None or window < 0:
        return "WITHIN is negative or NULL"
    return key, int(window)


def interval_plan(plan: Plan, fp: FastPlan | None, oracle) -> tuple[IntervalPlan | None, str]:
    """The time interval filter of a clause, or None and why it cannot be applied."""
    spec = plan.spec
    if fp is None:
        return None, "no row-level conditions were derived"
    kw = key_and_window(plan, oracle)
    if isinstance(kw, str):
        return None, kw
    key_sql, window = kw
    if window == 0:
        window = 1  # interval arithmetic below is in whole units; 1 keeps [t, t] meaningful
    if has_anchor(spec.pattern):
        return None, "anchors see partition boundaries"
    if spec.rows_per_match == "all" and spec.empty_matches == "unmatched":
        return None, "WITH UNMATCHED ROWS outputs every row"
    if any(plan.program.code[p].op == DONE for p in plan.program.waits(0)):
        return None, "the pattern can match zero rows"
    nodes = [m.node for m in plan.measures] + [d for d in plan.defines if d is not None]
    if any(_physical(n) for n in nodes):
        return None, "PREV/NEXT see rows outside the match"
    defined = {d.variable: d for d in spec.definitions}
    mandatory = _mandatory(spec.pattern)
    first, last = _edge_labels(plan)
    variables = []
    for name in plan.labels:
        label = plan.labels.index(name)
        cond = fp.row_sql[label]
        if name not in mandatory or always_true(defined.get(name)) or cond is None or H.PREFIX in cond:
            continue
        before = 0 if first == {label} else window
        after = 0 if last == {label} else window
        variables.append(VariableIntervals(label, name, cond, before, after,
                                           at_most_once=_max_rows(spec.pattern, name) <= 1))
    if not variables:
        return None, "no variable in every match has a row-level condition"
    by_label = {v.label: v for v in variables}
    for c in fp.compares:
        v = by_label.get(c.label)
        srcs = fp.registers[c.register]
        if v is None or c.op != vm.CMP_EQ or c.offset != 0:
            continue
        src_conds = [fp.row_sql[s] for s in sorted(srcs)]
        if any(sc is None or H.PREFIX in sc or always_true(defined.get(plan.labels[s]))
               for s, sc in zip(sorted(srcs), src_conds)):
            continue  # every row could be a source: the filter would carry the whole table
        if not _null_fails(c.other_sql, plan, oracle):
            continue
        try:
            common = oracle.type_of(f"(SELECT [({c.current_sql}), ({c.other_sql})] FROM (SELECT {_nulls(plan)}))")
        except Exception:  # noqa: BLE001 - no common type: no join filter
            continue
        if not common.endswith("[]"):
            continue
        v.joins.append(JoinCondition(c.current_sql, c.other_sql, frozenset(srcs), common[:-2],
                                     " OR ".join(f"({sc})" for sc in src_conds)))
    pkeys = [quote_ident(plan.input_columns[i][0]) for i in plan.partition_by]
    where, _ = row_filter(plan, fp)
    others = [plan.labels.index(v) for v in plan.labels if not always_true(defined.get(v))] if where else None
    ip = IntervalPlan(key_sql, plan.input_columns[plan.order_by[0][0]][0], window, pkeys, variables, where, others)
    return ip, f"{len(variables)} variable(s) bound the time intervals"


def _null_fails(other_sql: str, plan: Plan, oracle) -> bool:
    """Whether ``x = other`` cannot hold when ``other`` is read on the row of NULLs (no such row)."""
    try:
        value, _ = oracle.constant(f"(SELECT ({other_sql}) IS NULL FROM (SELECT {_nulls(plan)}))")
    except Exception:  # noqa: BLE001
        return False
    return value is True


def _nulls(plan: Plan) -> str:
    """A select list giving one row of NULLs with the input's columns."""
    return ", ".join(f"CAST(NULL AS {t}) AS \"{n.replace(chr(34), chr(34) * 2)}\"" for n, t in plan.input_columns)
