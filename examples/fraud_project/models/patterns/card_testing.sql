{{ config(tags=['fraud']) }}
-- Card testing: three tiny online purchases, then a large one, on one card within 10 minutes.
PATTERN SEQ(PROBE p1, PROBE p2, PROBE p3, LARGE big)
FROM {{ ref('transactions') }} TYPE kind PARTITION BY card_id ORDER BY ts
USE skip-till-next-match
WITHIN 10 minutes
RETURN p1.card_id AS card_id, p1.ts AS first_probe_ts, big.ts AS large_ts, big.amount AS large_amount
