-- pgTAP: the events_since resume cursor. notify_user / notify_room write an
-- event row and NOTIFY; inside this rolled-back transaction the rows vanish and
-- no NOTIFY is ever delivered (PostgreSQL sends notifications at COMMIT only).
-- Two things do outlive the rollback, as with any aborted publisher: the event
-- ids taken from switchboard.event_id_seq (a gap), and, while the transaction
-- runs (milliseconds), the event-order lock, which other publishers wait for.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(10);

SELECT switchboard.create_user('pgtap.a' || txid_current(), '$2b$12$abcdefghijklmnopqrstuv') AS a \gset
SELECT switchboard.create_user('pgtap.b' || txid_current(), '$2b$12$abcdefghijklmnopqrstuv') AS b \gset
SELECT 'pgtap-room-' || txid_current() AS room \gset
SELECT ok(switchboard.add_room_member(:'room', :'a'), 'a joins the room');

SELECT switchboard.notify_user(:'a', 'first', '{"n": 1}') AS e1 \gset
SELECT switchboard.notify_user(:'a', 'second', '{"n": 2}') AS e2 \gset
SELECT switchboard.notify_room(:'room', 'to-room', '{"n": 3}') AS e3 \gset
SELECT switchboard.notify_user(:'b', 'for-b') AS e4 \gset

SELECT ok(:e1 < :e2 AND :e2 < :e3 AND :e3 < :e4, 'event ids increase');
SELECT results_eq(format('SELECT id, event FROM switchboard.events_since(%L, %s, ARRAY[%L])', :'a', :e1 - 1, :'room'),
                  format('VALUES (%s::bigint, %L), (%s, %L), (%s, %L)', :e1, 'first', :e2, 'second', :e3, 'to-room'),
                  'from before the first: its events and its room''s, in id order');
SELECT results_eq(format('SELECT id FROM switchboard.events_since(%L, %s, ARRAY[%L])', :'a', :e1, :'room'),
                  format('VALUES (%s::bigint), (%s)', :e2, :e3), 'the cursor excludes what was seen');
SELECT is_empty(format('SELECT id FROM switchboard.events_since(%L, %s, ARRAY[%L])', :'a', :e3, :'room'),
                'nothing after the newest: the client is up to date');
SELECT results_eq(format('SELECT id FROM switchboard.events_since(%L, %s)', :'a', :e1 - 1),
                  format('VALUES (%s::bigint), (%s)', :e1, :e2), 'without rooms: only its own events');
SELECT results_eq(format('SELECT id FROM switchboard.events_since(%L, %s, ARRAY[%L], 1)', :'a', :e1 - 1, :'room'),
                  format('VALUES (%s::bigint)', :e1), 'max_rows pages the cursor');
SELECT is_empty(format('SELECT id FROM switchboard.events_since(%L, %s, ARRAY[%L])', :'b', :e1 - 1, :'room')
                || format(' WHERE id <> %s', :e4),
                'b, not a member, gets none of the room''s events');
SELECT throws_ok(format('SELECT * FROM switchboard.events_since(%L, -1)', :'a'), '22023');
SELECT throws_ok(format('SELECT * FROM switchboard.events_since(%L, 0, ''{}'', 0)', :'a'), '22023');

SELECT * FROM finish();
ROLLBACK;
