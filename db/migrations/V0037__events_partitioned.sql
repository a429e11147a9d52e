-- V0037: events partitioned by id; retention drops whole partitions (issue 35, item 2).
--
-- Before, retention was row DELETE (reap_events): every event became a dead tuple,
-- its WAL was written twice (insert, delete) and autovacuum followed the reaper.
-- Now switchboard.events is PARTITION BY RANGE (id) (id is the primary key, so the
-- key stays valid on the parent) and reap_events detaches a partition (and drops it
-- at the next sweep) once every row
-- of it is reapable (db/functions/50_events.sql: _events_drop_partitions): its id
-- range is entirely allocated (event_id_seq is past its upper bound) and every
-- row's transaction is visible in the cut's snapshot. events_partitions_ensure()
-- keeps partitions ahead of the sequence, each about one retention window of ids.
--
-- The conversion, with replicas running and publishing (a rolling update):
--   1. The existing table is renamed (and its indexes), under ACCESS EXCLUSIVE: a
--      publisher waits for this migration's COMMIT, then re-plans and inserts into
--      the new parent (a cached plan names the table by OID; the rename invalidates it).
--   2. A CHECK constraint matching the range the old table will cover
--      (id < the sequence's next value) is added NOT VALID and VALIDATEd, so
--      ATTACH PARTITION trusts it and skips its own scan. The table is small (one
--      retention window, 5 minutes by default), so this is a short scan.
--   3. The partitioned parent takes the old name, columns, defaults, check and the
--      index names (events_pkey, events_user, events_room, events_xid,
--      events_created: partitioned indexes; each partition has its own).
--   4. The old table is ATTACHed as the first partition, events_p0, for ids below
--      the sequence's next value (its indexes are attached to the parent's, not
--      rebuilt). Two partitions ahead follow, each max(10,000, the ids published in
--      the last 5 minutes) wide, and a DEFAULT partition, events_default: a safety
--      net so a publish never fails for want of a partition (the sequence outran the
--      partitions ahead). Its rows are deleted row by row once reapable, and the next
--      partition starts above them; status() and metrics_snapshot() report its rows
--      (events_default_rows), an alert fires while it holds any.
--
-- Privileges: events had no grants (every access is through SECURITY DEFINER
-- functions); the parent and its partitions have none either.
--
-- Functions (applied by afterAll): events_partitions_ensure, event_partitions,
-- _events_drop_partitions (new); reap_events (both), status(), metrics_snapshot().
-- Their signatures and results are unchanged (0.2.0 replicas run beside this release).
-- At older migration targets (pgmigrate -t 24) events is a plain table and
-- reap_events deletes rows as before.

LOCK TABLE switchboard.events IN ACCESS EXCLUSIVE MODE;

ALTER TABLE switchboard.events RENAME TO events_p0;
ALTER INDEX switchboard.events_pkey RENAME TO events_p0_pkey;
ALTER INDEX switchboard.events_user RENAME TO events_p0_user_id_id_idx;
ALTER INDEX switchboard.events_room RENAME TO events_p0_room_id_idx;
ALTER INDEX switchboard.events_created RENAME TO events_p0_created_at_idx;
ALTER INDEX switchboard.events_xid RENAME TO events_p0_xid_idx;

CREATE TABLE switchboard.events (
    id         bigint NOT NULL,
    user_id    uuid,
    room       text,
    event      text NOT NULL,
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT events_pkey PRIMARY KEY (id),
    CONSTRAINT events_target_check CHECK ((user_id IS NULL) <> (room IS NULL))
) PARTITION BY RANGE (id);
CREATE INDEX events_user ON switchboard.events (user_id, id) WHERE user_id IS NOT NULL;
CREATE INDEX events_room ON switchboard.events (room, id) WHERE room IS NOT NULL;
CREATE INDEX events_created ON switchboard.events (created_at);
CREATE INDEX events_xid ON switchboard.events (xid);
REVOKE ALL ON TABLE switchboard.events FROM PUBLIC;
-- Before any partition is created: LIKE ... INCLUDING COMMENTS copies the columns' COMMENTs.
COMMENT ON TABLE switchboard.events IS
    'Events for users and rooms, kept for the resume window (reap_events()). Written by notify_user() / notify_room(). Partitioned by RANGE (id) since V0037: reap_events drops a whole partition once every row of it is reapable; events_partitions_ensure() keeps partitions ahead of event_id_seq; events_default catches ids no partition covers. See event_partitions().';
COMMENT ON COLUMN switchboard.events.id IS 'Event id (event_id_seq): unique, increasing in insert order, not commit order (delivery order is by tick). The partition key.';
COMMENT ON COLUMN switchboard.events.user_id IS 'Target user (or NULL when room is set).';
COMMENT ON COLUMN switchboard.events.room IS 'Target room (or NULL when user_id is set).';
COMMENT ON COLUMN switchboard.events.event IS 'Event label, e.g. run.updated.';
COMMENT ON COLUMN switchboard.events.payload IS 'JSON payload, up to 1 MiB.';
COMMENT ON COLUMN switchboard.events.created_at IS 'When it was published.';
COMMENT ON COLUMN switchboard.events.xid IS 'The publishing transaction (pg_current_xact_id()): a tick''s snapshot decides which batch the event belongs to, whatever order ids were assigned in.';

-- Knobs and counters of the partition maintenance (one row).
CREATE TABLE switchboard.event_partitioning (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    min_span       bigint NOT NULL DEFAULT 10000 CHECK (min_span BETWEEN 100 AND 1000000000000),
    ahead          integer NOT NULL DEFAULT 2 CHECK (ahead BETWEEN 1 AND 50),
    lock_timeout   interval NOT NULL DEFAULT '100 milliseconds'
                   CHECK (lock_timeout BETWEEN interval '1 millisecond' AND interval '10 seconds'),
    dropped        bigint NOT NULL DEFAULT 0,
    drops_skipped  bigint NOT NULL DEFAULT 0,
    created        bigint NOT NULL DEFAULT 0,
    creates_skipped bigint NOT NULL DEFAULT 0,
    last_drop_at   timestamptz,
    last_create_at timestamptz
);
INSERT INTO switchboard.event_partitioning DEFAULT VALUES;
REVOKE ALL ON TABLE switchboard.event_partitioning FROM PUBLIC;

DO $convert$
DECLARE
    v_last bigint;
    v_called boolean;
    v_hi bigint;
    v_from bigint;
    v_span bigint;
BEGIN
    SELECT s.last_value, s.is_called INTO v_last, v_called FROM switchboard.event_id_seq s;
    -- The old table holds every id the sequence gave out so far: ids below v_hi.
    v_hi := greatest(CASE WHEN v_called THEN v_last ELSE v_last - 1 END,
                     coalesce((SELECT max(e.id) FROM switchboard.events_p0 e), 0)) + 1;
    -- Ids published in the last 5 minutes (the default keep): one partition should
    -- hold about one retention window.
    SELECT v_hi - min(e.id) INTO v_from FROM switchboard.events_p0 e WHERE e.created_at >= now() - interval '5 minutes';
    v_span := greatest(10000, coalesce(v_from, 0));
    EXECUTE format('ALTER TABLE switchboard.events_p0 ADD CONSTRAINT events_p0_range CHECK (id < %s) NOT VALID', v_hi);
    ALTER TABLE switchboard.events_p0 VALIDATE CONSTRAINT events_p0_range;
    EXECUTE format('ALTER TABLE switchboard.events ATTACH PARTITION switchboard.events_p0 FOR VALUES FROM (MINVALUE) TO (%s)',
                   v_hi);
    -- The check did its work (ATTACH skipped its scan); the partition bound says the same.
    ALTER TABLE switchboard.events_p0 DROP CONSTRAINT events_p0_range;
    EXECUTE format('COMMENT ON TABLE switchboard.events_p0 IS %L',
                   format('Partition of switchboard.events: the events stored before V0037 (ids below %s). '
                          'Dropped by reap_events once every row of it is reapable.', v_hi));
    FOR i IN 0..1 LOOP
        EXECUTE format('CREATE TABLE switchboard.%I (LIKE switchboard.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS)',
                       'events_p' || (v_hi + i * v_span));
        EXECUTE format('ALTER TABLE switchboard.events ATTACH PARTITION switchboard.%I FOR VALUES FROM (%s) TO (%s)',
                       'events_p' || (v_hi + i * v_span), v_hi + i * v_span, v_hi + (i + 1) * v_span);
        EXECUTE format('REVOKE ALL ON TABLE switchboard.%I FROM PUBLIC', 'events_p' || (v_hi + i * v_span));
        EXECUTE format('COMMENT ON TABLE switchboard.%I IS %L', 'events_p' || (v_hi + i * v_span),
                       format('Partition of switchboard.events: ids %s to %s, created ahead by V0037. '
                              'Dropped by reap_events once every row of it is reapable.',
                              v_hi + i * v_span, v_hi + (i + 1) * v_span - 1));
    END LOOP;
END
$convert$;

-- CREATE TABLE + ATTACH here too (the columns' COMMENTs come with LIKE).
CREATE TABLE switchboard.events_default
    (LIKE switchboard.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS);
ALTER TABLE switchboard.events ATTACH PARTITION switchboard.events_default DEFAULT;
REVOKE ALL ON TABLE switchboard.events_default FROM PUBLIC;

COMMENT ON TABLE switchboard.events_default IS
    'DEFAULT partition of switchboard.events: events whose id no partition covers (the sequence outran the partitions created ahead: a burst). A publish never fails for want of a partition. Its rows are deleted row by row once reapable; the next partition starts above them. Normally empty: status()/metrics_snapshot() report events_default_rows and an alert fires while it holds rows.';
COMMENT ON TABLE switchboard.event_partitioning IS
    'One row: how events_partitions_ensure() sizes partitions and how reap_events drops them, and what they did (counters). UPDATE it to change min_span, ahead or lock_timeout.';
COMMENT ON COLUMN switchboard.event_partitioning.singleton IS 'Always true (one row).';
COMMENT ON COLUMN switchboard.event_partitioning.min_span IS 'The smallest partition, in ids; a new partition spans max(min_span, the ids published over the last keep window).';
COMMENT ON COLUMN switchboard.event_partitioning.ahead IS 'How many empty partitions (no id allocated in them yet) to keep above event_id_seq.';
COMMENT ON COLUMN switchboard.event_partitioning.lock_timeout IS 'How long a drop waits for its ACCESS EXCLUSIVE locks (and a create for the DEFAULT partition''s) before it skips to the next sweep; publishers and relay reads that arrive meanwhile queue behind it, so this bounds the stall a sweep can cause.';
COMMENT ON COLUMN switchboard.event_partitioning.dropped IS 'Partitions dropped by reap_events so far.';
COMMENT ON COLUMN switchboard.event_partitioning.drops_skipped IS 'Drops skipped because the lock was not granted within lock_timeout (a transaction that published held it), or because a row committed in the meantime; tried again at the next sweep.';
COMMENT ON COLUMN switchboard.event_partitioning.created IS 'Partitions created ahead by events_partitions_ensure() so far.';
COMMENT ON COLUMN switchboard.event_partitioning.creates_skipped IS 'Partition creations skipped (lock on events_default not granted within lock_timeout); tried again at the next sweep.';
COMMENT ON COLUMN switchboard.event_partitioning.last_drop_at IS 'When reap_events last dropped a partition.';
COMMENT ON COLUMN switchboard.event_partitioning.last_create_at IS 'When events_partitions_ensure() last created a partition.';
