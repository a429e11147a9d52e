-- pgTAP: V0015. reap_events(keep, max_rows) deletes one bounded batch per
-- call and moves the horizon to the cut before the cut's events are gone; the
-- bounded maintenance sweep; the tick a call takes when no relay ticks (V0026). Inside a rolled-back transaction (the events are
-- written with an old xid: this transaction's own writes are never visible in
-- a snapshot it takes).
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(14);

SELECT has_function('switchboard', 'reap_events', ARRAY['interval', 'integer']);
SELECT function_privs_are('switchboard', 'reap_events', ARRAY['interval', 'integer'], 'switchboard_app',
                          ARRAY['EXECUTE'], 'the app role may run the bounded reap_events');
SELECT function_privs_are('switchboard', 'maintenance', ARRAY['integer', 'interval', 'interval', 'interval', 'interval'],
                          'switchboard_app', ARRAY['EXECUTE'], 'the app role may run the bounded maintenance sweep');

DELETE FROM switchboard.events;
INSERT INTO switchboard.events (id, room, event, xid)
SELECT 9000000000 + i, 'pgtap-reap', 'x', '3'::xid8 FROM generate_series(1, 5) i;
INSERT INTO switchboard.event_ticks (tick, snap, snap_xmax, created_at)
SELECT coalesce(max(tick), 0) + 1000, pg_current_snapshot(), pg_snapshot_xmax(pg_current_snapshot()),
       now() - interval '1 hour'
  FROM switchboard.event_ticks;

SELECT is(switchboard.reap_events('5 minutes', 2), 2, 'reap_events deletes at most max_rows');
SELECT is((SELECT first_tick FROM switchboard.event_window()), (SELECT max(tick) FROM switchboard.event_ticks),
          'the window starts after the cut from the first batch on');
SELECT is((SELECT reaped_through FROM switchboard.event_window()), 9000000002::bigint,
          'the horizon is the highest id deleted, oldest first');
SELECT is(switchboard.reap_events('5 minutes', 2), 2, '... the next batch');
SELECT is((switchboard.maintenance(max_rows => 2) ->> 'events')::int, 1, 'the bounded sweep takes the rest');
SELECT is((SELECT count(*) FROM switchboard.events WHERE room = 'pgtap-reap'), 0::bigint, 'the cut is gone');
-- V0026: a call ticks itself only when no tick was taken since the previous one,
-- and only as its transaction's first write (this one wrote: it asks nothing).
SELECT has_column('switchboard', 'event_horizon', 'reap_seen_tick', 'the newest tick the last call saw');
SELECT is((SELECT reap_seen_tick FROM switchboard.event_horizon), (SELECT max(tick) FROM switchboard.event_ticks),
          'each call records the newest tick it saw');
SELECT is(switchboard._reap_tick(), NULL, 'no tick in a transaction that already wrote (event_tick would refuse it)');
SELECT throws_ok($$SELECT switchboard.reap_events('5 minutes', 0)$$, '22023', NULL, 'max_rows 0 is refused');
SELECT throws_ok($$SELECT switchboard.maintenance(max_rows => NULL)$$, '22023', NULL, 'a NULL max_rows is refused');

SELECT * FROM finish();
ROLLBACK;
