-- pgTAP: Switchboard's SQL API -- signatures, return types, COMMENTs and the
-- privileges of switchboard_app / switchboard_job. Read-only.
--
-- Safe on production: one transaction, rolled back (pgtap itself is created
-- inside it when the database does not have it). Run:
--   pg_prove -d <db> db/tests/
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(78);

SELECT has_schema('switchboard');
SELECT schema_privs_are('switchboard', 'switchboard_app', ARRAY['USAGE'],
                        'switchboard_app may use the schema');
SELECT schema_privs_are('switchboard', 'switchboard_job', ARRAY[]::text[],
                        'switchboard_job has no rights on the schema');

-- Signatures and return types of the documented API.
SELECT has_function('switchboard', 'create_task', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'integer']);
SELECT function_returns('switchboard', 'create_task', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'integer'], 'switchboard.tasks');
SELECT has_function('switchboard', 'update_task', ARRAY['uuid', 'jsonb']);
SELECT function_returns('switchboard', 'update_task', ARRAY['uuid', 'jsonb'], 'switchboard.tasks');
SELECT has_function('switchboard', 'delete_task', ARRAY['uuid']);
SELECT function_returns('switchboard', 'delete_task', ARRAY['uuid'], 'boolean');
SELECT has_function('switchboard', 'create_run_exclusive', ARRAY['uuid', 'text']);
SELECT function_returns('switchboard', 'create_run_exclusive', ARRAY['uuid', 'text'], 'setof switchboard.task_runs');
SELECT has_function('switchboard', 'enqueue', ARRAY['text', 'jsonb', 'timestamp with time zone', 'text', 'integer', 'integer', 'text']);
SELECT function_returns('switchboard', 'enqueue', ARRAY['text', 'jsonb', 'timestamp with time zone', 'text', 'integer', 'integer', 'text'], 'setof switchboard.task_runs');
SELECT has_function('switchboard', 'cron_next', ARRAY['text', 'timestamp with time zone', 'text']);
SELECT function_returns('switchboard', 'cron_next', ARRAY['text', 'timestamp with time zone', 'text'], 'timestamp with time zone');
SELECT has_function('switchboard', 'cron_validate', ARRAY['text', 'text']);
SELECT function_returns('switchboard', 'cron_validate', ARRAY['text', 'text'], 'void');
SELECT has_function('switchboard', 'issue_ticket_v2', ARRAY['uuid', 'uuid', 'interval']);
SELECT function_returns('switchboard', 'issue_ticket_v2', ARRAY['uuid', 'uuid', 'interval'], 'text');
SELECT has_function('switchboard', 'consume_ticket_v2', ARRAY['text']);
SELECT function_returns('switchboard', 'consume_ticket_v2', ARRAY['text'], 'setof record');
SELECT has_function('switchboard', 'rate_check', ARRAY['text', 'double precision', 'integer', 'integer']);
SELECT function_returns('switchboard', 'rate_check', ARRAY['text', 'double precision', 'integer', 'integer'], 'setof record');
SELECT has_function('switchboard', 'notify_user', ARRAY['uuid', 'text', 'jsonb']);
SELECT function_returns('switchboard', 'notify_user', ARRAY['uuid', 'text', 'jsonb'], 'bigint');
SELECT has_function('switchboard', 'notify_room', ARRAY['text', 'text', 'jsonb']);
SELECT function_returns('switchboard', 'notify_room', ARRAY['text', 'text', 'jsonb'], 'bigint');
SELECT has_function('switchboard', 'events_since_v2', ARRAY['uuid', 'bigint', 'bigint', 'text[]', 'bigint', 'integer']);
SELECT function_returns('switchboard', 'events_since_v2', ARRAY['uuid', 'bigint', 'bigint', 'text[]', 'bigint', 'integer'], 'setof record');
SELECT has_function('switchboard', 'create_user', ARRAY['text', 'text', 'text']);
SELECT function_returns('switchboard', 'create_user', ARRAY['text', 'text', 'text'], 'uuid');
SELECT has_function('switchboard', 'run_job_sql', ARRAY['text']);
SELECT function_returns('switchboard', 'run_job_sql', ARRAY['text'], 'jsonb');
SELECT has_function('switchboard', 'status', ARRAY[]::text[]);
SELECT function_returns('switchboard', 'status', ARRAY[]::text[], 'setof record');
SELECT is_definer('switchboard', 'run_job_sql', ARRAY['text'], 'run_job_sql is SECURITY DEFINER');
SELECT function_owner_is('switchboard', 'run_job_sql', ARRAY['text'], 'switchboard_job',
                         'run_job_sql runs as the restricted job role');

-- The 0.1 forms are gone (V0026): no 0.2.0 server calls them, and upgrades go
-- one release at a time.
SELECT hasnt_function('switchboard', 'events_since', ARRAY['uuid', 'bigint', 'text[]', 'integer']);
SELECT hasnt_function('switchboard', 'event_horizon', ARRAY[]::text[]);
SELECT hasnt_function('switchboard', 'event_head', ARRAY[]::text[]);
SELECT hasnt_function('switchboard', 'relay_read', ARRAY['bigint', 'bigint[]', 'integer']);
SELECT hasnt_function('switchboard', '_relay_fetch_event', ARRAY['bigint']);
SELECT hasnt_function('switchboard', 'issue_ticket', ARRAY['uuid', 'interval']);
SELECT hasnt_function('switchboard', 'consume_ticket', ARRAY['text']);
SELECT hasnt_function('switchboard', 'login_lookup', ARRAY['text']);
SELECT hasnt_function('switchboard', 'auth_snapshot', ARRAY['interval']);
SELECT hasnt_function('switchboard', 'tool_call_start', ARRAY['uuid', 'text', 'text', 'jsonb', 'interval']);
SELECT hasnt_function('switchboard', 'tool_call_take', ARRAY['uuid']);
SELECT hasnt_function('switchboard', 'replica_heartbeat', ARRAY['text', 'jsonb']);

-- COMMENTs: every function a user calls (no leading underscore) says what it does.
SELECT is_empty($$
    SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'switchboard'::regnamespace AND p.proname !~ '^_'
       AND coalesce(obj_description(p.oid, 'pg_proc'), '') = ''
$$, 'every public switchboard function has a COMMENT');
SELECT ok(obj_description('switchboard.create_task(text, text, text, jsonb, text, integer)'::regprocedure, 'pg_proc')
          ~ '22023', 'create_task''s COMMENT names its SQLSTATEs');

-- Privileges. PUBLIC executes nothing; the app role what it is granted.
SELECT is_empty($$
    SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'switchboard'::regnamespace
       AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a
                                         WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
$$, 'PUBLIC may execute no switchboard function');
SELECT function_privs_are('switchboard', 'create_task', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'integer'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'notify_user', ARRAY['uuid', 'text', 'jsonb'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'consume_ticket_v2', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'rate_check', ARRAY['text', 'double precision', 'integer', 'integer'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'run_job_sql', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', '_check_timezone', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE'],
                          'switchboard_app may run the zone check cron_validate uses');
SELECT function_privs_are('switchboard', '_publish', ARRAY['uuid', 'text', 'text', 'jsonb'],
                          'switchboard_app', ARRAY[]::text[], 'the app cannot publish around notify_*');
SELECT function_privs_are('switchboard', '_random_128', ARRAY[]::text[], 'switchboard_app', ARRAY[]::text[]);
SELECT function_privs_are('switchboard', 'create_task', ARRAY['text', 'text', 'text', 'jsonb', 'text', 'integer'],
                          'switchboard_job', ARRAY[]::text[]);
SELECT is_empty($$
    SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'switchboard'::regnamespace
       AND p.oid <> 'switchboard.run_job_sql(text)'::regprocedure
       AND has_function_privilege('switchboard_job', p.oid, 'EXECUTE')
$$, 'switchboard_job executes no switchboard function but the one it owns');

SELECT table_privs_are('switchboard', 'tasks', 'switchboard_app', ARRAY['SELECT']);
SELECT table_privs_are('switchboard', 'task_runs', 'switchboard_app', ARRAY['SELECT']);
SELECT table_privs_are('switchboard', 'rooms', 'switchboard_app', ARRAY['SELECT']);
SELECT table_privs_are('switchboard', 'room_members', 'switchboard_app', ARRAY['SELECT']);
SELECT table_privs_are('switchboard', 'users', 'switchboard_app', ARRAY[]::text[],
                       'switchboard_app has no table-wide right on users');
SELECT column_privs_are('switchboard', 'users', 'username', 'switchboard_app', ARRAY['SELECT']);
SELECT column_privs_are('switchboard', 'users', 'password_hash', 'switchboard_app', ARRAY[]::text[],
                        'switchboard_app cannot read password hashes');
SELECT table_privs_are('switchboard', 'events', 'switchboard_app', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'tickets', 'switchboard_app', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'rate_limits', 'switchboard_app', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'revoked_tokens', 'switchboard_app', ARRAY[]::text[]);
SELECT is_empty($$
    SELECT c.oid::regclass::text FROM pg_catalog.pg_class c
     WHERE c.relnamespace = 'switchboard'::regnamespace AND c.relkind IN ('r', 'v', 'S', 'p')
       AND c.relname <> 'schema_version'
       AND has_table_privilege('switchboard_app', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
$$, 'switchboard_app writes no table directly (only through functions)');
SELECT table_privs_are('switchboard', 'tasks', 'switchboard_job', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'users', 'switchboard_job', ARRAY[]::text[]);
SELECT is_empty($$
    SELECT c.oid::regclass::text FROM pg_catalog.pg_class c
     WHERE c.relnamespace = 'switchboard'::regnamespace AND c.relkind IN ('r', 'v', 'S', 'p')
       AND (has_table_privilege('switchboard_job', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
            OR has_any_column_privilege('switchboard_job', c.oid, 'SELECT, INSERT, UPDATE, REFERENCES'))
$$, 'switchboard_job has no right on any switchboard table');
SELECT ok(NOT pg_has_role('switchboard_app', 'switchboard_job', 'MEMBER'),
          'switchboard_app is not a member of switchboard_job (SET ROLE is no boundary)');

SELECT * FROM finish();
ROLLBACK;
