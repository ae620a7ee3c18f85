"""Shared fixtures: a fresh in-memory connection and a helper to run one query."""
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
