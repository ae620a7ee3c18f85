"""``matchrec demo``: a generated example database and two MATCH_RECOGNIZE queries over it.

The data is synthetic and deterministic for a given seed (numpy's default generator):
``stocks`` holds one geometric random walk of minute prices per ticker, ``crimes`` a
Poisson stream of incidents with skewed type and district frequencies. The demo loads
both into DuckDB (in memory, or a file with ``--db``), runs a V-shape query and a crime
sequence query, and prints each query's SQL, its first rows, its match count and timings.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from typing import TextIO

import matchrec

DEFAULT_ROWS = 200_000
DEFAULT_SEED = 42
PREVIEW_ROWS = 10
START = "2024-01-02T09:30:00"

TICKERS = ["ACME", "BOLT", "CRUX", "DYNE", "EMBR", "FLUX", "GRID", "HALO", "IONX", "JADE",
           "KILN", "LUMA", "MESA", "NOVA", "ONYX", "PIKE", "QUBE", "RIFT", "SOLR", "TERA"]
# Relative frequencies, loosely shaped like a city's incident log: battery and theft are
# common, robbery is rare. They set how many robbery/battery/theft sequences occur.
CRIME_TYPES = {"THEFT": 22, "BATTERY": 18, "CRIMINAL_DAMAGE": 11, "NARCOTICS": 10, "OTHER_OFFENSE": 10,
               "ASSAULT": 8, "DECEPTIVE_PRACTICE": 7, "BURGLARY": 5, "MOTOR_VEHICLE_THEFT": 5, "ROBBERY": 4}
DISTRICTS = 25
MEAN_GAP_SECONDS = 60.0
TICK_VOLATILITY = 0.002  # standard deviation of the log return per minute

VSHAPE_SQL = """\
SELECT *
FROM stocks MATCH_RECOGNIZE (
  PARTITION BY ticker
  ORDER BY ts
  MEASURES FIRST(ts) AS start_ts, LAST(DOWN.ts) AS bottom_ts, LAST(UP.ts) AS end_ts,
           FIRST(price) AS start_price, LAST(DOWN.price) AS bottom_price, LAST(UP.price) AS end_price
  ONE ROW PER MATCH
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (STRT DOWN{3,} UP{3,})
  DEFINE DOWN AS DOWN.price < PREV(DOWN.price),
         UP AS UP.price > PREV(UP.price)
)
ORDER BY ticker, start_ts"""

CRIMES_SQL = """\
SELECT *
FROM crimes MATCH_RECOGNIZE (
  PARTITION BY district
  ORDER BY ts
  MEASURES R.id AS robbery_id, B.id AS battery_id, M.id AS theft_id,
           R.ts AS robbery_ts, M.ts - R.ts AS elapsed
  ONE ROW PER MATCH
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (R {- N* -} B {- N* -} M) WITHIN INTERVAL '30' MINUTE
  DEFINE R AS type = 'ROBBERY',
         B AS type = 'BATTERY' AND B.district = R.district,
         M AS type = 'MOTOR_VEHICLE_THEFT' AND M.district = R.district,
         N AS true
)
ORDER BY robbery_ts"""

QUERIES = [
    ("V-shape", "price falls for 3+ minutes, then rises for 3+ minutes", VSHAPE_SQL),
    ("crime sequence", "robbery, then battery, then motor vehicle theft in one district within 30 minutes, "
                       "other crimes in between skipped", CRIMES_SQL),
]


# ---------------------------------------------------------------- data
def generate(rows: int, seed: int):
    """``{"stocks": Arrow table, "crimes": Arrow table}`` with ``rows`` rows each."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    start = np.datetime64(START, "us")

    # stocks: the rows split evenly over the tickers, one price per minute
    counts = np.full(len(TICKERS), rows // len(TICKERS))
    counts[: rows % len(TICKERS)] += 1
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    minute = np.arange(rows) - np.repeat(offsets, counts)
    walk = np.cumsum(rng.normal(0.0, TICK_VOLATILITY, rows))
    # Restart the cumulative walk at each ticker's first row, from its own opening price.
    base = np.log(rng.uniform(20.0, 500.0, len(TICKERS))) - np.concatenate([[0.0], walk])[offsets]
    price = np.round(np.exp(np.repeat(base, counts) + walk), 2)
    stocks = pa.table({
        "ticker": pa.array(np.repeat(np.array(TICKERS), counts), pa.string()),
        "ts": pa.array(start + minute.astype("timedelta64[m]"), pa.timestamp("us")),
        "price": pa.array(price, pa.float64()),
    })

    # crimes: exponential gaps (a Poisson process), whole seconds
    seconds = np.floor(np.cumsum(rng.exponential(MEAN_GAP_SECONDS, rows))).astype("int64")
    names = np.array(list(CRIME_TYPES))
    weights = np.array(list(CRIME_TYPES.values()), dtype=float)
    # Busy and quiet districts (weights 1/k^0.7 in a random order), as in real cities.
    district_weights = rng.permutation(1.0 / np.arange(1, DISTRICTS + 1) ** 0.7)
    crimes = pa.table({
        "id": pa.array(np.arange(1, rows + 1, dtype=np.int64), pa.int64()),
        "ts": pa.array(start + seconds.astype("timedelta64[s]"), pa.timestamp("us")),
        "type": pa.array(names[rng.choice(len(names), rows, p=weights / weights.sum())], pa.string()),
        "district": pa.array(rng.choice(DISTRICTS, rows, p=district_weights / district_weights.sum()) + 1,
                             pa.int32()),
    })
    return {"stocks": stocks, "crimes": crimes}


SCHEMAS = {
    "stocks": "ticker VARCHAR, ts TIMESTAMP, price DOUBLE",
    "crimes": "id BIGINT, ts TIMESTAMP, type VARCHAR, district INTEGER",
}


def load(con: matchrec.Connection, tables: dict) -> None:
    """Create the demo tables in ``con`` from the Arrow tables of ``generate``."""
    cur = con.cursor()
    for name, table in tables.items():
        staging = f"__matchrec_demo_{name}"
        con.register(staging, table)
        try:
            cur.execute(f"CREATE OR REPLACE TABLE {name} ({SCHEMAS[name]})")
            cur.execute(f"INSERT INTO {name} SELECT * FROM {staging}")
        finally:
            con.unregister(staging)
    cur.close()


def build_database(con: matchrec.Connection, rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> dict:
    """Generate and load both tables; the seconds each step took."""
    started = time.perf_counter()
    tables = generate(rows, seed)
    generated = time.perf_counter()
    load(con, tables)
    return {"generation": generated - started, "load": time.perf_counter() - generated}


# ---------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                        help=f"rows of each table (default {DEFAULT_ROWS:_})")
    parser.add_argument("--db", metavar="PATH", help="write a DuckDB database file instead of using memory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    parser.add_argument("--force", action="store_true", help="overwrite the --db file if it exists")


def _prepare_file(path: str, force: bool) -> str | None:
    """None when ``path`` may be (re)created, else why not."""
    if os.path.isdir(path):
        return f"{path} is a directory"
    if os.path.exists(path) and os.path.getsize(path) > 0 and not force:
        return f"{path} already exists; use --force to overwrite it"
    for stale in (path, path + ".wal"):
        if os.path.exists(stale):
            os.remove(stale)  # DuckDB refuses an empty file and would replay a stale WAL
    return None


def run(args, out: TextIO | None = None) -> int:
    from matchrec.cli import error_text
    from matchrec.render import format_table, terminal_width

    out = out or sys.stdout
    if args.rows < 1:
        print("Error: --rows must be at least 1", file=sys.stderr)
        return 1
    if args.db:
        problem = _prepare_file(args.db, args.force)
        if problem:
            print(f"Error: {problem}", file=sys.stderr)
            return 1
    overall = time.perf_counter()
    con = matchrec.connect(args.db or ":memory:")
    # The parser and the compiled matcher's kernels load (or, on a first run, compile) on a
    # background thread while the data is generated; a query that needs one still building waits.
    matchrec.warm()
    try:
        con.cursor().execute("SET enable_progress_bar = false")  # it would interleave with the tables
        where = args.db or "an in-memory database"
        print(f"Generating {args.rows:,} stock prices ({len(TICKERS)} tickers) and {args.rows:,} crimes "
              f"({DISTRICTS} districts), seed {args.seed}, into {where}", file=out)
        timings = build_database(con, args.rows, args.seed)
        print(f"  generation {timings['generation']:.2f} s, load into DuckDB {timings['load']:.2f} s", file=out)
        for label, about, sql in QUERIES:
            print(f"\n-- {label}: {about}\n{sql};\n", file=out)
            out.flush()
            started = time.perf_counter()
            cur = con.cursor()
            try:
                cur.execute(sql)
                rows = cur.fetchall()
            except matchrec.Error as err:
                print(error_text(str(err)), file=sys.stderr)
                return 1
            timings[label] = time.perf_counter() - started
            names = [d[0] for d in cur.description]
            types = [str(d[1]).lower() for d in cur.description]
            cur.close()
            print(format_table(names, types, rows[:PREVIEW_ROWS], max_width=terminal_width(out)), file=out)
            shown = f", first {PREVIEW_ROWS} shown" if len(rows) > PREVIEW_ROWS else ""
            print(f"{len(rows):,} matches{shown}; the query took {timings[label]:.2f} s", file=out)
        timings["total"] = time.perf_counter() - overall
        print("\nTimings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()), file=out)
        if args.db:
            print(f"Open the database in the shell with: matchrec shell {shlex.quote(args.db)}", file=out)
        return 0
    finally:
        con.close()
