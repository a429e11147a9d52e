-- V0029: retry or cancel runs by filter, in one bounded statement (issue 33).
--
-- retry_runs(status, handler, task, since, max_rows) retries the newest attempt of
-- each matching chain: a run that was retried already is skipped (its retry is the
-- one to retry when it failed too). That needs "has this run a retry?" per run,
-- and the only index on retry_of (task_runs_one_active_retry, V0010) covers active
-- retries alone. task_runs_retried holds every retry's retry_of: retries are a small
-- share of runs, so the index is small; building it reads task_runs once (like
-- V0010's indexes, under a SHARE lock that holds writers back for the scan).
--
-- Function changes (applied by afterAll): retry_runs and cancel_runs in
-- 27_operate.sql, granted to switchboard_app and switchboard_operator.
CREATE INDEX task_runs_retried ON switchboard.task_runs (retry_of) WHERE retry_of IS NOT NULL;
COMMENT ON INDEX switchboard.task_runs_retried IS
    'Every retry by the run it retries: retry_runs() skips a run that was retried already.';
