-- Faults in the middle (issue 13).
--
-- Functions changed with this version (applied by afterAll): claim_due_task
-- and its new tick helper _claim_tick (20_scheduler.sql), status() gains
-- tasks_broken (80_status.sql, counted by _tasks_broken()).
--
-- One bad task row cannot stop the scheduler.
--
-- A task whose next fire time cannot be computed (a zone a DBA typed by hand,
-- a schedule that can never fire, an @every anchor at -infinity ...) used to
-- make every claim on every replica raise. claim_due_task() now parks such a
-- task instead: no run, next_run_at moved one minute ahead (it is looked at
-- again then, so a fix made with a plain UPDATE heals by itself), and the
-- error kept on the row for a DBA:
--
--   SELECT name, timezone, schedule, last_error, last_error_at
--     FROM switchboard.tasks WHERE last_error IS NOT NULL;
--
-- switchboard.status() counts them as tasks_broken. update_task() clears the
-- mark when it reschedules. Both columns are NULL for every healthy task, so
-- the previous release's server (which never reads them) is unaffected.
ALTER TABLE switchboard.tasks
    ADD COLUMN IF NOT EXISTS last_error text,
    ADD COLUMN IF NOT EXISTS last_error_at timestamptz;

COMMENT ON COLUMN switchboard.tasks.last_error IS
    'Why the scheduler could not compute this task''s next fire time (NULL when healthy). Set by claim_due_task(); cleared when the task fires again or update_task() reschedules it.';
COMMENT ON COLUMN switchboard.tasks.last_error_at IS
    'When last_error was recorded (database clock).';
