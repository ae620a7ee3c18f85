"""A Spark pipeline with MATCH_RECOGNIZE: read Parquet, match, write the matches as Parquet.

    python examples/spark_pipeline.py [--rows 200000] [--out matches_parquet] [--master local[2]]

The input is generated once with DuckDB (crime reports: a time, a type and a district per
event) and written as Parquet, standing in for the Parquet files of a data lake. Spark reads
it; the pattern - a robbery, then a battery in the same district, then a motor vehicle theft
in the same district, all within 30 minutes - is matched by matchrec on the executors, and
Spark SQL around the clause counts the matches per district before both results are written.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import duckdb

import matchrec.spark as ms  # before the session: Spark's Python workers use this interpreter

QUERY = """
SELECT district, count(*) AS matches, min(robbery_at) AS first_robbery
FROM reports MATCH_RECOGNIZE (
    ORDER BY ts
    MEASURES R.ts AS robbery_at, M.ts AS theft_at, R.district AS district
    AFTER MATCH SKIP PAST LAST ROW
    PATTERN (R N*? B N*? M) WITHIN INTERVAL '30' MINUTE
    DEFINE R AS type = 'ROBBERY',
           B AS type = 'BATTERY' AND district = R.district,
           M AS type = 'MOTOR VEHICLE THEFT' AND district = R.district,
           N AS true
)
GROUP BY district
"""


def generate(path: str, rows: int) -> None:
    """Crime-like reports: one every ~60 s, skewed types, 25 districts."""
    duckdb.sql(f"""
        COPY (
          SELECT TIMESTAMP '2024-01-01' + to_microseconds(CAST(i * 60e6 + (hash(i) % 30000000) AS BIGINT)) AS ts,
                 CASE WHEN hash(i, 1) % 100 < 8 THEN 'ROBBERY' WHEN hash(i, 1) % 100 < 30 THEN 'BATTERY'
                      WHEN hash(i, 1) % 100 < 38 THEN 'MOTOR VEHICLE THEFT' ELSE 'THEFT' END AS type,
                 CAST(hash(i, 2) % 25 + 1 AS INTEGER) AS district
          FROM range({rows}) r(i)
        ) TO '{path}' (FORMAT parquet)""")


def main(argv=None, spark=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    from pyspark.sql import SparkSession
    own = spark is None
    if own:
        spark = (SparkSession.builder.master(args.master).appName("matchrec-example")
                 .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="matchrec-example-")
    out = args.out or os.path.join(work, "matches")
    source = os.path.join(work, "reports.parquet")
    generate(source, args.rows)
    started = time.perf_counter()
    spark.read.parquet(source).createOrReplaceTempView("reports")
    per_district = ms.sql(spark, QUERY)
    per_district.write.mode("overwrite").parquet(out)
    seconds = time.perf_counter() - started
    written = spark.read.parquet(out).orderBy("district").collect()
    print(f"{args.rows} reports, {sum(r['matches'] for r in written)} matches in {len(written)} districts, "
          f"{seconds:.1f} s; mode: {ms.last_runs()[0].mode}")
    print(f"written to {out}")
    for r in written[:5]:
        print(f"  district {r['district']}: {r['matches']} matches, first robbery {r['first_robbery']}")
    if own:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
