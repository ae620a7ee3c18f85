"""Real Spark deployments for the tests: a standalone master with workers, and a Spark Connect
server, each started as child processes from the pyspark package's own launcher (spark-class /
spark-submit), bound to 127.0.0.1, and always stopped."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"nothing listened on port {port} after {timeout} s:\n{log.read_text()[-3000:]}")


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"})
    env.pop("PYSPARK_PYTHON", None)
    env.update(extra or {})
    return env


class Processes:
    """Child JVMs, each in its own process group, stopped (TERM, then KILL) in reverse order."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="matchrec-spark-"))
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str], env: dict) -> tuple[subprocess.Popen, Path]:
        log = self.dir / f"{name}.log"
        proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=self.dir,
                                start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def standalone(workers: int = 2) -> tuple[str, Processes]:
    """Start a master and ``workers`` workers (1 core, 1 GB each); returns (master URL, processes)."""
    procs = Processes()
    try:
        cls = str(spark_home() / "bin" / "spark-class")
        port = free_port()
        env = _env({"SPARK_DAEMON_MEMORY": "512m"})
        master, log = procs.start("master", [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                             "--port", str(port), "--webui-port", str(free_port())], env)
        _wait_port(port, master, log)
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            wport = free_port()
            work = procs.dir / f"work{i}"
            work.mkdir()
            w, wlog = procs.start(f"worker{i}", [cls, "org.apache.spark.deploy.worker.Worker", url, "--host",
                                                 "127.0.0.1", "--port", str(wport), "--webui-port",
                                                 str(free_port()), "--cores", "1", "--memory", "1g",
                                                 "--work-dir", str(work)], env)
            _wait_port(wport, w, wlog)
        _wait_registered(procs.dir / "master.log", workers)
        return url, procs
    except BaseException:
        procs.stop()
        raise


def _wait_registered(log: Path, workers: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("Registering worker") >= workers:
            return
        time.sleep(0.3)
    raise RuntimeError(f"the workers did not register with the master:\n{log.read_text()[-3000:]}")


def connect_server() -> tuple[str, Processes]:
    """Start a Spark Connect server (local[2], the package's spark-connect jar) whose Python
    workers run this interpreter; returns (sc:// URL, processes)."""
    procs = Processes()
    try:
        port = free_port()
        args = [str(spark_home() / "bin" / "spark-submit"), "--master", "local[2]", "--driver-memory", "1g",
                "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--conf", f"spark.connect.grpc.binding.port={port}",
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
                "--conf", "spark.sql.session.timeZone=UTC",
                "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"]
        server, log = procs.start("connect", args, _env({"PYSPARK_PYTHON": sys.executable}))
        _wait_port(port, server, log, timeout=180)
        return f"sc://127.0.0.1:{port}", procs
    except BaseException:
        procs.stop()
        raise
