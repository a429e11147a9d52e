-- pgTAP: operating runs -- cancel (queued and running, fenced), retry, pause /
-- resume a handler, the runs view and list_runs, and the descriptions a DBA
-- reads with \dt+ and \d+. One transaction, rolled back: no row stays and no
-- wake-up NOTIFY is sent.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(66);

-- The API.
SELECT has_function('switchboard', 'cancel_run', ARRAY['bigint']);
SELECT function_returns('switchboard', 'cancel_run', ARRAY['bigint'], 'boolean');
SELECT has_function('switchboard', 'retry_run', ARRAY['bigint']);
SELECT function_returns('switchboard', 'retry_run', ARRAY['bigint'], 'setof switchboard.task_runs');
SELECT has_function('switchboard', 'pause_handler', ARRAY['text']);
SELECT has_function('switchboard', 'resume_handler', ARRAY['text']);
SELECT has_function('switchboard', 'list_runs',
                    ARRAY['text', 'text', 'text', 'timestamp with time zone', 'integer', 'bigint']);
SELECT function_returns('switchboard', 'list_runs',
                        ARRAY['text', 'text', 'text', 'timestamp with time zone', 'integer', 'bigint'],
                        'setof switchboard.runs');
SELECT has_function('switchboard', 'lost_runs', ARRAY['text', 'bigint[]']);
SELECT has_function('switchboard', 'notify_admins', ARRAY['text', 'jsonb']);
SELECT has_view('switchboard', 'runs', 'the runs view exists');
SELECT has_table('switchboard', 'paused_handlers', 'paused handlers are a table');
SELECT is_empty($$
    SELECT f FROM unnest(ARRAY['cancel_run(bigint)', 'retry_run(bigint)', 'pause_handler(text)',
                               'resume_handler(text)', 'lost_runs(text, bigint[])', 'notify_admins(text, jsonb)',
                               'list_runs(text, text, text, timestamp with time zone, integer, bigint)']) f
     WHERE NOT has_function_privilege('switchboard_app', ('switchboard.' || f)::regprocedure, 'EXECUTE')
$$, 'switchboard_app may call every operate function');
SELECT table_privs_are('switchboard', 'runs', 'switchboard_app', ARRAY['SELECT']);
SELECT table_privs_are('switchboard', 'paused_handlers', 'switchboard_app', ARRAY['SELECT']);

-- Descriptions: \dt+ and \d+ show one for every table, view and column.
SELECT is_empty($$
    SELECT c.relname FROM pg_catalog.pg_class c
     WHERE c.relnamespace = 'switchboard'::regnamespace AND c.relkind IN ('r', 'v', 'p')
       AND c.relname NOT IN ('schema_version', 'schema_version_type')
       AND coalesce(obj_description(c.oid, 'pg_class'), '') = ''
$$, 'every switchboard table and view has a COMMENT');
SELECT is_empty($$
    SELECT c.relname || '.' || a.attname FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE c.relnamespace = 'switchboard'::regnamespace AND c.relkind IN ('r', 'v', 'p')
       AND c.relname NOT IN ('schema_version', 'schema_version_type')
       AND NOT c.relispartition  -- a partition's columns are its parent's (V0036: task_runs_history)
       AND coalesce(col_description(c.oid, a.attnum), '') = ''
$$, 'every column of every switchboard table and view has a COMMENT');

-- Keep the default maintenance task out of the claims below.
UPDATE switchboard.tasks SET is_active = false WHERE name = 'switchboard.maintenance';

-- cancel_run on a queued run.
SELECT id AS q1 FROM switchboard.enqueue('pgtap.op') \gset
SELECT ok(switchboard.cancel_run(:q1), 'a queued run can be cancelled');
SELECT is((SELECT status FROM switchboard.task_runs WHERE id = :q1), 'cancelled', 'it is cancelled, not abandoned');
SELECT ok((SELECT error FROM switchboard.task_runs WHERE id = :q1) LIKE 'cancelled by % before it started',
          'the error says who cancelled it and when');
SELECT ok((SELECT finished_at IS NOT NULL FROM switchboard.task_runs WHERE id = :q1), 'a cancelled run is finished');
SELECT is(switchboard.cancel_run(:q1), false, 'cancelling a finished run returns false');
SELECT throws_ok('SELECT switchboard.cancel_run(-1)', 'P0002', 'run -1 does not exist',
                 'cancelling an unknown run is P0002 naming it');

-- cancel_run on a running run: the worker's late calls are fenced.
SELECT id AS r1 FROM switchboard.enqueue('pgtap.op') \gset
SELECT is((SELECT id FROM switchboard.claim_due_task('pgtap-w1')), :'r1'::bigint, 'the worker claims the run');
SELECT ok(switchboard.cancel_run(:r1), 'a running run can be cancelled');
SELECT ok((SELECT error FROM switchboard.task_runs WHERE id = :r1) LIKE 'cancelled by % while running on pgtap-w1',
          'the error names the worker it was running on');
SELECT is(switchboard.heartbeat_run(:r1, 'pgtap-w1'), false, 'the worker''s heartbeat is refused');
SELECT is(switchboard.finish_run(:r1, 'pgtap-w1', true), false, 'the worker''s late finish is fenced');
SELECT is_empty(format('SELECT switchboard.finish_runs(%L, ARRAY[%s]::bigint[])', 'pgtap-w1', :r1),
                'a late batched finish is fenced too');
SELECT is_empty(format('SELECT * FROM switchboard.finish_and_claim(%L, ARRAY[%s]::bigint[], NULL, %L, 0)',
                       'pgtap-w1', :r1, '60 seconds'),
                'and a late finish_and_claim (finish only: max_runs 0)');
SELECT throws_ok(format('SELECT * FROM switchboard.finish_and_claim(%L, ARRAY[%s]::bigint[], NULL, %L, -1)',
                        'pgtap-w1', :r1, '60 seconds'), '22023', 'invalid max_runs -1',
                 'finish_and_claim refuses a negative max_runs, naming it');
SELECT is(switchboard.release_run(:r1, 'pgtap-w1'), false, 'and so is a hand-back');
SELECT is((SELECT status FROM switchboard.task_runs WHERE id = :r1), 'cancelled', 'the run stays cancelled');
SELECT results_eq(format('SELECT run_id, status FROM switchboard.lost_runs(%L, ARRAY[%s, -5]::bigint[]) ORDER BY 1',
                         'pgtap-w1', :r1),
                  format('VALUES (-5::bigint, NULL::text), (%s::bigint, %L::text)', :r1, 'cancelled'),
                  'lost_runs tells the worker which runs it no longer owns');
SELECT is((SELECT count(*) FROM switchboard.task_runs WHERE retry_of = :r1), 0::bigint,
          'a cancelled run is not retried automatically');
SELECT is((SELECT value FROM switchboard.status() WHERE item = 'runs_cancelled'), 2::bigint,
          'status() counts cancelled runs');
SELECT is((SELECT value FROM switchboard.status() WHERE item = 'runs_failed'), 0::bigint,
          'and not as failures');

-- retry_run.
SELECT throws_ok(format('SELECT switchboard.retry_run(%s)', (SELECT id FROM switchboard.enqueue('pgtap.op'))),
                 '55000', NULL, 'a queued run cannot be retried');
SELECT id AS n1, attempt AS n1_attempt, retry_of AS n1_of, trigger AS n1_trigger, status AS n1_status
  FROM switchboard.retry_run(:r1) \gset
SELECT is(:'n1_of'::bigint, :'r1'::bigint, 'the new run records what it retries');
SELECT is(:'n1_attempt'::integer, 2, 'it is the next attempt');
SELECT is(:'n1_trigger'::text, 'manual_retry', 'its trigger is manual_retry');
SELECT is(:'n1_status'::text, 'queued', 'it is queued');
SELECT throws_ok(format('SELECT switchboard.retry_run(%s)', :r1), '55000',
                 format('run %s cannot be retried: run %s is already queued', :r1, :n1),
                 'a second retry while the first is pending is refused, naming it');
SELECT throws_ok('SELECT switchboard.retry_run(-1)', 'P0002', 'run -1 does not exist', 'unknown run: P0002');
-- A task's run: the task's one-active-run rule holds for retries.
SELECT id AS task1 FROM switchboard.create_task('pgtap.op.task', NULL, 'pgtap.op') \gset
SELECT id AS t1 FROM switchboard.create_run_exclusive(:'task1') \gset
SELECT ok(switchboard.cancel_run(:t1), 'the task''s run is cancelled');
SELECT id AS t2 FROM switchboard.create_run_exclusive(:'task1') \gset
SELECT throws_ok(format('SELECT switchboard.retry_run(%s)', :t1), '55000', NULL,
                 'a retry is refused while the task has another queued run');

-- The runs view and list_runs.
SELECT is((SELECT task_name FROM switchboard.runs WHERE id = :t1), 'pgtap.op.task', 'the view names the task');
SELECT ok((SELECT duration_ms IS NOT NULL FROM switchboard.runs WHERE id = :r1), 'a run that ran has a duration');
SELECT results_eq(format('SELECT id FROM switchboard.list_runs(task => %L)', 'pgtap.op.task'),
                  format('VALUES (%s::bigint), (%s::bigint)', :t2, :t1), 'filter by task name, newest first');
SELECT results_eq(format('SELECT id FROM switchboard.list_runs(task => %L)', :'task1'),
                  format('VALUES (%s::bigint), (%s::bigint)', :t2, :t1), 'or by task id');
SELECT is((SELECT count(*) FROM switchboard.list_runs(status => 'cancelled', handler => 'pgtap.op')), 3::bigint,
          'filter by status and handler');
SELECT results_eq(format('SELECT id FROM switchboard.list_runs(handler => %L, max_rows => 2, before_id => %s)',
                         'pgtap.op', :n1),
                  format('SELECT id FROM switchboard.task_runs WHERE handler = %L AND id < %s ORDER BY id DESC LIMIT 2',
                         'pgtap.op', :n1),
                  'keyset pages: the ids below the cursor, newest first');
SELECT is((SELECT count(*) FROM switchboard.list_runs(since => now() + interval '1 hour')), 0::bigint,
          'since filters on created_at');
SELECT throws_ok($$SELECT * FROM switchboard.list_runs(status => 'lost')$$, '22023', 'invalid run status "lost"',
                 'a bad status is 22023 naming it');
SELECT throws_ok($$SELECT * FROM switchboard.list_runs(task => 'no.such.task')$$, 'P0002',
                 'task "no.such.task" does not exist', 'an unknown task is P0002 naming it');
SELECT throws_ok($$SELECT * FROM switchboard.list_runs(max_rows => 0)$$, '22023', 'invalid max_rows 0',
                 'a page size out of range is 22023');

-- pause_handler / resume_handler. Clear the queue first: only the paused
-- handler's work is left to claim.
SELECT count(switchboard.cancel_run(id)) FROM switchboard.task_runs WHERE status IN ('queued', 'running') \gset
SELECT ok(switchboard.pause_handler('pgtap.op'), 'pause a handler');
SELECT is(switchboard.pause_handler('pgtap.op'), false, 'pausing it again changes nothing');
SELECT throws_ok($$SELECT switchboard.pause_handler('no good')$$, '22023', 'invalid handler name "no good"',
                 'a bad handler name is 22023 naming it');
SELECT id AS p1 FROM switchboard.enqueue('pgtap.op') \gset
SELECT id AS task2 FROM switchboard.create_task('pgtap.op.tick', '@every 1 minute', 'pgtap.op') \gset
-- The task missed ten ticks while paused.
UPDATE switchboard.tasks SET next_run_at = now() - interval '10 minutes' WHERE id = :'task2';
SELECT is_empty($$SELECT * FROM switchboard.claim_due_tasks('pgtap-w2', '60 seconds', 10)$$,
                'claims skip a paused handler''s queued runs and due ticks');
SELECT ok((SELECT paused FROM switchboard.handlers WHERE handler = 'pgtap.op'), 'the handlers view shows it paused');
SELECT is((SELECT value FROM switchboard.status() WHERE item = 'handlers_paused'), 1::bigint,
          'status() counts paused handlers');
SELECT ok(switchboard.resume_handler('pgtap.op'), 'resume it');
SELECT is(switchboard.resume_handler('pgtap.op'), false, 'resuming again changes nothing');
SELECT is((SELECT count(*) FROM switchboard.claim_due_tasks('pgtap-w2', '60 seconds', 10)), 2::bigint,
          'after resume the held run and ONE tick of the task are claimed (its catch-up rule)');
SELECT ok((SELECT next_run_at > now() FROM switchboard.tasks WHERE id = :'task2'),
          'the task is back on its schedule, in the future');

SELECT * FROM finish();
ROLLBACK;
