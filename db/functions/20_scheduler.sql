-- Scheduler: tasks, runs, one-off jobs, leases and retries.
--
-- Every decision is one function call and one transaction. Exclusivity comes
-- from the partial unique indexes task_runs_one_active and
-- task_runs_queueing_lock (INSERT ... ON CONFLICT DO NOTHING), never from a
-- NOT EXISTS check, which is not race-free under READ COMMITTED. Workers are
-- woken by NOTIFY on channel switchboard_runs, which Postgres delivers at
-- COMMIT (and drops on ROLLBACK).

-- Next fire time of a task after `after`. @every keeps a fixed-rate anchor:
-- the next multiple of the interval after the previous due time, so a task
-- that was down for an hour fires once, on its grid, not 3,600 times.
CREATE OR REPLACE FUNCTION switchboard._task_next_fire(
    schedule text, timezone text, prev timestamptz, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_every interval := switchboard._every_interval(schedule);
    v_step double precision;
    v_n double precision;
BEGIN
    IF schedule IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_every IS NULL THEN
        RETURN switchboard.cron_next(schedule, after, timezone);
    END IF;
    IF prev IS NULL OR prev > after THEN
        RETURN coalesce(prev, after + v_every);
    END IF;
    v_step := extract(epoch FROM v_every);
    v_n := floor(extract(epoch FROM (after - prev)) / v_step) + 1;
    RETURN prev + v_every * v_n;
END
$$;
REVOKE ALL ON FUNCTION switchboard._task_next_fire(text, text, timestamptz, timestamptz) FROM PUBLIC;

-- _check_timezone lives in 10_cron.sql: the zone rule is cron_validate's.

CREATE OR REPLACE FUNCTION switchboard._check_handler(handler text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- length() and an unbounded class, not {0,127}: a bounded repeat costs the regex
    -- engine several microseconds per match, on every enqueue (BENCHMARKS.md, "Issue 33:
    -- enqueue from application code"; V0023 did the same for event labels).
    IF handler IS NULL OR length(handler) > 128 OR handler !~ '^[A-Za-z_][A-Za-z0-9_.:-]*$' THEN
        RAISE EXCEPTION 'invalid handler name "%"', left(handler, 200)
            USING ERRCODE = '22023',
                  HINT = 'A handler is a name like sql, notify, maintenance or myapp.send_mail (letters, digits, _ . : -).';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_handler(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_lease(lease interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lease IS NULL OR lease <= interval '0' OR lease > interval '1 day' THEN
        RAISE EXCEPTION 'invalid lease "%"', lease
            USING ERRCODE = '22023', HINT = 'A lease is a positive interval of at most 1 day, e.g. ''60 seconds''.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_lease(interval) FROM PUBLIC;

-- No SET clause, so the planner inlines it into the caller (see _random_128 in
-- 30_tickets.sql: a SQL function that is not inlined is planned again in every
-- transaction); the body is schema-qualified instead.
CREATE OR REPLACE FUNCTION switchboard._wake_workers()
RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_notify('switchboard_runs', '') $$;
REVOKE ALL ON FUNCTION switchboard._wake_workers() FROM PUBLIC;

-- The wait before a retry is the handler's backoff: _retry_delay() in 22_queues.sql.

-- create_task: validates everything up front so a bad schedule or zone never
-- reaches a claim. The first fire of @every is one interval from now.
CREATE OR REPLACE FUNCTION switchboard.create_task(
    name text, schedule text, handler text, args jsonb DEFAULT '{}',
    timezone text DEFAULT 'UTC', max_attempts integer DEFAULT 3)
RETURNS switchboard.tasks
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_task switchboard.tasks;
BEGIN
    IF name IS NULL OR length(btrim(name)) = 0 OR length(name) > 200 THEN
        RAISE EXCEPTION 'invalid task name "%"', name
            USING ERRCODE = '22023', HINT = 'A task name is 1 to 200 characters.';
    END IF;
    PERFORM switchboard._check_handler(handler);
    PERFORM switchboard._check_timezone(timezone);
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'task args must be a JSON object, got %', coalesce(jsonb_typeof(args), 'NULL')
            USING ERRCODE = '22023', HINT = 'Pass args as ''{"key": "value"}''::jsonb.';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'invalid max_attempts %', max_attempts
            USING ERRCODE = '22023', HINT = 'max_attempts is between 1 and 100.';
    END IF;
    IF schedule IS NOT NULL THEN
        PERFORM switchboard.cron_validate(schedule, timezone);
    END IF;
    BEGIN
        INSERT INTO switchboard.tasks AS t (name, schedule, timezone, handler, args, max_attempts, next_run_at, created_by)
        VALUES (name, schedule, timezone, handler, args, max_attempts,
                switchboard._task_next_fire(schedule, timezone, NULL, now()), session_user)
        RETURNING * INTO v_task;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'task "%" already exists', name
            USING ERRCODE = '23505', HINT = 'Task names are unique; use update_task() to change it.';
    END;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION switchboard.create_task(text, text, text, jsonb, text, integer) IS
    'Create a task. schedule: 5-field cron, @hourly/@daily/@weekly/@monthly/@yearly, "@every <interval>", or NULL (trigger-only). Raises 22023 on a bad schedule, zone, handler or args; 23505 if the name exists.';
REVOKE ALL ON FUNCTION switchboard.create_task(text, text, text, jsonb, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_task(text, text, text, jsonb, text, integer) TO switchboard_app;

-- update_task: a PATCH. Only the keys present change; next_run_at is
-- recomputed from now() when the schedule, zone or is_active changes.
CREATE OR REPLACE FUNCTION switchboard.update_task(task_id uuid, changes jsonb)
RETURNS switchboard.tasks
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task switchboard.tasks;
    v_key text;
    v_resched boolean := false;
BEGIN
    IF changes IS NULL OR jsonb_typeof(changes) <> 'object' THEN
        RAISE EXCEPTION 'changes must be a JSON object' USING ERRCODE = '22023',
            HINT = 'e.g. ''{"is_active": false}''::jsonb';
    END IF;
    FOR v_key IN SELECT jsonb_object_keys(changes) LOOP
        IF v_key NOT IN ('name', 'schedule', 'timezone', 'handler', 'args', 'is_active', 'max_attempts') THEN
            RAISE EXCEPTION 'unknown task field "%"', v_key USING ERRCODE = '22023',
                HINT = 'Changeable fields: name, schedule, timezone, handler, args, is_active, max_attempts.';
        END IF;
    END LOOP;
    SELECT * INTO v_task FROM switchboard.tasks t WHERE t.id = task_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist', task_id USING ERRCODE = 'P0002';
    END IF;
    IF changes ? 'name' THEN
        IF jsonb_typeof(changes->'name') <> 'string' OR length(btrim(changes->>'name')) = 0
           OR length(changes->>'name') > 200 THEN
            RAISE EXCEPTION 'invalid task name %', changes->'name' USING ERRCODE = '22023',
                HINT = 'A task name is 1 to 200 characters.';
        END IF;
        v_task.name := changes->>'name';
    END IF;
    IF changes ? 'schedule' THEN
        IF jsonb_typeof(changes->'schedule') NOT IN ('string', 'null') THEN
            RAISE EXCEPTION 'invalid schedule %', changes->'schedule' USING ERRCODE = '22023';
        END IF;
        v_task.schedule := changes->>'schedule';
        v_resched := true;
    END IF;
    IF changes ? 'timezone' THEN
        v_task.timezone := changes->>'timezone';
        PERFORM switchboard._check_timezone(v_task.timezone);
        v_resched := true;
    END IF;
    IF changes ? 'handler' THEN
        v_task.handler := changes->>'handler';
        PERFORM switchboard._check_handler(v_task.handler);
    END IF;
    IF changes ? 'args' THEN
        IF jsonb_typeof(changes->'args') <> 'object' THEN
            RAISE EXCEPTION 'task args must be a JSON object, got %', jsonb_typeof(changes->'args')
                USING ERRCODE = '22023';
        END IF;
        v_task.args := changes->'args';
    END IF;
    IF changes ? 'is_active' THEN
        IF jsonb_typeof(changes->'is_active') <> 'boolean' THEN
            RAISE EXCEPTION 'is_active must be true or false, got %', changes->'is_active' USING ERRCODE = '22023';
        END IF;
        v_resched := v_resched OR (v_task.is_active IS DISTINCT FROM (changes->>'is_active')::boolean);
        v_task.is_active := (changes->>'is_active')::boolean;
    END IF;
    IF changes ? 'max_attempts' THEN
        IF jsonb_typeof(changes->'max_attempts') <> 'number'
           OR (changes->>'max_attempts')::numeric NOT BETWEEN 1 AND 100
           OR (changes->>'max_attempts')::numeric % 1 <> 0 THEN
            RAISE EXCEPTION 'invalid max_attempts %', changes->'max_attempts' USING ERRCODE = '22023',
                HINT = 'max_attempts is between 1 and 100.';
        END IF;
        v_task.max_attempts := (changes->>'max_attempts')::integer;
    END IF;
    IF v_task.schedule IS NOT NULL THEN
        PERFORM switchboard.cron_validate(v_task.schedule, v_task.timezone);
    END IF;
    IF v_resched THEN
        v_task.next_run_at := switchboard._task_next_fire(v_task.schedule, v_task.timezone, NULL, now());
    END IF;
    BEGIN
        UPDATE switchboard.tasks t
           SET name = v_task.name, schedule = v_task.schedule, timezone = v_task.timezone,
               handler = v_task.handler, args = v_task.args, is_active = v_task.is_active,
               max_attempts = v_task.max_attempts, next_run_at = v_task.next_run_at, updated_at = now(),
               last_error = CASE WHEN v_resched THEN NULL ELSE t.last_error END,
               last_error_at = CASE WHEN v_resched THEN NULL ELSE t.last_error_at END
         WHERE t.id = task_id
        RETURNING * INTO v_task;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'task "%" already exists', v_task.name USING ERRCODE = '23505';
    END;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION switchboard.update_task(uuid, jsonb) IS
    'Change a task: pass only the fields to change, e.g. ''{"is_active": false}'' pauses it. Raises P0002 if the task does not exist, 22023 on bad values.';
REVOKE ALL ON FUNCTION switchboard.update_task(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.update_task(uuid, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.delete_task(task_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.tasks t WHERE t.id = task_id;   -- its hot runs go by the foreign key
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN   -- an older target (pgmigrate -t N)
        RETURN true;
    END IF;
    -- Its finished runs (V0036: history has no foreign key, see V0036). After the task's
    -- DELETE, which waited for any finish of its runs: a new snapshot sees those too.
    DELETE FROM switchboard.task_runs_history h WHERE h.task_id = delete_task.task_id;
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.delete_task(uuid) IS
    'Delete a task and its run history. Returns false if there was no such task.';
REVOKE ALL ON FUNCTION switchboard.delete_task(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.delete_task(uuid) TO switchboard_app;

-- One retry rule for both ways a run can fail (lease expired, handler
-- failed): while attempts remain, a new queued run with attempt + 1 replaces
-- it, not before run_at, in the same queue with the same priority. Returns
-- whether a retry was queued.
CREATE OR REPLACE FUNCTION switchboard._queue_retry(run switchboard.task_runs, run_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF run.attempt >= run.max_attempts THEN
        RETURN false;
    END IF;
    INSERT INTO switchboard.task_runs_hot
        (task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock,
         run_at, scheduled_for, retry_of, queue, priority)
    VALUES (run.task_id, run.handler, run.args, 'queued', 'retry', run.attempt + 1,
            run.max_attempts, run.queueing_lock, _queue_retry.run_at, run.scheduled_for, run.id,
            run.queue, run.priority)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
REVOKE ALL ON FUNCTION switchboard._queue_retry(switchboard.task_runs, timestamptz) FROM PUBLIC;

-- Expired leases -> abandoned (terminal) + a queued retry while attempts
-- remain. SKIP LOCKED so concurrent rescuers never block each other or a
-- worker that is finishing the same run right now.
CREATE OR REPLACE FUNCTION switchboard._rescue_expired_runs(max_rows integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run switchboard.task_runs;
    v_count integer := 0;
    v_retried integer := 0;
BEGIN
    -- The run moves to history in the statement that abandons it (V0036).
    FOR v_run IN
        WITH gone AS (
            DELETE FROM switchboard.task_runs_hot r
             WHERE r.id IN (SELECT e.id FROM switchboard.task_runs_hot e
                             WHERE e.status = 'running' AND e.lease_expires_at < now()
                             ORDER BY e.lease_expires_at LIMIT max_rows
                             FOR UPDATE SKIP LOCKED)
               AND r.status = 'running'
            RETURNING r.*)
        INSERT INTO switchboard.task_runs_history
        SELECT g.id, g.task_id, g.handler, g.args, 'abandoned', g.trigger, g.attempt, g.max_attempts,
               g.queueing_lock, g.run_at, g.scheduled_for, g.worker, g.lease_expires_at, g.started_at,
               now(), g.result, 'lease expired: worker ' || coalesce(g.worker, '?') || ' stopped heartbeating',
               g.retry_of, g.created_at, g.queue, g.priority
          FROM gone g
        RETURNING *
    LOOP
        v_count := v_count + 1;
        IF switchboard._queue_retry(v_run, now()) THEN
            v_retried := v_retried + 1;
        END IF;
    END LOOP;
    IF v_retried > 0 THEN
        PERFORM switchboard._wake_workers();
    END IF;
    RETURN v_count;
END
$$;
REVOKE ALL ON FUNCTION switchboard._rescue_expired_runs(integer) FROM PUBLIC;

-- _claim_tick: the tick half of claim_due_task. Takes the oldest due task
-- (FOR UPDATE SKIP LOCKED), advances its next_run_at and creates its running
-- run in the same transaction: a crash after COMMIT leaves both, a crash
-- before leaves neither. Outcomes:
--   run set                   the tick was claimed;
--   run NULL, skipped true    a due task was handled without a run: it still
--                             had an active run (the tick is counted in
--                             skipped_ticks, never run concurrently), or its
--                             next fire time could not be computed (parked,
--                             see below), or it was a parked task that is
--                             healthy again; more may be due, look again;
--   run NULL, skipped false   nothing due that another worker has not locked.
-- One bad row cannot stop the scheduler: an error while computing the next
-- fire time (a zone typed by hand, a schedule that never fires, an anchor at
-- -infinity) is caught here, in a subtransaction entered only on the tick
-- path, and the task is parked: no run, next_run_at = now + 1 minute,
-- last_error set. When a parked task comes due again it is re-checked: still
-- broken, it stays parked; fixed (even by a plain UPDATE), it goes back on its
-- schedule from now without a run at the re-check instant.
CREATE OR REPLACE FUNCTION switchboard._claim_tick(
    worker text, lease interval, claim_at timestamptz,
    OUT run switchboard.task_runs, OUT skipped boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_task switchboard.tasks;
    v_due timestamptz;
    v_next timestamptz;
    v_err text;
    v_state text;
BEGIN
    skipped := false;
    SELECT * INTO v_task FROM switchboard.tasks t
     WHERE t.is_active AND t.next_run_at <= _claim_tick.claim_at
       AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
     ORDER BY t.next_run_at LIMIT 1 FOR UPDATE OF t SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    skipped := true;
    -- A due time before 1970 (-infinity, a BC date) is a hand-made "run now":
    -- the tick is due now, and no client has to read a timestamp it cannot
    -- represent (psycopg refuses dates before year 1).
    v_due := CASE WHEN v_task.next_run_at >= timestamptz '1970-01-01 00:00:00+00'
                  THEN v_task.next_run_at ELSE _claim_tick.claim_at END;
    BEGIN
        -- A parked task is re-anchored from now (prev NULL), like update_task does.
        v_next := switchboard._task_next_fire(
            v_task.schedule, v_task.timezone,
            CASE WHEN v_task.last_error IS NULL THEN v_due END, _claim_tick.claim_at);
    EXCEPTION WHEN OTHERS THEN  -- not query_canceled: a cancel still cancels
        GET STACKED DIAGNOSTICS v_err = MESSAGE_TEXT, v_state = RETURNED_SQLSTATE;
        UPDATE switchboard.tasks
           SET next_run_at = _claim_tick.claim_at + interval '1 minute',
               last_error = left(format('next fire time of schedule %L in zone %L: %s (SQLSTATE %s)',
                                        v_task.schedule, v_task.timezone, v_err, v_state), 2000),
               last_error_at = now()
         WHERE id = v_task.id;
        RETURN;
    END;
    IF v_task.last_error IS NOT NULL THEN
        UPDATE switchboard.tasks SET next_run_at = v_next, last_error = NULL, last_error_at = NULL
         WHERE id = v_task.id;
        RETURN;
    END IF;
    UPDATE switchboard.tasks SET next_run_at = v_next WHERE id = v_task.id;
    INSERT INTO switchboard.task_runs_hot
        (task_id, handler, args, status, trigger, attempt, max_attempts,
         run_at, scheduled_for, worker, lease_expires_at, started_at)
    VALUES (v_task.id, v_task.handler, v_task.args, 'running', 'schedule', 1,
            v_task.max_attempts, v_due, v_due,
            _claim_tick.worker, _claim_tick.claim_at + _claim_tick.lease, _claim_tick.claim_at)
    ON CONFLICT (task_id) WHERE status IN ('queued', 'running') AND task_id IS NOT NULL DO NOTHING
    RETURNING * INTO run;
    IF FOUND THEN
        skipped := false;
        RETURN;
    END IF;
    -- The task still has an active run: skip this tick, never overlap.
    UPDATE switchboard.tasks SET skipped_ticks = skipped_ticks + 1 WHERE id = v_task.id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._claim_tick(text, interval, timestamptz) FROM PUBLIC;

-- How many tasks are parked (see _claim_tick), for status(). PL/pgSQL so that
-- its body is not resolved when it is created: the function files are applied
-- at HEAD even when pgmigrate targets an older version (-t 1), whose schema
-- has no last_error column; a LANGUAGE sql status() naming it would fail there.
CREATE OR REPLACE FUNCTION switchboard._tasks_broken()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT count(*) FROM switchboard.tasks WHERE last_error IS NOT NULL);
END
$$;
REVOKE ALL ON FUNCTION switchboard._tasks_broken() FROM PUBLIC;

-- claim_due_task: one unit of work of the default queue per call, oldest due
-- first across queued runs and due ticks (a backlog of jobs cannot starve cron
-- ticks, and vice versa); among queued runs the highest priority goes first
-- (V0030: the head is read from task_runs_ready, queue = 'default'). Task runs
-- and ticks are always in the default queue; named queues are claimed by
-- claim_due_tasks(worker, lease, queues, slots) (25_batch_claim.sql). Rows are taken with FOR UPDATE SKIP LOCKED, so N workers never
-- block on or double-claim the same row. Expired leases are rescued here
-- first, so a stuck maintenance run cannot block its own rescue. Each round:
--   1. the due tick, if it is the oldest due work (_claim_tick);
--   2. the queue head (the hot path: one UPDATE, no helper call);
--   3. the due tick, if the queue head was older but locked by others.
-- Before the rounds (V0017), the hot path: the queue head in one UPDATE gated
-- by "no expired lease and no due tick", the common case of a job backlog;
-- when the gate is closed or nothing is queued the rounds below decide.
-- A paused handler's queued runs and due ticks are passed over: "handler <>
-- ALL (ARRAY(SELECT ... FROM paused_handlers))" is an InitPlan, read once per
-- statement, and a plain filter on the index scan that keeps the claim's
-- ordered, LIMITed walk. (A NOT EXISTS anti-join here made the generic plan a
-- hash anti-join over every due queued row plus a sort: each claim's cost grew
-- with the backlog.) A tick passed over keeps
-- its next_run_at, so when the handler is resumed the task catches up by its
-- own rule: once, not once per missed tick; @every keeps its anchor.
-- A round that only skipped ticks looks again, since more may be due; a
-- round that found everything locked by other workers stops. The bound (32
-- rounds) only matters when that many ticks are skipped or parked at once:
-- the call then returns no row and the next one carries on.
-- enable_seqscan = off (V0015): every statement here reads the head of an
-- index (task_runs_ready, task_runs_running, tasks_due, the keys). PL/pgSQL
-- caches a generic plan per session; when it is re-made after the queue was
-- analyzed empty (autovacuum on an idle queue, then a burst), the planner
-- believes task_runs holds no row and picks a sequential scan, and every
-- claim reads the whole queue until the next autoanalyze: several times the
-- PostgreSQL CPU per job in bench/profile_jobs.py (BENCHMARKS.md "3b, December
-- 2026"; off: as with fresh statistics). An index always exists
-- for these reads, so the setting only removes the wrong choice.
-- enable_bitmapscan = off (V0015): the paused-handler filter "handler <> ALL
-- (...)" is estimated from the handler column's statistics; when the backlog is
-- one handler (the common case: n_distinct = 1), "<>" looks like it keeps no
-- row, the planner expects one row and picks a bitmap scan of every due queued
-- run plus a sort over them instead of the ordered, LIMITed index walk, whose
-- cost grows with the backlog (bench/sql.py figure 3a collapsed against plain
-- SQL: BENCHMARKS.md "c23"). Without bitmap scans the only index path left is
-- that walk, which reads one entry.
-- (q.handler || '') <> ALL (...) (V0030): the same estimate again, once the
-- head is read in (priority DESC, run_at, id) order. "handler <> ALL" estimated
-- from a one-handler backlog's statistics keeps one row, so task_runs_queued
-- (run_at) plus a sort of every due run looked as cheap as the ordered walk of
-- task_runs_ready (a sort growing with the backlog against one entry read). The expression has no
-- statistics: the planner uses its default selectivity (most rows kept) and
-- walks task_runs_ready. tests/test_batch_claim.py counts the buffers.
-- enable_sort = off (V0030): the estimate that still misleads is the table's own.
-- After an ANALYZE of a task_runs whose runs had nearly all finished (autoanalyze
-- between bursts; bench/queues_ab.py --analyzed-history), the planner believes about
-- one run is queued: reading every due run through task_runs_queued and sorting them
-- by (priority DESC, run_at, id) then looks as cheap as the ordered walk, and a claim
-- read the whole backlog (BENCHMARKS.md, "Issue 33: queues and priorities in the
-- drain"). Every claim statement has an index that gives its order, so the setting
-- only removes the wrong choice, as the two above do.
CREATE OR REPLACE FUNCTION switchboard.claim_due_task(worker text, lease interval DEFAULT '60 seconds')
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
    v_worker text := claim_due_task.worker;
    v_lease interval := claim_due_task.lease;
    v_run switchboard.task_runs;
    v_tick record;
    v_queued_at timestamptz;
    v_task_at timestamptz;
    v_tick_first boolean;
    v_skipped boolean;
    v_expired boolean;
BEGIN
    IF v_worker IS NULL OR length(v_worker) = 0 OR length(v_worker) > 200 THEN
        RAISE EXCEPTION 'invalid worker name "%"', v_worker USING ERRCODE = '22023',
            HINT = 'Worker names are unique per process, e.g. host:pid:random.';
    END IF;
    IF v_lease IS NULL OR v_lease <= interval '0' OR v_lease > interval '1 day' THEN
        PERFORM switchboard._check_lease(v_lease);  -- raises (the test is inlined: hot path)
    END IF;

    -- The hot path (V0017): the queue head in one statement, taken only when
    -- nothing else comes first: no lease to rescue and no due tick (a due tick
    -- goes through the ordered rounds below, which compare it with the head).
    -- The two NOT EXISTS are uncorrelated: a one-time filter evaluated before
    -- the head is looked at, so a closed gate locks nothing. One statement
    -- instead of the check below plus the UPDATE (bench/sql.py --floor, see
    -- BENCHMARKS.md "c23").
    UPDATE switchboard.task_runs_hot
       SET status = 'running', worker = v_worker, lease_expires_at = v_now + v_lease,
           started_at = v_now
     WHERE id = (SELECT q.id FROM switchboard.task_runs_hot q
                  WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= v_now
                    AND (q.handler || '') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                  ORDER BY q.priority DESC, q.run_at, q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
       AND NOT EXISTS (SELECT 1 FROM switchboard.task_runs_hot e
                        WHERE e.status = 'running' AND e.lease_expires_at < v_now)
       AND NOT EXISTS (SELECT 1 FROM switchboard.tasks t
                        WHERE t.is_active AND t.next_run_at <= v_now
                          AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p)))
    RETURNING * INTO v_run;
    IF FOUND THEN
        RETURN NEXT v_run;
        RETURN;
    END IF;

    -- One statement answers both: is a lease to rescue, is a tick due?
    SELECT EXISTS (SELECT 1 FROM switchboard.task_runs_hot
                    WHERE status = 'running' AND lease_expires_at < v_now),
           (SELECT t.next_run_at FROM switchboard.tasks t
             WHERE t.is_active AND t.next_run_at <= v_now
               AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY t.next_run_at LIMIT 1)
      INTO v_expired, v_task_at;
    IF v_expired THEN
        PERFORM switchboard._rescue_expired_runs(100);
    END IF;

    FOR v_round IN 1..32 LOOP
        IF v_round > 1 THEN
            SELECT t.next_run_at INTO v_task_at FROM switchboard.tasks t
             WHERE t.is_active AND t.next_run_at <= v_now
               AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY t.next_run_at LIMIT 1;
        END IF;
        -- The queue's head is only worth a look of its own when a tick competes
        -- with it; otherwise the claim in step 2 is the only scan of the head.
        v_queued_at := NULL;
        IF v_task_at IS NOT NULL THEN
            SELECT q.run_at INTO v_queued_at FROM switchboard.task_runs_hot q
             WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= v_now
               AND (q.handler || '') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY q.priority DESC, q.run_at, q.id LIMIT 1;
        END IF;
        v_tick_first := v_task_at IS NOT NULL AND (v_queued_at IS NULL OR v_task_at <= v_queued_at);
        v_skipped := false;

        -- 1. the due tick, when it is the oldest due work
        IF v_tick_first THEN
            SELECT t.run, t.skipped INTO v_tick FROM switchboard._claim_tick(v_worker, v_lease, v_now) t;
            IF (v_tick.run).id IS NOT NULL THEN
                RETURN NEXT v_tick.run;
                RETURN;
            END IF;
            v_skipped := v_tick.skipped;
        END IF;

        -- 2. the queue head
        IF v_queued_at IS NOT NULL OR v_task_at IS NULL THEN
            UPDATE switchboard.task_runs_hot
               SET status = 'running', worker = v_worker, lease_expires_at = v_now + v_lease,
                   started_at = v_now
             WHERE id = (SELECT q.id FROM switchboard.task_runs_hot q
                          WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= v_now
                            AND (q.handler || '') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                          ORDER BY q.priority DESC, q.run_at, q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
            RETURNING * INTO v_run;
            IF FOUND THEN
                RETURN NEXT v_run;
                RETURN;
            END IF;
        END IF;

        -- 3. the due tick, when an older queued run was there but taken by others
        IF v_task_at IS NOT NULL AND NOT v_tick_first THEN
            SELECT t.run, t.skipped INTO v_tick FROM switchboard._claim_tick(v_worker, v_lease, v_now) t;
            IF (v_tick.run).id IS NOT NULL THEN
                RETURN NEXT v_tick.run;
                RETURN;
            END IF;
            v_skipped := v_tick.skipped;
        END IF;

        -- Nothing claimed. Look again only if a tick was skipped (more may be due);
        -- otherwise everything due is locked by other workers.
        EXIT WHEN NOT v_skipped;
    END LOOP;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_task(text, interval) IS
    'Claim at most one unit of work of the default queue (a queued run, highest priority first, or a due task tick; oldest due first) for worker, leased until now() + lease. FOR UPDATE SKIP LOCKED: concurrent workers never get the same run. A task whose next fire time cannot be computed is skipped and marked (tasks.last_error, status() tasks_broken). Work of a paused handler (pause_handler()) is skipped. Returns no row when nothing is due.';
REVOKE ALL ON FUNCTION switchboard.claim_due_task(text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.claim_due_task(text, interval) TO switchboard_app;

-- create_run_exclusive: the unique partial index task_runs_one_active decides.
-- A concurrent INSERT waits for the other transaction and then does nothing.
CREATE OR REPLACE FUNCTION switchboard.create_run_exclusive(task_id uuid, trigger text DEFAULT 'manual')
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id uuid := create_run_exclusive.task_id;
    v_trigger text := coalesce(create_run_exclusive.trigger, 'manual');
    v_run switchboard.task_runs;
BEGIN
    IF v_trigger !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'invalid trigger "%"', v_trigger USING ERRCODE = '22023',
            HINT = 'A trigger is a short label such as manual or api.';
    END IF;
    INSERT INTO switchboard.task_runs_hot (task_id, handler, args, status, trigger, max_attempts, run_at)
    SELECT t.id, t.handler, t.args, 'queued', v_trigger, t.max_attempts, now()
      FROM switchboard.tasks t WHERE t.id = v_id
    ON CONFLICT (task_id) WHERE status IN ('queued', 'running') AND task_id IS NOT NULL DO NOTHING
    RETURNING * INTO v_run;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN NEXT v_run;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.tasks t WHERE t.id = v_id) THEN
        RAISE EXCEPTION 'task % does not exist', v_id USING ERRCODE = 'P0002',
            HINT = 'See SELECT id, name FROM switchboard.tasks;';
    END IF;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.create_run_exclusive(uuid, text) IS
    'Queue a run of a task iff it has no queued or running run (enforced by a unique partial index); returns the run, or no row if one is already active. Workers are woken at COMMIT. P0002 if the task does not exist.';
REVOKE ALL ON FUNCTION switchboard.create_run_exclusive(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_run_exclusive(uuid, text) TO switchboard_app;

-- enqueue: transactional. The job is a row in the caller's transaction, so it
-- exists iff that transaction commits; the wake-up NOTIFY is sent at COMMIT.
-- max_attempts, priority and queue default to the handler's options
-- (switchboard.handler_options, 22_queues.sql), then to 3, 0 and 'default'.
-- A handler name no replica has registered is accepted (its code may deploy
-- after the job is queued; `switchboard enqueue` checks live replicas first);
-- a queue nothing serves is refused, since its job would wait forever.
CREATE OR REPLACE FUNCTION switchboard.enqueue(
    handler text, args jsonb DEFAULT '{}', run_at timestamptz DEFAULT now(),
    queueing_lock text DEFAULT NULL, max_attempts integer DEFAULT NULL,
    priority integer DEFAULT NULL, queue text DEFAULT NULL)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_run switchboard.task_runs;
    -- the handler's options as scalars: no variable of handler_options' type (V0030),
    -- which does not exist at an older migration target the function files load at
    v_opt_attempts integer;
    v_opt_priority integer;
    v_opt_queue text;
    v_attempts integer;
    v_priority integer;
    v_queue text;
BEGIN
    PERFORM switchboard._check_handler(enqueue.handler);
    IF enqueue.args IS NULL OR jsonb_typeof(enqueue.args) <> 'object' THEN
        RAISE EXCEPTION 'job args must be a JSON object, got %', coalesce(jsonb_typeof(enqueue.args), 'NULL')
            USING ERRCODE = '22023', HINT = 'Pass args as ''{"key": "value"}''::jsonb.';
    END IF;
    IF enqueue.queueing_lock IS NOT NULL AND length(enqueue.queueing_lock) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid queueing_lock "%"', enqueue.queueing_lock USING ERRCODE = '22023',
            HINT = 'A queueing lock is 1 to 200 characters.';
    END IF;
    SELECT o.max_attempts, o.priority, o.queue INTO v_opt_attempts, v_opt_priority, v_opt_queue
      FROM switchboard.handler_options o WHERE o.handler = enqueue.handler;
    v_attempts := coalesce(enqueue.max_attempts, v_opt_attempts, 3);
    IF v_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'invalid max_attempts %', v_attempts
            USING ERRCODE = '22023', HINT = 'max_attempts is between 1 and 100.';
    END IF;
    v_priority := coalesce(enqueue.priority, v_opt_priority, 0);
    IF v_priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'invalid priority %', v_priority USING ERRCODE = '22023',
            HINT = 'priority is between -100 and 100; a higher priority is claimed first within its queue.';
    END IF;
    v_queue := coalesce(enqueue.queue, v_opt_queue, 'default');
    IF enqueue.queue IS NOT NULL AND v_queue IS DISTINCT FROM v_opt_queue AND v_queue <> 'default' THEN
        PERFORM switchboard._check_queue(v_queue);
        IF NOT EXISTS (SELECT 1 FROM switchboard.handler_options o WHERE o.queue = v_queue) THEN
            RAISE EXCEPTION 'queue "%" does not exist', v_queue USING ERRCODE = '22023',
                HINT = 'A queue exists when a handler''s options name it (SELECT DISTINCT queue FROM switchboard.handler_options) or it is default; replicas serve it with the slots SWITCHBOARD_QUEUES gives.';
        END IF;
    END IF;
    INSERT INTO switchboard.task_runs_hot
        (task_id, handler, args, status, trigger, max_attempts, queueing_lock, run_at, queue, priority)
    VALUES (NULL, enqueue.handler, enqueue.args, 'queued', 'enqueue', v_attempts,
            enqueue.queueing_lock, coalesce(enqueue.run_at, now()), v_queue, v_priority)
    ON CONFLICT (queueing_lock) WHERE status IN ('queued', 'running') AND queueing_lock IS NOT NULL
    DO NOTHING
    RETURNING * INTO v_run;
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN NEXT v_run;
    END IF;
    RETURN;
END
$$;
COMMENT ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer, integer, text) IS
    'Enqueue a one-off job in the caller''s transaction (it exists iff the transaction commits; workers are woken at COMMIT), not due before run_at. max_attempts, priority (-100..100, higher first) and queue default to the handler''s options (handler_options), else 3, 0 and default; a queue no handler names is refused (22023). With a queueing_lock, at most one queued-or-running job holds it: a second enqueue returns no row.';
REVOKE ALL ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer, integer, text) TO switchboard_app;

-- heartbeat_run / finish_run / release_run are fenced on (run, worker,
-- running): a worker whose lease expired and whose run was rescued cannot
-- touch the rescued run.
CREATE OR REPLACE FUNCTION switchboard.heartbeat_run(run_id bigint, worker text, lease interval DEFAULT '60 seconds')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM switchboard._check_lease(heartbeat_run.lease);
    UPDATE switchboard.task_runs_hot SET lease_expires_at = now() + heartbeat_run.lease
     WHERE id = heartbeat_run.run_id AND worker = heartbeat_run.worker AND status = 'running';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.heartbeat_run(bigint, text, interval) IS
    'Extend the lease of a running run to now() + lease. False (and nothing changed) if worker no longer owns the run.';
REVOKE ALL ON FUNCTION switchboard.heartbeat_run(bigint, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.heartbeat_run(bigint, text, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.finish_run(
    run_id bigint, worker text, ok boolean, result jsonb DEFAULT NULL, error text DEFAULT NULL,
    retry boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_run switchboard.task_runs;
BEGIN
    IF finish_run.ok IS NULL OR finish_run.retry IS NULL THEN
        RAISE EXCEPTION 'ok and retry must be true or false' USING ERRCODE = '22023';
    END IF;
    -- The run moves to history in the statement that finishes it (V0036): DELETE from
    -- the hot table (fenced on worker and status, as the UPDATE was), INSERT what it
    -- returned. A concurrent finish, cancel or rescue of the same run waits for the
    -- row lock and then finds the row gone: 0 rows, false, as before.
    -- Success needs nothing back from the row (V0017): no RETURNING * into a
    -- record, which only a retry (below) reads.
    IF finish_run.ok THEN
        WITH gone AS (
            DELETE FROM switchboard.task_runs_hot r
             WHERE r.id = finish_run.run_id AND r.worker = finish_run.worker AND r.status = 'running'
            RETURNING r.*)
        INSERT INTO switchboard.task_runs_history
        SELECT g.id, g.task_id, g.handler, g.args, 'succeeded', g.trigger, g.attempt, g.max_attempts,
               g.queueing_lock, g.run_at, g.scheduled_for, g.worker, NULL, g.started_at,
               now(), finish_run.result, left(finish_run.error, 10000), g.retry_of, g.created_at, g.queue, g.priority
          FROM gone g;
        RETURN FOUND;
    END IF;
    WITH gone AS (
        DELETE FROM switchboard.task_runs_hot r
         WHERE r.id = finish_run.run_id AND r.worker = finish_run.worker AND r.status = 'running'
        RETURNING r.*)
    INSERT INTO switchboard.task_runs_history
    SELECT g.id, g.task_id, g.handler, g.args, 'failed', g.trigger, g.attempt, g.max_attempts,
           g.queueing_lock, g.run_at, g.scheduled_for, g.worker, NULL, g.started_at,
           now(), finish_run.result, left(finish_run.error, 10000), g.retry_of, g.created_at, g.queue, g.priority
      FROM gone g
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF finish_run.retry
       AND switchboard._queue_retry(v_run, now() + switchboard._retry_delay(v_run.handler, v_run.attempt)) THEN
        PERFORM switchboard._wake_workers();
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.finish_run(bigint, text, boolean, jsonb, text, boolean) IS
    'Record a run''s outcome. A failed run with attempts left is retried as a new queued run (same queue and priority) after its handler''s backoff (handler_options: least(cap, base * 2^attempt) less up to jitter of it; 2^attempt seconds capped at 1 hour by default); retry = false fails it for good (a failure no retry can fix). False (and nothing changed) if worker no longer owns the run.';
REVOKE ALL ON FUNCTION switchboard.finish_run(bigint, text, boolean, jsonb, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.finish_run(bigint, text, boolean, jsonb, text, boolean) TO switchboard_app;

-- release_run: graceful hand-back on shutdown. The run goes back to queued
-- (same attempt) and workers are woken, so another replica takes it at once
-- instead of waiting for the lease to expire.
CREATE OR REPLACE FUNCTION switchboard.release_run(run_id bigint, worker text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE switchboard.task_runs_hot
       SET status = 'queued', worker = NULL, lease_expires_at = NULL, started_at = NULL, run_at = now()
     WHERE id = release_run.run_id AND worker = release_run.worker AND status = 'running';
    IF FOUND THEN
        PERFORM switchboard._wake_workers();
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.release_run(bigint, text) IS
    'Hand a running run back (shutdown): it becomes queued again, same attempt, and another worker can claim it at once. False if worker no longer owns it.';
REVOKE ALL ON FUNCTION switchboard.release_run(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.release_run(bigint, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_expired_runs()
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_total integer := 0;
    v_n integer;
BEGIN
    LOOP
        v_n := switchboard._rescue_expired_runs(1000);
        v_total := v_total + v_n;
        EXIT WHEN v_n < 1000;
    END LOOP;
    RETURN v_total;
END
$$;
COMMENT ON FUNCTION switchboard.reap_expired_runs() IS
    'Mark running runs whose lease expired as abandoned; while attempts remain, queue a new run with attempt + 1. Returns how many were abandoned.';
REVOKE ALL ON FUNCTION switchboard.reap_expired_runs() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_expired_runs() TO switchboard_app;

-- cancel_run, retry_run, pause_handler / resume_handler: db/functions/27_operate.sql.

-- reap_runs (retention of finished runs): db/functions/21_runs_history.sql.
