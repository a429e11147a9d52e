-- Replay after a long absence (issue 13): the relay's batched catch-up.
--
-- After its LISTEN connection comes back, a replica must deliver to every
-- local socket what was committed while it was deaf. Asking events_since()
-- once per socket costs one round trip per socket (1,000 sockets: 1,000
-- queries at the moment the database is recovering); this function answers
-- for all of them at once, one page at a time: every event after after_id
-- that targets one of the users, or one of the rooms. For a room event,
-- members lists which of the given users are members of that room *now* --
-- a member removed during the outage missed the removal notice too, so the
-- relay re-checks here instead of trusting the rooms its sockets joined.
-- The relay pages by passing the last id of the previous page as after_id
-- (ids follow commit order, so the pages are complete).
CREATE OR REPLACE FUNCTION switchboard._relay_catch_up(
    users uuid[], rooms text[], after_id bigint, max_rows integer DEFAULT 500)
RETURNS TABLE (id bigint, user_id uuid, room text, event text, payload jsonb,
               created_at timestamptz, members uuid[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    IF after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid after_id %', after_id USING ERRCODE = '22023',
            HINT = 'after_id is the lowest cursor among the sockets being caught up (0 for everything).';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'A page is 1 to 10000 events.';
    END IF;
    RETURN QUERY
    SELECT e.id, e.user_id, e.room, e.event, e.payload, e.created_at,
           CASE WHEN e.room IS NOT NULL THEN
                ARRAY(SELECT m.user_id FROM switchboard.room_members m
                       WHERE m.room = e.room AND m.user_id = ANY (users)) END
      FROM (SELECT * FROM switchboard.events ue
             WHERE ue.user_id = ANY (coalesce(users, '{}')) AND ue.id > after_id
            UNION ALL
            SELECT * FROM switchboard.events re
             WHERE re.room = ANY (coalesce(rooms, '{}')) AND re.id > after_id) e
     ORDER BY e.id
     LIMIT max_rows;
END
$$;
COMMENT ON FUNCTION switchboard._relay_catch_up(uuid[], text[], bigint, integer) IS
    'Internal (relay): one page (max_rows, in id order) of the events after after_id for any of users or rooms, with the users that are members of each room event''s room now. The relay''s catch-up after a LISTEN reconnect: one query per page for all sockets.';
REVOKE ALL ON FUNCTION switchboard._relay_catch_up(uuid[], text[], bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard._relay_catch_up(uuid[], text[], bigint, integer) TO switchboard_app;
