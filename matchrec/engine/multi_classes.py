"""Element classes of a group's read and the preparation of its statements (``run_many``).

An element class is a (type, single-variable filter) pair: its boolean mask over the read rows is
computed once and shared by every statement's elements of that class. Preparing a statement gives
each element its class, compiles its conditions (Python and whole-array evaluators, and the
templates the sharing planner compares), and decides whether the shared operator evaluates it.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from matchrec.engine.multi_rays import RayForms
from matchrec.operators import cer_shared as O
from matchrec.operators.cer_reference import alternatives
from matchrec.parser import sase as S
from matchrec.planner import cer as P
from matchrec.planner import sharing as SH
from matchrec.planner.cer.choice import KLEENE_NOT_COUNTED, closures_counted, orders_apart
from matchrec.planner.cer_ranges import decide
from matchrec.planner.cer_vector import VectorColumns, compile_condition


class ElementClasses:
    """The read table's keys, partitions and types, and the classes found so far with their masks."""

    def __init__(self, table: pa.Table, filter_cols: dict, partitioned: bool):
        self.table, self.filter_cols = table, filter_cols
        n = len(table)
        self.key = table.column("__key").to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
        self.pid = table.column("__pid").to_numpy().astype(np.int64) if partitioned and n else None
        self.types = table.column("__type")
        self.codes, self.code_of = self.type_codes(self.types)
        self.classes: dict = {}  # (type, filter sql) -> id
        self.masks: list = []
        self._masks: dict = {}  # ("type", type) or ("filter", column) -> its rows as a mask
        self.labels: list = []
        self.ranges: dict = {}  # column -> (per type code: min, max, usable; all rows' (min, max) or None)

    def class_id(self, type_, filter_sql) -> int:
        k = (type_, filter_sql)
        got = self.classes.get(k)
        if got is not None:
            return got
        # a type's mask and a filter's column are each made once: a workload's classes pair a few
        # filters with many types (power's rules: 49 classes of 20 types and 6 filters)
        m = self._mask(("type", type_), lambda: self._type_mask(type_))
        label = type_ if type_ is not None else "*"
        if filter_sql is not None:
            name = self.filter_cols[filter_sql]
            m = m & self._mask(("filter", name), lambda: np.asarray(
                self.table.column(name).fill_null(False).to_numpy(zero_copy_only=False), bool))
            label += f"[{filter_sql}]"
        got = self.classes[k] = len(self.masks)
        self.masks.append(m)
        self.labels.append(label)
        return got

    def _mask(self, key: tuple, make) -> np.ndarray:
        got = self._masks.get(key)
        if got is None:
            got = self._masks[key] = make()
            got.flags.writeable = False  # shared by classes: none may write into another's rows
        return got

    def _type_mask(self, type_) -> np.ndarray:
        n = len(self.table)
        if type_ is None:
            return np.ones(n, bool)
        return self.codes == self.code_of[type_] if type_ in self.code_of else np.zeros(n, bool)

    def value_range(self, type_, name: str, vcols: VectorColumns) -> tuple | None:
        """(min, max, exact) of numeric column ``name`` over the events of type ``type_`` (None: every
        event), None when unknown: not numeric, no such event, or a NULL or NaN among them. The
        range of a type is that of every element class of it (``planner.cer_ranges``)."""
        if name not in self.ranges:
            self.ranges[name] = self._ranges(name, vcols)
        got = self.ranges[name]
        if got is None:
            return None
        lows, highs, usable, whole = got
        if type_ is None:
            return whole
        code = self.code_of.get(type_)
        if code is None or not usable[code]:
            return None
        exact = lows.dtype.kind == "i"
        lo, hi = (int(lows[code]), int(highs[code])) if exact else (float(lows[code]), float(highs[code]))
        return lo, hi, exact

    def _ranges(self, name: str, vcols: VectorColumns):
        values = vcols.get(name)
        # float32 excluded: DuckDB may compare it at its own precision, beyond the float margin
        if values is None or not len(values) or values.dtype.kind not in "if" or values.dtype == np.float32:
            return None
        k = len(self.code_of)
        known = self.codes >= 0  # rows of a NULL type bind no typed element
        codes, vals = self.codes[known], values[known]
        count = np.bincount(codes, minlength=k)
        bad = np.zeros(k, bool)
        nulls = vcols.nulls(name)
        if nulls is not None:
            bad |= np.bincount(codes[nulls[known]], minlength=k) > 0
        if values.dtype.kind == "f":
            nan = np.isnan(vals)
            bad |= np.bincount(codes[nan], minlength=k) > 0
        else:
            vals = vals.astype(np.int64)
        info = np.iinfo(np.int64) if vals.dtype.kind == "i" else None
        lows = np.full(k, info.max if info else np.inf, vals.dtype)
        highs = np.full(k, info.min if info else -np.inf, vals.dtype)
        np.minimum.at(lows, codes, vals)
        np.maximum.at(highs, codes, vals)
        usable = (count > 0) & ~bad
        whole = None
        if (nulls is None or not nulls.any()) and not (values.dtype.kind == "f" and np.isnan(values).any()):
            exact = values.dtype.kind == "i"
            lo, hi = values.min(), values.max()
            whole = (int(lo), int(hi), True) if exact else (float(lo), float(hi), False)
        return lows, highs, usable, whole

    @staticmethod
    def type_codes(types) -> tuple[np.ndarray, dict]:
        """Each row's type as an integer code (-1: NULL) and the code of each type: one pass over the
        type column instead of one comparison of every row per class."""
        if not len(types):
            return np.zeros(0, np.int64), {}
        enc = pc.dictionary_encode(types.combine_chunks())
        codes = np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
        return codes, {t: i for i, t in enumerate(enc.dictionary.to_pylist())}


def prepare(items: list, classes: ElementClasses, lines: list | None = None) -> None:
    """Give each statement (``item``) its element classes and compiled conditions, and decide whether
    the shared operator evaluates it (``item.shared``; else ``item.why`` says why not). A condition
    the value ranges of its variables' types decide true for every binding (``planner.cer_ranges``)
    is left out: it filters nothing; one decided false over single events only marks the
    alternatives binding all its variables as matching nothing (``item.never``: the shared operator
    makes no unit of them); ``lines`` gets which were."""
    table = classes.table
    vcols = VectorColumns(table)
    converted: dict = {}  # columns converted once for every statement's conditions
    ray_forms: dict = {}  # conditions read as rays, per form (``RayForms``)
    dropped, never = [], []
    for item in items:
        q, plan = item.query, item.plan
        item.class_of = {v: classes.class_id(e.type, plan.filter_sql.get(v)) for v, e in q.elements.items()}
        kleene = {v for v, e in q.elements.items() if e.kleene}
        res = P._Resolver(q, plan.columns)
        vecs = [compile_condition(expr, res.col, vcols, kleene) for expr in q.conditions]
        item.py_conds = PythonConditions(plan, table, converted)
        if any(vec is None for vec in vecs):
            item.py_conds.get()  # needed at once (and its errors raised now, as the statement alone raises them)
        item.conds = []
        item.templates = []
        for i, (expr, vec) in enumerate(zip(q.conditions, vecs)):
            verdict = decided(expr, q, kleene, res, classes, vcols) if vec is not None else None
            if verdict is True:
                dropped.append(f"{item.index} ({q.text[expr.span[0]:expr.span[1]]})")
                continue
            names = frozenset(S.variables(expr))
            if verdict is False and names <= set(q.positive):
                # a negated event's condition false for every binding blocks nothing: it stays
                item.never.append(names)
                never.append(f"{item.index} ({q.text[expr.span[0]:expr.span[1]]})")
            template = SH.condition_template(expr, res.col)
            rays = RayForms(expr, res.col, vcols, kleene, template, ray_forms) if vec is not None else {}
            item.conds.append(O.Cond(frozenset(S.variables(expr)), item.py_conds.function(i), vec,
                                     q.text[expr.span[0]:expr.span[1]], rays))
            item.templates.append(template)
        if q.strategy != "any":
            item.why = f"{S.STRATEGY_NAMES[q.strategy]} decides each event as it arrives"
        elif any(q.elements[v].kleene for v in q.positive):
            item.why = countable(item, classes)
            item.shared = not item.why
        else:
            item.shared = True
    if dropped and lines is not None:
        lines.append(f"  conditions true for every binding by the value ranges of their variables' types, left out: "
                     f"statements {', '.join(dropped)}")
    if never and lines is not None:
        lines.append(f"  conditions false for every binding by the value ranges of their variables' types (the "
                     f"alternatives binding their variables match nothing): statements {', '.join(never)}")


def decided(expr, q, kleene: set, res, classes: ElementClasses, vcols: VectorColumns) -> bool | None:
    """Whether ``expr`` holds for every binding of its (single, not Kleene) variables (True), for
    none (False), or either may happen (None)."""
    if S.variables(expr) & kleene:
        return None

    def range_of(col):
        if col.var in kleene or col.index is not None or col.var not in q.elements:
            return None
        return classes.value_range(q.elements[col.var].type, res.col(col), vcols)
    return decide(expr, range_of)


class PythonConditions:
    """A statement's conditions as Python functions of one binding (``planner.cer``), compiled when
    first needed: the shared operator evaluates their numpy forms and calls a Python function only
    where a numpy form refuses the values (compiling every statement's took a few percent of a
    workload's time)."""

    def __init__(self, plan, table: pa.Table, converted: dict):
        self.args = (plan, table, converted)
        self.compiled: list | None = None

    def get(self) -> list:
        """The conditions (``operators.cer_reference.Condition``), in the statement's order."""
        if self.compiled is None:
            self.compiled = P.compile_conditions(*self.args)
        return self.compiled

    def function(self, i: int):
        """Condition ``i``'s function of a binding, compiled at its first call."""
        def call(binding, i=i):
            return self.get()[i].fn(binding)
        return call


def countable(item, classes: ElementClasses) -> str:
    """'' when the shared operator can count the pattern's Kleene closures (``cer_shared.Kleene``),
    else why not."""
    q = item.query
    if q.returns == "events":
        return "Kleene closure (its events returned)"
    chains = alternatives(q.root)
    if (len(chains) != 1 and q.returns != "count") or not orders_apart(chains):
        return "Kleene closure in OR / AND"
    chain = chains[0]
    # every alternative's closures: a condition reading one in any of them is not counted
    kvars = {e.var for c in chains for e in c if e.kleene is not None}
    if q.returns == "project":
        # A row per match whose columns read no closure: the skeleton's row repeated once per set.
        # The rows keep the order of the statement run alone (first event, then variable by
        # variable in name order, a closure by its sets) only when the closures bind neither the
        # first event nor a name before a single event's: the repeated rows are then adjacent.
        if any(S.variables(p.expr) & kvars for p in q.projections):
            return "Kleene closure read by RETURN"
        pos = [e for e in chain if not e.negated]
        single = [e.var for e in pos if e.kleene is None]
        if pos[0].kleene is not None or min(kvars) < max(single):
            return "Kleene closure (matches returned, in an order only its sets give)"
    read = set().union(*(c.vars for c in item.conds))
    if not all(closures_counted(c, read) for c in chains):
        return KLEENE_NOT_COUNTED
    if any(c.vars & kvars for c in item.conds):
        return "Kleene closure read by a condition"
    return ""
