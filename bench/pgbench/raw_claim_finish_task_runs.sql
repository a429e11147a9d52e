-- The baseline's two plain UPDATEs on switchboard.task_runs (its nine indexes and
-- constraints) instead of bench_jobs: what the table costs by itself.
UPDATE switchboard.task_runs
   SET status = 'running', worker = 'w' || :client_id,
       lease_expires_at = now() + interval '60 seconds', started_at = now()
 WHERE id = (SELECT id FROM switchboard.task_runs
              WHERE status = 'queued' AND run_at <= now()
              ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS run_id \gset
UPDATE switchboard.task_runs
   SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
 WHERE id = :run_id AND worker = 'w' || :client_id AND status = 'running';
