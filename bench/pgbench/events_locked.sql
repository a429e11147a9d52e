-- The previous release's publish path, rebuilt by bench/event_publishers.py as
-- bench_notify_locked(): lock the one order row until COMMIT, nextval, INSERT,
-- pg_notify -- what notify_user did before V0009.
SELECT bench_notify_locked(:uid);
