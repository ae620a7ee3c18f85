"""Runs every engine on every query, each measurement in a fresh child process.

Fast engines (matchrec's default path, the DuckDB floor and the DuckDB formulation) run at
each requested size. Slow ones (the reference matcher, pandas-match-recognize, Flink) run
on samples, the same generator at a smaller size, grown 4x at a time until one run takes
longer than the time budget or the requested size is reached; the fast engines then also
run on that sample so every ratio and count check compares engines on the same data.

Peak memory is what the child reports from /proc (VmHWM of itself and of live descendants
such as the Flink JVM). The wait4() ru_maxrss of the child is only a fallback: Linux folds
the parent's own peak (from before exec) into it, so it overstates small children.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

from bench import datasets
from bench.measure import RESULT_MARK
from bench.queries import Query

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
PMR_VENV = os.path.join(BENCH, ".pmr-venv")
FLINK_VENV = os.path.join(BENCH, ".flink-venv")

# Display order and labels of the engines.
ENGINES = {
    "matchrec": "matchrec (fast path)",
    "reference": "matchrec reference (fast_path=0)",
    "floor": "DuckDB floor",
    "duckdb": "DuckDB formulation",
    "pmr": "pandas-match-recognize",
    "flinkshape": "matchrec, Flink's statement",
    "flink": "Flink (batch, p=2)",
}
SAMPLE_START = {"reference": 10_000, "pmr": 1_000, "flink": 10_000}


@dataclass
class Measurement:
    query: str
    engine: str
    rows: int
    requested: int = 0  # the size asked for (real data may have fewer rows)
    times: list = field(default_factory=list)
    count: int | None = None
    rss_mb: float | None = None
    extra: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def first(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def warm(self) -> float | None:
        return self.times[1] if len(self.times) > 1 else None

    @property
    def time(self) -> float | None:
        """The figure ratios use: the warm run when there was one."""
        return self.warm if self.warm is not None else self.first


@dataclass
class Settings:
    data_dir: str
    seed: int = datasets.DEFAULT_SEED
    budget: float = 20.0
    runs: int = 2
    warm_skip: float = 120.0
    timeout: float = 3600.0
    peers: bool = False


def spawn(cmd: list[str], timeout: float) -> tuple[int, str, str, float]:
    """Run ``cmd`` in its own session; (exit code, stdout, stderr, peak RSS in MB)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, start_new_session=True)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            _killpg(proc.pid)
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
        _killpg(proc.pid)  # a JVM or worker left behind in the child's session
        out.seek(0)
        err.seek(0)
        stderr = err.read()
        if timed_out.is_set():
            stderr += f"\n(killed after the {timeout:.0f} s timeout)"
        return proc.returncode, out.read(), stderr, usage.ru_maxrss / 1024.0


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Runner:
    def __init__(self, settings: Settings, log=print):
        self.s = settings
        self.log = log
        self.cache: dict[tuple, Measurement] = {}
        self.row_counts: dict[str, int] = {}
        self.skipped_peers: dict[str, str] = {}
        self.cache_query: dict[str, str] = {}  # query name -> dataset name
        self.shown: set[tuple] = set()  # cache keys that go into the tables
        self.finals: set[tuple] = set()  # samples some requested size settled on
        self.growth: dict[tuple, list[Measurement]] = {}  # (query, engine) -> every sample tried

    # -------------------------------------------------------------- data
    def dataset(self, q: Query, n: int) -> tuple[str, int]:
        path = datasets.ensure(self.s.data_dir, q.dataset, n, self.s.seed, log=self.log)
        if path not in self.row_counts:
            import duckdb
            con = duckdb.connect(path, read_only=True)
            self.row_counts[path] = con.execute(f"SELECT count(*) FROM {q.dataset}").fetchone()[0]
            con.close()
        return path, self.row_counts[path]

    # -------------------------------------------------------------- one measurement
    def measure(self, q: Query, engine: str, n: int, timeout: float | None = None) -> Measurement:
        path, rows = self.dataset(q, n)
        key = (q.name, engine, path)
        self.shown.add(key)
        if key in self.cache:
            return self.cache[key]
        spec = {"engine": engine, "query": q.name, "db": path, "runs": self.s.runs, "warm_skip": self.s.warm_skip}
        if engine == "pmr":
            csv = datasets.export_csv(path, q.dataset, q.columns, q.name)
            spec.update(csv=csv, columns=q.columns, rowtime=q.rowtime, sql=q.pmr)
            cmd = [os.path.join(PMR_VENV, "bin", "python"), os.path.join(BENCH, "peers", "pmr_driver.py")]
        elif engine == "flink":
            csv = datasets.export_csv(path, q.dataset, q.columns, q.name)
            spec.update(csv=csv, table=q.dataset, columns=q.columns, rowtime=q.rowtime, sql=q.flink, parallelism=2)
            cmd = [os.path.join(FLINK_VENV, "bin", "python"), os.path.join(BENCH, "peers", "flink_driver.py")]
        else:
            cmd = [sys.executable, "-m", "bench.measure"]
        self.log(f"  {q.name}: {ENGINES[engine]} on {rows:,} rows ...")
        code, out, err, rss = spawn(cmd + [json.dumps(spec)], timeout or self.s.timeout)
        m = Measurement(q.name, engine, rows, requested=n, rss_mb=rss)
        lines = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
        if code == 0 and lines:
            result = json.loads(lines[-1][len(RESULT_MARK):])
            m.times, m.count, m.extra = result["times"], result.get("count"), result.get("extra", {})
            if result.get("rss_kb"):
                m.rss_mb = result["rss_kb"] / 1024.0
            self.log(f"    first {m.first:.3f} s" + (f", warm {m.warm:.3f} s" if m.warm is not None else "")
                     + (f", {m.count:,} matches" if m.count is not None else ""))
        else:
            tail = [line for line in (err or out).strip().splitlines() if line.strip()][-3:]
            m.error = f"exit {code}: " + " | ".join(tail)[-400:]
            self.log(f"    FAILED {m.error}")
        self.cache[key] = m
        return m

    def sampled(self, q: Query, engine: str, n: int) -> Measurement | None:
        """The largest sample (up to n rows) this engine finishes within the time budget."""
        size, best = min(n, SAMPLE_START[engine]), None
        tried = self.growth.setdefault((q.name, engine), [])
        while True:
            # A 4x larger sample after one under budget should take about 4x the budget.
            m = self.measure(q, engine, size, timeout=max(8 * self.s.budget, 180))
            if m not in tried:
                tried.append(m)
            if m.error:
                best = best or m
                break
            best = m
            if size >= n or (m.first or 0) > self.s.budget:
                break
            size = min(n, size * 4)
        self.finals.add((q.name, engine, self._path_of(best)))
        for probe in tried:  # only the samples finally used (for some requested size) are tabulated
            key = (q.name, engine, self._path_of(probe))
            if key not in self.finals:
                self.shown.discard(key)
        return best

    def _path_of(self, m: Measurement) -> str:
        return datasets.path_for(self.s.data_dir, self.cache_query[m.query], m.requested, self.s.seed)

    # -------------------------------------------------------------- one query
    def run_query(self, q: Query, sizes: list[int]) -> list[Measurement]:
        if not datasets.available(q.dataset):
            return []
        self.cache_query[q.name] = q.dataset
        for n in sizes:
            for engine in ("floor", "duckdb", "matchrec"):
                if engine != "duckdb" or q.duckdb:
                    self.measure(q, engine, n)
            samples = [self.sampled(q, "reference", n)]
            if self.s.peers:
                if q.pmr and self.peer_ready("pmr"):
                    samples.append(self.sampled(q, "pmr", n))
                if q.flink and self.peer_ready("flink"):
                    flink = self.sampled(q, "flink", n)
                    samples.append(flink)
                    if flink is not None and not flink.error:
                        self.measure(q, "flinkshape", flink.requested)
            for m in samples:
                if m is not None and not m.error:
                    for engine in ("floor", "duckdb", "matchrec"):
                        if engine != "duckdb" or q.duckdb:
                            self.measure(q, engine, m.requested)
        return sorted((m for k, m in self.cache.items() if m.query == q.name and k in self.shown),
                      key=lambda m: (m.rows, list(ENGINES).index(m.engine)))

    def peer_ready(self, peer: str) -> bool:
        venv = PMR_VENV if peer == "pmr" else FLINK_VENV
        if os.path.exists(os.path.join(venv, "bin", "python")):
            return True
        if peer not in self.skipped_peers:
            how = "python -m bench --setup-pmr" if peer == "pmr" else "python -m bench --setup-flink"
            self.skipped_peers[peer] = f"{venv} is missing; create it with `{how}`"
            self.log(f"NOTE: skipping {ENGINES[peer]}: {self.skipped_peers[peer]}")
        return False


def setup_venv(venv: str, requirement: str, log=print) -> int:
    """Create a separate virtualenv for a peer (its pins conflict with the main stack)."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        log(f"creating {venv}")
        code = subprocess.call([_base_python(), "-m", "venv", venv])
        if code:
            return code
    log(f"installing {requirement} into {venv}")
    return subprocess.call([python, "-m", "pip", "install", "-q", requirement])


def _base_python() -> str:
    """The interpreter the current virtualenv was made from."""
    exe = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return exe if os.path.exists(exe) else "python3"
