"""Dual filtering on Spark: every partition of the input plays a storage node."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FilterReport:
    used: bool = False
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    shuffle: object = None

    def lines(self) -> list[str]:
        return ([f"interval filtering: {self.reason}"] if self.reason else []) + self.notes


def filter_rows(df, analysis, mode: str):
    return None, FilterReport(reason="not applied")
