"""Partition numbers of a sorted read (``engine.cer_read.with_partition_ids``, counted where the
sorted values change) against DuckDB's ``dense_rank() OVER (ORDER BY part NULLS LAST) - 1`` over
the same rows: every type a PARTITION BY column can have, with NULLs, NaN, -0.0, equal intervals
written differently, and the types Arrow cannot compare (ranked by DuckDB)."""
from __future__ import annotations

import random

import duckdb
import numpy as np
import pytest

from matchrec.engine.cer_read import with_partition_ids

VALUES = {
    "INTEGER": ["1", "2", "NULL", "-5"],
    "BIGINT": ["1", "NULL", "9"],
    "DOUBLE": ["'NaN'", "0.0", "-0.0", "NULL", "1.5", "'inf'"],
    "FLOAT": ["'NaN'", "1.0", "NULL"],
    "VARCHAR": ["'a'", "'A'", "NULL", "''", "'b'"],
    "BOOLEAN": ["true", "false", "NULL"],
    "DATE": ["DATE '2020-01-01'", "NULL", "DATE '2021-01-01'"],
    "TIMESTAMP": ["TIMESTAMP '2020-01-01 00:00:01'", "NULL", "TIMESTAMP '2020-01-01'"],
    "TIME": ["TIME '01:00:00'", "NULL", "TIME '00:00:00'"],
    "DECIMAL(10,2)": ["1.50", "2.25", "NULL"],
    "INTERVAL": ["INTERVAL 1 DAY", "INTERVAL 24 HOUR", "NULL", "INTERVAL 1 MONTH"],
    "UUID": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "NULL", "'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"],
    "BLOB": ["'\\x00'::BLOB", "'a'::BLOB", "NULL"],
    "ENUM('x','y','z')": ["'z'", "'x'", "NULL"],
    "INTEGER[]": ["[1,2]", "[1]", "NULL", "[]"],
    "STRUCT(a INT)": ["{'a': 1}", "{'a': NULL}", "NULL"],
}


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_partition_ids_equal_dense_rank(kind):
    duck = duckdb.connect()
    rng = random.Random(kind)
    for trial in range(6):
        n = rng.choice([0, 1, 2, 60])
        rows = ", ".join(f"({rng.choice(VALUES[kind])}::{kind}, {i})" for i in range(n))
        duck.execute(f"CREATE OR REPLACE TABLE p AS SELECT * FROM (VALUES {rows}) AS v(__part, __key)" if n else
                     f"CREATE OR REPLACE TABLE p (__part {kind}, __key INTEGER)")
        body, order = "SELECT * FROM p", ["__part NULLS LAST", "__key"]
        table = duck.sql(f"SELECT * FROM ({body}) ORDER BY {', '.join(order)}").to_arrow_table()
        got = with_partition_ids(duck, table, body, order).column("__pid").to_numpy()
        want = duck.sql(f"SELECT dense_rank() OVER (ORDER BY __part NULLS LAST) - 1 AS r FROM ({body}) "
                        f"ORDER BY {', '.join(order)}").fetchnumpy()["r"]
        assert np.array_equal(got, np.asarray(want, np.int64)), (kind, trial, got, want)
