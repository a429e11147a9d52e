-- Least-privilege roles for the application's own code and for people (issue 33).
--
-- switchboard_app holds every grant the replicas need. Other callers need far
-- less, and each role below is exactly what its caller may do -- nothing else:
--
--   switchboard_publisher  application code that publishes and enqueues in its own
--                          transactions (switchboard.api): notify_user, notify_room,
--                          enqueue, and a stream's producer side (open, append,
--                          renew, close). It reads nothing and claims nothing.
--   switchboard_reader     dashboards: status(), metrics_snapshot(), partition_health(),
--                          the runs, handlers, replicas and partitions views, list_runs(), known_handlers(),
--                          event_window(). No event, ticket, session or user data.
--   switchboard_operator   people who act on jobs: retry_run, cancel_run (and
--                          retry_runs, cancel_runs by filter), pause_handler,
--                          resume_handler, stream_stop; a member of
--                          switchboard_reader (it sees what it acts on).
--
-- NOLOGIN: grant a role to a login role (GRANT switchboard_publisher TO myapp).
-- Cluster-wide, created here when missing so the grants below apply at every
-- migration target (the function files load at each one); two databases of one
-- cluster may migrate at once, so a concurrent CREATE ROLE is tolerated. Every
-- function here is SECURITY DEFINER with REVOKE ... FROM PUBLIC in its own file: these
-- GRANTs are the only way in. tests/test_roles.py checks each role's whole
-- privilege set against the lists below, and db/tests/70_roles.sql checks them
-- in any installation.
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['switchboard_publisher', 'switchboard_reader', 'switchboard_operator'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END LOOP;
END
$roles$;
GRANT USAGE ON SCHEMA switchboard TO switchboard_publisher;
GRANT USAGE ON SCHEMA switchboard TO switchboard_reader;
GRANT USAGE ON SCHEMA switchboard TO switchboard_operator;
GRANT switchboard_reader TO switchboard_operator;

-- publisher
GRANT EXECUTE ON FUNCTION switchboard.notify_user(uuid, text, jsonb) TO switchboard_publisher;
GRANT EXECUTE ON FUNCTION switchboard.notify_room(text, text, jsonb) TO switchboard_publisher;
GRANT EXECUTE ON FUNCTION switchboard.enqueue(text, jsonb, timestamptz, text, integer, integer, text) TO switchboard_publisher;
GRANT EXECUTE ON FUNCTION switchboard.stream_open(uuid, text, jsonb, text, interval, interval) TO switchboard_publisher;
GRANT EXECUTE ON FUNCTION switchboard.stream_append(uuid, text[]) TO switchboard_publisher;
GRANT EXECUTE ON FUNCTION switchboard.stream_renew(uuid[]) TO switchboard_publisher;
GRANT EXECUTE ON FUNCTION switchboard.stream_close(uuid, text, jsonb) TO switchboard_publisher;

-- reader
GRANT EXECUTE ON FUNCTION switchboard.status() TO switchboard_reader;
GRANT EXECUTE ON FUNCTION switchboard.metrics_snapshot() TO switchboard_reader;
GRANT EXECUTE ON FUNCTION switchboard.list_runs(text, text, text, timestamptz, integer, bigint) TO switchboard_reader;
GRANT EXECUTE ON FUNCTION switchboard.known_handlers(text) TO switchboard_reader;
GRANT EXECUTE ON FUNCTION switchboard.event_window() TO switchboard_reader;
GRANT SELECT ON switchboard.runs TO switchboard_reader;
GRANT EXECUTE ON FUNCTION switchboard.partition_health() TO switchboard_reader;
GRANT SELECT ON switchboard.partitions TO switchboard_reader;
GRANT SELECT ON switchboard.handlers TO switchboard_reader;
GRANT SELECT ON switchboard.replicas TO switchboard_reader;

-- operator (and everything switchboard_reader may do)
GRANT EXECUTE ON FUNCTION switchboard.retry_run(bigint) TO switchboard_operator;
GRANT EXECUTE ON FUNCTION switchboard.cancel_run(bigint) TO switchboard_operator;
GRANT EXECUTE ON FUNCTION switchboard.pause_handler(text) TO switchboard_operator;
GRANT EXECUTE ON FUNCTION switchboard.resume_handler(text) TO switchboard_operator;
GRANT EXECUTE ON FUNCTION switchboard.stream_stop(uuid, uuid) TO switchboard_operator;
GRANT EXECUTE ON FUNCTION switchboard.retry_runs(text, text, text, timestamptz, integer) TO switchboard_operator;
GRANT EXECUTE ON FUNCTION switchboard.cancel_runs(text, text, text, timestamptz, integer) TO switchboard_operator;
