{{ config(materialized='view', tags=['staging']) }}
-- Each transaction with the event type the pattern models match on.
SELECT txn_id, card_id, ts, amount, channel, country,
       CASE WHEN channel = 'atm' THEN 'ATM'
            WHEN country <> 'home' THEN 'FOREIGN'
            WHEN channel = 'online' AND amount < 2 THEN 'PROBE'
            WHEN amount >= 500 THEN 'LARGE'
            ELSE 'PURCHASE' END AS kind
FROM {{ ref('raw_transactions') }}
