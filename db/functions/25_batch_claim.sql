-- Batched claim and finish: what a replica with k free slots asks for in one
-- round trip, and how it records k successes in one.
--
-- End to end, a job costs two round trips (claim, finish) and the server
-- CPU of two function calls; with short handlers that, not scheduling, is the
-- limit (py-spy: most of a replica's time in the claim and finish round trips;
-- BENCHMARKS.md "3b: jobs drained per second vs procrastinate").
-- claim_due_tasks() takes the first unit through claim_due_task()
-- (oldest due first across ticks and queued runs, lease rescue, tick
-- skipping), then fills the remaining slots with further queued runs in one
-- UPDATE over FOR UPDATE SKIP LOCKED, so concurrent replicas still never get
-- the same run. finish_runs() records successes only; a failure goes through
-- finish_run(), which schedules its retry. Both stay fenced on
-- (run, worker, running).
-- enable_seqscan = off, enable_bitmapscan = off (V0015): as claim_due_task (20_scheduler.sql), whose
-- comment says why; the batch's head read is the same kind of statement.
--
-- V0018, the common case in one statement: when no lease has expired and no
-- task tick is due before the queue's head, claim_due_task() would only take
-- the queue's head, and the fill below the next max_runs - 1 runs of the same
-- ordered walk; one UPDATE ... LIMIT max_runs takes the same runs. That skips a
-- nested SECURITY DEFINER call (its SET clauses, its checks, its own UPDATE)
-- per batch, a sizeable share of the PostgreSQL CPU per drained job
-- (bench/profile_jobs.py --pgss, pg_stat_user_functions; BENCHMARKS.md "j23"). The probes are
-- claim_due_task's own (expired lease: status = 'running' AND lease_expires_at
-- < now; oldest due tick: active, next_run_at <= now, handler not paused; the
-- queue head's run_at, read only when a tick is due) and so is the rule: the
-- queue goes first when its head is strictly older than the tick. A tick due
-- during a long drain is thus no reason to leave the fast path while older
-- queued runs remain (a third of a 20,000-job drain's claims did, behind the
-- 10-second maintenance tick). An expired lease, a tick due first, an invalid
-- argument (claim_due_task raises its own error), or a tick behind a queue
-- whose due runs are all locked: the first unit goes through claim_due_task()
-- exactly as before.
CREATE OR REPLACE FUNCTION switchboard.claim_due_tasks(
    worker text, lease interval DEFAULT '60 seconds', max_runs integer DEFAULT 1)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
DECLARE
    v_first switchboard.task_runs;
    v_now timestamptz := now();
    v_task_at timestamptz;
    v_queued_at timestamptz;
    v_fast boolean := false;
    -- Dynamic, so planned at each call (see the comment above finish_runs): the oldest
    -- $4 due queued runs of unpaused handlers, leased to $1 from $2 for $3.
    v_take constant text := 'UPDATE switchboard.task_runs_hot r
           SET status = ''running'', worker = $1, lease_expires_at = $2 + $3, started_at = $2
         WHERE r.id = ANY (ARRAY(SELECT q.id FROM switchboard.task_runs_hot q
                                  WHERE q.status = ''queued'' AND q.queue = ''default'' AND q.run_at <= $2
                                    AND (q.handler || '''') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                                  ORDER BY q.priority DESC, q.run_at, q.id
                                  LIMIT $4 FOR UPDATE OF q SKIP LOCKED))
        RETURNING r.*';
BEGIN
    IF max_runs IS NULL OR max_runs < 1 OR max_runs > 1000 THEN
        RAISE EXCEPTION 'invalid max_runs %', max_runs USING ERRCODE = '22023',
            HINT = 'max_runs is how many free slots the worker has: 1 to 1000.';
    END IF;
    IF claim_due_tasks.worker IS NOT NULL AND length(claim_due_tasks.worker) BETWEEN 1 AND 200
       AND claim_due_tasks.lease > interval '0' AND claim_due_tasks.lease <= interval '1 day'
       AND NOT EXISTS (SELECT 1 FROM switchboard.task_runs_hot e
                        WHERE e.status = 'running' AND e.lease_expires_at < v_now)
    THEN
        v_fast := true;
        SELECT t.next_run_at INTO v_task_at FROM switchboard.tasks t
         WHERE t.is_active AND t.next_run_at <= v_now
           AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
         ORDER BY t.next_run_at LIMIT 1;
        IF v_task_at IS NOT NULL THEN
            SELECT q.run_at INTO v_queued_at FROM switchboard.task_runs_hot q
             WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= v_now
               AND (q.handler || '') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY q.priority DESC, q.run_at, q.id LIMIT 1;
        END IF;
    END IF;
    IF v_fast AND (v_task_at IS NULL OR v_queued_at < v_task_at) THEN
        RETURN QUERY EXECUTE v_take USING claim_due_tasks.worker, v_now, claim_due_tasks.lease, max_runs;
        -- With a due tick behind the queue head, claim_due_task takes the tick when every
        -- older queued run is locked by other workers: so does the slow path below.
        IF FOUND OR v_task_at IS NULL THEN
            RETURN;
        END IF;
    END IF;
    SELECT * INTO v_first FROM switchboard.claim_due_task(claim_due_tasks.worker, claim_due_tasks.lease);
    IF NOT FOUND OR v_first.id IS NULL THEN
        RETURN;
    END IF;
    RETURN NEXT v_first;
    IF max_runs > 1 THEN
        RETURN QUERY EXECUTE v_take USING claim_due_tasks.worker, v_now, claim_due_tasks.lease, max_runs - 1;
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) IS
    'Claim up to max_runs units of work of the default queue in one call: the first as claim_due_task() claims it (oldest due first, ticks included, expired leases rescued), the rest from the default queue''s runs, highest priority first (FOR UPDATE SKIP LOCKED). When no lease has expired and no tick is due, all of them are the oldest due queued runs, taken in one statement. Paused handlers (pause_handler()) are skipped. No row when nothing is due.';
REVOKE ALL ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.claim_due_tasks(text, interval, integer) TO switchboard_app;

-- Each finished run moves to history in the same statement (V0036): DELETE from the
-- hot table (fenced as the UPDATE was: worker and status), INSERT what it returned.
-- Planned at each call (V0018), here and in claim_due_tasks' UPDATE: an idle
-- replica polls, so cached generic plans of both were often made while the queue
-- was empty, where every path costs the same. A burst then ran on them:
-- finish_runs as a sequential scan of task_runs under a hash join, the batch
-- claim's outer UPDATE through task_runs_by_handler (handler, id DESC) with
-- id = ANY(...) as a qual on its second column, a walk of the whole index (both
-- growing with the table; bench/profile_jobs.py, BENCHMARKS.md "j23"). A custom plan is
-- made for the table as it is at each call (its current size, even with
-- empty-table statistics) and takes the primary key. Tested by buffers in
-- tests/test_batch_claim.py.
-- Here that is plan_cache_mode = force_custom_plan on a static statement, not
-- EXECUTE of a string (as before issue 35): the function has no other expression
-- worth caching, and EXECUTE parsed and analysed the statement again at every call,
-- with a join to unnest(run_ids, results) for the results. Issue 35 measured the
-- finish at ~190 us of server time per single-run call with EXECUTE after the move
-- to history, ~115 us this way (pg_stat_statements, same cluster, same run). A
-- result is looked up by position (array_position, the first match: a batch is at
-- most a worker's slots, and results is NULL when no handler returned a value).
-- claim_due_tasks keeps EXECUTE: plan_cache_mode on it re-planned every PL/pgSQL
-- expression and doubled its own time per job.
CREATE OR REPLACE FUNCTION switchboard.finish_runs(worker text, run_ids bigint[], results jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    IF run_ids IS NULL OR (results IS NOT NULL AND cardinality(results) <> cardinality(run_ids)) THEN
        RAISE EXCEPTION 'run_ids and results differ in length' USING ERRCODE = '22023',
            HINT = 'Pass one result per run id, or NULL for none.';
    END IF;
    IF array_ndims(run_ids) > 1 OR array_ndims(results) > 1 THEN
        RAISE EXCEPTION 'run_ids and results must be one-dimensional arrays (got % and % dimensions)',
            array_ndims(run_ids), coalesce(array_ndims(results), 0) USING ERRCODE = '22023',
            HINT = 'Pass flat arrays: ARRAY[id, ...] and ARRAY[result, ...].';
    END IF;
    RETURN QUERY
    WITH gone AS (
         DELETE FROM switchboard.task_runs_hot r
          WHERE r.id = ANY (finish_runs.run_ids) AND r.worker = finish_runs.worker AND r.status = 'running'
         RETURNING r.*)
     INSERT INTO switchboard.task_runs_history
     SELECT g.id, g.task_id, g.handler, g.args, 'succeeded', g.trigger, g.attempt, g.max_attempts,
            g.queueing_lock, g.run_at, g.scheduled_for, g.worker, NULL, g.started_at, now(),
            CASE WHEN finish_runs.results IS NOT NULL
                 THEN finish_runs.results[array_position(finish_runs.run_ids, g.id)
                                          - array_lower(finish_runs.run_ids, 1) + array_lower(finish_runs.results, 1)] END,
            g.error, g.retry_of, g.created_at, g.queue, g.priority
       FROM gone g
     RETURNING id;
END
$$;
COMMENT ON FUNCTION switchboard.finish_runs(text, bigint[], jsonb[]) IS
    'Record several successful runs of worker at once (results in the same order, or NULL). Returns the ids actually finished: a run the worker no longer owns is left untouched (fencing). Failures go through finish_run(), which schedules retries.';
REVOKE ALL ON FUNCTION switchboard.finish_runs(text, bigint[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.finish_runs(text, bigint[], jsonb[]) TO switchboard_app;

-- finish_and_claim (V0018): a replica's steady state is "k handlers just
-- succeeded, k slots are free": finish_runs() and claim_due_tasks() in one
-- round trip and one transaction instead of two. Per drained job that is half
-- the statements, commits and client round trips of the finish/claim cycle
-- (bench/profile_jobs.py, bench/jobs_ab.py). The finish is fenced exactly as
-- finish_runs() (it is called); the claim is exactly claim_due_tasks() (it is
-- called). Finished runs come back first as thin rows (only id, and status
-- 'succeeded'), then the claimed runs, whole (status 'running'), so the caller
-- tells them apart by status and decodes no columns it does not need.
-- max_runs = 0 only finishes (a draining replica). A failure rolls back both:
-- the runs stay running until their lease expires and are retried, as when
-- finish_runs() fails.
CREATE OR REPLACE FUNCTION switchboard.finish_and_claim(
    worker text, run_ids bigint[], results jsonb[], lease interval, max_runs integer)
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_done switchboard.task_runs;
    v_id bigint;
BEGIN
    IF max_runs IS NULL OR max_runs < 0 OR max_runs > 1000 THEN
        RAISE EXCEPTION 'invalid max_runs %', max_runs USING ERRCODE = '22023',
            HINT = 'max_runs is how many free slots the worker has: 0 (finish only) to 1000.';
    END IF;
    v_done.status := 'succeeded';
    FOR v_id IN SELECT f FROM switchboard.finish_runs(finish_and_claim.worker, finish_and_claim.run_ids,
                                                     finish_and_claim.results) AS f LOOP
        v_done.id := v_id;
        RETURN NEXT v_done;
    END LOOP;
    IF max_runs > 0 THEN
        RETURN QUERY SELECT * FROM switchboard.claim_due_tasks(finish_and_claim.worker, finish_and_claim.lease,
                                                               finish_and_claim.max_runs);
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.finish_and_claim(text, bigint[], jsonb[], interval, integer) IS
    'finish_runs(worker, run_ids, results) then claim_due_tasks(worker, lease, max_runs) in one call and one transaction. Returns the runs actually finished as rows holding only id and status = ''succeeded'' (fenced: a run the worker no longer owns is absent), then the claimed runs (status ''running''). max_runs = 0 only finishes.';
REVOKE ALL ON FUNCTION switchboard.finish_and_claim(text, bigint[], jsonb[], interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.finish_and_claim(text, bigint[], jsonb[], interval, integer) TO switchboard_app;

-- Named queues (V0030). A replica gives each queue it serves its own slots
-- (SWITCHBOARD_QUEUES), so a slow queue cannot take the slots of a fast one.
-- queues[i] gets at most slots[i] runs, taken by one UPDATE whose LATERAL subquery
-- walks each queue's head of task_runs_ready (highest priority, then oldest due
-- first) with FOR UPDATE SKIP LOCKED, as the default queue's claim does; the default
-- queue goes through claim_due_tasks(worker, lease, n) above instead when a lease
-- expired or a tick is due before its head. A replica that serves only the default
-- queue calls the three-argument form, unchanged.
CREATE OR REPLACE FUNCTION switchboard._check_queue_slots(queues text[], slots integer[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queues IS NULL OR slots IS NULL OR cardinality(queues) <> cardinality(slots)
       OR cardinality(queues) NOT BETWEEN 1 AND 64 THEN
        RAISE EXCEPTION 'queues and slots must be arrays of one length (1 to 64), got % and %',
                        cardinality(queues), cardinality(slots) USING ERRCODE = '22023',
            HINT = 'e.g. queues => ''{default,emails}'', slots => ''{8,2}''.';
    END IF;
    PERFORM switchboard._check_queue(q) FROM unnest(queues) AS q;
    IF EXISTS (SELECT 1 FROM unnest(slots) AS n WHERE n IS NULL OR n NOT BETWEEN 0 AND 1000)
       OR (SELECT sum(n) FROM unnest(slots) AS n) > 1000
       OR (SELECT count(DISTINCT q) FROM unnest(queues) AS q) <> cardinality(queues) THEN
        RAISE EXCEPTION 'invalid slots % for queues %', slots, queues USING ERRCODE = '22023',
            HINT = 'Each queue once; its free slots 0 to 1000, at most 1000 in all.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_queue_slots(text[], integer[]) FROM PUBLIC;

-- The common case in one statement, as the three-argument form's fast path: when no
-- lease has expired and no task tick is due before the default queue's head, every
-- queue's share, the default queue's included, is taken by one UPDATE. Otherwise the
-- default queue goes through claim_due_tasks(worker, lease, n) (ticks, lease rescue)
-- and the same UPDATE takes the named queues' share. The arguments are checked by one
-- expression on the way in; _check_queue_slots, which says what is wrong, runs only
-- when it fails (a queue name that matches nothing claims nothing).
CREATE OR REPLACE FUNCTION switchboard.claim_due_tasks(
    worker text, lease interval, queues text[], slots integer[])
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
DECLARE
    v_default integer := 0;
    v_pos integer;
    v_now timestamptz := now();
    v_task_at timestamptz;
    v_queued_at timestamptz;
    v_all boolean := true;      -- the default queue's share goes in the one UPDATE
BEGIN
    IF queues IS NULL OR slots IS NULL OR cardinality(queues) <> cardinality(slots)
       OR cardinality(queues) NOT BETWEEN 1 AND 64
       OR (0 <= ALL (slots) AND 1000 >= ALL (slots)) IS NOT TRUE THEN
        PERFORM switchboard._check_queue_slots(queues, slots);   -- raises, naming what is wrong
    END IF;
    IF claim_due_tasks.worker IS NULL OR length(claim_due_tasks.worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid worker name "%"', claim_due_tasks.worker USING ERRCODE = '22023',
            HINT = 'Worker names are unique per process, e.g. host:pid:random.';
    END IF;
    IF claim_due_tasks.lease IS NULL OR claim_due_tasks.lease <= interval '0'
       OR claim_due_tasks.lease > interval '1 day' THEN
        PERFORM switchboard._check_lease(claim_due_tasks.lease);   -- raises
    END IF;
    v_pos := array_position(queues, 'default');
    IF v_pos IS NOT NULL THEN
        v_default := slots[array_lower(slots, 1) + v_pos - array_lower(queues, 1)];
    END IF;
    IF v_default > 0 THEN
        IF EXISTS (SELECT 1 FROM switchboard.task_runs_hot e WHERE e.status = 'running' AND e.lease_expires_at < v_now) THEN
            v_all := false;
        ELSE
            SELECT t.next_run_at INTO v_task_at FROM switchboard.tasks t
             WHERE t.is_active AND t.next_run_at <= v_now
               AND t.handler <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
             ORDER BY t.next_run_at LIMIT 1;
            IF v_task_at IS NOT NULL THEN
                SELECT q.run_at INTO v_queued_at FROM switchboard.task_runs_hot q
                 WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= v_now
                   AND (q.handler || '') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                 ORDER BY q.priority DESC, q.run_at, q.id LIMIT 1;
                v_all := coalesce(v_queued_at < v_task_at, false);
            END IF;
        END IF;
        IF NOT v_all THEN
            RETURN QUERY SELECT * FROM switchboard.claim_due_tasks(claim_due_tasks.worker, claim_due_tasks.lease,
                                                                   v_default);
        END IF;
    END IF;
    -- Dynamic, planned at each call (see finish_runs' comment).
    RETURN QUERY EXECUTE
    'UPDATE switchboard.task_runs_hot r
        SET status = ''running'', worker = $1, lease_expires_at = $2 + $3, started_at = $2
      WHERE r.id = ANY (ARRAY(
            SELECT x.id FROM unnest($4::text[], $5::integer[]) AS w(queue, n)
            CROSS JOIN LATERAL (
                SELECT q.id FROM switchboard.task_runs_hot q
                 WHERE q.status = ''queued'' AND q.queue = w.queue AND q.run_at <= $2
                   AND (q.handler || '''') <> ALL (ARRAY(SELECT p.handler FROM switchboard.paused_handlers p))
                 ORDER BY q.priority DESC, q.run_at, q.id
                 LIMIT w.n FOR UPDATE OF q SKIP LOCKED) AS x
             WHERE w.n > 0 AND (w.queue <> ''default'' OR $6)))
    RETURNING r.*'
    USING claim_due_tasks.worker, v_now, claim_due_tasks.lease, queues, slots, v_all;
    -- As the three-argument form: a tick due behind a default-queue head that other
    -- workers hold is taken when this call found nothing else.
    IF NOT FOUND AND v_all AND v_task_at IS NOT NULL THEN
        RETURN QUERY SELECT * FROM switchboard.claim_due_tasks(claim_due_tasks.worker, claim_due_tasks.lease,
                                                               v_default);
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.claim_due_tasks(text, interval, text[], integer[]) IS
    'Claim work from several queues in one call: at most slots[i] runs of queues[i], each queue highest priority first, then oldest due first (FOR UPDATE SKIP LOCKED). The default queue is claimed as claim_due_tasks(worker, lease, n) claims it (task ticks, expired leases rescued). 22023 on arrays of different lengths, a bad queue name or slot count.';
REVOKE ALL ON FUNCTION switchboard.claim_due_tasks(text, interval, text[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.claim_due_tasks(text, interval, text[], integer[]) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.finish_and_claim(
    worker text, run_ids bigint[], results jsonb[], lease interval, queues text[], slots integer[])
RETURNS SETOF switchboard.task_runs
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_done switchboard.task_runs;
    v_id bigint;
BEGIN
    v_done.status := 'succeeded';
    FOR v_id IN SELECT f FROM switchboard.finish_runs(finish_and_claim.worker, finish_and_claim.run_ids,
                                                     finish_and_claim.results) AS f LOOP
        v_done.id := v_id;
        RETURN NEXT v_done;
    END LOOP;
    IF queues IS NULL OR slots IS NULL OR 0 < ANY (slots) IS NOT FALSE THEN   -- the claim checks them
        RETURN QUERY SELECT * FROM switchboard.claim_due_tasks(finish_and_claim.worker, finish_and_claim.lease,
                                                               finish_and_claim.queues, finish_and_claim.slots);
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.finish_and_claim(text, bigint[], jsonb[], interval, text[], integer[]) IS
    'finish_runs(worker, run_ids, results) then claim_due_tasks(worker, lease, queues, slots) in one call and one transaction: the finished runs as thin rows (id, status = ''succeeded''), then the claimed runs. All slots 0 only finishes.';
REVOKE ALL ON FUNCTION switchboard.finish_and_claim(text, bigint[], jsonb[], interval, text[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.finish_and_claim(text, bigint[], jsonb[], interval, text[], integer[]) TO switchboard_app;
