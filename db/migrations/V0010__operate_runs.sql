-- V0010: operate it (issue 20) -- cancel, retry, pause, and descriptions for a DBA.
--
-- Functions changed or added with this version (applied by afterAll):
-- cancel_run (queued AND running runs, status 'cancelled'), retry_run,
-- pause_handler / resume_handler, the claim functions skip paused handlers,
-- lost_runs (how a replica learns that its running run was cancelled), the
-- runs view, list_runs, status() counts runs_cancelled and handlers_paused
-- (db/functions/20_scheduler.sql, 25_batch_claim.sql, 27_operate.sql,
-- 70_replicas.sql, 80_status.sql).
--
-- Rolling update. The previous release's server keeps working against this
-- schema: it never writes 'cancelled'; its finish_run/finish_runs/heartbeat_run
-- calls on a run cancelled meanwhile return false (fenced on status =
-- 'running', exactly as after a lease rescue), so it drops the late outcome
-- and logs "lease lost"; its claims go through the same claim functions, which
-- now skip paused handlers. No signature it calls changes.

-- 1. A distinct terminal status. The new CHECK is a superset of the old one:
--    added NOT VALID (no scan under the ACCESS EXCLUSIVE lock of the ALTER),
--    then validated, which only needs SHARE UPDATE EXCLUSIVE.
ALTER TABLE switchboard.task_runs DROP CONSTRAINT task_runs_status_check;
ALTER TABLE switchboard.task_runs ADD CONSTRAINT task_runs_status_check
    CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled')) NOT VALID;
ALTER TABLE switchboard.task_runs VALIDATE CONSTRAINT task_runs_status_check;

-- reap_runs() deletes finished runs by this index; cancelled runs are finished too.
CREATE INDEX task_runs_finished_v2 ON switchboard.task_runs (finished_at)
    WHERE status IN ('succeeded', 'failed', 'abandoned', 'cancelled');
DROP INDEX switchboard.task_runs_finished;

-- 2. A run has at most one active (queued or running) retry. retry_run() and
--    the automatic retry (_queue_retry) both insert with ON CONFLICT DO NOTHING,
--    so two operators retrying the same failed run at once get one new run, and
--    a manual retry of a run whose automatic retry is still pending is refused.
--    Every existing run has at most one retry row at all, so the index builds.
CREATE UNIQUE INDEX task_runs_one_active_retry ON switchboard.task_runs (retry_of)
    WHERE status IN ('queued', 'running') AND retry_of IS NOT NULL;
-- The listing (list_runs) pages by id, newest first, optionally by handler.
CREATE INDEX task_runs_by_handler ON switchboard.task_runs (handler, id DESC);

-- 3. Paused handlers: claims skip their queued runs and their tasks' ticks.
CREATE TABLE switchboard.paused_handlers (
    handler   text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL DEFAULT session_user,
    CONSTRAINT paused_handlers_handler_check CHECK (handler ~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$')
);
REVOKE ALL ON TABLE switchboard.paused_handlers FROM PUBLIC;
GRANT SELECT ON TABLE switchboard.paused_handlers TO switchboard_app;

-- 4. Descriptions: what \dt+ and \d+ show a DBA.
COMMENT ON TABLE switchboard.paused_handlers IS
    'Handlers whose work is held: claims skip their queued runs and their tasks'' due ticks. Written by pause_handler() / resume_handler().';
COMMENT ON COLUMN switchboard.paused_handlers.handler IS 'The paused handler name (as in tasks.handler, task_runs.handler).';
COMMENT ON COLUMN switchboard.paused_handlers.paused_at IS 'When pause_handler() was called (database clock).';
COMMENT ON COLUMN switchboard.paused_handlers.paused_by IS 'The database role that paused it (session_user).';

COMMENT ON TABLE switchboard.users IS
    'People who log in. Managed by create_user(), set_user_role(), set_user_password_hash(), disable_user(); the application role reads hashes only through login_lookup_v2().';
COMMENT ON COLUMN switchboard.users.id IS 'User id (the "sub" of its tokens).';
COMMENT ON COLUMN switchboard.users.username IS 'Login name, unique; letters, digits and _ . @ -, at most 64 characters.';
COMMENT ON COLUMN switchboard.users.password_hash IS 'argon2/bcrypt hash computed by the server; never readable by switchboard_app.';
COMMENT ON COLUMN switchboard.users.role IS 'admin or member.';
COMMENT ON COLUMN switchboard.users.disabled IS 'A disabled user cannot log in; its sockets are closed on every replica.';
COMMENT ON COLUMN switchboard.users.created_at IS 'When the user was created.';
COMMENT ON COLUMN switchboard.users.updated_at IS 'Last change of role, password or disabled flag.';
COMMENT ON COLUMN switchboard.users.token_epoch IS 'Bumped by a role change, password change or disable: tokens issued in an older epoch are refused.';

COMMENT ON TABLE switchboard.revoked_tokens IS 'Access tokens revoked by logout, kept until they would have expired anyway (reaped by maintenance()).';
COMMENT ON COLUMN switchboard.revoked_tokens.jti IS 'The token id (JWT jti).';
COMMENT ON COLUMN switchboard.revoked_tokens.user_id IS 'Whose token it was.';
COMMENT ON COLUMN switchboard.revoked_tokens.expires_at IS 'When the token expires; the row is reaped after that.';

COMMENT ON TABLE switchboard.rooms IS 'Rooms: named audiences for notify_room(); only members may join a room''s stream or publish to it.';
COMMENT ON COLUMN switchboard.rooms.name IS 'Room name: letters, digits and _ . : -, at most 128 characters.';
COMMENT ON COLUMN switchboard.rooms.created_at IS 'When the room was first used.';
COMMENT ON TABLE switchboard.room_members IS 'Who belongs to which room (add_room_member() / remove_room_member()).';
COMMENT ON COLUMN switchboard.room_members.room IS 'The room.';
COMMENT ON COLUMN switchboard.room_members.user_id IS 'The member.';
COMMENT ON COLUMN switchboard.room_members.added_at IS 'When the user was added.';

COMMENT ON TABLE switchboard.tasks IS
    'Scheduled and trigger-only tasks. Change them with create_task() / update_task() / delete_task(); each claim advances next_run_at in the same transaction that creates the run.';
COMMENT ON COLUMN switchboard.tasks.id IS 'Task id.';
COMMENT ON COLUMN switchboard.tasks.name IS 'Unique name, 1 to 200 characters.';
COMMENT ON COLUMN switchboard.tasks.schedule IS 'Cron expression, @hourly/@daily/..., "@every <interval>", or NULL for trigger-only.';
COMMENT ON COLUMN switchboard.tasks.timezone IS 'Zone the cron expression is read in (default UTC).';
COMMENT ON COLUMN switchboard.tasks.handler IS 'The handler that runs it (see the switchboard.handlers view; pause_handler() holds its ticks).';
COMMENT ON COLUMN switchboard.tasks.args IS 'JSON object handed to the handler (a sql task: its statement).';
COMMENT ON COLUMN switchboard.tasks.is_active IS 'false: paused, no ticks fire (trigger still works). Resuming re-anchors the schedule from now.';
COMMENT ON COLUMN switchboard.tasks.max_attempts IS 'Attempts per run (1..100): a failed or abandoned run is retried while attempts remain.';
COMMENT ON COLUMN switchboard.tasks.next_run_at IS 'Next due tick (NULL: trigger-only; ''infinity'': parked for good). Ticks missed during downtime fire once.';
COMMENT ON COLUMN switchboard.tasks.skipped_ticks IS 'Ticks that came due while a run of the task was still queued or running (skipped, never overlapped).';
COMMENT ON COLUMN switchboard.tasks.created_by IS 'Database role that created it.';
COMMENT ON COLUMN switchboard.tasks.created_at IS 'When it was created.';
COMMENT ON COLUMN switchboard.tasks.updated_at IS 'Last update_task().';

COMMENT ON TABLE switchboard.task_runs IS
    'Runs of tasks and one-off jobs (task_id NULL). A run is one attempt; a retry is a new row (attempt + 1, retry_of = the old id). Read it through the switchboard.runs view or list_runs().';
COMMENT ON COLUMN switchboard.task_runs.id IS 'Run id (increasing: a larger id is a newer run).';
COMMENT ON COLUMN switchboard.task_runs.task_id IS 'The task, or NULL for a one-off job from enqueue().';
COMMENT ON COLUMN switchboard.task_runs.handler IS 'Handler that runs it (copied from the task when the run was created).';
COMMENT ON COLUMN switchboard.task_runs.args IS 'JSON arguments (copied from the task when the run was created).';
COMMENT ON COLUMN switchboard.task_runs.status IS 'queued, running, succeeded, failed, abandoned (lease expired) or cancelled (cancel_run()). The last four are final.';
COMMENT ON COLUMN switchboard.task_runs.trigger IS 'What created it: schedule, manual, api, cli, enqueue, retry (automatic), manual_retry (retry_run()).';
COMMENT ON COLUMN switchboard.task_runs.attempt IS 'Attempt number, 1 for the first try.';
COMMENT ON COLUMN switchboard.task_runs.max_attempts IS 'Attempts allowed: no automatic retry once attempt reaches it.';
COMMENT ON COLUMN switchboard.task_runs.queueing_lock IS 'enqueue()''s lock: at most one queued or running job holds a given value.';
COMMENT ON COLUMN switchboard.task_runs.run_at IS 'Not claimed before this time (retry backoff, delayed jobs).';
COMMENT ON COLUMN switchboard.task_runs.scheduled_for IS 'The tick this run is for (scheduled runs and their retries).';
COMMENT ON COLUMN switchboard.task_runs.worker IS 'Worker (replica id) that claimed it.';
COMMENT ON COLUMN switchboard.task_runs.lease_expires_at IS 'A running run whose lease expires is rescued: abandoned, and retried while attempts remain.';
COMMENT ON COLUMN switchboard.task_runs.started_at IS 'When it was claimed.';
COMMENT ON COLUMN switchboard.task_runs.finished_at IS 'When it reached a final status.';
COMMENT ON COLUMN switchboard.task_runs.result IS 'The handler''s JSON result (succeeded runs).';
COMMENT ON COLUMN switchboard.task_runs.error IS 'Why it failed, was abandoned or was cancelled.';
COMMENT ON COLUMN switchboard.task_runs.retry_of IS 'The run this one retries (automatically or by retry_run()); NULL for a first attempt.';
COMMENT ON COLUMN switchboard.task_runs.created_at IS 'When the row was created.';

COMMENT ON TABLE switchboard.tickets IS 'Single-use WebSocket tickets (UNLOGGED): only the SHA-256 is stored; consume_ticket() deletes it.';
COMMENT ON COLUMN switchboard.tickets.hash IS 'SHA-256 of the ticket.';
COMMENT ON COLUMN switchboard.tickets.user_id IS 'Whose ticket it is.';
COMMENT ON COLUMN switchboard.tickets.expires_at IS 'Refused after this time; reaped by reap_tickets().';

COMMENT ON TABLE switchboard.rate_limits IS 'Token buckets (GCRA), one row per key, UNLOGGED; see rate_check().';
COMMENT ON COLUMN switchboard.rate_limits.key IS 'What is limited, e.g. login:ip:10.0.0.1.';
COMMENT ON COLUMN switchboard.rate_limits.tat_us IS 'Theoretical arrival time in microseconds since the epoch (database clock).';
COMMENT ON COLUMN switchboard.rate_limits.updated_at IS 'Last rate_check(); idle keys are reaped by reap_rate_limits().';

COMMENT ON TABLE switchboard.events IS 'Events for users and rooms, kept for the resume window (reap_events()). Written by notify_user() / notify_room().';
COMMENT ON COLUMN switchboard.events.id IS 'Event id, increasing in commit order.';
COMMENT ON COLUMN switchboard.events.user_id IS 'Target user (or NULL when room is set).';
COMMENT ON COLUMN switchboard.events.room IS 'Target room (or NULL when user_id is set).';
COMMENT ON COLUMN switchboard.events.event IS 'Event label, e.g. run.updated.';
COMMENT ON COLUMN switchboard.events.payload IS 'JSON payload, up to 1 MiB.';
COMMENT ON COLUMN switchboard.events.created_at IS 'When it was published.';
COMMENT ON TABLE switchboard.event_horizon IS 'One row: the highest event id reaped so far (a resume from below it may have lost events).';
COMMENT ON COLUMN switchboard.event_horizon.singleton IS 'Always true (one row).';
COMMENT ON COLUMN switchboard.event_horizon.reaped_through IS 'Highest reaped event id.';
COMMENT ON TABLE switchboard.event_order IS 'One row whose lock orders publishers (event ids in commit order); owner only.';
COMMENT ON COLUMN switchboard.event_order.singleton IS 'Always true (one row).';
COMMENT ON COLUMN switchboard.event_order.lock_wait IS 'How long a publisher waits for the previous one to commit before 55P03.';
COMMENT ON TABLE switchboard.ephemeral_events IS 'Client events (typing, tool.call.<id>): UNLOGGED, about a minute, never resumed.';
COMMENT ON COLUMN switchboard.ephemeral_events.id IS 'Ephemeral event id.';
COMMENT ON COLUMN switchboard.ephemeral_events.user_id IS 'Target user (or NULL when room is set).';
COMMENT ON COLUMN switchboard.ephemeral_events.room IS 'Target room (or NULL when user_id is set).';
COMMENT ON COLUMN switchboard.ephemeral_events.event IS 'Event label.';
COMMENT ON COLUMN switchboard.ephemeral_events.sender IS 'The user who sent it.';
COMMENT ON COLUMN switchboard.ephemeral_events.payload IS 'JSON payload.';
COMMENT ON COLUMN switchboard.ephemeral_events.created_at IS 'When it was published.';

COMMENT ON TABLE switchboard.replica_registry IS 'Every replica that heartbeats (UNLOGGED); the switchboard.replicas view shows the live ones.';
COMMENT ON COLUMN switchboard.replica_registry.id IS 'Replica id (host:pid:random); also its worker name on runs.';
COMMENT ON COLUMN switchboard.replica_registry.info IS 'Host, pid, open sockets as of the last heartbeat.';
COMMENT ON COLUMN switchboard.replica_registry.started_at IS 'First heartbeat.';
COMMENT ON COLUMN switchboard.replica_registry.heartbeat_at IS 'Last heartbeat.';
COMMENT ON COLUMN switchboard.replica_registry.handlers IS 'Task handlers the replica runs (NULL: a replica that does not say).';
COMMENT ON COLUMN switchboard.replica_registry.version IS 'Server version of the replica.';
COMMENT ON COLUMN switchboard.replica_registry.heartbeat_interval IS 'How often it heartbeats.';
COMMENT ON COLUMN switchboard.replica_registry.live_window IS 'Live while heartbeat_at is within this window (3 heartbeats, at least 30 s).';
COMMENT ON TABLE switchboard.presence_sockets IS 'How many sockets each user has on each replica (UNLOGGED); read the switchboard.presence view.';
COMMENT ON COLUMN switchboard.presence_sockets.replica_id IS 'The replica.';
COMMENT ON COLUMN switchboard.presence_sockets.user_id IS 'The user.';
COMMENT ON COLUMN switchboard.presence_sockets.sockets IS 'Open sockets.';
COMMENT ON COLUMN switchboard.presence_sockets.since IS 'Since when.';
COMMENT ON TABLE switchboard.tool_calls IS 'Calls sent to a user''s browser by /tools/call and their answers (UNLOGGED, short-lived).';
COMMENT ON COLUMN switchboard.tool_calls.id IS 'Call id.';
COMMENT ON COLUMN switchboard.tool_calls.user_id IS 'The user whose browser is asked.';
COMMENT ON COLUMN switchboard.tool_calls.replica_id IS 'The replica that waits for the answer.';
COMMENT ON COLUMN switchboard.tool_calls.name IS 'Tool name.';
COMMENT ON COLUMN switchboard.tool_calls.expires_at IS 'The caller stops waiting at this time.';
COMMENT ON COLUMN switchboard.tool_calls.answered IS 'Whether the user answered.';
COMMENT ON COLUMN switchboard.tool_calls.result IS 'The answer.';
COMMENT ON COLUMN switchboard.unlogged_epoch.singleton IS 'Always true (one row).';
COMMENT ON COLUMN switchboard.unlogged_epoch.since IS 'When the UNLOGGED state began (moves after crash recovery or a promotion).';
