-- Baseline: the same row into a plain table with the same indexes, nothing else.
INSERT INTO bench_events (user_id, event, payload) VALUES (:uid, 'bench.event', '{"n": 1}');
