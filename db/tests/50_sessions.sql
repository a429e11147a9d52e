-- pgTAP: login sessions (V0011, V0027, db/functions/62_sessions.sql) -- rotation,
-- reuse detection, expiry, tickets bound to sessions, the user changes
-- that end every session, the rows kept per session, the absolute lifetime, the
-- grace for a lost response and the per-session refresh limit. One transaction, rolled back: no row stays, and no
-- announcement is ever delivered.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(85);

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
SELECT has_function('switchboard', 'start_session_v2', ARRAY['uuid', 'interval', 'interval']);
SELECT has_function('switchboard', 'refresh_session_v2',
                    ARRAY['text', 'interval', 'interval', 'bytea', 'double precision', 'integer']);
SELECT function_privs_are('switchboard', 'start_session_v2', ARRAY['uuid', 'interval', 'interval'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'refresh_session_v2',
                          ARRAY['text', 'interval', 'interval', 'bytea', 'double precision', 'integer'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT col_not_null('switchboard', 'sessions', 'max_expires_at', 'every session has an absolute expiry');
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
            'switchboard.reap_sessions(interval)', 'switchboard.start_session_v2(uuid,interval,interval)',
            'switchboard.refresh_session_v2(text,interval,interval,bytea,double precision,integer)']::regprocedure[]) f
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

-- V0027: the absolute lifetime.
SELECT switchboard.create_user('pgtap.b' || txid_current(), '$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA') AS u2 \gset
SELECT throws_ok(format('SELECT * FROM switchboard.start_session_v2(%L, %L, %L)', :'u2', '2 days', '1 day'), '22023',
                 NULL, 'an absolute lifetime shorter than the idle one is refused');
SELECT throws_ok(format('SELECT * FROM switchboard.start_session_v2(%L, %L, NULL)', :'u2', '1 day'), '22023');
SELECT session_id AS m1, refresh_token AS mt1, max_expires_at AS mmax
  FROM switchboard.start_session_v2(:'u2', '1 hour', '2 hours') \gset
SELECT is(:'mmax'::timestamptz, now() + interval '2 hours', 'max_expires_at = now() + max_lifetime');
SELECT is((SELECT expires_at FROM switchboard.refresh_session_v2(:'mt1', '1 day')), now() + interval '2 hours',
          'a refresh never moves the expiry past max_expires_at');
SELECT session_id AS m2 FROM switchboard.start_session(:'u2', '1 day') \gset
SELECT is((SELECT max_expires_at - created_at FROM switchboard.sessions WHERE id = :'m2'), interval '30 days',
          'the previous release''s start_session: 30 days absolute');
SELECT session_id AS m3, refresh_token AS mt3 FROM switchboard.start_session_v2(:'u2', '1 hour', '2 hours') \gset
UPDATE switchboard.sessions SET expires_at = now() - interval '1 second', max_expires_at = now() - interval '1 second'
 WHERE id = :'m3';
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'mt3', '1 day')), 'ended',
          'past max_expires_at a refresh ends the session');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'m3'), 'expired', '... as expired');

-- V0027: at most 8 rows per session; an older spent token is unknown, not reuse.
CREATE TEMP TABLE chain (i integer PRIMARY KEY, sid uuid, tok text);
CREATE TEMP TABLE who AS SELECT :'u2'::uuid AS uid;
DO $$
DECLARE
    v_sid uuid;
    v_tok text;
BEGIN
    SELECT s.session_id, s.refresh_token INTO v_sid, v_tok
      FROM switchboard.start_session_v2((SELECT uid FROM who), '1 day', '2 days') s;
    FOR i IN 0..20 LOOP
        INSERT INTO chain VALUES (i, v_sid, v_tok);
        SELECT r.new_refresh_token INTO v_tok FROM switchboard.refresh_session_v2(v_tok, '1 day', '60 seconds',
                                                                                  sha256('fp-a'::bytea)) r;
    END LOOP;
    INSERT INTO chain VALUES (21, v_sid, v_tok);
END
$$;
SELECT is((SELECT count(*) FROM switchboard.refresh_tokens WHERE session_id = (SELECT sid FROM chain WHERE i = 0)),
          8::bigint, '21 rotations leave 8 rows');
SELECT is((SELECT count(*) FROM switchboard.refresh_tokens
            WHERE session_id = (SELECT sid FROM chain WHERE i = 0) AND used_at IS NULL), 1::bigint,
          '... one of them unused');
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2((SELECT tok FROM chain WHERE i = 5), '1 day')),
          'unknown', 'a token older than 8 rotations is unknown');
SELECT is((SELECT ended_at FROM switchboard.sessions WHERE id = (SELECT sid FROM chain WHERE i = 0)), NULL,
          '... and revokes nothing');
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2((SELECT tok FROM chain WHERE i = 17), '1 day', '60 seconds',
                                                               sha256('fp-a'::bytea))),
          'reused', 'a kept spent token whose successor was used: reuse, even from the same client');

-- V0027: a lost response. The same client gets the same successor; nobody else does.
SELECT session_id AS g1, refresh_token AS ga FROM switchboard.start_session_v2(:'u2', '1 day', '2 days') \gset
SELECT new_refresh_token AS gb FROM switchboard.refresh_session_v2(:'ga', '1 day', '60 seconds', sha256('fp-a'::bytea)) \gset
SELECT results_eq(format($$SELECT outcome, new_refresh_token FROM switchboard.refresh_session_v2(%L, '1 day', '60 seconds', sha256('fp-a'::bytea))$$, :'ga'),
                  format('VALUES (%L, %L)', 'resent', :'gb'), 'the same client within the grace: the same successor');
SELECT is((SELECT count(*) FROM switchboard.refresh_tokens WHERE session_id = :'g1'), 2::bigint,
          '... and no new row');
SELECT is((SELECT count(*) FROM switchboard.refresh_tokens WHERE session_id = :'g1'
              AND hash = sha256(decode(:'gb', 'hex')) AND used_at IS NULL), 1::bigint, '... which is the live one');
SELECT is((SELECT outcome FROM switchboard.refresh_session(:'ga', '1 day', '10 seconds')), 'concurrent',
          'the previous release''s call (no fingerprint): concurrent, as before');
SELECT new_refresh_token AS gc FROM switchboard.refresh_session_v2(:'gb', '1 day', '60 seconds', sha256('fp-a'::bytea)) \gset
SELECT is((SELECT successor_seed FROM switchboard.refresh_tokens WHERE hash = sha256(decode(:'ga', 'hex'))), NULL,
          'the seed goes once the successor is used');
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'ga', '1 day', '60 seconds', sha256('fp-a'::bytea))),
          'reused', 'a replay after the successor was used ends the session');
SELECT session_id AS g2, refresh_token AS ha FROM switchboard.start_session_v2(:'u2', '1 day', '2 days') \gset
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'ha', '1 day', '60 seconds', sha256('fp-a'::bytea))),
          'rotated', 'rotated by client a');
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'ha', '1 day', '60 seconds', sha256('fp-b'::bytea))),
          'reused', 'a replay from another client within the grace ends the session');
SELECT is((SELECT end_reason FROM switchboard.sessions WHERE id = :'g2'), 'reuse', '... as reuse');
SELECT refresh_token AS ia FROM switchboard.start_session_v2(:'u2', '1 day', '2 days') \gset
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'ia', '1 day', '0 seconds', sha256('fp-a'::bytea))),
          'rotated', 'rotated with no grace');
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'ia', '1 day', '0 seconds', sha256('fp-a'::bytea))),
          'reused', 'with no grace any replay ends the session');

-- V0027: the per-session limit; a denied refresh changes nothing.
SELECT refresh_token AS la FROM switchboard.start_session_v2(:'u2', '1 day', '2 days') \gset
SELECT new_refresh_token AS lb FROM switchboard.refresh_session_v2(:'la', '1 day', '60 seconds', sha256('fp-a'::bytea), 0.001, 1) \gset
SELECT ok((SELECT outcome = 'limited' AND retry_after_ms > 0
             FROM switchboard.refresh_session_v2(:'lb', '1 day', '60 seconds', sha256('fp-a'::bytea), 0.001, 1)),
          'the second refresh of a burst-1 session is limited, with a retry_after_ms');
SELECT is((SELECT outcome FROM switchboard.refresh_session_v2(:'lb', '1 day', '60 seconds', sha256('fp-a'::bytea))),
          'rotated', '... and its token was not spent');
SELECT throws_ok($$SELECT * FROM switchboard.refresh_session_v2(repeat('0', 64), '1 day', '-1 second')$$, '22023',
                 NULL, 'a negative grace is refused');
SELECT throws_ok($$SELECT * FROM switchboard.refresh_session_v2(repeat('0', 64), '1 day', '1 minute', '\x0102'::bytea)$$,
                 '22023', NULL, 'a fingerprint that is not 32 bytes is refused');
SELECT throws_ok($$SELECT * FROM switchboard.refresh_session_v2(repeat('0', 64), '1 day', '1 minute', NULL, 1.0, NULL)$$,
                 '22023', NULL, 'a rate without a burst is refused');

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
