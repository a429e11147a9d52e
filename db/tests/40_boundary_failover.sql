-- pgTAP: what V0002..V0007 added -- the trust boundary (the relay's read,
-- now relay_read_v3, user_states, revoked_among, token_epoch; the event_order
-- lock table it added is dropped by V0014), tool calls, the handler registry (known_handlers, the
-- handlers view, live_window), failover awareness (db_instance), bad task
-- rows (tasks.last_error, status()'s tasks_broken) and metrics_snapshot.
-- Everything happens inside one transaction that is rolled back: no row
-- stays (users, replicas, presence, tool calls, events, the unlogged_epoch
-- row db_instance writes), and no NOTIFY of notify_room / _announce /
-- _publish_ephemeral is ever delivered (PostgreSQL sends them at COMMIT only).
-- As in 30_events.sql, taken sequence values are a gap.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(95);

-- Signatures, return types and privileges of the functions added since V0001.
SELECT has_function('switchboard', 'relay_read_v3', ARRAY['bigint', 'bigint', 'bigint[]', 'integer']);
SELECT function_returns('switchboard', 'relay_read_v3', ARRAY['bigint', 'bigint', 'bigint[]', 'integer'], 'setof record');
SELECT function_privs_are('switchboard', 'relay_read_v3', ARRAY['bigint', 'bigint', 'bigint[]', 'integer'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'relay_read_v3', ARRAY['bigint', 'bigint', 'bigint[]', 'integer'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'event_window', ARRAY[]::text[]);
SELECT function_returns('switchboard', 'event_window', ARRAY[]::text[], 'setof record');
SELECT function_privs_are('switchboard', 'event_window', ARRAY[]::text[], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'event_window', ARRAY[]::text[], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'user_states', ARRAY['uuid[]']);
SELECT function_returns('switchboard', 'user_states', ARRAY['uuid[]'], 'setof record');
SELECT function_privs_are('switchboard', 'user_states', ARRAY['uuid[]'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'user_states', ARRAY['uuid[]'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'revoked_among', ARRAY['text[]']);
SELECT function_returns('switchboard', 'revoked_among', ARRAY['text[]'], 'setof record');
SELECT function_privs_are('switchboard', 'revoked_among', ARRAY['text[]'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'revoked_among', ARRAY['text[]'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'is_room_member', ARRAY['text', 'uuid']);
SELECT function_returns('switchboard', 'is_room_member', ARRAY['text', 'uuid'], 'boolean');
SELECT function_privs_are('switchboard', 'is_room_member', ARRAY['text', 'uuid'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'is_room_member', ARRAY['text', 'uuid'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'tool_call_send', ARRAY['uuid', 'text', 'text', 'jsonb', 'interval']);
SELECT function_returns('switchboard', 'tool_call_send', ARRAY['uuid', 'text', 'text', 'jsonb', 'interval'], 'uuid');
SELECT function_privs_are('switchboard', 'tool_call_send', ARRAY['uuid', 'text', 'text', 'jsonb', 'interval'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'tool_call_send', ARRAY['uuid', 'text', 'text', 'jsonb', 'interval'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'tool_call_collect', ARRAY['uuid', 'boolean']);
SELECT function_returns('switchboard', 'tool_call_collect', ARRAY['uuid', 'boolean'], 'setof record');
SELECT function_privs_are('switchboard', 'tool_call_collect', ARRAY['uuid', 'boolean'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'tool_call_collect', ARRAY['uuid', 'boolean'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'login_lookup_v2', ARRAY['text']);
SELECT function_returns('switchboard', 'login_lookup_v2', ARRAY['text'], 'setof record');
SELECT function_privs_are('switchboard', 'login_lookup_v2', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'login_lookup_v2', ARRAY['text'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'auth_snapshot_v2', ARRAY['interval']);
SELECT function_returns('switchboard', 'auth_snapshot_v2', ARRAY['interval'], 'setof record');
SELECT function_privs_are('switchboard', 'auth_snapshot_v2', ARRAY['interval'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'auth_snapshot_v2', ARRAY['interval'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'known_handlers', ARRAY['text']);
SELECT function_returns('switchboard', 'known_handlers', ARRAY['text'], 'setof text');
SELECT function_privs_are('switchboard', 'known_handlers', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'known_handlers', ARRAY['text'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'replica_heartbeat', ARRAY['text', 'jsonb', 'text[]', 'interval', 'text']);
SELECT function_returns('switchboard', 'replica_heartbeat', ARRAY['text', 'jsonb', 'text[]', 'interval', 'text'], 'void');
SELECT function_privs_are('switchboard', 'replica_heartbeat', ARRAY['text', 'jsonb', 'text[]', 'interval', 'text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'replica_heartbeat', ARRAY['text', 'jsonb', 'text[]', 'interval', 'text'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'db_instance', ARRAY[]::text[]);
SELECT function_returns('switchboard', 'db_instance', ARRAY[]::text[], 'setof record');
SELECT function_privs_are('switchboard', 'db_instance', ARRAY[]::text[], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'db_instance', ARRAY[]::text[], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'metrics_snapshot', ARRAY[]::text[]);
SELECT function_returns('switchboard', 'metrics_snapshot', ARRAY[]::text[], 'setof record');
SELECT function_privs_are('switchboard', 'metrics_snapshot', ARRAY[]::text[], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'metrics_snapshot', ARRAY[]::text[], 'switchboard_job', ARRAY[]::text[]);
SELECT is_empty($$
    SELECT s FROM unnest(ARRAY[
        'switchboard.relay_read_v3(bigint, bigint, bigint[], integer)', 'switchboard.event_window()',
        'switchboard.user_states(uuid[])', 'switchboard.revoked_among(text[])',
        'switchboard.is_room_member(text, uuid)', 'switchboard.tool_call_send(uuid, text, text, jsonb, interval)',
        'switchboard.tool_call_collect(uuid, boolean)', 'switchboard.login_lookup_v2(text)',
        'switchboard.auth_snapshot_v2(interval)', 'switchboard.known_handlers(text)',
        'switchboard.replica_heartbeat(text, jsonb, text[], interval, text)', 'switchboard.db_instance()',
        'switchboard.metrics_snapshot()']) s
     WHERE length(coalesce(obj_description(s::regprocedure, 'pg_proc'), '')) < 20
$$, 'each of them has a COMMENT saying what it does');
SELECT hasnt_function('switchboard', '_lock_event_order', ARRAY[]::text[],
                      'the retired event-order lock function is dropped (V0014)');
SELECT function_privs_are('switchboard', '_tasks_broken', ARRAY[]::text[], 'switchboard_app', ARRAY[]::text[]);

-- Tables and views of V0002..V0006.
SELECT hasnt_table('switchboard', 'event_order', 'the retired event-order lock table is dropped (V0014)');
SELECT table_privs_are('switchboard', 'ephemeral_events', 'switchboard_app', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'unlogged_epoch', 'switchboard_app', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'tool_calls', 'switchboard_app', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'handlers', 'switchboard_app', ARRAY['SELECT']);
SELECT has_column('switchboard', 'tasks', 'last_error', 'tasks.last_error exists');
SELECT has_column('switchboard', 'tasks', 'last_error_at', 'tasks.last_error_at exists');
SELECT has_column('switchboard', 'users', 'token_epoch', 'users.token_epoch exists');

-- No other role may take the ticker row: as switchboard_app, locking or reading
-- it is refused, while the SECURITY DEFINER notify_* publish for it (no lock).
-- (Skipped when the running role may not SET ROLE switchboard_app, e.g. a
-- CREATEROLE owner that is not a member of it; the privilege test above stays.)
SELECT pg_has_role('switchboard_app', 'MEMBER') AS can_be_app \gset
\if :can_be_app
SET LOCAL ROLE switchboard_app;
SELECT throws_ok('SELECT 1 FROM switchboard.event_ticker FOR UPDATE', '42501', NULL,
                 'switchboard_app cannot lock the ticker row');
SELECT throws_ok('SELECT publishers_notify FROM switchboard.event_ticker', '42501', NULL,
                 'switchboard_app cannot even read it');
SELECT lives_ok($$SELECT switchboard.notify_room('pgtap-app-room', 'through-definer')$$,
                'notify_room publishes on switchboard_app''s behalf');
RESET ROLE;
\else
SELECT skip('the running role cannot SET ROLE switchboard_app', 3);
\endif

-- notify_room: an empty/unknown room is not an error; a bad name is 22023.
SELECT switchboard.notify_room('pgtap-nobody-' || txid_current(), 'to-nobody', '{"n": 1}') AS e1 \gset
SELECT ok(:e1 > 0, 'notify_room on a room nobody is in returns an event id');
SELECT throws_ok($$SELECT switchboard.notify_room('bad room!', 'e')$$, '22023', 'invalid room name "bad room!"',
                 'a bad room name is 22023 naming it');
SELECT throws_ok($$SELECT switchboard.notify_room(NULL, 'e')$$, '22023', NULL, 'a NULL room is 22023');

-- Rooms, users, token_epoch.
SELECT switchboard.create_user('pgtap.u' || txid_current(), '$2b$12$abcdefghijklmnopqrstuv') AS u \gset
SELECT switchboard.create_user('pgtap.v' || txid_current(), '$2b$12$abcdefghijklmnopqrstuv') AS v \gset
SELECT switchboard.add_room_member('pgtap-room-' || txid_current(), :'u') AS joined \gset
SELECT ok(switchboard.is_room_member('pgtap-room-' || txid_current(), :'u'), 'is_room_member: a member');
SELECT ok(NOT switchboard.is_room_member('pgtap-room-' || txid_current(), :'v'), 'is_room_member: not a member');
SELECT results_eq(format('SELECT role, disabled, token_epoch FROM switchboard.user_states(ARRAY[%L, %L]::uuid[])',
                         :'u', '00000000-0000-0000-0000-000000000000'),
                  $$VALUES ('member'::text, false, 0)$$, 'user_states: a new user at epoch 0, no row for an unknown id');
SELECT switchboard.set_user_role(:'u', 'admin') AS r1 \gset
SELECT is((SELECT token_epoch FROM switchboard.user_states(ARRAY[:'u'::uuid])), 1, 'a role change bumps token_epoch');
SELECT switchboard.set_user_role(:'u', 'admin') AS r2 \gset
SELECT is((SELECT token_epoch FROM switchboard.user_states(ARRAY[:'u'::uuid])), 1,
          'setting the same role again does not');
SELECT switchboard.set_user_password_hash(:'u', '$2b$12$zyxwvutsrqponmlkjihgfe') AS p1 \gset
SELECT is((SELECT token_epoch FROM switchboard.user_states(ARRAY[:'u'::uuid])), 2, 'a password change bumps it');
SELECT switchboard.disable_user(:'u') AS d1 \gset
SELECT results_eq(format('SELECT role, disabled, token_epoch FROM switchboard.login_lookup_v2(%L)', 'pgtap.u' || txid_current()),
                  $$VALUES ('admin'::text, true, 3)$$, 'disable_user bumps it; login_lookup_v2 returns the epoch');
SELECT is((SELECT token_epoch FROM switchboard.auth_snapshot_v2() WHERE kind = 'user' AND user_id = :'u'), 3,
          'auth_snapshot_v2 carries the epoch');
SELECT switchboard.revoke_token('pgtap-jti-' || txid_current(), :'u', now() + interval '1 hour') AS t1 \gset
SELECT switchboard.revoke_token('pgtap-old-' || txid_current(), :'u', now() - interval '1 minute') AS t2 \gset
SELECT results_eq(format('SELECT jti FROM switchboard.revoked_among(ARRAY[%L, %L, %L])', 'pgtap-jti-' || txid_current(),
                         'pgtap-old-' || txid_current(), 'pgtap-never'),
                  format('VALUES (%L)', 'pgtap-jti-' || txid_current()),
                  'revoked_among: only the revoked, unexpired ids');

-- Replicas: live_window, the handler registry, tool calls.
SELECT switchboard.replica_heartbeat('pgtap-r' || txid_current(), '{}', ARRAY['pgtap.handler'], '20 seconds', '9.9.9-pgtap') AS h1 \gset
SELECT switchboard.replica_heartbeat('pgtap-s' || txid_current(), '{}', ARRAY[]::text[], '5 seconds', NULL) AS h2 \gset
SELECT results_eq(format('SELECT live_window FROM switchboard.replicas WHERE id IN (%L, %L) ORDER BY id',
                         'pgtap-r' || txid_current(), 'pgtap-s' || txid_current()),
                  $$VALUES (interval '60 seconds'), (interval '30 seconds')$$,
                  'live_window: three heartbeat intervals, never below 30 s');
SELECT ok('pgtap.handler' IN (SELECT switchboard.known_handlers('9.9.9-pgtap')), 'known_handlers of that version');
SELECT ok('pgtap.handler' NOT IN (SELECT switchboard.known_handlers('0.0.0-none')), 'not of another version');
SELECT results_eq($$SELECT served, live_replicas, versions FROM switchboard.handlers WHERE handler = 'pgtap.handler'$$,
                  $$VALUES (true, 1::bigint, ARRAY['9.9.9-pgtap'])$$, 'the handlers view: served by one live replica');
SELECT is(switchboard.tool_call_send(:'v', 'pgtap-r' || txid_current(), 'echo'), NULL,
          'tool_call_send to a user with no socket: NULL');
SELECT switchboard.presence_set('pgtap-r' || txid_current(), :'v', 1) AS ps \gset
SELECT switchboard.tool_call_send(:'v', 'pgtap-r' || txid_current(), 'echo', '{"x": 1}') AS call \gset
SELECT matches(:'call'::text, '^[0-9a-f-]{36}$', 'with a socket on a live replica it returns a call id');
SELECT is_empty(format('SELECT * FROM switchboard.tool_call_collect(%L)', :'call'), 'nothing to collect before the answer');
SELECT ok(NOT switchboard.tool_call_answer(:'call', :'u', '{"y": 1}'), 'another user cannot answer');
SELECT ok(switchboard.tool_call_answer(:'call', :'v', '{"y": 2}'), 'the callee answers');
SELECT results_eq(format('SELECT answered, result FROM switchboard.tool_call_collect(%L)', :'call'),
                  $$VALUES (true, '{"y": 2}'::jsonb)$$, 'tool_call_collect returns the answer');
SELECT is_empty(format('SELECT * FROM switchboard.tool_call_collect(%L)', :'call'), '... once');
SELECT throws_ok(format('SELECT switchboard.tool_call_send(%L, %L, %L, %L, %L)', :'v', 'r', 'echo', '{}', '11 minutes'),
                 '22023', NULL, 'a tool call timeout over 10 minutes is 22023');

-- Bad task rows, status(), failover awareness, metrics.
SELECT switchboard.create_task('pgtap.broken', '@hourly', 'noop') IS NOT NULL AS created \gset
SELECT (SELECT value FROM switchboard.status() WHERE item = 'tasks_broken') AS broken0 \gset
UPDATE switchboard.tasks SET last_error = 'pgtap', last_error_at = now() WHERE name = 'pgtap.broken';
SELECT is((SELECT value FROM switchboard.status() WHERE item = 'tasks_broken'), (:broken0 + 1)::bigint,
          'status() counts a task with last_error as tasks_broken');
SELECT results_eq('SELECT in_recovery, timeline >= 1, unlogged_since IS NOT NULL FROM switchboard.db_instance()',
                  $$VALUES (false, true, true)$$, 'db_instance: a primary, its timeline and unlogged_since');
SELECT is((SELECT unlogged_since FROM switchboard.db_instance()), (SELECT since FROM switchboard.unlogged_epoch),
          'db_instance records unlogged_since in the UNLOGGED marker row');
SELECT results_eq('SELECT item FROM switchboard.metrics_snapshot() ORDER BY item',
                  $$VALUES ('event_backlog_seconds'), ('event_partitions_ahead'), ('events_default_rows'),
                           ('expired_leases'), ('live_replicas'), ('runs_due'),
                           ('runs_due_age_seconds'), ('runs_history_default'), ('runs_partitions_ahead')$$,
                  'metrics_snapshot: the nine gauges');
SELECT cmp_ok((SELECT value FROM switchboard.metrics_snapshot() WHERE item = 'live_replicas'), '>=', 2::double precision,
              'metrics_snapshot counts the live replicas');

SELECT * FROM finish();
ROLLBACK;
