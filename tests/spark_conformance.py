"""Run MATCH_RECOGNIZE conformance cases through Spark (``matchrec.spark.sql``) and DuckDB.

Usage: ``python -m tests.spark_conformance CORPUS.jsonl [-v]``. A corpus line is a JSON object
with ``sql``, ``dialect`` and ``expected`` rows (or ``expected_error``). Each case is run through
Spark on ``local[2]`` and through ``matchrec.connect()``; a case passes on an engine when its rows
equal the expected ones as a multiset (numbers with a small relative tolerance), or when an
expected error is raised as a matchrec error. The last line printed is
``spark: N passed, N failed; duckdb: N passed, N failed; same cases: yes|no``.
"""
from __future__ import annotations

import argparse
import datetime
import decimal
import json
import math
import sys


def norm(v):
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float, decimal.Decimal)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        v = v.replace(tzinfo=None)
    if hasattr(v, "asDict"):  # a Spark struct
        return norm(v.asDict())
    return str(v)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def rows_match(expected, actual) -> bool:
    exp = [norm(list(r)) for r in expected]
    act = [norm(list(r)) for r in actual]
    if len(exp) != len(act):
        return False
    remaining = list(act)
    for row in exp:
        for i, cand in enumerate(remaining):
            if same(row, cand):
                del remaining[i]
                break
        else:
            return False
    return True


def spark_rows(df) -> list:
    # Rows through Arrow keep Spark's values as they are (maps, arrays, decimals)
    return [tuple(r) for r in df.collect()]


def check(case: dict, run) -> tuple[bool, str]:
    import matchrec
    from matchrec.spark import matchrec_error
    try:
        try:
            rows = run(case["sql"], case.get("dialect", "trino"))
        except Exception as err:  # noqa: BLE001 - runtime errors of executors arrive wrapped by Spark
            raise matchrec_error(err) or err
    except matchrec.Error as err:
        if "expected_error" in case:
            return True, ""
        return False, f"{type(err).__name__}: {str(err)[:300]}"
    except Exception as err:  # noqa: BLE001 - a case fails, the run goes on
        return False, f"non-matchrec {type(err).__name__}: {str(err).strip()[:300]}"
    if "expected_error" in case:
        return False, f"expected an error, got {len(rows)} rows"
    if rows_match(case["expected"]["rows"], rows):
        return True, ""
    return False, f"rows differ: got {rows[:5]} expected {case['expected']['rows'][:5]}"


def spark_session(master: str = "local[2]"):
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(master).appName("matchrec-tests")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_corpus(cases: list[dict], spark, verbose: bool = False) -> dict:
    import matchrec
    import matchrec.spark as ms

    def on_spark(sql, dialect):
        return spark_rows(ms.sql(spark, sql, dialect=dialect))

    def on_duckdb(sql, dialect):
        con = matchrec.connect(dialect=dialect)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    result = {"spark": {}, "duckdb": {}}
    for case in cases:
        for name, run in (("spark", on_spark), ("duckdb", on_duckdb)):
            ok, why = check(case, run)
            result[name][case["id"]] = ok
            if verbose and not ok:
                print(f"FAIL [{name}] {case['id']}: {why}", file=sys.stderr)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus")
    p.add_argument("-v", action="store_true")
    p.add_argument("-k", default="")
    args = p.parse_args(argv)
    with open(args.corpus) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    cases = [c for c in cases if args.k in c["id"]]
    spark = spark_session()
    res = run_corpus(cases, spark, args.v)
    s, d = res["spark"], res["duckdb"]
    sp, dp = sum(s.values()), sum(d.values())
    print(f"spark: {sp} passed, {len(s) - sp} failed; duckdb: {dp} passed, {len(d) - dp} failed; "
          f"same cases: {'yes' if s == d else 'no'}")
    spark.stop()
    return 0 if s == d else 1


if __name__ == "__main__":
    sys.exit(main())
