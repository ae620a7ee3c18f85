{{ config(materialized='table', tags=['staging']) }}
-- Seven days of card transactions for 300 cards, with two fraud scenarios mixed in.
-- The rows come from hash() rather than random(): every run, on any number of threads,
-- generates the same data, so the project runs end to end on an empty database.
WITH normal AS (
    SELECT i AS txn_id,
           (1 + hash(i, 'card') % 300)::INTEGER AS card_id,
           TIMESTAMP '2024-03-04 00:00:00' + to_seconds((i * 15 + hash(i, 'jitter') % 15)::BIGINT) AS ts,
           round(2 + exp(6.5 * (hash(i, 'amount') % 1000000) / 1e6), 2) AS amount,
           CASE WHEN hash(i, 'channel') % 100 < 55 THEN 'pos'
                WHEN hash(i, 'channel') % 100 < 90 THEN 'online'
                ELSE 'atm' END AS channel,
           CASE WHEN hash(i, 'country') % 100 < 3 THEN ['FR', 'BR', 'TH'][(1 + hash(i, 'where') % 3)::BIGINT]
                ELSE 'home' END AS country
    FROM range(40000) t(i)
),
-- Card testing: three tiny online purchases a minute apart, then a large one.
card_testing AS (
    SELECT 1000000 + c * 10 + k AS txn_id,
           c::INTEGER AS card_id,
           TIMESTAMP '2024-03-06 02:00:00' + to_minutes((c * 7 + k + (k = 3)::INTEGER)::BIGINT) AS ts,
           CASE WHEN k < 3 THEN 0.5 + k * 0.45 ELSE 950.0 + c END AS amount,
           'online' AS channel,
           'home' AS country
    FROM range(5, 301, 37) cards(c), range(4) steps(k)
),
-- A purchase abroad, then a cash withdrawal at home twenty minutes later.
impossible_travel AS (
    SELECT 2000000 + c * 10 + k AS txn_id,
           c::INTEGER AS card_id,
           TIMESTAMP '2024-03-08 10:00:00' + to_minutes((c * 3 + 20 * k)::BIGINT) AS ts,
           CASE WHEN k = 0 THEN 80.0 ELSE 400.0 END AS amount,
           CASE WHEN k = 0 THEN 'pos' ELSE 'atm' END AS channel,
           CASE WHEN k = 0 THEN 'BR' ELSE 'home' END AS country
    FROM range(7, 301, 41) cards(c), range(2) steps(k)
)
SELECT * FROM normal
UNION ALL SELECT * FROM card_testing
UNION ALL SELECT * FROM impossible_travel
ORDER BY ts, txn_id
