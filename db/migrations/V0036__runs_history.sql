-- V0036: run history apart from the hot table (issue 35, item 1).
--
-- Before: every run, queued, running and every finished one kept for a week, lived
-- in switchboard.task_runs, the table every claim walks; retention was a row-by-row
-- DELETE (reap_runs) leaving dead tuples for autovacuum (BENCHMARKS.md, "history":
-- reaping 5M runs cost 38-40 s, 553 MiB of WAL and 5M dead tuples).
-- Now:
--   switchboard.task_runs_hot      the old table, renamed: queued and running runs
--                                  (plus, until runs_backfill() has drained them,
--                                  the finished runs of the previous release). Every
--                                  index of the claim and of the exclusivity
--                                  guarantees stays on it, under its old name.
--   switchboard.task_runs_history  finished runs (succeeded, failed, abandoned,
--                                  cancelled), PARTITION BY RANGE (finished_at): one
--                                  partition per UTC day, task_runs_history_pYYYYMMDD,
--                                  a task_runs_history_before partition (MINVALUE up
--                                  to the day of this migration) for older runs, and
--                                  task_runs_history_default, a safety net (a finish
--                                  never fails for want of a day partition).
--   switchboard.task_runs          a VIEW: hot UNION ALL history, same columns, so
--                                  every reader (functions, the console, a DBA in
--                                  psql, scripts) sees every run exactly once.
-- Every statement that finishes a run moves it in that statement (DELETE from hot
-- ... RETURNING, INSERT into history: db/functions/20_scheduler.sql and the files
-- after it); retention drops whole day partitions (reap_runs, maintenance()).
--
-- Rolling update from 0.2.0: this version is short (a rename, empty tables, a view,
-- a trigger; no copy under a lock). The finished runs already in the hot table
-- stay visible through the view and are moved to history in bounded batches by
-- runs_backfill(), which every maintenance() sweep calls until none is left. The
-- 0.2.0 server calls the same functions by the same signatures (function files
-- are applied right after this, in the same transaction).
--
-- Functions whose argument or result type is the task_runs row type are dropped
-- here and created again by the function files (afterAll): after the rename that
-- row type is task_runs_hot's, and CREATE OR REPLACE could not change the result
-- type to the view's (same columns, another type), nor replace _queue_retry's
-- argument type without leaving an orphan overload behind.
DO $drop$
DECLARE
    v_type oid := 'switchboard.task_runs'::regtype;
    v_fn regprocedure;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'switchboard'::regnamespace
           AND (p.prorettype = v_type OR v_type = ANY (p.proargtypes)
                OR v_type = ANY (coalesce(p.proallargtypes, '{}')))
    LOOP
        EXECUTE format('DROP FUNCTION %s', v_fn);
    END LOOP;
END
$drop$;

ALTER TABLE switchboard.task_runs RENAME TO task_runs_hot;
-- No CHECK (status IN ('queued', 'running')) on it, not even NOT VALID: a 0.2.0
-- replica's statement that was waiting for this migration's lock when it committed
-- still runs the old function body (UPDATE ... SET status = 'succeeded' on this
-- table); it must succeed, and runs_backfill() moves the row it leaves here.
COMMENT ON TABLE switchboard.task_runs_hot IS
    'Queued and running runs (the hot table every claim walks; V0036). A run leaves it in the statement that finishes it, for task_runs_history. Read every run through the task_runs view, the runs view or list_runs().';
COMMENT ON INDEX switchboard.task_runs_finished_v2 IS
    'Finished runs still in the hot table (from before V0036): runs_backfill() walks it, oldest first; empty once drained.';

CREATE TABLE switchboard.task_runs_history (
    id               bigint NOT NULL,
    task_id          uuid,
    handler          text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL,
    trigger          text NOT NULL,
    attempt          integer NOT NULL DEFAULT 1,
    max_attempts     integer NOT NULL DEFAULT 3,
    queueing_lock    text,
    run_at           timestamptz NOT NULL DEFAULT now(),
    scheduled_for    timestamptz,
    worker           text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz NOT NULL,
    result           jsonb,
    error            text,
    retry_of         bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    queue            text NOT NULL DEFAULT 'default',
    priority         smallint NOT NULL DEFAULT 0,
    -- Also what lets the planner leave history out of a query on the task_runs view
    -- that asks for queued or running runs (constraint_exclusion = partition, the
    -- default, applies to UNION ALL members).
    CONSTRAINT task_runs_history_status_check
        CHECK (status IN ('succeeded', 'failed', 'abandoned', 'cancelled')),
    CONSTRAINT task_runs_history_attempt_check CHECK (attempt >= 1 AND max_attempts >= 1)
) PARTITION BY RANGE (finished_at);
-- What the readers need. No unique index: a unique index of a partitioned table
-- must contain the partition key; ids are unique because every run is created in
-- the hot table (its identity) and moved once (DELETE ... RETURNING). No foreign key
-- to tasks: it would make every finish check and lock the task's row; delete_task()
-- deletes a task's history itself.
CREATE INDEX task_runs_history_id ON switchboard.task_runs_history (id);
CREATE INDEX task_runs_history_by_handler ON switchboard.task_runs_history (handler, id DESC);
CREATE INDEX task_runs_history_by_task ON switchboard.task_runs_history (task_id, id DESC)
    WHERE task_id IS NOT NULL;
CREATE INDEX task_runs_history_retried ON switchboard.task_runs_history (retry_of) WHERE retry_of IS NOT NULL;
CREATE INDEX task_runs_history_finished ON switchboard.task_runs_history (finished_at);
COMMENT ON TABLE switchboard.task_runs_history IS
    'Finished runs (succeeded, failed, abandoned, cancelled; V0036), partitioned by finished_at: one partition per UTC day (task_runs_history_pYYYYMMDD, created ahead by runs_partitions_ensure()), task_runs_history_before for runs finished before V0036 was applied, and task_runs_history_default (should stay empty: rows there mean a day partition was missing; the next runs_partitions_ensure() moves them). Retention drops whole day partitions (reap_runs). Read it through the task_runs view.';
COMMENT ON INDEX switchboard.task_runs_history_id IS 'A run by id (retry_run, run detail, list_runs pages).';
COMMENT ON INDEX switchboard.task_runs_history_by_handler IS 'list_runs by handler, newest first.';
COMMENT ON INDEX switchboard.task_runs_history_by_task IS 'A task''s history, newest first.';
COMMENT ON INDEX switchboard.task_runs_history_retried IS 'Whether a finished run was retried (retry_runs).';
COMMENT ON INDEX switchboard.task_runs_history_finished IS 'Finishes since a point (the runs feed); old rows of the default partition (reap_runs).';
COMMENT ON COLUMN switchboard.task_runs_history.id IS 'Run id, as it was in task_runs_hot (unique across hot and history).';
COMMENT ON COLUMN switchboard.task_runs_history.task_id IS 'The task, or NULL for a one-off job from enqueue().';
COMMENT ON COLUMN switchboard.task_runs_history.handler IS 'Handler that ran it.';
COMMENT ON COLUMN switchboard.task_runs_history.args IS 'JSON arguments.';
COMMENT ON COLUMN switchboard.task_runs_history.status IS 'succeeded, failed, abandoned (lease expired) or cancelled.';
COMMENT ON COLUMN switchboard.task_runs_history.trigger IS 'What created it: schedule, manual, api, cli, enqueue, retry, manual_retry.';
COMMENT ON COLUMN switchboard.task_runs_history.attempt IS 'Attempt number, 1 for the first try.';
COMMENT ON COLUMN switchboard.task_runs_history.max_attempts IS 'Attempts allowed.';
COMMENT ON COLUMN switchboard.task_runs_history.queueing_lock IS 'enqueue()''s queueing lock, if any (released when the run finished).';
COMMENT ON COLUMN switchboard.task_runs_history.run_at IS 'Not claimed before this time.';
COMMENT ON COLUMN switchboard.task_runs_history.scheduled_for IS 'The tick this run was for (scheduled runs).';
COMMENT ON COLUMN switchboard.task_runs_history.worker IS 'Worker (replica id) that claimed it.';
COMMENT ON COLUMN switchboard.task_runs_history.lease_expires_at IS 'The lease it held when it finished (abandoned runs), else NULL.';
COMMENT ON COLUMN switchboard.task_runs_history.started_at IS 'When it was claimed.';
COMMENT ON COLUMN switchboard.task_runs_history.finished_at IS 'When it reached its final status: the partition key.';
COMMENT ON COLUMN switchboard.task_runs_history.result IS 'The handler''s JSON result (succeeded runs).';
COMMENT ON COLUMN switchboard.task_runs_history.error IS 'Why it failed, was abandoned or was cancelled.';
COMMENT ON COLUMN switchboard.task_runs_history.retry_of IS 'The run this one retried; NULL for a first attempt.';
COMMENT ON COLUMN switchboard.task_runs_history.created_at IS 'When the run was created.';
COMMENT ON COLUMN switchboard.task_runs_history.queue IS 'The named queue it was claimed from.';
COMMENT ON COLUMN switchboard.task_runs_history.priority IS 'Its priority within the queue.';
REVOKE ALL ON TABLE switchboard.task_runs_history FROM PUBLIC;
GRANT SELECT ON TABLE switchboard.task_runs_history TO switchboard_app;

CREATE TABLE switchboard.task_runs_history_default PARTITION OF switchboard.task_runs_history DEFAULT;
COMMENT ON TABLE switchboard.task_runs_history_default IS
    'Safety net: finished runs whose day has no partition yet. Should be empty: runs_partitions_ensure() (every maintenance sweep) moves its rows into the day partitions it creates; status() reports runs_history_default.';
-- Runs finished before this version (the backfill's target) and on this very day
-- before the day partitions existed: dropped whole once all of it is older than keep.
DO $parts$
DECLARE
    v_today date := (now() AT TIME ZONE 'UTC')::date;
BEGIN
    EXECUTE format('CREATE TABLE switchboard.task_runs_history_before PARTITION OF switchboard.task_runs_history'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)', v_today::timestamp AT TIME ZONE 'UTC');
    EXECUTE format('COMMENT ON TABLE switchboard.task_runs_history_before IS %L',
                   'Runs finished before ' || v_today || ' (UTC), when V0036 was applied: where runs_backfill() moves the previous release''s finished runs. Dropped whole by reap_runs once older than keep.');
    FOR d IN 0..3 LOOP
        EXECUTE format('CREATE TABLE switchboard.%I PARTITION OF switchboard.task_runs_history'
                       ' FOR VALUES FROM (%L) TO (%L)',
                       'task_runs_history_p' || to_char(v_today + d, 'YYYYMMDD'),
                       (v_today + d)::timestamp AT TIME ZONE 'UTC', (v_today + d + 1)::timestamp AT TIME ZONE 'UTC');
        EXECUTE format('COMMENT ON TABLE switchboard.%I IS %L',
                       'task_runs_history_p' || to_char(v_today + d, 'YYYYMMDD'),
                       'Runs finished on ' || (v_today + d) || ' (UTC). Dropped whole by reap_runs once older than keep.');
    END LOOP;
END
$parts$;

-- The view every reader keeps using. UNION ALL of two disjoint sets: a run is in
-- exactly one of them, and a finish moves it in one statement, so any snapshot sees
-- it once.
CREATE VIEW switchboard.task_runs AS
    SELECT h.id, h.task_id, h.handler, h.args, h.status, h.trigger, h.attempt, h.max_attempts,
           h.queueing_lock, h.run_at, h.scheduled_for, h.worker, h.lease_expires_at, h.started_at,
           h.finished_at, h.result, h.error, h.retry_of, h.created_at, h.queue, h.priority
      FROM switchboard.task_runs_hot h
    UNION ALL
    SELECT f.id, f.task_id, f.handler, f.args, f.status, f.trigger, f.attempt, f.max_attempts,
           f.queueing_lock, f.run_at, f.scheduled_for, f.worker, f.lease_expires_at, f.started_at,
           f.finished_at, f.result, f.error, f.retry_of, f.created_at, f.queue, f.priority
      FROM switchboard.task_runs_history f;
-- A DBA's INSERT without these columns gets the table's defaults.
ALTER VIEW switchboard.task_runs ALTER COLUMN args SET DEFAULT '{}';
ALTER VIEW switchboard.task_runs ALTER COLUMN status SET DEFAULT 'queued';
ALTER VIEW switchboard.task_runs ALTER COLUMN attempt SET DEFAULT 1;
ALTER VIEW switchboard.task_runs ALTER COLUMN max_attempts SET DEFAULT 3;
ALTER VIEW switchboard.task_runs ALTER COLUMN run_at SET DEFAULT now();
ALTER VIEW switchboard.task_runs ALTER COLUMN created_at SET DEFAULT now();
ALTER VIEW switchboard.task_runs ALTER COLUMN queue SET DEFAULT 'default';
ALTER VIEW switchboard.task_runs ALTER COLUMN priority SET DEFAULT 0;
REVOKE ALL ON TABLE switchboard.task_runs FROM PUBLIC;
GRANT SELECT ON TABLE switchboard.task_runs TO switchboard_app;
COMMENT ON VIEW switchboard.task_runs IS
    'Every run: task_runs_hot (queued, running) UNION ALL task_runs_history (finished, partitioned by day; V0036). Runs of tasks and one-off jobs (task_id NULL); a run is one attempt, a retry is a new run (attempt + 1, retry_of = the old id). A hand-written INSERT, UPDATE or DELETE on it is routed to the right table by a trigger (a run made final moves to history); the functions write the tables themselves.';
COMMENT ON COLUMN switchboard.task_runs.id IS 'Run id (increasing: a larger id is a newer run).';
COMMENT ON COLUMN switchboard.task_runs.task_id IS 'The task, or NULL for a one-off job from enqueue().';
COMMENT ON COLUMN switchboard.task_runs.handler IS 'Handler that runs it (copied from the task when the run was created).';
COMMENT ON COLUMN switchboard.task_runs.args IS 'JSON arguments (copied from the task when the run was created).';
COMMENT ON COLUMN switchboard.task_runs.status IS 'queued, running (in task_runs_hot), succeeded, failed, abandoned (lease expired) or cancelled (in task_runs_history).';
COMMENT ON COLUMN switchboard.task_runs.trigger IS 'What created it: schedule, manual, api, cli, enqueue, retry (automatic), manual_retry (retry_run()).';
COMMENT ON COLUMN switchboard.task_runs.attempt IS 'Attempt number, 1 for the first try.';
COMMENT ON COLUMN switchboard.task_runs.max_attempts IS 'Attempts allowed: no automatic retry once attempt reaches it.';
COMMENT ON COLUMN switchboard.task_runs.queueing_lock IS 'enqueue()''s lock: at most one queued or running job holds a given value.';
COMMENT ON COLUMN switchboard.task_runs.run_at IS 'Not claimed before this time (retry backoff, delayed jobs).';
COMMENT ON COLUMN switchboard.task_runs.scheduled_for IS 'The tick this run is for (scheduled runs and their retries).';
COMMENT ON COLUMN switchboard.task_runs.worker IS 'Worker (replica id) that claimed it.';
COMMENT ON COLUMN switchboard.task_runs.lease_expires_at IS 'A running run whose lease expires is rescued: abandoned, and retried while attempts remain.';
COMMENT ON COLUMN switchboard.task_runs.started_at IS 'When it was claimed.';
COMMENT ON COLUMN switchboard.task_runs.finished_at IS 'When it reached a final status.';
COMMENT ON COLUMN switchboard.task_runs.result IS 'The handler''s JSON result (succeeded runs).';
COMMENT ON COLUMN switchboard.task_runs.error IS 'Why it failed, was abandoned or was cancelled.';
COMMENT ON COLUMN switchboard.task_runs.retry_of IS 'The run this one retries (automatically or by retry_run()); NULL for a first attempt.';
COMMENT ON COLUMN switchboard.task_runs.created_at IS 'When the row was created.';
COMMENT ON COLUMN switchboard.task_runs.queue IS 'Named queue: claims serve each queue with its own slots per replica (SWITCHBOARD_QUEUES). Task runs are in ''default''.';
COMMENT ON COLUMN switchboard.task_runs.priority IS 'Within a queue, a higher priority is claimed first (-100 to 100; then oldest due first).';

-- Hand-written writes on the view (a DBA's UPDATE in psql, scripts, tests) are routed
-- to the table that holds the run by this trigger. Its function is defined by the
-- function files (db/functions/21_runs_history.sql, applied right after this version);
-- created here as a stub only so that the trigger can be (OR REPLACE: at an older
-- migration target the function files may already have created it).
CREATE OR REPLACE FUNCTION switchboard._task_runs_view_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'switchboard.task_runs is read-only until the function files are applied'
        USING ERRCODE = '55000', HINT = 'Apply db/functions (pgmigrate does, after every version).';
END
$$;
REVOKE ALL ON FUNCTION switchboard._task_runs_view_write() FROM PUBLIC;
CREATE TRIGGER task_runs_write INSTEAD OF INSERT OR UPDATE OR DELETE ON switchboard.task_runs
    FOR EACH ROW EXECUTE FUNCTION switchboard._task_runs_view_write();
COMMENT ON TRIGGER task_runs_write ON switchboard.task_runs IS
    'Routes hand-written writes on the view to task_runs_hot or task_runs_history (see _task_runs_view_write()).';
