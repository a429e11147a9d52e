-- Login sessions and rotating refresh tokens (V0011).
--
-- A session is one login; its refresh tokens are one family. The server
-- hands the refresh token to the browser in an HttpOnly cookie and never
-- stores it: only its SHA-256 is kept (like tickets). refresh_session() uses
-- the presented token up and issues the next one in the same transaction.
-- Presenting a token that was already used is the theft signal (RFC 9700
-- section 4.14.2, "refresh token rotation"): the whole family ends, so whichever of
-- the thief and the user holds the newer token loses it too.
--
-- Two tabs of one browser refreshing at the same instant send the same
-- cookie; the second would look like reuse. A token used less than
-- race_window ago is answered 'concurrent' instead (no new token, the family
-- stays): the browser already holds the newer cookie from the first answer
-- and simply retries. A replay after the window ends the family.
--
-- Ending a session is announced on switchboard_control as
-- {"kind": "session", "session_id"} (ids only, like every hint): each replica
-- re-reads it with session_states() and closes the sockets opened under it.
-- A password change, a role change and disable_user end all the user's
-- sessions too (60_users.sql); those already close sockets through the
-- user's token epoch, so they need no per-session announcement.

-- One place that ends a session: marks it, drops its unused tickets,
-- announces it. True if it was live.
CREATE OR REPLACE FUNCTION switchboard._end_session(session_id uuid, reason text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.sessions s SET ended_at = now(), end_reason = _end_session.reason
     WHERE s.id = _end_session.session_id AND s.ended_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM switchboard.tickets t WHERE t.session_id = _end_session.session_id;
    PERFORM switchboard._announce(jsonb_build_object('kind', 'session', 'session_id', _end_session.session_id));
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION switchboard._end_session(uuid, text) FROM PUBLIC;

-- Every live session of a user (password change, role change, disable): one
-- UPDATE on the partial index sessions_user_live. No announcement: the
-- caller bumps the user's token epoch, which closes the sockets.
CREATE OR REPLACE FUNCTION switchboard._end_user_sessions(user_id uuid, reason text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    UPDATE switchboard.sessions s SET ended_at = now(), end_reason = _end_user_sessions.reason
     WHERE s.user_id = _end_user_sessions.user_id AND s.ended_at IS NULL;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM switchboard.tickets t WHERE t.user_id = _end_user_sessions.user_id AND t.session_id IS NOT NULL;
    RETURN v_n;
END
$$;
REVOKE ALL ON FUNCTION switchboard._end_user_sessions(uuid, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_lifetime(lifetime interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lifetime IS NULL OR lifetime < interval '1 second' OR lifetime > interval '365 days' THEN
        RAISE EXCEPTION 'invalid session lifetime "%"', lifetime USING ERRCODE = '22023',
            HINT = 'A session lives between 1 second and 365 days (SWITCHBOARD_SESSION_TTL).';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_lifetime(interval) FROM PUBLIC;

-- 256 random bits, hex: the refresh token. Stored only as sha256.
CREATE OR REPLACE FUNCTION switchboard.start_session(user_id uuid, lifetime interval)
RETURNS TABLE (session_id uuid, refresh_token text, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_raw bytea := switchboard._random_128() || switchboard._random_128();
    v_disabled boolean;
    v_id uuid;
    v_exp timestamptz := now() + lifetime;
BEGIN
    PERFORM switchboard._check_lifetime(lifetime);
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = start_session.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', start_session.user_id USING ERRCODE = 'P0002';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', start_session.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot log in; see enable_user().';
    END IF;
    INSERT INTO switchboard.sessions (user_id, expires_at) VALUES (start_session.user_id, v_exp)
    RETURNING id INTO v_id;
    INSERT INTO switchboard.refresh_tokens (hash, session_id) VALUES (sha256(v_raw), v_id);
    RETURN QUERY SELECT v_id, encode(v_raw, 'hex'), v_exp;
END
$$;
COMMENT ON FUNCTION switchboard.start_session(uuid, interval) IS
    'Start a login session for user_id: its id, its first refresh token (64 hex characters, only the SHA-256 is stored) and when it expires unless refreshed (now() + lifetime). P0002 for an unknown user, 28000 for a disabled one.';
REVOKE ALL ON FUNCTION switchboard.start_session(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.start_session(uuid, interval) TO switchboard_app;

-- Returns an outcome instead of raising: a detected reuse must COMMIT the end
-- of the family (an exception would roll it back).
-- Exclusivity: the UPDATE ... WHERE used_at IS NULL decides; two refreshes
-- with one token serialise on its row and the second finds it used. A logout
-- racing a refresh serialise on the session row (FOR UPDATE).
CREATE OR REPLACE FUNCTION switchboard.refresh_session(refresh_token text, lifetime interval,
                                                       race_window interval DEFAULT '10 seconds')
RETURNS TABLE (outcome text, session_id uuid, user_id uuid, username text, role text, token_epoch integer,
               new_refresh_token text, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_hash bytea;
    v_sid uuid;
    v_used timestamptz;
    v_s switchboard.sessions;
    v_u record;
    v_raw bytea;
    v_exp timestamptz;
BEGIN
    PERFORM switchboard._check_lifetime(lifetime);
    IF refresh_token IS NULL OR refresh_token !~ '^[0-9a-f]{64}$' THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::uuid, NULL::uuid, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    v_hash := sha256(decode(refresh_token, 'hex'));
    UPDATE switchboard.refresh_tokens t SET used_at = clock_timestamp()
     WHERE t.hash = v_hash AND t.used_at IS NULL
    RETURNING t.session_id INTO v_sid;
    IF NOT FOUND THEN
        SELECT t.session_id, t.used_at INTO v_sid, v_used FROM switchboard.refresh_tokens t WHERE t.hash = v_hash;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'unknown'::text, NULL::uuid, NULL::uuid, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
            RETURN;
        END IF;
        SELECT * INTO v_s FROM switchboard.sessions s WHERE s.id = v_sid FOR UPDATE;
        IF v_s.ended_at IS NOT NULL THEN
            RETURN QUERY SELECT 'ended'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
        ELSIF v_used > clock_timestamp() - coalesce(race_window, interval '0') THEN
            RETURN QUERY SELECT 'concurrent'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
        ELSE
            PERFORM switchboard._end_session(v_sid, 'reuse');
            RETURN QUERY SELECT 'reused'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                NULL::text, NULL::timestamptz;
        END IF;
        RETURN;
    END IF;
    SELECT * INTO v_s FROM switchboard.sessions s WHERE s.id = v_sid FOR UPDATE;
    SELECT u.username, u.role, u.disabled, u.token_epoch INTO v_u FROM switchboard.users u WHERE u.id = v_s.user_id;
    IF v_s.ended_at IS NULL AND (v_u.disabled OR v_s.expires_at <= clock_timestamp()) THEN
        PERFORM switchboard._end_session(v_sid, CASE WHEN v_u.disabled THEN 'disabled' ELSE 'expired' END);
        v_s.ended_at := now();
    END IF;
    IF v_s.ended_at IS NOT NULL THEN
        RETURN QUERY SELECT 'ended'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    v_raw := switchboard._random_128() || switchboard._random_128();
    v_exp := now() + lifetime;
    INSERT INTO switchboard.refresh_tokens (hash, session_id) VALUES (sha256(v_raw), v_sid);
    UPDATE switchboard.sessions s SET refreshed_at = now(), expires_at = v_exp WHERE s.id = v_sid;
    RETURN QUERY SELECT 'rotated'::text, v_sid, v_s.user_id, v_u.username::text, v_u.role::text,
                        v_u.token_epoch::integer, encode(v_raw, 'hex'), v_exp;
END
$$;
COMMENT ON FUNCTION switchboard.refresh_session(text, interval, interval) IS
    'Rotate a refresh token. outcome: rotated (new_refresh_token issued, the session''s expiry moved to now() + lifetime), unknown (no such token), ended (the session ended or expired), concurrent (the token was used less than race_window ago: retry with the newer one; nothing changed), reused (a used token came back: the whole session ended and was announced).';
REVOKE ALL ON FUNCTION switchboard.refresh_session(text, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.refresh_session(text, interval, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.end_session(session_id uuid, reason text DEFAULT 'logout')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF reason IS NULL OR reason NOT IN ('logout', 'revoked') THEN
        RAISE EXCEPTION 'invalid session end reason "%"', reason USING ERRCODE = '22023',
            HINT = 'end_session() takes logout or revoked; the other reasons are set by the functions that cause them.';
    END IF;
    RETURN switchboard._end_session(session_id, reason);
END
$$;
COMMENT ON FUNCTION switchboard.end_session(uuid, text) IS
    'End a session (logout, or an administrator''s revoke): its refresh tokens stop working, its unused tickets are dropped, and every replica closes the sockets opened under it (1008). False if it had already ended or does not exist.';
REVOKE ALL ON FUNCTION switchboard.end_session(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.end_session(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.end_session_by_refresh(refresh_token text)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_sid uuid;
BEGIN
    IF refresh_token IS NULL OR refresh_token !~ '^[0-9a-f]{64}$' THEN
        RETURN NULL;
    END IF;
    SELECT t.session_id INTO v_sid FROM switchboard.refresh_tokens t
     WHERE t.hash = sha256(decode(refresh_token, 'hex'));
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM switchboard._end_session(v_sid, 'logout');
    RETURN v_sid;
END
$$;
COMMENT ON FUNCTION switchboard.end_session_by_refresh(text) IS
    'Logout by refresh token (a client whose access token has expired): ends the token''s session. The session id, or NULL if the token is unknown.';
REVOKE ALL ON FUNCTION switchboard.end_session_by_refresh(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.end_session_by_refresh(text) TO switchboard_app;

-- The replica's own read behind a "session" hint, and its periodic check of
-- sockets whose session's known expiry has passed (it may have been refreshed
-- on another replica since).
CREATE OR REPLACE FUNCTION switchboard.session_states(session_ids uuid[])
RETURNS TABLE (session_id uuid, user_id uuid, expires_at timestamptz, ended_at timestamptz, end_reason text,
               live boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(session_ids) > 10000 THEN
        RAISE EXCEPTION 'too many session ids (%)', cardinality(session_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per call.';
    END IF;
    RETURN QUERY SELECT s.id, s.user_id, s.expires_at, s.ended_at, s.end_reason,
                        s.ended_at IS NULL AND s.expires_at > clock_timestamp()
                   FROM switchboard.sessions s WHERE s.id = ANY (coalesce(session_ids, '{}'));
END
$$;
COMMENT ON FUNCTION switchboard.session_states(uuid[]) IS
    'Expiry and end of the given sessions (no row for an unknown id); live = not ended and not expired. What a replica reads after a "session" announcement instead of trusting it.';
REVOKE ALL ON FUNCTION switchboard.session_states(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.session_states(uuid[]) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_sessions(keep interval DEFAULT '1 day')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    -- Kept for `keep` after the end, so a late replay of an old token still
    -- reads as "ended" (401) rather than "unknown"; refresh_tokens cascade.
    DELETE FROM switchboard.sessions s
     WHERE s.expires_at < now() - keep OR s.ended_at < now() - keep;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_sessions(interval) IS
    'Delete sessions (and their refresh tokens) that ended or expired more than keep ago. Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_sessions(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_sessions(interval) TO switchboard_app;

-- issue_ticket_v2 binds the ticket to the session it is minted under;
-- issue_ticket (the previous release's call) is a thin overload with no session.
CREATE OR REPLACE FUNCTION switchboard.issue_ticket_v2(user_id uuid, session_id uuid,
                                                       ttl interval DEFAULT '30 seconds')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_raw bytea := switchboard._random_128();
    v_disabled boolean;
BEGIN
    IF ttl IS NULL OR ttl <= interval '0' OR ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid ticket ttl "%"', ttl USING ERRCODE = '22023',
            HINT = 'A ticket lives between 1 second and 1 hour; default 30 seconds.';
    END IF;
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = issue_ticket_v2.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', issue_ticket_v2.user_id USING ERRCODE = 'P0002';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', issue_ticket_v2.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot get a ticket; see enable_user().';
    END IF;
    IF issue_ticket_v2.session_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM switchboard.sessions s
             WHERE s.id = issue_ticket_v2.session_id AND s.user_id = issue_ticket_v2.user_id
               AND s.ended_at IS NULL AND s.expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'session % has ended', issue_ticket_v2.session_id USING ERRCODE = '28000',
            HINT = 'Log in again (or refresh) for a live session.';
    END IF;
    INSERT INTO switchboard.tickets (hash, user_id, expires_at, session_id)
    VALUES (sha256(v_raw), issue_ticket_v2.user_id, now() + ttl, issue_ticket_v2.session_id);
    RETURN encode(v_raw, 'hex');
END
$$;
COMMENT ON FUNCTION switchboard.issue_ticket_v2(uuid, uuid, interval) IS
    'issue_ticket bound to a session: the socket it opens belongs to session_id (NULL: no session, a token from before sessions). 28000 if the session has ended or expired or is not the user''s.';
REVOKE ALL ON FUNCTION switchboard.issue_ticket_v2(uuid, uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.issue_ticket_v2(uuid, uuid, interval) TO switchboard_app;

-- consume_ticket_v2 also returns the session (and its expiry, which the
-- socket watches); a ticket whose session ended meanwhile is refused.
CREATE OR REPLACE FUNCTION switchboard.consume_ticket_v2(ticket text)
RETURNS TABLE (user_id uuid, session_id uuid, session_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_user uuid;
    v_sid uuid;
    v_expires timestamptz;
    v_sexp timestamptz;
BEGIN
    IF ticket IS NULL OR ticket !~ '^[0-9A-Fa-f]{32}$' THEN
        RETURN;
    END IF;
    DELETE FROM switchboard.tickets t WHERE t.hash = sha256(decode(lower(ticket), 'hex'))
    RETURNING t.user_id, t.expires_at, t.session_id INTO v_user, v_expires, v_sid;
    IF NOT FOUND OR v_expires <= clock_timestamp() THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = v_user AND NOT u.disabled) THEN
        RETURN;
    END IF;
    IF v_sid IS NOT NULL THEN
        SELECT s.expires_at INTO v_sexp FROM switchboard.sessions s
         WHERE s.id = v_sid AND s.ended_at IS NULL AND s.expires_at > clock_timestamp();
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT v_user, v_sid, v_sexp;
END
$$;
COMMENT ON FUNCTION switchboard.consume_ticket_v2(text) IS
    'Consume a ticket exactly once: its user, session (NULL for a ticket from before sessions) and the session''s expiry; no row if the ticket is unknown, malformed, expired or used, its user is disabled, or its session has ended or expired.';
REVOKE ALL ON FUNCTION switchboard.consume_ticket_v2(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.consume_ticket_v2(text) TO switchboard_app;

-- auth_snapshot_v3 adds the sessions ended within since (kind 'session', id =
-- the session id): what a replica reloads after its LISTEN connection
-- reconnects. auth_snapshot_v2 stays for the previous release's server.
CREATE OR REPLACE FUNCTION switchboard.auth_snapshot_v3(since interval DEFAULT '1 day')
RETURNS TABLE (kind text, id text, user_id uuid, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT a.kind, a.id, a.user_id, a.role, a.disabled, a.token_epoch FROM switchboard.auth_snapshot_v2(since) a
    UNION ALL
    SELECT 'session'::text, s.id::text, s.user_id, NULL::text, NULL::boolean, NULL::integer
      FROM switchboard.sessions s WHERE s.ended_at > now() - auth_snapshot_v3.since;
END
$$;
COMMENT ON FUNCTION switchboard.auth_snapshot_v3(interval) IS
    'auth_snapshot_v2 plus the sessions ended within since (kind session): their access tokens are refused.';
REVOKE ALL ON FUNCTION switchboard.auth_snapshot_v3(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.auth_snapshot_v3(interval) TO switchboard_app;
