-- presence_sync: a replica's heartbeat re-asserts its whole presence in one
-- call (after a Postgres crash the UNLOGGED presence rows are gone; after a
-- missed presence_set the counts would drift). Replaces the replica's rows.
CREATE OR REPLACE FUNCTION switchboard.presence_sync(replica_id text, user_ids uuid[], sockets integer[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(array_length(user_ids, 1), 0) <> coalesce(array_length(sockets, 1), 0) THEN
        RAISE EXCEPTION 'user_ids and sockets differ in length' USING ERRCODE = '22023';
    END IF;
    INSERT INTO switchboard.replica_registry (id) VALUES (replica_id)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO UPDATE SET heartbeat_at = now();
    DELETE FROM switchboard.presence_sockets p
     WHERE p.replica_id = presence_sync.replica_id AND p.user_id <> ALL (coalesce(user_ids, '{}'));
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    SELECT presence_sync.replica_id, u, s FROM unnest(user_ids, sockets) AS x(u, s) WHERE s > 0
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
COMMENT ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) IS
    'Replace all presence rows of replica_id with the given users and socket counts (called with each heartbeat).';
REVOKE ALL ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_sync(text, uuid[], integer[]) TO switchboard_app;
