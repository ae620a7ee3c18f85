"""Plan one MATCH_RECOGNIZE: resolve names against the input schema, analyse every
expression, compile the pattern, and fix the output layout and types.

The Plan is everything the engine needs to run the clause; it holds no data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from matchrec.errors import ProgrammingError, positioned
from matchrec.operators import expr as ir
from matchrec.operators.program import PatternTooLarge, Program, compile_pattern
from matchrec.parser import hidden as H
from matchrec.parser import spec as S
from matchrec.planner.analysis import ExpressionAnalyzer, Oracle, Scope, history_dependent
from matchrec.planner.logical import LogicalPlan
from matchrec.planner.pattern import lower as lower_pattern

BOOLEAN_TYPES = {"BOOLEAN", '"NULL"'}


@dataclass
class MeasurePlan:
    name: str
    node: ir.Node
    type: str


@dataclass
class OutputColumn:
    name: str
    source: str  # "input" (index into the input columns), "measure" (into measures) or "const" (TRUE)
    index: int
    type: str


@dataclass
class Plan:
    spec: S.MatchSpec
    labels: list[str]
    subsets: dict[str, frozenset[int]]
    program: Program
    input_columns: list[tuple[str, str]]  # (name, DuckDB type)
    pushed: list[tuple[str, str]]  # (DuckDB SQL, type) computed per row after the input columns
    partition_by: list[int]  # input column indexes
    order_by: list[tuple[int, bool, bool]]  # (input column index, descending, nulls_first)
    defines: list[ir.Node | None]  # per label id; None: always true
    history_dependent: list[bool]
    measures: list[MeasurePlan]
    output: list[OutputColumn]
    skip_labels: frozenset[int] | None = None  # SKIP TO FIRST/LAST: the variable's labels
    within_sql: str | None = None
    physical: Any = None  # planner.physical.PhysicalPlan, set once when planning is done

    @property
    def notes(self) -> list[str]:
        """The physical decisions as lines (source access, filtering, matcher); empty before planning ends."""
        return self.physical.notes() if self.physical is not None else []

    def explain(self) -> str:
        """EXPLAIN's text: the physical plan's, in the layout every form shares (planner.physical)."""
        if self.physical is not None:
            return self.physical.explain()
        lines = ["logical:"]
        for heading, body in self.logical_plan().sections():
            lines.append(f"  {heading}: {body[0]}" if body else f"  {heading}: none")
            lines += [f"    {b}" for b in body[1:]]
        return "\n".join(lines)

    def logical_plan(self, form: str = "match_recognize") -> LogicalPlan:
        """What the clause means (``form``: "match_recognize", or "window" for a window with PATTERN)."""
        spec = self.spec
        described = [line.strip() for line in spec.describe().splitlines()[1:]]

        def picked(*prefixes):
            return [line.split(": ", 1)[1] if line.startswith(prefixes[0] + ":") else line
                    for line in described if line.startswith(prefixes)]
        source = ["the input (" + ", ".join(f"{n} {t}" for n, t in self.input_columns) + ")"]
        conditions = []
        for d in spec.definitions:
            conditions.append(f"define {d.variable} := {d.expression.text}")
        for label, node in zip(self.labels, self.defines):
            if node is None:
                conditions.append(f"define {label}: always true")
            else:
                dep = "depends on match history" if self.history_dependent[self.labels.index(label)] \
                    else "independent of match history"
                conditions.append(f"define {label}: {describe_node(node, self)}  [{dep}]")
        pattern = picked("pattern") + picked("subset")
        strategy = [line for line in described if line.startswith(("rows:", "after match skip:"))]
        output = ", ".join(f"{c.name} {c.type}" for c in self.output)
        measures = [f"measure {m.name} := {m.expression.text}" for m in spec.measures]
        measures += [f"measure {m.name} {m.type}: {describe_node(m.node, self)}" for m in self.measures]
        return LogicalPlan(form, source=tuple(source),
                           partition=tuple(picked("partition by")),
                           order=tuple(picked("order by")),
                           pattern=tuple(pattern),
                           conditions=tuple(conditions),
                           window=(f"WITHIN {spec.within.sql}",) if spec.within is not None else (),
                           strategy=tuple(strategy),
                           output=tuple([output] + measures))


def describe_node(node: ir.Node, plan: Plan) -> str:
    n_in = len(plan.input_columns)

    def col(i):
        return plan.input_columns[i][0] if i < n_in else H.pushed(i - n_in)

    def labels(ls):
        return "*" if ls is None else "|".join(plan.labels[i] for i in sorted(ls))

    def walk(n):
        if isinstance(n, ir.Const):
            return repr(n.value)
        if isinstance(n, ir.Col):
            return col(n.index)
        if isinstance(n, ir.Classifier):
            return "CLASSIFIER"
        if isinstance(n, ir.MatchNumber):
            return "MATCH_NUMBER"
        if isinstance(n, ir.At):
            nav = n.nav
            where = f"{'LAST' if nav.last else 'FIRST'}({labels(nav.labels)}"
            where += f", {nav.logical_offset})" if nav.logical_offset else ")"
            if nav.physical_offset:
                where += f"{nav.physical_offset:+d}"
            if not nav.running:
                where = "FINAL " + where
            return f"{walk(n.expr)}@{where}"
        if isinstance(n, ir.Agg):
            args = ", ".join(walk(a) for a in n.args) if not n.star else "*"
            mode = "" if n.running else "FINAL "
            return f"{mode}{n.func}[{labels(n.labels)}]({args})"
        if isinstance(n, ir.Op):
            return f"{n.op}(" + ", ".join(walk(a) for a in n.args) + ")"
        if isinstance(n, ir.Fallback):
            return "duckdb{" + n.template[7:] + "}(" + ", ".join(walk(a) for a in n.args) + ")"
        return type(n).__name__
    return walk(node)


def _err(spec: S.MatchSpec, message: str, span: S.Span | None):
    if span is None:
        return ProgrammingError(message)
    return positioned(ProgrammingError, message, spec.source, span.start, span.end)


def _find_label_span(node: S.PatternNode, name: str) -> S.Span | None:
    if isinstance(node, S.Label) and node.name == name:
        return node.span
    for child in list(getattr(node, "items", ()) or ()) + ([node.body] if getattr(node, "body", None) else []):
        found = _find_label_span(child, name)
        if found:
            return found
    return None


def _resolve_column(spec: S.MatchSpec, ref: S.ColumnRef, columns: list[tuple[str, str]], what: str) -> int:
    exact = [i for i, (n, _) in enumerate(columns) if n == ref.name]
    if exact:
        return exact[0]
    if not ref.quoted:
        loose = [i for i, (n, _) in enumerate(columns) if n.lower() == ref.name.lower()]
        if len(loose) == 1:
            return loose[0]
    names = ", ".join(n for n, _ in columns)
    raise _err(spec, f"{what} column {ref.name!r} does not exist in the input (columns: {names})", ref.span)


def build_plan(spec: S.MatchSpec, columns: list[tuple[str, str]], oracle: Oracle) -> Plan:
    labels = S.pattern_labels(spec.pattern)
    # ---- subsets
    subsets: dict[str, frozenset[int]] = {}
    for sub in spec.subsets:
        if sub.name in labels:
            raise _err(spec, f"SUBSET name {sub.name!r} is already a primary pattern variable", sub.span)
        members = []
        for member, span in zip(sub.members, sub.member_spans or [sub.span] * len(sub.members)):
            if member not in labels:
                raise _err(spec, f"{member!r} in SUBSET {sub.name} is not a pattern variable of PATTERN", span)
            members.append(labels.index(member))
        subsets[sub.name] = frozenset(members)
    # ---- definitions must name pattern variables
    for d in spec.definitions:
        if d.variable not in labels:
            if d.variable in subsets:
                raise _err(spec, f"DEFINE cannot define the SUBSET {d.variable!r}", d.variable_span)
            raise _err(spec, f"DEFINE names {d.variable!r}, which does not appear in PATTERN", d.variable_span)
    # ---- skip target
    skip_labels = None
    if spec.skip.kind in ("to_first", "to_last"):
        var = spec.skip.variable
        if var in labels:
            skip_labels = frozenset([labels.index(var)])
        elif var in subsets:
            skip_labels = subsets[var]
        else:
            raise _err(spec, f"AFTER MATCH SKIP TO refers to {var!r}, which is not a pattern variable or SUBSET",
                       spec.skip.span)
    if spec.rows_per_match == "all" and spec.empty_matches == "unmatched" and _has_exclusion(spec.pattern):
        raise _err(spec, "Pattern exclusion {- -} is not allowed with ALL ROWS PER MATCH WITH UNMATCHED ROWS",
                   spec.pattern.span)
    # ---- partitioning and ordering
    partition_by = [_resolve_column(spec, c, columns, "PARTITION BY") for c in spec.partition_by]
    order_by = []
    for key in spec.order_by:
        idx = _resolve_column(spec, key.column, columns, "ORDER BY")
        nulls_first = bool(key.nulls_first) if key.nulls_first is not None else False
        order_by.append((idx, key.descending, nulls_first))
    # ---- program
    try:
        program = compile_pattern(lower_pattern(spec.pattern, {name: i for i, name in enumerate(labels)}), labels)
    except PatternTooLarge as err:
        raise _err(spec, err.message or "PATTERN is too large once its quantifiers are expanded; use smaller bounds",
                   err.span or spec.pattern.span) from None
    # ---- expressions
    scope = Scope(labels=labels, subsets=subsets, columns=list(columns), oracle=oracle, dialect=spec.dialect)
    defines: list[ir.Node | None] = [None] * len(labels)
    dependent = [False] * len(labels)
    for d in spec.definitions:
        label = labels.index(d.variable)
        analyzer = ExpressionAnalyzer(scope, d.expression, "define", label)
        node, typ = analyzer.analyze_root(spec.source)
        if typ not in BOOLEAN_TYPES:
            raise _err(spec, f"DEFINE {d.variable} must be a boolean condition, not {typ}", d.expression.span)
        node = current_row_navigation(node, label)
        defines[label] = node
        dependent[label] = history_dependent(node, label)
    measures = []
    for m in spec.measures:
        analyzer = ExpressionAnalyzer(scope, m.expression, "measure")
        node, typ = analyzer.analyze_root(spec.source)
        if typ == '"NULL"':
            typ = "INTEGER"  # DuckDB gives a bare NULL the INTEGER type in a result
        measures.append(MeasurePlan(m.name, node, typ))
    # ---- output layout (Trino's): ONE ROW = partition columns + measures;
    # ALL ROWS = partition columns, order columns, measures, the other input columns.
    # A column named twice in PARTITION BY / ORDER BY (``ORDER BY id ASC, id DESC``, legal in
    # Trino) is output once.
    output: list[OutputColumn] = []
    for i in dict.fromkeys(partition_by):
        output.append(OutputColumn(columns[i][0], "input", i, columns[i][1]))
    if spec.rows_per_match == "all":
        for i in dict.fromkeys(i for i, _, _ in order_by):
            if i not in partition_by:
                output.append(OutputColumn(columns[i][0], "input", i, columns[i][1]))
    for k, m in enumerate(measures):
        output.append(OutputColumn(m.name, "measure", k, m.type))
    if spec.rows_per_match == "all":
        used = set(partition_by) | {i for i, _, _ in order_by}
        for i, (name, typ) in enumerate(columns):
            if i not in used:
                output.append(OutputColumn(name, "input", i, typ))
    if not output:
        # ONE ROW PER MATCH without PARTITION BY or MEASURES has no columns, which DuckDB
        # relations cannot represent; a marker column keeps count(*) and EXISTS working.
        output.append(OutputColumn(H.ROW_MARK, "const", 0, "BOOLEAN"))
    seen: dict[str, OutputColumn] = {}
    for col in output:
        key = col.name.lower()
        if key in seen:
            m = next((m for m in spec.measures if m.name.lower() == key), None)
            raise _err(spec, f"Output column {col.name!r} appears twice (a measure named like an input column?)",
                       m.name_span if m else spec.span)
        seen[key] = col
    within_sql = spec.within.sql if spec.within is not None else None
    if within_sql is not None and not order_by:
        raise _err(spec, "WITHIN needs an ORDER BY: the bound applies to the first ORDER BY column",
                   spec.within.span)
    return Plan(spec=spec, labels=labels, subsets=subsets, program=program, input_columns=list(columns),
                pushed=scope.pushed, partition_by=partition_by, order_by=order_by, defines=defines,
                history_dependent=dependent, measures=measures, output=output, skip_labels=skip_labels,
                within_sql=within_sql)


def current_row_navigation(node: ir.Node, label: int) -> ir.Node:
    """In the DEFINE of ``label``, LAST(V.x) over a variable set holding ``label`` is the current row.

    (The row being tested is tentatively labelled ``label``.) Rewriting it as navigation over
    the universal variable lets the evaluator skip the search through the labels.
    """
    if isinstance(node, ir.At):
        nav = node.nav
        if nav.labels is not None and label in nav.labels and nav.last and nav.running \
                and nav.logical_offset == 0:
            nav = ir.Nav(None, True, 0, True, nav.physical_offset)
        return ir.At(nav, current_row_navigation(node.expr, label))
    if isinstance(node, ir.Op):
        return ir.Op(node.op, tuple(current_row_navigation(a, label) for a in node.args))
    if isinstance(node, ir.Fallback):
        return ir.Fallback(node.template, tuple(current_row_navigation(a, label) for a in node.args), node.types)
    return node


def _has_exclusion(node: S.PatternNode) -> bool:
    if isinstance(node, S.Exclusion):
        return True
    children = list(getattr(node, "items", ()) or ())
    if getattr(node, "body", None) is not None:
        children.append(node.body)
    return any(_has_exclusion(c) for c in children)
