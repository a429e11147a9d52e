-- Events: targeted, transactional notify.
--
-- The event lives in switchboard.events (payloads up to 1 MiB); NOTIFY on
-- channel switchboard_events carries it to every replica's relay at COMMIT
-- (and is dropped on ROLLBACK). When the JSON would not fit NOTIFY's 8000-byte
-- limit, the notification carries everything but the payload plus
-- "truncated": true, and the relay reads the row.
--
-- Ids increase in commit order. A sequence alone hands ids out at insert
-- time, so a transaction that publishes first and commits last would make a
-- reader that already saw a higher id miss it. Publishers therefore take a
-- transaction-scoped advisory lock before nextval: the next publisher waits
-- until the previous one commits or rolls back. Postgres already serialises
-- notifying commits on its notify queue lock, so the extra cost is small.
-- Consequence: publish LAST in a transaction. A caller that publishes and
-- then waits on a row lock held by another publisher deadlocks; Postgres
-- detects it and one of them gets 40P01 (never a hang).

CREATE OR REPLACE FUNCTION switchboard._check_event(event text, payload jsonb, max_bytes integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_size integer;
BEGIN
    IF event IS NULL OR event !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid event label "%"', event USING ERRCODE = '22023',
            HINT = 'An event label is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'event payload must not be NULL' USING ERRCODE = '22023', HINT = 'Use ''{}''::jsonb.';
    END IF;
    v_size := octet_length(payload::text);
    IF v_size > max_bytes THEN
        RAISE EXCEPTION 'event payload is % bytes, the limit is %', v_size, max_bytes
            USING ERRCODE = '22023', HINT = 'Store large data elsewhere and send a reference.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_event(text, jsonb, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._publish(user_id uuid, room text, event text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_ts timestamptz := clock_timestamp();
    v_msg text;
BEGIN
    -- Commit-order ids: see the header of this file. Key (1937204836, 1) = 'sbev'.
    PERFORM pg_advisory_xact_lock(1937204836, 1);
    v_id := nextval('switchboard.event_id_seq');
    INSERT INTO switchboard.events (id, user_id, room, event, payload, created_at)
    VALUES (v_id, _publish.user_id, _publish.room, _publish.event, _publish.payload, v_ts);
    v_msg := json_build_object('id', v_id, 'user_id', _publish.user_id, 'room', _publish.room,
                               'event', _publish.event,
                               'ts', (extract(epoch FROM v_ts) * 1000)::bigint,
                               'payload', _publish.payload)::text;
    IF octet_length(v_msg) > 7900 THEN
        v_msg := json_build_object('id', v_id, 'user_id', _publish.user_id, 'room', _publish.room,
                                   'event', _publish.event,
                                   'ts', (extract(epoch FROM v_ts) * 1000)::bigint,
                                   'truncated', true)::text;
    END IF;
    PERFORM pg_notify('switchboard_events', v_msg);
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish(uuid, text, text, jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.notify_user(user_id uuid, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 1048576);
    IF user_id IS NULL OR NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = notify_user.user_id) THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    RETURN switchboard._publish(user_id, NULL, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_user(uuid, text, jsonb) IS
    'Publish an event to every socket of user_id on every replica, iff the calling transaction commits. Returns the event id (ids increase in commit order). Payload up to 1 MiB. Call it LAST in a transaction: publishers are serialised until COMMIT.';
REVOKE ALL ON FUNCTION switchboard.notify_user(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_user(uuid, text, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.notify_room(room text, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 1048576);
    IF room IS NULL OR NOT EXISTS (SELECT 1 FROM switchboard.rooms r WHERE r.name = notify_room.room) THEN
        RAISE EXCEPTION 'room "%" does not exist', room USING ERRCODE = 'P0002',
            HINT = 'A room exists once it has a member: add_room_member(room, user_id).';
    END IF;
    RETURN switchboard._publish(NULL, room, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_room(text, text, jsonb) IS
    'Publish an event to every member of room with a socket joined to it, on every replica, iff the calling transaction commits. Returns the event id. Call it LAST in a transaction.';
REVOKE ALL ON FUNCTION switchboard.notify_room(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_room(text, text, jsonb) TO switchboard_app;

-- events_since: the resume cursor. Targeted events of this user plus events of
-- the given rooms *that the user is a member of* (a room the user does not
-- belong to yields nothing), in id (= commit) order.
CREATE OR REPLACE FUNCTION switchboard.events_since(
    user_id uuid, after_id bigint, rooms text[] DEFAULT '{}', max_rows integer DEFAULT 10000)
RETURNS SETOF switchboard.events
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_user uuid := events_since.user_id;
BEGIN
    IF after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid after_id %', after_id USING ERRCODE = '22023',
            HINT = 'after_id is the last event id the client saw (0 for everything retained).';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT e.* FROM (
        SELECT * FROM switchboard.events ue
         WHERE ue.user_id = v_user AND ue.id > after_id
        UNION ALL
        SELECT re.* FROM switchboard.events re
          JOIN switchboard.room_members m ON m.room = re.room AND m.user_id = v_user
         WHERE re.room = ANY (coalesce(rooms, '{}')) AND re.id > after_id
    ) e
    ORDER BY e.id
    LIMIT max_rows;
END
$$;
COMMENT ON FUNCTION switchboard.events_since(uuid, bigint, text[], integer) IS
    'What user_id missed after after_id: its own events and events of the given rooms it belongs to, in commit order. Complete: once id N was seen, no event with id <= N can still commit. Compare after_id with event_horizon() to detect a gap past retention.';
REVOKE ALL ON FUNCTION switchboard.events_since(uuid, bigint, text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.events_since(uuid, bigint, text[], integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.event_horizon()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT h.reaped_through FROM switchboard.event_horizon h);
END
$$;
COMMENT ON FUNCTION switchboard.event_horizon() IS
    'The highest event id deleted by reap_events(). A client resuming after an id below it may have missed events (resume_gap).';
REVOKE ALL ON FUNCTION switchboard.event_horizon() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_horizon() TO switchboard_app;

-- The relay's read of an event whose NOTIFY was truncated (payload > ~7.9 kB).
CREATE OR REPLACE FUNCTION switchboard._relay_fetch_event(event_id bigint)
RETURNS SETOF switchboard.events
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM switchboard.events e WHERE e.id = event_id;
END
$$;
COMMENT ON FUNCTION switchboard._relay_fetch_event(bigint) IS
    'Internal (relay): read one event whose NOTIFY was truncated because its payload did not fit.';
REVOKE ALL ON FUNCTION switchboard._relay_fetch_event(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._relay_fetch_event(bigint) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_events(keep interval DEFAULT '5 minutes')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_max bigint;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023';
    END IF;
    WITH gone AS (
        DELETE FROM switchboard.events e WHERE e.created_at < now() - keep RETURNING e.id
    )
    SELECT count(*), max(id) INTO v_n, v_max FROM gone;
    IF v_max IS NOT NULL THEN
        UPDATE switchboard.event_horizon SET reaped_through = greatest(reaped_through, v_max);
    END IF;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_events(interval) IS
    'Delete events older than keep (the resume window, default 5 minutes) and advance event_horizon(). Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_events(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_events(interval) TO switchboard_app;

-- Client events (typing, tool results) are published on the bus, tagged with
-- the sender, never stored, and have no id. The sender must belong to the
-- room; the function checks it so no replica can be tricked into relaying.
CREATE OR REPLACE FUNCTION switchboard.publish_client_event(sender uuid, room text, event text, payload jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 4096);
    IF NOT EXISTS (SELECT 1 FROM switchboard.room_members m
                    WHERE m.room = publish_client_event.room AND m.user_id = sender) THEN
        RAISE EXCEPTION 'user % is not a member of room "%"', sender, room USING ERRCODE = '42501',
            HINT = 'Only room members may publish client events to a room.';
    END IF;
    PERFORM pg_notify('switchboard_events',
        json_build_object('id', NULL, 'user_id', NULL, 'room', room, 'event', event,
                          'ts', (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                          'from', sender, 'ephemeral', true, 'payload', payload)::text);
END
$$;
COMMENT ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) IS
    'Relay an ephemeral client event (e.g. typing) from sender to a room it belongs to: NOTIFY only, never stored, no id, payload up to 4 kB. 42501 if sender is not a member.';
REVOKE ALL ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) TO switchboard_app;
