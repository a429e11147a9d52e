-- V0030: per-handler options, named queues and priorities (issue 33).
--
-- 1. A run has a queue and a priority. Claims serve one queue at a time, each with
--    its own number of slots per replica (SWITCHBOARD_QUEUES), highest priority
--    first, then oldest due first. Adding a NOT NULL column with a constant
--    default is a catalog change in PostgreSQL 11+: no table rewrite.
--    task_runs_ready is the claim's new entry point; task_runs_queued (run_at, id)
--    stays for what reads due runs by time (metrics_snapshot, status, the runs feed).
--    Building it reads task_runs once under a SHARE lock (as V0010 and V0029 did).
-- 2. switchboard.handler_options: what a handler's registration says, stored where
--    the SQL honours it: enqueue() takes the queue, priority and max_attempts from
--    it when the caller gives none; finish_run() takes the retry backoff (base,
--    cap, jitter); the timeout is enforced by the replica that runs the handler and
--    shown here. Replicas write it at start (set_handler_options()).
-- 3. enqueue() gains priority and queue, and its max_attempts defaults to the
--    handler's; finish_run() gains retry (false: a failure that no retry can fix,
--    such as arguments that do not match the handler's type). The old forms are
--    dropped here and the new ones created by the function files (afterAll): a call
--    by position with the old arguments (a 0.2.0 replica's) resolves to the new
--    form with the same meaning.
ALTER TABLE switchboard.task_runs
    ADD COLUMN queue text NOT NULL DEFAULT 'default',
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD CONSTRAINT task_runs_priority_check CHECK (priority BETWEEN -100 AND 100),
    ADD CONSTRAINT task_runs_queue_check CHECK (queue ~ '^[a-z][a-z0-9_.-]{0,62}$');
COMMENT ON COLUMN switchboard.task_runs.queue IS
    'Named queue: claims serve each queue with its own slots per replica (SWITCHBOARD_QUEUES). Task runs are in ''default''.';
COMMENT ON COLUMN switchboard.task_runs.priority IS
    'Within a queue, a higher priority is claimed first (-100 to 100; then oldest due first).';
CREATE INDEX task_runs_ready ON switchboard.task_runs (queue, priority DESC, run_at, id) WHERE status = 'queued';
COMMENT ON INDEX switchboard.task_runs_ready IS
    'The claim''s entry point: a queue''s queued runs, highest priority first, then oldest due first.';

CREATE TABLE switchboard.handler_options (
    handler        text PRIMARY KEY,
    queue          text NOT NULL DEFAULT 'default',
    priority       smallint NOT NULL DEFAULT 0,
    max_attempts   integer NOT NULL DEFAULT 3,
    backoff_base   interval NOT NULL DEFAULT '1 second',
    backoff_cap    interval NOT NULL DEFAULT '1 hour',
    backoff_jitter real NOT NULL DEFAULT 0,
    timeout        interval,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    updated_by     text,
    CONSTRAINT handler_options_queue_check CHECK (queue ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    CONSTRAINT handler_options_priority_check CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT handler_options_attempts_check CHECK (max_attempts BETWEEN 1 AND 100),
    CONSTRAINT handler_options_backoff_check CHECK (
        backoff_base > interval '0' AND backoff_base <= interval '1 day'
        AND backoff_cap >= backoff_base AND backoff_cap <= interval '7 days'
        AND backoff_jitter >= 0 AND backoff_jitter <= 1),
    CONSTRAINT handler_options_timeout_check CHECK (
        timeout IS NULL OR (timeout > interval '0' AND timeout <= interval '1 day'))
);
COMMENT ON TABLE switchboard.handler_options IS
    'What each handler''s registration says (written by replicas at start with set_handler_options()): its queue, priority and max_attempts (the defaults of enqueue()), its retry backoff (used by finish_run()) and its timeout (enforced by the replica). A handler with no row uses the defaults.';
COMMENT ON COLUMN switchboard.handler_options.handler IS 'Handler name.';
COMMENT ON COLUMN switchboard.handler_options.queue IS 'Queue its jobs go to when enqueue() names none.';
COMMENT ON COLUMN switchboard.handler_options.priority IS 'Priority of its jobs when enqueue() gives none (-100 to 100, higher first).';
COMMENT ON COLUMN switchboard.handler_options.max_attempts IS 'Attempts of its jobs when enqueue() gives none (1 to 100).';
COMMENT ON COLUMN switchboard.handler_options.backoff_base IS 'Retry N+1 of a failed run waits least(backoff_cap, backoff_base * 2^N), less a random share of up to backoff_jitter of it.';
COMMENT ON COLUMN switchboard.handler_options.backoff_cap IS 'Longest wait before a retry.';
COMMENT ON COLUMN switchboard.handler_options.backoff_jitter IS 'Share of the wait (0 to 1) taken off at random, so failed runs do not all retry at once.';
COMMENT ON COLUMN switchboard.handler_options.timeout IS 'A run still in the handler after this long fails (and is retried by the rule above); NULL: no timeout.';
COMMENT ON COLUMN switchboard.handler_options.updated_at IS 'When it was last set.';
COMMENT ON COLUMN switchboard.handler_options.updated_by IS 'Who set it: the replica id, or the database role.';
GRANT SELECT ON switchboard.handler_options TO switchboard_app;

DROP FUNCTION IF EXISTS switchboard.enqueue(text, jsonb, timestamptz, text, integer);
DROP FUNCTION IF EXISTS switchboard.finish_run(bigint, text, boolean, jsonb, text);
DROP FUNCTION IF EXISTS switchboard._retry_backoff(integer);
