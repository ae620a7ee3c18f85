"""Tables, count checks and the RESULTS.md text for a benchmark run.

Ratios are taken between measurements of the same run on the same rows: ``x floor`` is an
engine's time over the DuckDB floor's, ``matchrec / this`` is matchrec's time over the
engine's (below 1: matchrec is faster). Times are the warm (second) run where there was
one, otherwise the first.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess

from bench import datasets
from bench.queries import Query
from bench.runner import ENGINES, FLINK_VENV, PMR_VENV, ROOT, Measurement

HEADER = ["engine", "rows", "first s", "warm s", "rows/s", "matches", "x floor", "matchrec / this", "peak MB",
          "notes"]


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    r = a / b
    return f"{r:,.0f}x" if r >= 100 else f"{r:.2f}x" if r >= 0.01 else f"{r:.4f}x"


def _notes(q: Query, m: Measurement) -> str:
    if m.error:
        return "FAILED: " + m.error.replace("|", "/")
    e = m.extra
    if m.engine in ("matchrec", "reference", "flinkshape"):
        parts = [e.get("matcher") or ""]
        if "match_s" in e:
            parts.append(f"match {e['match_s']:.2f} s")
        return ", ".join(p for p in parts if p)
    if m.engine == "duckdb":
        return "exact" if q.duckdb_exact else "upper bound"
    if m.engine == "floor":
        return "scan + same windows, 1 row out"
    if m.engine == "pmr":
        return f"CSV load {e.get('load_s', 0):.2f} s not timed"
    if m.engine == "flink":
        return f"JVM/env start {e.get('startup_s', 0):.1f} s not timed; ratio vs Flink's statement"
    return ""


def table(q: Query, ms: list[Measurement]) -> list[str]:
    at = {(m.rows, m.engine): m for m in ms}
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for m in ms:
        floor = at.get((m.rows, "floor"))
        mine = at.get((m.rows, "flinkshape" if m.engine == "flink" else "matchrec"))
        vs = "-" if m.engine in ("matchrec", "flinkshape") else _ratio(mine and mine.time, m.time)
        cells = [ENGINES[m.engine], f"{m.rows:,}", _num(m.first), _num(m.warm),
                 f"{m.rows / m.time:,.0f}" if m.time else "-",
                 "-" if m.count is None else f"{m.count:,}",
                 "-" if m.engine == "floor" else _ratio(m.time, floor and floor.time), vs,
                 _num(m.rss_mb, 0), _notes(q, m)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def count_warnings(q: Query, ms: list[Measurement]) -> list[str]:
    """Where an engine's count differs from the one it must equal (same query, same rows)."""
    at = {(m.rows, m.engine): m for m in ms}
    out = []
    for m in ms:
        if m.error:
            out.append(f"WARNING: {q.name} @ {m.rows:,} rows: {ENGINES[m.engine]} failed: {m.error}")
            continue
        if m.count is None or m.engine in ("matchrec", "flinkshape"):
            continue
        ref_engine = "flinkshape" if m.engine == "flink" else "matchrec"
        ref = at.get((m.rows, ref_engine))
        if ref is None or ref.count is None or ref.count == m.count:
            continue
        if m.engine == "duckdb" and not q.duckdb_exact and m.count >= ref.count:
            continue  # an upper bound that holds
        what = (f"{ENGINES[m.engine]} returned {m.count:,} matches, {ENGINES[ref_engine]} {ref.count:,}")
        if m.engine == "flink" and not q.flink_comparable:
            out.append(f"note: {q.name} @ {m.rows:,} rows: {what} (not comparable, see the Flink note)")
        else:
            out.append(f"WARNING: {q.name} @ {m.rows:,} rows: {what}")
    return out


def query_section(q: Query, ms: list[Measurement], growth: dict | None = None) -> tuple[list[str], list[str]]:
    ds = datasets.DATASETS[q.dataset]
    lines = [f"### {q.name}: {q.about}", "",
             f"Dataset `{q.dataset}`: {ds.about}.", ""]
    if q.duckdb:
        kind = "exact" if q.duckdb_exact else "upper bound only"
        lines.append(f"- DuckDB formulation ({kind}): {q.duckdb_note}")
    if any(m.engine == "flink" for m in ms):
        lines.append(f"- Flink ({'comparable' if q.flink_comparable else 'not comparable'}): {q.flink_note}")
    for engine, tried in (growth or {}).items():
        steps = ", ".join(f"{m.rows:,} rows {m.first:.2f} s" if m.first is not None else f"{m.rows:,} rows failed"
                          for m in tried)
        lines.append(f"- {ENGINES[engine]} sample growth (first-run times): {steps}")
    lines.append("")
    lines += table(q, ms)
    warnings = count_warnings(q, ms)
    if warnings:
        lines += [""] + [f"- {w}" for w in warnings]
    return lines + [""], warnings


# ------------------------------------------------------------------ environment
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _venv_version(venv: str, dist: str) -> str | None:
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return None
    try:
        return subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version('{dist}'))"],
                              capture_output=True, text=True, timeout=60, check=False).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "matchrec"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" with uncommitted changes under matchrec/" if dirty else "") + f" (source digest {_digest()})"


def _digest() -> str:
    """A hash of matchrec's source files, which catches edits git has not seen yet."""
    h = hashlib.sha1()
    for folder, dirs, files in sorted(os.walk(os.path.join(ROOT, "matchrec"))):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".py", ".lark")):
                h.update(name.encode())
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:10]


def machine(peers: bool, started: datetime.datetime | None = None) -> list[str]:
    import duckdb
    import numpy
    import pyarrow

    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                if line.startswith("MemTotal")), 0)
    lines = [(f"- CPU: {cpu}, {os.cpu_count()} cores; RAM {mem / 1024 / 1024:.1f} GiB; {platform.system()} "
              f"{platform.release()}"),
             (f"- Python {platform.python_version()}, DuckDB {duckdb.__version__}, pyarrow {pyarrow.__version__}, "
              f"numpy {numpy.__version__}")]
    if peers:
        pmr = _venv_version(PMR_VENV, "pandas-match-recognize")
        flink = _venv_version(FLINK_VENV, "apache-flink")
        pandas = _venv_version(PMR_VENV, "pandas")
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()[:1] \
            if flink else []
        lines.append(f"- Peers: pandas-match-recognize {pmr or 'not installed'} (pandas {pandas or '-'}, own venv), "
                     f"apache-flink {flink or 'not installed'} (own venv{', ' + java[0] if java else ''})")
    lines.append(f"- Date: {started or datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC (start of the run)")
    return lines


def run_section(command: str, settings, sections: list[list[str]], skipped: dict, notes: list[str],
                started: datetime.datetime, git_before: str) -> str:
    lines = [f"## Run: `{command}`", ""]
    lines += machine(settings.peers, started)
    git_after = git_state()
    # matchrec is edited while benchmarks run; say which code was measured.
    lines.append(f"- matchrec at git {git_before}" if git_after == git_before else
                 f"- matchrec changed during the run: git {git_before} at the start, {git_after} at the end")
    lines.append(f"- Settings: seed {settings.seed}; sample budget {settings.budget:.0f} s (slow engines grow "
                 f"their sample 4x until a run exceeds it); {settings.runs} runs per process (second = warm; "
                 f"skipped after a first run over {settings.warm_skip:.0f} s)")
    for peer, why in skipped.items():
        lines.append(f"- {ENGINES[peer]} skipped: {why}")
    for note in notes:
        lines.append(f"- {note}")
    lines.append("")
    for s in sections:
        lines += s
    return "\n".join(lines) + "\n"


PREAMBLE = """# matchrec benchmark results

Written by `python -m bench` (see bench/README.md). Every figure below was measured in the run
whose section it is in; nothing is typed in by hand. `first s` is the first run in a fresh
process (imports done, caches and JIT cold), `warm s` the second run in the same process;
`rows/s`, `x floor` and `matchrec / this` use the warm time when there is one. `peak MB` is
the measuring process's peak RSS (for Flink, plus the JVM's). Ratios compare engines on the
same rows of the same run.

"""


def write(path: str, text: str, append: bool) -> None:
    exists = os.path.exists(path) and os.path.getsize(path) > 0
    with open(path, "a" if append and exists else "w") as f:
        if not (append and exists):
            f.write(PREAMBLE)
        f.write(text)
