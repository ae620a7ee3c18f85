"""The ``matchrec`` command line: argument parsing, subcommand dispatch and error reporting.

Each subcommand lives in a module with two functions, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); add one by appending to SUBCOMMANDS. Whatever a
subcommand raises ends as a one-message error on stderr and a non-zero status, never as a
Python traceback (set MATCHREC_DEBUG=1 to see the traceback of an unexpected error).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

# (name, module, one-line help) of each subcommand.
DEFAULT_SUBCOMMAND = "shell"  # what a bare ``matchrec`` or ``matchrec -c SQL`` runs
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("shell", "matchrec.shell", "interactive SQL shell with MATCH_RECOGNIZE (the default)"),
    ("demo", "matchrec.demo", "build a demo database (stocks, crimes) and run example queries"),
    ("storage-node", "matchrec.connectors.storage_node", "serve one DuckDB shard to compute nodes over Arrow Flight"),
    ("load", "matchrec.connectors.loader", "spread a table over storage nodes"),
    ("index", "matchrec.connectors.index_cli", "build the ACER range-bitmap index of a table on storage nodes"),
    ("run", "matchrec.run_cli", "build a folder of SQL models (dbt-style) into a DuckDB database"),
    ("spark-env", "matchrec.spark_env", "pack a relocatable Python with matchrec for Spark's spark.archives"),
    ("compile", "matchrec.compile_cli", "print the SQL each model of a project would run, in dependency order"),
]


def _version() -> str:
    import duckdb
    import matchrec
    return f"matchrec {matchrec.__version__} (DuckDB {duckdb.__version__})"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(
        prog="matchrec", description="SQL:2016 MATCH_RECOGNIZE for DuckDB.",
        epilog="Run 'matchrec COMMAND --help' for the options of a command.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    modules: dict[str, object] = {}
    for name, module_name, help_text in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # one broken subcommand must not take the others down
            module = _Unavailable(name, err)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        modules[name] = module
    return parser, modules


class _Unavailable:
    """Stands in for a subcommand module that failed to import; running it reports why."""

    def __init__(self, name: str, err: ImportError):
        self.name, self.err = name, err

    def add_arguments(self, parser) -> None:
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(self, args) -> int:
        print(f"Error: the {self.name} command is unavailable: {self.err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``matchrec`` console script and of ``python -m matchrec``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser, modules = build_parser()
        if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
            argv = [DEFAULT_SUBCOMMAND, *argv]
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help, --version and usage errors
            return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
        return modules[args.subcommand].run(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()  # the reader (e.g. head) left; nothing more to say
        return 141
    except Exception as err:  # noqa: BLE001 - users get a message, not a traceback
        import matchrec
        if isinstance(err, (matchrec.Error, OSError)):
            print(error_text(str(err)), file=sys.stderr)
            return 1
        if os.environ.get("MATCHREC_DEBUG"):
            raise
        print(f"matchrec: internal error: {type(err).__name__}: {err} "
              "(set MATCHREC_DEBUG=1 to see the traceback)", file=sys.stderr)
        return 1


def error_text(message: str) -> str:
    """``message`` prefixed with ``Error:`` unless it already names its kind (``Parser Error: ...``)."""
    first = message.split("\n", 1)[0]
    return message if re.match(r"[\w ]*Error:", first) else f"Error: {message}"


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
