-- Run history apart from the hot table (V0036, issue 35 item 1): partitions of
-- switchboard.task_runs_history created ahead, the previous release's finished runs
-- moved out of the hot table in bounded batches, and retention by dropping whole
-- day partitions. maintenance() (80_status.sql) calls all three every sweep.
--
-- Locks. Creating a day partition is CREATE TABLE (a new, empty table) then
-- ATTACH PARTITION, which takes SHARE UPDATE EXCLUSIVE on task_runs_history (finishes,
-- which insert into it, go on) and ACCESS EXCLUSIVE on the new table and on the
-- default partition (scanned to check that none of its rows belongs to the new day:
-- it should be empty). Dropping a day partition is DETACH PARTITION then DROP TABLE:
-- the plain DETACH takes ACCESS EXCLUSIVE on task_runs_history for a catalog change.
-- DETACH ... CONCURRENTLY would not, but it cannot run inside a function or a
-- transaction block (and the application role, which runs the sweep, owns no table).
-- So both run under a short lock_timeout (the SET clause of the two helpers below):
-- a lock not granted at once is given up, counted (maintenance's
-- runs_partitions_busy), and tried again on the next sweep, instead of queueing
-- every finish behind a long reader of the view. Because the timeout is shorter
-- than deadlock_timeout, it is always this side that gives up.
--
-- PL/pgSQL throughout: the bodies name tables that exist only from V0036 on, and the
-- function files are also applied on top of older versions (pgmigrate -t N); there
-- every function here does nothing (to_regclass is NULL) or what it did before.

-- The range of each partition of task_runs_history, from the catalog (NULL bounds:
-- MINVALUE, or the default partition).
CREATE OR REPLACE FUNCTION switchboard._runs_history_parts()
RETURNS TABLE (part regclass, relname name, lower_bound timestamptz, upper_bound timestamptz, is_default boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.oid::regclass, c.relname,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz,
           pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'switchboard.task_runs_history'::regclass
     ORDER BY 4 NULLS LAST;
END
$$;
REVOKE ALL ON FUNCTION switchboard._runs_history_parts() FROM PUBLIC;

-- One day partition: created empty, filled with the default partition's rows of
-- that day (ATTACH would refuse while the default holds any), then attached. The
-- default partition is locked first, so no finish can put a row of that day there
-- between the move and the ATTACH's check. Returns the rows moved.
CREATE OR REPLACE FUNCTION switchboard._runs_history_add_day(day date)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
AS $$
DECLARE
    v_name text := 'task_runs_history_p' || to_char(day, 'YYYYMMDD');
    v_from timestamptz := day::timestamp AT TIME ZONE 'UTC';
    v_to timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
    v_moved integer;
BEGIN
    LOCK TABLE switchboard.task_runs_history_default IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('CREATE TABLE switchboard.%I (LIKE switchboard.task_runs_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   v_name);
    -- The partition's constraint as a CHECK of its own: ATTACH then need not scan it.
    EXECUTE format('ALTER TABLE switchboard.%I ADD CONSTRAINT %I CHECK (finished_at >= %L AND finished_at < %L)',
                   v_name, v_name || '_range', v_from, v_to);
    EXECUTE format('WITH gone AS (DELETE FROM switchboard.task_runs_history_default d'
                   ' WHERE d.finished_at >= $1 AND d.finished_at < $2 RETURNING d.*)'
                   ' INSERT INTO switchboard.%I SELECT * FROM gone', v_name) USING v_from, v_to;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    EXECUTE format('ALTER TABLE switchboard.task_runs_history ATTACH PARTITION switchboard.%I FOR VALUES FROM (%L) TO (%L)',
                   v_name, v_from, v_to);
    EXECUTE format('ALTER TABLE switchboard.%I DROP CONSTRAINT %I', v_name, v_name || '_range');
    EXECUTE format('COMMENT ON TABLE switchboard.%I IS %L', v_name,
                   'Runs finished on ' || day || ' (UTC). Dropped whole by reap_runs once older than keep.');
    RETURN v_moved;
END
$$;
REVOKE ALL ON FUNCTION switchboard._runs_history_add_day(date) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.runs_partitions_ensure(
    days_ahead integer DEFAULT 3, OUT created integer, OUT moved integer, OUT busy integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_today date := (now() AT TIME ZONE 'UTC')::date;
    v_day date;
    v_from timestamptz;
    v_to timestamptz;
BEGIN
    created := 0;
    moved := 0;
    busy := 0;
    IF days_ahead IS NULL OR days_ahead NOT BETWEEN 0 AND 60 THEN
        RAISE EXCEPTION 'invalid days_ahead %', days_ahead USING ERRCODE = '22023',
            HINT = 'Day partitions are created from today (UTC) to today + days_ahead: 0 to 60; 3 is the default.';
    END IF;
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN
        RETURN;
    END IF;
    -- One creator at a time (a DBA's call beside the sweep): the other skips.
    IF NOT pg_try_advisory_xact_lock(hashtext('switchboard.runs_partitions')) THEN
        busy := 1;
        RETURN;
    END IF;
    FOR d IN 0..days_ahead LOOP
        v_day := v_today + d;
        v_from := v_day::timestamp AT TIME ZONE 'UTC';
        v_to := (v_day + 1)::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM switchboard._runs_history_parts() p
             WHERE NOT p.is_default
               AND coalesce(p.lower_bound, '-infinity') < v_to AND p.upper_bound > v_from);
        BEGIN
            moved := moved + switchboard._runs_history_add_day(v_day);
            created := created + 1;
        EXCEPTION WHEN lock_not_available THEN
            busy := busy + 1;
            EXIT;
        END;
    END LOOP;
END
$$;
COMMENT ON FUNCTION switchboard.runs_partitions_ensure(integer) IS
    'Create the missing day partitions of task_runs_history (task_runs_history_pYYYYMMDD) from today to today + days_ahead (UTC; 0..60), each as CREATE TABLE then ATTACH PARTITION, after moving into it the rows of its day that the default partition holds. Under a 200 ms lock_timeout: a day whose locks are not granted at once is left for the next call (busy). maintenance() calls it every sweep. Returns (created, moved, busy).';
REVOKE ALL ON FUNCTION switchboard.runs_partitions_ensure(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.runs_partitions_ensure(integer) TO switchboard_app;

-- The previous release's finished runs, still in the hot table after V0036, moved to
-- history oldest first, at most max_rows per call (one statement: the view shows each
-- run once throughout). Rows finished before V0036 land in task_runs_history_before.
-- SKIP LOCKED: a row someone is touching waits for the next call.
CREATE OR REPLACE FUNCTION switchboard.runs_backfill(max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds one call (one transaction): 1 to 1000000; 10000 is the default batch.';
    END IF;
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM switchboard.task_runs_hot r
         WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.task_runs_hot o
                                    WHERE o.status IN ('succeeded', 'failed', 'abandoned', 'cancelled')
                                    ORDER BY o.finished_at
                                    LIMIT max_rows FOR UPDATE SKIP LOCKED))
           AND r.status IN ('succeeded', 'failed', 'abandoned', 'cancelled')
        RETURNING r.*)
    INSERT INTO switchboard.task_runs_history
    SELECT g.id, g.task_id, g.handler, g.args, g.status, g.trigger, g.attempt, g.max_attempts,
           g.queueing_lock, g.run_at, g.scheduled_for, g.worker, g.lease_expires_at, g.started_at,
           coalesce(g.finished_at, g.created_at), g.result, g.error, g.retry_of, g.created_at, g.queue, g.priority
      FROM gone g;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.runs_backfill(integer) IS
    'Move at most max_rows finished runs left in task_runs_hot (from before V0036) to task_runs_history, oldest first, in one statement (the task_runs view shows each run once throughout). Returns how many; 0 once drained. maintenance() calls it every sweep.';
REVOKE ALL ON FUNCTION switchboard.runs_backfill(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.runs_backfill(integer) TO switchboard_app;

-- DETACH then DROP of one partition, under the short lock_timeout (header).
CREATE OR REPLACE FUNCTION switchboard._runs_history_drop_part(part regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
AS $$
BEGIN
    EXECUTE format('ALTER TABLE switchboard.task_runs_history DETACH PARTITION %s', part);
    EXECUTE format('DROP TABLE %s', part);
END
$$;
REVOKE ALL ON FUNCTION switchboard._runs_history_drop_part(regclass) FROM PUBLIC;

-- Retention, for reap_runs and maintenance(): drop every partition whose whole range
-- is older than keep (oldest first; stop at the first whose locks are not granted),
-- then delete at most max_rows old rows one by one where a partition cannot be
-- dropped: the default partition, and finished runs still in the hot table. At an
-- older migration target (no history table) it is the row-by-row DELETE of before.
CREATE OR REPLACE FUNCTION switchboard._reap_runs(keep interval, max_rows integer,
                                                 OUT deleted integer, OUT dropped integer, OUT busy integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_part regclass;
    v_n integer;
BEGIN
    deleted := 0;
    dropped := 0;
    busy := 0;
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023',
            HINT = 'keep is a non-negative interval such as ''7 days''.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds one call (one transaction): 1 to 1000000; 10000 is the default batch.';
    END IF;
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN
        EXECUTE
        'DELETE FROM switchboard.task_runs r
          WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.task_runs o
                                     WHERE o.status IN (''succeeded'', ''failed'', ''abandoned'', ''cancelled'')
                                       AND o.finished_at < now() - $1
                                     ORDER BY o.finished_at
                                     LIMIT $2 FOR UPDATE SKIP LOCKED))
            AND r.status IN (''succeeded'', ''failed'', ''abandoned'', ''cancelled'') AND r.finished_at < now() - $1'
        USING keep, max_rows;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN;
    END IF;
    FOR v_part IN
        SELECT p.part FROM switchboard._runs_history_parts() p
         WHERE NOT p.is_default AND p.upper_bound <= now() - keep
         ORDER BY p.upper_bound
    LOOP
        BEGIN
            PERFORM switchboard._runs_history_drop_part(v_part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            busy := busy + 1;
            EXIT;
        END;
    END LOOP;
    -- ctid, not id: the rows found are deleted without a second index probe.
    DELETE FROM switchboard.task_runs_history_default r
     WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.task_runs_history_default o
                                WHERE o.finished_at < now() - keep
                                ORDER BY o.finished_at
                                LIMIT max_rows FOR UPDATE SKIP LOCKED))
       AND r.finished_at < now() - keep;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted < max_rows THEN
        DELETE FROM switchboard.task_runs_hot r
         WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM switchboard.task_runs_hot o
                                    WHERE o.status IN ('succeeded', 'failed', 'abandoned', 'cancelled')
                                      AND o.finished_at < now() - keep
                                    ORDER BY o.finished_at
                                    LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED))
           AND r.status IN ('succeeded', 'failed', 'abandoned', 'cancelled') AND r.finished_at < now() - keep;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        deleted := deleted + v_n;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._reap_runs(interval, integer) FROM PUBLIC;

-- reap_runs: retention of finished runs. Since V0036 a day of history is one
-- partition, dropped whole once its last hour is older than keep: no row-by-row
-- DELETE, no dead tuples, a few kB of WAL (BENCHMARKS.md, "history"). Row by row,
-- bounded by max_rows, only what is not in a day partition: rows of the default
-- partition and finished runs still in the hot table. A partition is dropped when
-- all of it is older than keep, so a run is kept between keep and keep + 1 day.
-- Returns the rows deleted one by one (a partition dropped whole is not counted:
-- maintenance() reports runs_partitions_dropped); max_rows back means more are due.
CREATE OR REPLACE FUNCTION switchboard.reap_runs(keep interval, max_rows integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT r.deleted FROM switchboard._reap_runs(keep, max_rows) r);
END
$$;
COMMENT ON FUNCTION switchboard.reap_runs(interval, integer) IS
    'Retention of finished runs older than keep: drops every day partition of task_runs_history whose whole day is older than keep (DETACH + DROP under a 200 ms lock_timeout; a partition whose lock is not granted is left for the next call), then deletes at most max_rows old rows of the default partition and of the hot table, in the caller''s transaction. Returns the rows deleted one by one (not those of dropped partitions); max_rows back means more are due (call again, in a new transaction).';
REVOKE ALL ON FUNCTION switchboard.reap_runs(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_runs(interval, integer) TO switchboard_app;

-- The one-argument form (a DBA's call, and maintenance(keep_runs, ...)'s, which
-- the 0.2.0 server's sweep calls): one batch of 10,000.
CREATE OR REPLACE FUNCTION switchboard.reap_runs(keep interval DEFAULT '7 days')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN switchboard.reap_runs(keep, 10000);
END
$$;
COMMENT ON FUNCTION switchboard.reap_runs(interval) IS
    'reap_runs(keep, 10000): drop the day partitions of finished runs older than keep, and delete at most 10000 old rows kept outside them. Returns the rows deleted one by one.';
REVOKE ALL ON FUNCTION switchboard.reap_runs(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_runs(interval) TO switchboard_app;

-- What a DBA and an alert need to know about the layout (status() items).
CREATE OR REPLACE FUNCTION switchboard._runs_history_status()
RETURNS TABLE (item text, value bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'runs_history_default', count(*) FROM switchboard.task_runs_history_default
    UNION ALL
    SELECT 'runs_partitions_ahead', count(*) FROM switchboard._runs_history_parts() p
     WHERE p.lower_bound > now()
    UNION ALL
    SELECT 'runs_partition_oldest_age_seconds',
           coalesce(extract(epoch FROM now() - min(p.upper_bound)), 0)::bigint
      FROM switchboard._runs_history_parts() p WHERE NOT p.is_default
    UNION ALL
    SELECT 'runs_backfill_pending', count(*) FROM switchboard.task_runs_hot r
     WHERE r.status IN ('succeeded', 'failed', 'abandoned', 'cancelled');
END
$$;
REVOKE ALL ON FUNCTION switchboard._runs_history_status() FROM PUBLIC;

-- The two gauges metrics_snapshot() adds (every replica polls it every few seconds):
-- rows in the default partition (counted up to 100,000: it should be empty) and day
-- partitions for days to come. Alert SwitchboardRunsHistoryNotMaintained.
CREATE OR REPLACE FUNCTION switchboard._runs_history_metrics()
RETURNS TABLE (item text, value double precision)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF to_regclass('switchboard.task_runs_history') IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'runs_history_default', count(*)::double precision
      FROM (SELECT 1 FROM switchboard.task_runs_history_default LIMIT 100000) d
    UNION ALL
    SELECT 'runs_partitions_ahead', count(*)::double precision FROM switchboard._runs_history_parts() p
     WHERE p.lower_bound > now();
END
$$;
REVOKE ALL ON FUNCTION switchboard._runs_history_metrics() FROM PUBLIC;

-- The task_runs view's INSTEAD OF trigger (V0036). Hand-written writes on the view (a
-- DBA's UPDATE in psql, scripts, tests) go to the
-- table that holds the run: an active run stays in hot (updated in place), a run
-- given a final status moves to history (finished_at now() if none was given), a
-- final run made active again moves back. The functions never write through it.
-- SECURITY INVOKER: the caller needs the privileges on the tables (the application
-- role has none: it only SELECTs the view).
CREATE OR REPLACE FUNCTION switchboard._task_runs_view_write()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM switchboard.task_runs_hot r WHERE r.id = OLD.id;
        IF NOT FOUND THEN
            DELETE FROM switchboard.task_runs_history r WHERE r.id = OLD.id;
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.id IS NULL THEN
            NEW.id := nextval(pg_get_serial_sequence('switchboard.task_runs_hot', 'id'));
        END IF;
    ELSE
        IF NEW.id IS DISTINCT FROM OLD.id THEN
            RAISE EXCEPTION 'a run''s id cannot change (% to %)', OLD.id, NEW.id USING ERRCODE = '428C9',
                HINT = 'Insert a new run instead.';
        END IF;
        IF NEW.status IN ('queued', 'running') THEN
            UPDATE switchboard.task_runs_hot r
               SET (task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock, run_at,
                    scheduled_for, worker, lease_expires_at, started_at, finished_at, result, error, retry_of,
                    created_at, queue, priority)
                 = (NEW.task_id, NEW.handler, NEW.args, NEW.status, NEW.trigger, NEW.attempt, NEW.max_attempts,
                    NEW.queueing_lock, NEW.run_at, NEW.scheduled_for, NEW.worker, NEW.lease_expires_at,
                    NEW.started_at, NEW.finished_at, NEW.result, NEW.error, NEW.retry_of, NEW.created_at,
                    NEW.queue, NEW.priority)
             WHERE r.id = OLD.id;
            IF FOUND THEN
                RETURN NEW;
            END IF;
        END IF;
        DELETE FROM switchboard.task_runs_hot r WHERE r.id = OLD.id;
        DELETE FROM switchboard.task_runs_history r WHERE r.id = OLD.id;
    END IF;
    IF NEW.status IN ('queued', 'running') THEN
        INSERT INTO switchboard.task_runs_hot OVERRIDING SYSTEM VALUE SELECT (NEW).*;
    ELSE
        NEW.finished_at := coalesce(NEW.finished_at, now());
        INSERT INTO switchboard.task_runs_history SELECT (NEW).*;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION switchboard._task_runs_view_write() IS
    'INSTEAD OF trigger of the task_runs view: routes a hand-written INSERT, UPDATE or DELETE to task_runs_hot (queued, running) or task_runs_history (final statuses), moving a run between them when its status crosses over.';
REVOKE ALL ON FUNCTION switchboard._task_runs_view_write() FROM PUBLIC;
