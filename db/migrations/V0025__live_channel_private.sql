-- V0025: the live channel private (issue 32).
--
-- LISTEN has no permissions. With the live path on, publishers sent every event
-- whole on the fixed channel switchboard_live, so any role that could connect read
-- every event's user, room, label and payload there; and it could flood that channel
-- with messages whose MAC does not verify, each of which made the relay re-read the
-- key on its next read.
--
-- Now the channel is named after the key: switchboard_live_<32 hex digits of
-- sha256('switchboard-live-channel:' || key)>. A role that cannot read event_live
-- cannot name it (the hash does not give the key back; 128 bits are not guessed),
-- and nothing is sent on switchboard_live any more. A generated column: the name
-- follows every key change (event_live_path(rotate_key => true)) by construction.
-- (ADD COLUMN rewrites this one-row table under an ACCESS EXCLUSIVE lock: publishers
-- read it, so they wait for the migration's few milliseconds.)
--
-- Function changes (applied by afterAll), all in 50_events.sql:
--   _publish: NOTIFYs the live message on event_live.channel (read in the same SELECT
--     as the pads).
--   relay_live_key(OUT key, OUT channel): the key and its channel (was: the key).
--     The live path is unreleased (V0020, after 0.2.0), so dropped and re-created
--     rather than given a _v2.
--   relay_live_listen(channel, listening): new. The relay LISTENs on the channel
--     through it, with the name as a bound parameter, so the name is not in the
--     LISTEN session's query text (pg_stat_activity, which pg_read_all_stats reads).
--   event_live_path: NOTIFYs {"live":1} on switchboard_events, so every relay
--     re-reads the key and LISTENs on the new channel at once.
ALTER TABLE switchboard.event_live
    ADD COLUMN channel text NOT NULL GENERATED ALWAYS AS
        ('switchboard_live_' || left(encode(sha256('switchboard-live-channel:'::bytea || key), 'hex'), 32)) STORED;
COMMENT ON COLUMN switchboard.event_live.channel IS
    'The channel live messages are sent on: switchboard_live_ and the first 32 hex digits of sha256(''switchboard-live-channel:'' || key). Secret like the key: a role that can name it can LISTEN to every event.';
COMMENT ON TABLE switchboard.event_live IS
    'The verified live path (off by default): switch it with event_live_path(). The key signs live NOTIFYs and names their channel; only the owner and switchboard_app (relay_live_key()) can read them.';
-- (IF EXISTS: on a fresh install the function files run after every migration.)
DROP FUNCTION IF EXISTS switchboard.relay_live_key();
