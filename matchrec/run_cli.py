"""``matchrec run PROJECT_DIR``: build a folder of SQL models into a DuckDB database, dbt-style.

This module owns the command line of a run: its options, the progress bar on stderr (when
stderr is a terminal) and the summary table on stdout. Loading, scheduling and
materialisation live in the package ``matchrec.engine.project``.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from typing import TextIO

from matchrec.cli import error_text
from matchrec.engine.project import (SUMMARY_COLUMNS, ModelResult, Progress, ProjectLoadError, RunResult, format_errors,
                                     load_project, located, run_project, select, summary_rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("project", metavar="PROJECT_DIR", help="folder of .sql models (searched recursively)")
    parser.add_argument("--db", default=":memory:", metavar="PATH",
                        help="DuckDB database file to build into (default: in memory, gone at exit)")
    add_selection_arguments(parser)
    parser.add_argument("--threads", type=_positive, default=1, metavar="N",
                        help="models built at the same time (default 1)")
    parser.add_argument("--fail-fast", "-x", action="store_true", help="start no new model after the first error")
    parser.add_argument("--nodes", default=None, metavar="HOST:PORT,...",
                        help="storage nodes (grpc://host:port or host:port, comma-separated): their tables can be "
                             "named in the models, which run on a compute-node connection")
    from matchrec.connectors.credentials import add_client_arguments
    add_client_arguments(parser)


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--select", "-s", nargs="+", metavar="SELECTOR",
                        help="models to build: name, +name (with ancestors), name+ (with descendants), tag:x, "
                             "path:dir; several are a union, a,b an intersection")
    parser.add_argument("--exclude", nargs="+", metavar="SELECTOR", help="models to leave out (same syntax)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def load_or_report(folder: str):
    """The project in ``folder``, or None after printing each of its load errors as ``file:line:col: ...``."""
    try:
        return load_project(folder)
    except ProjectLoadError as err:
        print("\n".join(error_text(located(e)) for e in err.errors), file=sys.stderr)
        if len(err.errors) > 1:
            print(f"{len(err.errors)} errors in the project; nothing was built", file=sys.stderr)
        return None


def run(args) -> int:
    project = load_or_report(args.project)
    if project is None:
        return 1
    keys = select(project, args.select, args.exclude)
    opener = connector(args)
    con = opener(args.db)
    try:
        progress = ProgressBar(sys.stderr, len(keys)) if sys.stderr.isatty() else Progress()
        result = run_project(project, con, keys, threads=args.threads, fail_fast=args.fail_fast, progress=progress,
                             connect=opener)
    finally:
        con.close()
    print(summary(result, args.db))
    errors = format_errors(result)
    if errors:
        sys.stdout.flush()
        print("\n".join(error_text(e) for e in errors), file=sys.stderr)
    return 0 if result.ok else 1


def connector(args):
    """``matchrec.connect``, on the storage nodes of ``--nodes`` when given (every worker the same)."""
    import functools

    import matchrec
    if not getattr(args, "nodes", None):
        return matchrec.connect
    from matchrec.connectors.credentials import resolve_token
    nodes = [u if "://" in u else f"grpc://{u}" for u in (x.strip() for x in args.nodes.split(",")) if u]
    return functools.partial(matchrec.connect, storage_nodes=nodes, token=resolve_token(args.token, args.token_file),
                             tls_root_certs=args.tls_root_certs)


def summary(result: RunResult, database: str) -> str:
    """The summary table, the shared passes and the totals."""
    lines = [_table(SUMMARY_COLUMNS, summary_rows(result), right={"rows", "matches", "seconds"})]
    for p in result.passes:
        numbered = ", ".join(f"{i} {name}" for i, name in enumerate(p.models))
        lines.append(f"pass #{p.number} over {p.source}, one run_many call ({p.seconds:.3f} s), statements: "
                     f"{numbered}")
        lines += [f"  {line}" for line in p.report]
    rows = sum(r.rows or 0 for r in result.results)
    matches = sum(r.matches or 0 for r in result.results)
    threads = f"{result.threads} thread{'s' if result.threads != 1 else ''}"
    lines.append(f"Done in {result.seconds:.2f} s ({threads}): {result.count('OK')} OK, {result.count('ERROR')} "
                 f"ERROR, {result.count('SKIPPED')} SKIPPED; {_plural(rows, 'row')} stored, {_plural(matches, 'match')}")
    if database == ":memory:":
        lines.append("The database is in memory: the tables are gone now. Pass --db FILE to keep them.")
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "es" if word.endswith("ch") else "s")


def _table(names: list[str], rows: list[tuple], right: set[str]) -> str:
    """A plain text table: a header, a rule, one line per row; the ``right`` columns right-aligned."""
    widths = [max([len(n)] + [len(str(r[i])) for r in rows]) for i, n in enumerate(names)]

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if n in right else str(c).ljust(w)
                         for c, w, n in zip(cells, widths, names)).rstrip()

    return "\n".join([line(names), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


class ProgressBar(Progress):
    """One line on a terminal: a bar of models done out of the total and the models running now."""

    def __init__(self, stream: TextIO, total: int):
        self.stream, self.total, self.done_count = stream, total, 0
        self.running: list[str] = []

    def started(self, names: list[str]) -> None:
        self.running += names
        self._draw()

    def finished(self, result: ModelResult) -> None:
        self.done_count += 1
        if result.name in self.running:
            self.running.remove(result.name)
        self._draw()

    def done(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((80, 24)).columns
        filled = 20 * self.done_count // max(1, self.total)
        text = f"[{'#' * filled}{'.' * (20 - filled)}] {self.done_count}/{self.total} models"
        if self.running:
            text += "  running: " + ", ".join(self.running)
        if len(text) > width - 1:
            text = text[:max(0, width - 2)] + "…"
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
