-- pgTAP: pushed presence (V0035, issue 34) -- presence_track, presence_meta_sync
-- and presence_of_rooms: metadata bounded where it is stored, online taken from
-- presence_sockets on a live replica, rows gone with their replica. One
-- transaction, rolled back: no user, replica or presence row stays.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(29);

-- The API, its privileges and the table a DBA reads with \d+.
SELECT has_function('switchboard', 'presence_track', ARRAY['text', 'bigint', 'uuid', 'text', 'jsonb']);
SELECT function_returns('switchboard', 'presence_track', ARRAY['text', 'bigint', 'uuid', 'text', 'jsonb'], 'void');
SELECT function_privs_are('switchboard', 'presence_track', ARRAY['text', 'bigint', 'uuid', 'text', 'jsonb'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'presence_track', ARRAY['text', 'bigint', 'uuid', 'text', 'jsonb'],
                          'switchboard_publisher', ARRAY[]::text[]);
SELECT has_function('switchboard', 'presence_meta_sync', ARRAY['text', 'jsonb']);
SELECT function_privs_are('switchboard', 'presence_meta_sync', ARRAY['text', 'jsonb'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT has_function('switchboard', 'presence_of_rooms', ARRAY['text[]', 'integer']);
SELECT function_returns('switchboard', 'presence_of_rooms', ARRAY['text[]', 'integer'], 'setof record');
SELECT function_privs_are('switchboard', 'presence_of_rooms', ARRAY['text[]', 'integer'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'presence_of_rooms', ARRAY['text[]', 'integer'], 'switchboard_reader', ARRAY[]::text[]);
SELECT has_table('switchboard', 'presence_meta', 'presence metadata is a table');
SELECT is((SELECT relpersistence FROM pg_class WHERE oid = 'switchboard.presence_meta'::regclass), 'u',
          'presence_meta is UNLOGGED, like presence_sockets');
SELECT isnt(obj_description('switchboard.presence_meta'::regclass, 'pg_class'), NULL, 'presence_meta has a COMMENT');
SELECT isnt(obj_description('switchboard.presence_of_rooms(text[], integer)'::regprocedure, 'pg_proc'), NULL,
            'presence_of_rooms has a COMMENT');

-- Two members of a room, one outsider; ann online on a live replica with two tracked connections.
SELECT switchboard.create_user('pgtap_ann', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA', 'member');
SELECT switchboard.create_user('pgtap_ben', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA', 'member');
SELECT switchboard.add_room_member('pgtap_room', id) FROM switchboard.users WHERE username IN ('pgtap_ann', 'pgtap_ben');
SELECT switchboard.replica_heartbeat('pgtap-r1', '{}', '{}', '5 seconds', 'x');
SELECT switchboard.presence_set('pgtap-r1', (SELECT id FROM switchboard.users WHERE username = 'pgtap_ann'), 2);
SELECT switchboard.presence_track('pgtap-r1', 1, (SELECT id FROM switchboard.users WHERE username = 'pgtap_ann'),
                                  'pgtap_room', '{"status": "here"}');
SELECT switchboard.presence_track('pgtap-r1', 2, (SELECT id FROM switchboard.users WHERE username = 'pgtap_ann'),
                                  'pgtap_room', '{"status": "away", "n": 2}');

SELECT results_eq(
    $$SELECT username, metas FROM switchboard.presence_of_rooms(ARRAY['pgtap_room', 'pgtap_none'])$$,
    $$VALUES ('pgtap_ann'::text, '[{"status": "here"}, {"n": 2, "status": "away"}]'::jsonb)$$,
    'only the online member is listed, with the metadata of each tracked connection');
SELECT is((SELECT count(*) FROM switchboard.presence_of_rooms(ARRAY['pgtap_room'], 1))::int, 1, 'max_members bounds a room');

-- Bad metadata: 22023 naming the value, nothing stored.
SELECT throws_ok($$SELECT switchboard.presence_track('pgtap-r1', 3, gen_random_uuid(), 'pgtap_room', '"away"')$$,
                 '22023', 'invalid presence metadata "away": not an object', 'metadata is an object');
SELECT throws_like($$SELECT switchboard.presence_track('pgtap-r1', 3, gen_random_uuid(), 'pgtap_room',
                     '{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9}')$$,
                   '%too large%', 'at most 8 keys');
SELECT throws_like($$SELECT switchboard.presence_track('pgtap-r1', 3, gen_random_uuid(), 'pgtap_room',
                     jsonb_build_object('s', repeat('x', 260)))$$, '%too large%', 'at most 256 bytes');
SELECT lives_ok($$SELECT switchboard.presence_track('pgtap-r1', 3, gen_random_uuid(), 'pgtap_room',
                  jsonb_build_object('s', repeat('x', 240), 'n', 1))$$, '256 bytes of compact JSON fit');
SELECT throws_like($$SELECT switchboard.presence_track('pgtap-r1', 3, gen_random_uuid(), 'pgtap_room', '{"a": [1]}')$$,
                   '%values scalars%', 'no nested values');
SELECT throws_ok($$SELECT * FROM switchboard.presence_of_rooms(array_fill('r'::text, ARRAY[501]))$$,
                 '22023', NULL, 'at most 500 rooms per call');
SELECT throws_ok($$SELECT switchboard.presence_meta_sync('pgtap-r1', '[{"conn": 1, "meta": {}}]')$$,
                 '22023', NULL, 'a synced row names its room and user');

-- Untrack one room of one connection; the heartbeat's sync replaces the replica's rows.
SELECT switchboard.presence_track('pgtap-r1', 2, NULL, 'pgtap_room', NULL);
SELECT is((SELECT count(*) FROM switchboard.presence_meta WHERE replica_id = 'pgtap-r1' AND conn = 2)::int, 0,
          'meta NULL untracks');
SELECT switchboard.presence_meta_sync('pgtap-r1', jsonb_build_array(jsonb_build_object(
    'conn', 7, 'room', 'pgtap_room', 'user_id', (SELECT id FROM switchboard.users WHERE username = 'pgtap_ann'),
    'meta', '{"status": "synced"}'::jsonb)));
SELECT results_eq($$SELECT conn, meta FROM switchboard.presence_meta WHERE replica_id = 'pgtap-r1'$$,
                  $$VALUES (7::bigint, '{"status": "synced"}'::jsonb)$$, 'sync replaces the replica''s rows');
SELECT switchboard.presence_track('pgtap-r1', 7, NULL, NULL, NULL);
SELECT is((SELECT count(*) FROM switchboard.presence_meta WHERE replica_id = 'pgtap-r1')::int, 0,
          'room and meta NULL untrack the connection everywhere');

-- A replica that stops heartbeating: its members are offline, its rows go with it.
SELECT switchboard.presence_track('pgtap-r1', 1, (SELECT id FROM switchboard.users WHERE username = 'pgtap_ann'),
                                  'pgtap_room', '{}');
UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '1 hour' WHERE id = 'pgtap-r1';
SELECT is((SELECT count(*) FROM switchboard.presence_of_rooms(ARRAY['pgtap_room']))::int, 0,
          'nobody is online on a dead replica');
SELECT ok(switchboard.replica_stop('pgtap-r1'), 'the replica stops');
SELECT is((SELECT count(*) FROM switchboard.presence_meta WHERE replica_id = 'pgtap-r1')::int, 0,
          'the rows go with their replica');

SELECT * FROM finish();
ROLLBACK;
