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
    UNION ALL SELECT 'event_backlog_seconds',
                     coalesce(extract(epoch FROM now() - min(created_at)), 0)::double precision
      FROM switchboard.events
    UNION ALL SELECT 'live_replicas', count(*)::double precision FROM switchboard.replicas
    UNION ALL SELECT m.item, m.value FROM switchboard._runs_history_metrics() m
$$;
COMMENT ON FUNCTION switchboard.metrics_snapshot() IS
    'The gauges every replica exports on /metrics: expired_leases, runs_due, runs_due_age_seconds (oldest due queued run), event_backlog_seconds (oldest stored event), live_replicas; run history (V0036): runs_history_default (rows in the default partition, counted up to 100000) and runs_partitions_ahead (day partitions for days to come). Index-backed; cheap to poll.';
REVOKE ALL ON FUNCTION switchboard.metrics_snapshot() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.metrics_snapshot() TO switchboard_app;
