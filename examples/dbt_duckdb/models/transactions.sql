-- Card transactions with an event type (kind) for the pattern; a few card-testing bursts mixed in.
{{ config(materialized='table') }}
WITH normal AS (
    SELECT i AS txn_id,
           (1 + hash(i, 'card') % 50)::INTEGER AS card_id,
           TIMESTAMP '2024-03-04 00:00:00' + to_seconds((i * 60)::BIGINT) AS ts,
           round(2 + exp(6.5 * (hash(i, 'amount') % 1000000) / 1e6), 2) AS amount,
           CASE WHEN hash(i, 'channel') % 100 < 60 THEN 'pos' ELSE 'online' END AS channel
    FROM range(5000) t(i)
),
bursts AS (
    SELECT 1000000 + c * 10 + k AS txn_id, c::INTEGER AS card_id,
           TIMESTAMP '2024-03-05 02:00:00' + to_minutes((c * 7 + k)::BIGINT) AS ts,
           CASE WHEN k < 3 THEN 0.99 ELSE 900.0 END AS amount, 'online' AS channel
    FROM range(3, 51, 9) cards(c), range(4) steps(k)
)
SELECT *, CASE WHEN channel = 'online' AND amount < 2 THEN 'PROBE'
               WHEN amount >= 500 THEN 'LARGE' ELSE 'PURCHASE' END AS kind
FROM (SELECT * FROM normal UNION ALL SELECT * FROM bursts)
