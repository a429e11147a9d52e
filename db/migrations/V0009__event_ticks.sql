-- V0009: events without a global lock (issue 18).
--
-- Publishers no longer take the event_order row lock: event ids come from the
-- sequence at insert time and so no longer follow commit order. Order comes
-- from ticks instead (PgQ's design): each event row records the id of the
-- transaction that wrote it (xid8), and a tick records a snapshot. Batch k is
-- the set of events whose transaction is visible in tick k's snapshot but not
-- in tick k-1's; every reader delivers batch after batch, by id inside a batch,
-- so every replica (and every resume) sees one total order, whatever order the
-- transactions committed in. A resume cursor is (tick, last id): short, exact.
--
-- switchboard.event_order stays (unused, owner-only) for one release: dropping
-- it would break nothing now, but pgTAP and DBAs' scripts name it.
ALTER TABLE switchboard.events ADD COLUMN xid xid8;
-- Existing rows: this migration's transaction, which the first tick (below)
-- sees as committed, so they all fall before tick 1.
UPDATE switchboard.events SET xid = pg_current_xact_id();
ALTER TABLE switchboard.events ALTER COLUMN xid SET DEFAULT pg_current_xact_id(),
                               ALTER COLUMN xid SET NOT NULL;
CREATE INDEX events_xid ON switchboard.events (xid);

-- One row per tick: a snapshot taken by event_tick() under the ticker lock, so
-- ticks are totally ordered and each snapshot contains the previous one.
CREATE SEQUENCE switchboard.event_tick_seq AS bigint;
CREATE TABLE switchboard.event_ticks (
    tick       bigint PRIMARY KEY,
    snap       pg_snapshot NOT NULL,
    snap_xmax  xid8 NOT NULL,   -- pg_snapshot_xmax(snap): grows with tick, indexed to find an event's batch
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT event_ticks_xmax_check CHECK (snap_xmax = pg_snapshot_xmax(snap))
);
CREATE INDEX event_ticks_xmax ON switchboard.event_ticks (snap_xmax, tick);
ALTER SEQUENCE switchboard.event_tick_seq OWNED BY switchboard.event_ticks.tick;
REVOKE ALL ON TABLE switchboard.event_ticks FROM PUBLIC;
INSERT INTO switchboard.event_ticks (tick, snap, snap_xmax)
VALUES (nextval('switchboard.event_tick_seq'), pg_current_snapshot(), pg_snapshot_xmax(pg_current_snapshot()));

-- The ticker lock: one row, locked FOR UPDATE SKIP LOCKED by whichever replica
-- ticks now (no leader: a replica that dies mid-tick releases it with its
-- connection). Owner-only, like event_order: nobody else can hold it.
-- publishers_notify: whether a publishing transaction NOTIFYs at all. true
-- (default): one {"id": N} per transaction wakes the relays at once. false:
-- publishers only INSERT (no NOTIFY, so no NOTIFY commit lock); relays poll
-- event_tick() every SWITCHBOARD_EVENT_TICK_INTERVAL and one {"tick": k} per
-- batch wakes them all (PgQ's ticker). A DBA switches it:
-- UPDATE switchboard.event_ticker SET publishers_notify = false;
CREATE TABLE switchboard.event_ticker (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    publishers_notify boolean NOT NULL DEFAULT true
);
INSERT INTO switchboard.event_ticker DEFAULT VALUES;
REVOKE ALL ON TABLE switchboard.event_ticker FROM PUBLIC;

-- The resume window in ticks: ticks at or below reaped_tick were reaped with
-- their events; a cursor at or before it gets resume_gap.
ALTER TABLE switchboard.event_horizon ADD COLUMN reaped_tick bigint NOT NULL DEFAULT 0;

-- What a DBA reads in \d+ (every table and column a DBA reads is described).
COMMENT ON COLUMN switchboard.events.xid IS 'The publishing transaction (pg_current_xact_id()): a tick''s snapshot decides which batch the event belongs to, whatever order ids were assigned in.';
COMMENT ON TABLE switchboard.event_ticks IS
    'Ticks (PgQ style): snapshots recorded by event_tick(). The events of batch k are those visible in tick k''s snapshot and not in tick k-1''s; delivery order is (tick, id).';
COMMENT ON COLUMN switchboard.event_ticks.tick IS 'The tick number: the first part of every cursor (v1.<tick>.<id>).';
COMMENT ON COLUMN switchboard.event_ticks.snap IS 'pg_current_snapshot() when the tick was taken.';
COMMENT ON COLUMN switchboard.event_ticks.snap_xmax IS 'pg_snapshot_xmax(snap): grows with tick; indexed to find the batch of an event (event_batch).';
COMMENT ON COLUMN switchboard.event_ticks.created_at IS 'When the tick was taken; retention (reap_events) counts from here.';
COMMENT ON TABLE switchboard.event_ticker IS
    'One row: the ticker''s lock (whoever holds it FOR UPDATE SKIP LOCKED ticks; no leader) and its setting.';
COMMENT ON COLUMN switchboard.event_ticker.singleton IS 'Always true: the table has exactly one row.';
COMMENT ON COLUMN switchboard.event_ticker.publishers_notify IS 'true: each publishing transaction sends one NOTIFY; false: publishers only INSERT and replicas poll event_tick() (SWITCHBOARD_EVENT_TICK_INTERVAL).';
COMMENT ON COLUMN switchboard.event_horizon.reaped_tick IS 'Ticks at or below this were reaped: a cursor below it gets resume_gap.';
