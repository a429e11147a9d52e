-- Switchboard core schema: every piece of state that N replicas share.
-- Tables only; functions live in db/functions and are (re)applied after every
-- new version by pgmigrate's afterAll callback.
--
-- Roles are cluster-wide. switchboard_app is the least-privilege application
-- role (NOLOGIN: grant it to the login role the server uses); switchboard_job
-- is the restricted role the `sql` task handler's statements run as (through
-- run_job_sql(), a SECURITY DEFINER function owned by it; the application role
-- is deliberately NOT a member: SET ROLE is not a boundary, RESET ROLE undoes it). Two databases in
-- one cluster may migrate at once (the advisory lock is per database), so a
-- concurrent CREATE ROLE is tolerated.
DO $roles$
BEGIN
    BEGIN
        CREATE ROLE switchboard_app NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    BEGIN
        CREATE ROLE switchboard_job NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
END
$roles$;

GRANT USAGE ON SCHEMA switchboard TO switchboard_app;
REVOKE ALL ON SCHEMA switchboard FROM PUBLIC;
REVOKE ALL ON TABLE switchboard.schema_version FROM PUBLIC;
GRANT SELECT ON TABLE switchboard.schema_version TO switchboard_app;

-- Users. The application role reads hashes only through login_lookup().
CREATE TABLE switchboard.users (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    username      text NOT NULL UNIQUE,
    password_hash text NOT NULL,
    role          text NOT NULL DEFAULT 'member',
    disabled      boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT users_role_check CHECK (role IN ('admin', 'member')),
    CONSTRAINT users_username_check CHECK (username ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$')
);
GRANT SELECT (id, username, role, disabled, created_at, updated_at)
    ON switchboard.users TO switchboard_app;

-- Revoked access tokens (logout). Kept until the token would have expired.
CREATE TABLE switchboard.revoked_tokens (
    jti        text PRIMARY KEY,
    user_id    uuid NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX revoked_tokens_expires ON switchboard.revoked_tokens (expires_at);

-- Rooms and their members.
CREATE TABLE switchboard.rooms (
    name       text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rooms_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$')
);
CREATE TABLE switchboard.room_members (
    room     text NOT NULL REFERENCES switchboard.rooms (name) ON DELETE CASCADE,
    user_id  uuid NOT NULL REFERENCES switchboard.users (id) ON DELETE CASCADE,
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (room, user_id)
);
CREATE INDEX room_members_user ON switchboard.room_members (user_id);
GRANT SELECT ON switchboard.rooms, switchboard.room_members TO switchboard_app;

-- Tasks: periodic (schedule) or trigger-only (schedule IS NULL).
-- next_run_at is advanced by claim_due_task in the same transaction that
-- creates the run, so a crash can never leave a task unscheduled.
CREATE TABLE switchboard.tasks (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name          text NOT NULL UNIQUE,
    schedule      text,
    timezone      text NOT NULL DEFAULT 'UTC',
    handler       text NOT NULL,
    args          jsonb NOT NULL DEFAULT '{}',
    is_active     boolean NOT NULL DEFAULT true,
    max_attempts  integer NOT NULL DEFAULT 3,
    next_run_at   timestamptz,
    skipped_ticks bigint NOT NULL DEFAULT 0,
    created_by    text NOT NULL DEFAULT current_user,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tasks_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 100),
    CONSTRAINT tasks_name_check CHECK (length(name) BETWEEN 1 AND 200)
);
-- The claim's entry point for due ticks: a tiny partial index.
CREATE INDEX tasks_due ON switchboard.tasks (next_run_at)
    WHERE is_active AND next_run_at IS NOT NULL;
GRANT SELECT ON switchboard.tasks TO switchboard_app;

-- Runs of tasks and one-off jobs (task_id IS NULL). A run is an attempt;
-- a retry is a new row with attempt + 1 (the old row keeps its outcome).
CREATE TABLE switchboard.task_runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id          uuid REFERENCES switchboard.tasks (id) ON DELETE CASCADE,
    handler          text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL DEFAULT 'queued',
    trigger          text NOT NULL,
    attempt          integer NOT NULL DEFAULT 1,
    max_attempts     integer NOT NULL DEFAULT 3,
    queueing_lock    text,
    run_at           timestamptz NOT NULL DEFAULT now(),
    scheduled_for    timestamptz,
    worker           text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    result           jsonb,
    error            text,
    retry_of         bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT task_runs_status_check
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'abandoned')),
    CONSTRAINT task_runs_attempt_check CHECK (attempt >= 1 AND max_attempts >= 1)
);
-- "Only one run of a task at a time" is this index, not a NOT EXISTS check:
-- the second INSERT ... ON CONFLICT DO NOTHING simply returns no row.
-- One-off jobs (task_id IS NULL) are left out: NULLs never conflict, so their
-- entries would only cost a write per claim.
CREATE UNIQUE INDEX task_runs_one_active ON switchboard.task_runs (task_id)
    WHERE status IN ('queued', 'running') AND task_id IS NOT NULL;
-- At most one queued-or-running job per queueing lock.
CREATE UNIQUE INDEX task_runs_queueing_lock ON switchboard.task_runs (queueing_lock)
    WHERE status IN ('queued', 'running') AND queueing_lock IS NOT NULL;
-- The claim's entry point for queued work (oldest due first).
CREATE INDEX task_runs_queued ON switchboard.task_runs (run_at, id) WHERE status = 'queued';
-- Lease rescue scans only running rows. "lease_expires_at IS NOT NULL" is
-- always true for them; it is in the predicate so that a lookup by primary key
-- that also says status = 'running' (finish_run, heartbeat_run, release_run)
-- cannot pick this index: with "status = 'running'" alone, the generic plan of
-- those UPDATEs walked the whole index (every running row plus every dead
-- entry since the last vacuum) instead of probing the primary key. The rescue
-- queries say lease_expires_at < now(), which implies the extra condition.
CREATE INDEX task_runs_running ON switchboard.task_runs (lease_expires_at)
    WHERE status = 'running' AND lease_expires_at IS NOT NULL;
-- A task's history (runs of one task, newest first); one-off jobs have none.
CREATE INDEX task_runs_by_task ON switchboard.task_runs (task_id, id DESC) WHERE task_id IS NOT NULL;
CREATE INDEX task_runs_finished ON switchboard.task_runs (finished_at)
    WHERE status IN ('succeeded', 'failed', 'abandoned');
GRANT SELECT ON switchboard.task_runs TO switchboard_app;

-- WebSocket tickets: only the SHA-256 of the ticket is stored.
CREATE UNLOGGED TABLE switchboard.tickets (
    hash       bytea PRIMARY KEY,
    user_id    uuid NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX tickets_expires ON switchboard.tickets (expires_at);

-- Token buckets (GCRA): one row per key; tat_us is the theoretical arrival
-- time in microseconds since the epoch (database clock).
CREATE UNLOGGED TABLE switchboard.rate_limits (
    key        text PRIMARY KEY,
    tat_us     bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Events. Ids come from event_id_seq taken under a transaction-scoped
-- advisory lock, so they increase in commit order (see notify_user).
CREATE SEQUENCE switchboard.event_id_seq AS bigint;
CREATE TABLE switchboard.events (
    id         bigint PRIMARY KEY,
    user_id    uuid,
    room       text,
    event      text NOT NULL,
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_target_check CHECK ((user_id IS NULL) <> (room IS NULL))
);
CREATE INDEX events_user ON switchboard.events (user_id, id) WHERE user_id IS NOT NULL;
CREATE INDEX events_room ON switchboard.events (room, id) WHERE room IS NOT NULL;
CREATE INDEX events_created ON switchboard.events (created_at);
-- The highest event id reaped so far: a resume from an id below it may have
-- lost events (the client gets resume_gap and reloads).
CREATE TABLE switchboard.event_horizon (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reaped_through bigint NOT NULL DEFAULT 0
);
INSERT INTO switchboard.event_horizon DEFAULT VALUES;

-- Replica registry and presence: UNLOGGED (after a crash the live replicas
-- re-register with their next heartbeat).
CREATE UNLOGGED TABLE switchboard.replica_registry (
    id           text PRIMARY KEY,
    info         jsonb NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNLOGGED TABLE switchboard.presence_sockets (
    replica_id text NOT NULL REFERENCES switchboard.replica_registry (id) ON DELETE CASCADE,
    user_id    uuid NOT NULL,
    sockets    integer NOT NULL,
    since      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, replica_id)
);
CREATE INDEX presence_sockets_replica ON switchboard.presence_sockets (replica_id);

-- Tool bridge: a call sent to a user's browser, answered on any replica.
CREATE UNLOGGED TABLE switchboard.tool_calls (
    id         uuid PRIMARY KEY,
    user_id    uuid NOT NULL,
    replica_id text NOT NULL,
    name       text NOT NULL,
    expires_at timestamptz NOT NULL,
    answered   boolean NOT NULL DEFAULT false,
    result     jsonb
);
CREATE INDEX tool_calls_expires ON switchboard.tool_calls (expires_at);

-- The default maintenance sweep (reap_* via switchboard.maintenance()): one
-- replica runs it per tick, like any task.
INSERT INTO switchboard.tasks (name, schedule, handler, args, next_run_at, created_by)
VALUES ('switchboard.maintenance', '@every 10 seconds', 'maintenance', '{}', now(), 'switchboard');
