"""Start-up costs: ``import matchrec`` and the demo's queries in fresh processes.

    python bench/bench_startup.py [--rows N] [--imports K]

Every figure comes from a new interpreter. ``import`` is the wall time of ``import matchrec``
measured inside the process (the interpreter's own start excluded), best of K, beside
``import duckdb`` for scale. The demo (``python -m matchrec demo``) runs twice with
NUMBA_CACHE_DIR and MATCHREC_CACHE_DIR pointing at a new empty folder: the first run finds no
compiled kernel and no parser tables (a fresh install), the second finds what the first
cached. The per-query times are those the demo prints; ``process`` is the run's wall time.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(cache: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = os.path.join(cache, "numba")
        env["MATCHREC_CACHE_DIR"] = os.path.join(cache, "matchrec")
    return env


def import_time(module: str, runs: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], env=_env(), check=True, capture_output=True,
                                  text=True).stdout) for _ in range(runs)]
    return min(times)


def demo(rows: int, cache: str) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "matchrec", "demo", "--rows", str(rows)], env=_env(cache),
                          capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"the demo failed:\n{done.stderr}")
    line = next(l for l in done.stdout.splitlines() if l.startswith("Timings (s): "))
    figures = dict(re.findall(r"([A-Za-z][A-Za-z -]*?) ([0-9.]+)(?:,|$)", line[len("Timings (s): "):]))
    return {"process": wall, **{k.strip(): float(v) for k, v in figures.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--imports", type=int, default=5, help="runs of each import (the best is shown)")
    args = parser.parse_args()
    print(f"import matchrec  {import_time('matchrec', args.imports):.3f} s   "
          f"(import duckdb {import_time('duckdb', args.imports):.3f} s)")
    with tempfile.TemporaryDirectory(prefix="matchrec-bench-") as cache:
        for label in ("fresh caches", "warm caches"):
            r = demo(args.rows, cache)
            queries = ", ".join(f"{k} {v:.2f} s" for k, v in r.items() if k not in ("process", "total",
                                                                                       "generation", "load"))
            print(f"demo, {label}: {queries}; generation {r['generation']:.2f} s; "
                  f"demo total {r['total']:.2f} s; process {r['process']:.2f} s")


if __name__ == "__main__":
    main()
