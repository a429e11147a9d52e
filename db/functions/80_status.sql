-- One look for a DBA, and the maintenance sweep.

-- The WAL timeline this server writes on: PostgreSQL starts a new one at every
-- promotion (a failover or switchover) and, under Patroni, when a crashed primary
-- is restarted in place. Read from the current WAL file name, which needs no
-- privilege (pg_control_checkpoint() does, and lags until the next checkpoint).
-- NULL on a standby.
CREATE OR REPLACE FUNCTION switchboard._timeline()
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer END
$$;
REVOKE ALL ON FUNCTION switchboard._timeline() FROM PUBLIC;

-- PL/pgSQL, so the table is looked up when called, not when the function is
-- created: function files are also applied on top of older versions (pgmigrate
-- -t N), where V0006's table does not exist yet.
CREATE OR REPLACE FUNCTION switchboard._unlogged_since()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT e.since FROM switchboard.unlogged_epoch e);
END
$$;
REVOKE ALL ON FUNCTION switchboard._unlogged_since() FROM PUBLIC;

-- Which PostgreSQL a replica is talking to, and whether the UNLOGGED state it
-- relied on survived. Called by every replica each time its LISTEN connection
-- (re)connects: a new timeline means a promotion happened (the replica counts
-- a failover); a new unlogged_since means tickets, rate buckets, registry,
-- presence and tool calls were emptied (crash recovery or promotion), so the
-- replica re-registers at once and fails its waiting tool calls instead of
-- letting them time out. The marker row is (re)created here: INSERT ... ON
-- CONFLICT DO NOTHING, so concurrent callers agree on one "since".
CREATE OR REPLACE FUNCTION switchboard.db_instance()
RETURNS TABLE (timeline integer, in_recovery boolean, started_at timestamptz, unlogged_since timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pg_is_in_recovery() THEN
        INSERT INTO switchboard.unlogged_epoch (singleton) VALUES (true) ON CONFLICT DO NOTHING;
    END IF;
    RETURN QUERY SELECT switchboard._timeline(), pg_is_in_recovery(), pg_postmaster_start_time(),
                        switchboard._unlogged_since();
END
$$;
COMMENT ON FUNCTION switchboard.db_instance() IS
    'The server a replica is connected to: WAL timeline (+1 at every promotion), in_recovery, postmaster start, and since when the UNLOGGED state (tickets, rate buckets, registry, presence, tool calls) exists. A change of unlogged_since means that state was emptied by crash recovery or a promotion.';
REVOKE ALL ON FUNCTION switchboard.db_instance() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.db_instance() TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.status()
RETURNS TABLE (item text, value bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'tasks_due', count(*) FROM switchboard.tasks WHERE is_active AND next_run_at <= now()
    UNION ALL SELECT 'tasks_active', count(*) FROM switchboard.tasks WHERE is_active
    UNION ALL SELECT 'tasks_broken', switchboard._tasks_broken()
    UNION ALL SELECT 'runs_' || s, (SELECT count(*) FROM switchboard.task_runs r WHERE r.status = s)
      FROM unnest(ARRAY['queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled']) AS s
    UNION ALL SELECT 'runs_due', count(*) FROM switchboard.task_runs WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'expired_leases', count(*) FROM switchboard.task_runs
               WHERE status = 'running' AND lease_expires_at < now()
    UNION ALL SELECT 'live_tickets', count(*) FROM switchboard.tickets WHERE expires_at > now()
    UNION ALL SELECT 'rate_limit_keys', count(*) FROM switchboard.rate_limits
    UNION ALL SELECT 'events_retained', count(*) FROM switchboard.events
    UNION ALL SELECT 'event_backlog_seconds',
                     coalesce(extract(epoch FROM now() - min(created_at))::bigint, 0) FROM switchboard.events
    UNION ALL SELECT 'last_event_id', coalesce(max(id), 0) FROM switchboard.events
    UNION ALL SELECT 'events_default_rows', switchboard._events_default_rows()
    UNION ALL SELECT 'live_replicas', count(*) FROM switchboard.replicas
    UNION ALL SELECT 'users_online', count(DISTINCT user_id) FROM switchboard.presence
    UNION ALL SELECT 'sockets_open', coalesce(sum(sockets), 0)::bigint FROM switchboard.presence
    UNION ALL SELECT 'handlers_unserved', count(*) FROM switchboard.handlers
               WHERE NOT served AND (active_tasks > 0 OR pending_runs > 0)
    UNION ALL SELECT 'handlers_paused', switchboard._handlers_paused()
    UNION ALL SELECT 'db_in_recovery', pg_is_in_recovery()::int
    UNION ALL SELECT 'db_timeline', switchboard._timeline()
    UNION ALL SELECT 'db_started_at', extract(epoch FROM pg_postmaster_start_time())::bigint
    UNION ALL SELECT 'unlogged_state_since', extract(epoch FROM switchboard._unlogged_since())::bigint
    UNION ALL SELECT h.item, h.value FROM switchboard._runs_history_status() h
$$;
COMMENT ON FUNCTION switchboard.status() IS
    'One look at the system: due tasks, broken tasks (next fire time not computable: see tasks.last_error), runs by status (runs_cancelled apart from runs_failed), expired leases, live tickets, rate-limit keys, event backlog, events_default_rows (events no partition covered: a burst outran the partitions created ahead; V0037), live replicas, sockets, handlers that active tasks or pending runs need but no live replica serves (see the switchboard.handlers view), handlers paused by pause_handler(); and the server itself: db_in_recovery (0/1), db_timeline (goes up by one at every promotion), db_started_at and unlogged_state_since (epoch seconds; the latter moves when crash recovery or a promotion emptied the UNLOGGED tables); run history (V0036): runs_history_default (rows in the default partition: a day partition was missing), runs_partitions_ahead (day partitions created for days to come), runs_partition_oldest_age_seconds (how long ago the oldest partition''s range ended: retention drops it after keep), runs_backfill_pending (finished runs of the previous release not moved yet).';
REVOKE ALL ON FUNCTION switchboard.status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.status() TO switchboard_app;

-- The maintenance sweep, run by the default task 'switchboard.maintenance'
-- (handler 'maintenance') on one replica per tick. Each reaper is bounded by
-- its own index; the whole sweep is one transaction. reap_events comes first:
-- it ticks when no relay does, and only as its transaction's first write (see
-- _reap_tick).
-- The run-history part of a sweep (V0036): day partitions created ahead, the previous
-- release's finished runs moved out of the hot table (one batch), then retention
-- (old day partitions dropped, old rows outside them deleted). Keys: runs (rows
-- deleted one by one, as before), runs_partitions_created, runs_partitions_dropped,
-- runs_partitions_busy (a partition lock not granted within the lock_timeout: tried
-- again next sweep), runs_default_moved (rows moved out of the default partition into
-- a new day partition), runs_backfilled.
CREATE OR REPLACE FUNCTION switchboard._maintain_runs_history(keep_runs interval, max_rows integer)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ensure record;
    v_reap record;
    v_backfilled integer;
BEGIN
    SELECT * INTO v_ensure FROM switchboard.runs_partitions_ensure(3);
    v_backfilled := switchboard.runs_backfill(max_rows);
    SELECT * INTO v_reap FROM switchboard._reap_runs(keep_runs, max_rows);
    RETURN jsonb_build_object('runs', v_reap.deleted,
                              'runs_partitions_created', v_ensure.created,
                              'runs_partitions_dropped', v_reap.dropped,
                              'runs_partitions_busy', v_ensure.busy + v_reap.busy,
                              'runs_default_moved', v_ensure.moved,
                              'runs_backfilled', v_backfilled);
END
$$;
REVOKE ALL ON FUNCTION switchboard._maintain_runs_history(interval, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.maintenance(
    keep_runs interval DEFAULT '7 days', keep_events interval DEFAULT '5 minutes',
    rate_limit_idle interval DEFAULT '1 hour', replica_stale interval DEFAULT '30 seconds')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := '{}';
    v_n integer;
BEGIN
    v := v || jsonb_build_object('events', switchboard.reap_events(keep_events));
    v := v || jsonb_build_object('expired_runs', switchboard.reap_expired_runs());
    v := v || switchboard._maintain_runs_history(keep_runs, 10000);
    v := v || jsonb_build_object('tickets', switchboard.reap_tickets());
    v := v || jsonb_build_object('sessions', switchboard.reap_sessions());
    v := v || jsonb_build_object('rate_limits', switchboard.reap_rate_limits(rate_limit_idle));
    v := v || jsonb_build_object('replicas', switchboard.reap_replicas(replica_stale));
    DELETE FROM switchboard.revoked_tokens WHERE expires_at < now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v := v || jsonb_build_object('revoked_tokens', v_n);
    DELETE FROM switchboard.tool_calls WHERE expires_at < now() - interval '1 minute';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v := v || jsonb_build_object('tool_calls', v_n);
    RETURN v;
END
$$;
COMMENT ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) IS
    'Run every reaper once, in one transaction (old events first, with the unbounded reap_events(keep_events); expired leases, run history (day partitions created ahead, the previous release''s finished runs moved out of the hot table, old partitions dropped), old runs, tickets, sessions ended a day ago, idle rate-limit keys, dead replicas, expired revocations, stale tool calls). What the 0.2.0 server''s sweep calls; this release''s calls maintenance(max_rows, ...). Returns counts per reaper.';
REVOKE ALL ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) TO switchboard_app;

-- The bounded sweep (V0015): every reaper that can meet a backlog deletes at
-- most max_rows per call (runs, rate-limit keys, events), so one sweep is one
-- short transaction whatever the backlog; the caller sweeps again while a
-- count comes back at max_rows. max_rows comes first and has no default so
-- that the 0.2.0 server's call by name (keep_events =>, replica_stale =>)
-- still resolves to the four-argument form above, which it keeps: its
-- reap_events is the unbounded one and its handler does not loop on events.
CREATE OR REPLACE FUNCTION switchboard.maintenance(
    max_rows integer, keep_runs interval DEFAULT '7 days', keep_events interval DEFAULT '5 minutes',
    rate_limit_idle interval DEFAULT '1 hour', replica_stale interval DEFAULT '30 seconds')
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := '{}';
    v_n integer;
BEGIN
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds each reaper in one sweep, 1 to 1000000 (e.g. 10000).';
    END IF;
    v := v || jsonb_build_object('events', switchboard.reap_events(keep_events, max_rows));
    v := v || jsonb_build_object('expired_runs', switchboard.reap_expired_runs());
    v := v || switchboard._maintain_runs_history(keep_runs, max_rows);
    v := v || jsonb_build_object('tickets', switchboard.reap_tickets());
    v := v || jsonb_build_object('sessions', switchboard.reap_sessions());
    v := v || jsonb_build_object('rate_limits', switchboard.reap_rate_limits(rate_limit_idle, max_rows));
    v := v || jsonb_build_object('streams', switchboard.reap_streams(max_rows));
    v := v || jsonb_build_object('replicas', switchboard.reap_replicas(replica_stale));
    DELETE FROM switchboard.revoked_tokens WHERE expires_at < now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v := v || jsonb_build_object('revoked_tokens', v_n);
    DELETE FROM switchboard.tool_calls WHERE expires_at < now() - interval '1 minute';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v := v || jsonb_build_object('tool_calls', v_n);
    RETURN v;
END
$$;
COMMENT ON FUNCTION switchboard.maintenance(integer, interval, interval, interval, interval) IS
    'Run every reaper once, each bounded to max_rows (old runs, idle rate-limit keys, old events, streams) where a backlog can build; run history: day partitions created ahead (runs_partitions_created), finished runs of the previous release moved out of the hot table (runs_backfilled), day partitions older than keep_runs dropped (runs_partitions_dropped; runs_partitions_busy when a lock was not granted at once: retried next sweep); sweep again while any count equals max_rows. Otherwise as maintenance(keep_runs, keep_events, rate_limit_idle, replica_stale). Returns counts per reaper.';
REVOKE ALL ON FUNCTION switchboard.maintenance(integer, interval, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.maintenance(integer, interval, interval, interval, interval) TO switchboard_app;
