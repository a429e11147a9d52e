-- Failover awareness (issue 12).
--
-- A promoted standby, and a primary restarted after a crash, start with every
-- UNLOGGED table empty (tickets, rate buckets, replica registry, presence, tool
-- calls). This marker is itself UNLOGGED: its row disappears exactly when that
-- state is wiped, so a replica that finds a new "since" knows the UNLOGGED
-- state it relied on is gone (see switchboard.db_instance() in
-- db/functions/80_status.sql). One row, written by db_instance().
CREATE UNLOGGED TABLE switchboard.unlogged_epoch (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    since     timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE switchboard.unlogged_epoch IS
    'One row, UNLOGGED: when the UNLOGGED state (tickets, rate buckets, registry, presence, tool calls) began. Emptied by crash recovery and by promotion.';
