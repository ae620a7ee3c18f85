{{ config(materialized='table', tags=['marts']) }}
-- Every alert of the three pattern models, one row each.
SELECT card_id, 'card_testing' AS alert, large_ts AS ts, large_amount AS amount
FROM {{ ref('card_testing') }}
UNION ALL
SELECT card_id, 'atm_after_foreign', atm_ts, atm_amount
FROM {{ ref('atm_after_foreign') }}
UNION ALL
SELECT card_id, 'spend_spike', end_ts, end_amount
FROM {{ ref('spend_spikes') }}
ORDER BY ts, card_id, alert
