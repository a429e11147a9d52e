-- Operate: cancel, retry and pause work; the runs view and its listing.
--
-- Every decision is still one statement on task_runs, fenced or made
-- exclusive by what already guards the scheduler:
--   * cancel_run and finish_run both take the run out of task_runs_hot
--     (V0036: DELETE ... WHERE status = 'running' (or 'queued') RETURNING, moved
--     to task_runs_history in the same statement); the row lock orders them,
--     and the loser re-reads the row, finds it gone and changes nothing. A worker whose run was cancelled
--     learns it from lost_runs() (asked when the relay hears switchboard_runs,
--     which cancel_run sends at commit) or, at the latest, from its next
--     heartbeat_run(), which answers false.
--   * retry_run inserts with ON CONFLICT DO NOTHING: the unique partial
--     indexes task_runs_one_active (a task runs once at a time),
--     task_runs_queueing_lock and task_runs_one_active_retry (a run has one
--     active retry) decide, never a NOT EXISTS check.
--   * pause_handler is a row in switchboard.paused_handlers; the claim
--     functions skip the work of a paused handler (20_scheduler.sql).

-- The runs as an operator reads them: the task's name beside each run, and
-- how long it took (or, while running, has taken so far).
CREATE OR REPLACE VIEW switchboard.runs AS
    SELECT r.id, r.task_id, t.name AS task_name, r.handler, r.status, r.trigger,
           r.attempt, r.max_attempts, r.worker,
           r.created_at, r.run_at, r.started_at, r.finished_at,
           coalesce(r.finished_at, CASE WHEN r.status = 'running' THEN now() END) - r.started_at AS duration,
           (extract(epoch FROM coalesce(r.finished_at, CASE WHEN r.status = 'running' THEN now() END)
                               - r.started_at) * 1000)::bigint AS duration_ms,
           r.error, r.retry_of, r.lease_expires_at, r.scheduled_for, r.queueing_lock,
           r.args, r.result
      FROM switchboard.task_runs r
      LEFT JOIN switchboard.tasks t ON t.id = r.task_id;
COMMENT ON VIEW switchboard.runs IS
    'Runs of tasks and one-off jobs with their task''s name and duration; newest first by id. Filter and page with list_runs().';
COMMENT ON COLUMN switchboard.runs.id IS 'Run id (a larger id is a newer run).';
COMMENT ON COLUMN switchboard.runs.task_id IS 'The task, or NULL for a one-off job from enqueue().';
COMMENT ON COLUMN switchboard.runs.task_name IS 'The task''s name (NULL for a one-off job).';
COMMENT ON COLUMN switchboard.runs.handler IS 'Handler that runs it.';
COMMENT ON COLUMN switchboard.runs.status IS 'queued, running, succeeded, failed, abandoned (lease expired) or cancelled.';
COMMENT ON COLUMN switchboard.runs.trigger IS 'What created it: schedule, manual, api, cli, enqueue, retry, manual_retry.';
COMMENT ON COLUMN switchboard.runs.attempt IS 'Attempt number, 1 for the first try.';
COMMENT ON COLUMN switchboard.runs.max_attempts IS 'Attempts allowed before automatic retries stop.';
COMMENT ON COLUMN switchboard.runs.worker IS 'Worker (replica id) that claimed it.';
COMMENT ON COLUMN switchboard.runs.created_at IS 'When the run was created.';
COMMENT ON COLUMN switchboard.runs.run_at IS 'Not claimed before this time.';
COMMENT ON COLUMN switchboard.runs.started_at IS 'When it was claimed.';
COMMENT ON COLUMN switchboard.runs.finished_at IS 'When it reached a final status.';
COMMENT ON COLUMN switchboard.runs.duration IS 'finished_at - started_at; for a running run, the time so far.';
COMMENT ON COLUMN switchboard.runs.duration_ms IS 'duration in milliseconds.';
COMMENT ON COLUMN switchboard.runs.error IS 'Why it failed, was abandoned or was cancelled.';
COMMENT ON COLUMN switchboard.runs.retry_of IS 'The run this one retries; NULL for a first attempt.';
COMMENT ON COLUMN switchboard.runs.lease_expires_at IS 'Lease expiry of a running run.';
COMMENT ON COLUMN switchboard.runs.scheduled_for IS 'The tick this run is for (scheduled runs).';
COMMENT ON COLUMN switchboard.runs.queueing_lock IS 'enqueue()''s queueing lock, if any.';
COMMENT ON COLUMN switchboard.runs.args IS 'JSON arguments.';
COMMENT ON COLUMN switchboard.runs.result IS 'JSON result of a succeeded run.';
GRANT SELECT ON switchboard.runs TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard._check_run_status(status text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF status IS NOT NULL
       AND status NOT IN ('queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled') THEN
        RAISE EXCEPTION 'invalid run status "%"', status USING ERRCODE = '22023',
            HINT = 'A run status is one of queued, running, succeeded, failed, abandoned, cancelled.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_run_status(text) FROM PUBLIC;

-- list_runs: keyset pagination, newest first. The cursor is the last id of
-- the previous page (before_id): a page is "ids below the cursor", so rows
-- inserted meanwhile never shift a page (OFFSET would repeat or skip rows).
-- It walks the primary key backwards (or task_runs_by_task /
-- task_runs_by_handler when those filters are given) and stops after
-- max_rows matches.
CREATE OR REPLACE FUNCTION switchboard.list_runs(
    status text DEFAULT NULL, handler text DEFAULT NULL, task text DEFAULT NULL,
    since timestamptz DEFAULT NULL, max_rows integer DEFAULT 50, before_id bigint DEFAULT NULL)
RETURNS SETOF switchboard.runs
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_status text := list_runs.status;
    v_handler text := list_runs.handler;
    v_task text := list_runs.task;
    v_since timestamptz := list_runs.since;
    v_before bigint := list_runs.before_id;
    v_task_id uuid;
BEGIN
    PERFORM switchboard._check_run_status(v_status);
    IF v_handler IS NOT NULL THEN
        PERFORM switchboard._check_handler(v_handler);
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows is a page size from 1 to 1000.';
    END IF;
    IF v_task IS NOT NULL THEN
        -- A task is named by its name or its id.
        SELECT t.id INTO v_task_id FROM switchboard.tasks t
         WHERE t.name = v_task OR t.id::text = lower(v_task) LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task "%" does not exist', v_task USING ERRCODE = 'P0002',
                HINT = 'Name a task by its name or id: SELECT id, name FROM switchboard.tasks;';
        END IF;
    END IF;
    RETURN QUERY
    SELECT v.* FROM switchboard.runs v
     WHERE (v_before IS NULL OR v.id < v_before)
       AND (v_status IS NULL OR v.status = v_status)
       AND (v_handler IS NULL OR v.handler = v_handler)
       AND (v_task_id IS NULL OR v.task_id = v_task_id)
       AND (v_since IS NULL OR v.created_at >= v_since)
     ORDER BY v.id DESC
     LIMIT max_rows;
END
$$;
COMMENT ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) IS
    'Runs newest first, filtered by status, handler, task (name or id) and created since; at most max_rows (1..1000). Next page: before_id => the last id of this page. 22023 on a bad status or handler name, P0002 on an unknown task.';
REVOKE ALL ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) TO switchboard_app;

-- Who is acting, for the record a cancel leaves: the database role, and the
-- person behind it when the caller said so (the server and the CLI set
-- switchboard.actor for their transaction: the admin's username, the OS user).
-- A label, not an authority: any session may set the setting.
CREATE OR REPLACE FUNCTION switchboard._actor()
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(left(nullif(current_setting('switchboard.actor', true), ''), 100) || ' (' || session_user || ')',
                    session_user::text)
$$;
REVOKE ALL ON FUNCTION switchboard._actor() FROM PUBLIC;

-- cancel_run: a queued or a running run becomes 'cancelled' (final, never
-- retried). For a running run the row is the fence: the worker's late
-- finish_run / finish_runs / heartbeat_run / release_run all say
-- "WHERE status = 'running'" and return false. The wake-up NOTIFY at commit
-- makes every replica ask lost_runs() for its running runs, so the owner
-- tells its handler (HandlerContext.cancelled and .lease_lost) and stops it
-- within about a second, instead of at the next heartbeat (lease / 3).
CREATE OR REPLACE FUNCTION switchboard.cancel_run(run_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_who text := switchboard._actor();
BEGIN
    -- The run moves to history in the statement that cancels it (V0036).
    WITH gone AS (
        DELETE FROM switchboard.task_runs_hot r
         WHERE r.id = cancel_run.run_id AND r.status IN ('queued', 'running')
        RETURNING r.*)
    INSERT INTO switchboard.task_runs_history
    SELECT g.id, g.task_id, g.handler, g.args, 'cancelled', g.trigger, g.attempt, g.max_attempts,
           g.queueing_lock, g.run_at, g.scheduled_for, g.worker, NULL, g.started_at, now(), g.result,
           CASE WHEN g.status = 'running'
                THEN 'cancelled by ' || v_who || ' while running on ' || coalesce(g.worker, '?')
                ELSE 'cancelled by ' || v_who || ' before it started' END,
           g.retry_of, g.created_at, g.queue, g.priority
      FROM gone g;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN true;
    END IF;
    SELECT r.status INTO v_status FROM switchboard.task_runs r WHERE r.id = cancel_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', run_id USING ERRCODE = 'P0002',
            HINT = 'See SELECT id, status FROM switchboard.runs ORDER BY id DESC LIMIT 20;';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.cancel_run(bigint) IS
    'Cancel a queued or running run: it becomes cancelled (final, not retried, counted apart from failures). A running handler is told and stopped by its replica; its late outcome is discarded (fenced). False if the run had already finished; P0002 if there is no such run.';
REVOKE ALL ON FUNCTION switchboard.cancel_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.cancel_run(bigint) TO switchboard_app;

-- retry_run: a new queued attempt of a finished run (any final status),
-- attempt + 1, retry_of = the old run, trigger 'manual_retry'. The old row
-- keeps its outcome. max_attempts grows to cover the new attempt, so a manual
-- retry always gets its one attempt (and no automatic retries beyond the
-- run's own budget). Exclusivity is the unique indexes' (header).
CREATE OR REPLACE FUNCTION switchboard.retry_run(run_id bigint)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_old switchboard.task_runs;
    v_new switchboard.task_runs;
    v_active record;
BEGIN
    SELECT * INTO v_old FROM switchboard.task_runs r WHERE r.id = retry_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', run_id USING ERRCODE = 'P0002',
            HINT = 'See SELECT id, status FROM switchboard.runs ORDER BY id DESC LIMIT 20;';
    END IF;
    IF v_old.status IN ('queued', 'running') THEN
        RAISE EXCEPTION 'run % is %, not finished', run_id, v_old.status USING ERRCODE = '55000',
            HINT = 'Only a finished run (succeeded, failed, abandoned, cancelled) can be retried; cancel_run() it first or wait.';
    END IF;
    INSERT INTO switchboard.task_runs_hot
        (task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock,
         run_at, scheduled_for, retry_of, queue, priority)
    VALUES (v_old.task_id, v_old.handler, v_old.args, 'queued', 'manual_retry', v_old.attempt + 1,
            greatest(v_old.max_attempts, v_old.attempt + 1), v_old.queueing_lock,
            now(), v_old.scheduled_for, v_old.id, v_old.queue, v_old.priority)
    ON CONFLICT DO NOTHING
    RETURNING * INTO v_new;
    IF NOT FOUND THEN
        SELECT r.id, r.status INTO v_active FROM switchboard.task_runs_hot r
         WHERE r.status IN ('queued', 'running')
           AND (r.retry_of = v_old.id
                OR (v_old.task_id IS NOT NULL AND r.task_id = v_old.task_id)
                OR (v_old.queueing_lock IS NOT NULL AND r.queueing_lock = v_old.queueing_lock))
         LIMIT 1;
        RAISE EXCEPTION 'run % cannot be retried: run % is already %', run_id,
                        coalesce(v_active.id::text, '?'), coalesce(v_active.status, 'active')
            USING ERRCODE = '55000',
                  HINT = 'A task (or queueing lock, or failed run) has at most one queued or running run; wait for it or cancel_run() it.';
    END IF;
    PERFORM switchboard._wake_workers();
    RETURN NEXT v_new;
END
$$;
COMMENT ON FUNCTION switchboard.retry_run(bigint) IS
    'Queue a new attempt of a finished run (attempt + 1, retry_of = run_id, trigger manual_retry) and return it. P0002 if there is no such run; 55000 if the run is still queued or running, or if its task / queueing lock / own retry already has a queued or running run.';
REVOKE ALL ON FUNCTION switchboard.retry_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.retry_run(bigint) TO switchboard_app;

-- Bulk operations by filter (V0029): what an operator does after an outage ("retry
-- every failed run of mail.send from the last two hours") without a loop of calls.
-- One statement each, bounded by max_rows (call again until a call returns no row);
-- the filters are list_runs' (status, handler, task name or id, created since).
CREATE OR REPLACE FUNCTION switchboard._run_filter_task(task text)
RETURNS uuid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid;
BEGIN
    IF task IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT t.id INTO v_id FROM switchboard.tasks t WHERE t.name = task OR t.id::text = lower(task) LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task "%" does not exist', task USING ERRCODE = 'P0002',
            HINT = 'Name a task by its name or id: SELECT id, name FROM switchboard.tasks;';
    END IF;
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._run_filter_task(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_bulk(handler text, max_rows integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF handler IS NOT NULL THEN
        PERFORM switchboard._check_handler(handler);
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'A bulk call acts on 1 to 10000 runs; call again until a call returns no row.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_bulk(text, integer) FROM PUBLIC;

-- retry_runs: a new queued attempt (as retry_run makes) of each matching finished
-- run that has no retry yet, oldest first. Runs whose task / queueing lock already
-- has a queued or running run are skipped by the unique indexes (ON CONFLICT), as
-- is the second of two matching runs of one task: nothing is retried twice.
CREATE OR REPLACE FUNCTION switchboard.retry_runs(status text, handler text DEFAULT NULL, task text DEFAULT NULL,
                                                  since timestamptz DEFAULT NULL, max_rows integer DEFAULT 1000)
RETURNS TABLE (run_id bigint, retry_id bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_status text := retry_runs.status;
    v_handler text := retry_runs.handler;
    v_since timestamptz := retry_runs.since;
    v_task uuid;
    v_n integer;
BEGIN
    IF v_status IS NULL OR v_status NOT IN ('failed', 'abandoned', 'cancelled', 'succeeded') THEN
        RAISE EXCEPTION 'invalid status "%" for a retry', v_status USING ERRCODE = '22023',
            HINT = 'Retry runs that finished: failed, abandoned, cancelled or succeeded.';
    END IF;
    PERFORM switchboard._check_bulk(v_handler, max_rows);
    v_task := switchboard._run_filter_task(retry_runs.task);
    RETURN QUERY
    WITH picked AS (
        SELECT r.* FROM switchboard.task_runs r
         WHERE r.status = v_status
           AND (v_handler IS NULL OR r.handler = v_handler)
           AND (v_task IS NULL OR r.task_id = v_task)
           AND (v_since IS NULL OR r.created_at >= v_since)
           AND NOT EXISTS (SELECT 1 FROM switchboard.task_runs x WHERE x.retry_of = r.id)
           -- a busy task or queueing lock is not picked (it would only conflict and take
           -- a place in the page); two picked runs of one task or lock: the first wins
           AND NOT (r.task_id IS NOT NULL AND EXISTS (
                    SELECT 1 FROM switchboard.task_runs_hot a
                     WHERE a.task_id = r.task_id AND a.status IN ('queued', 'running')))
           AND NOT (r.queueing_lock IS NOT NULL AND EXISTS (
                    SELECT 1 FROM switchboard.task_runs_hot a
                     WHERE a.queueing_lock = r.queueing_lock AND a.status IN ('queued', 'running')))
         ORDER BY r.id
         LIMIT max_rows
    ), made AS (
        INSERT INTO switchboard.task_runs_hot
            (task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock,
             run_at, scheduled_for, retry_of, queue, priority)
        SELECT p.task_id, p.handler, p.args, 'queued', 'manual_retry', p.attempt + 1,
               greatest(p.max_attempts, p.attempt + 1), p.queueing_lock, now(), p.scheduled_for, p.id,
               p.queue, p.priority
          FROM picked p ORDER BY p.id
        ON CONFLICT DO NOTHING
        RETURNING task_runs_hot.retry_of, task_runs_hot.id
    )
    SELECT m.retry_of, m.id FROM made m ORDER BY m.retry_of;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
        PERFORM switchboard._wake_workers();
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.retry_runs(text, text, text, timestamptz, integer) IS
    'Retry the matching finished runs (status failed, abandoned, cancelled or succeeded; optional handler, task name or id, created since), oldest first, at most max_rows (1..10000) in one statement: one new queued attempt each, as retry_run makes. A run retried before is skipped (retry its retry); one whose task or queueing lock has a queued or running run is skipped. Returns (run_id, retry_id) per retry; call again until a call returns no row (a page may come back short when two of its runs share a task or lock). 22023 on a bad status, handler or max_rows; P0002 on an unknown task.';
REVOKE ALL ON FUNCTION switchboard.retry_runs(text, text, text, timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.retry_runs(text, text, text, timestamptz, integer) TO switchboard_app;

-- cancel_runs: cancel_run for each matching queued (or running) run, oldest first.
CREATE OR REPLACE FUNCTION switchboard.cancel_runs(status text, handler text DEFAULT NULL, task text DEFAULT NULL,
                                                   since timestamptz DEFAULT NULL, max_rows integer DEFAULT 1000)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_status text := cancel_runs.status;
    v_handler text := cancel_runs.handler;
    v_since timestamptz := cancel_runs.since;
    v_task uuid;
    v_who text := switchboard._actor();
    v_n integer;
BEGIN
    IF v_status IS NULL OR v_status NOT IN ('queued', 'running') THEN
        RAISE EXCEPTION 'invalid status "%" for a cancel', v_status USING ERRCODE = '22023',
            HINT = 'Cancel runs that have not finished: queued or running.';
    END IF;
    PERFORM switchboard._check_bulk(v_handler, max_rows);
    v_task := switchboard._run_filter_task(cancel_runs.task);
    -- The pick is a MATERIALIZED CTE, evaluated exactly once. Written as
    -- WHERE id IN (SELECT ... LIMIT max_rows FOR UPDATE) it cancelled more than max_rows
    -- runs in tests/test_operate_sql.py (a subquery the planner may execute again).
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT c.id FROM switchboard.task_runs_hot c
         WHERE c.status = v_status
           AND (v_handler IS NULL OR c.handler = v_handler)
           AND (v_task IS NULL OR c.task_id = v_task)
           AND (v_since IS NULL OR c.created_at >= v_since)
         ORDER BY c.id LIMIT max_rows FOR UPDATE
    ), gone AS (
        -- moved to history in the statement that cancels them (V0036)
        DELETE FROM switchboard.task_runs_hot r
         USING picked p
         WHERE r.id = p.id AND r.status = v_status
        RETURNING r.*
    )
    INSERT INTO switchboard.task_runs_history
    SELECT g.id, g.task_id, g.handler, g.args, 'cancelled', g.trigger, g.attempt, g.max_attempts,
           g.queueing_lock, g.run_at, g.scheduled_for, g.worker, NULL, g.started_at, now(), g.result,
           CASE WHEN g.status = 'running'
                THEN 'cancelled by ' || v_who || ' while running on ' || coalesce(g.worker, '?')
                ELSE 'cancelled by ' || v_who || ' before it started' END,
           g.retry_of, g.created_at, g.queue, g.priority
      FROM gone g
    RETURNING task_runs_history.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
        PERFORM switchboard._wake_workers();
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.cancel_runs(text, text, text, timestamptz, integer) IS
    'Cancel the matching runs of one status (queued or running; optional handler, task name or id, created since), oldest first, at most max_rows (1..10000) in one statement, as cancel_run does each: running handlers are told and stopped by their replicas. Returns the cancelled ids; call again until a call returns no row. 22023 on a bad status, handler or max_rows; P0002 on an unknown task.';
REVOKE ALL ON FUNCTION switchboard.cancel_runs(text, text, text, timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.cancel_runs(text, text, text, timestamptz, integer) TO switchboard_app;

-- lost_runs: which of the runs a worker believes it is running it no longer
-- owns (cancelled, rescued, deleted). One probe of the primary key per id; a
-- replica asks it when it hears switchboard_runs while it has runs going.
CREATE OR REPLACE FUNCTION switchboard.lost_runs(worker text, run_ids bigint[])
RETURNS TABLE (run_id bigint, status text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT x.id, r.status
      FROM unnest(lost_runs.run_ids) AS x(id)
      LEFT JOIN switchboard.task_runs r ON r.id = x.id
     WHERE r.id IS NULL OR r.status <> 'running' OR r.worker IS DISTINCT FROM lost_runs.worker
$$;
COMMENT ON FUNCTION switchboard.lost_runs(text, bigint[]) IS
    'Of run_ids, those that worker no longer owns as running (status: cancelled, abandoned, ... or NULL if the run is gone). A replica stops their handlers.';
REVOKE ALL ON FUNCTION switchboard.lost_runs(text, bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.lost_runs(text, bigint[]) TO switchboard_app;

-- pause_handler / resume_handler. A pause holds the handler's queued runs and
-- its tasks' due ticks; runs already running go on (cancel_run() them if they
-- must stop). A claim statement that started before the pause committed may
-- still take one unit of the handler's work; every claim after it does not.
-- Resuming wakes the workers: held work is claimed at once, and each held
-- task fires once for the ticks it missed (its catch-up rule).
CREATE OR REPLACE FUNCTION switchboard.pause_handler(name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_handler(pause_handler.name);
    INSERT INTO switchboard.paused_handlers (handler, paused_by) VALUES (pause_handler.name, session_user)
    ON CONFLICT (handler) DO NOTHING;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.pause_handler(text) IS
    'Hold a handler''s work: claims skip its queued runs and its tasks'' due ticks (running runs go on). True if it was not paused yet. 22023 on an invalid name. Undo with resume_handler().';
REVOKE ALL ON FUNCTION switchboard.pause_handler(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.pause_handler(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.resume_handler(name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_handler(resume_handler.name);
    DELETE FROM switchboard.paused_handlers p WHERE p.handler = resume_handler.name;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.resume_handler(text) IS
    'Release a paused handler: its held runs are claimed at once and each of its tasks fires once for the ticks it missed. True if it was paused. 22023 on an invalid name.';
REVOKE ALL ON FUNCTION switchboard.resume_handler(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.resume_handler(text) TO switchboard_app;

-- notify_admins: one event to every enabled admin, through notify_user (so it
-- is delivered iff the caller commits, and resumable). The server calls it
-- with run.updated after an operator's cancel or retry, last in the same
-- transaction (notify_* hold the event-order lock until commit: publish last).
CREATE OR REPLACE FUNCTION switchboard.notify_admins(event text, payload jsonb DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := 0;
    v_user uuid;
BEGIN
    FOR v_user IN SELECT u.id FROM switchboard.users u WHERE u.role = 'admin' AND NOT u.disabled ORDER BY u.id LOOP
        PERFORM switchboard.notify_user(v_user, notify_admins.event, notify_admins.payload);
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.notify_admins(text, jsonb) IS
    'Send one event to every enabled admin (notify_user each; delivered iff the transaction commits). Returns how many admins. Call it last in a transaction.';
REVOKE ALL ON FUNCTION switchboard.notify_admins(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_admins(text, jsonb) TO switchboard_app;

-- How many handlers are paused, for status(). PL/pgSQL: resolved when called
-- (see _tasks_broken in 20_scheduler.sql).
CREATE OR REPLACE FUNCTION switchboard._handlers_paused()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT count(*) FROM switchboard.paused_handlers);
END
$$;
REVOKE ALL ON FUNCTION switchboard._handlers_paused() FROM PUBLIC;
