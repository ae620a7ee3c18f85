"""Start-up costs: ``import matchrec`` and the demo's queries in fresh processes.

    python bench/bench_startup.py [--rows N] [--imports K] [--compare LABEL=PATH ...] [--append]

Every figure comes from a new interpreter. ``import`` is the wall time of ``import matchrec``
measured inside the process (the interpreter's own start excluded), best of K, beside
``import duckdb`` for scale. The demo (``python -m matchrec demo``) runs with
NUMBA_CACHE_DIR and MATCHREC_CACHE_DIR pointing at a new empty folder: first with nothing
cached (no compiled kernel, no parser tables), then a second run finding what the first cached,
then, in another empty folder, after the step ``pip install -e .`` adds to the build (compiling
the kernels into numba's cache, buildtools/matchrec_build.py), as a fresh install would. The per-query times are those the demo prints; ``process`` is the run's wall time and
``cpu`` its user + system CPU time (which a busy machine inflates less than wall time).

``--compare LABEL=PATH`` measures another checkout of matchrec (e.g. an older commit exported
with ``git archive``) in the same run, before this one, so the two can be compared on the same
load. ``--append`` adds the table to bench/RESULTS.md as a new section.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "RESULTS.md")


def _env(root: str, cache: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = os.path.join(cache, "numba")
        env["MATCHREC_CACHE_DIR"] = os.path.join(cache, "matchrec")
    return env


def import_time(root: str, module: str, runs: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return min(float(subprocess.run([sys.executable, "-c", code], env=_env(root), check=True, capture_output=True,
                                    text=True, cwd=root).stdout) for _ in range(runs))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def demo(root: str, rows: int, cache: str) -> dict:
    cpu, started = _children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "matchrec", "demo", "--rows", str(rows)], env=_env(root, cache),
                          capture_output=True, text=True, cwd=root)
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if done.returncode:
        raise SystemExit(f"the demo failed:\n{done.stderr}")
    line = next(l for l in done.stdout.splitlines() if l.startswith("Timings (s): "))
    figures = re.findall(r"([A-Za-z][A-Za-z -]*?) ([0-9.]+)(?:,|$)", line[len("Timings (s): "):])
    return {"process": wall, "cpu": cpu, **{k.strip(): float(v) for k, v in figures}}


def install_step(root: str, cache: str) -> float | None:
    """CPU seconds of the editable install's kernel compile (buildtools/matchrec_build.py), run
    the way that backend runs it; None for a checkout without it."""
    if not os.path.exists(os.path.join(root, "buildtools", "matchrec_build.py")):
        return None
    cpu = _children_cpu()
    subprocess.run([sys.executable, "-c", "from matchrec.operators import compiled; compiled.precompile()"],
                   env=_env(root, cache), cwd=root, check=True)
    return _children_cpu() - cpu


def measure(label: str, root: str, rows: int, imports: int) -> list[str]:
    rows_out = []
    imp = import_time(root, "matchrec", imports)

    def row(state: str, r: dict) -> None:
        rows_out.append(f"| {label} | {imp:.3f} | {state} | {r['V-shape']:.2f} | {r['crime sequence']:.2f} | "
                        f"{r['generation']:.2f} | {r['total']:.2f} | {r['process']:.2f} | {r['cpu']:.2f} |")
        print(rows_out[-1], flush=True)

    with tempfile.TemporaryDirectory(prefix="matchrec-bench-") as cache:
        row("empty caches, no install step", demo(root, rows, cache))
        row("second run", demo(root, rows, cache))
    with tempfile.TemporaryDirectory(prefix="matchrec-bench-") as cache:
        step = install_step(root, cache)
        if step is not None:
            row(f"fresh install (its kernel compile: {step:.1f} s cpu)", demo(root, rows, cache))
    return rows_out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--imports", type=int, default=5, help="runs of each import (the best is shown)")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=PATH",
                        help="another matchrec checkout to measure first")
    parser.add_argument("--append", action="store_true", help="add the results to bench/RESULTS.md")
    args = parser.parse_args()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    duck = import_time(ROOT, "duckdb", args.imports)
    header = ["| matchrec | import matchrec s | demo run | V-shape s | crime sequence s | generation s | "
              "demo total s | process s | process cpu s |", "|---|---|---|---|---|---|---|---|---|"]
    print(*header, sep="\n")
    table = list(header)
    for spec in args.compare:
        label, _, path = spec.partition("=")
        table += measure(label, os.path.abspath(path), args.rows, args.imports)
    head = _git("rev-parse", "--short", "HEAD") + (" with uncommitted changes" if _git("status", "--porcelain",
                                                                                         "matchrec") else "")
    table += measure(f"this checkout (git {head})", ROOT, args.rows, args.imports)
    print(f"import duckdb alone: {duck:.3f} s; load average at the start {load:.1f}")
    if args.append:
        shown = [f"--compare '{c.partition('=')[0]}=<checkout>'" for c in args.compare]
        cmd = " ".join(["python bench/bench_startup.py", f"--rows {args.rows}", f"--imports {args.imports}",
                        *shown, "--append"])
        section = [f"## Start-up: `{cmd}`", "",
                   f"- {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python "
                   f"{platform.python_version()}; date {when}; load average {load:.1f} at the start "
                   "(other work shared the machine: compare rows of this run, not absolute times)",
                   f"- {args.rows:,} rows per table; `import duckdb` alone {duck:.3f} s (best of {args.imports})",
                   "- empty caches: new NUMBA_CACHE_DIR and MATCHREC_CACHE_DIR folders (no compiled kernel, no "
                   "parser tables); second run: the same folders as the first left them; fresh install: new "
                   "folders, filled by the editable install's kernel compile only (the parser tables are built "
                   "by the demo)", "", *table, ""]
        with open(RESULTS, "a") as f:
            f.write("\n" + "\n".join(section))


if __name__ == "__main__":
    main()
