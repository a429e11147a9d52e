-- Presence, pushed (issue 34): what a replica reads to send presence.state and
-- presence.diff frames, and what a connection says about itself.
--
-- A replica polls presence_of_rooms() once per SWITCHBOARD_PRESENCE_INTERVAL for
-- every room one of its sockets subscribed to (presence/push.py), diffs each
-- room against its last snapshot and sends at most one frame per room per
-- interval: a reconnect storm is a handful of diffs, not a frame per socket.
-- Online is what presence_sockets says on a live replica (as for
-- room_members_online); the metadata is presence_meta (V0035), written by
-- presence_track() and re-asserted by each heartbeat's presence_meta_sync().
--
-- Every function here is plpgsql: its body is resolved when it is called, so
-- this file loads at a migration target older than V0035 (which creates
-- presence_meta) without touching the table.

-- _check_presence_meta(meta): an object of at most 8 keys (each 1 to 32
-- characters), scalar values only, at most 256 bytes as compact JSON text.
CREATE OR REPLACE FUNCTION switchboard._check_presence_meta(meta jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys integer;
BEGIN
    IF meta IS NULL OR jsonb_typeof(meta) <> 'object' THEN
        RAISE EXCEPTION 'invalid presence metadata %: not an object', left(meta::text, 100)
            USING ERRCODE = '22023', HINT = 'Presence metadata is a JSON object, e.g. {"status": "away"}.';
    END IF;
    v_keys := (SELECT count(*) FROM jsonb_object_keys(meta));
    -- jsonb's text puts a space after each ':' and ','; the bound is on the compact form.
    IF v_keys > 8 OR octet_length(meta::text) - greatest(2 * v_keys - 1, 0) > 256 THEN
        RAISE EXCEPTION 'invalid presence metadata %: too large', left(meta::text, 100)
            USING ERRCODE = '22023', HINT = 'At most 8 keys and 256 bytes of JSON.';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_each(meta) AS e(k, v)
                WHERE length(e.k) NOT BETWEEN 1 AND 32 OR jsonb_typeof(e.v) IN ('object', 'array')) THEN
        RAISE EXCEPTION 'invalid presence metadata %: keys are 1 to 32 characters, values scalars', left(meta::text, 100)
            USING ERRCODE = '22023', HINT = 'Values are strings, numbers, booleans or null; no nested objects or arrays.';
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard._check_presence_meta(jsonb) IS
    'Raise 22023 unless meta is presence metadata: an object of at most 8 keys (1 to 32 characters) with scalar values, small (256 bytes as the server sends it).';
REVOKE ALL ON FUNCTION switchboard._check_presence_meta(jsonb) FROM PUBLIC;

-- presence_track(replica, conn, user, room, meta): connection conn of replica
-- tracks itself in room with meta; meta NULL stops tracking in room; room and
-- meta NULL stop tracking everywhere (the socket closed). The replica has
-- checked that the socket joined the room (a member); here only the bounds.
CREATE OR REPLACE FUNCTION switchboard.presence_track(replica_id text, conn bigint, user_id uuid, room text,
                                                      meta jsonb)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_rid text := presence_track.replica_id;
    v_conn bigint := presence_track.conn;
    v_room text := presence_track.room;
BEGIN
    IF v_rid IS NULL OR length(v_rid) NOT BETWEEN 1 AND 200 OR v_conn IS NULL THEN
        RAISE EXCEPTION 'invalid connection "%" / %', left(v_rid, 200), v_conn USING ERRCODE = '22023',
            HINT = 'Pass the replica id (1 to 200 characters) and the connection number.';
    END IF;
    IF meta IS NULL THEN
        DELETE FROM switchboard.presence_meta p
         WHERE p.replica_id = v_rid AND p.conn = v_conn AND (v_room IS NULL OR p.room = v_room);
        RETURN;
    END IF;
    IF v_room IS NULL OR length(v_room) NOT BETWEEN 1 AND 128 OR presence_track.user_id IS NULL THEN
        RAISE EXCEPTION 'invalid room "%" or user %', left(v_room, 200), presence_track.user_id
            USING ERRCODE = '22023', HINT = 'Track in a room (1 to 128 characters) as a user.';
    END IF;
    PERFORM switchboard._check_presence_meta(meta);
    INSERT INTO switchboard.replica_registry (id) VALUES (v_rid)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO NOTHING;
    INSERT INTO switchboard.presence_meta AS p (replica_id, conn, room, user_id, meta)
    VALUES (v_rid, v_conn, v_room, presence_track.user_id, meta)
    ON CONFLICT ON CONSTRAINT presence_meta_pkey DO UPDATE SET meta = EXCLUDED.meta, user_id = EXCLUDED.user_id;
END
$$;
COMMENT ON FUNCTION switchboard.presence_track(text, bigint, uuid, text, jsonb) IS
    'Connection conn of replica_id tracks itself in room with meta (presence metadata, _check_presence_meta); meta NULL untracks it in room, room and meta NULL everywhere.';
REVOKE ALL ON FUNCTION switchboard.presence_track(text, bigint, uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_track(text, bigint, uuid, text, jsonb) TO switchboard_app;

-- presence_meta_sync(replica, rows): the heartbeat re-asserts every tracked
-- connection of the replica in one call (rows: a JSON array of
-- {"conn", "room", "user_id", "meta"}): rows of connections gone since (a
-- failed untrack) go, rows an UNLOGGED reset emptied come back. Unchanged rows
-- are not written.
CREATE OR REPLACE FUNCTION switchboard.presence_meta_sync(replica_id text, tracked jsonb)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_variable
DECLARE
    v_rid text := presence_meta_sync.replica_id;
    v_rows jsonb := coalesce(presence_meta_sync.tracked, '[]');
BEGIN
    IF v_rid IS NULL OR length(v_rid) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid replica id "%"', left(v_rid, 200) USING ERRCODE = '22023',
            HINT = 'A replica id is 1 to 200 characters, e.g. host:pid:random.';
    END IF;
    IF jsonb_typeof(v_rows) <> 'array' OR jsonb_array_length(v_rows) > 200000 THEN
        RAISE EXCEPTION 'invalid tracked connections (% rows)', left(v_rows::text, 100) USING ERRCODE = '22023',
            HINT = 'Pass a JSON array of at most 200000 {"conn", "room", "user_id", "meta"} objects.';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(v_rows) AS i(conn bigint, room text, user_id uuid, meta jsonb)
                WHERE i.conn IS NULL OR i.user_id IS NULL OR i.room IS NULL OR length(i.room) NOT BETWEEN 1 AND 128) THEN
        RAISE EXCEPTION 'invalid tracked connection: conn, room (1 to 128 characters) and user_id are required'
            USING ERRCODE = '22023', HINT = 'Each row is {"conn": n, "room": r, "user_id": u, "meta": {...}}.';
    END IF;
    PERFORM switchboard._check_presence_meta(i.meta)
       FROM jsonb_to_recordset(v_rows) AS i(conn bigint, room text, user_id uuid, meta jsonb);
    INSERT INTO switchboard.replica_registry (id) VALUES (v_rid)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO NOTHING;
    DELETE FROM switchboard.presence_meta p
     WHERE p.replica_id = v_rid
       AND NOT EXISTS (SELECT 1 FROM jsonb_to_recordset(v_rows) AS i(conn bigint, room text, user_id uuid, meta jsonb)
                        WHERE i.conn = p.conn AND i.room = p.room);
    INSERT INTO switchboard.presence_meta AS p (replica_id, conn, room, user_id, meta)
    SELECT v_rid, i.conn, i.room, i.user_id, i.meta
      FROM jsonb_to_recordset(v_rows) AS i(conn bigint, room text, user_id uuid, meta jsonb)
      LEFT JOIN switchboard.presence_meta o ON o.replica_id = v_rid AND o.conn = i.conn AND o.room = i.room
     WHERE o.conn IS NULL OR o.meta <> i.meta OR o.user_id <> i.user_id
    ON CONFLICT ON CONSTRAINT presence_meta_pkey DO UPDATE SET meta = EXCLUDED.meta, user_id = EXCLUDED.user_id;
END
$$;
COMMENT ON FUNCTION switchboard.presence_meta_sync(text, jsonb) IS
    'Replace the presence metadata rows of replica_id with tracked (a JSON array of {conn, room, user_id, meta}); called with each heartbeat. Unchanged rows are not written.';
REVOKE ALL ON FUNCTION switchboard.presence_meta_sync(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_meta_sync(text, jsonb) TO switchboard_app;

-- presence_of_rooms(rooms, max_members): for each room, its members online on a
-- live replica (at most max_members per room, by username), each with the
-- metadata of their tracked connections in that room (at most 8, oldest first).
-- One call per interval serves every room of a replica: at most 500 rooms.
CREATE OR REPLACE FUNCTION switchboard.presence_of_rooms(rooms text[], max_members integer DEFAULT 1000)
RETURNS TABLE (room text, user_id uuid, username text, metas jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF rooms IS NULL OR cardinality(rooms) > 500 THEN
        RAISE EXCEPTION 'invalid room list (% rooms)', cardinality(rooms) USING ERRCODE = '22023',
            HINT = 'Ask for at most 500 rooms at a time.';
    END IF;
    IF max_members IS NULL OR max_members NOT BETWEEN 1 AND 10001 THEN
        RAISE EXCEPTION 'invalid max_members %', max_members USING ERRCODE = '22023',
            HINT = 'Ask for 1 to 10001 members per room.';
    END IF;
    RETURN QUERY
    SELECT x.r, q.uid, q.uname, q.m
      FROM (SELECT DISTINCT u.r FROM unnest(presence_of_rooms.rooms) AS u(r)) AS x
     CROSS JOIN LATERAL (
        SELECT m.user_id AS uid, usr.username AS uname,
               coalesce((SELECT jsonb_agg(t.meta ORDER BY t.since, t.replica_id, t.conn)
                           FROM (SELECT pm.meta, pm.since, pm.replica_id, pm.conn
                                   FROM switchboard.presence_meta pm
                                   JOIN switchboard.replica_registry r2 ON r2.id = pm.replica_id
                                  WHERE pm.room = x.r AND pm.user_id = m.user_id
                                    AND r2.heartbeat_at > now() - r2.live_window
                                  ORDER BY pm.since, pm.replica_id, pm.conn
                                  LIMIT 8) AS t), '[]'::jsonb) AS m
          FROM switchboard.room_members m
          JOIN switchboard.users usr ON usr.id = m.user_id
         WHERE m.room = x.r
           AND EXISTS (SELECT 1 FROM switchboard.presence_sockets p
                         JOIN switchboard.replica_registry r ON r.id = p.replica_id
                        WHERE p.user_id = m.user_id AND p.sockets > 0
                          AND r.heartbeat_at > now() - r.live_window)
         ORDER BY usr.username, m.user_id
         LIMIT presence_of_rooms.max_members) AS q;
END
$$;
COMMENT ON FUNCTION switchboard.presence_of_rooms(text[], integer) IS
    'For each of rooms (at most 500): its members online on a live replica (at most max_members, by username) with the metadata of their tracked connections there (at most 8 each).';
REVOKE ALL ON FUNCTION switchboard.presence_of_rooms(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_of_rooms(text[], integer) TO switchboard_app;
