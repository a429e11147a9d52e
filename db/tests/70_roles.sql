-- pgTAP: the least-privilege roles (db/functions/95_roles.sql). Each role may run
-- its functions and read its views; a sample of what it must not do is checked
-- too (tests/test_roles.py compares each role's whole privilege set). Nothing is
-- written.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(43);

SELECT has_role(r) FROM unnest(ARRAY['switchboard_publisher', 'switchboard_reader', 'switchboard_operator']) r;
SELECT ok(NOT rolcanlogin AND NOT rolsuper AND NOT rolcreaterole AND NOT rolcreatedb,
          rolname || ' is NOLOGIN and holds no attribute')
  FROM pg_catalog.pg_roles
 WHERE rolname IN ('switchboard_publisher', 'switchboard_reader', 'switchboard_operator') ORDER BY rolname;
SELECT schema_privs_are('switchboard', r, ARRAY['USAGE'], r || ' may use the schema (and create nothing in it)')
  FROM unnest(ARRAY['switchboard_publisher', 'switchboard_reader', 'switchboard_operator']) r;
SELECT is_member_of('switchboard_reader', 'switchboard_operator', 'an operator sees what it acts on');

-- publisher: notify, enqueue, a stream's producer side
SELECT function_privs_are('switchboard', f, a, 'switchboard_publisher', ARRAY['EXECUTE'])
  FROM (VALUES ('notify_user', ARRAY['uuid', 'text', 'jsonb']), ('notify_room', ARRAY['text', 'text', 'jsonb']),
               ('enqueue', ARRAY['text', 'jsonb', 'timestamp with time zone', 'text', 'integer', 'integer', 'text']),
               ('stream_open', ARRAY['uuid', 'text', 'jsonb', 'text', 'interval', 'interval']),
               ('stream_append', ARRAY['uuid', 'text[]']), ('stream_renew', ARRAY['uuid[]']),
               ('stream_close', ARRAY['uuid', 'text', 'jsonb'])) v(f, a);
SELECT function_privs_are('switchboard', f, a, 'switchboard_publisher', ARRAY[]::text[],
                          'switchboard_publisher may not run ' || f)
  FROM (VALUES ('claim_due_tasks', ARRAY['text', 'interval', 'integer']),
               ('issue_ticket_v2', ARRAY['uuid', 'uuid', 'interval']),
               ('events_since_v2', ARRAY['uuid', 'bigint', 'bigint', 'text[]', 'bigint', 'integer']),
               ('cancel_run', ARRAY['bigint']), ('stream_read', ARRAY['uuid', 'integer', 'integer', 'uuid'])) v(f, a);
SELECT table_privs_are('switchboard', 'events', 'switchboard_publisher', ARRAY[]::text[],
                       'switchboard_publisher reads no event');

-- reader: status and the dashboards' views
SELECT function_privs_are('switchboard', f, a, 'switchboard_reader', ARRAY['EXECUTE'])
  FROM (VALUES ('status', ARRAY[]::text[]), ('metrics_snapshot', ARRAY[]::text[]),
               ('partition_health', ARRAY[]::text[]),
               ('event_window', ARRAY[]::text[]), ('known_handlers', ARRAY['text']),
               ('list_runs', ARRAY['text', 'text', 'text', 'timestamp with time zone', 'integer', 'bigint'])) v(f, a);
SELECT table_privs_are('switchboard', v, 'switchboard_reader', ARRAY['SELECT'])
  FROM unnest(ARRAY['runs', 'handlers', 'replicas', 'partitions']) v;
SELECT function_privs_are('switchboard', 'cancel_run', ARRAY['bigint'], 'switchboard_reader', ARRAY[]::text[],
                          'switchboard_reader may not cancel a run');
SELECT table_privs_are('switchboard', 'users', 'switchboard_reader', ARRAY[]::text[],
                       'switchboard_reader reads no user');

-- operator: retry, cancel, pause, resume, stop a stream
SELECT function_privs_are('switchboard', f, a, 'switchboard_operator', ARRAY['EXECUTE'])
  FROM (VALUES ('retry_run', ARRAY['bigint']), ('cancel_run', ARRAY['bigint']),
               ('pause_handler', ARRAY['text']), ('resume_handler', ARRAY['text']),
               ('stream_stop', ARRAY['uuid', 'uuid']),
               ('retry_runs', ARRAY['text', 'text', 'text', 'timestamp with time zone', 'integer']),
               ('cancel_runs', ARRAY['text', 'text', 'text', 'timestamp with time zone', 'integer'])) v(f, a);
SELECT function_privs_are('switchboard', 'enqueue', ARRAY['text', 'jsonb', 'timestamp with time zone', 'text', 'integer', 'integer', 'text'],
                          'switchboard_operator', ARRAY[]::text[], 'switchboard_operator may not enqueue');

SELECT * FROM finish();
ROLLBACK;
