-- Baseline: the same row into a plain table with the same indexes, plus a NOTIFY.
WITH e AS (INSERT INTO bench_events (user_id, event, payload) VALUES (:uid, 'bench.event', '{"n": 1}')
           RETURNING id)
SELECT pg_notify('bench_events', '{"id":' || id || '}') FROM e;
