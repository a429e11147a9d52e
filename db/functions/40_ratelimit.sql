-- Rate limits: GCRA (the token bucket as a single timestamp). One UNLOGGED
-- row per key holds the theoretical arrival time (tat, microseconds since the
-- epoch, database clock). A request of cost c with emission interval T = 1/rate
-- is admitted iff max(tat, now) + c*T - now <= burst*T. The decision is one
-- INSERT ... ON CONFLICT DO UPDATE ... WHERE: the row lock serialises every
-- replica's callers, and a denied request (WHERE false) writes nothing.
-- The raising half of rate_check's argument check: called only when the one
-- combined test in rate_check fails, so the hot path evaluates one condition.
CREATE OR REPLACE FUNCTION switchboard._rate_check_raise(key text, rate double precision, burst integer, cost integer)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL OR length(key) = 0 OR length(key) > 512 THEN
        RAISE EXCEPTION 'invalid rate-limit key "%"', key USING ERRCODE = '22023',
            HINT = 'A key is 1 to 512 characters, e.g. ''login:ip:203.0.113.7''.';
    END IF;
    IF rate IS NULL OR NOT (rate > 0) OR rate = 'Infinity'::float8 OR rate > 1000000 THEN
        RAISE EXCEPTION 'invalid rate %', rate USING ERRCODE = '22023',
            HINT = 'rate is requests per second: > 0 and <= 1000000.';
    END IF;
    IF burst IS NULL OR burst < 1 THEN
        RAISE EXCEPTION 'invalid burst %', burst USING ERRCODE = '22023', HINT = 'burst is at least 1.';
    END IF;
    IF cost IS NULL OR cost < 1 OR cost > burst THEN
        RAISE EXCEPTION 'invalid cost % for burst %', cost, burst USING ERRCODE = '22023',
            HINT = 'cost is between 1 and burst: a request costing more than the burst could never pass.';
    END IF;
    RAISE EXCEPTION 'invalid rate_check arguments' USING ERRCODE = '22023';
END
$$;
REVOKE ALL ON FUNCTION switchboard._rate_check_raise(text, double precision, integer, integer) FROM PUBLIC;

-- Each top-level call is its own transaction, and PL/pgSQL prepares every
-- simple expression again in each new transaction (each costs): the body
-- keeps their number down (one combined argument check, no copies of the
-- arguments). Profile and floor: V0013 and BENCHMARKS.md "Scale".
CREATE OR REPLACE FUNCTION switchboard.rate_check(
    key text, rate double precision, burst integer, cost integer DEFAULT 1)
RETURNS TABLE (allowed boolean, remaining integer, retry_after_ms integer, reset_after_ms integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_now bigint := (extract(epoch FROM now()) * 1000000)::bigint;
    v_t double precision;
    v_inc bigint;
    v_tol bigint;
    v_tat bigint;
BEGIN
    -- NaN > 0 is true in PostgreSQL, NaN <= 1000000 is not; NULLs make it NULL.
    IF (length(rate_check.key) BETWEEN 1 AND 512 AND rate > 0 AND rate <= 1000000
        AND burst >= 1 AND cost BETWEEN 1 AND burst) IS NOT TRUE THEN
        PERFORM switchboard._rate_check_raise(rate_check.key, rate, burst, cost);
    END IF;
    v_t := 1000000.0 / rate;
    v_inc := round(cost * v_t)::bigint;
    v_tol := round(burst * v_t)::bigint;

    INSERT INTO switchboard.rate_limits AS r (key, tat_us, updated_at)
    VALUES (rate_check.key, v_now + v_inc, now())
    ON CONFLICT ON CONSTRAINT rate_limits_pkey DO UPDATE
       SET tat_us = greatest(r.tat_us, v_now) + v_inc, updated_at = now()
     WHERE greatest(r.tat_us, v_now) + v_inc - v_now <= v_tol
    RETURNING r.tat_us INTO v_tat;

    allowed := FOUND;
    IF NOT allowed THEN
        -- Denied: the row is locked by the ON CONFLICT above, so this read is exact.
        SELECT greatest(r.tat_us, v_now) INTO v_tat FROM switchboard.rate_limits r WHERE r.key = rate_check.key;
    END IF;
    retry_after_ms := CASE WHEN allowed THEN 0 ELSE ceil((v_tat + v_inc - v_now - v_tol) / 1000.0)::integer END;
    remaining := greatest(0, floor((v_tol - (v_tat - v_now)) / v_t + 1e-9))::integer;
    reset_after_ms := greatest(0, ceil((v_tat - v_now) / 1000.0))::integer;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION switchboard.rate_check(text, double precision, integer, integer) IS
    'Token bucket (GCRA) per key: a fresh key admits exactly burst requests at once, then rate per second. A denied request consumes nothing; retry_after_ms says when it would pass; reset_after_ms when the bucket is full again. Same answer on every replica (database clock).';
REVOKE ALL ON FUNCTION switchboard.rate_check(text, double precision, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.rate_check(text, double precision, integer, integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.rate_reset(key text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.rate_limits r WHERE r.key = rate_reset.key;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.rate_reset(text) IS
    'Forget a key: its bucket is full again. True if the key existed.';
REVOKE ALL ON FUNCTION switchboard.rate_reset(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.rate_reset(text) TO switchboard_app;

-- reap_rate_limits: bounded since V0013 (see reap_runs). rate_limits has no
-- index but its key: an index on updated_at would be written by every
-- rate_check and end its HOT updates. The batch is found by a scan that stops
-- after max_rows idle keys, so a call costs at most one pass over the table.
CREATE OR REPLACE FUNCTION switchboard.reap_rate_limits(idle interval, max_rows integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_now bigint := (extract(epoch FROM now()) * 1000000)::bigint;
BEGIN
    IF idle IS NULL OR idle < interval '0' THEN
        RAISE EXCEPTION 'invalid idle interval "%"', idle USING ERRCODE = '22023',
            HINT = 'idle is a non-negative interval such as ''1 hour''.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds one call (one transaction): 1 to 1000000; 10000 is the default batch.';
    END IF;
    -- Only buckets that are full again (tat in the past) may go: deleting a
    -- bucket that still holds debt would hand out a fresh burst. SKIP LOCKED:
    -- a key being checked right now is busy, not idle.
    DELETE FROM switchboard.rate_limits r
     WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.rate_limits o
                                WHERE o.updated_at < now() - idle AND o.tat_us <= v_now
                                LIMIT max_rows FOR UPDATE SKIP LOCKED))
       AND r.updated_at < now() - idle AND r.tat_us <= v_now;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_rate_limits(interval, integer) IS
    'Delete at most max_rows rate-limit keys untouched for idle whose bucket is full again. Returns how many; max_rows back means more are due (call again, in a new transaction).';
REVOKE ALL ON FUNCTION switchboard.reap_rate_limits(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_rate_limits(interval, integer) TO switchboard_app;

-- The one-argument form (a DBA's call, and maintenance(keep_runs, ...)'s, which the
-- 0.2.0 server's sweep calls): one batch of 10,000 (the documented batch size).
CREATE OR REPLACE FUNCTION switchboard.reap_rate_limits(idle interval DEFAULT '1 hour')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN switchboard.reap_rate_limits(idle, 10000);
END
$$;
COMMENT ON FUNCTION switchboard.reap_rate_limits(interval) IS
    'Delete rate-limit keys untouched for idle whose bucket is full again, at most 10000 per call (one batch; see reap_rate_limits(interval, integer)). Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_rate_limits(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_rate_limits(interval) TO switchboard_app;
