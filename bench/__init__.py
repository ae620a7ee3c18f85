"""Benchmarks of matchrec against DuckDB baselines and peer engines; run ``python -m bench``."""
from __future__ import annotations

import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def publish(text: str, path: str | None = RESULTS) -> None:
    """Print a benchmark's section and append it to ``path`` (bench/RESULTS.md; None: print only)."""
    print(text)
    if path:
        with open(path, "a") as out:
            out.write("\n" + text.rstrip("\n") + "\n")
