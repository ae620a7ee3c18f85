"""Shared fixtures: a fresh in-memory connection and a helper to run one query; one storage-node
cluster and one local Spark session per test session (started on first use)."""
from __future__ import annotations

import pytest

import matchrec


@pytest.fixture
def con():
    connection = matchrec.connect(":memory:")
    yield connection
    connection.close()


@pytest.fixture
def q(con):
    """Run SQL and return all rows."""
    def run(sql, params=None):
        cur = con.cursor()
        cur.execute(sql, params)
        return cur.fetchall()
    return run


@pytest.fixture(scope="module")
def trino():
    """A connection with Trino's dialect, one per test module."""
    connection = matchrec.connect(":memory:", dialect="trino")
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory):
    """Three storage nodes on 127.0.0.1 (token ``nodes.TOKEN``); yields their addresses."""
    from nodes import Cluster
    cluster = Cluster(tmp_path_factory.mktemp("nodes"), 3)
    yield cluster.uris
    cluster.close()


@pytest.fixture(scope="session")
def spark_shared():
    """A local[2] SparkSession for the whole test session: a function returning it, started again if
    a module stopped the session in between (getOrCreate hands every module the same one)."""
    from spark_conformance import spark_session
    sessions = []

    def live():
        if not sessions or sessions[-1].sparkContext._jsc is None:
            sessions.append(spark_session())
        return sessions[-1]
    yield live
    if sessions and sessions[-1].sparkContext._jsc is not None:
        sessions[-1].stop()
