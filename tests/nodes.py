"""Real storage nodes for the tests: Arrow Flight servers on 127.0.0.1, as threads of the test
process (``start_cluster``) or as ``matchrec storage-node`` processes (``start_node``).

The cluster fixture in conftest.py starts one cluster per test session; tests that need to kill
or restart a node start their own processes here.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading

from matchrec.connectors.storage_node import StorageNode

TOKEN = "t0ken"


class Cluster:
    """N storage nodes serving from threads; ``uris`` are their addresses."""

    def __init__(self, base_dir, n: int = 3, token: str = TOKEN, max_payload_mb: int = 64):
        self.token = token
        self.nodes = [StorageNode(str(base_dir / f"n{i}.duckdb"), token=token, max_payload_mb=max_payload_mb)
                      for i in range(n)]
        self.threads = [threading.Thread(target=node.wait, daemon=True) for node in self.nodes]
        for t in self.threads:
            t.start()
        self.uris = [f"grpc://127.0.0.1:{node.port}" for node in self.nodes]

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(db: str, port: int) -> subprocess.Popen:
    """A ``matchrec storage-node`` process without a token, returned once it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "matchrec", "storage-node", "--db", db, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "serving" in line, proc.stderr.read()
    return proc


def stop_nodes(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
