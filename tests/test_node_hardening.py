"""Storage nodes under hostile or unlucky conditions: real node processes on 127.0.0.1.

Malformed requests get short errors and leave the node's memory bounded; deep filter
expressions are refused; a client that times out has the node's DuckDB work interrupted;
retries with backoff outlast a node's restart; the token comes from a file or the
environment; TLS with a self-signed certificate; no non-loopback address without a token.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import matchrec
from matchrec.cli import main
from matchrec.connectors.loader import load
from matchrec.connectors.remote import RemoteStore
from matchrec.connectors.storage_node import check_exposure, is_loopback

TOKEN = "s3cret-from-env"
COSTLY = "regexp_matches(repeat(CAST(v AS VARCHAR) || 'ab', 2000), '(a|b|c)*z')"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "matchrec", "storage-node", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    assert "serving" in line, proc.stderr.read()
    proc.banner = line
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _events(n: int) -> pa.Table:
    rng = random.Random(5)
    return pa.table({"ts": pa.array(range(n), pa.int64()), "v": pa.array([rng.randint(0, 50) for _ in range(n)],
                                                                          pa.int32()),
                     "type": pa.array([rng.choice("abc") for _ in range(n)])})


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One node process whose token comes from the environment, holding 200,000 events."""
    base = tmp_path_factory.mktemp("hard")
    port = _free_port()
    proc = _start(["--db", str(base / "n.duckdb"), "--port", str(port), "--max-payload-mb", "64"],
                  env={"MATCHREC_NODE_TOKEN": TOKEN})
    uri = f"grpc://127.0.0.1:{port}"
    con = duckdb.connect()
    con.register("src", _events(200_000))
    load([uri], "ev", "SELECT * FROM src", con, "random", token=TOKEN)
    yield SimpleNamespace(proc=proc, uri=uri, port=port, base=base)
    _stop(proc)


def _client(uri):
    return fl.connect(uri), fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])


def _exchange(client, opts, command: bytes, blobs=None, blob_type=pa.large_binary(), name="blob") -> pa.Table:
    writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(command), options=opts)
    try:
        table = pa.table({name: pa.array(blobs or [], blob_type)})
        writer.begin(table.schema)
        if blobs:
            writer.write_table(table)
        writer.done_writing()
        return reader.read_all()
    finally:
        try:
            writer.close()
        except (fl.FlightError, pa.ArrowException, OSError):
            pass


def _status(uri) -> dict:
    client, opts = _client(uri)
    try:
        return json.loads(next(iter(client.do_action(fl.Action("status", b""), options=opts))).body.to_pybytes())
    finally:
        client.close()


def _short(err: Exception) -> str:
    """What the node said, without the gRPC transport's own context."""
    return str(err).split(". Detail:", 1)[0]


# -- malformed requests

def _malformed(client, opts, rng: random.Random) -> list[str]:
    deep_json = b"[" * 100_000 + b"]" * 100_000
    cases = [
        lambda: _exchange(client, opts, bytes(rng.getrandbits(8) for _ in range(200))),
        lambda: _exchange(client, opts, deep_json),
        lambda: _exchange(client, opts, b'{"op": "tables", "pad": "' + b"x" * (8 << 20) + b'"}'),
        lambda: _exchange(client, opts, b'{"op": "probe", "bytes": 60000000}'),
        lambda: _exchange(client, opts, b'{"op": "probe", "bytes": "many"}'),
        lambda: _exchange(client, opts, b'{"op": "tables"}', [b"x" * (70 << 20)]),
        lambda: _exchange(client, opts, b'{"op": "tables"}', [b"y" * (20 << 20)] * 4),
        lambda: _exchange(client, opts, b'{"op": "tables"}', ["text"], pa.string()),
        lambda: _exchange(client, opts, b'{"op": "pull", "table": "ev", "where": "' + b"(" * 3000 + b"true"
                          + b")" * 3000 + b'"}'),
        lambda: _exchange(client, opts, b'{"op": "pull", "table": "ev", "where": "' + b"NOT " * 3000 + b'true"}'),
        lambda: _exchange(client, opts, b'{"op": "candidates", "table": "ev", "condition": "true", "key_sql": "ts", '
                                         b'"filter": {"kind": "swf", "blob": 0}}', [os.urandom(5000)]),
        lambda: list(client.do_get(fl.Ticket(os.urandom(64)), options=opts)),
        lambda: client.get_flight_info(fl.FlightDescriptor.for_path("x"), options=opts),
        lambda: list(client.do_action(fl.Action("explode", os.urandom(100)), options=opts)),
    ]
    said = []
    for case in cases:
        with pytest.raises(fl.FlightError) as info:
            case()
        said.append(_short(info.value))
    return said


def test_malformed_requests_get_short_errors_and_memory_stays_bounded(node):
    client, opts = _client(node.uri)
    rng = random.Random(3)
    _malformed(client, opts, rng)  # the first run sizes the node's pools
    before = _rss_mb(node.proc.pid)
    rounds = 2
    for _ in range(rounds):
        said = _malformed(client, opts, rng)
    after = _rss_mb(node.proc.pid)
    print(f"\nnode RSS before {rounds} malformed rounds {before:.0f} MB, after {after:.0f} MB")
    for text in said:
        assert len(text) < 400 and "Traceback" not in text and ".py" not in text and "/" not in text, text
    assert any("nests" in t for t in said) and any("not JSON" in t for t in said)
    assert any("at most 1048576 bytes" in t for t in said) and any("payload exceeds" in t for t in said)
    assert any("hands out no tickets" in t for t in said) and any("unknown action" in t for t in said)
    assert after < before + 150, (before, after)
    assert _exchange(client, opts, b'{"op": "tables"}').column("name").to_pylist() == ["ev"]
    client.close()


def test_deep_filter_expressions_are_refused_briefly(node):
    remote = matchrec.connect(storage_nodes=[node.uri], token=TOKEN)
    for where in ["(" * 3000 + "v > 1" + ")" * 3000, "NOT " * 3000 + "v > 1", "- " * 3000 + "v > 1"]:
        with pytest.raises(matchrec.OperationalError, match="refused the request: bad request: SQL fragment nests"):
            remote.remote.call_all({"op": "pull", "table": "ev", "columns": ["ts"], "where": where})
    fine = remote.remote.call_all({"op": "pull", "table": "ev", "columns": ["ts"], "where": "((v > 49))"})
    assert 0 < fine[0].num_rows < 200_000
    remote.close()


# -- a client that leaves

def test_a_client_timeout_interrupts_the_nodes_work(node):
    cancelled = _status(node.uri)["cancelled"]
    client, opts = _client(node.uri)
    short = fl.FlightCallOptions(timeout=1, headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    request = json.dumps({"op": "pull", "table": "ev", "columns": ["ts"], "where": COSTLY}).encode()
    started = time.perf_counter()
    with pytest.raises(fl.FlightTimedOutError):
        _exchange(client, short, request)
    client.close()
    while _status(node.uri)["cancelled"] == cancelled and time.perf_counter() - started < 20:
        time.sleep(0.1)
    seen = time.perf_counter() - started
    assert _status(node.uri)["cancelled"] == cancelled + 1
    cpu0 = _cpu_seconds(node.proc.pid)
    time.sleep(2)
    busy = _cpu_seconds(node.proc.pid) - cpu0
    print(f"\nnode stopped the request {seen:.2f} s after it began (client timeout 1 s); "
          f"CPU used in the next 2 s: {busy:.2f} s")
    assert busy < 0.5  # a core kept busy would use about 2 s here


# -- retries across a restart

def test_retries_with_backoff_outlast_a_node_restart(tmp_path):
    assert [round(RemoteStore.backoff(SimpleNamespace(retry_backoff=0.1), k) / (0.1 * 2 ** k), 1) >= 0.8
            for k in range(4)] == [True] * 4
    assert RemoteStore.backoff(SimpleNamespace(retry_backoff=0.1), 20) <= 6.0
    port = _free_port()
    db = str(tmp_path / "r.duckdb")
    proc = _start(["--db", db, "--port", str(port)])
    uri = f"grpc://127.0.0.1:{port}"
    try:
        con = duckdb.connect()
        con.register("src", _events(1000))
        load([uri], "ev", "SELECT * FROM src", con, "random")
        remote = matchrec.connect(storage_nodes=[uri], node_timeout=10)
        cur = remote.cursor()
        # waits 0.4, 0.8, 1.6, 3.2, 5, 5 s: room for a node process that takes long to start on a busy machine
        cur.execute("SET matchrec_node_retries = 6")
        cur.execute("SET matchrec_node_retry_backoff_ms = 400")
        restarted = []
        _stop(proc)  # down when the query starts; up again about a second later
        timer = threading.Thread(target=lambda: (time.sleep(0.7), restarted.append(
            _start(["--db", db, "--port", str(port)]))))
        timer.start()
        started = time.perf_counter()
        assert cur.execute("SELECT count(*) FROM ev").fetchall() == [(1000,)]
        took = time.perf_counter() - started
        timer.join()
        print(f"\nquery succeeded {took:.2f} s after it began against a stopped node (6 retries, 0.4 s backoff)")
        assert took < (0.4 + 0.8 + 1.6 + 3.2 + 5.0 + 5.0) * 1.2 + 6 * 1.0  # the backoffs plus a failed attempt each
        proc = restarted[0]
        _stop(proc)
        cur.execute("SET matchrec_node_retries = 0")
        started = time.perf_counter()
        with pytest.raises(matchrec.OperationalError, match=f"{uri} failed during the query"):
            cur.execute("SELECT count(*) FROM ev")
        cur.execute("SET matchrec_node_retries = 2")
        with pytest.raises(matchrec.OperationalError, match="after 3 attempts"):
            cur.execute("SELECT count(*) FROM ev")
        remote.close()
    finally:
        _stop(proc)


# -- tokens, TLS, exposure

def test_token_from_file_or_environment_and_never_shown(tmp_path, monkeypatch, capsys):
    secret_file = tmp_path / "token"
    secret_file.write_text("file-s3cret\n")
    port = _free_port()
    proc = _start(["--db", str(tmp_path / "t.duckdb"), "--port", str(port), "--token-file", str(secret_file)])
    uri = f"grpc://127.0.0.1:{port}"
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"file-s3cret" not in f.read()
        assert "file-s3cret" not in proc.banner and "token required" in proc.banner
        monkeypatch.delenv("MATCHREC_NODE_TOKEN", raising=False)
        with pytest.raises(matchrec.OperationalError, match="requires a valid token"):
            matchrec.connect(storage_nodes=[uri])
        matchrec.connect(storage_nodes=[uri], token="file-s3cret").close()
        monkeypatch.setenv("MATCHREC_NODE_TOKEN", "file-s3cret")
        matchrec.connect(storage_nodes=[uri]).close()
        monkeypatch.setenv("MATCHREC_NODE_TOKEN", "wrong")
        with pytest.raises(matchrec.OperationalError, match="requires a valid token") as info:
            matchrec.connect(storage_nodes=[uri])
        assert "wrong" not in str(info.value)
    finally:
        _stop(proc)
    assert "file-s3cret" not in proc.stderr.read()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert main(["storage-node", "--db", str(tmp_path / "e.duckdb"), "--port", "0", "--token-file", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "token file" in err and "is empty" in err and not (tmp_path / "e.duckdb").exists()


def test_non_loopback_address_needs_a_token_or_insecure(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MATCHREC_NODE_TOKEN", raising=False)
    assert main(["storage-node", "--db", str(tmp_path / "x.duckdb"), "--port", "0", "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "Refusing to listen on 0.0.0.0 without a token" in err and "--insecure" in err
    assert "Traceback" not in err and not (tmp_path / "x.duckdb").exists()
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.7")
    with pytest.raises(matchrec.ProgrammingError, match="--insecure"):
        check_exposure("0.0.0.0", None, False)
    check_exposure("0.0.0.0", "t", False)
    check_exposure("0.0.0.0", None, True)
    check_exposure("127.0.0.1", None, False)


def test_tls_with_a_self_signed_certificate(tmp_path, monkeypatch):
    cert, key = tmp_path / "node.pem", tmp_path / "node.key"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                           "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                           "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    port = _free_port()
    proc = _start(["--db", str(tmp_path / "tls.duckdb"), "--port", str(port), "--tls-cert", str(cert),
                   "--tls-key", str(key), "--token", "tls-token"])
    assert f"grpc+tls://127.0.0.1:{port}" in proc.banner
    uri = f"grpc+tls://localhost:{port}"
    try:
        con = duckdb.connect()
        con.register("src", _events(500))
        load([uri], "ev", "SELECT * FROM src", con, "random", token="tls-token", tls_root_certs=str(cert))
        remote = matchrec.connect(storage_nodes=[uri], token="tls-token", tls_root_certs=str(cert))
        assert remote.cursor().execute("SELECT count(*) FROM ev").fetchall() == [(500,)]
        remote.close()
        monkeypatch.setenv("MATCHREC_NODE_TLS_ROOT_CERTS", str(cert))
        remote = matchrec.connect(storage_nodes=[uri], token="tls-token")
        assert remote.cursor().execute("SELECT count(*) FROM ev WHERE v > 25").fetchall()[0][0] > 0
        remote.close()
        monkeypatch.delenv("MATCHREC_NODE_TLS_ROOT_CERTS")
        with pytest.raises(matchrec.OperationalError):  # the certificate is not trusted by the system
            matchrec.connect(storage_nodes=[uri], token="tls-token", node_timeout=5)
        with pytest.raises(matchrec.OperationalError):  # plain gRPC cannot talk to a TLS node
            matchrec.connect(storage_nodes=[f"grpc://127.0.0.1:{port}"], token="tls-token", node_timeout=5)
    finally:
        _stop(proc)
