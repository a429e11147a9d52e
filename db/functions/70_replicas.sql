-- Replica registry, presence and the tool bridge.
--
-- Each replica upserts its row every few seconds; presence rows hang off it
-- (ON DELETE CASCADE), so when a replica dies and reap_replicas() removes its
-- row, its users stop being "online" without anyone having to clean up.
--
-- Liveness: a replica is live while heartbeat_at > now() - live_window, where
-- live_window is a generated column derived from the replica's own
-- heartbeat_interval (V0002): greatest(30 s, 3 x interval). Every reader below
-- uses that column, so a replica configured to heartbeat every 60 s stays
-- live (and its users online) between heartbeats.

-- replica_heartbeat(id, info, handlers, heartbeat_interval, version): the
-- current servers' heartbeat. It records which task handlers the replica's
-- scheduler runs (an empty array for a replica with the scheduler off), so
-- known_handlers() and the switchboard.handlers view can tell which handlers
-- no live replica serves.
CREATE OR REPLACE FUNCTION switchboard.replica_heartbeat(
    replica_id text, info jsonb, handlers text[], heartbeat_interval interval, version text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF replica_id IS NULL OR length(replica_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid replica id "%"', replica_id USING ERRCODE = '22023',
            HINT = 'A replica id is 1 to 200 characters, e.g. host:pid:random.';
    END IF;
    IF heartbeat_interval IS NULL OR heartbeat_interval <= interval '0' OR heartbeat_interval > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid heartbeat interval "%"', heartbeat_interval USING ERRCODE = '22023',
            HINT = 'A replica heartbeats between every few milliseconds and every hour.';
    END IF;
    IF handlers IS NULL OR cardinality(handlers) > 10000 THEN
        RAISE EXCEPTION 'invalid handler list (% names)', cardinality(handlers) USING ERRCODE = '22023',
            HINT = 'Pass the handler names this replica runs, an empty array if none (at most 10000).';
    END IF;
    PERFORM switchboard._check_handler(h) FROM unnest(handlers) AS h;
    IF version IS NOT NULL AND length(version) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'invalid version "%"', version USING ERRCODE = '22023',
            HINT = 'A version is 1 to 100 characters, e.g. 0.1.0.';
    END IF;
    INSERT INTO switchboard.replica_registry AS r (id, info, heartbeat_at, handlers, heartbeat_interval, version)
    VALUES (replica_id, coalesce(info, '{}'), now(), handlers, heartbeat_interval, version)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey
    DO UPDATE SET heartbeat_at = now(), info = coalesce(EXCLUDED.info, r.info), handlers = EXCLUDED.handlers,
                  heartbeat_interval = EXCLUDED.heartbeat_interval, version = EXCLUDED.version;
END
$$;
COMMENT ON FUNCTION switchboard.replica_heartbeat(text, jsonb, text[], interval, text) IS
    'Register or refresh a replica with the task handlers it runs, its heartbeat interval (its liveness window is derived from it) and its server version.';
REVOKE ALL ON FUNCTION switchboard.replica_heartbeat(text, jsonb, text[], interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.replica_heartbeat(text, jsonb, text[], interval, text) TO switchboard_app;


CREATE OR REPLACE FUNCTION switchboard.replica_stop(replica_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.replica_registry r WHERE r.id = replica_id;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION switchboard.replica_stop(text) IS
    'Deregister a replica on clean shutdown (its presence rows go with it).';
REVOKE ALL ON FUNCTION switchboard.replica_stop(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.replica_stop(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.reap_replicas(stale interval DEFAULT '30 seconds')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM switchboard.replica_registry r WHERE r.heartbeat_at < now() - greatest(stale, r.live_window);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_replicas(interval) IS
    'Forget replicas that stopped heartbeating for longer than stale and their own liveness window (and their presence). Returns how many.';
REVOKE ALL ON FUNCTION switchboard.reap_replicas(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_replicas(interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.presence_set(replica_id text, user_id uuid, sockets integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF sockets IS NULL OR sockets < 0 THEN
        RAISE EXCEPTION 'invalid socket count %', sockets USING ERRCODE = '22023';
    END IF;
    IF sockets = 0 THEN
        DELETE FROM switchboard.presence_sockets p
         WHERE p.replica_id = presence_set.replica_id AND p.user_id = presence_set.user_id;
        RETURN;
    END IF;
    INSERT INTO switchboard.replica_registry (id) VALUES (replica_id)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO NOTHING;
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    VALUES (replica_id, user_id, sockets)
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
COMMENT ON FUNCTION switchboard.presence_set(text, uuid, integer) IS
    'Record how many sockets user_id has on replica_id (0 removes the row). Kept by each replica''s relay.';
REVOKE ALL ON FUNCTION switchboard.presence_set(text, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.presence_set(text, uuid, integer) TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.replicas AS
    SELECT r.id, r.info, r.started_at, r.heartbeat_at,
           (SELECT coalesce(sum(p.sockets), 0) FROM switchboard.presence_sockets p WHERE p.replica_id = r.id) AS sockets,
           r.version, r.handlers, r.heartbeat_interval, r.live_window
      FROM switchboard.replica_registry r
     WHERE r.heartbeat_at > now() - r.live_window;
COMMENT ON VIEW switchboard.replicas IS 'Live replicas (heartbeat within their live_window), their open sockets, version and handlers.';
COMMENT ON COLUMN switchboard.replicas.id IS 'Replica id (host:pid:random); also its worker name on runs.';
COMMENT ON COLUMN switchboard.replicas.info IS 'Host, pid and sockets as of its last heartbeat.';
COMMENT ON COLUMN switchboard.replicas.started_at IS 'First heartbeat.';
COMMENT ON COLUMN switchboard.replicas.heartbeat_at IS 'Last heartbeat.';
COMMENT ON COLUMN switchboard.replicas.sockets IS 'Open WebSockets (from presence).';
COMMENT ON COLUMN switchboard.replicas.version IS 'Server version.';
COMMENT ON COLUMN switchboard.replicas.handlers IS 'Task handlers it runs.';
COMMENT ON COLUMN switchboard.replicas.heartbeat_interval IS 'How often it heartbeats.';
COMMENT ON COLUMN switchboard.replicas.live_window IS 'It counts as live while its last heartbeat is within this window.';
GRANT SELECT ON switchboard.replicas TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.presence AS
    SELECT p.user_id, u.username, p.replica_id, p.sockets, p.since
      FROM switchboard.presence_sockets p
      JOIN switchboard.replica_registry r ON r.id = p.replica_id
      LEFT JOIN switchboard.users u ON u.id = p.user_id
     WHERE r.heartbeat_at > now() - r.live_window;
COMMENT ON VIEW switchboard.presence IS 'Which users have sockets on which live replica.';
COMMENT ON COLUMN switchboard.presence.user_id IS 'The user.';
COMMENT ON COLUMN switchboard.presence.username IS 'The user''s name.';
COMMENT ON COLUMN switchboard.presence.replica_id IS 'The live replica holding the sockets.';
COMMENT ON COLUMN switchboard.presence.sockets IS 'Open sockets of the user on that replica.';
COMMENT ON COLUMN switchboard.presence.since IS 'Since when.';
GRANT SELECT ON switchboard.presence TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.user_online(user_id uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM switchboard.presence_sockets p
                     JOIN switchboard.replica_registry r ON r.id = p.replica_id
                    WHERE p.user_id = user_online.user_id AND p.sockets > 0
                      AND r.heartbeat_at > now() - r.live_window);
END
$$;
COMMENT ON FUNCTION switchboard.user_online(uuid) IS 'True if user_id has a socket on any live replica.';
REVOKE ALL ON FUNCTION switchboard.user_online(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.user_online(uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.room_members_online(room text)
RETURNS TABLE (user_id uuid, username text, online boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.user_id, u.username, switchboard.user_online(m.user_id)
      FROM switchboard.room_members m JOIN switchboard.users u ON u.id = m.user_id
     WHERE m.room = room_members_online.room
     ORDER BY u.username
$$;
COMMENT ON FUNCTION switchboard.room_members_online(text) IS 'Members of room with whether each has a socket anywhere now.';
REVOKE ALL ON FUNCTION switchboard.room_members_online(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.room_members_online(text) TO switchboard_app;

-- Handlers: which task handlers the live replicas run. known_handlers() is
-- what POST /tasks checks (create_task itself stays permissive: a DBA may
-- create a task for a handler that arrives with the next release). The view
-- puts what is served beside what is wanted (active tasks, queued or running
-- runs), so a DBA sees at a glance a handler nobody will run.
CREATE OR REPLACE FUNCTION switchboard.known_handlers(version text DEFAULT NULL)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT h
      FROM switchboard.replica_registry r CROSS JOIN LATERAL unnest(r.handlers) AS h
     WHERE r.heartbeat_at > now() - r.live_window
       AND (known_handlers.version IS NULL OR r.version = known_handlers.version)
     ORDER BY 1
$$;
COMMENT ON FUNCTION switchboard.known_handlers(text) IS
    'Task handler names that some live replica (of the given server version, or any when NULL) registers with its heartbeat.';
REVOKE ALL ON FUNCTION switchboard.known_handlers(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.known_handlers(text) TO switchboard_app;

CREATE OR REPLACE VIEW switchboard.handlers AS
    WITH served AS (
        SELECT h AS handler, count(*) AS live_replicas,
               array_agg(DISTINCT r.version ORDER BY r.version) FILTER (WHERE r.version IS NOT NULL) AS versions
          FROM switchboard.replica_registry r CROSS JOIN LATERAL unnest(r.handlers) AS h
         WHERE r.heartbeat_at > now() - r.live_window
         GROUP BY h
    ), wanted AS (
        SELECT w.handler, sum(w.tasks)::bigint AS active_tasks, sum(w.runs)::bigint AS pending_runs
          FROM (SELECT t.handler, count(*) AS tasks, 0 AS runs FROM switchboard.tasks t
                 WHERE t.is_active GROUP BY t.handler
                UNION ALL
                SELECT r.handler, 0, count(*) FROM switchboard.task_runs r
                 WHERE r.status IN ('queued', 'running') GROUP BY r.handler) AS w
         GROUP BY w.handler
    )
    SELECT coalesce(s.handler, w.handler, p.handler) AS handler,
           s.handler IS NOT NULL AS served,
           coalesce(s.live_replicas, 0) AS live_replicas,
           coalesce(s.versions, '{}') AS versions,
           coalesce(w.active_tasks, 0) AS active_tasks,
           coalesce(w.pending_runs, 0) AS pending_runs,
           p.handler IS NOT NULL AS paused,
           p.paused_at
      FROM served s FULL JOIN wanted w ON w.handler = s.handler
      FULL JOIN switchboard.paused_handlers p ON p.handler = coalesce(s.handler, w.handler);
COMMENT ON VIEW switchboard.handlers IS
    'Task handlers served by live replicas, wanted by active tasks or queued/running runs, or paused; served = false means no live replica runs it, paused = true that claims skip its work (pause_handler()).';
COMMENT ON COLUMN switchboard.handlers.handler IS 'Handler name.';
COMMENT ON COLUMN switchboard.handlers.served IS 'Some live replica runs it.';
COMMENT ON COLUMN switchboard.handlers.live_replicas IS 'How many live replicas run it.';
COMMENT ON COLUMN switchboard.handlers.versions IS 'Server versions of those replicas.';
COMMENT ON COLUMN switchboard.handlers.active_tasks IS 'Active tasks with this handler.';
COMMENT ON COLUMN switchboard.handlers.pending_runs IS 'Queued or running runs with this handler.';
COMMENT ON COLUMN switchboard.handlers.paused IS 'Paused by pause_handler(): claims skip its queued runs and due ticks.';
COMMENT ON COLUMN switchboard.handlers.paused_at IS 'When it was paused.';
GRANT SELECT ON switchboard.handlers TO switchboard_app;

-- Tool bridge. tool_call_send (50_events.sql) registers the call (who it went
-- to, which replica waits) and sends tool.call.<id> to the user's sockets as an
-- ephemeral event; tool_call_answer accepts the answer only from that user,
-- only once, and wakes the waiting replica on switchboard_control, which then
-- collects it with tool_call_collect.

CREATE OR REPLACE FUNCTION switchboard.tool_call_answer(call_id uuid, sender uuid, result jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_replica text;
BEGIN
    PERFORM switchboard._check_event('tool.result', coalesce(result, 'null'), 1048576);
    UPDATE switchboard.tool_calls c SET answered = true, result = tool_call_answer.result
     WHERE c.id = call_id AND c.user_id = sender AND NOT c.answered AND c.expires_at > now()
    RETURNING c.replica_id INTO v_replica;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM switchboard._announce(jsonb_build_object('kind', 'tool_result', 'call_id', call_id, 'replica_id', v_replica));
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_answer(uuid, uuid, jsonb) IS
    'Answer a tool call. Accepted only from the user the call went to, only once, before it expires; wakes the waiting replica.';
REVOKE ALL ON FUNCTION switchboard.tool_call_answer(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_answer(uuid, uuid, jsonb) TO switchboard_app;

