"""Disaggregated storage benchmark: three storage nodes behind a bandwidth-limited link.

    python -m bench.storage [--rows 10000000] [--rate-mbit 100] [--only crimes,bikes,...]

The three nodes are separate ``matchrec storage-node`` processes inside a network namespace,
reached over a veth pair whose both ends are shaped with ``tc ... netem rate``, or with a token
bucket (``tbf rate``) where the kernel has no netem (needs root and iproute2; without them the
run says so and uses plain loopback). Each dataset is generated
(bench.datasets), spread over the nodes with ``matchrec load`` (random partitioning, like the
paper's), then every pull strategy runs the dataset's query from this process as the compute
node. For every strategy the table shows bytes each way, events pulled, round trips and
latency, and checks that the result equals local execution (count and a digest of the rows).
A last table measures the false-positive rates of the window and join filters against the
exact structures, next to the formulas. Results are appended to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time

import duckdb
import numpy as np

from bench import publish
import matchrec
from bench import datasets
from bench.queries import QUERIES

NS, HOST_IF, NODE_IF = "mrbench", "mrbench0", "mrbench1"
HOST_IP, NODE_IP = "10.77.0.1", "10.77.0.2"

STORAGE_QUERIES = {
    "crimes": ("crimes", QUERIES["crimes"].matchrec),
    # Same bike / same job as PARTITION BY: the time intervals are kept per partition key.
    "bikes": ("bikes", """
SELECT * FROM bikes MATCH_RECOGNIZE (
  PARTITION BY bike_id ORDER BY start_ts, trip_id
  MEASURES A.trip_id AS a, B.trip_id AS b, C.trip_id AS c
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A {- N* -} B {- N* -} C) WITHIN INTERVAL '6' HOUR
  DEFINE A AS end_station = 7, B AS start_station = 7, C AS end_station <= 3, N AS true)"""),
    "cluster": ("cluster", """
SELECT * FROM cluster MATCH_RECOGNIZE (
  PARTITION BY job_id ORDER BY ts
  MEASURES S.ts AS submitted, F.ts AS failed
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (S {- N* -} C {- N* -} F) WITHIN INTERVAL '2' MINUTE
  DEFINE S AS event_type = 'SUBMIT', C AS event_type = 'SCHEDULE', F AS event_type = 'FAIL', N AS true)"""),
    "synthetic": ("synthetic", QUERIES["synthetic_seq"].matchrec),
}
# Ties in the first ORDER BY key would make the match order (and so the result) depend on how
# the rows happen to be stored; the queries break them with a unique column.
STRATEGIES = [("pull_all", "auto"), ("push_down", "auto"), ("naive_dfs", "auto"), ("dfs", "auto"),
              ("dfs", "always"), ("dfs", "never"), ("dfs_stateful", "auto"),
              ("push_pull", "auto")]


def targets(dataset: str, got: dict) -> list[str]:
    """The issue's targets for one dataset, from ``got``: label -> (PullStats, latency s)."""
    def total(label):
        ps = got[label][0]
        return ps.bytes_sent + ps.bytes_received

    def verdict(ok):
        return "met" if ok else "NOT met"

    out = []
    if "dfs (round trips auto)" in got and "push_down" in got:
        r = total("dfs (round trips auto)") / max(total("push_down"), 1)
        out.append(f"- dfs bytes / push_down bytes: {r:.3f} (target at most 0.20: {verdict(r <= 0.20)})")
        if dataset == "crimes":
            lat = got["dfs (round trips auto)"][1] / got["push_down"][1]
            out.append(f"- dfs latency / push_down latency: {lat:.2f} (target at most 0.5: {verdict(lat <= 0.5)})")
    sides = [got[k][1] for k in ("dfs (round trips always)", "dfs (round trips never)") if k in got]
    if sides and "dfs (round trips auto)" in got:
        r = got["dfs (round trips auto)"][1] / min(sides)
        out.append(f"- cost model: dfs latency with round trips auto / the better of always and never: {r:.2f} "
                   f"(target at most 1.10: {verdict(r <= 1.10)})")
    return out


def run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def setup_link(rate_mbit: int) -> str | None:
    """The qdisc shaping both ends of a veth pair into the nodes' namespace, or None (loopback)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("  shaping a link needs root and iproute2; using loopback", file=sys.stderr)
        return None
    teardown_link()
    try:
        run(["ip", "netns", "add", NS])
        run(["ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NODE_IF])
        run(["ip", "link", "set", NODE_IF, "netns", NS])
        run(["ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_IF])
        run(["ip", "link", "set", HOST_IF, "up"])
        run(["ip", "netns", "exec", NS, "ip", "addr", "add", f"{NODE_IP}/24", "dev", NODE_IF])
        run(["ip", "netns", "exec", NS, "ip", "link", "set", NODE_IF, "up"])
        run(["ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up"])
    except subprocess.CalledProcessError as err:
        print(f"  could not build the veth link ({err.stderr.strip()}); using loopback", file=sys.stderr)
        teardown_link()
        return None
    # netem where the kernel has it; otherwise a token bucket (tbf), which limits the rate the same way
    for qdisc in (["netem", "rate", f"{rate_mbit}mbit"],
                  ["tbf", "rate", f"{rate_mbit}mbit", "burst", "128kb", "latency", "50ms"]):
        host = run(["tc", "qdisc", "add", "dev", HOST_IF, "root", *qdisc], check=False)
        node = run(["ip", "netns", "exec", NS, "tc", "qdisc", "add", "dev", NODE_IF, "root", *qdisc], check=False)
        if host.returncode == 0 and node.returncode == 0:
            return " ".join(qdisc)
        run(["tc", "qdisc", "del", "dev", HOST_IF, "root"], check=False)
        run(["ip", "netns", "exec", NS, "tc", "qdisc", "del", "dev", NODE_IF, "root"], check=False)
    print("  no rate-limiting qdisc works here; using loopback", file=sys.stderr)
    teardown_link()
    return None


def teardown_link() -> None:
    run(["ip", "netns", "del", NS], check=False)
    run(["ip", "link", "del", HOST_IF], check=False)


def start_nodes(data_dir: str, shaped: bool, n: int = 3) -> tuple[list[subprocess.Popen], list[str]]:
    procs, uris = [], []
    host = NODE_IP if shaped else "127.0.0.1"
    os.makedirs(data_dir, exist_ok=True)  # a fresh checkout has no dataset cache yet
    for i in range(n):
        db = os.path.join(data_dir, f"storage-node-{i}.duckdb")
        for stale in (db, db + ".wal"):
            if os.path.exists(stale):
                os.remove(stale)
        cmd = [sys.executable, "-m", "matchrec", "storage-node", "--db", db, "--host", host, "--port", str(9400 + i)]
        if shaped:  # an address of a private veth pair: no token needed to keep others out
            cmd = ["ip", "netns", "exec", NS] + cmd + ["--insecure"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if "serving" not in line:
            raise SystemExit(f"storage node {i} did not start: {proc.stderr.read()}")
        procs.append(proc)
        uris.append(f"grpc://{host}:{9400 + i}")
    return procs, uris


def stop_nodes(procs: list[subprocess.Popen]) -> None:
    """Stop node processes: a terminate, then a kill for any that has not exited within 20 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def digest(rows: list) -> str:
    h = hashlib.sha256()
    for r in sorted(repr(r) for r in rows):
        h.update(r.encode())
    return h.hexdigest()[:12]


def measure_filters(db: str, sql: str) -> list[str]:
    """False-positive rates of the window and join filters on one query's real TIS."""
    from matchrec.operators.intervals import IntervalSet, ShrinkingWindowFilter, WindowJoinFilter
    con = duckdb.connect(db, read_only=True)
    t = con.sql("SELECT epoch_us(ts) FROM crimes WHERE type = 'ROBBERY' ORDER BY 1").fetchnumpy()
    t = next(iter(t.values()))
    w = 30 * 60 * 1_000_000
    tis = IntervalSet.around(np.zeros(len(t), np.int64), t, 0, w)
    swf = ShrinkingWindowFilter.build(tis, w)
    rng = np.random.default_rng(1)
    q = rng.integers(int(t.min()), int(t.max()), 1_000_000)
    zero = np.zeros(len(q), np.int64)
    inside = tis.contains(zero, q)
    got = swf.contains(zero, q)
    outside = ~inside
    fpr = (got & outside).sum() / max(outside.sum(), 1)
    # split: what the slices add (a TIS rounded out to slices) vs fingerprint collisions
    sl = w // 20
    coarse = IntervalSet._merged(tis.pk, (tis.lo // sl) * sl, (tis.hi // sl) * sl + sl - 1)
    coarse_in = coarse.contains(zero, q)
    fp_coll = (got & ~coarse_in).sum() / max((~coarse_in).sum(), 1)
    load = swf.entries / swf.cells.size
    bound = 2 * swf.d / 2 ** 12
    d = con.sql("SELECT epoch_us(ts) AS t, district FROM crimes WHERE type = 'BATTERY'").fetchnumpy()
    bt, bv = d["t"], d["district"].astype(np.int64)
    wjf = WindowJoinFilter.build(np.zeros(len(bt), np.int64), bv, bt, w)
    qt = rng.integers(int(bt.min()), int(bt.max()), 200_000)
    qv = rng.integers(1000, 2000, len(qt))  # districts that never occur
    measured = wjf.may_follow(np.zeros(len(qt), np.int64), qv, qt).mean()
    single = wjf.expected_fpr(wjf.inserted)
    return [
        "| filter | structure | measured false-positive rate | formula |",
        "|---|---|---|---|",
        f"| SWF (crimes, robbery TIS, w = 30 min) | {swf.cells.shape[0]} buckets x {swf.d}, load {load:.2f}, "
        f"{len(swf.to_bytes()):,} B on the wire for {len(tis):,} intervals | {fpr:.4f} of instants outside the TIS "
        f"({fp_coll:.5f} from fingerprint collisions, the rest from 20-slice rounding) | collisions <= 2d/2^f "
        f"= {bound:.5f} per probe |",
        f"| WJF (crimes, battery districts) | {wjf.n_bits:,} bits, k = {wjf.k}, {wjf.inserted:,} keys | "
        f"{measured:.4f} (two probes: own and previous window) | (1 - e^(-kn/m))^k = {single:.4f} per probe, "
        f"{1 - (1 - single) ** 2:.4f} for two |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--rate-mbit", type=int, default=100)
    ap.add_argument("--only", default=",".join(STORAGE_QUERIES))
    ap.add_argument("--data-dir", default="bench/.data")
    ap.add_argument("--out", default="bench/RESULTS.md")
    args = ap.parse_args()
    started = time.time()
    shaped = setup_link(args.rate_mbit)
    link = (f"veth pair into a network namespace, both ends shaped with `tc qdisc add ... {shaped}`" if shaped
            else "loopback without a rate limit")
    print(f"link: {link}")
    procs, uris = start_nodes(args.data_dir, shaped)
    lines = [f"\n## Storage nodes: `python -m bench.storage --rows {args.rows}`\n",
             f"- 3 storage nodes (separate processes), link: {link}",
             f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"Python {platform.python_version()}, DuckDB {duckdb.__version__}",
             f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
             "- Bytes are Arrow buffer sizes of requests and replies (filters as sent, compressed where they are); "
             "latency is the whole query at the compute node, the faster of two runs (pull_all: one run). "
             "`ok` = same row count and digest as local execution.\n"]
    try:
        for name in args.only.split(","):
            dataset, sql = STORAGE_QUERIES[name]
            db = datasets.ensure(args.data_dir, dataset, args.rows)
            src = duckdb.connect(db, read_only=True)
            from matchrec.connectors.loader import load
            t0 = time.perf_counter()
            counts = load(uris, dataset, f"SELECT * FROM {dataset}", src, "random")
            load_s = time.perf_counter() - t0
            src.close()
            local = matchrec.connect(db, read_only=True)
            cur = local.cursor()
            t0 = time.perf_counter()
            cur.execute(sql)
            want_rows = cur.fetchall()
            local_s = time.perf_counter() - t0
            want = (len(want_rows), digest(want_rows))
            local.close()
            print(f"{name}: {sum(counts):,} rows loaded in {load_s:.1f} s; "
                  f"local {want[0]:,} matches in {local_s:.2f} s")
            lines += [f"### {name} ({sum(counts):,} events; {want[0]:,} matches; local DuckDB run {local_s:.2f} s)\n",
                      "| strategy | round trips | bytes sent | bytes received | total vs push_down | events pulled "
                      "| latency s | vs push_down | result |", "|---|---|---|---|---|---|---|---|---|"]
            remote = matchrec.connect(storage_nodes=uris, node_timeout=600)
            rcur = remote.cursor()
            rows = []
            for strategy, trips in STRATEGIES:
                rcur.execute(f"SET pull_strategy = {strategy}")
                rcur.execute(f"SET matchrec_round_trips = {trips}")
                # the faster of two runs (pull_all: one, it takes half a minute): one run's
                # latency varies by about 5% here, more than the cost model's margin
                elapsed = float("inf")
                for _ in range(1 if strategy == "pull_all" else 2):
                    t0 = time.perf_counter()
                    rcur.execute(sql)
                    got_rows = rcur.fetchall()
                    elapsed = min(elapsed, time.perf_counter() - t0)
                ps = rcur.pull_stats[0]
                ok = (len(got_rows), digest(got_rows)) == want
                rows.append((f"{strategy}" + (f" (round trips {trips})" if strategy == "dfs" else ""), ps, elapsed, ok))
                print(f"  {rows[-1][0]}: {ps.bytes_sent + ps.bytes_received:,} B, {elapsed:.2f} s, "
                      f"{'ok' if ok else 'DIFFERENT'}")
            remote.close()
            base = next(r for r in rows if r[0] == "push_down")
            base_bytes = base[1].bytes_sent + base[1].bytes_received
            for label, ps, elapsed, ok in rows:
                total = ps.bytes_sent + ps.bytes_received
                lines.append(f"| {label} | {ps.round_trips} | {ps.bytes_sent:,} | {ps.bytes_received:,} | "
                             f"{total / base_bytes:.3f} | {ps.events_pulled:,} | {elapsed:.2f} | "
                             f"{elapsed / base[2]:.2f} | {'ok' if ok else 'DIFFERENT'} |")
            lines += [""] + targets(name, {label: (ps, elapsed) for label, ps, elapsed, _ in rows}) + [""]
        if "crimes" in args.only.split(","):
            lines += ["### Filter false-positive rates\n"] + measure_filters(
                datasets.ensure(args.data_dir, "crimes", args.rows), STORAGE_QUERIES["crimes"][1]) + [""]
    finally:
        stop_nodes(procs)
        if shaped:
            teardown_link()
    lines.append(f"- Total wall time: {time.time() - started:.0f} s\n")
    publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
