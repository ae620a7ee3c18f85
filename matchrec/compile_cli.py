"""``matchrec compile PROJECT_DIR``: print the SQL each model of a project would run, in dependency order.

This module owns the command line of compile; templates, selection and ordering live in
``matchrec.engine.project``. Nothing is executed and no database is opened.
"""
from __future__ import annotations

import argparse
import sys

from matchrec.engine.project import compile_text, select
from matchrec.run_cli import add_selection_arguments, load_or_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("project", metavar="PROJECT_DIR", help="folder of .sql models (searched recursively)")
    add_selection_arguments(parser)


def run(args) -> int:
    project = load_or_report(args.project)
    if project is None:
        return 1
    sys.stdout.write(compile_text(project, select(project, args.select, args.exclude)))
    return 0
