-- V0035: presence, pushed (issue 34, item 1).
--
-- presence_meta: the small metadata object a connection sets for itself in a
-- room it joined (WebSocket action presence.track), stored where every replica
-- can read it: a replica pushes presence.state / presence.diff frames computed
-- from presence_sockets (who is online, V0001) and these rows (what each
-- connection said about itself), across replicas. UNLOGGED like
-- presence_sockets: emptied by crash recovery and by promotion (failover.py
-- notices; the heartbeat's presence_meta_sync re-asserts the rows from the
-- replica's memory), and a replica's rows go with its registry row
-- (ON DELETE CASCADE: replica_stop, reap_replicas). The application role reads
-- and writes them only through the SECURITY DEFINER functions of
-- db/functions/76_presence_push.sql, which bound every value.
CREATE UNLOGGED TABLE switchboard.presence_meta (
    replica_id text NOT NULL REFERENCES switchboard.replica_registry (id) ON DELETE CASCADE,
    conn       bigint NOT NULL,
    room       text NOT NULL,
    user_id    uuid NOT NULL,
    meta       jsonb NOT NULL DEFAULT '{}',
    since      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (replica_id, conn, room),
    CONSTRAINT presence_meta_bounded CHECK (jsonb_typeof(meta) = 'object' AND octet_length(meta::text) <= 1024
                                            AND length(room) BETWEEN 1 AND 128)
);
CREATE INDEX presence_meta_room_user ON switchboard.presence_meta (room, user_id);
COMMENT ON TABLE switchboard.presence_meta IS
    'Presence metadata of each tracked connection per room (UNLOGGED; WebSocket action presence.track). Read through presence_of_rooms().';
COMMENT ON COLUMN switchboard.presence_meta.replica_id IS 'The replica holding the connection (its rows go with the replica).';
COMMENT ON COLUMN switchboard.presence_meta.conn IS 'The connection''s number on that replica.';
COMMENT ON COLUMN switchboard.presence_meta.room IS 'The room the connection tracks itself in.';
COMMENT ON COLUMN switchboard.presence_meta.user_id IS 'The connection''s user.';
COMMENT ON COLUMN switchboard.presence_meta.meta IS 'What the connection said about itself: an object of at most 8 scalar values, 256 bytes.';
COMMENT ON COLUMN switchboard.presence_meta.since IS 'When it was first tracked.';
