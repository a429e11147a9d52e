-- pgTAP: run history apart from the hot table (V0036) -- the layout a DBA sees
-- (hot table, partitioned history, the task_runs view, COMMENTs), a finish moving
-- its run, the default partition as a safety net emptied by runs_partitions_ensure,
-- retention by dropping a partition, the backfill. One transaction, rolled back.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(35);

-- The layout.
SELECT has_table('switchboard', 'task_runs_hot', 'queued and running runs are a table');
SELECT has_table('switchboard', 'task_runs_history', 'finished runs are a table');
SELECT has_view('switchboard', 'task_runs', 'task_runs is a view of both');
SELECT is((SELECT relkind::text FROM pg_class WHERE oid = 'switchboard.task_runs_history'::regclass), 'p',
          'history is partitioned');
SELECT is((SELECT pg_get_partkeydef('switchboard.task_runs_history'::regclass)), 'RANGE (finished_at)',
          '... by range of finished_at');
SELECT has_table('switchboard', 'task_runs_history_default', 'a default partition is the safety net');
SELECT ok(to_regclass('switchboard.task_runs_history_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NOT NULL,
          'today (UTC) has its partition');
-- 3 when V0036 or the last sweep ran today (UTC); at least 2 if that was yesterday
SELECT cmp_ok((SELECT count(*)::int FROM switchboard._runs_history_parts() p WHERE p.lower_bound > now()), '>=', 2,
              'the days ahead have theirs');
SELECT has_index('switchboard', 'task_runs_hot', 'task_runs_one_active', 'the exclusive-run index stays on hot');
SELECT has_index('switchboard', 'task_runs_hot', 'task_runs_queueing_lock', 'the queueing-lock index stays on hot');
SELECT has_index('switchboard', 'task_runs_history', 'task_runs_history_by_handler', ARRAY['handler', 'id'],
                 'history is listed by handler');
SELECT is_empty($$
    SELECT c.relname FROM pg_class c
     WHERE c.relnamespace = 'switchboard'::regnamespace
       AND (c.relname IN ('task_runs', 'task_runs_hot') OR c.relname LIKE 'task_runs_history%')
       AND c.relkind IN ('r', 'p', 'v') AND obj_description(c.oid, 'pg_class') IS NULL
$$, 'the view, hot, history and every partition have a COMMENT');
SELECT is_empty($$
    SELECT a.attname FROM pg_attribute a
     WHERE a.attrelid = 'switchboard.task_runs_history'::regclass AND a.attnum > 0 AND NOT a.attisdropped
       AND col_description(a.attrelid, a.attnum) IS NULL
$$, 'every column of history has a COMMENT');
SELECT table_privs_are('switchboard', 'task_runs_history', 'switchboard_app', ARRAY['SELECT'],
                       'the application role only reads history');

-- The API.
SELECT has_function('switchboard', 'runs_partitions_ensure', ARRAY['integer']);
SELECT has_function('switchboard', 'runs_backfill', ARRAY['integer']);
SELECT function_privs_are('switchboard', 'runs_partitions_ensure', ARRAY['integer'], 'switchboard_app', ARRAY['EXECUTE'],
                          'the application role (the maintenance sweep) creates partitions');
SELECT function_privs_are('switchboard', 'runs_backfill', ARRAY['integer'], 'switchboard_app', ARRAY['EXECUTE'],
                          'the application role (the maintenance sweep) backfills');
SELECT throws_ok($$SELECT * FROM switchboard.runs_partitions_ensure(-1)$$, '22023', NULL,
                 'a negative days_ahead is refused');
SELECT throws_ok($$SELECT switchboard.runs_backfill(0)$$, '22023', NULL, 'max_rows 0 is refused');

-- A finish moves its run.
UPDATE switchboard.tasks SET is_active = false;
SELECT switchboard.enqueue('pgtap.hist', '{"n": 1}');
SELECT ok((SELECT count(*) FROM switchboard.claim_due_tasks('pgtap-w', '60 seconds', 1000)) >= 1, 'claimed');
SELECT ok(switchboard.finish_run((SELECT id FROM switchboard.task_runs_hot WHERE handler = 'pgtap.hist'),
                                 'pgtap-w', true, '{"ok": 1}'), 'finished');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs_hot WHERE handler = 'pgtap.hist'), 0,
          'the finished run left the hot table');
SELECT is((SELECT status || ' ' || (result->>'ok') FROM switchboard.task_runs_history WHERE handler = 'pgtap.hist'),
          'succeeded 1', '... and is in history, with its outcome');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs WHERE handler = 'pgtap.hist'), 1,
          'the view shows it once');
SELECT is((SELECT count(*)::int FROM switchboard.retry_run((SELECT id FROM switchboard.task_runs_history
                                                              WHERE handler = 'pgtap.hist'))), 1,
          'retry_run retries a run in history');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs_hot
            WHERE status NOT IN ('queued', 'running')), 0, 'the hot table holds only queued and running runs');

-- No partition for the day (dropped here, with the run finished above): the finish
-- lands in the default partition, and the next runs_partitions_ensure moves it into
-- the day's new partition.
SELECT switchboard._runs_history_drop_part(
    ('switchboard.task_runs_history_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'))::regclass);
SELECT ok(switchboard.cancel_run((SELECT id FROM switchboard.task_runs_hot WHERE handler = 'pgtap.hist')),
          'cancelled with no partition for today');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs_history_default WHERE handler = 'pgtap.hist'), 1,
          '... into the default partition');
SELECT is((SELECT value FROM switchboard.status() WHERE item = 'runs_history_default'), 1::bigint,
          'status() reports the default partition''s rows');
SELECT is((SELECT created || ' ' || moved FROM switchboard.runs_partitions_ensure(0)), '1 1',
          'runs_partitions_ensure creates today''s partition and moves the row into it');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs_history_default), 0, 'the default partition is empty again');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs WHERE handler = 'pgtap.hist'), 1,
          'the cancelled run is there, once');

-- Retention drops whole partitions: with keep 0 the partition of the previous
-- release's runs (whose range ended today at 00:00 UTC) goes; today's stays.
SELECT switchboard.reap_runs('0 seconds', 10);
SELECT ok(to_regclass('switchboard.task_runs_history_before') IS NULL, 'reap_runs dropped a partition older than keep');
SELECT is((SELECT count(*)::int FROM switchboard.task_runs WHERE handler = 'pgtap.hist'), 1,
          '... and kept today''s');

SELECT * FROM finish();
ROLLBACK;
