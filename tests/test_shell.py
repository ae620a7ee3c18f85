"""Tests of ``matchrec shell``: in process (Shell on StringIO), through a pipe, through a pty."""
from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import time

import pytest

import matchrec
from matchrec.shell import Shell, format_table, split_complete

VSHAPE = """SELECT * FROM (VALUES (1, 90), (2, 80), (3, 70), (4, 75)) t(id, value)
MATCH_RECOGNIZE (
  ORDER BY id MEASURES FIRST(id) AS s, LAST(id) AS e ONE ROW PER MATCH
  PATTERN (A B+ C) DEFINE B AS B.value < PREV(B.value), C AS C.value > PREV(C.value));
"""
BAD_DEFINE = "SELECT * FROM (VALUES (1)) t(id) MATCH_RECOGNIZE (ORDER BY id PATTERN (A+) DEFINE B AS id > 1);\n"


@pytest.fixture
def shell(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    con = matchrec.connect()
    sh = Shell(con, out=io.StringIO(), err=io.StringIO())
    yield sh
    con.close()


def cells(text: str) -> list[list[str]]:
    """The cells of every box-table row in ``text``."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.strip().startswith("│")]


def run(sh: Shell, text: str) -> tuple[bool, str, str]:
    sh.out.seek(0), sh.out.truncate()
    sh.err.seek(0), sh.err.truncate()
    ok = sh.run_script(text)
    return ok, sh.out.getvalue(), sh.err.getvalue()


# ---------------------------------------------------------------- statement splitting
@pytest.mark.parametrize("text, statements, rest", [
    ("SELECT 1;", ["SELECT 1"], ""),
    ("SELECT 1; SELECT 2", ["SELECT 1"], " SELECT 2"),
    ("SELECT ';' AS x;", ["SELECT ';' AS x"], ""),
    ("SELECT 'it''s;' ;", ["SELECT 'it''s;' "], ""),
    ('SELECT 1 AS "a;b";', ['SELECT 1 AS "a;b"'], ""),
    ("SELECT 1 -- ;\n;", ["SELECT 1 -- ;\n"], ""),
    ("SELECT /* ; */ 1;", ["SELECT /* ; */ 1"], ""),
    ("SELECT $$a;b$$;", ["SELECT $$a;b$$"], ""),
    ("SELECT 'open;", [], "SELECT 'open;"),
    ("SELECT 1; /* open ;", ["SELECT 1"], " /* open ;"),
    ("SELECT $1;", ["SELECT $1"], ""),
])
def test_split_complete(text, statements, rest):
    assert split_complete(text) == (statements, rest)


# ---------------------------------------------------------------- in process
def test_multiline_statement_and_match_recognize(shell):
    ok, out, err = run(shell, "SELECT 1 AS a,\n  2 AS b\n;\n" + VSHAPE)
    assert ok and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("┌") and "│    a    │    b    │" in lines
    assert "│ integer │ integer │" in lines
    assert ["1", "4"] in cells(out)


def test_error_then_success_continues(shell):
    ok, out, err = run(shell, BAD_DEFINE + "SELECT 42 AS answer;\n")
    assert not ok
    assert "DEFINE names 'B'" in err and "Line 1, Col 83." in err
    assert err.rstrip().endswith("^")
    assert ["42"] in cells(out)


def test_timer(shell):
    ok, out, _ = run(shell, ".timer on\nSELECT 1;\nCREATE TABLE t(a INT);\n.timer off\nSELECT 2;\n")
    assert ok
    assert out.count("Run Time: ") == 2
    assert all(line.endswith(" s") for line in out.splitlines() if line.startswith("Run Time: "))
    ok, _, err = run(shell, ".timer maybe\n")
    assert not ok and "Usage: .timer on|off" in err


def test_tables_and_schema(shell):
    ok, out, _ = run(shell, "CREATE TABLE events(id INTEGER, v DOUBLE);\nCREATE VIEW big AS SELECT * FROM events"
                            " WHERE v > 1;\n.tables\n")
    assert ok and out.split() == ["big", "events"]
    ok, out, _ = run(shell, ".schema events\n")
    assert ok and out.strip() == "CREATE TABLE events(id INTEGER, v DOUBLE);"
    ok, out, _ = run(shell, ".schema\n")
    assert "CREATE VIEW big AS" in out and "CREATE TABLE events" in out
    ok, _, err = run(shell, ".schema nothing\n")
    assert not ok and "No table or view named nothing" in err


def test_quiet_statements_print_nothing(shell):
    ok, out, _ = run(shell, "CREATE TABLE t(a INT);\nINSERT INTO t VALUES (1), (2);\nSET threads = 1;\n")
    assert ok and out == ""
    ok, out, _ = run(shell, "INSERT INTO t VALUES (7) RETURNING a;\n")
    assert ["7"] in cells(out)


def test_mode_csv_and_line(shell):
    ok, out, _ = run(shell, ".mode csv\nSELECT 1 AS a, 'x,y' AS b, NULL AS c;\n")
    assert ok and out == 'a,b,c\n1,"x,y",\n'
    ok, out, _ = run(shell, ".mode line\nSELECT 1 AS a, 'hello' AS long_name;\n")
    assert out == "        a = 1\nlong_name = hello\n"
    ok, _, err = run(shell, ".mode html\n")
    assert not ok and "Usage: .mode" in err


def test_explain_prints_plan_verbatim(shell):
    ok, out, _ = run(shell, "EXPLAIN " + VSHAPE)
    assert ok
    assert out.startswith("MATCH_RECOGNIZE #1\nlogical:\n")
    assert "  pattern: A B+ C" in out and "explain_value" not in out
    duckdb_plan = min(out.find(corner) for corner in "╭┌" if corner in out)  # DuckDB draws its plan in boxes
    assert out.index("program:") < duckdb_plan


def test_maxrows_footer_and_null(shell):
    ok, out, _ = run(shell, "SELECT range AS x, NULL AS n FROM range(100);\n")
    lines = out.splitlines()
    assert lines[-1] == "100 rows (40 shown)"
    assert "NULL" in lines[5]
    assert any("·" in line for line in lines)
    body = [line for line in lines if line.startswith("│") and "NULL" in line]
    assert len(body) == 40 and body[0].split()[1] == "0" and body[-1].split()[1] == "99"
    ok, out, _ = run(shell, ".maxrows 5\nSELECT * FROM range(10);\n")
    assert out.splitlines()[-1] == "10 rows (5 shown)"
    ok, out, _ = run(shell, ".maxrows 0\nSELECT * FROM range(100);\n")
    assert "shown" not in out and out.count("\n") == 100 + 5


def test_read_file(shell, tmp_path):
    script = tmp_path / "s.sql"
    script.write_text("CREATE TABLE r AS\n  SELECT 5 AS five;\n.mode csv\nSELECT * FROM r;\n")
    ok, out, _ = run(shell, f".read {script}\n")
    assert ok and out == "five\n5\n"
    ok, _, err = run(shell, f".read {tmp_path / 'missing.sql'}\n")
    assert not ok and "Cannot read" in err


def test_quit_stops(shell):
    ok, out, _ = run(shell, "SELECT 1 AS a;\n.quit\nSELECT 2 AS b;\n")
    assert ok and "a" in out and "b" not in out and shell.done


def test_help_and_unknown_command(shell):
    ok, out, _ = run(shell, ".help\n")
    assert ok and ".timer on|off" in out and ".read FILE" in out
    ok, _, err = run(shell, ".frobnicate\n")
    assert not ok and "Unknown command .frobnicate" in err


def test_wide_table_drops_middle_columns():
    names = [f"column_{i}" for i in range(12)]
    text = format_table(names, ["varchar"] * 12, [tuple("v" * 30 for _ in names)], max_width=80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "column_0" in lines[1] and "column_11" in lines[1] and "…" in lines[1]
    assert lines[-1].startswith("12 columns (") and lines[-1].endswith(" shown)")


def test_long_values_are_truncated():
    text = format_table(["s"], ["varchar"], [("x" * 100,), ("a\nb",)], max_col_width=10)
    assert "│ xxxxxxxxx… │" in text and "a\\nb" in text


# ---------------------------------------------------------------- through a pipe
def _cli(*args, stdin: str | None = None, env=None, timeout=60):
    environment = {**os.environ, "MATCHREC_HISTORY": "", **(env or {})}
    environment.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "matchrec", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=environment)


def test_pipe_script_with_failure():
    script = ("SELECT 1 AS a,\n 2 AS b;\n" + BAD_DEFINE + ".timer on\nSELECT 'after' AS s;\n.mode csv\n"
              "CREATE TABLE t AS SELECT * FROM range(3) r(x);\nSELECT * FROM t;\n.tables\n.schema t\n")
    proc = _cli("shell", stdin=script)
    assert proc.returncode == 1
    assert "matchrec>" not in proc.stdout and "...>" not in proc.stdout
    assert ["1", "2"] in cells(proc.stdout) and ["after"] in cells(proc.stdout)
    assert "Run Time: " in proc.stdout
    assert "x\n0\n1\n2\n" in proc.stdout and "CREATE TABLE t(x BIGINT);" in proc.stdout
    assert "Line 1, Col 83." in proc.stderr and "Traceback" not in proc.stderr


def test_pipe_success_and_file_database(tmp_path):
    db = str(tmp_path / "x.duckdb")
    proc = _cli("shell", db, stdin="CREATE TABLE k AS SELECT 1 AS one;\n")
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    proc = _cli("shell", db, stdin=".mode csv\nSELECT * FROM k\n")  # no final semicolon
    assert proc.returncode == 0 and proc.stdout == "one\n1\n"


# ---------------------------------------------------------------- through a pseudo-terminal
class Pty:
    """A child process on a pseudo-terminal, read with timeouts."""

    def __init__(self, argv: list[str], env: dict):
        import fcntl
        import pty
        import struct
        import termios
        self.fd, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        name = os.ttyname(slave)
        os.close(slave)
        # posix_spawn instead of fork: forking a process with running threads (DuckDB's) is not
        # safe. In a new session, opening the terminal makes it the controlling terminal, so
        # Ctrl-C reaches the shell; SIGINT is reset because a background job inherits it ignored.
        self.pid = os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=(signal.SIGINT,), file_actions=[
            (os.POSIX_SPAWN_CLOSE, self.fd),
            (os.POSIX_SPAWN_OPEN, 0, name, os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1),
            (os.POSIX_SPAWN_DUP2, 0, 2),
        ])
        self.output = b""

    def expect(self, text: str, timeout: float = 10.0) -> str:
        """Read until ``text`` appears after what earlier calls consumed; return the new output."""
        wanted = text.encode()
        deadline = time.monotonic() + timeout
        while wanted not in self.output:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                raise AssertionError(f"timed out waiting for {text!r}; got {self.output.decode(errors='replace')!r}")
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"EOF waiting for {text!r}; got {self.output.decode(errors='replace')!r}")
            self.output += chunk
        head, _, self.output = self.output.partition(wanted)
        return (head + wanted).decode(errors="replace")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if select.select([self.fd], [], [], 0.05)[0]:
                    os.read(self.fd, 65536)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        self.kill()
        raise AssertionError("the shell did not exit")

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


@pytest.mark.skipif(not sys.platform.startswith(("linux", "darwin")), reason="needs a POSIX pty")
def test_pty_session(tmp_path):
    history = tmp_path / "history"
    env = {**os.environ, "TERM": "dumb", "MATCHREC_HISTORY": str(history), "HOME": str(tmp_path)}
    env.pop("COLUMNS", None)
    term = Pty([sys.executable, "-m", "matchrec", "shell"], env)
    try:
        banner = term.expect("matchrec> ")
        assert ".help" in banner
        term.send("SELECT 40 +\r")
        term.expect("     ...> ")
        term.send("2 AS answer;\r")
        result = term.expect("matchrec> ")
        assert ["answer"] in cells(result) and ["42"] in cells(result)
        term.send(BAD_DEFINE.replace("\n", "\r"))
        result = term.expect("matchrec> ")
        assert "Line 1, Col 83." in result and "^" in result and "Traceback" not in result
        term.send(".timer on\r")
        term.expect("matchrec> ")
        term.send("SELECT 'still alive' AS s;\r")
        result = term.expect("matchrec> ")
        assert "still alive" in result and "Run Time: " in result
        term.send("SELECT 'typing\r")
        term.expect("     ...> ")
        # CPython's readline notices a SIGINT that lands between drawing the prompt and
        # waiting for input only at the next keypress; a person never types that fast.
        time.sleep(0.5)
        term.send("\x03")  # Ctrl-C abandons the unfinished statement
        term.expect("matchrec> ")
        term.send("SELECT 7 AS seven;\r")
        assert ["7"] in cells(term.expect("matchrec> "))
        term.send("\x04")  # Ctrl-D ends the session
        assert term.wait() == 0
    finally:
        term.kill()
    lines = history.read_text().splitlines()
    assert "SELECT 40 + 2 AS answer;" in lines  # a multi-line statement is one history entry
    assert "SELECT 7 AS seven;" in lines
