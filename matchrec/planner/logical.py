"""The logical plan: what a statement means, in one shape for every form.

A MATCH_RECOGNIZE clause, a window with PATTERN and a CER query each plan to one ``LogicalPlan``
(``planner.plan.Plan.logical_plan``, ``engine.cer.physical_plan``): the source, its partitioning
and order, the pattern, the conditions on its variables, the window, the selection strategy (the
standard's rows per match and AFTER MATCH SKIP being one of them, skip-till-any-match another)
and the output. The physical plan (``planner.physical``) carries it, the matcher choice reads its
form and strategy, and EXPLAIN prints it under the same headings for every form.
"""
from __future__ import annotations

from dataclasses import dataclass

HEADINGS = ("source", "partition", "order", "pattern", "conditions", "window", "strategy", "output")
FORMS = ("match_recognize", "window", "cer")


@dataclass(frozen=True)
class LogicalPlan:
    """Each field holds EXPLAIN's lines under its heading, the first one the summary."""
    form: str  # one of FORMS
    source: tuple[str, ...]
    partition: tuple[str, ...]
    order: tuple[str, ...]
    pattern: tuple[str, ...]
    conditions: tuple[str, ...]
    window: tuple[str, ...]
    strategy: tuple[str, ...]
    output: tuple[str, ...]

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"unknown statement form {self.form!r}")

    def sections(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(heading, lines) in the order of HEADINGS; an empty field reads "none"."""
        return tuple((h, getattr(self, h) or ("none",)) for h in HEADINGS)
