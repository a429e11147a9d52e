-- pgTAP: the events_since_v2 resume cursor. notify_user / notify_room write an
-- event row and NOTIFY; inside this rolled-back transaction the rows vanish and
-- no NOTIFY is ever delivered (PostgreSQL sends notifications at COMMIT only).
-- Two things do outlive the rollback, as with any aborted publisher: the event
-- ids taken from switchboard.event_id_seq and event_tick_seq (gaps). No lock:
-- publishers never wait for each other (V0009).
--
-- Ticks: event_tick() refuses a transaction that already wrote, so the tick
-- here is written by hand, with a snapshot that sees this transaction as
-- committed (xmin = xmax = our xid + 1): what a reader sees once a tick taken
-- after our COMMIT exists.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(79);

SELECT switchboard.create_user('pgtap.a' || txid_current(), '$2b$12$abcdefghijklmnopqrstuv') AS a \gset
SELECT switchboard.create_user('pgtap.b' || txid_current(), '$2b$12$abcdefghijklmnopqrstuv') AS b \gset
SELECT 'pgtap-room-' || txid_current() AS room \gset
SELECT ok(switchboard.add_room_member(:'room', :'a'), 'a joins the room');

SELECT switchboard.notify_user(:'a', 'first', '{"n": 1}') AS e1 \gset
SELECT switchboard.notify_user(:'a', 'second', '{"n": 2}') AS e2 \gset
SELECT switchboard.notify_room(:'room', 'to-room', '{"n": 3}') AS e3 \gset
SELECT switchboard.notify_user(:'b', 'for-b') AS e4 \gset

SELECT ok(:e1 < :e2 AND :e2 < :e3 AND :e3 < :e4, 'event ids increase');

-- The ordering objects (V0009).
SELECT has_column('switchboard', 'events', 'xid', 'events record the inserting transaction');
SELECT col_type_is('switchboard', 'events', 'xid', 'xid8', 'as xid8 (no wraparound)');
SELECT col_default_is('switchboard', 'events', 'xid', 'pg_current_xact_id()', 'stamped by default');
SELECT has_index('switchboard', 'events', 'events_xid', 'candidates are found by xid');
SELECT has_table('switchboard', 'event_ticks', 'ticks are stored');
SELECT has_table('switchboard', 'event_ticker', 'the ticker row');
SELECT is((SELECT count(*) FROM switchboard.event_ticker), 1::bigint, 'the ticker has its one row');
SELECT table_privs_are('switchboard', 'event_ticker', 'switchboard_app', ARRAY[]::text[],
                       'switchboard_app cannot lock the ticker row itself');
SELECT table_privs_are('switchboard', 'event_ticks', 'switchboard_app', ARRAY[]::text[],
                       'nor write ticks');
SELECT function_privs_are('switchboard', 'event_tick', ARRAY[]::text[], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'events_since_v2',
                          ARRAY['uuid', 'bigint', 'bigint', 'text[]', 'bigint', 'integer'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', '_events_after',
                          ARRAY['uuid', 'text[]', 'bigint', 'bigint', 'bigint', 'integer'],
                          'switchboard_app', ARRAY[]::text[], 'the unfiltered reader is internal');
SELECT throws_ok('SELECT switchboard.event_tick()', '25001', NULL,
                 'event_tick() refuses a transaction that already wrote');

SELECT format('%1$s:%1$s:', pg_current_xact_id()::text::bigint + 1) AS snap \gset
INSERT INTO switchboard.event_ticks (tick, snap, snap_xmax)
SELECT nextval('switchboard.event_tick_seq'), :'snap'::pg_snapshot, pg_snapshot_xmax(:'snap'::pg_snapshot)
RETURNING tick AS k1 \gset
SELECT results_eq(format('SELECT tick, id, event FROM switchboard.events_since_v2(%L, %s, 0, ARRAY[%L])',
                         :'a', :k1 - 1, :'room'),
                  format('VALUES (%s::bigint, %s::bigint, %L), (%s, %s, %L), (%s, %s, %L)',
                         :k1, :e1, 'first', :k1, :e2, 'second', :k1, :e3, 'to-room'),
                  'events_since_v2: the batch of the tick that made them visible, by id');
SELECT results_eq(format('SELECT id FROM switchboard.events_since_v2(%L, %s, %s, ARRAY[%L])',
                         :'a', :k1, :e1, :'room'),
                  format('VALUES (%s::bigint), (%s)', :e2, :e3), 'a mid-batch position excludes what was seen');
SELECT is_empty(format('SELECT id FROM switchboard.events_since_v2(%L, %s, 9223372036854775807, ARRAY[%L])',
                       :'a', :k1, :'room'), 'the whole batch seen: nothing after it');
SELECT is((SELECT switchboard.event_batch(:e2)), :k1::bigint, 'event_batch: a bare id''s batch');
SELECT is((SELECT last_tick FROM switchboard.event_window()), :k1::bigint, 'event_window: the newest tick');
SELECT results_eq(format('SELECT tick, id, ephemeral FROM switchboard.relay_read_v2(%s, %s, ''{}'', 2)',
                         :k1, :e1),
                  format('VALUES (%s::bigint, %s::bigint, false), (%s, %s, false)', :k1, :e2, :k1, :e3),
                  'relay_read_v2: every event after the position, max_rows of them');
SELECT results_eq(format('SELECT id FROM switchboard.events_since_v2(%L, %s, 0)', :'a', :k1 - 1),
                  format('VALUES (%s::bigint), (%s)', :e1, :e2), 'without rooms: only its own events');
SELECT results_eq(format('SELECT id FROM switchboard.events_since_v2(%L, %s, 0, ARRAY[%L], NULL, 1)',
                         :'a', :k1 - 1, :'room'),
                  format('VALUES (%s::bigint)', :e1), 'max_rows pages the read');
SELECT is_empty(format('SELECT id FROM switchboard.events_since_v2(%L, %s, 0, ARRAY[%L])', :'b', :k1 - 1, :'room')
                || format(' WHERE id <> %s', :e4),
                'b, not a member, gets none of the room''s events');
SELECT throws_ok(format('SELECT * FROM switchboard.events_since_v2(%L, -1, 0)', :'a'), '22023');
SELECT throws_ok(format('SELECT * FROM switchboard.events_since_v2(%L, 0, 0, ''{}'', NULL, 0)', :'a'), '22023');
SELECT throws_ok('SELECT * FROM switchboard.relay_read_v2(0, 0, ''{}'', 0)', '22023');
-- relay_read_v3 (V0021): the window first, then the same rows, in one snapshot.
SELECT results_eq(format('SELECT kind, tick, id FROM switchboard.relay_read_v3(%s, %s, ''{}'', 2)', :k1, :e1),
                  format('VALUES (''window'', (SELECT reaped_tick FROM switchboard.event_horizon), '
                         '(SELECT reaped_through FROM switchboard.event_horizon)), '
                         '(''event'', %s::bigint, %s::bigint), (''event'', %s, %s)', :k1, :e2, :k1, :e3),
                  'relay_read_v3: the retained window, then every event after the position');
SELECT results_eq(format('SELECT kind FROM switchboard.relay_read_v3(%s, 9223372036854775807)', :k1),
                  $$VALUES ('window'::text)$$, 'relay_read_v3: the window row even when nothing is new');
SELECT throws_ok('SELECT * FROM switchboard.relay_read_v3(0, 0, ''{}'', 0)', '22023');
SELECT throws_ok('SELECT * FROM switchboard.relay_read_v3(0, 0, array_fill(1::bigint, ARRAY[10001]))', '22023');
SELECT is(switchboard.reap_events('1 hour'), 0, 'reap_events keeps what became visible within keep');

-- _events_unticked (V0014): event_tick's "anything not covered by the last tick?",
-- answered from events_xid. Our events are covered by a snapshot that sees this
-- transaction as committed, not by one taken before it began or while it ran.
SELECT function_privs_are('switchboard', '_events_unticked', ARRAY['pg_snapshot'], 'switchboard_app',
                          ARRAY[]::text[], '_events_unticked is internal');
SELECT ok((SELECT p.proconfig FROM pg_proc p
             WHERE p.oid = 'switchboard._events_after(uuid, text[], bigint, bigint, bigint, integer)'::regprocedure)
           @> ARRAY['plan_cache_mode=force_generic_plan'],
          '_events_after keeps its generic plans (no re-planning on every relay read)');
SELECT ok((SELECT p.proconfig FROM pg_proc p
             WHERE p.oid = 'switchboard._events_after(uuid, text[], bigint, bigint, bigint, integer)'::regprocedure)
           @> ARRAY['jit=off'],
          '_events_after is never JIT-compiled (its estimate grows with the retained events, not with a wake-up''s rows)');
SELECT is(switchboard._events_unticked(:'snap'::pg_snapshot), false,
          '_events_unticked: nothing beyond a snapshot that sees every event as committed');
SELECT is(switchboard._events_unticked(format('%1$s:%1$s:', pg_current_xact_id())::pg_snapshot), true,
          '_events_unticked: events at or above the snapshot''s xmax are not covered');
SELECT is(switchboard._events_unticked(format('%1$s:%2$s:%1$s', pg_current_xact_id(),
                                              pg_current_xact_id()::text::bigint + 1)::pg_snapshot), true,
          '_events_unticked: events of a transaction in the snapshot''s xip are not covered');

-- relay_ephemeral_missed (V0019): after a LISTEN reconnect, the ephemeral ids created
-- within the lookback, newest first, bounded; the rows are then read by relay_read_v2.
INSERT INTO switchboard.ephemeral_events (room, event, created_at)
VALUES (:'room', 'typing', clock_timestamp() - interval '20 seconds') RETURNING id AS eph_old \gset
INSERT INTO switchboard.ephemeral_events (user_id, event) VALUES (:'a', 'tool.call.x') RETURNING id AS eph1 \gset
INSERT INTO switchboard.ephemeral_events (room, event) VALUES (:'room', 'typing') RETURNING id AS eph2 \gset
SELECT results_eq(format('SELECT id FROM switchboard.relay_ephemeral_missed(''10 seconds'') '
                         'WHERE id IN (%s, %s, %s)', :eph_old, :eph1, :eph2),
                  format('VALUES (%s::bigint), (%s)', :eph2, :eph1),
                  'relay_ephemeral_missed: what was created within the lookback, newest first');
SELECT ok(:eph_old IN (SELECT id FROM switchboard.relay_ephemeral_missed('25 seconds')),
          'relay_ephemeral_missed: a longer lookback reaches the older one');
SELECT is((SELECT count(*) FROM switchboard.relay_ephemeral_missed('30 seconds', 1)), 1::bigint,
          'relay_ephemeral_missed: at most max_rows');
SELECT throws_ok('SELECT * FROM switchboard.relay_ephemeral_missed(''31 seconds'')', '22023');
SELECT throws_ok('SELECT * FROM switchboard.relay_ephemeral_missed(''-1 second'')', '22023');
SELECT throws_ok('SELECT * FROM switchboard.relay_ephemeral_missed(NULL)', '22023');
SELECT throws_ok('SELECT * FROM switchboard.relay_ephemeral_missed(''1 second'', 0)', '22023');
SELECT throws_ok('SELECT * FROM switchboard.relay_ephemeral_missed(''1 second'', 10001)', '22023');
SELECT function_privs_are('switchboard', 'relay_ephemeral_missed', ARRAY['interval', 'integer'], 'switchboard_app',
                          ARRAY['EXECUTE']);

-- The verified live path (V0020): off by default; the owner switches it; the pads are
-- RFC 2104's; the app role reads the key, nobody else; enabling by hand needs the pads.
SELECT is((SELECT enabled FROM switchboard.event_live), false, 'event_live: off by default');
SELECT is((SELECT (key, channel) IS NULL FROM switchboard.relay_live_key()), true,
          'relay_live_key: key and channel NULL while the live path is off');
SELECT throws_ok('UPDATE switchboard.event_live SET enabled = true', '23514', NULL,
                 'event_live: enabling by hand without the HMAC pads is refused');
SELECT is((SELECT enabled FROM switchboard.event_live_path(true, 500)), true, 'event_live_path: on');
SELECT is((SELECT octet_length(key) FROM switchboard.relay_live_key()), 32, 'relay_live_key: the 32-byte key once on');
-- V0025: the channel is named after the key, and moves with it.
SELECT is((SELECT channel FROM switchboard.relay_live_key()),
          (SELECT 'switchboard_live_' || left(encode(sha256('switchboard-live-channel:'::bytea || key), 'hex'), 32)
             FROM switchboard.event_live),
          'relay_live_key: the channel is switchboard_live_ and 32 hex digits of sha256 of the key');
CREATE TEMP TABLE live_before AS SELECT channel FROM switchboard.event_live;
SELECT is((SELECT key_created_at IS NOT NULL FROM switchboard.event_live_path(true, rotate_key => true)), true,
          'event_live_path: rotate_key');
SELECT isnt((SELECT channel FROM switchboard.event_live), (SELECT channel FROM live_before),
            'event_live: a new key, a new channel');
SELECT throws_ok('UPDATE switchboard.event_live SET channel = ''switchboard_live''', '428C9', NULL,
                 'event_live: the channel cannot be set by hand (generated from the key)');
SELECT throws_ok('SELECT switchboard.relay_live_listen(''switchboard_events'')', '22023', NULL,
                 'relay_live_listen: live channel names only');
SELECT lives_ok('SELECT switchboard.relay_live_listen((SELECT channel FROM switchboard.event_live))',
                'relay_live_listen: LISTENs on a live channel');
SELECT function_privs_are('switchboard', 'relay_live_listen', ARRAY['text', 'boolean'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT is((SELECT ipad = (switchboard._live_pads(key)).ipad AND opad = (switchboard._live_pads(key)).opad
             AND get_byte(ipad, 63) = 54 AND get_byte(opad, 63) = 92 FROM switchboard.event_live), true,
          'event_live: the key zero-padded to 64 bytes, XOR 0x36 / 0x5c');
SELECT throws_ok('SELECT * FROM switchboard.event_live_path(true, 7901)', '22023');
SELECT throws_ok('SELECT * FROM switchboard.event_live_path(NULL)', '22004');
SELECT function_privs_are('switchboard', 'relay_live_key', ARRAY[]::text[], 'switchboard_app', ARRAY['EXECUTE']);
SELECT is((SELECT id_hints FROM switchboard.event_live_path(true)), true,
          'event_live_path: {"id"} hints stay on by default (previous-release relays need them)');
SELECT is((SELECT id_hints FROM switchboard.event_live_path(true, send_id_hints => false)), false,
          'event_live_path: send_id_hints => false stops them');
SELECT is((SELECT id_hints FROM switchboard.event_live_path(true, 600)), false,
          'event_live_path: send_id_hints NULL leaves the setting as it was');
SELECT function_privs_are('switchboard', 'event_live_path', ARRAY['boolean', 'integer', 'boolean', 'boolean'],
                          'switchboard_app', ARRAY[]::text[]);

-- The publish path's CPU (V0023): _event_ok is the inlined form of _check_event's rules,
-- true exactly when _check_event accepts; labels and room names stay 1 to 128 characters;
-- an unknown user is P0002 and takes no event id.
CREATE FUNCTION pg_temp.check_refuses(e text, p jsonb, m integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM switchboard._check_event(e, p, m);
    RETURN false;
EXCEPTION WHEN sqlstate '22023' THEN
    RETURN true;
END
$$;
SELECT is((SELECT count(*) FROM (VALUES (NULL::text), (''), ('a'), ('_'), ('.a'), (':a'), ('-a'), ('9'),
                                        ('a.b:c-d_e'), ('A9_.'), (repeat('a', 128)), (repeat('a', 129)),
                                        ('_' || repeat('-', 127)), ('a b'), ('é'), ('aé'), ('a' || chr(10)),
                                        (chr(10) || 'a'), ('a$'), ('a^'), ('a/b'), ('a*'), ('[a]')) l(e)
            CROSS JOIN (VALUES (NULL::jsonb), ('{}'), ('[]'), ('null'), ('"x"'), ('{"n": 1}'),
                               ((repeat('[', 64) || '1' || repeat(']', 64))::jsonb),
                               ((repeat('[', 65) || '1' || repeat(']', 65))::jsonb),
                               ((repeat('{"a":', 65) || '1' || repeat('}', 65))::jsonb)) p(p)
            CROSS JOIN (VALUES (2), (7), (8), (1048576)) m(m)
           WHERE coalesce(switchboard._event_ok(l.e, p.p, m.m), false) = pg_temp.check_refuses(l.e, p.p, m.m)),
          0::bigint, '_event_ok is true exactly when _check_event accepts (labels, payload NULL/size/depth)');
SELECT ok((SELECT l.lanname = 'sql'
             FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE p.oid = 'switchboard._event_ok(text, jsonb, integer)'::regprocedure)
          AND (SELECT p.proconfig IS NULL AND NOT p.prosecdef AND NOT p.proisstrict FROM pg_proc p
                WHERE p.oid = 'switchboard._event_ok(text, jsonb, integer)'::regprocedure),
          '_event_ok stays inlinable: LANGUAGE sql, no SET clause, not SECURITY DEFINER, not STRICT');
SELECT function_privs_are('switchboard', '_event_ok', ARRAY['text', 'jsonb', 'integer'], 'switchboard_app',
                          ARRAY[]::text[], '_event_ok is internal');
SELECT lives_ok(format('SELECT switchboard.notify_user(%L, %L)', :'a', repeat('x', 128)),
                'notify_user: a 128-character label');
SELECT throws_ok(format('SELECT switchboard.notify_user(%L, %L)', :'a', repeat('x', 129)), '22023',
                 format('invalid event label "%s"', repeat('x', 129)), 'notify_user: a 129-character label is 22023');
SELECT lives_ok(format('SELECT switchboard.notify_room(%L, %L)', repeat('r', 128), 'e'),
                'notify_room: a 128-character room name');
SELECT throws_ok(format('SELECT switchboard.notify_room(%L, %L)', repeat('r', 129), 'e'), '22023',
                 format('invalid room name "%s"', repeat('r', 129)), 'notify_room: a 129-character room name is 22023');
SELECT throws_ok($$SELECT switchboard.notify_room('_r', 'e')$$, '22023', NULL,
                 'notify_room: a room name starts with a letter or digit');
SELECT nextval('switchboard.event_id_seq') AS seq_before \gset
SELECT throws_ok('SELECT switchboard.notify_user(''00000000-0000-0000-0000-000000000000'', ''e'')', 'P0002',
                 'user 00000000-0000-0000-0000-000000000000 does not exist', 'notify_user: an unknown user is P0002');
SELECT throws_ok('SELECT switchboard.notify_user(NULL, ''e'')', 'P0002', 'user <NULL> does not exist',
                 'notify_user: a NULL user is P0002');
SELECT throws_ok(format('SELECT switchboard.notify_user(%L, ''bad label!'')', '00000000-0000-0000-0000-000000000000'),
                 '22023', NULL, 'notify_user: the event is checked before the user (as before V0023)');
SELECT is(nextval('switchboard.event_id_seq'), :seq_before::bigint + 1, 'an unknown user takes no event id');

SELECT * FROM finish();
ROLLBACK;
