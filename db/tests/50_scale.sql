-- pgTAP: V0013. presence_sync replaces one replica's rows set-based; the
-- reapers delete one bounded batch per call. Inside a rolled-back transaction.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(12);

SELECT has_function('switchboard', 'reap_runs', ARRAY['interval', 'integer']);
SELECT has_function('switchboard', 'reap_rate_limits', ARRAY['interval', 'integer']);
SELECT function_privs_are('switchboard', 'reap_runs', ARRAY['interval', 'integer'], 'switchboard_app',
                          ARRAY['EXECUTE'], 'the app role may run the bounded reap_runs');

SELECT switchboard.presence_sync('pgtap-r', ARRAY['00000000-0000-0000-0000-00000000000a',
                                                  '00000000-0000-0000-0000-00000000000b']::uuid[], ARRAY[1, 2]);
SELECT switchboard.presence_sync('pgtap-r', ARRAY['00000000-0000-0000-0000-00000000000b',
                                                  '00000000-0000-0000-0000-00000000000c']::uuid[], ARRAY[3, 1]);
SELECT results_eq($$SELECT user_id::text, sockets FROM switchboard.presence_sockets
                     WHERE replica_id = 'pgtap-r' ORDER BY 1$$,
                  $$VALUES ('00000000-0000-0000-0000-00000000000b', 3), ('00000000-0000-0000-0000-00000000000c', 1)$$,
                  'presence_sync replaces the replica''s rows: gone user deleted, count changed, new user added');
SELECT switchboard.presence_sync('pgtap-r', ARRAY['00000000-0000-0000-0000-00000000000b']::uuid[], ARRAY[0]);
SELECT is((SELECT count(*) FROM switchboard.presence_sockets WHERE replica_id = 'pgtap-r'), 0::bigint,
          'a user with 0 sockets has no row');
SELECT throws_ok($$SELECT switchboard.presence_sync('pgtap-r', ARRAY['00000000-0000-0000-0000-00000000000b']::uuid[], ARRAY[1, 2])$$,
                 '22023', NULL, 'arrays of different lengths are refused');

DELETE FROM switchboard.task_runs;
-- V0036: with the previous release's partition gone, runs finished before the day
-- partitions land in the default one, which reap_runs deletes row by row, bounded.
DROP TABLE switchboard.task_runs_history_before;
INSERT INTO switchboard.task_runs (handler, status, trigger, run_at, finished_at)
SELECT 'pgtap', 'succeeded', 'enqueue', now() - interval '9 days', now() - interval '8 days' FROM generate_series(1, 7);
SELECT is(switchboard.reap_runs('7 days', 5), 5, 'reap_runs deletes at most max_rows');
SELECT is(switchboard.reap_runs('7 days', 5), 2, '... and the rest on the next call');
SELECT throws_ok($$SELECT switchboard.reap_runs('7 days', 0)$$, '22023', NULL, 'max_rows 0 is refused');

INSERT INTO switchboard.rate_limits (key, tat_us, updated_at)
SELECT 'pgtap-idle' || i, 0, now() - interval '2 hours' FROM generate_series(1, 3) i;
SELECT is(switchboard.reap_rate_limits('1 hour', 2), 2, 'reap_rate_limits deletes at most max_rows');
SELECT is(switchboard.reap_rate_limits('1 hour', 2), 1, '... and the rest on the next call');
SELECT throws_ok($$SELECT switchboard.reap_rate_limits('1 hour', -1)$$, '22023', NULL, 'a negative max_rows is refused');

SELECT * FROM finish();
ROLLBACK;
