-- Trust boundary (issue 11). NOTIFY has no permissions: any role that may
-- connect can pg_notify on any channel and take any advisory lock. From this
-- version on, NOTIFY payloads are hints (ids) and replicas read what they act
-- on through the functions; see docs/security.md.

-- The event-order lock. A row lock on this one-row table replaces the
-- advisory lock that any role could take: only the owner (through the
-- SECURITY DEFINER notify_* functions) can lock the row; switchboard_app and
-- switchboard_job have no privilege on the table at all. lock_wait bounds how
-- long a publisher waits for the previous one to commit (55P03 after that);
-- a DBA may change it: UPDATE switchboard.event_order SET lock_wait = '2s';
CREATE TABLE switchboard.event_order (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    lock_wait interval NOT NULL DEFAULT '5 seconds',
    CONSTRAINT event_order_lock_wait_check CHECK (lock_wait > interval '0' AND lock_wait <= interval '10 minutes')
);
INSERT INTO switchboard.event_order DEFAULT VALUES;
REVOKE ALL ON TABLE switchboard.event_order FROM PUBLIC;

-- Ephemeral events (client events such as typing, tool.call.<id>): never
-- delivered from a NOTIFY payload any more. The row is the message; the
-- NOTIFY carries only its id, and the relay reads the row (rows live about a
-- minute, reaped by reap_events). A logged sequence: ids never repeat after
-- a crash, so a relay's recently-seen set cannot swallow a new event.
CREATE SEQUENCE switchboard.ephemeral_event_id_seq AS bigint;
CREATE UNLOGGED TABLE switchboard.ephemeral_events (
    id         bigint PRIMARY KEY DEFAULT nextval('switchboard.ephemeral_event_id_seq'),
    user_id    uuid,
    room       text,
    event      text NOT NULL,
    sender     uuid,
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT ephemeral_events_target_check CHECK ((user_id IS NULL) <> (room IS NULL))
);
ALTER SEQUENCE switchboard.ephemeral_event_id_seq OWNED BY switchboard.ephemeral_events.id;
CREATE INDEX ephemeral_events_created ON switchboard.ephemeral_events (created_at);
REVOKE ALL ON TABLE switchboard.ephemeral_events FROM PUBLIC;

-- A role change, a password change and disabling a user revoke every token
-- issued before: tokens carry the epoch they were issued in ("gen").
ALTER TABLE switchboard.users ADD COLUMN token_epoch integer NOT NULL DEFAULT 0;
