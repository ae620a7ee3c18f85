{{ config(tags=['fraud']) }}
-- Impossible travel: a purchase abroad, then a large cash withdrawal at home within an hour.
PATTERN SEQ(FOREIGN f, ATM a)
FROM {{ ref('transactions') }} TYPE kind PARTITION BY card_id ORDER BY ts
USE skip-till-next-match
WHERE a.country = 'home' AND a.amount >= 200
WITHIN 1 hour
RETURN f.card_id AS card_id, f.country AS foreign_country, f.ts AS foreign_ts, a.ts AS atm_ts,
       a.amount AS atm_amount
