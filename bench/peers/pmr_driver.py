"""pandas-match-recognize driver, run by bench/.pmr-venv's python with a JSON spec.

Loads the CSV into pandas (not timed: it is input preparation, like the DuckDB table the
other engines read), adds epoch-millisecond copies of the timestamp columns (``t`` for the
ORDER BY column, ``x_t`` for ``x_ts``) because the library has no INTERVAL arithmetic, and
times ``match_recognize`` ``runs`` times. Its plan and automaton caches stay on, so the
second run is its warm time; results are not cached (checked: time grows with the input).
"""
import json
import sys
import time

# bench/peers/rss.py: the directory of this script is on sys.path
from rss import peak_rss_kb

RESULT_MARK = "@@BENCH_RESULT@@ "


def main(spec: dict) -> dict:
    import logging

    import pandas as pd
    # The library logs every unsupported condition at ERROR level and then silently treats it
    # as false; keep the log (it explains a 0 count) but only on stderr.
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    from pandas_match_recognize import match_recognize

    names = [c for c, _ in spec["columns"]]
    stamps = [c for c, t in spec["columns"] if t.startswith("TIMESTAMP")]
    started = time.perf_counter()
    df = pd.read_csv(spec["csv"], names=names, header=None, parse_dates=stamps)
    for c in stamps:
        alias = "t" if c == spec["rowtime"] else c[: -len("_ts")] + "_t" if c.endswith("_ts") else c + "_t"
        df[alias] = df[c].astype("int64") // 1_000_000
    load = time.perf_counter() - started
    times, count = [], None
    for _ in range(spec["runs"]):
        started = time.perf_counter()
        out = match_recognize(spec["sql"], df)
        times.append(time.perf_counter() - started)
        count = len(out)
        if times[-1] > spec["warm_skip"]:
            break
    return {"times": times, "count": count, "extra": {"load_s": round(load, 3)}, "rss_kb": peak_rss_kb()}


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    print(RESULT_MARK + json.dumps(result), flush=True)
