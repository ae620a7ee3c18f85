"""One large run of a must-have query in a fresh process: time and peak memory.

    python -m bench.big_run --rows 100000000 --only crimes

Used for the 100 M-row crimes run (the full benchmark would also try the slow baselines at
that size). Prints one line per run: rows, matches, seconds, peak resident memory.
"""
from __future__ import annotations

import argparse
import resource
import time

import matchrec
from bench import datasets
from bench.queries import QUERIES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--only", default="crimes")
    ap.add_argument("--data-dir", default="bench/.data")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--append", default=None, help="also append the lines as a section of this Markdown file")
    args = ap.parse_args()
    lines = []
    query = QUERIES[args.only]
    path = datasets.ensure(args.data_dir, query.dataset, args.rows)
    con = matchrec.connect(path, read_only=True)
    cur = con.cursor()
    sql = f"SELECT count(*) FROM ({query.matchrec})"
    for run in range(args.runs):
        started = time.perf_counter()
        cur.execute(sql)
        (matches,) = cur.fetchone()
        seconds = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        stats = cur.stats[0][1]
        line = (f"{args.only} rows={args.rows:,} run={run + 1} matches={matches:,} seconds={seconds:.2f} "
                f"peak_mb={peak:,.0f} rows_matched_after_filter={stats.rows_in:,} matcher={stats.matcher}")
        print(line, flush=True)
        lines.append(line)
    if args.append:
        import platform
        with open(args.append, "a") as f:
            f.write(f"\n## Run: `python -m bench.big_run --rows {args.rows} --only {args.only}`\n\n"
                    f"- {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
                    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the dataset was generated beforehand "
                    "(peak memory is the matching process only)\n\n```\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
