"""A dbt-duckdb Python model that runs a matchrec CER statement.

dbt-duckdb calls ``model(dbt, session)`` with ``session`` wrapping its DuckDB cursor;
``session.cursor()`` is a plain DuckDB connection to the same database, which
``matchrec.connect`` borrows (closing matchrec's connection leaves it open).
"""
import matchrec

CARD_TESTING = """
PATTERN SEQ(PROBE p1, PROBE p2, PROBE p3, LARGE big)
FROM card_testing_input TYPE kind PARTITION BY card_id ORDER BY ts
USE skip-till-next-match
WITHIN 10 minutes
RETURN p1.card_id AS card_id, p1.ts AS first_probe_ts, big.ts AS large_ts, big.amount AS large_amount
"""


def model(dbt, session):
    dbt.config(materialized="table")
    # dbt.ref() records the dependency and returns a DuckDB relation of the upstream model.
    events = dbt.ref("transactions").to_arrow_table()
    duck = session.cursor()
    con = matchrec.connect(duck)
    con.register("card_testing_input", events)
    matches = con.cursor().execute(CARD_TESTING).fetch_arrow_table()
    con.close()
    duck.close()
    # dbt reads one return statement at the end of model(): an Arrow table, a DataFrame or a relation
    return matches
