-- One look for a DBA, and the maintenance sweep.

CREATE OR REPLACE FUNCTION switchboard.status()
RETURNS TABLE (item text, value bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'tasks_due', count(*) FROM switchboard.tasks WHERE is_active AND next_run_at <= now()
    UNION ALL SELECT 'tasks_active', count(*) FROM switchboard.tasks WHERE is_active
    UNION ALL SELECT 'runs_' || s, (SELECT count(*) FROM switchboard.task_runs r WHERE r.status = s)
      FROM unnest(ARRAY['queued', 'running', 'succeeded', 'failed', 'abandoned']) AS s
    UNION ALL SELECT 'runs_due', count(*) FROM switchboard.task_runs WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'expired_leases', count(*) FROM switchboard.task_runs
               WHERE status = 'running' AND lease_expires_at < now()
    UNION ALL SELECT 'live_tickets', count(*) FROM switchboard.tickets WHERE expires_at > now()
    UNION ALL SELECT 'rate_limit_keys', count(*) FROM switchboard.rate_limits
    UNION ALL SELECT 'events_retained', count(*) FROM switchboard.events
    UNION ALL SELECT 'event_backlog_seconds',
                     coalesce(extract(epoch FROM now() - min(created_at))::bigint, 0) FROM switchboard.events
    UNION ALL SELECT 'last_event_id', coalesce(max(id), 0) FROM switchboard.events
    UNION ALL SELECT 'live_replicas', count(*) FROM switchboard.replicas
    UNION ALL SELECT 'users_online', count(DISTINCT user_id) FROM switchboard.presence
    UNION ALL SELECT 'sockets_open', coalesce(sum(sockets), 0)::bigint FROM switchboard.presence
    UNION ALL SELECT 'handlers_unserved', count(*) FROM switchboard.handlers WHERE NOT served
$$;
COMMENT ON FUNCTION switchboard.status() IS
    'One look at the system: due tasks, runs by status, expired leases, live tickets, rate-limit keys, event backlog, live replicas, sockets, handlers that active tasks or pending runs need but no live replica serves (see the switchboard.handlers view).';
REVOKE ALL ON FUNCTION switchboard.status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.status() TO switchboard_app;

-- The maintenance sweep, run by the default task 'switchboard.maintenance'
-- (handler 'maintenance') on one replica per tick. Each reaper is bounded by
-- its own index; the whole sweep is one transaction.
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
    v := v || jsonb_build_object('expired_runs', switchboard.reap_expired_runs());
    v := v || jsonb_build_object('runs', switchboard.reap_runs(keep_runs));
    v := v || jsonb_build_object('tickets', switchboard.reap_tickets());
    v := v || jsonb_build_object('rate_limits', switchboard.reap_rate_limits(rate_limit_idle));
    v := v || jsonb_build_object('events', switchboard.reap_events(keep_events));
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
    'Run every reaper once (expired leases, old runs, tickets, idle rate-limit keys, old events, dead replicas, expired revocations, stale tool calls). Returns counts per reaper.';
REVOKE ALL ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.maintenance(interval, interval, interval, interval) TO switchboard_app;
