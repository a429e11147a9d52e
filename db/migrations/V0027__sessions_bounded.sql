-- V0027: login sessions bounded in rows and in time, and a refresh that survives a
-- lost response (issue 32).
--
-- refresh_tokens grew without bound: every rotation inserted a row that left only
-- with its session, and a session that kept refreshing never expired (300
-- refreshes in 2.9 s left 300 rows for one session). Now:
--
-- * Each token row knows its generation (0 at login, +1 per rotation; unique per
--   session, so one session can never hold two successors of one token), and a
--   rotation keeps only the newest 8 rows of its session. A spent token older
--   than that reads as unknown (401, nothing revoked) instead of as reuse: reuse
--   detection covers the last 7 rotations, which is hours of a browser's normal
--   refreshing; a thief replaying something older gains nothing either way.
-- * sessions.max_expires_at: an absolute lifetime fixed at login
--   (SWITCHBOARD_SESSION_MAX_LIFETIME, 30 days by default); a refresh moves
--   expires_at to least(now() + lifetime, max_expires_at), never past it.
--   Live sessions get created_at + 30 days (the default); one that is older than
--   that has expired from now on (its next refresh ends it, and its sockets close
--   when the expiry their replica knows passes, at the latest).
-- * Loss-tolerant rotation (RFC 9700 section 4.14.2; Auth0's "reuse interval",
--   Okta's "grace period"): the spent row keeps a random seed from which its
--   successor was derived (successor = sha256(token || seed)), and an HMAC of the
--   client that spent it. The same client presenting the spent token again within
--   the grace, before the successor was used, is handed the SAME successor
--   (recomputed, never stored: the table still holds no usable token); any other
--   replay ends the session. Seed and fingerprint are cleared when the successor
--   is used.
--
-- Function changes (applied by afterAll): start_session_v2 and refresh_session_v2
-- beside the 0.2.0 signatures, which delegate to them (a 0.2 replica keeps working
-- during a rolling update; refresh_session keeps its 409 'concurrent' answer).

ALTER TABLE switchboard.sessions ADD COLUMN max_expires_at timestamptz;
UPDATE switchboard.sessions SET max_expires_at = created_at + interval '30 days';
UPDATE switchboard.sessions SET expires_at = max_expires_at WHERE expires_at > max_expires_at;
ALTER TABLE switchboard.sessions ALTER COLUMN max_expires_at SET NOT NULL;
ALTER TABLE switchboard.sessions ADD CONSTRAINT sessions_max_expiry_check CHECK (expires_at <= max_expires_at);

ALTER TABLE switchboard.refresh_tokens
    ADD COLUMN generation integer,
    ADD COLUMN successor_seed bytea,
    ADD COLUMN client_fingerprint bytea;
-- Existing families: keep the newest 8 rows (the unused token sorts last), numbered 0..7.
DELETE FROM switchboard.refresh_tokens t
 USING (SELECT r.hash, row_number() OVER (PARTITION BY r.session_id
                                          ORDER BY r.used_at IS NULL DESC, r.issued_at DESC, r.hash) AS rn
          FROM switchboard.refresh_tokens r) k
 WHERE t.hash = k.hash AND k.rn > 8;
UPDATE switchboard.refresh_tokens t SET generation = k.g
  FROM (SELECT r.hash, row_number() OVER (PARTITION BY r.session_id
                                          ORDER BY r.used_at IS NULL, r.issued_at, r.hash) - 1 AS g
          FROM switchboard.refresh_tokens r) k
 WHERE t.hash = k.hash;
ALTER TABLE switchboard.refresh_tokens ALTER COLUMN generation SET NOT NULL;
ALTER TABLE switchboard.refresh_tokens ADD CONSTRAINT refresh_tokens_seed_check
    CHECK (successor_seed IS NULL OR octet_length(successor_seed) = 32);
-- The family's rows in order: pruning (generation <= newest - 8) and the successor's
-- uniqueness; it replaces the plain index on session_id.
CREATE UNIQUE INDEX refresh_tokens_session_generation ON switchboard.refresh_tokens (session_id, generation);
DROP INDEX switchboard.refresh_tokens_session;

COMMENT ON COLUMN switchboard.sessions.max_expires_at IS
    'Absolute expiry, fixed at login (SWITCHBOARD_SESSION_MAX_LIFETIME): no refresh moves expires_at past it.';
COMMENT ON COLUMN switchboard.sessions.expires_at IS
    'Idle expiry: each refresh moves it to least(now() + the configured lifetime, max_expires_at).';
COMMENT ON TABLE switchboard.refresh_tokens IS
    'Refresh tokens, single use and rotating: only their SHA-256 is stored, and at most the newest 8 per session. Presenting a used one again ends the whole session (reuse detection), except the same client within the grace before the successor was used (it gets the same successor again).';
COMMENT ON COLUMN switchboard.refresh_tokens.generation IS
    '0 for the token issued at login, +1 per rotation; unique per session (one successor per token).';
COMMENT ON COLUMN switchboard.refresh_tokens.successor_seed IS
    'Random 32 bytes of a spent token: its successor is sha256(token || seed), recomputed for a replay within the grace. Useless without the token itself; cleared when the successor is used.';
COMMENT ON COLUMN switchboard.refresh_tokens.client_fingerprint IS
    'HMAC-SHA256 (server key) of the User-Agent and client network that spent the token (NULL: spent by a 0.2 replica); a replay within the grace must match it. Cleared with successor_seed.';
