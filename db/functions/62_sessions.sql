-- Login sessions and rotating refresh tokens (V0011; bounded and loss-tolerant
-- since V0027).
--
-- A session is one login; its refresh tokens are one family. The server
-- hands the refresh token to the browser in an HttpOnly cookie and never
-- stores it: only its SHA-256 is kept (like tickets). refresh_session_v2() uses
-- the presented token up and issues the next one in the same transaction.
-- Presenting a token that was already used is the theft signal (RFC 9700
-- section 4.14.2, "refresh token rotation"): the whole family ends, so whichever of
-- the thief and the user holds the newer token loses it too.
--
-- A response can be lost, and two tabs of one browser can refresh at the same
-- instant with the same cookie: both look like reuse. So the successor of a
-- token is derived, not drawn: sha256(token || seed) with a random seed kept on
-- the spent row. The same client (an HMAC of its User-Agent and network, made
-- by the server) presenting the spent token again within the grace, while the
-- successor is still unused, gets the same successor again ('resent'); a replay
-- from another client, after the grace, or after the successor was used ends
-- the family. The table never holds a usable token: the seed is worthless
-- without the spent token, which only its client has.
--
-- Every step of a refresh holds the session's row lock (FOR UPDATE), so the
-- refreshes, the logout and the ends of one session run one at a time; the
-- unique (session_id, generation) index makes a second successor of one token
-- impossible whatever happens. A rotation keeps the newest 8 rows of the
-- family (V0027 says why 8) and never moves the expiry past max_expires_at.
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

CREATE OR REPLACE FUNCTION switchboard._check_max_lifetime(lifetime interval, max_lifetime interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_lifetime IS NULL OR max_lifetime > interval '365 days' OR max_lifetime < lifetime THEN
        RAISE EXCEPTION 'invalid session max lifetime "%" for lifetime "%"', max_lifetime, lifetime
            USING ERRCODE = '22023',
            HINT = 'The absolute lifetime is at least the idle lifetime and at most 365 days (SWITCHBOARD_SESSION_MAX_LIFETIME >= SWITCHBOARD_SESSION_TTL).';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_max_lifetime(interval, interval) FROM PUBLIC;

-- The refresh token: 256 random bits, hex; stored only as sha256. The session
-- can never outlive now() + max_lifetime, however often it is refreshed.
CREATE OR REPLACE FUNCTION switchboard.start_session_v2(user_id uuid, lifetime interval, max_lifetime interval)
RETURNS TABLE (session_id uuid, refresh_token text, expires_at timestamptz, max_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_raw bytea := switchboard._random_128() || switchboard._random_128();
    v_disabled boolean;
    v_id uuid;
    v_max timestamptz;
    v_exp timestamptz;
BEGIN
    PERFORM switchboard._check_lifetime(lifetime);
    PERFORM switchboard._check_max_lifetime(lifetime, max_lifetime);
    v_max := now() + max_lifetime;
    v_exp := least(now() + lifetime, v_max);
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = start_session_v2.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', start_session_v2.user_id USING ERRCODE = 'P0002',
            HINT = 'Create the user first (create_user).';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', start_session_v2.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot log in; see enable_user().';
    END IF;
    INSERT INTO switchboard.sessions (user_id, expires_at, max_expires_at)
    VALUES (start_session_v2.user_id, v_exp, v_max)
    RETURNING id INTO v_id;
    INSERT INTO switchboard.refresh_tokens (hash, session_id, generation) VALUES (sha256(v_raw), v_id, 0);
    RETURN QUERY SELECT v_id, encode(v_raw, 'hex'), v_exp, v_max;
END
$$;
COMMENT ON FUNCTION switchboard.start_session_v2(uuid, interval, interval) IS
    'Start a login session for user_id: its id, its first refresh token (64 hex characters, only the SHA-256 is stored), when it expires unless refreshed (now() + lifetime) and when it ends whatever happens (now() + max_lifetime; max_lifetime >= lifetime). P0002 for an unknown user, 28000 for a disabled one, 22023 for a bad lifetime.';
REVOKE ALL ON FUNCTION switchboard.start_session_v2(uuid, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.start_session_v2(uuid, interval, interval) TO switchboard_app;

-- The 0.2.0 server's call (rolling updates): its sessions get the default absolute
-- lifetime of 30 days (or lifetime, if longer).
CREATE OR REPLACE FUNCTION switchboard.start_session(user_id uuid, lifetime interval)
RETURNS TABLE (session_id uuid, refresh_token text, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT s.session_id, s.refresh_token, s.expires_at
      FROM switchboard.start_session_v2(start_session.user_id, lifetime,
                                        greatest(lifetime, interval '30 days')) s;
END
$$;
COMMENT ON FUNCTION switchboard.start_session(uuid, interval) IS
    'The previous release''s start_session_v2 (kept one release for rolling updates): absolute lifetime 30 days, or lifetime if longer.';
REVOKE ALL ON FUNCTION switchboard.start_session(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.start_session(uuid, interval) TO switchboard_app;

-- The raising half of refresh_session_v2's argument checks.
CREATE OR REPLACE FUNCTION switchboard._check_refresh_args(lifetime interval, grace interval,
                                                          client_fingerprint bytea,
                                                          session_rate double precision, session_burst integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_lifetime(lifetime);
    IF grace IS NULL OR grace < interval '0' OR grace > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid refresh grace "%"', grace USING ERRCODE = '22023',
            HINT = 'The grace is between 0 and 1 hour (SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS, default 60 s).';
    END IF;
    IF client_fingerprint IS NOT NULL AND octet_length(client_fingerprint) <> 32 THEN
        RAISE EXCEPTION 'invalid client fingerprint of % bytes', octet_length(client_fingerprint)
            USING ERRCODE = '22023', HINT = 'A fingerprint is an HMAC-SHA256 (32 bytes), or NULL.';
    END IF;
    IF (session_rate IS NULL) <> (session_burst IS NULL)
       OR (session_rate IS NOT NULL AND (NOT (session_rate > 0) OR session_rate > 1000000
                                         OR session_burst NOT BETWEEN 1 AND 1000000)) THEN
        RAISE EXCEPTION 'invalid per-session refresh limit: rate %, burst %', session_rate, session_burst
            USING ERRCODE = '22023',
            HINT = 'Both NULL (no limit), or a rate in (0, 1000000] per second and a burst in [1, 1000000].';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_refresh_args(interval, interval, bytea, double precision, integer) FROM PUBLIC;

-- Returns an outcome instead of raising: a detected reuse must COMMIT the end of
-- the family (an exception would roll it back).
-- Exclusivity: the session's row lock, taken before the token is re-read, makes
-- every refresh, logout and end of one session run one at a time (lock order:
-- session, then its tokens -- the order of _end_session and reap_sessions too); a
-- second successor of one token would also break refresh_tokens_session_generation.
-- The per-session bucket is charged only once the token is known to belong to the
-- session, so knowing a session's id spends none of its budget; a denied refresh
-- changes nothing ('limited': the client keeps its cookie and retries).
CREATE OR REPLACE FUNCTION switchboard.refresh_session_v2(refresh_token text, lifetime interval,
                                                          grace interval DEFAULT '60 seconds',
                                                          client_fingerprint bytea DEFAULT NULL,
                                                          session_rate double precision DEFAULT NULL,
                                                          session_burst integer DEFAULT NULL)
RETURNS TABLE (outcome text, session_id uuid, user_id uuid, username text, role text, token_epoch integer,
               new_refresh_token text, expires_at timestamptz, retry_after_ms integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- Rows kept per session: the current token, the spent one a grace replay needs,
    -- and six more for reuse detection (V0027).
    c_keep CONSTANT integer := 8;
    v_now timestamptz := clock_timestamp();
    v_raw bytea;
    v_hash bytea;
    v_sid uuid;
    v_s record;
    v_t record;
    v_u record;
    v_rl record;
    v_seed bytea;
    v_new bytea;
    v_exp timestamptz;
BEGIN
    PERFORM switchboard._check_refresh_args(lifetime, grace, client_fingerprint, session_rate, session_burst);
    IF refresh_token IS NULL OR refresh_token !~ '^[0-9a-f]{64}$' THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::uuid, NULL::uuid, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz, NULL::integer;
        RETURN;
    END IF;
    v_raw := decode(refresh_token, 'hex');
    v_hash := sha256(v_raw);
    SELECT t.session_id INTO v_sid FROM switchboard.refresh_tokens t WHERE t.hash = v_hash;
    IF FOUND THEN
        SELECT s.user_id, s.expires_at, s.max_expires_at, s.ended_at INTO v_s
          FROM switchboard.sessions s WHERE s.id = v_sid FOR UPDATE;
    END IF;
    IF FOUND THEN
        -- Re-read under the lock: a rotation that committed meanwhile is seen whole.
        SELECT t.generation, t.used_at, t.successor_seed, t.client_fingerprint INTO v_t
          FROM switchboard.refresh_tokens t WHERE t.hash = v_hash;
    END IF;
    IF NOT FOUND THEN  -- never issued, pruned (older than c_keep rotations) or reaped
        RETURN QUERY SELECT 'unknown'::text, NULL::uuid, NULL::uuid, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz, NULL::integer;
        RETURN;
    END IF;

    SELECT u.username, u.role, u.disabled, u.token_epoch INTO v_u FROM switchboard.users u WHERE u.id = v_s.user_id;
    IF v_s.ended_at IS NULL AND (v_u.disabled OR v_s.expires_at <= v_now) THEN
        PERFORM switchboard._end_session(v_sid, CASE WHEN v_u.disabled THEN 'disabled' ELSE 'expired' END);
        v_s.ended_at := now();
    END IF;
    IF v_s.ended_at IS NOT NULL THEN
        RETURN QUERY SELECT 'ended'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz, NULL::integer;
        RETURN;
    END IF;

    IF v_t.used_at IS NULL
       OR (v_t.successor_seed IS NOT NULL AND v_t.used_at > v_now - grace
           AND client_fingerprint IS NOT NULL AND v_t.client_fingerprint = client_fingerprint) THEN
        -- A rotation, or the same client's replay of the spent token within the grace
        -- (the seed is still there, so the successor is unused): both are refreshes.
        IF session_rate IS NOT NULL THEN
            SELECT r.allowed, r.retry_after_ms INTO v_rl
              FROM switchboard.rate_check('refresh-session:' || v_sid::text, session_rate, session_burst) r;
            IF NOT v_rl.allowed THEN
                RETURN QUERY SELECT 'limited'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                                    NULL::text, NULL::timestamptz, v_rl.retry_after_ms;
                RETURN;
            END IF;
        END IF;
        IF v_t.used_at IS NOT NULL THEN
            RETURN QUERY SELECT 'resent'::text, v_sid, v_s.user_id, v_u.username::text, v_u.role::text,
                                v_u.token_epoch::integer, encode(sha256(v_raw || v_t.successor_seed), 'hex'),
                                v_s.expires_at, NULL::integer;
            RETURN;
        END IF;
        v_seed := switchboard._random_128() || switchboard._random_128();
        v_new := sha256(v_raw || v_seed);
        UPDATE switchboard.refresh_tokens t
           SET used_at = v_now, successor_seed = v_seed, client_fingerprint = refresh_session_v2.client_fingerprint
         WHERE t.hash = v_hash;
        INSERT INTO switchboard.refresh_tokens (hash, session_id, generation)
        VALUES (sha256(v_new), v_sid, v_t.generation + 1);
        -- The predecessor's successor (this token) is used now: no replay of it is forgiven.
        UPDATE switchboard.refresh_tokens t SET successor_seed = NULL, client_fingerprint = NULL
         WHERE t.session_id = v_sid AND t.generation = v_t.generation - 1 AND t.successor_seed IS NOT NULL;
        DELETE FROM switchboard.refresh_tokens t
         WHERE t.session_id = v_sid AND t.generation <= v_t.generation + 1 - c_keep;
        v_exp := least(now() + lifetime, v_s.max_expires_at);
        UPDATE switchboard.sessions s SET refreshed_at = now(), expires_at = v_exp WHERE s.id = v_sid;
        RETURN QUERY SELECT 'rotated'::text, v_sid, v_s.user_id, v_u.username::text, v_u.role::text,
                            v_u.token_epoch::integer, encode(v_new, 'hex'), v_exp, NULL::integer;
        RETURN;
    END IF;

    -- A spent token whose replay is not forgiven. Without a fingerprint on either
    -- side (a 0.2 replica's call, or a token a 0.2 replica spent), a replay within the
    -- grace before the successor was used is answered as 0.2.0 did: 'concurrent'.
    IF v_t.successor_seed IS NOT NULL AND v_t.used_at > v_now - grace
       AND (client_fingerprint IS NULL OR v_t.client_fingerprint IS NULL) THEN
        RETURN QUERY SELECT 'concurrent'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::timestamptz, NULL::integer;
        RETURN;
    END IF;
    PERFORM switchboard._end_session(v_sid, 'reuse');
    RETURN QUERY SELECT 'reused'::text, v_sid, v_s.user_id, NULL::text, NULL::text, NULL::integer,
                        NULL::text, NULL::timestamptz, NULL::integer;
END
$$;
COMMENT ON FUNCTION switchboard.refresh_session_v2(text, interval, interval, bytea, double precision, integer) IS
    'Rotate a refresh token. outcome: rotated (new_refresh_token issued; expires_at = least(now() + lifetime, the session''s max_expires_at)); resent (the same client_fingerprint presented the token it spent less than grace ago and its successor is still unused: the SAME successor again, nothing changed); limited (the session''s bucket, session_rate per second and session_burst, is empty: retry after retry_after_ms, nothing changed); concurrent (used less than grace ago, but a fingerprint is missing: retry with the newer one); unknown (no such token: not one we issued, older than the 8 kept per session, or reaped); ended (the session ended or expired); reused (any other replay of a used token: the whole session ended and was announced). Calls racing with one token hand out exactly one successor.';
REVOKE ALL ON FUNCTION switchboard.refresh_session_v2(text, interval, interval, bytea, double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.refresh_session_v2(text, interval, interval, bytea, double precision, integer) TO switchboard_app;

-- The 0.2.0 server's call (rolling updates): no fingerprint, so no replay is ever
-- resent; within race_window it is 'concurrent' (409) as before. No session limit.
CREATE OR REPLACE FUNCTION switchboard.refresh_session(refresh_token text, lifetime interval,
                                                       race_window interval DEFAULT '10 seconds')
RETURNS TABLE (outcome text, session_id uuid, user_id uuid, username text, role text, token_epoch integer,
               new_refresh_token text, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT r.outcome, r.session_id, r.user_id, r.username, r.role, r.token_epoch,
                        r.new_refresh_token, r.expires_at
      FROM switchboard.refresh_session_v2(refresh_session.refresh_token, lifetime,
                                          least(greatest(coalesce(race_window, interval '0'), interval '0'),
                                                interval '1 hour')) r;
END
$$;
COMMENT ON FUNCTION switchboard.refresh_session(text, interval, interval) IS
    'The previous release''s refresh_session_v2 (kept one release for rolling updates): no client fingerprint and no per-session limit. outcome: rotated, unknown, ended, concurrent (used less than race_window ago and its successor unused: retry with the newer one; nothing changed), reused (the whole session ended).';
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

-- issue_ticket_v2 binds the ticket to the session it is minted under (session_id
-- NULL: a ticket bound to no session). The 0.1 issue_ticket is gone (V0026).
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
-- reconnects. It builds on auth_snapshot_v2 (users, revocations), which the 0.2.0
-- server also calls.
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
