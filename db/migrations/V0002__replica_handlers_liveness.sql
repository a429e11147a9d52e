-- V0002: replicas register what they serve and how often they heartbeat.
--
-- handlers: the task handler names the replica's scheduler runs (NULL: a
--   replica of the previous release, which does not say). POST /tasks refuses
--   a handler that no live replica of its version registers; the
--   switchboard.handlers view and status() show handlers nobody serves.
-- version: the server version (switchboard.__version__) of the replica.
-- heartbeat_interval: SWITCHBOARD_HEARTBEAT_INTERVAL of the replica. Liveness
--   used to be a fixed 30 seconds everywhere: with an interval of 60 s every
--   user looked offline (and /tools/call answered 404) between heartbeats, and
--   maintenance reaped live replicas. live_window is derived from it in ONE
--   place, here: three missed heartbeats, never less than the old 30 s (a
--   GC pause or a loaded node must not flap presence).
ALTER TABLE switchboard.replica_registry
    ADD COLUMN handlers text[],
    ADD COLUMN version text,
    ADD COLUMN heartbeat_interval interval NOT NULL DEFAULT '5 seconds',
    ADD COLUMN live_window interval NOT NULL
        GENERATED ALWAYS AS (greatest(interval '30 seconds', 3 * heartbeat_interval)) STORED;
