-- What the Prometheus gauges and alerts read, cheap enough to call from every
-- replica every few seconds. status() is the DBA's full picture and counts
-- every run kept for a week; this reads only index-backed edges:
-- task_runs_running (expired leases), task_runs_queued (due runs and the oldest
-- due run_at), events_created (the oldest stored event), replicas (a few rows),
-- and the run history's partition catalog (_runs_history_metrics, 21_runs_history.sql).
-- Ages are seconds on the database clock, so replica clock skew does not enter.
CREATE OR REPLACE FUNCTION switchboard.metrics_snapshot()
RETURNS TABLE (item text, value double precision)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'expired_leases', count(*)::double precision FROM switchboard.task_runs
     WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at < now()
    UNION ALL SELECT 'runs_due', count(*)::double precision FROM switchboard.task_runs
     WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'runs_due_age_seconds',
                     coalesce(extract(epoch FROM now() - min(run_at)), 0)::double precision
      FROM switchboard.task_runs WHERE status = 'queued' AND run_at <= now()
    UNION ALL SELECT 'event_backlog_seconds', switchboard._event_backlog_seconds()
    UNION ALL SELECT 'events_default_rows', switchboard._events_default_rows()::double precision
    UNION ALL SELECT 'event_partitions_ahead', coalesce(switchboard._event_partitions_ahead()::double precision, 'NaN')
    UNION ALL SELECT 'live_replicas', count(*)::double precision FROM switchboard.replicas
    UNION ALL SELECT m.item, m.value FROM switchboard._runs_history_metrics() m
$$;
COMMENT ON FUNCTION switchboard.metrics_snapshot() IS
    'The gauges every replica exports on /metrics: expired_leases, runs_due, runs_due_age_seconds (oldest due queued run), event_backlog_seconds (how long ago the oldest event retention should have removed by now was published: the newest event of the oldest partition whose ids are all given out, or the oldest in events_default; before V0037 the oldest stored event), events_default_rows (events no partition covered), event_partitions_ahead (partitions above event_id_seq; NaN before V0037), live_replicas; run history (V0036): runs_history_default (rows in the default partition, counted up to 100000) and runs_partitions_ahead (day partitions for days to come). Index-backed; cheap to poll.';
REVOKE ALL ON FUNCTION switchboard.metrics_snapshot() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.metrics_snapshot() TO switchboard_app;
