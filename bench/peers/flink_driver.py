"""Apache Flink (PyFlink, batch mode) driver, run by bench/.flink-venv's python with a JSON spec.

Declares a filesystem CSV table whose ORDER BY column is a time attribute (a watermark on
it: Flink's MATCH_RECOGNIZE needs one), then runs ``SELECT count(*) FROM (<query>)``
``runs`` times in the same JVM. A batch count is one final row, so nothing streams back to
Python. The JVM is a child process, so the reported peak RSS adds its VmHWM, read from
/proc before exit.
"""
import json
import sys
import time

# bench/peers/rss.py: the directory of this script is on sys.path
from rss import peak_rss_kb

RESULT_MARK = "@@BENCH_RESULT@@ "


def main(spec: dict) -> dict:
    started = time.perf_counter()
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    env.get_config().set("parallelism.default", str(spec.get("parallelism", 2)))
    cols = ", ".join(f"`{c}` {t}" for c, t in spec["columns"])
    env.execute_sql(f"""
        CREATE TABLE {spec['table']} ({cols},
          WATERMARK FOR `{spec['rowtime']}` AS `{spec['rowtime']}` - INTERVAL '1' SECOND)
        WITH ('connector' = 'filesystem', 'path' = '{spec['csv']}', 'format' = 'csv',
              'csv.null-literal' = '')""")
    startup = time.perf_counter() - started
    times, count = [], None
    for _ in range(spec["runs"]):
        started = time.perf_counter()
        rows = list(env.execute_sql(f"SELECT count(*) FROM ({spec['sql']}) AS q").collect())
        times.append(time.perf_counter() - started)
        count = rows[0][0]
        if times[-1] > spec["warm_skip"]:
            break
    return {"times": times, "count": count, "extra": {"startup_s": round(startup, 2)},
            "rss_kb": peak_rss_kb()}


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    print(RESULT_MARK + json.dumps(result), flush=True)
