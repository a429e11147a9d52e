-- pgTAP: tasks, zones, exclusive runs, SQLSTATEs on bad input, cron_next on
-- DST days. Creates tasks and runs inside one transaction that is rolled back:
-- no row stays, and the wake-up NOTIFY of create_run_exclusive / enqueue is
-- never sent (PostgreSQL delivers NOTIFY at COMMIT and drops it on ROLLBACK).
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(33);

-- Zones: create_task accepts exactly what cron_validate accepts.
CREATE FUNCTION pg_temp.accepts(sql text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN true;
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN false;
END
$$;
SELECT is_empty($$
    SELECT z FROM unnest(ARRAY['UTC', 'utc', 'Utc', 'Etc/UTC', 'Europe/Berlin', 'europe/berlin',
                               'AMERICA/NEW_YORK', 'EST5EDT', 'UTC+3', 'Mars/Olympus', 'Europe/Berlinn', '']) z
     WHERE pg_temp.accepts(format('SELECT switchboard.cron_validate(%L, %L)', '@hourly', z))
           IS DISTINCT FROM pg_temp.accepts(format('SELECT switchboard._check_timezone(%L)', z))
$$, 'the zone check accepts exactly what cron_validate accepts');
SELECT lives_ok($$SELECT switchboard.create_task('pgtap.utc', '@hourly', 'noop', '{}', 'utc')$$,
                'create_task accepts ''utc'' like cron_validate');
SELECT lives_ok($$SELECT switchboard.create_task('pgtap.berlin', '0 3 * * *', 'noop', '{}', 'europe/berlin')$$,
                'create_task accepts a zone name in any case');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.mars', '@hourly', 'noop', '{}', 'Mars/Olympus')$$,
                 '22023', 'unknown time zone "Mars/Olympus"', 'an unknown zone is 22023 naming it');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.null', '@hourly', 'noop', '{}', NULL)$$,
                 '22023', 'time zone must not be NULL', 'a NULL zone is 22023');
SELECT throws_ok($$SELECT switchboard.update_task((SELECT id FROM switchboard.tasks WHERE name = 'pgtap.utc'),
                                                  '{"timezone": "Mars/Olympus"}')$$,
                 '22023', 'unknown time zone "Mars/Olympus"', 'update_task checks the zone too');

-- Bad input: SQLSTATE and a message naming the value.
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.bad', '61 * * * *', 'noop')$$,
                 '22023', NULL, 'a bad cron field is 22023');
SELECT throws_like($$SELECT switchboard.create_task('pgtap.bad', '* * *', 'noop')$$,
                   '%"* * *"%', 'the error names the bad schedule');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.bad', '@every soon', 'noop')$$, '22023');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.bad', '@hourly', 'bad handler!')$$, '22023');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.bad', '@hourly', 'noop', '[]')$$, '22023');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.bad', '@hourly', 'noop', '{}', 'UTC', 0)$$, '22023');
SELECT throws_ok($$SELECT switchboard.create_task('', '@hourly', 'noop')$$, '22023');
SELECT throws_ok($$SELECT switchboard.create_task('pgtap.utc', '@hourly', 'noop')$$,
                 '23505', 'task "pgtap.utc" already exists', 'a duplicate name is 23505');
SELECT throws_ok($$SELECT switchboard.update_task('00000000-0000-0000-0000-000000000000', '{}')$$, 'P0002');
SELECT throws_ok($$SELECT switchboard.update_task((SELECT id FROM switchboard.tasks WHERE name = 'pgtap.utc'),
                                                  '{"colour": "red"}')$$, '22023');
SELECT throws_ok($$SELECT switchboard.create_run_exclusive('00000000-0000-0000-0000-000000000000')$$, 'P0002');
SELECT throws_ok($$SELECT switchboard.cron_next('not a schedule')$$, '22023');
SELECT throws_ok($$SELECT switchboard.cron_next('@hourly', 'infinity')$$, '22023');
SELECT throws_ok($$SELECT switchboard.enqueue('noop', '{}', now(), repeat('x', 201))$$, '22023');

-- Exclusive runs: one queued-or-running run per task, decided by a unique index.
SELECT switchboard.create_task('pgtap.exclusive', NULL, 'noop') IS NOT NULL AS created \gset
SELECT is((SELECT count(*) FROM switchboard.create_run_exclusive(
              (SELECT id FROM switchboard.tasks WHERE name = 'pgtap.exclusive'), 'pgtap')),
          1::bigint, 'the first create_run_exclusive queues a run');
SELECT is((SELECT count(*) FROM switchboard.create_run_exclusive(
              (SELECT id FROM switchboard.tasks WHERE name = 'pgtap.exclusive'), 'pgtap')),
          0::bigint, 'a second one returns no row while the first is queued');
SELECT is((SELECT count(*) FROM switchboard.task_runs r JOIN switchboard.tasks t ON t.id = r.task_id
            WHERE t.name = 'pgtap.exclusive'), 1::bigint, 'exactly one run exists');
SELECT ok(switchboard.cancel_run((SELECT r.id FROM switchboard.task_runs r JOIN switchboard.tasks t ON t.id = r.task_id
                                   WHERE t.name = 'pgtap.exclusive')), 'the queued run can be cancelled');
SELECT is((SELECT count(*) FROM switchboard.create_run_exclusive(
              (SELECT id FROM switchboard.tasks WHERE name = 'pgtap.exclusive'), 'pgtap')),
          1::bigint, 'after it ended, a new run can be queued');
SELECT is((SELECT count(*) FROM switchboard.enqueue('noop', '{}', now(), 'pgtap-lock')), 1::bigint,
          'enqueue with a queueing_lock queues a job');
SELECT is((SELECT count(*) FROM switchboard.enqueue('noop', '{}', now(), 'pgtap-lock')), 0::bigint,
          'a second job with the same queueing_lock is refused (no row)');

-- cron_next on DST days (wall-clock schedules in a zone).
SELECT is(switchboard.cron_next('30 2 * * *', '2026-03-28 23:00Z', 'Europe/Berlin'), '2026-03-29 01:00Z'::timestamptz,
          'Berlin spring forward: 02:30 does not exist, the tick fires at the transition (03:00 CEST)');
SELECT is(switchboard.cron_next('30 2 * * *', '2026-10-24 23:00Z', 'Europe/Berlin'), '2026-10-25 00:30Z'::timestamptz,
          'Berlin fall back: 02:30 happens twice, the tick fires at the first (CEST)');
SELECT is(switchboard.cron_next('30 2 * * *', '2026-10-25 00:30Z', 'Europe/Berlin'), '2026-10-26 01:30Z'::timestamptz,
          '... and not again at the second 02:30 (CET): next is the following day');
SELECT is(switchboard.cron_next('0 * * * *', '2026-10-25 00:00Z', 'Europe/Berlin'), '2026-10-25 02:00Z'::timestamptz,
          'hourly across fall back: the repeated 02:00 does not fire twice');
SELECT is(switchboard.cron_next('30 2 * * *', '2026-03-08 06:00Z', 'America/New_York'), '2026-03-08 07:00Z'::timestamptz,
          'New York spring forward: fires at the transition (03:00 EDT)');
SELECT is(switchboard.cron_next('30 2 * * *', '2026-03-28 23:00Z', 'utc'), '2026-03-29 02:30Z'::timestamptz,
          'in UTC there is no DST');

SELECT * FROM finish();
ROLLBACK;
