-- pgTAP: WebSocket tickets are single use; the rate limiter's burst and
-- retry_after. A throwaway user and bucket inside a rolled-back transaction:
-- no row stays, and create_user's NOTIFY is never sent.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(17);

SELECT switchboard.create_user('pgtap.' || txid_current(), '$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA') AS uid \gset
SELECT switchboard.issue_ticket_v2(:'uid', NULL) AS ticket \gset
SELECT matches(:'ticket'::text, '^[0-9a-f]{32}$', 'a ticket is 128 bits of hex');
SELECT is((SELECT count(*) FROM switchboard.tickets WHERE hash = sha256(decode(:'ticket', 'hex'))), 1::bigint,
          'only the SHA-256 of the ticket is stored');
SELECT is((SELECT user_id FROM switchboard.consume_ticket_v2(:'ticket')), :'uid'::uuid, 'the first use returns the user');
SELECT is_empty(format('SELECT * FROM switchboard.consume_ticket_v2(%L)', :'ticket'),
                'the second use returns no row: single use');
SELECT is((SELECT user_id FROM switchboard.consume_ticket_v2(upper(switchboard.issue_ticket_v2(:'uid', NULL)))),
          :'uid'::uuid, 'a ticket is case-insensitive hex');
SELECT is_empty($$SELECT * FROM switchboard.consume_ticket_v2('not-a-ticket')$$,
                'a malformed ticket is no row, not an error');
SELECT throws_ok($$SELECT switchboard.issue_ticket_v2('00000000-0000-0000-0000-000000000000', NULL)$$, 'P0002');
SELECT throws_ok(format('SELECT switchboard.issue_ticket_v2(%L, NULL, %L)', :'uid', '2 hours'), '22023');

-- GCRA: now() is fixed inside a transaction, so every call below happens at
-- the same instant: exactly `burst` requests pass, then retry_after is exact.
SELECT results_eq($$SELECT allowed, remaining, retry_after_ms FROM switchboard.rate_check('pgtap:' || txid_current(), 1, 3)$$,
                  $$VALUES (true, 2, 0)$$, 'first request of burst 3: allowed, 2 left');
SELECT results_eq($$SELECT allowed, remaining, retry_after_ms FROM switchboard.rate_check('pgtap:' || txid_current(), 1, 3)$$,
                  $$VALUES (true, 1, 0)$$, 'second: allowed, 1 left');
SELECT results_eq($$SELECT allowed, remaining, retry_after_ms FROM switchboard.rate_check('pgtap:' || txid_current(), 1, 3)$$,
                  $$VALUES (true, 0, 0)$$, 'third: allowed, none left');
SELECT results_eq($$SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM switchboard.rate_check('pgtap:' || txid_current(), 1, 3)$$,
                  $$VALUES (false, 0, 1000, 3000)$$,
                  'fourth: denied, retry after exactly 1 s at 1/s, full again after 3 s');
SELECT results_eq($$SELECT allowed, retry_after_ms FROM switchboard.rate_check('pgtap:' || txid_current(), 1, 3)$$,
                  $$VALUES (false, 1000)$$, 'a denied request consumed nothing');
SELECT results_eq($$SELECT allowed, retry_after_ms FROM switchboard.rate_check('pgtap:' || txid_current(), 1, 3, 3)$$,
                  $$VALUES (false, 3000)$$, 'a request costing the whole burst waits for a full bucket');
SELECT ok(switchboard.rate_reset('pgtap:' || txid_current()), 'rate_reset empties the bucket');
SELECT throws_ok($$SELECT * FROM switchboard.rate_check('pgtap:x', 1, 0)$$, '22023', 'invalid burst 0');
SELECT throws_ok($$SELECT * FROM switchboard.rate_check('pgtap:x', 1, 3, 4)$$, '22023', 'invalid cost 4 for burst 3');

SELECT * FROM finish();
ROLLBACK;
