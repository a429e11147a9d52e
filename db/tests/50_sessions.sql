-- pgTAP: login sessions (V0011, db/functions/62_sessions.sql) -- rotation,
-- reuse detection, expiry, tickets bound to sessions, and the user changes
-- that end every session. One transaction, rolled back: no row stays, and no
-- announcement is ever delivered.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(52);

-- The API: signatures, privileges, comments.
SELECT has_function('switchboard', 'start_session', ARRAY['uuid', 'interval']);
SELECT has_function('switchboard', 'refresh_session', ARRAY['text', 'interval', 'interval']);
SELECT has_function('switchboard', 'end_session', ARRAY['uuid', 'text']);
SELECT has_function('switchboard', 'end_session_by_refresh', ARRAY['text']);
SELECT has_function('switchboard', 'session_states', ARRAY['uuid[]']);
SELECT has_function('switchboard', 'issue_ticket_v2', ARRAY['uuid', 'uuid', 'interval']);
SELECT has_function('switchboard', 'consume_ticket_v2', ARRAY['text']);
SELECT has_function('switchboard', 'auth_snapshot_v3', ARRAY['interval']);
SELECT has_function('switchboard', 'reap_sessions', ARRAY['interval']);
SELECT function_privs_are('switchboard', 'start_session', ARRAY['uuid', 'interval'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'refresh_session', ARRAY['text', 'interval', 'interval'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'end_session', ARRAY['uuid', 'text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'consume_ticket_v2', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'start_session', ARRAY['uuid', 'interval'], 'switchboard_job', ARRAY[]::text[]);
SELECT is((SELECT count(*) FROM unnest(ARRAY[
            'switchboard.start_session(uuid,interval)', 'switchboard.refresh_session(text,interval,interval)',
            'switchboard.end_session(uuid,text)', 'switchboard.end_session_by_refresh(text)',
            'switchboard.session_states(uuid[])', 'switchboard.issue_ticket_v2(uuid,uuid,interval)',
            'switchboard.consume_ticket_v2(text)', 'switchboard.auth_snapshot_v3(interval)',
            'switchboard.reap_sessions(interval)']::regprocedure[]) f
           WHERE obj_description(f, 'pg_proc') IS NULL), 0::bigint, 'every new public function has a COMMENT');
SELECT table_privs_are('switchboard', 'refresh_tokens', 'switchboard_app', ARRAY[]::text[],
                       'the app role reads refresh tokens only through the functions');

-- Start: 256 random bits, only the hash stored.
SELECT switchboard.create_user('pgtap.s' || txid_current(), '$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA') AS uid \gset
SELECT session_id AS sid, refresh_token AS rt1 FROM switchboard.start_session(:'uid', '1 day') \gset
SELECT matches(:'rt1'::text, '^[0-9a-f]{64}$', 'a refresh token is 256 bits of hex');
SELECT is((SELECT count(*) FROM switchboard.refresh_tokens WHERE hash = sha256(decode(:'rt1', 'hex'))), 1::bigint,
          'only the SHA-256 of the refresh token is stored');
SELECT throws_ok($$SELECT * FROM switchboard.start_session('00000000-0000-0000-0000-000000000000', '1 day')$$, 'P0002');
SELECT throws_ok(format('SELECT * FROM switchboard.start_session(%L, %L)', :'uid', '0 seconds'), '22023');

-- Rotation: single use, same session.
SELECT outcome AS o2, session_id AS sid2, new_refresh_token AS rt2
  FROM switchboard.refresh_session(:'rt1', '1 day', '10 seconds') \gset
SELECT is(:'o2'::text, 'rotated', 'a live token rotates');
SELECT is(:'sid2'::uuid, :'sid'::uuid, 'rotation keeps the session');
SELECT isnt(:'rt2'::text, :'rt1'::text, 'rotation issues a new token');
SELECT is((SELECT outcome FROM switchboard.refresh_session(:'rt1', '1 day', '10 seconds')), 'concurrent',
          'the used token within the race window: concurrent, nothing revoked');
SELECT is((SELECT ended_at FROM switchboard.sessions WHERE id = :'sid'), NULL, '... the session lives on');
SELECT is((SELECT outcome FROM switchboard.refresh_session(repeat('0', 64), '1 day')), 'unknown', 'an unknown token');
SELECT is((SELECT outcome FROM switchboard.refresh_session('garbage', '1 day')), 'unknown',
          'a malformed token is unknown, not an error');

-- Tickets are bound to the session.
SELECT switchboard.issue_ticket_v2(:'uid', :'sid') AS t1 \gset
SELECT switchboard.issue_ticket_v2(:'uid', :'sid') AS t2 \gset
SELECT results_eq(format('SELECT user_id, session_id FROM switchboard.consume_ticket_v2(%L)', :'t1'),
                  format('VALUES (%L::uuid, %L::uuid)', :'uid', :'sid'), 'a ticket carries its session');

-- Reuse after the window: the whole family ends.
SELECT is((SELECT outcome FROM switchboard.refresh_session(:'rt1', '1 day', '0 seconds')), 'reused',
          'a used token after the window: reuse detected');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'sid'), 'reuse', 'the family ended (reuse)');
SELECT is((SELECT outcome FROM switchboard.refresh_session(:'rt2', '1 day')), 'ended',
          'the newest token of the family is dead too');
SELECT is((SELECT count(*) FROM switchboard.consume_ticket_v2(:'t2')), 0::bigint,
          'a ticket minted under the ended session opens nothing');
SELECT throws_ok(format('SELECT switchboard.issue_ticket_v2(%L, %L)', :'uid', :'sid'), '28000');
SELECT is((SELECT live FROM switchboard.session_states(ARRAY[:'sid'::uuid])), false, 'session_states: not live');
SELECT ok(EXISTS (SELECT 1 FROM switchboard.auth_snapshot_v3() WHERE kind = 'session' AND id = :'sid'),
          'auth_snapshot_v3 lists the ended session');

-- Logout, by id and by refresh token.
SELECT session_id AS sid3, refresh_token AS rt3 FROM switchboard.start_session(:'uid', '1 day') \gset
SELECT is(switchboard.end_session(:'sid3'), true, 'end_session ends a live session');
SELECT is(switchboard.end_session(:'sid3'), false, '... once');
SELECT throws_ok(format('SELECT switchboard.end_session(%L, %L)', :'sid3', 'reuse'), '22023');
SELECT session_id AS sid4, refresh_token AS rt4 FROM switchboard.start_session(:'uid', '1 day') \gset
SELECT is(switchboard.end_session_by_refresh(:'rt4'), :'sid4'::uuid, 'logout by refresh token');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'sid4'), 'logout', '... reason logout');

-- Expiry: refresh finds it expired and ends it.
SELECT session_id AS sid5, refresh_token AS rt5 FROM switchboard.start_session(:'uid', '1 day') \gset
UPDATE switchboard.sessions SET expires_at = now() - interval '1 second' WHERE id = :'sid5';
SELECT is((SELECT live FROM switchboard.session_states(ARRAY[:'sid5'::uuid])), false, 'an expired session is not live');
SELECT is((SELECT outcome FROM switchboard.refresh_session(:'rt5', '1 day')), 'ended', 'an expired session does not refresh');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'sid5'), 'expired', '... and is ended (expired)');

-- User changes end every session of the user.
SELECT session_id AS sp FROM switchboard.start_session(:'uid', '1 day') \gset
SELECT switchboard.set_user_password_hash(:'uid', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$b3RoZXI');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'sp'), 'password', 'a password change ends sessions');
SELECT session_id AS sr FROM switchboard.start_session(:'uid', '1 day') \gset
SELECT switchboard.set_user_role(:'uid', 'member');
SELECT is((SELECT ended_at FROM switchboard.sessions WHERE id = :'sr'), NULL, 'the same role again ends nothing');
SELECT switchboard.set_user_role(:'uid', 'admin');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'sr'), 'role', 'a role change ends sessions');
SELECT session_id AS sd FROM switchboard.start_session(:'uid', '1 day') \gset
SELECT switchboard.disable_user(:'uid');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'sd'), 'disabled', 'disable_user ends sessions');
SELECT throws_ok(format('SELECT * FROM switchboard.start_session(%L, %L)', :'uid', '1 day'), '28000');

-- Bounds and reaping.
SELECT throws_ok($$SELECT * FROM switchboard.session_states(array_fill('00000000-0000-0000-0000-000000000000'::uuid, ARRAY[10001]))$$,
                 '22023');
SELECT is((SELECT count(*) FROM switchboard.session_states(ARRAY['00000000-0000-0000-0000-000000000000'::uuid])),
          0::bigint, 'an unknown session: no row');
UPDATE switchboard.sessions SET ended_at = now() - interval '2 days' WHERE id = :'sid';
SELECT ok(switchboard.reap_sessions() >= 1, 'reap_sessions deletes sessions ended long ago');
SELECT is((SELECT count(*) FROM switchboard.refresh_tokens WHERE session_id = :'sid'), 0::bigint,
          '... with their refresh tokens');

SELECT * FROM finish();
ROLLBACK;
