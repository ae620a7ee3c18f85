"""The case folder: every line of ``tests/cases/*.jsonl`` is one statement with its input and its
expected rows (or error), run on every engine:

- ``duckdb``: ``matchrec.connect()`` as a user runs it;
- ``reference``: the same with ``SET matchrec_fast_path = 0`` (the reference matchers);
- ``spark``: ``matchrec.spark.sql`` on one local[2] SparkSession for the whole test session (the
  default run: every second case and those in Spark's dialect; ``-m slow``: the others);
- ``nodes``: the input loaded onto three Arrow Flight storage nodes on 127.0.0.1 (spread by row),
  the statement run by a compute-node connection.

A case line (one JSON object):

    {"name": "unique_name",
     "table": {"name": "t", "columns": {"id": "INTEGER", "v": "INTEGER"}, "rows": [[1, 5], [2, 7]]},
     "setup": "CREATE TABLE u AS ...",            # instead of (or besides) "table"; DuckDB SQL
     "sql": "SELECT ... MATCH_RECOGNIZE (...)",
     "expected": [[1, 2], [3, 4]],                # rows as lists; null for NULL
     "error": {"class": "ProgrammingError", "message": "fragment"},   # instead of "expected"
     "order_matters": false,                      # default: rows compared as a multiset
     "dialect": "duckdb",                          # the SQL dialect of "sql" (default duckdb)
     "where": {"engines": ["duckdb", "reference"], "reason": "why not the others"},
     "why": "how the expected rows were derived",
     "slow": false}

The input is built in DuckDB ("table" becomes ``CREATE TABLE`` + ``INSERT``, "setup" runs as is);
every table it leaves is what the engines see. Numbers compare with a small relative tolerance.
"""
from __future__ import annotations

import json
import pathlib

import duckdb
import pytest

import matchrec
from spark_conformance import norm, rows_match, same

CASE_DIR = pathlib.Path(__file__).resolve().parent / "cases"
ENGINES = ("duckdb", "reference", "spark", "nodes")
KEYS = {"name", "table", "setup", "sql", "expected", "error", "order_matters", "dialect", "where", "why", "slow"}


def load_cases() -> list[dict]:
    cases, names = [], set()
    for path in sorted(CASE_DIR.glob("*.jsonl")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("//"):
                continue
            where = f"{path.name}:{lineno}"
            try:
                case = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not JSON: {err}") from None
            unknown = set(case) - KEYS
            assert not unknown, f"{where}: unknown keys {sorted(unknown)}"
            assert case.get("name") and case["name"] not in names, f"{where}: missing or repeated name"
            assert "sql" in case and (("expected" in case) != ("error" in case)), \
                f"{where}: needs sql and exactly one of expected / error"
            assert "table" in case or "setup" in case, f"{where}: needs table or setup"
            engines = case.get("where", {}).get("engines", ENGINES)
            assert set(engines) <= set(ENGINES) and (engines == ENGINES or case["where"].get("reason")), \
                f"{where}: where names engines of {ENGINES} and gives a reason"
            names.add(case["name"])
            case["_at"] = where
            cases.append(case)
    return cases


CASES = load_cases()


def _params():
    on_spark = 0
    for case in CASES:
        for engine in case.get("where", {}).get("engines", ENGINES):
            slow = bool(case.get("slow"))
            if engine == "spark" and case.get("dialect") != "spark":
                # each case is a few Spark jobs (about a second here): the default run sends every
                # second case to Spark, and every case written in Spark's dialect; `-m slow` the rest
                slow |= on_spark % 2 == 1
                on_spark += 1
            marks = [pytest.mark.slow] if slow else []
            yield pytest.param(case, engine, id=f"{case['name']}-{engine}", marks=marks)


# -- the input

def _sql_literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + str(v).replace("'", "''") + "'"


def build_input(case: dict) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding the case's tables."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    t = case.get("table")
    if t:
        cols = ", ".join(f'"{c}" {ty}' for c, ty in t["columns"].items())
        con.execute(f'CREATE TABLE "{t["name"]}" ({cols})')
        if t["rows"]:
            values = ", ".join("(" + ", ".join(_sql_literal(v) for v in row) + ")" for row in t["rows"])
            con.execute(f'INSERT INTO "{t["name"]}" VALUES {values}')
    if case.get("setup"):
        con.execute(case["setup"])
    return con


def _tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
                                      "ORDER BY table_name").fetchall()]


# -- the engines

def run_duckdb(case, fast_path: bool):
    src = build_input(case)
    con = matchrec.connect(src, dialect=case.get("dialect", "duckdb"))
    try:
        cur = con.cursor()
        if not fast_path:
            cur.execute("SET matchrec_fast_path = 0")
        cur.execute(case["sql"])
        return cur.fetchall()
    finally:
        con.close()
        src.close()


def run_spark(case, spark):
    import matchrec.spark as ms
    src = build_input(case)
    try:
        for name in _tables(src):
            spark.createDataFrame(src.table(name).to_arrow_table()).createOrReplaceTempView(name)
    finally:
        src.close()
    try:
        return [tuple(r) for r in ms.sql(spark, case["sql"], dialect=case.get("dialect", "spark")).collect()]
    except matchrec.Error:
        raise
    except Exception as err:  # an executor's error arrives wrapped by Spark
        raise ms.matchrec_error(err) or err


def run_nodes(case, uris):
    from matchrec.connectors.loader import load
    from nodes import TOKEN
    src = build_input(case)
    try:
        for name in _tables(src):
            load(uris, name, f'SELECT * FROM "{name}"', src, "random", token=TOKEN)
    finally:
        src.close()
    con = matchrec.connect(storage_nodes=uris, token=TOKEN, dialect=case.get("dialect", "duckdb"))
    try:
        cur = con.cursor()
        cur.execute(case["sql"])
        return cur.fetchall()
    finally:
        con.close()


# -- comparing

def _sort_key(row):
    return [(x is None, repr(x)) for x in row]


def rows_equal(expected, got, order_matters: bool) -> bool:
    if not order_matters:
        return rows_match(expected, got)
    exp, act = [norm(list(r)) for r in expected], [norm(list(r)) for r in got]
    return len(exp) == len(act) and all(same(x, y) for x, y in zip(exp, act))


def _show(rows, limit=20) -> str:
    rows = [list(r) for r in rows]
    more = f" ... ({len(rows)} rows)" if len(rows) > limit else ""
    return repr(rows[:limit]) + more


@pytest.mark.parametrize("case,engine", list(_params()))
def test_case(case, engine, request):
    def run():
        if engine == "spark":
            return run_spark(case, request.getfixturevalue("spark_shared")())
        if engine == "nodes":
            return run_nodes(case, request.getfixturevalue("node_cluster"))
        return run_duckdb(case, fast_path=engine == "duckdb")

    label = f"{case['_at']} {case['name']} on {engine}\n  {case['sql']}"
    if "error" in case:
        want = case["error"]
        cls = getattr(matchrec, want["class"])
        with pytest.raises(matchrec.Error) as info:
            run()
        assert isinstance(info.value, cls), f"{label}\n  expected {want['class']}, got " \
                                            f"{type(info.value).__name__}: {info.value}"
        assert want.get("message", "").lower() in str(info.value).lower(), \
            f"{label}\n  expected a message with {want['message']!r}, got: {info.value}"
        return
    got = run()
    assert rows_equal(case["expected"], got, case.get("order_matters", False)), \
        f"{label}\n  expected {_show(case['expected'])}\n  got      {_show(got)}"


def test_the_folder_holds_cases_of_every_kind():
    """The seed set keeps covering the clause, the window form, CER statements and errors."""
    text = " ".join(c["sql"].upper() for c in CASES)
    for word in ("PARTITION BY", "RUNNING", "FINAL", "ALL ROWS PER MATCH", "SKIP TO NEXT ROW", "SKIP TO FIRST",
                 "SKIP TO LAST", "PERMUTE", "SUBSET", "CLASSIFIER", "MATCH_NUMBER", "{-", "OVER W", "PATTERN SEQ",
                 "STRATEGY", "WITHIN"):
        assert word in text, word
    assert sum("error" in c for c in CASES) >= 5
    assert len(CASES) >= 60
