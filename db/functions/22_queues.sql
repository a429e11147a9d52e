-- Per-handler options, named queues and priorities (V0030).
--
-- A handler's registration (its queue, priority, max_attempts, retry backoff and
-- timeout) is stored in switchboard.handler_options, where the SQL honours it:
--   enqueue()      takes queue, priority and max_attempts from it when the caller
--                  names none (20_scheduler.sql);
--   finish_run()   waits _retry_delay() before a failed run's retry;
--   claims         serve each queue with the slots the replica gives it, highest
--                  priority first (claim_due_tasks(worker, lease, queues, slots),
--                  25_batch_claim.sql);
--   the replica    enforces the timeout (it is the one running the handler).
-- A queue exists when it is 'default' or some handler's options name it: an
-- enqueue() into any other queue would wait forever, so it is refused.

CREATE OR REPLACE FUNCTION switchboard._check_queue(queue text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue IS NULL OR queue !~ '^[a-z][a-z0-9_.-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid queue name "%"', left(queue, 80) USING ERRCODE = '22023',
            HINT = 'A queue is a lower-case name of up to 63 characters: letters, digits, _ . - (e.g. default, emails).';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_queue(text) FROM PUBLIC;

-- The wait before retry attempt + 1 of a failed run of handler: the handler's
-- backoff (handler_options; 1 s base, 1 h cap, no jitter without a row):
-- least(cap, base * 2^attempt), less a random share of up to jitter of it.
-- Computed in seconds as double precision: base * 2^attempt as an interval
-- overflows long before the cap applies.
CREATE OR REPLACE FUNCTION switchboard._retry_delay(handler text, attempt integer)
RETURNS interval
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
-- PL/pgSQL, not SQL: its body is not resolved when the function files are applied at a
-- migration target older than V0030 (no handler_options table yet).
DECLARE
    v_base interval;
    v_cap interval;
    v_jitter real;
BEGIN
    SELECT o.backoff_base, o.backoff_cap, o.backoff_jitter INTO v_base, v_cap, v_jitter
      FROM switchboard.handler_options o WHERE o.handler = _retry_delay.handler;
    RETURN make_interval(secs =>
               least(extract(epoch FROM coalesce(v_cap, interval '1 hour'))::double precision,
                     extract(epoch FROM coalesce(v_base, interval '1 second'))::double precision
                     * power(2::double precision, least(greatest(_retry_delay.attempt, 0), 60)))
               * (1 - coalesce(v_jitter, 0) * random()));
END
$$;
REVOKE ALL ON FUNCTION switchboard._retry_delay(text, integer) FROM PUBLIC;
COMMENT ON FUNCTION switchboard._retry_delay(text, integer) IS
    'Wait before retrying a failed run of handler after attempt: least(backoff_cap, backoff_base * 2^attempt) less up to backoff_jitter of it at random (handler_options; 1 second, 1 hour, 0 without a row).';

-- A number (seconds) from options->key, bounded; NULL when the key is absent.
CREATE OR REPLACE FUNCTION switchboard._option_seconds(options jsonb, key text, lo double precision,
                                                        hi double precision)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := options -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'number' OR v::text::numeric <= lo::numeric OR v::text::numeric > hi::numeric THEN
        RAISE EXCEPTION 'invalid handler option %: %', key, left(v::text, 40) USING ERRCODE = '22023',
            HINT = format('%s is a number of seconds, more than %s and at most %s.', key, lo, hi);
    END IF;
    RETURN make_interval(secs => v::text::numeric::double precision);
END
$$;
REVOKE ALL ON FUNCTION switchboard._option_seconds(jsonb, text, double precision, double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._option_int(options jsonb, key text, lo integer, hi integer, dflt integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := options -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN dflt;
    END IF;
    IF jsonb_typeof(v) <> 'number' OR v::text::numeric % 1 <> 0 OR v::text::numeric NOT BETWEEN lo AND hi THEN
        RAISE EXCEPTION 'invalid handler option %: %', key, left(v::text, 40) USING ERRCODE = '22023',
            HINT = format('%s is a whole number from %s to %s.', key, lo, hi);
    END IF;
    RETURN v::text::integer;
END
$$;
REVOKE ALL ON FUNCTION switchboard._option_int(jsonb, text, integer, integer, integer) FROM PUBLIC;

-- set_handler_options: what a replica calls at start for each handler it runs
-- (the whole registration: a key left out takes its default). The last writer
-- wins; during a rolling update that is the newest replica to start. Returns
-- whether the stored row changed. No variable or result of the table's type: the
-- function files are applied at HEAD even at an older migration target (pgmigrate
-- -t N), where the table does not exist yet.
CREATE OR REPLACE FUNCTION switchboard.set_handler_options(handler text, options jsonb, set_by text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_key text;
    v_queue text;
    v_priority integer;
    v_attempts integer;
    v_base interval;
    v_cap interval;
    v_jitter real := 0;
    v_timeout interval;
    v_jitter_json jsonb;
    v_n integer;
    v_old_queue text;
BEGIN
    PERFORM switchboard._check_handler(handler);
    IF options IS NULL OR jsonb_typeof(options) <> 'object' THEN
        RAISE EXCEPTION 'handler options must be a JSON object, got %', coalesce(jsonb_typeof(options), 'NULL')
            USING ERRCODE = '22023', HINT = 'e.g. ''{"queue": "emails", "max_attempts": 5}''::jsonb';
    END IF;
    FOR v_key IN SELECT jsonb_object_keys(options) LOOP
        IF v_key NOT IN ('queue', 'priority', 'max_attempts', 'backoff_base', 'backoff_cap', 'backoff_jitter',
                         'timeout') THEN
            RAISE EXCEPTION 'unknown handler option "%"', v_key USING ERRCODE = '22023',
                HINT = 'Options: queue, priority, max_attempts, backoff_base, backoff_cap, backoff_jitter (0 to 1), timeout (seconds).';
        END IF;
    END LOOP;
    IF set_by IS NOT NULL AND length(set_by) > 200 THEN
        RAISE EXCEPTION 'set_by is longer than 200 characters' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(options -> 'queue') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION 'invalid handler option queue: %', left((options -> 'queue')::text, 40) USING ERRCODE = '22023',
            HINT = 'queue is a name such as "emails".';
    END IF;
    v_queue := coalesce(options ->> 'queue', 'default');
    PERFORM switchboard._check_queue(v_queue);
    v_priority := switchboard._option_int(options, 'priority', -100, 100, 0);
    v_attempts := switchboard._option_int(options, 'max_attempts', 1, 100, 3);
    v_base := coalesce(switchboard._option_seconds(options, 'backoff_base', 0, 86400), interval '1 second');
    v_cap := coalesce(switchboard._option_seconds(options, 'backoff_cap', 0, 604800), interval '1 hour');
    IF v_cap < v_base THEN
        RAISE EXCEPTION 'invalid handler options: backoff_cap % is less than backoff_base %', v_cap, v_base
            USING ERRCODE = '22023', HINT = 'The cap is the longest wait: at least the base.';
    END IF;
    v_jitter_json := options -> 'backoff_jitter';
    IF v_jitter_json IS NOT NULL AND jsonb_typeof(v_jitter_json) <> 'null' THEN
        IF jsonb_typeof(v_jitter_json) <> 'number' OR v_jitter_json::text::numeric NOT BETWEEN 0 AND 1 THEN
            RAISE EXCEPTION 'invalid handler option backoff_jitter: %', left(v_jitter_json::text, 40)
                USING ERRCODE = '22023', HINT = 'backoff_jitter is the share of the wait taken off at random: 0 to 1.';
        END IF;
        v_jitter := v_jitter_json::text::numeric::real;
    END IF;
    v_timeout := switchboard._option_seconds(options, 'timeout', 0, 86400);
    SELECT o.queue INTO v_old_queue FROM switchboard.handler_options o WHERE o.handler = handler FOR UPDATE;
    INSERT INTO switchboard.handler_options AS o
        (handler, queue, priority, max_attempts, backoff_base, backoff_cap, backoff_jitter, timeout,
         updated_at, updated_by)
    VALUES (handler, v_queue, v_priority, v_attempts, v_base, v_cap, v_jitter, v_timeout, now(),
            coalesce(set_by, session_user))
    ON CONFLICT ON CONSTRAINT handler_options_pkey DO UPDATE
       SET queue = EXCLUDED.queue, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
           backoff_base = EXCLUDED.backoff_base, backoff_cap = EXCLUDED.backoff_cap,
           backoff_jitter = EXCLUDED.backoff_jitter, timeout = EXCLUDED.timeout,
           updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by
     -- a replica restarting with the same registration writes nothing
     WHERE (o.queue, o.priority, o.max_attempts, o.backoff_base, o.backoff_cap, o.backoff_jitter, o.timeout)
           IS DISTINCT FROM (EXCLUDED.queue, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.backoff_base,
                             EXCLUDED.backoff_cap, EXCLUDED.backoff_jitter, EXCLUDED.timeout);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    -- The handler moved to another queue (V0034): its queued runs that were in the old
    -- one (before its first registration: the default queue, where enqueue() put them)
    -- follow it. No replica serves a queue that no handler names, so they would wait
    -- there forever. A run enqueued into a queue of its own choosing stays put.
    v_old_queue := coalesce(v_old_queue, 'default');
    IF v_n > 0 AND v_old_queue <> v_queue THEN
        UPDATE switchboard.task_runs_hot r SET queue = v_queue
         WHERE r.handler = handler AND r.status = 'queued' AND r.queue = v_old_queue;
    END IF;
    RETURN v_n > 0;
END
$$;
COMMENT ON FUNCTION switchboard.set_handler_options(text, jsonb, text) IS
    'Store a handler''s registration (replicas call it at start): options is a JSON object with any of queue, priority (-100..100), max_attempts (1..100), backoff_base and backoff_cap (seconds), backoff_jitter (0..1), timeout (seconds or null); a key left out takes its default. Replaces the whole row; true if it changed. When the queue changes, the handler''s queued runs in the old queue move to the new one (in the same statement), so none is left in a queue no replica serves. 22023 names a bad key or value.';
REVOKE ALL ON FUNCTION switchboard.set_handler_options(text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_handler_options(text, jsonb, text) TO switchboard_app;
