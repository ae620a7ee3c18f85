{{ config(materialized='table', tags=['fraud']) }}
-- Escalating spend: five purchases or more on one card within a day, each over 1.5 times the one before.
SELECT *
FROM {{ ref('transactions') }} MATCH_RECOGNIZE (
    PARTITION BY card_id
    ORDER BY ts
    MEASURES FIRST(ts) AS start_ts, LAST(ts) AS end_ts,
             FIRST(amount) AS start_amount, LAST(amount) AS end_amount, COUNT(UP.*) AS steps
    ONE ROW PER MATCH
    AFTER MATCH SKIP PAST LAST ROW
    PATTERN (START UP{4,}) WITHIN INTERVAL '1' DAY
    DEFINE UP AS UP.amount > 1.5 * PREV(UP.amount)
)
