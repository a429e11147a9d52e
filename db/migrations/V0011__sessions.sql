-- V0011: login sessions with rotating refresh tokens (issue 19).
--
-- A session is one login: its refresh tokens form one family. Each refresh
-- uses up the presented token and issues the next; presenting a used token
-- again (a copy in an attacker's hands, or the real client after the copy was
-- used) ends the whole family ("reuse detection"). Only SHA-256 hashes of
-- refresh tokens are stored. Access tokens carry the session id ("sid"), and
-- so do WebSocket tickets: a socket belongs to its session and is closed when
-- the session ends (db/functions/62_sessions.sql).

CREATE TABLE switchboard.sessions (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id      uuid NOT NULL REFERENCES switchboard.users (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    refreshed_at timestamptz NOT NULL DEFAULT now(),
    -- Idle lifetime: every refresh moves it to now() + the configured lifetime.
    expires_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    end_reason   text,
    CONSTRAINT sessions_end_reason_check CHECK (
        end_reason IN ('logout', 'reuse', 'expired', 'password', 'role', 'disabled', 'revoked')),
    CONSTRAINT sessions_ended_check CHECK ((ended_at IS NULL) = (end_reason IS NULL))
);
-- The live sessions of a user (ended by a password change, role change, disable).
CREATE INDEX sessions_user_live ON switchboard.sessions (user_id) WHERE ended_at IS NULL;
-- reap_sessions(): ended or expired long ago.
CREATE INDEX sessions_expires ON switchboard.sessions (expires_at);
REVOKE ALL ON TABLE switchboard.sessions FROM PUBLIC;

-- Every refresh token ever issued for a live (or recently ended) session:
-- used_at IS NULL is the family's current token; a used one presented again
-- is the reuse signal.
CREATE TABLE switchboard.refresh_tokens (
    hash       bytea PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES switchboard.sessions (id) ON DELETE CASCADE,
    issued_at  timestamptz NOT NULL DEFAULT now(),
    used_at    timestamptz
);
CREATE INDEX refresh_tokens_session ON switchboard.refresh_tokens (session_id);
REVOKE ALL ON TABLE switchboard.refresh_tokens FROM PUBLIC;

-- A ticket remembers the session it was minted under (NULL: a token from
-- before sessions, or a ticket issued by issue_ticket() of the previous release).
ALTER TABLE switchboard.tickets ADD COLUMN session_id uuid;
CREATE INDEX tickets_session ON switchboard.tickets (session_id) WHERE session_id IS NOT NULL;
