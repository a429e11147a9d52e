-- V0013: how cost grows with work (issue 23).
--
-- Function changes (applied by afterAll):
--   presence_sync (75_presence_sync.sql): set-based, skips unchanged rows;
--     was quadratic in sockets ("user_id <> ALL (user_ids)").
--   reap_runs(interval, integer), reap_rate_limits(interval, integer): new,
--     bounded (max_rows per call and transaction). The one-argument forms the
--     previous release calls keep their signatures and delete one batch of
--     10,000 per call; the maintenance handler sweeps again while a reaper
--     comes back full (within 5 s per tick). A 1,000,000-row backlog is 100
--     short transactions instead of one that holds every row lock, a burst of
--     WAL and a snapshot that stops vacuum everywhere in the database.
--   rate_check (40_ratelimit.sql): same signature, same answers, fewer
--     PL/pgSQL expressions per call (one combined argument check; the
--     raising half moved to _rate_check_raise). Each top-level call is its own
--     transaction, and PL/pgSQL prepares every simple expression again in each
--     new transaction, so at the statement level every expression costs
--     ~1-2 us. Profiled (bench/scale.py, backend CPU per call, one prepared
--     client): ~10 % less CPU than before. The floor: a SECURITY DEFINER
--     PL/pgSQL set-returning function doing nothing but the same upsert already
--     costs 0.70-0.86x of the raw statement (function scan, the definer switch
--     and search_path, SPI, a tuplestore); the app role must not write
--     rate_limits directly, so that wrapper stays. Its table gets fillfactor 80
--     below (HOT updates).
--
-- Storage settings. ALTER TABLE ... SET (autovacuum_*, fillfactor) takes a
-- SHARE UPDATE EXCLUSIVE lock: reads and writes go on, so this is safe while
-- the previous release runs.
--
-- task_runs is a queue: every claim and every finish writes a new row version
-- (status is in the predicate of every partial index, so no update of a run
-- can be HOT) and leaves a dead entry in task_runs_queued, the index the claim
-- walks from its head. A claim skips dead entries cheaply once they are
-- marked killed, which needs the old version to be dead to every snapshot;
-- vacuum is what finally removes them and the dead heap versions. With the
-- defaults (vacuum when 20 % of the table is dead) a 1,000,000-row table
-- waits for 200,000 dead versions, and the drain walks them. Per table:
--   autovacuum_vacuum_scale_factor 0.01 + threshold 1000: vacuum after 1 %
--     dead (10,000 versions at 1,000,000 rows) instead of 20 %;
--   autovacuum_vacuum_insert_scale_factor 0.01: an enqueue burst (inserts
--     only) gets its visibility map and freezing done early, so the first
--     vacuum after the drain is not a full-table one;
--   autovacuum_analyze_scale_factor 0.02: the planner's idea of "queued"
--     follows the queue (a stale estimate after a burst can turn the claim's
--     index scan into a bitmap scan, which cannot kill dead entries);
--   autovacuum_vacuum_cost_delay 1 (ms, default 2): the queue's vacuum may
--     use more I/O than background tables: it is the one that pays back.
-- fillfactor is NOT lowered for task_runs: free space on a page only helps
-- HOT updates, and no update of a run can be HOT (see above); it would only
-- make the table and every scan of history bigger.
-- autovacuum_naptime is server-wide (default 1 min: each database is visited
-- at most once a minute); docs/capacity.md says when to lower it.
ALTER TABLE switchboard.task_runs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- rate_limits: every rate_check rewrites its key's row, and no indexed column
-- changes (key only), so each update can be HOT if the page has room: a
-- fillfactor of 80 leaves room from the first insert on (only new pages are
-- filled to it; pruning keeps room on the old ones). One-row-per-key churn
-- makes dead versions fast: vacuum after 5 % instead of 20 %.
ALTER TABLE switchboard.rate_limits SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 1
);
