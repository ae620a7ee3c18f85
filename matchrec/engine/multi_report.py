"""The report lines of a group's shared evaluation (``ManyResult.report``): the plan and its
search, each unit's order, the nodes shared between statements."""
from __future__ import annotations

from matchrec.planner import sharing as SH

NEGATED = ("negated element's", "negated elements'")  # a closure's gate of one class, of several


def listed(xs) -> str:
    return ", ".join(str(x) for x in xs)


def describe(run, lines: list, items: list, units: list, plan, info, roots, n_classes: int,
             search_share: float) -> None:
    """The shared operator's part of the report: its plan (``search_share``: the share of the start
    plan's expected evaluation time a search may take), each unit's order, the nodes shared."""
    r = run
    lines.append(f"  shared operator: {len(items)} pattern(s) as {len(units)} unit(s) (alternatives), "
                 f"{n_classes} element class(es)")
    if info.details:
        how = "; ".join(f"{m} {c:,.0f} in {s} moves" for m, c, s in info.details)
        lines.append(f"  plan: estimated cost {info.start_cost:,.0f} -> {info.cost:,.0f} (start: "
                     f"{'greedy lazy orders' if r.reorder else 'written orders'}); optimiser {info.seconds:.3f} s "
                     f"of {info.budget:.3f} s allowed ({how}; a search may take {search_share:.0%} of the start "
                     f"plan's expected evaluation time, at most the budget)")
    else:
        lines.append(f"  plan: estimated cost {info.cost:,.0f} ({'greedy lazy' if r.reorder else 'written'} "
                     f"orders, {'sharing every common prefix' if r.share else 'no sharing'}; no search)")
    for u, unit in enumerate(units):
        order = " > ".join(unit.vars[p] for p in plan.orders[u])
        counted = "".join((f"; Kleene closure counted between {unit.vars[k.prev]} and {unit.vars[k.next]}"
                           if k.prev is not None and k.next is not None else
                           f"; Kleene closure counted after {unit.vars[k.prev]} (ending the match)" if k.prev is not None
                           else f"; Kleene closure counted before {unit.vars[k.next]} (starting the match)")
                          + ("" if not k.gate else
                             f" less the sets reaching past the {NEGATED[len(k.gate) > 1]} "
                             f"{'last' if k.gate_after else 'first'} "
                             f"event {_gate_end(unit, k)}")
                          for k in unit.kleene)
        lines.append(f"    {unit.label}: order {order}{counted}")
    nodes = list(SH.walk(roots))
    shared = [n for n in nodes if len({units[u].pattern for u in n.users}) > 1 or len(n.users) > 1]
    r.stats["nodes"] += len(nodes)
    r.stats["shared_nodes"] += len(shared)
    lines.append(f"  nodes: {len(nodes)} for {sum(len(u.vars) for u in units)} unit steps; shared nodes: "
                 f"{len(shared)}")
    for n in shared[:40]:
        users = listed(sorted({items[units[u].pattern].index for u in n.users}))
        lines.append(f"    [{n.label}] window {n.window}: units {len(n.users)}, statements {users}")
    if len(shared) > 40:
        lines.append(f"    ... {len(shared) - 40} more")


def _gate_end(unit, k) -> str:
    """Where a closure's gate reads its negated events from (``multi_report``'s plan lines)."""
    if k.gate_after:
        return f"before {unit.vars[k.next]}" if k.next is not None else "up to the window's end"
    return f"after {unit.vars[k.prev]}" if k.prev is not None else "from the window's start"
