"""The ``matchrec shell`` SQL shell: statement splitting, dot commands, result rendering.

It behaves like the DuckDB CLI. Interactively (stdin is a terminal) it prompts, edits lines
and keeps history with ``readline``; otherwise it reads statements from stdin silently and
exits with status 1 if any failed. Statements end with ``;`` and may span lines; a line
starting with ``.`` outside a statement is a dot command (``.help`` lists them).
Results render as a box table (``format_table``, also used by ``matchrec demo``), CSV or
one ``column = value`` line per column.
"""
from __future__ import annotations

import collections
import csv
import os
import re
import sys
import time
from typing import Iterable, TextIO

import matchrec
from matchrec.render import (DEFAULT_MAX_COL_WIDTH, _pad, _type_name, display_width, format_table,  # noqa: F401
                             format_value, terminal_width)

PROMPT = "matchrec> "
CONTINUATION = "     ...> "
DEFAULT_MAX_ROWS = 40
FETCH_BATCH = 2048

HELP = """\
.exit, .quit          Leave the shell
.help                 Show this message
.maxrows N            Rows shown by the table mode (0: all; default 40)
.maxwidth N           Widest column of the table mode, in characters (default 40)
.mode table|csv|line  Result format (csv and line print every row)
.plot FILE [time=C partition=C match=C classifier=C]
                      Write the match timeline of the last query (run again) to
                      FILE (.html or .svg); the query needs ALL ROWS PER MATCH with
                      MATCH_NUMBER() and CLASSIFIER() measures
.read FILE            Run the SQL statements and dot commands of FILE
.schema [TABLE]       CREATE statements of all tables and views, or of one
.tables [PATTERN]     Names of tables and views (PATTERN as in LIKE)
.timer on|off         Print the run time of each statement

SQL statements end with ';' and may span several lines. EXPLAIN <query> prints
matchrec's MATCH_RECOGNIZE plan followed by DuckDB's plan."""

# Statements whose (row count) result DuckDB's CLI does not print either.
_QUIET_KEYWORDS = {
    "ABORT", "ALTER", "ANALYZE", "ATTACH", "BEGIN", "CHECKPOINT", "COMMENT", "COMMIT", "COPY", "CREATE",
    "DEALLOCATE", "DELETE", "DETACH", "DROP", "END", "EXPORT", "FORCE", "IMPORT", "INSERT", "INSTALL", "LOAD",
    "MERGE", "PREPARE", "RESET", "ROLLBACK", "SET", "START", "TRUNCATE", "UPDATE", "USE", "VACUUM",
}
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_]\w*)?\$")
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_FIRST_WORD = re.compile(r"[\s(]*([A-Za-z_]+)")


# ---------------------------------------------------------------- statement splitting
def split_complete(text: str) -> tuple[list[str], str]:
    """Split ``text`` on top-level semicolons: (complete statements, unfinished rest).

    Quotes, comments and dollar-quoted strings hide semicolons; an unterminated one makes
    everything from the last complete statement on the unfinished rest.
    """
    out: list[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            j = i + 1
            while True:
                j = text.find(c, j)
                if j < 0:
                    return out, text[start:]
                if text.startswith(c, j + 1):  # a doubled quote is an escaped quote
                    j += 2
                    continue
                break
            i = j + 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                return out, text[start:]
            i = j + 2
        elif c == "$" and (m := _DOLLAR_TAG.match(text, i)):
            j = text.find(m.group(0), m.end())
            if j < 0:
                return out, text[start:]
            i = j + len(m.group(0))
        elif c == ";":
            out.append(text[start:i])
            start = i = i + 1
        else:
            i += 1
    return out, text[start:]


def is_blank(sql: str) -> bool:
    """True when ``sql`` holds nothing but whitespace and comments."""
    return not _COMMENTS.sub("", sql).strip()


def _shows_result(sql: str) -> bool:
    m = _FIRST_WORD.match(_COMMENTS.sub(" ", sql))
    if not m or m.group(1).upper() not in _QUIET_KEYWORDS:
        return True
    return re.search(r"\bRETURNING\b", sql, re.I) is not None


class _History:
    """readline line editing and the history file (``~/.matchrec_history`` or $MATCHREC_HISTORY)."""

    def __init__(self):
        try:
            import readline
        except ImportError:  # e.g. Python built without it: plain input() still works
            readline = None
        self.rl = readline
        env = os.environ.get("MATCHREC_HISTORY")
        self.path = None if env == "" else env or os.path.join(os.path.expanduser("~"), ".matchrec_history")
        if self.rl is None:
            return
        try:
            self.rl.set_history_length(2000)
            if self.path and os.path.exists(self.path):
                self.rl.read_history_file(self.path)
        except (OSError, AttributeError):
            pass

    def length(self) -> int:
        try:
            return self.rl.get_current_history_length() if self.rl else 0
        except AttributeError:
            return 0

    def collapse(self, start: int, lines: list[str]) -> None:
        """Replace the separate lines of a multi-line statement by one entry, as DuckDB does."""
        end = self.length()
        if self.rl is None or end - start < 2 or any("--" in ln for ln in lines):
            return  # a '--' comment would swallow the lines joined after it
        try:
            for i in range(end - 1, start - 1, -1):
                self.rl.remove_history_item(i)
            self.rl.add_history(" ".join(ln.strip() for ln in lines if ln.strip()))
        except (AttributeError, ValueError):
            pass

    def save(self) -> None:
        if self.rl is None or not self.path:
            return
        try:
            self.rl.write_history_file(self.path)
        except OSError:
            pass


# ---------------------------------------------------------------- the shell
class Shell:
    """Runs statements and dot commands against a matchrec Connection, printing to ``out``/``err``."""

    def __init__(self, connection: matchrec.Connection, out: TextIO | None = None, err: TextIO | None = None,
                 interactive: bool = False):
        self.con = connection
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.interactive = interactive
        self.mode = "table"
        self.maxrows = DEFAULT_MAX_ROWS
        self.max_col_width = DEFAULT_MAX_COL_WIDTH
        self.timer = False
        self.failed = False
        self.done = False
        self._depth = 0
        self.last_query: str | None = None  # the last statement that returned rows, for .plot

    # -- input
    def run_script(self, text: str) -> bool:
        """Run every statement and dot command of ``text``; False if any failed."""
        return self.run_lines(text.splitlines())

    def run_lines(self, lines: Iterable[str]) -> bool:
        failed_before, self.failed = self.failed, False
        pending = ""
        for line in lines:
            if self.done:
                break
            pending = self.feed(pending, line.rstrip("\r\n"))
        if not self.done and not is_blank(pending):
            self.run_sql(pending)  # a last statement may omit its semicolon
        ok = not self.failed
        self.failed = failed_before or self.failed
        return ok

    def feed(self, pending: str, line: str) -> str:
        """Add ``line`` to the unfinished statement ``pending``; run what completes; return the rest."""
        if is_blank(pending) and line.lstrip().startswith("."):
            self.run_command(line.strip())
            return ""
        statements, rest = split_complete(pending + line + "\n")
        for sql in statements:
            if self.done:
                break
            if not is_blank(sql):
                self.run_sql(sql)
        return rest if not is_blank(rest) else ""

    def interact(self, database: str = ":memory:") -> None:
        """The prompt loop; returns at end of input (Ctrl-D) or on .quit."""
        import duckdb
        history = _History()
        where = "a transient in-memory database" if database == ":memory:" else database
        print(f"matchrec {getattr(matchrec, '__version__', '?')} (DuckDB {duckdb.__version__}): "
              f"SQL:2016 MATCH_RECOGNIZE for DuckDB\n"
              f'Enter ".help" for usage hints. Connected to {where}.', file=self.out)
        pending, lines, start = "", [], history.length()
        try:
            while not self.done:
                try:
                    line = input(CONTINUATION if pending else PROMPT)
                except EOFError:
                    print(file=self.out)
                    break
                except KeyboardInterrupt:  # Ctrl-C drops the statement being typed
                    print(file=self.out)
                    pending, lines, start = "", [], history.length()
                    continue
                lines.append(line)
                pending = self.feed(pending, line)
                if not pending:
                    history.collapse(start, lines)
                    lines, start = [], history.length()
                self.out.flush()
        finally:
            history.save()

    # -- SQL
    def run_sql(self, sql: str) -> bool:
        sql = sql.strip()  # error positions then count from the statement's first character
        started = time.perf_counter()
        ok = True
        try:
            cur = self.con.cursor()
            try:
                cur.execute(sql)
                if cur.description is not None and _shows_result(sql):
                    if cur.description[0][0] != "explain_key":
                        self.last_query = sql
                    self._print_result(cur)
            finally:
                cur.close()
        except matchrec.Error as err:
            ok = self._error(str(err))
        except KeyboardInterrupt:
            if not self.interactive:
                raise
            ok = self._error("Interrupted")
        if self.timer:
            print(f"Run Time: {time.perf_counter() - started:.3f} s", file=self.out)
        self.out.flush()
        return ok

    def _error(self, message: str) -> bool:
        from matchrec.cli import error_text
        print(error_text(message), file=self.err)
        self.err.flush()
        self.failed = True
        return False

    def _print_result(self, cur) -> None:
        names = [d[0] for d in cur.description]
        types = [_type_name(d[1]) for d in cur.description]
        if names == ["explain_key", "explain_value"]:
            for _key, value in cur.fetchall():
                print(str(value).rstrip("\n"), file=self.out)
                print(file=self.out)
            return
        if self.mode == "csv":
            writer = csv.writer(self.out, lineterminator="\n")
            writer.writerow(names)
            for batch in iter(lambda: cur.fetchmany(FETCH_BATCH), []):
                writer.writerows([[("" if v is None else format_value(v)) for v in row] for row in batch])
            return
        if self.mode == "line":
            width = max((display_width(n) for n in names), default=0)
            first = True
            for batch in iter(lambda: cur.fetchmany(FETCH_BATCH), []):
                for row in batch:
                    if not first:
                        print(file=self.out)
                    first = False
                    for name, value in zip(names, row):
                        print(f"{_pad(name, width, 'right')} = {format_value(value)}", file=self.out)
            return
        self._print_table(cur, names, types)

    def _print_table(self, cur, names: list[str], types: list[str]) -> None:
        # Keep the head and a rolling tail so a huge result never sits in memory.
        limit = self.maxrows
        head_n = (limit + 1) // 2 if limit else None
        kept: list[tuple] = []
        tail: collections.deque = collections.deque(maxlen=limit // 2 if limit else None)
        total = 0
        for batch in iter(lambda: cur.fetchmany(FETCH_BATCH), []):
            total += len(batch)
            if limit and len(kept) < limit:
                kept.extend(batch[:limit - len(kept)])
            elif not limit:
                kept.extend(batch)
            if limit:
                tail.extend(batch)
        split = None
        if limit and total > limit:
            split = head_n
            kept = kept[:head_n] + (list(tail) if limit // 2 else [])
        print(format_table(names, types, kept, total=total, split=split, max_width=terminal_width(self.out),
                           max_col_width=self.max_col_width), file=self.out)

    # -- dot commands
    def run_command(self, line: str) -> bool:
        parts = line.split(None, 1)
        name, arg = parts[0].lower(), (parts[1].strip() if len(parts) > 1 else "")
        handler = {
            ".exit": self._cmd_quit, ".quit": self._cmd_quit, ".help": self._cmd_help, ".timer": self._cmd_timer,
            ".tables": self._cmd_tables, ".schema": self._cmd_schema, ".mode": self._cmd_mode,
            ".maxrows": self._cmd_maxrows, ".maxwidth": self._cmd_maxwidth, ".read": self._cmd_read,
            ".plot": self._cmd_plot,
        }.get(name)
        if handler is None:
            return self._error(f'Unknown command {name}: enter ".help" for the list of commands')
        try:
            return handler(arg) is not False
        except matchrec.Error as err:
            return self._error(str(err))
        finally:
            self.out.flush()

    def _cmd_quit(self, arg: str) -> None:
        self.done = True

    def _cmd_help(self, arg: str) -> None:
        print(HELP, file=self.out)

    def _cmd_timer(self, arg: str):
        if arg.lower() not in ("on", "off"):
            return self._error("Usage: .timer on|off")
        self.timer = arg.lower() == "on"

    def _cmd_mode(self, arg: str):
        mode = {"box": "table", "duckbox": "table"}.get(arg.lower(), arg.lower())
        if not arg:
            print(f"current output mode: {self.mode}", file=self.out)
        elif mode in ("table", "csv", "line"):
            self.mode = mode
        else:
            return self._error("Usage: .mode table|csv|line")

    def _cmd_maxrows(self, arg: str):
        return self._set_int(arg, "maxrows", "Usage: .maxrows N (0 shows every row)")

    def _cmd_maxwidth(self, arg: str):
        return self._set_int(arg, "max_col_width", "Usage: .maxwidth N")

    def _set_int(self, arg: str, attr: str, usage: str):
        if not arg:
            print(getattr(self, attr), file=self.out)
            return None
        if not arg.isdigit():
            return self._error(usage)
        setattr(self, attr, int(arg))

    def _query(self, sql: str, params=None) -> list[tuple]:
        cur = self.con.cursor()
        try:
            return cur.execute(sql, params).fetchall()
        finally:
            cur.close()

    def _cmd_tables(self, arg: str) -> None:
        rows = self._query(
            "SELECT database_name, schema_name, name FROM ("
            " SELECT database_name, schema_name, table_name AS name FROM duckdb_tables() WHERE NOT internal"
            " UNION ALL SELECT database_name, schema_name, view_name FROM duckdb_views() WHERE NOT internal)"
            " WHERE name ILIKE ? ORDER BY name", [arg or "%"])
        current = self._query("SELECT current_database(), current_schema()")[0]
        names = []
        for db, schema, name in rows:
            qualified = name if (schema == "main" and db in (current[0], "temp")) else f"{schema}.{name}"
            names.append(qualified if db in (current[0], "temp") else f"{db}.{qualified}")
        if names:
            self._print_columns(names)

    def _print_columns(self, names: list[str]) -> None:
        width = max(display_width(n) for n in names) + 2
        per_line = max(1, (terminal_width(self.out) or 80) // width)
        per_col = -(-len(names) // per_line)
        for r in range(per_col):
            print("".join(_pad(n, width, "left") for n in names[r::per_col]).rstrip(), file=self.out)

    def _cmd_schema(self, arg: str):
        table = arg.strip().strip('"')
        rows = self._query(
            "SELECT schema_name, name, sql FROM ("
            " SELECT schema_name, table_name AS name, sql FROM duckdb_tables() WHERE NOT internal"
            " UNION ALL SELECT schema_name, view_name, sql FROM duckdb_views() WHERE NOT internal)"
            " WHERE ? = '' OR lower(name) = lower(?) OR lower(schema_name || '.' || name) = lower(?)"
            " ORDER BY name", [table, table, table])
        if table and not rows:
            return self._error(f"No table or view named {table}")
        for schema, name, sql in rows:
            if sql:
                print(sql.rstrip().rstrip(";") + ";", file=self.out)
                continue
            columns = self._query("SELECT column_name, data_type FROM duckdb_columns() "
                                  "WHERE schema_name = ? AND table_name = ? ORDER BY column_index", [schema, name])
            print(f"{name}(" + ", ".join(f"{c} {t}" for c, t in columns) + ");", file=self.out)

    def _cmd_plot(self, arg: str):
        usage = "Usage: .plot FILE [time=COLUMN] [partition=COLUMN] [match=COLUMN] [classifier=COLUMN]"
        words = arg.split()
        if not words:
            return self._error(usage)
        path, columns = os.path.expanduser(words[0].strip("'\"")), {}
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key not in ("time", "partition", "match", "classifier") or not value:
                return self._error(usage)
            columns[key] = value
        if self.last_query is None:
            return self._error("No query to plot: run a query with ALL ROWS PER MATCH, MATCH_NUMBER() and "
                               "CLASSIFIER() first")
        from matchrec import plot
        cur = self.con.cursor()
        try:
            # the shell streams results without keeping them, so the query runs once more
            drawn = plot.timeline(cur.execute(self.last_query), **columns)
        finally:
            cur.close()
        written = drawn.save(path)
        print(f"{drawn.matches} matches in {drawn.partitions} partitions written to {written}", file=self.out)

    def _cmd_read(self, arg: str):
        path = os.path.expanduser(arg.strip().strip("'\""))
        if not path:
            return self._error("Usage: .read FILE")
        if self._depth >= 16:
            return self._error(f"Too many nested .read commands (at {path})")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as err:
            return self._error(f"Cannot read {path}: {getattr(err, 'strerror', None) or err}")
        self._depth += 1
        try:
            return self.run_script(text)
        finally:
            self._depth -= 1


# ---------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    parser.add_argument("database", nargs="?", default=":memory:",
                        help="DuckDB database file (default: a transient in-memory database)")
    parser.add_argument("--dialect", default="duckdb", help="SQL dialect of the statements (default: duckdb)")
    parser.add_argument("-c", "--command", dest="sql", metavar="SQL",
                        help="run SQL (statements or a dot command) and exit")
    parser.add_argument("--read-only", action="store_true", help="open the database read-only")


def run(args) -> int:
    """``matchrec shell``: 0 on success, 1 if a statement failed in a script or -c."""
    con = matchrec.connect(args.database, dialect=args.dialect, read_only=args.read_only)
    try:
        interactive = args.sql is None and sys.stdin.isatty()
        if not interactive:  # DuckDB's progress bar would end up in the output of scripts
            con.cursor().execute("SET enable_progress_bar = false")
        if args.sql is not None:
            shell = Shell(con)
            return 0 if shell.run_script(args.sql) else 1
        if interactive:
            Shell(con, interactive=True).interact(args.database)
            return 0
        shell = Shell(con)
        return 0 if shell.run_lines(sys.stdin) else 1
    finally:
        con.close()
