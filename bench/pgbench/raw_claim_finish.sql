-- Baseline worker cycle: the same two writes as plain SQL on a plain table with the
-- same partial index.
UPDATE bench_jobs
   SET status = 'running', worker = 'w' || :client_id,
       lease_expires_at = now() + interval '60 seconds', started_at = now()
 WHERE id = (SELECT id FROM bench_jobs
              WHERE status = 'queued' AND run_at <= now()
              ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS run_id \gset
UPDATE bench_jobs
   SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
 WHERE id = :run_id AND worker = 'w' || :client_id AND status = 'running';
