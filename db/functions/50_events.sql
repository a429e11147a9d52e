-- Events: targeted, transactional notify.
--
-- The event lives in switchboard.events (payloads up to 1 MiB). At COMMIT a
-- NOTIFY on channel switchboard_events wakes every replica's relay; it
-- carries only the id ({"id": N}) and is dropped on ROLLBACK. NOTIFY has no
-- permissions (any role that can connect may pg_notify anything, and LISTEN
-- to anything), so the payload is a hint: the relay reads the events after
-- its cursor with relay_read() and delivers what it read, never what it was
-- told (docs/security.md). The body never travels on the bus either, so a
-- LISTENing stranger learns ids, not contents.
--
-- Ids increase in commit order. A sequence alone hands ids out at insert
-- time, so a transaction that publishes first and commits last would make a
-- reader that already saw a higher id miss it. Publishers therefore lock the
-- one row of switchboard.event_order before nextval: the next publisher waits
-- until the previous one commits or rolls back. It is a row lock on an
-- owner-only table, not an advisory lock, because pg_advisory_lock is PUBLIC:
-- any role (a `sql` task too) could take an advisory key and stall every
-- publisher; nobody but these SECURITY DEFINER functions can lock this row.
-- A publisher waits at most event_order.lock_wait (default 5 s), then gets
-- 55P03 with a HINT instead of hanging. Consequence: publish LAST in a
-- transaction. A caller that publishes and then waits on a row lock held by
-- another publisher deadlocks; Postgres detects it and one of them gets 40P01.

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

-- Take the event-order lock. Uncontended (the common case) it is one
-- SKIP LOCKED probe and no subtransaction; contended, it waits at most
-- event_order.lock_wait (or the caller's shorter lock_timeout) inside a
-- BEGIN/EXCEPTION block so the timeout surfaces as a clear 55P03.
CREATE OR REPLACE FUNCTION switchboard._lock_event_order()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_wait interval;
    v_caller text := current_setting('lock_timeout');
    v_ms bigint;
BEGIN
    PERFORM 1 FROM switchboard.event_order o WHERE o.singleton FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT o.lock_wait INTO v_wait FROM switchboard.event_order o WHERE o.singleton;
    v_ms := (extract(epoch FROM coalesce(v_wait, interval '5 seconds')) * 1000)::bigint;
    IF v_caller NOT IN ('0', '0ms') THEN
        v_ms := least(v_ms, (extract(epoch FROM v_caller::interval) * 1000)::bigint);
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', v_ms::text, true);
        PERFORM 1 FROM switchboard.event_order o WHERE o.singleton FOR UPDATE;
        PERFORM set_config('lock_timeout', v_caller, true);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'waited % ms for the event-order lock; another publisher has not committed', v_ms
            USING ERRCODE = '55P03',
                  HINT = 'A transaction that calls notify_user/notify_room holds the lock until it ends: '
                      || 'publish last and commit promptly. The bound is switchboard.event_order.lock_wait.';
    END;
END
$$;
REVOKE ALL ON FUNCTION switchboard._lock_event_order() FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._publish(user_id uuid, room text, event text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- Commit-order ids: see the header of this file.
    PERFORM switchboard._lock_event_order();
    v_id := nextval('switchboard.event_id_seq');
    INSERT INTO switchboard.events (id, user_id, room, event, payload, created_at)
    VALUES (v_id, _publish.user_id, _publish.room, _publish.event, _publish.payload, clock_timestamp());
    -- A hint only: the relay reads the rows after its cursor (relay_read).
    PERFORM pg_notify('switchboard_events', '{"id":' || v_id || '}');
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish(uuid, text, text, jsonb) FROM PUBLIC;

-- Ephemeral events (typing, tool.call.<id>): stored for about a minute in an
-- UNLOGGED table, never in events (no id in the event stream, not resumed).
-- The NOTIFY carries {"eph": id}; relays read the row with relay_read().
CREATE OR REPLACE FUNCTION switchboard._publish_ephemeral(user_id uuid, room text, event text,
                                                          sender uuid, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO switchboard.ephemeral_events (user_id, room, event, sender, payload)
    VALUES (_publish_ephemeral.user_id, _publish_ephemeral.room, _publish_ephemeral.event,
            _publish_ephemeral.sender, _publish_ephemeral.payload)
    RETURNING id INTO v_id;
    PERFORM pg_notify('switchboard_events', '{"eph":' || v_id || '}');
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish_ephemeral(uuid, text, text, uuid, jsonb) FROM PUBLIC;

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

-- A room with no members (or an unknown room) is not an error: the event is
-- stored and delivered to nobody live, like a NOTIFY nobody listens to. A
-- publisher's transaction must not abort because nobody is listening; typos
-- show up in room_members_online() and status(). The name is still checked.
CREATE OR REPLACE FUNCTION switchboard.notify_room(room text, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 1048576);
    IF room IS NULL OR room !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid room name "%"', room USING ERRCODE = '22023',
            HINT = 'A room name is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    RETURN switchboard._publish(NULL, room, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_room(text, text, jsonb) IS
    'Publish an event to every member of room with a socket joined to it, on every replica, iff the calling transaction commits. Returns the event id. A room without members is not an error (stored, delivered to nobody live). Call it LAST in a transaction.';
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

-- Kept for a previous-release relay during a rolling update (it read events
-- whose NOTIFY was truncated); this release reads with relay_read().
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

-- The relay's read, once per LISTEN wake-up (not per notification, not per
-- socket): every stored event after the replica's cursor, in id (= commit)
-- order, plus the ephemeral events whose ids the wake-ups named. The ids in a
-- NOTIFY are hints: a forged id names no row, or a row the relay has already
-- delivered (its cursor and recently-seen set skip it); the cursor only ever
-- moves to ids read here. Ephemeral rows older than 30 seconds are not
-- returned, so an old id replayed on the bus delivers nothing.
CREATE OR REPLACE FUNCTION switchboard.relay_read(after_id bigint, ephemeral_ids bigint[] DEFAULT '{}',
                                                  max_rows integer DEFAULT 1000)
RETURNS TABLE (id bigint, ephemeral boolean, user_id uuid, room text, event text, sender uuid,
               payload jsonb, ts bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid after_id %', after_id USING ERRCODE = '22023',
            HINT = 'after_id is the relay cursor: the highest event id it has read (see event_head()).';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'Between 1 and 100000.';
    END IF;
    IF cardinality(ephemeral_ids) > 10000 THEN
        RAISE EXCEPTION 'too many ephemeral ids (%)', cardinality(ephemeral_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per read.';
    END IF;
    RETURN QUERY
    (SELECT e.id, false, e.user_id, e.room, e.event, NULL::uuid, e.payload,
            (extract(epoch FROM e.created_at) * 1000)::bigint
       FROM switchboard.events e WHERE e.id > after_id ORDER BY e.id LIMIT max_rows)
    UNION ALL
    (SELECT x.id, true, x.user_id, x.room, x.event, x.sender, x.payload,
            (extract(epoch FROM x.created_at) * 1000)::bigint
       FROM switchboard.ephemeral_events x
      WHERE x.id = ANY (coalesce(ephemeral_ids, '{}'))
        AND x.created_at > now() - interval '30 seconds'
      ORDER BY x.id);
END
$$;
COMMENT ON FUNCTION switchboard.relay_read(bigint, bigint[], integer) IS
    'Internal (relay): stored events after the cursor after_id in commit order (at most max_rows), then the ephemeral events with the given ids (younger than 30 s). What a replica delivers; NOTIFY payloads only say when to call it.';
REVOKE ALL ON FUNCTION switchboard.relay_read(bigint, bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_read(bigint, bigint[], integer) TO switchboard_app;

-- Where a relay starts its cursor: the highest committed event id (or the
-- reaped horizon when nothing is retained). Ids are commit-ordered, so no
-- event with a lower id can still appear.
CREATE OR REPLACE FUNCTION switchboard.event_head()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN greatest(coalesce((SELECT max(e.id) FROM switchboard.events e), 0),
                    (SELECT h.reaped_through FROM switchboard.event_horizon h));
END
$$;
COMMENT ON FUNCTION switchboard.event_head() IS
    'The highest event id committed so far: a relay''s starting cursor for relay_read().';
REVOKE ALL ON FUNCTION switchboard.event_head() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_head() TO switchboard_app;

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
    -- Ephemeral rows are only read within 30 s of their NOTIFY.
    DELETE FROM switchboard.ephemeral_events x WHERE x.created_at < now() - interval '1 minute';
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_events(interval) IS
    'Delete events older than keep (the resume window, default 5 minutes) and advance event_horizon(); also drops ephemeral events older than a minute. Returns how many events.';
REVOKE ALL ON FUNCTION switchboard.reap_events(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_events(interval) TO switchboard_app;

-- Client events (typing) are published on the bus, tagged with the sender,
-- never stored in events, and have no id. The sender must belong to the
-- room; the function checks it. The event itself is a row of
-- ephemeral_events read by the relays (the NOTIFY is only its id), so a
-- forged NOTIFY cannot put words in a member's mouth.
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
    PERFORM switchboard._publish_ephemeral(NULL, room, event, sender, payload);
END
$$;
COMMENT ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) IS
    'Relay an ephemeral client event (e.g. typing) from sender to a room it belongs to: never stored in events, no id, payload up to 4 kB. 42501 if sender is not a member.';
REVOKE ALL ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) TO switchboard_app;

-- One registration for both tool-call entry points (tool_call_send and the
-- previous release's tool_call_start): validate, refuse an offline user (NULL),
-- record who the call went to and which replica waits. The callers differ only
-- in how the browser hears of the call.
CREATE OR REPLACE FUNCTION switchboard._tool_call_register(
    user_id uuid, replica_id text, name text, args jsonb, timeout interval)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid := gen_random_uuid();
BEGIN
    PERFORM switchboard._check_event(coalesce(name, ''), coalesce(args, 'null'), 6000);
    IF timeout IS NULL OR timeout <= interval '0' OR timeout > interval '10 minutes' THEN
        RAISE EXCEPTION 'invalid timeout "%"', timeout USING ERRCODE = '22023',
            HINT = 'A tool call waits between 1 ms and 10 minutes.';
    END IF;
    IF NOT switchboard.user_online(user_id) THEN
        RETURN NULL;
    END IF;
    INSERT INTO switchboard.tool_calls (id, user_id, replica_id, name, expires_at)
    VALUES (v_id, user_id, replica_id, name, now() + timeout);
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._tool_call_register(uuid, text, text, jsonb, interval) FROM PUBLIC;

-- The tool bridge's send and collect, replacing tool_call_start and
-- tool_call_take (db/functions/70_replicas.sql; kept for a previous-release
-- server during a rolling update). tool_call_start put the call's name and
-- args in the NOTIFY payload, so anybody could send a browser a forged
-- tool.call; here the call is an ephemeral row read by the relay. And a
-- forged tool_result wake-up made the waiter collect (and delete) an
-- unanswered call: tool_call_collect only takes an answered one.
CREATE OR REPLACE FUNCTION switchboard.tool_call_send(
    user_id uuid, replica_id text, name text, args jsonb DEFAULT '{}', timeout interval DEFAULT '30 seconds')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid;
BEGIN
    v_id := switchboard._tool_call_register(user_id, replica_id, name, args, timeout);
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM switchboard._publish_ephemeral(user_id, NULL, 'tool.call.' || v_id, NULL,
                                           jsonb_build_object('name', name, 'args', args));
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) IS
    'Send tool.call.<id> to user_id''s sockets wherever they are; returns the call id, or NULL if the user has no socket on any live replica. The answer is collected with tool_call_collect().';
REVOKE ALL ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.tool_call_collect(call_id uuid, give_up boolean DEFAULT false)
RETURNS TABLE (answered boolean, result jsonb)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    DELETE FROM switchboard.tool_calls c
     WHERE c.id = tool_call_collect.call_id AND (c.answered OR give_up)
    RETURNING c.answered, c.result;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_collect(uuid, boolean) IS
    'The waiting replica collects an answered tool call (no row while unanswered: a wake-up that was not an answer changes nothing). give_up => true forgets the call whatever its state (timeout).';
REVOKE ALL ON FUNCTION switchboard.tool_call_collect(uuid, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_collect(uuid, boolean) TO switchboard_app;
