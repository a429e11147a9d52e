-- V0020: the verified live path (opt-in): an event's frame straight from its NOTIFY.
--
-- Every relay reads every event it delivers (relay_read_v2), because a NOTIFY
-- payload can be forged by any role that can connect. That read is most of the
-- COMMIT -> frame time (BENCHMARKS.md, figure 5). With the live path on, a
-- publisher also NOTIFYs the whole event on channel switchboard_live, signed
-- with HMAC-SHA256 under a key only the owner and switchboard_app can read; a
-- relay delivers a message whose MAC verifies at once, and still reads every
-- event afterwards (that read moves its position and confirms the frame's
-- cursor). A message that does not verify is a hint, as before.
--
-- Off by default: with it on, event contents travel on the bus, and LISTEN has
-- no permissions (any role that can connect can read them). See README
-- "The live path" and docs/security.md.
CREATE TABLE switchboard.event_live (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    enabled boolean NOT NULL DEFAULT false,
    max_bytes integer NOT NULL DEFAULT 4000 CHECK (max_bytes BETWEEN 0 AND 7900),
    -- HMAC-SHA256 key (32 bytes from gen_random_uuid(), which draws on pg_strong_random)
    -- and its inner and outer pads, precomputed so a publish hashes twice and no more.
    -- event_live_path() computes the pads; enabling by hand without them is refused.
    key bytea NOT NULL CHECK (octet_length(key) = 32),
    ipad bytea NOT NULL DEFAULT '',
    opad bytea NOT NULL DEFAULT '',
    key_created_at timestamptz NOT NULL DEFAULT now(),
    -- Whether publishers still send the per-transaction {"id": N} hint on switchboard_events
    -- while the path is on (new relays need only the live message; previous-release
    -- relays, which do not LISTEN on switchboard_live, need the hint).
    id_hints boolean NOT NULL DEFAULT true,
    CONSTRAINT event_live_pads CHECK (NOT enabled OR (octet_length(ipad) = 64 AND octet_length(opad) = 64))
);
REVOKE ALL ON TABLE switchboard.event_live FROM PUBLIC;
COMMENT ON COLUMN switchboard.event_live.singleton IS 'Always true: one row.';
COMMENT ON COLUMN switchboard.event_live.enabled IS 'Whether publishers send each event signed on switchboard_live (event_live_path()).';
COMMENT ON COLUMN switchboard.event_live.max_bytes IS 'The largest live message; an event above it sends a {"b": id} barrier and is read.';
COMMENT ON COLUMN switchboard.event_live.key IS 'The HMAC-SHA256 key (32 bytes); relays read it with relay_live_key().';
COMMENT ON COLUMN switchboard.event_live.ipad IS 'The key zero-padded to 64 bytes XOR 0x36 (RFC 2104), set by event_live_path().';
COMMENT ON COLUMN switchboard.event_live.opad IS 'The key zero-padded to 64 bytes XOR 0x5c (RFC 2104), set by event_live_path().';
COMMENT ON COLUMN switchboard.event_live.key_created_at IS 'When the key was drawn (event_live_path(..., rotate_key => true)).';
COMMENT ON COLUMN switchboard.event_live.id_hints IS 'While enabled: whether publishers also send the {"id": N} hint on switchboard_events (true by default; previous-release relays need it during a rolling update, this release''s do not).';
COMMENT ON TABLE switchboard.event_live IS
    'The verified live path (off by default): switch it with event_live_path(). The key signs live NOTIFYs; only the owner and switchboard_app (relay_live_key()) can read it.';

-- Function changes (applied by afterAll): _check_event refuses payloads nested more
-- than 64 levels (22023; readers parse recursively, and one such event made relays
-- reconnect forever); _live_pads, event_live_path,
-- relay_live_key (new); _publish sends the live message when enabled.
INSERT INTO switchboard.event_live (key)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
