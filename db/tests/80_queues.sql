-- pgTAP: per-handler options, named queues and priorities (V0030) -- what a
-- handler's registration stores is what enqueue(), the claims and finish_run()
-- honour; bad options are refused naming the value. One transaction, rolled
-- back: no row stays and no wake-up NOTIFY is sent.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(33);

-- The API and the layout a DBA reads with \d+.
SELECT has_function('switchboard', 'set_handler_options', ARRAY['text', 'jsonb', 'text']);
SELECT function_returns('switchboard', 'set_handler_options', ARRAY['text', 'jsonb', 'text'], 'boolean');
SELECT has_function('switchboard', 'claim_due_tasks', ARRAY['text', 'interval', 'text[]', 'integer[]']);
SELECT has_function('switchboard', 'finish_and_claim',
                    ARRAY['text', 'bigint[]', 'jsonb[]', 'interval', 'text[]', 'integer[]']);
SELECT has_function('switchboard', 'finish_run', ARRAY['bigint', 'text', 'boolean', 'jsonb', 'text', 'boolean']);
SELECT has_table('switchboard', 'handler_options', 'handler options are a table');
SELECT has_column('switchboard', 'task_runs', 'queue', 'a run has a queue');
SELECT has_column('switchboard', 'task_runs', 'priority', 'a run has a priority');
SELECT has_index('switchboard', 'task_runs_hot', 'task_runs_ready', ARRAY['queue', 'priority', 'run_at', 'id'],
                 'the claim reads task_runs_ready');
SELECT isnt(obj_description('switchboard.handler_options'::regclass, 'pg_class'), NULL,
            'handler_options has a COMMENT');
SELECT function_privs_are('switchboard', 'set_handler_options', ARRAY['text', 'jsonb', 'text'],
                          'switchboard_publisher', ARRAY[]::text[], 'a publisher cannot change handler options');

-- Options are stored and read back through the handlers view.
SELECT ok(switchboard.set_handler_options('pgtap.mail',
              '{"queue": "pgtap_mail", "priority": 5, "max_attempts": 6, "timeout": 30}'),
          'set_handler_options stores a new registration (true: changed)');
SELECT is((SELECT (queue, priority, max_attempts, timeout)::text FROM switchboard.handler_options
            WHERE handler = 'pgtap.mail'), '(pgtap_mail,5,6,00:00:30)', 'the options are stored');

-- Bad options: 22023, naming the value.
SELECT throws_like($$SELECT switchboard.set_handler_options('pgtap.x', '{"prio": 1}')$$,
                   '%unknown handler option "prio"%', 'an unknown option is refused by name');
SELECT throws_like($$SELECT switchboard.set_handler_options('pgtap.x', '{"priority": 500}')$$,
                   '%priority%', 'a priority out of range is refused');
SELECT throws_like($$SELECT switchboard.set_handler_options('pgtap.x', '{"queue": "Bad Queue"}')$$,
                   '%invalid queue name%', 'a bad queue name is refused');
SELECT throws_ok($$SELECT switchboard.set_handler_options('pgtap.x', '{"backoff_base": 10, "backoff_cap": 1}')$$,
                 '22023', NULL, 'a cap below the base is refused');
SELECT is_empty($$SELECT 1 FROM switchboard.handler_options WHERE handler = 'pgtap.x'$$,
                'a refused registration stores nothing');

-- enqueue() takes the handler's options unless the caller names its own.
SELECT is((SELECT (queue, priority, max_attempts)::text FROM switchboard.enqueue('pgtap.mail')),
          '(pgtap_mail,5,6)', 'enqueue takes the handler''s queue, priority and max_attempts');
SELECT is((SELECT (queue, priority, max_attempts)::text
             FROM switchboard.enqueue('pgtap.mail', priority => -2, max_attempts => 1, queue => 'default')),
          '(default,-2,1)', 'the caller''s own values win');
SELECT is((SELECT (queue, priority, max_attempts)::text FROM switchboard.enqueue('pgtap.plain')),
          '(default,0,3)', 'a handler without options: default queue, priority 0, 3 attempts');
SELECT throws_like($$SELECT switchboard.enqueue('pgtap.plain', queue => 'pgtap_nowhere')$$,
                   '%queue "pgtap_nowhere" does not exist%', 'a queue no handler names is refused');
SELECT throws_ok($$SELECT switchboard.enqueue('pgtap.plain', priority => 101)$$, '22023', NULL,
                 'a priority out of range is refused');

-- The claims: the default queue by priority, a named queue by its slots only.
UPDATE switchboard.tasks SET is_active = false;
SELECT lives_ok($$SELECT switchboard.enqueue('pgtap.prio', '{"n": "low"}', now() - interval '1 minute', priority => -1)$$,
                'a low-priority job is queued');
SELECT lives_ok($$SELECT switchboard.enqueue('pgtap.prio', '{"n": "high"}', now() - interval '1 minute', priority => 9)$$,
                'a high-priority job is queued after it');
SELECT is((SELECT args->>'n' FROM switchboard.claim_due_task('pgtap-w1') WHERE handler = 'pgtap.prio'), 'high',
          'the default queue''s claim takes the highest priority first');
SELECT is((SELECT count(*)::int FROM switchboard.claim_due_tasks('pgtap-w1', '60 seconds', 100)
            WHERE queue = 'pgtap_mail'), 0, 'the three-argument claim never takes a named queue''s run');
SELECT is((SELECT count(*)::int FROM switchboard.claim_due_tasks('pgtap-w2', '60 seconds', '{pgtap_mail}', '{5}')),
          1, 'the queue''s own claim takes its run');
SELECT throws_like($$SELECT * FROM switchboard.claim_due_tasks('w', '60 seconds', '{a,b}', '{1}')$$,
                   '%one length%', 'queues and slots of different lengths are refused');

-- finish_run: the retry keeps queue and priority; retry => false fails for good.
SELECT ok(switchboard.finish_run((SELECT id FROM switchboard.task_runs WHERE worker = 'pgtap-w2'), 'pgtap-w2',
                                 false, NULL, 'boom'), 'the failure is recorded');
SELECT is((SELECT (queue, priority, attempt)::text FROM switchboard.task_runs
            WHERE retry_of = (SELECT id FROM switchboard.task_runs WHERE worker = 'pgtap-w2')),
          '(pgtap_mail,5,2)', 'its retry keeps the queue and the priority');

-- A handler that moves to another queue takes its queued runs along (V0034); a run
-- enqueued into a queue of its own choosing stays.
SELECT lives_ok($$SELECT switchboard.enqueue('pgtap.mover', '{"n": 1}'), switchboard.enqueue('pgtap.mover', '{"n": 2}'),
                         switchboard.enqueue('pgtap.mover', '{"n": 3}', queue => 'pgtap_mail')$$,
                'two runs in the default queue, one in a named queue');
SELECT switchboard.set_handler_options('pgtap.mover', '{"queue": "pgtap_moved"}');
SELECT is((SELECT string_agg(queue, ',' ORDER BY args->>'n') FROM switchboard.task_runs WHERE handler = 'pgtap.mover'),
          'pgtap_moved,pgtap_moved,pgtap_mail', 'the runs left in the old queue follow the handler; the chosen queue stays');

SELECT * FROM finish();
ROLLBACK;
