-- WebSocket tickets: short-lived, single-use, stored only as a SHA-256 hash
-- in an UNLOGGED table (a crash loses at most 30 seconds of tickets, which
-- clients simply re-request). They are issued and consumed, bound to a login
-- session, by issue_ticket_v2 and consume_ticket_v2 (62_sessions.sql);
-- consumption is one DELETE ... RETURNING: two replicas consuming the same
-- ticket at the same instant serialise on the row, and the second DELETE finds
-- nothing. (0.1's issue_ticket and consume_ticket, which knew no sessions, were
-- dropped by V0026.)

-- 128 random bits without pgcrypto: gen_random_uuid() draws from the same
-- strong source (pg_strong_random); the version/variant bits (bytes 7 and 9 of
-- a version 4 UUID) are skipped, so all 16 bytes taken below are random.
-- Shaped to be inlined into its caller: one expression, no FROM, no SET clause
-- (a SET clause or a FROM forbids inlining, and a SQL function that is not
-- inlined is parsed and planned again in every transaction that calls it:
-- that doubled the cost of issuing a ticket). Every name is schema-qualified, so
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
