"""CER statements on Spark (``ms.sql`` with ``PATTERN ... FROM`` or MATCH_RECOGNIZE with STRATEGY,
``ms.run_many``): rows and types equal to the DuckDB path's (``matchrec.connect()``) over the same
rows, on the session's local[2] Spark. Random statements cover negation, Kleene closure, AND,
equality conditions between variables, PARTITION BY and not (the time split), every strategy and
interval filtering; the default run is a few of them, ``-m slow`` a sweep of seeds."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

import matchrec
import matchrec.spark as ms
from spark_conformance import rows_match
from test_spark import events as spark_events


@pytest.fixture
def spark(spark_shared):
    return spark_shared()


def events(n=400, keys=3, seed=1) -> pa.Table:
    return spark_events(n, keys, seed, ties=True)


def _duck(table: pa.Table, name: str = "ev"):
    con = matchrec.connect()
    con.register("__input", table)
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM __input")  # a table: rowid is the source's order
    return con


def _duck_many(data, workload: list) -> list:
    """The workload's tables by ``matchrec.run_many`` over the same events in DuckDB."""
    con = _duck(data)
    try:
        return matchrec.run_many(con, workload).tables
    finally:
        con.close()


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


def _types(schema) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _same(con, spark, sql: str, **kw) -> tuple[int, str]:
    want = con.execute(sql).fetch_arrow_table()
    df = ms.sql(spark, sql, **kw)
    got = df.collect()
    assert _types(df.schema) == _types(ms._spark_schema(want.schema)), (sql, df.schema, want.schema)
    assert rows_match(_rows(want), got), (sql, len(want), len(got))
    return len(got), ms.last_runs()[0].mode


def random_statement(rng: random.Random, partitioned: bool | None = None) -> str:
    n = rng.randint(2, 3)
    names = ["x", "y", "z"][:n]
    kleene = rng.randrange(n) if rng.random() < 0.4 else None
    items = [f"{rng.choice('abcd')}{'+' if i == kleene else ''} {v}" for i, v in enumerate(names)]
    op = "AND" if rng.random() < 0.2 else "SEQ"
    if op == "SEQ" and rng.random() < 0.35:
        items.insert(rng.randint(0, len(items)), f"~{rng.choice('abcd')} n")
    single = [v for i, v in enumerate(names) if i != kleene]
    where = []
    if len(single) >= 2 and rng.random() < 0.5:
        a, b = rng.sample(single, 2)
        where.append(f"{a}.g = {b}.g")
    if rng.random() < 0.4:
        where.append(f"{rng.choice(names)}.v {rng.choice(['<', '>'])} {rng.randint(10, 40)}")
    if kleene is not None and rng.random() < 0.3:
        where.append(f"avg({names[kleene]}.v) > {rng.randint(5, 30)}")
    partitioned = rng.random() < 0.5 if partitioned is None else partitioned
    # without WITHIN only patterns that cannot explode (no Kleene closure): the DuckDB path would stop them too
    within = rng.randint(4, 16) if not partitioned or kleene is not None or rng.random() < 0.8 else None
    strategy = rng.choice(["", "USE skip-till-any-match", "USE skip-till-next-match", "USE strict-contiguity"])
    ret = rng.choice(["count", "events", "project"])
    if ret == "count":
        returns = "RETURN COUNT(*)"
    elif ret == "events":
        returns = ""
    else:
        proj = [f"{single[0]}.ts", f"{names[-1]}.v"]
        if len(single) >= 2:
            proj.append(f"{single[1]}.v - {single[0]}.v AS d")
        if kleene is not None:
            proj.append(f"count({names[kleene]}) AS c")
        returns = "RETURN " + ", ".join(proj)
    parts = [f"PATTERN {op}({', '.join(items)}) FROM ev", "PARTITION BY k" if partitioned else "", strategy,
             ("WHERE " + " AND ".join(where)) if where else "", f"WITHIN {within}" if within is not None else "",
             returns]
    return " ".join(p for p in parts if p)


def _differential(spark, seeds, per_seed: int, filters=("on", "off")):
    for seed in seeds:
        data = events(seed=seed)
        spark.createDataFrame(data).createOrReplaceTempView("ev")
        con = _duck(data)
        rng = random.Random(seed)
        try:
            for i in range(per_seed):
                sql = random_statement(rng, partitioned=i % 2 == 0)
                _same(con, spark, sql, interval_filter=filters[i % len(filters)])
        finally:
            con.close()


def test_differential_spark_equals_duckdb(spark):
    """Two random statements: one partitioned, one through the time split."""
    _differential(spark, [11], 2, filters=("off",))


@pytest.mark.slow
def test_time_split_count_filtered_and_match_recognize_form(spark):
    """The time split's COUNT(*) with a negation and a Kleene closure, filtered before the shuffle,
    and the MATCH_RECOGNIZE form with a strategy."""
    data = events(n=600, seed=4)
    spark.createDataFrame(data).createOrReplaceTempView("ev")
    con = _duck(data)
    try:
        n, mode = _same(con, spark, "PATTERN SEQ(a x, ~c n, b+ y) FROM ev USE skip-till-next-match WITHIN 9 "
                                    "RETURN COUNT(*)", interval_filter="on")
        assert mode.startswith("time split") and n == 1
        assert ms.last_runs()[0].filtering.used
        n, mode = _same(con, spark, "SELECT * FROM ev MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES "
                                    "A.ts AS s, last(B.ts) AS e, count(B.*) AS nb PATTERN (A B+ C) WITHIN 10 "
                                    "STRATEGY skip-till-any-match DEFINE A AS v >= 25, B AS B.v < 30, "
                                    "C AS C.v > A.v)", interval_filter="off")
        assert mode.startswith("partitioned") and n > 0
    finally:
        con.close()


@pytest.mark.slow
def test_differential_spark_equals_duckdb_sweep(spark):
    _differential(spark, range(20, 26), 4, filters=("on", "off", "auto"))


@pytest.mark.slow
def test_run_many_equals_duckdb(spark):
    data = events(seed=5)
    spark.createDataFrame(data).createOrReplaceTempView("ev")
    workload = [
        "PATTERN SEQ(a x, b y) FROM ev PARTITION BY k WHERE x.g = y.g WITHIN 8 RETURN x.ts, y.ts",
        "SET matchrec_cer_mechanism = eager",
        "PATTERN SEQ(a x, b+ y, c z) FROM ev PARTITION BY k WITHIN 10 RETURN COUNT(*)",
        "PATTERN SEQ(c x, d y) FROM ev WITHIN 6 RETURN x.v + y.v AS s",
    ]
    want = _duck_many(data, workload)
    # filtering forced: the shared shuffle carries only rows inside the two statements' interval sets
    got = ms.run_many(spark, workload, interval_filter="on")
    assert got[1] is None
    for sql, w, g in zip(workload, want, got):
        if g is None:
            continue
        assert _types(g.schema) == _types(ms._spark_schema(w.schema)), sql
        assert rows_match(_rows(w), g.collect()), sql
    runs = ms.last_runs()
    shared = [r for r in runs if "2 statements share one shuffle" in r.mode]
    assert shared and shared[0].filtering.used, [r.mode for r in runs]
    assert sum("one final pull for the 2 statements" in line for line in shared[0].lines) == 2, shared[0].lines
    # the time-split statement's rounds are in the same one job as the shuffle's
    alone = [r for r in runs if r.mode.startswith("time split")]
    assert alone and alone[0].filtering.used and "in the table's one job of rounds" in alone[0].lines[-1], alone
    assert any("1 Spark job" in line and "the table's 3 statements in 2 groups" in line
               for r in runs for line in r.lines), [r.lines for r in runs]


def test_release_frees_dataframes_held_in_reference_cycles(spark):
    """A DataFrame that only a Python reference cycle still holds keeps its JVM plan alive until the
    cyclic collector runs; release() runs it, so repeated statements do not fill the driver's heap."""
    import weakref
    spark.createDataFrame(events(seed=2)).createOrReplaceTempView("ev")
    df = ms.sql(spark, "PATTERN SEQ(a x, b y) FROM ev PARTITION BY k WITHIN 8 RETURN x.ts, y.ts")
    df.collect()
    holder: list = [df]
    holder.append(holder)
    ref = weakref.ref(df)
    del df, holder
    assert ref() is not None  # only the cycle holds it
    ms.release()
    assert ref() is None


@pytest.mark.slow
def test_run_many_random_workload_equals_duckdb(spark):
    """Random workloads with filtering forced: the shuffles' and the time-split statements' rounds
    in one job for the table (join filters included), every result equal to DuckDB's run_many."""
    for seed in (41, 42):
        data = events(n=500, seed=seed)
        spark.createDataFrame(data).createOrReplaceTempView("ev")
        rng = random.Random(seed)
        workload = [random_statement(rng, partitioned=i % 2 == 0) for i in range(5)]
        workload.append("PATTERN SEQ(d x, ~a n, b y) FROM ev WHERE x.g = y.g WITHIN 7 RETURN COUNT(*)")
        want = _duck_many(data, workload)
        got = ms.run_many(spark, workload, interval_filter="on")
        for sql, w, g in zip(workload, want, got):
            assert rows_match(_rows(w), g.collect()), (seed, sql)
        lines = [line for r in ms.last_runs() for line in r.lines]
        assert any("shared rounds: 1 Spark job" in line for line in lines), lines
        ms.release()


GROUP = [
    "PATTERN SEQ(a x, b y) FROM ev PARTITION BY k WHERE x.v >= 46 WITHIN 4 RETURN x.ts, y.ts",
    "PATTERN SEQ(b x, a y, c z) FROM ev PARTITION BY k WHERE y.v >= 46 WITHIN 6 RETURN COUNT(*)",
    "PATTERN SEQ(a x, c+ y) FROM ev PARTITION BY k WHERE x.v >= 46 WITHIN 3 RETURN x.ts, COUNT(y) AS n",
]


def test_group_rounds_keep_every_row_a_match_needs():
    """The shared rounds of a run_many group without Spark: each partition's replies come from the
    ShardService its task runs (two halves of the rows), the group's final pull keeps fewer rows,
    and matching over them gives every statement's result over all rows."""
    import duckdb

    from matchrec.connectors.shard import ShardService
    from matchrec.connectors.spark_filtering import TABLE, GroupRounds, answer_batch
    from matchrec.planner.cer_intervals import interval_plan
    from matchrec.spark_cer import analyze
    data = events(n=2000, keys=4, seed=9)
    ips = [interval_plan(analyze(sql, data.schema, []).plan)[0] for sql in GROUP]
    rounds = GroupRounds.of(ips)
    # 7 elements with a row-level condition, 3 distinct conditions: one request each, plus the statistics
    assert sum(len(ip.variables) for ip in ips) == 7 and len(rounds.requests) == 1 + 3, rounds.conds
    numbered = data.append_column("rid", pa.array(range(data.num_rows), pa.int64()))
    cons = []
    for half in (numbered.slice(0, 1000), numbered.slice(1000)):
        con = duckdb.connect()
        con.register("half", half)
        con.execute(f"CREATE TABLE {TABLE} AS SELECT * FROM half")
        cons.append(con)
    kept = []
    # then with frequent conditions skipped (b and c: a quarter of the rows each): only a's intervals
    for skip in (None, (0.2, 0)):
        replies = [answer_batch(con, rounds.requests, skip) for con in cons]
        found = rounds.sets([[r[i] for r in replies] for i in range(len(rounds.requests))])
        assert found.rows == data.num_rows and all(s is not None for s in found.sets)
        assert len(found.skipped) == (0 if skip is None else 2), found.skipped
        request, blobs = rounds.pull(found, numbered.column_names)
        rows = pa.concat_tables([ShardService(con, 1 << 26).answer(request, blobs) for con in cons])
        kept.append(rows.sort_by("rid").drop_columns(["rid"]).cast(data.schema))
    assert 0 < kept[0].num_rows < kept[1].num_rows < data.num_rows // 2, [t.num_rows for t in kept]
    results = []
    for table in (data, *kept):
        con = _duck(table)
        try:
            results.append(matchrec.run_many(con, GROUP).tables)
        finally:
            con.close()
    for sql, want, got, got_skipping in zip(GROUP, *results):
        assert want.num_rows and _rows(want) == _rows(got) == _rows(got_skipping), sql


TABLE_WORKLOAD = [
    "PATTERN SEQ(a x, b y) FROM ev WITHIN 5 RETURN COUNT(*)",
    "PATTERN SEQ(a x, ~d n, c y) FROM ev WHERE y.v > 20 WITHIN 5 RETURN x.ts, y.ts",
    "PATTERN SEQ(a x, c y) FROM ev PARTITION BY k WITHIN 5 RETURN COUNT(*)",
    # join filters: a consumer's candidates need a source's value before them, a source's a consumer's after
    "PATTERN SEQ(a x, b y, c z) FROM ev PARTITION BY k WHERE x.g = z.g WITHIN 6 RETURN x.ts, z.ts",
    "PATTERN SEQ(d x, ~a n, b y) FROM ev WHERE x.g = y.g AND y.v > 10 WITHIN 7 RETURN COUNT(*)",
]


def test_table_rounds_keep_every_row_a_match_needs():
    """run_many's one job of rounds for a whole table without Spark: random statements, partitioned
    (shared shuffles) and not (each matched alone), every group's requests in one batch answered by
    each of two halves of the rows, a request several groups make asked once, the join filters
    applied on the driver; each group's final pull keeps every row its statements' matches need,
    and fewer rows than the table."""
    import duckdb

    from matchrec.connectors.shard import ShardService
    from matchrec.connectors.spark_filtering import TABLE, GroupRounds, TableRounds, answer_batch
    from matchrec.planner.cer_intervals import interval_plan
    from matchrec.spark_cer import analyze, shuffle_groups
    for seed, skip in ((31, None), (32, (0.2, 0))):
        rng = random.Random(seed)
        data = events(n=900, keys=4, seed=seed)
        workload = TABLE_WORKLOAD + [random_statement(rng) for _ in range(3)]
        analyses = {i: analyze(sql, data.schema, []) for i, sql in enumerate(workload)}
        groups = {g: idx for g, idx in shuffle_groups(list(analyses), analyses).items()
                  if all(interval_plan(analyses[i].plan)[0] is not None for i in idx)}
        assert ("", 0) in groups and ("", 1) in groups, workload
        rounds = TableRounds.of([GroupRounds.of([interval_plan(analyses[i].plan)[0] for i in idx])
                                 for idx in groups.values()])
        # statements 1 and 2 ask a's candidates with one window: once for both
        assert len(rounds.requests) < sum(len(g.requests) for g in rounds.groups), workload
        numbered = data.append_column("rid", pa.array(range(data.num_rows), pa.int64()))
        cons = []
        for half in (numbered.slice(0, 450), numbered.slice(450)):
            con = duckdb.connect()
            con.register("half", half)
            con.execute(f"CREATE TABLE {TABLE} AS SELECT * FROM half")
            cons.append(con)
        replies = [answer_batch(con, rounds.requests, skip) for con in cons]
        found = rounds.sets([[r[i] for r in replies] for i in range(len(rounds.requests))])
        assert skip is not None or sum(got.joined_out for got in found) > 0  # (skipping: every type is frequent)
        full = _duck(data)
        try:
            for g, idx, got in zip(rounds.groups, groups.values(), found):
                assert got.rows == data.num_rows
                if any(s is None for s in got.sets):  # every element condition skipped: no filtering
                    continue
                request, blobs = g.pull(got, numbered.column_names)
                rows = pa.concat_tables([ShardService(con, 1 << 26).answer(request, blobs) for con in cons])
                kept = rows.sort_by("rid").drop_columns(["rid"]).cast(data.schema)
                assert kept.num_rows < data.num_rows, workload
                con = _duck(kept)
                try:
                    for i in idx:
                        want = full.execute(workload[i]).fetch_arrow_table()
                        assert _rows(want) == _rows(con.execute(workload[i]).fetch_arrow_table()), workload[i]
                finally:
                    con.close()
        finally:
            full.close()
            for con in cons:
                con.close()


@pytest.mark.slow
def test_run_many_shares_one_set_of_rounds(spark):
    """A group of statements with shared element conditions: one job finds every statement's time
    interval set; fewer Spark jobs than each statement's own rounds, the same rows as DuckDB."""
    from matchrec.connectors.spark_filtering import GROUP_ROUNDS
    from matchrec.connectors.spark_metrics import ShuffleMeter
    data = events(n=300, seed=8)
    spark.createDataFrame(data).createOrReplaceTempView("ev")
    workload = [
        "PATTERN SEQ(a x, b y) FROM ev PARTITION BY k WHERE x.v >= 45 WITHIN 4 RETURN x.ts, y.ts",
        "PATTERN SEQ(b x, a y, c z) FROM ev PARTITION BY k WHERE y.v >= 45 WITHIN 6 RETURN COUNT(*)",
    ]
    want = _duck_many(data, workload)
    jobs, lines = {}, {}
    try:
        for rounds in ("each", "shared"):
            spark.conf.set(GROUP_ROUNDS, rounds)
            meter = ShuffleMeter(spark)
            got = ms.run_many(spark, workload, interval_filter="on")
            for sql, w, g in zip(workload, want, got):
                assert rows_match(_rows(w), g.collect()), (rounds, sql)
            jobs[rounds] = meter.delta().jobs
            lines[rounds] = "\n".join(line for r in ms.last_runs() for line in r.lines)
            ms.release()
    finally:
        spark.conf.unset(GROUP_ROUNDS)
    assert "shared rounds: 1 Spark job" in lines["shared"], lines["shared"]
    assert "shared rounds" not in lines["each"], lines["each"]
    assert 0 < jobs["shared"] < jobs["each"], jobs


def test_errors_point_into_the_statement(spark):
    spark.createDataFrame(events(n=20)).createOrReplaceTempView("ev")
    with pytest.raises(matchrec.ProgrammingError) as info:
        ms.sql(spark, "PATTERN SEQ(a x, b y) FROM ev\nWHERE x.nope = 1 RETURN COUNT(*)")
    assert "nope is not a column" in str(info.value) and "Line 2, Col 7" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError) as info:
        ms.sql(spark, "PATTERN SEQ(a x b y) FROM ev")
    assert "Line 1, Col 17" in str(info.value)
    with pytest.raises(matchrec.ProgrammingError, match="Spark cannot read nosuch"):
        ms.run_many(spark, ["PATTERN SEQ(a x, b y) FROM nosuch RETURN COUNT(*)"])


@pytest.mark.slow
def test_explain_analyze_reports_the_filtering(spark):
    spark.createDataFrame(events(n=800, seed=6)).createOrReplaceTempView("ev")
    lines = [r[0] for r in ms.sql(spark, "EXPLAIN ANALYZE PATTERN SEQ(a x, b y) FROM ev PARTITION BY k WITHIN 5 "
                                         "RETURN x.ts, y.ts", interval_filter="on").collect()]
    text = "\n".join(lines)
    assert lines[0].startswith("CER statement #1 on Spark: partitioned"), text
    assert "interval filtering: used" in text and "without interval filtering:" in text, text
    plain = [r[0] for r in ms.sql(spark, "EXPLAIN PATTERN SEQ(a x, b y) FROM ev WITHIN 5").collect()]
    assert plain[0].startswith("CER statement #1 on Spark: time split"), plain
