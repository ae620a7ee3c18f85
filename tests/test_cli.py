"""Tests of the ``matchrec`` command line (``python -m matchrec``)."""
from __future__ import annotations

import os
import subprocess
import sys

import matchrec
from matchrec.cli import main

BAD = "SELECT * FROM (VALUES (1)) t(id) MATCH_RECOGNIZE (ORDER BY id PATTERN (A+) DEFINE B AS id > 1)"


def matchrec_cli(*args, stdin=""):
    env = {**os.environ, "MATCHREC_HISTORY": ""}
    return subprocess.run([sys.executable, "-m", "matchrec", *args], input=stdin, capture_output=True, text=True,
                          timeout=60, env=env)


def test_version():
    proc = matchrec_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith(f"matchrec {matchrec.__version__} (DuckDB ")


def test_command_good_query():
    proc = matchrec_cli("shell", "-c", "SELECT 6 * 7 AS answer")
    assert proc.returncode == 0 and proc.stderr == ""
    assert "answer" in proc.stdout and "42" in proc.stdout


def test_command_bad_query():
    proc = matchrec_cli("shell", "-c", BAD)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "Line 1, Col 83." in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].strip() == "^"
    assert "Traceback" not in proc.stderr


def test_bad_database_path_is_a_message():
    proc = matchrec_cli("shell", os.path.join(os.sep, "no", "such", "dir", "x.duckdb"), "-c", "SELECT 1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.strip()


def test_in_process(capsys):
    assert main(["-c", "SELECT 'plain' AS s"]) == 0  # no subcommand: the shell
    assert "plain" in capsys.readouterr().out
    assert main(["shell", "-c", BAD]) == 1
    assert "Line 1, Col" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "shell" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_dialect_option(capsys):
    assert main(["shell", "--dialect", "nonsense", "-c", "SELECT 1"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_broken_subcommand_does_not_break_the_others(monkeypatch, capsys):
    from matchrec import cli
    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, ("ghost", "matchrec.no_such_module", "missing")])
    assert main(["ghost"]) == 1
    assert "ghost command is unavailable" in capsys.readouterr().err
    assert main(["shell", "-c", "SELECT 1"]) == 0


def test_unexpected_exception_is_one_line(monkeypatch, capsys):
    from matchrec import shell

    def explode(args):
        raise RuntimeError("boom")
    monkeypatch.setattr(shell, "run", explode)
    monkeypatch.delenv("MATCHREC_DEBUG", raising=False)
    assert main(["shell"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and "Traceback" not in err
