{{ config(materialized='parquet', tags=['marts', 'export']) }}
-- Per card with alerts: how many, of how many kinds, and its spend; exported as Parquet.
SELECT a.card_id,
       count(*) AS alerts,
       count(DISTINCT a.alert) AS alert_kinds,
       max(a.ts) AS last_alert_ts,
       any_value(s.transactions) AS transactions,
       any_value(s.spend) AS spend
FROM {{ ref('fraud_alerts') }} a
JOIN (SELECT card_id, count(*) AS transactions, round(sum(amount), 2) AS spend
      FROM {{ ref('transactions') }} GROUP BY card_id) s USING (card_id)
GROUP BY a.card_id
ORDER BY alerts DESC, a.card_id
