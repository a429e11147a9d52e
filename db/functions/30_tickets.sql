-- WebSocket tickets: short-lived, single-use, stored only as a SHA-256 hash
-- in an UNLOGGED table (a crash loses at most 30 seconds of tickets, which
-- clients simply re-request). Consumption is one DELETE ... RETURNING: two
-- replicas consuming the same ticket at the same instant serialise on the
-- row, and the second DELETE finds nothing.

-- 128 random bits without pgcrypto: gen_random_uuid() draws from the same
-- strong source (pg_strong_random); the version/variant bits (bytes 7 and 9 of
-- a version 4 UUID) are skipped, so all 16 bytes taken below are random.
-- Shaped to be inlined into its caller: one expression, no FROM, no SET clause
-- (a SET clause or a FROM forbids inlining, and a SQL function that is not
-- inlined is parsed and planned again in every transaction that calls it:
-- that doubled the cost of issue_ticket). Every name is schema-qualified, so
-- the body means the same under any search_path.
CREATE OR REPLACE FUNCTION switchboard._random_128()
RETURNS bytea
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 1, 6)
           OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 10, 7)
           OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 1, 3)
$$;
REVOKE ALL ON FUNCTION switchboard._random_128() FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.issue_ticket(user_id uuid, ttl interval DEFAULT '30 seconds')
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
    SELECT u.disabled INTO v_disabled FROM switchboard.users u WHERE u.id = issue_ticket.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', issue_ticket.user_id USING ERRCODE = 'P0002';
    END IF;
    IF v_disabled THEN
        RAISE EXCEPTION 'user % is disabled', issue_ticket.user_id USING ERRCODE = '28000',
            HINT = 'A disabled user cannot get a ticket; see enable_user().';
    END IF;
    INSERT INTO switchboard.tickets (hash, user_id, expires_at)
    VALUES (sha256(v_raw), issue_ticket.user_id, now() + ttl);
    RETURN encode(v_raw, 'hex');
END
$$;
COMMENT ON FUNCTION switchboard.issue_ticket(uuid, interval) IS
    'Issue a single-use WebSocket ticket for user_id: 128 random bits as 32 hex characters. Only its SHA-256 is stored. P0002 for an unknown user, 28000 for a disabled one.';
REVOKE ALL ON FUNCTION switchboard.issue_ticket(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.issue_ticket(uuid, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.consume_ticket(ticket text)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_user uuid;
    v_expires timestamptz;
BEGIN
    IF ticket IS NULL OR ticket !~ '^[0-9A-Fa-f]{32}$' THEN
        RETURN NULL;
    END IF;
    DELETE FROM switchboard.tickets t WHERE t.hash = sha256(decode(lower(ticket), 'hex'))
    RETURNING t.user_id, t.expires_at INTO v_user, v_expires;
    IF NOT FOUND OR v_expires <= clock_timestamp() THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = v_user AND NOT u.disabled) THEN
        RETURN NULL;
    END IF;
    RETURN v_user;
END
$$;
COMMENT ON FUNCTION switchboard.consume_ticket(text) IS
    'Consume a ticket: the user id, exactly once; NULL if the ticket is unknown, malformed, expired, already used or its user is disabled.';
REVOKE ALL ON FUNCTION switchboard.consume_ticket(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.consume_ticket(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_tickets()
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM switchboard.tickets t WHERE t.expires_at <= now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_tickets() IS 'Delete expired tickets. Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_tickets() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_tickets() TO switchboard_app;
