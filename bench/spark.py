"""Spark benchmark: matchrec.spark on local[1] and local[2] against matchrec's DuckDB path.

    python -m bench.spark [--rows 10000000] [--only keyed,unpartitioned,crimes] [--runs 1]

Parts:

* keyed: the V-shape query (PARTITION BY symbol) over stock-like data with 1,000 symbols, on
  local[1] and local[2]: time, speed-up of local[2] over local[1], and ratio to the DuckDB path;
* unpartitioned: the crimes-like query (no PARTITION BY, WITHIN 30 minutes) the same way; its
  report must say the time split ran;
* crimes: the crimes-like query on local[2] with interval_filter off and on: shuffle bytes
  (ShuffleMeter deltas around the run) and their ratio, and times.

The datasets come from bench.datasets (cached DuckDB files in bench/.data); each is exported
once to a Parquet file next to it, which is what Spark reads. The DuckDB path
(``matchrec.connect(file).execute(sql).fetch_arrow_table()``) runs the same statement on the
DuckDB file. Every Spark master runs in its own process with a fresh session (a SparkContext's
master cannot change). Every result is checked against the DuckDB path's: row count and an
order-independent digest of the rows. Results are appended to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from bench import publish
import matchrec
from bench import datasets
from bench.queries import QUERIES

MASTERS = ("local[1]", "local[2]")
FILTER_TARGET = 5.0  # the goal: interval filtering shuffles at least 5x fewer bytes

# bench/queries.py's crimes query with the elapsed time in milliseconds: Spark has no type for
# DuckDB's month-day-nano INTERVAL, so that measure cannot leave the executors as it is.
CRIMES_SQL = """
SELECT * FROM crimes MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES R.id AS robbery_id, B.id AS battery_id, M.id AS theft_id, epoch_ms(M.ts) - epoch_ms(R.ts) AS elapsed_ms
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (R {- N* -} B {- N* -} M) WITHIN INTERVAL '30' MINUTE
  DEFINE R AS type = 'ROBBERY', B AS type = 'BATTERY',
         M AS type = 'MOTOR_VEHICLE_THEFT' AND M.district = B.district, N AS true)"""


@dataclass(frozen=True)
class Part:
    name: str
    query: str  # a key of STATEMENTS
    masters: tuple[str, ...]
    filters: tuple[str, ...]
    title: str


# query name -> (dataset, statement in DuckDB's dialect, its PARTITION BY column, what to say about it)
STATEMENTS = {
    "vshape": ("stock", QUERIES["vshape"].matchrec, "symbol", "V-shape per symbol (PARTITION BY symbol ORDER BY ts)"),
    "crimes": ("crimes", CRIMES_SQL, None, "robbery, battery, motor vehicle theft in the battery's district "
                                           "within 30 minutes (ORDER BY ts, no PARTITION BY)"),
}
# keyed and unpartitioned keep interval filtering off so they measure the matching alone
PARTS = {p.name: p for p in [
    Part("keyed", "vshape", MASTERS, ("off",), "keyed"),
    Part("unpartitioned", "crimes", MASTERS, ("off",), "unpartitioned with WITHIN (time split)"),
    Part("crimes", "crimes", ("local[2]",), ("off", "on"), "crimes: shuffle bytes with and without interval "
                                                           "filtering (local[2])"),
]}


# ------------------------------------------------------------------ checking results
def digest(table: pa.Table) -> tuple[int, str]:
    """(rows, digest) of a result, independent of row order and of how each engine types a column.

    Timestamps (with or without a zone) and durations become integer microseconds,
    decimals doubles; the digest is the sum of DuckDB's hash of each row's text, so both sides
    must be hashed by this one function.
    """
    cols = []
    for i, f in enumerate(table.schema):
        col = table.column(i)
        if pa.types.is_timestamp(f.type):
            col = col.cast(pa.timestamp("us", tz=f.type.tz)).cast(pa.int64())
        elif pa.types.is_duration(f.type):
            col = col.cast(pa.duration("us")).cast(pa.int64())
        elif pa.types.is_decimal(f.type):
            col = col.cast(pa.float64())
        cols.append(col)
    names = [f"c{i}" for i in range(len(cols))]
    norm = pa.Table.from_arrays(cols, names=names)
    con = duckdb.connect()
    try:
        con.register("result_rows", norm)
        n, total = con.execute(f"SELECT count(*), sum(hash(CAST(row({', '.join(names)}) AS VARCHAR))::HUGEINT) "
                               "FROM result_rows").fetchone()
    finally:
        con.close()
    return int(n), f"{int(total or 0) % 2 ** 64:016x}"


def verdict(got: dict, want: dict) -> str:
    if "error" in got:
        return "FAILED"
    return "ok" if (got["rows"], got["digest"]) == (want["rows"], want["digest"]) else "MISMATCH"


# ------------------------------------------------------------------ the DuckDB path (this process)
def duckdb_path(db: str, sql: str, runs: int, table: str, key: str | None) -> dict:
    con = matchrec.connect(db, read_only=True)
    try:
        duck = con.duckdb_connection
        threads = duck.execute("SELECT current_setting('threads')").fetchone()[0]
        keys = duck.execute(f"SELECT count(DISTINCT {key}) FROM {table}").fetchone()[0] if key else None
        cur = con.cursor()
        times, result = [], None
        for _ in range(1 + runs):
            t0 = time.perf_counter()
            cur.execute(sql)
            table = cur.fetch_arrow_table()
            times.append(time.perf_counter() - t0)
            got = digest(table)
            if result is not None and got != (result["rows"], result["digest"]):
                raise SystemExit(f"the DuckDB path gave two different results for {sql}")
            result = {"rows": got[0], "digest": got[1]}
    finally:
        con.close()
    return {**result, "first": times[0], "warm": min(times[1:]), "threads": int(threads), "keys": keys}


# ------------------------------------------------------------------ a Spark master (child process)
def spark_session(master: str, driver_memory: str):
    from pyspark.sql import SparkSession
    cores = int(master[master.index("[") + 1:-1])
    spark = (SparkSession.builder.master(master).appName("matchrec-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.memory", driver_memory)
             .config("spark.sql.shuffle.partitions", str(2 * cores))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from /proc/stat (Linux), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return sum(v) - idle, sum(v)


def cores_busy(before, after) -> float | None:
    """How many of the machine's cores were busy on average between two ``cpu_jiffies`` readings:
    with the machine otherwise quiet, how many cores a run kept busy (Spark's JVM threads and its
    Python workers together)."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


def spark_run(spark, job: dict) -> dict:
    """One timed run: from the matchrec.spark.sql call until the matches are on the driver as Arrow.
    The call itself runs jobs (the time split's statistics, its matching and the walk for AFTER
    MATCH SKIP PAST LAST ROW; the filtering rounds), so how long it took is kept apart."""
    import matchrec.spark as ms
    from matchrec.connectors.spark_metrics import ShuffleMeter
    # a fresh session per master, but runs within it share Spark's cache: the time split persists
    # its input, and an equal plan of an earlier run would be read from memory
    spark.catalog.clearCache()
    meter = ShuffleMeter(spark)
    cpu0 = cpu_jiffies()
    t0 = time.perf_counter()
    df = ms.sql(spark, job["sql"], dialect="duckdb", interval_filter=job["interval_filter"])
    in_call = time.perf_counter() - t0
    reports = ms.last_runs()
    table = df.toArrow()
    seconds = time.perf_counter() - t0
    busy = cores_busy(cpu0, cpu_jiffies())
    moved = meter.delta()
    ms.release()  # what the time split and interval filtering persisted for this run
    rows, dig = digest(table)
    out = {"seconds": seconds, "in_call": in_call, "cores_busy": busy, "rows": rows, "digest": dig,
           "shuffle_written": moved.written, "shuffle_read": moved.read, "shuffle_records": moved.records,
           "shuffle_stages": moved.stages, "mode": "; ".join(r.mode for r in reports),
           "lines": [x for r in reports for x in r.lines], "filtering": "", "filter_shuffle": None}
    for r in reports:
        f = r.filtering
        if f is None:
            continue
        out["filtering"] = "used" if getattr(f, "used", False) else f"not used ({getattr(f, 'reason', '')})"
        s = getattr(f, "shuffle", None)
        if s is not None:
            out["filter_shuffle"] = s.written
    return out


def child(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    master = spec["master"]
    t0 = time.perf_counter()
    spark = spark_session(master, spec["driver_memory"])
    out = {"master": master, "spark": spark.version, "session_s": time.perf_counter() - t0,
           "java": spark.sparkContext._jvm.System.getProperty("java.version"),
           "parallelism": spark.sparkContext.defaultParallelism, "inputs": {}, "jobs": {}}
    try:
        for name, path in spec["views"].items():
            df = spark.read.parquet(path)
            df.createOrReplaceTempView(name)
            out["inputs"][name] = df.rdd.getNumPartitions()
        for job in spec["jobs"]:
            runs = []
            for i in range(1 + spec["runs"]):
                try:
                    r = spark_run(spark, job)
                except Exception as err:  # noqa: BLE001 - recorded in the table; the other runs go on
                    import matchrec.spark as ms
                    err = ms.matchrec_error(err) or err
                    runs.append({"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"})
                    print(f"  {master} {job['id']}: {runs[-1]['error']}", flush=True)
                    break
                runs.append(r)
                print(f"  {master} {job['id']} {'first' if i == 0 else 'warm'} run: {r['seconds']:.2f} s, "
                      f"{r['rows']:,} rows, shuffle {r['shuffle_written']:,} B, "
                      f"{verdict(r, job['want'])}", flush=True)
            out["jobs"][job["id"]] = runs
            with open(spec["out"], "w") as f:  # after every job: a crash later keeps what was measured
                json.dump(out, f)
    finally:
        spark.stop()
    out["wall_s"] = time.perf_counter() - t0
    with open(spec["out"], "w") as f:
        json.dump(out, f)


def run_master(master: str, jobs: list[dict], views: dict, args) -> dict:
    """Run ``jobs`` in a child process on ``master``; its stderr (Spark's log) goes to a file."""
    tmp = tempfile.mkdtemp(prefix="spark-bench-", dir=args.data_dir)
    spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
    log_path = os.path.join(args.data_dir, f"spark-bench-{master.replace('[', '').replace(']', '')}.log")
    with open(spec_path, "w") as f:
        json.dump({"master": master, "driver_memory": args.driver_memory, "runs": args.runs, "views": views,
                   "jobs": jobs, "out": out_path}, f)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "bench.spark", "--child", spec_path], stderr=log)
    wall = time.perf_counter() - t0
    result = {}
    if os.path.exists(out_path):
        with open(out_path) as f:
            result = json.load(f)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-2000:]
        print(f"  {master} process exited with {proc.returncode}; end of {log_path}:\n{tail}", file=sys.stderr)
        result["exit"] = proc.returncode
    result["process_s"] = wall
    for p in (spec_path, out_path):
        if os.path.exists(p):
            os.remove(p)
    os.rmdir(tmp)
    return result


# ------------------------------------------------------------------ data
def parquet_for(db: str, table: str) -> str:
    """The Parquet export of a dataset's DuckDB file, written once next to it."""
    path = db[: -len(".duckdb")] + ".parquet"
    if not os.path.exists(path):
        con = duckdb.connect(db, read_only=True)
        try:
            con.execute(f"COPY {table} TO '{path}.tmp' (FORMAT parquet)")
        finally:
            con.close()
        os.replace(path + ".tmp", path)
    return path


# ------------------------------------------------------------------ the report
def fmt_s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def warm(runs: list[dict]) -> dict | None:
    """The fastest timed run (the first run of a configuration is the warm-up)."""
    ok = [r for r in runs[1:] if "error" not in r]
    return min(ok, key=lambda r: r["seconds"]) if ok else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--only", default=",".join(PARTS))
    ap.add_argument("--runs", type=int, default=1, help="timed runs after the warm-up run (best is reported)")
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--data-dir", default="bench/.data")
    ap.add_argument("--out", default="bench/RESULTS.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    unknown = [p for p in args.only.split(",") if p not in PARTS]
    if unknown or args.runs < 1:
        ap.error(f"--only takes {', '.join(PARTS)}" if unknown else "--runs must be at least 1")
    parts = [PARTS[p] for p in args.only.split(",")]
    started = time.time()
    load_start = os.getloadavg()[0]
    # (what, seconds, 1-minute load average before it): other work on the machine shows there
    steps: list[tuple[str, float, float]] = []

    # data: the DuckDB file of each dataset (the DuckDB path) and its Parquet export (Spark)
    dbs, views = {}, {}
    for q in dict.fromkeys(p.query for p in parts):
        dataset = STATEMENTS[q][0]
        t0, load = time.perf_counter(), os.getloadavg()[0]
        dbs[q] = datasets.ensure(args.data_dir, dataset, args.rows)
        views[dataset] = parquet_for(dbs[q], dataset)
        steps.append((f"{dataset}: data and Parquet export (cached after the first run)", time.perf_counter() - t0,
                      load))

    # the DuckDB path: the reference result and its time
    ref = {}
    for q, db in dbs.items():
        t0, load = time.perf_counter(), os.getloadavg()[0]
        dataset, sql, key, _ = STATEMENTS[q]
        ref[q] = duckdb_path(db, sql, args.runs, dataset, key)
        steps.append((f"{q}: DuckDB path, {1 + args.runs} runs", time.perf_counter() - t0, load))
        print(f"DuckDB path {q}: {ref[q]['rows']:,} rows, first {ref[q]['first']:.2f} s, "
              f"warm {ref[q]['warm']:.2f} s ({ref[q]['threads']} threads)", flush=True)

    # Spark: one child process per master, each running every job that master needs
    results = {}
    for master in MASTERS:
        jobs = {}
        for p in parts:
            if master in p.masters:
                for flt in p.filters:
                    jid = f"{p.query}/interval_filter={flt}"
                    jobs[jid] = {"id": jid, "sql": STATEMENTS[p.query][1], "interval_filter": flt,
                                 "want": ref[p.query]}
        if not jobs:
            continue
        print(f"Spark {master}: {', '.join(jobs)}", flush=True)
        load = os.getloadavg()[0]
        results[master] = run_master(master, list(jobs.values()), views, args)
        res = results[master]
        steps.append((f"Spark {master} process (session start {fmt_s(res.get('session_s'))} s)", res["process_s"],
                      load))

    def runs_of(master: str, q: str, flt: str) -> list[dict]:
        return results.get(master, {}).get("jobs", {}).get(f"{q}/interval_filter={flt}", [])

    threads = ", ".join(sorted({str(r["threads"]) for r in ref.values()}))
    any_res = next((r for r in results.values() if "spark" in r), {})
    size = {ds: os.path.getsize(path) for ds, path in views.items()}
    only = "" if args.only == ",".join(PARTS) else f" --only {args.only}"
    only += "" if args.runs == 1 else f" --runs {args.runs}"
    lines = [f"\n## Spark: `python -m bench.spark --rows {args.rows}{only}`\n",
             f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
             f"{load_start:.2f} at the start and {os.getloadavg()[0]:.2f} at the end (the cores are shared); "
             f"Spark {any_res.get('spark', '?')} on Java {any_res.get('java', '?')}, Python "
             f"{platform.python_version()}, DuckDB {duckdb.__version__}",
             f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
             "- Data (bench.datasets, " + "; ".join(
                 f"{ds}: {args.rows:,} rows, Parquet {size[ds] / 1e6:.1f} MB read in "
                 + ", ".join(f"{r['inputs'].get(ds, '?')} partition(s) on {m}" for m, r in results.items()
                             if "inputs" in r) for ds in views) + "). Spark reads the Parquet exports; the "
             "DuckDB path reads the DuckDB files they were exported from.",
             f"- Each master runs in its own process and Spark session (driver memory {args.driver_memory}, "
             "`spark.sql.shuffle.partitions` = 2 x cores). Each configuration runs once as a warm-up (`first`: "
             f"a fresh session, Python workers starting) and then {args.runs} time(s); `warm` is the best of "
             "those. A Spark time runs from the `matchrec.spark.sql` call until the matches are on the driver as "
             "Arrow (`DataFrame.toArrow()`); `in sql()` is the part spent inside the call, which runs Spark jobs "
             "itself (the time split's statistics, its matching and the walk for SKIP PAST LAST ROW; the "
             "filtering rounds), the rest is the action. The DuckDB path is "
             f"`matchrec.connect(file).execute(sql).fetch_arrow_table()` with {threads} DuckDB thread(s). "
             "Shuffle bytes are `ShuffleMeter` deltas around the warm run. `cores busy`: the machine's busy "
             "CPU time during the warm run over its wall time, from /proc/stat (how many cores the run kept busy: "
             "Spark's JVM threads and its Python workers together). `ok` = same row count and order-independent "
             "digest of the rows as the DuckDB path.\n"]

    for p in parts:
        dataset, _, key, about = STATEMENTS[p.query]
        want = ref[p.query]
        if p.name in ("keyed", "unpartitioned"):
            keys = f" with {ref[p.query]['keys']:,} partition keys" if key else ""
            lines += [f"### {p.title}: {about}, {dataset}-like, {args.rows:,} rows{keys}\n",
                      "| engine | mode | warm s | of which in sql() s | first s | cores busy | local[1] / this | "
                      "this / DuckDB path | shuffle bytes written | rows | result |",
                      "|---|---|---|---|---|---|---|---|---|---|---|",
                      f"| matchrec DuckDB path ({want['threads']} threads) | - | {want['warm']:.2f} | - | "
                      f"{want['first']:.2f} | - | - | 1.00 | - | {want['rows']:,} | reference |"]
            one = warm(runs_of("local[1]", p.query, "off"))
            for master in p.masters:
                runs = runs_of(master, p.query, "off")
                w = warm(runs)
                if w is None:
                    err = next((r["error"] for r in runs if "error" in r), "no result (see the log)")
                    lines.append(f"| Spark {master} | {err} | - | - | - | - | - | - | - | - | FAILED |")
                    continue
                mode = w["mode"]
                if p.name == "unpartitioned" and not mode.startswith("time split"):
                    mode = f"NOT A TIME SPLIT: {mode}"
                result = "ok" if all(verdict(r, want) == "ok" for r in runs) else "MISMATCH"
                lines.append(f"| Spark {master} | {mode} | {w['seconds']:.2f} | {w['in_call']:.2f} | "
                             f"{fmt_s(runs[0].get('seconds'))} | {fmt_s(w.get('cores_busy'))} | "
                             f"{fmt_s(one['seconds'] / w['seconds'] if one else None)} | "
                             f"{w['seconds'] / want['warm']:.2f} | {w['shuffle_written']:,} | {w['rows']:,} | "
                             f"{result} |")
            two = warm(runs_of("local[2]", p.query, "off"))
            if one and two:
                lines.append(f"\n- Speed-up of local[2] over local[1] (warm): {one['seconds'] / two['seconds']:.2f}x; "
                             f"local[2] takes {two['seconds'] / want['warm']:.2f}x the DuckDB path's time "
                             f"(local[1]: {one['seconds'] / want['warm']:.2f}x).")
            lines.append("")
        elif p.name == "crimes":
            lines += [f"### {p.title}: {about}, {args.rows:,} rows\n",
                      "| interval_filter | filtering | mode | warm s | of which in sql() s | first s | "
                      "shuffle bytes written | shuffle bytes read | shuffle records | of which filtering rounds "
                      "(bytes) | rows | result |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            got = {}
            for flt in p.filters:
                runs = runs_of("local[2]", p.query, flt)
                w = warm(runs)
                if w is None:
                    err = next((r["error"] for r in runs if "error" in r), "no result (see the log)")
                    lines.append(f"| {flt} | {err} | - | - | - | - | - | - | - | - | - | FAILED |")
                    continue
                got[flt] = w
                result = "ok" if all(verdict(r, want) == "ok" for r in runs) else "MISMATCH"
                fs = w["filter_shuffle"]
                lines.append(f"| {flt} | {w['filtering'] or '-'} | {w['mode']} | {w['seconds']:.2f} | "
                             f"{w['in_call']:.2f} | "
                             f"{fmt_s(runs[0].get('seconds'))} | {w['shuffle_written']:,} | {w['shuffle_read']:,} | "
                             f"{w['shuffle_records']:,} | {'-' if fs is None else f'{fs:,}'} | {w['rows']:,} | "
                             f"{result} |")
            if "off" in got and "on" in got:
                ratio = got["off"]["shuffle_written"] / max(got["on"]["shuffle_written"], 1)
                lines.append(f"\n- Shuffle bytes written, off / on: {ratio:.2f}x (target: at least "
                             f"{FILTER_TARGET:.0f}x, {'met' if ratio >= FILTER_TARGET else 'not met'}); time on / "
                             f"off: {got['on']['seconds'] / got['off']['seconds']:.2f}.")
                notes = [x.strip() for x in got["on"]["lines"] if x.strip()]
                if notes:
                    lines.append("- Report of the `on` run: " + "; ".join(notes))
            lines.append("")

    lines += ["### Where the time went\n", "| step | seconds | load average before it |", "|---|---|---|"]
    lines += [f"| {label} | {s:.1f} | {load:.2f} |" for label, s, load in steps]
    lines.append(f"\n- Total wall time: {time.time() - started:.0f} s\n")
    publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
