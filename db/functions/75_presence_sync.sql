-- presence_sync: a replica's heartbeat re-asserts its whole presence in one
-- call (after a Postgres crash the UNLOGGED presence rows are gone; after a
-- missed presence_set the counts would drift). Replaces the replica's rows.
--
-- Set-based since V0013. The old body deleted with
-- "user_id <> ALL (user_ids)", a linear search of the array per row: S rows
-- times S elements, 400 million comparisons (seconds of a core) at 20,000
-- sockets, every heartbeat. Now both statements are joins the planner runs as
-- hash joins, and rows whose count did not change are not written at all (an
-- unchanged heartbeat writes nothing but the registry row). The statements are
-- planned with the actual array (plan_cache_mode = force_custom_plan): a
-- generic plan would guess 10 elements for unnest() and could pick a nested
-- loop, which is the quadratic plan again. Planning costs tens of microseconds,
-- once per heartbeat.
--
-- Duplicated user ids still raise 21000 (as before); a user listed with 0
-- sockets has no row afterwards (before V0013 an old row of that user stayed).
CREATE OR REPLACE FUNCTION switchboard.presence_sync(replica_id text, user_ids uuid[], sockets integer[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_variable
DECLARE
    v_rid text := presence_sync.replica_id;
    v_users uuid[] := coalesce(presence_sync.user_ids, '{}');
    v_socks integer[] := coalesce(presence_sync.sockets, '{}');
BEGIN
    IF cardinality(v_users) <> cardinality(v_socks) THEN
        RAISE EXCEPTION 'user_ids and sockets differ in length (% and %)', cardinality(v_users), cardinality(v_socks)
            USING ERRCODE = '22023', HINT = 'Pass one socket count per user id.';
    END IF;
    INSERT INTO switchboard.replica_registry (id) VALUES (v_rid)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO UPDATE SET heartbeat_at = now();
    -- Rows of this replica whose user is gone (or listed with no socket).
    DELETE FROM switchboard.presence_sockets p
     WHERE p.replica_id = v_rid
       AND NOT EXISTS (SELECT 1 FROM unnest(v_users, v_socks) AS x(u, s) WHERE x.u = p.user_id AND x.s > 0);
    -- New users and changed counts only.
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    SELECT v_rid, x.u, x.s
      FROM unnest(v_users, v_socks) AS x(u, s)
      LEFT JOIN switchboard.presence_sockets o ON o.replica_id = v_rid AND o.user_id = x.u
     WHERE x.s > 0 AND (o.user_id IS NULL OR o.sockets <> x.s)
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
COMMENT ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) IS
    'Replace all presence rows of replica_id with the given users and socket counts (called with each heartbeat). Set-based: rows whose count did not change are not written; a user with 0 sockets has no row afterwards.';
REVOKE ALL ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) TO switchboard_app;
