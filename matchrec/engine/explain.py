"""EXPLAIN [ANALYZE] of a MATCH_RECOGNIZE statement: the text matchrec adds before DuckDB's plan.

Each clause shows its physical plan in the layout every form shares (``planner.physical``:
``logical:`` then ``physical:`` sections), CER statements included (``engine.cer``).

The result of an EXPLAIN has two VARCHAR columns (``explain_key``, ``explain_value``), as
DuckDB's: the first row is matchrec's (key ``matchrec``: each clause's plan and, under
ANALYZE, what its run counted), the rows after it DuckDB's EXPLAIN of the statement that
finishes the query.
"""
from __future__ import annotations

DESCRIPTION = [("explain_key", "VARCHAR", None, None, None, None, None),
               ("explain_value", "VARCHAR", None, None, None, None, None)]


def clauses_text(runs, analyze: bool) -> str:
    """matchrec's part of the EXPLAIN: one plan per clause run (``engine.statement.ClauseRun``)."""
    lines = []
    for run in runs:
        lines.append(run.plan.explain())  # the physical plan, titled by its planning (planner.physical)
        if analyze:
            lines += _analyze_lines(run)
    return "\n".join(lines)


def _analyze_lines(run) -> list[str]:
    s = run.stats
    lines = [f"Analyze: rows in {s.rows_in}, partitions {s.partitions}, matches {s.matches} "
             f"(+{s.empty_matches} empty), rows out {s.rows_out}",
             f"  matcher {s.matcher}: {s.match_seconds:.3f} s; output and MEASURES "
             f"{s.output_seconds:.3f} s; DuckDB input {run.input_seconds:.3f} s"]
    if s.starts_tried or s.starts_pruned:
        lines.append(f"  reference matcher started at {s.starts_tried} rows; "
                     f"{s.starts_pruned} start rows pruned by the compiled pre-filter")
    lines.append(f"  DuckDB fallback evaluations {s.fallback_calls}")
    for key, value in s.extra.items():
        lines.append(f"  {key}: {value}")
    return lines


def rows(runs, analyze: bool, duck_rows) -> list[tuple[str, str]]:
    """The EXPLAIN result: matchrec's row, then DuckDB's rows (``duck_rows``) as text."""
    return [("matchrec", clauses_text(runs, analyze))] + [(str(a), str(b)) for a, b in duck_rows]
