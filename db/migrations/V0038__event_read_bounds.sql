-- V0038: the ids a relay read can meet, recorded with each tick (issue 35, item 2).
--
-- events is partitioned by id (V0037), but a read (_events_after) finds its rows by
-- transaction id (events_xid): an event's batch is the first tick whose snapshot
-- sees its transaction. With no predicate on id, every read visited every partition
-- (the retained ones, the two ahead, events_default): 1.51x the CPU per relay
-- wake-up of one table, ~17 us per further partition (bench/events_partition_ops.py).
--
-- Each tick now records the sequence around its snapshot:
--   id_floor   event_id_seq's position read before the tick's own xid was assigned
--   floor_xid  that xid. A transaction with a larger xid got it later, and _publish
--              takes its xid before its event id (db/functions/50_events.sql), so
--              its events have ids above id_floor. (The snapshot's xmax cannot
--              serve: it is the oldest xid not completed; larger ones may be running.)
--   id_ceiling the position read after the snapshot: every event the snapshot sees
--              took its id before.
-- A read bounds the ids of each window by the floor of the newest tick whose
-- floor_xid is below the xmin of its first snapshot (every xid it can return is at
-- least that xmin) and by the ceiling of the window's last tick, so the plan prunes
-- the partitions outside.
-- Ticks from before this version have NULLs: no bound, as before.
--
-- ADD COLUMN without a default only changes the catalog (ACCESS EXCLUSIVE on
-- event_ticks for that instant); the new index covers no row yet.
ALTER TABLE switchboard.event_ticks ADD COLUMN id_floor bigint, ADD COLUMN floor_xid xid8,
    ADD COLUMN id_ceiling bigint;
-- A read finds its floor tick with one descent: the newest tick whose floor_xid is
-- below an xmin. floor_xid grows with tick (ticks are taken one at a time), so the
-- newest such tick is the one with the largest such floor_xid. Without the index a
-- transaction held open for long (its xid holds every snapshot's xmin back) would
-- make each read walk every tick taken since.
CREATE INDEX event_ticks_floor ON switchboard.event_ticks (floor_xid) WHERE floor_xid IS NOT NULL;
COMMENT ON COLUMN switchboard.event_ticks.id_floor IS
    'event_id_seq''s position read before this tick''s transaction id (floor_xid) was assigned (V0038). NULL on ticks from before V0038.';
COMMENT ON COLUMN switchboard.event_ticks.floor_xid IS
    'This tick''s own transaction id, assigned after id_floor was read (V0038): events of transactions with larger xids have ids above id_floor. NULL on ticks from before V0038.';
COMMENT ON COLUMN switchboard.event_ticks.id_ceiling IS
    'event_id_seq''s position read after this tick''s snapshot (V0038): every event the snapshot sees has an id at most this. NULL on ticks from before V0038.';
