-- The `sql` task handler: an admin's statement runs as switchboard_job.
--
-- SET [LOCAL] ROLE on the application's connection is not a security
-- boundary: any statement can RESET ROLE (e.g. EXECUTE 'RESET ROLE' inside a
-- DO block) and act with the application role again. A SECURITY DEFINER
-- function *owned by* switchboard_job is a boundary: while it runs, Postgres
-- refuses SET ROLE, RESET ROLE and SET SESSION AUTHORIZATION (42501), so the
-- statement cannot leave the job role, and the job role has no rights on
-- Switchboard's tables. search_path is pinned: statements schema-qualify
-- their tables (public.sessions, not sessions).
--
-- Ownership: the migrating role becomes a member of switchboard_job (so it
-- may transfer the function and re-create it on the next release), and the
-- job role holds CREATE on the schema only for the ALTER ... OWNER below.
--
-- Session state: whatever the statement leaves in the session (SET or
-- set_config(..., false), a session advisory lock, LISTEN, PREPARE, a temp
-- table) outlives this call. The server therefore runs each job on its own
-- connection and closes it afterwards (never a pooled one); a DBA calling
-- this from psql owns the session it runs in. The server also refuses a
-- task's timeout_seconds of 0 (no timeout) unless its operator allowed it
-- (SWITCHBOARD_SQL_ALLOW_NO_TIMEOUT).

-- Roles are cluster-wide (the two names are spelled only here and in
-- V0001__core_schema.sql and the GRANTs of db/functions). Two Switchboard
-- databases on one cluster would share switchboard_app: the login of one
-- deployment could act as the application in the other. Refuse to install
-- into a second database unless the operator opts in on the migrating
-- session (PGOPTIONS='-c switchboard.shared_roles=on'), e.g. for tests or
-- throwaway copies that trust each other. pg_shdepend is the cluster-wide
-- record of which database holds grants to (or objects of) a role; a
-- database cloned with CREATE DATABASE ... TEMPLATE copies its entries.
DO $shared_roles$
DECLARE
    v_other text;
BEGIN
    IF coalesce(current_setting('switchboard.shared_roles', true), '') IN ('on', 'true', '1') THEN
        RETURN;
    END IF;
    SELECT string_agg(DISTINCT d.datname, ', ' ORDER BY d.datname) INTO v_other
      FROM pg_catalog.pg_shdepend s
      JOIN pg_catalog.pg_database d ON d.oid = s.dbid
     WHERE s.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass
       AND s.refobjid IN (SELECT r.oid FROM pg_catalog.pg_roles r
                           WHERE r.rolname IN ('switchboard_app', 'switchboard_job'))
       AND d.datname <> current_database();
    IF v_other IS NOT NULL THEN
        RAISE EXCEPTION 'roles switchboard_app and switchboard_job already hold privileges in database(s) %', v_other
            USING ERRCODE = '55000',
                  DETAIL = 'Roles are cluster-wide: a login granted switchboard_app for this database could act as the application in the other one too.',
                  HINT = 'Install each Switchboard in its own cluster, or drop the other installation. If the databases trust each other '
                      || '(tests, throwaway copies), migrate with PGOPTIONS=''-c switchboard.shared_roles=on''.';
    END IF;
END
$shared_roles$;

GRANT switchboard_job TO CURRENT_USER;
GRANT CREATE ON SCHEMA switchboard TO switchboard_job;

CREATE OR REPLACE FUNCTION switchboard.run_job_sql(statement text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows bigint;
BEGIN
    IF statement IS NULL OR length(btrim(statement)) = 0 THEN
        RAISE EXCEPTION 'the sql handler needs a statement' USING ERRCODE = '22023',
            HINT = 'Task args: {"sql": "DELETE FROM public.sessions WHERE expires_at < now()"}';
    END IF;
    EXECUTE statement;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN jsonb_build_object('rowcount', v_rows, 'role', current_user);
END
$$;
ALTER FUNCTION switchboard.run_job_sql(text) OWNER TO switchboard_job;
REVOKE CREATE ON SCHEMA switchboard FROM switchboard_job;
COMMENT ON FUNCTION switchboard.run_job_sql(text) IS
    'Run one SQL statement as the restricted role switchboard_job (the sql task handler). The statement cannot switch roles; it must schema-qualify table names. Session state it leaves behind stays with the session: run it on a connection that is closed afterwards. Returns {"rowcount", "role"}.';
REVOKE ALL ON FUNCTION switchboard.run_job_sql(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.run_job_sql(text) TO switchboard_app;

-- A sql task's statement can outlive statement_timeout: PL/pgSQL may catch
-- query_canceled and go on, and a closed client connection is noticed only
-- where client_connection_check_interval (which the statement may SET to 0)
-- is checked. So the replica terminates the job's backend after timeout +
-- grace, through these two functions, which make that power narrow:
--   * sql_job_register(run_id, kill_after) is called by the job's backend
--     itself (it registers pg_backend_pid(), nothing else), only while run_id
--     is a running run of the sql handler; it also ends orphans: a registered
--     backend of an earlier attempt of the same run (its replica stopped while
--     the statement ignored everything), or one past its kill_after;
--   * terminate_sql_job(pid) terminates only a backend registered that way,
--     still the same backend (pid and backend_start), after its kill_after.
-- The application role cannot terminate anything else through them, and the
-- job role (switchboard_job, what the statement runs as) can call neither.
-- PL/pgSQL, bound at first call: the file is also applied on top of an older
-- schema (pgmigrate -t N) that has no sql_job_backends yet.
CREATE OR REPLACE FUNCTION switchboard.sql_job_register(run_id bigint, kill_after interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_start timestamptz;
    v_orphan integer;
BEGIN
    IF kill_after IS NULL OR kill_after < interval '0' OR kill_after > interval '2 days' THEN
        RAISE EXCEPTION 'invalid kill_after "%"', kill_after USING ERRCODE = '22023',
            HINT = 'The statement''s timeout plus a grace period, between 0 and 2 days.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM switchboard.task_runs_hot r
                    WHERE r.id = sql_job_register.run_id AND r.status = 'running' AND r.handler = 'sql') THEN
        RAISE EXCEPTION 'run % is not a running sql task run', run_id USING ERRCODE = '22023',
            HINT = 'Only the backend of a running sql task registers itself, just before its statement.';
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_catalog.pg_stat_activity a WHERE a.pid = pg_catalog.pg_backend_pid();
    IF v_start IS NULL THEN
        RAISE EXCEPTION 'the owner of switchboard.sql_job_register cannot see this backend''s start time'
            USING ERRCODE = '42501',
                  HINT = 'GRANT pg_signal_backend, pg_read_all_stats TO the role that runs the migrations.';
    END IF;
    -- Rows of backends that are gone (ended normally, or terminated) go first.
    DELETE FROM switchboard.sql_job_backends b
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                        WHERE a.pid = b.pid AND a.backend_start = b.backend_start);
    -- Orphans: a backend still running an earlier attempt of this run (its replica
    -- stopped or lost the lease while the statement ignored the cancel and the closed
    -- connection), or any registered backend past its kill_after whose replica never
    -- terminated it. One run, one backend; nothing outlives its timeout for long.
    FOR v_orphan IN
        SELECT b.pid FROM switchboard.sql_job_backends b
          JOIN pg_catalog.pg_stat_activity a ON a.pid = b.pid AND a.backend_start = b.backend_start
         WHERE b.pid <> pg_catalog.pg_backend_pid()
           AND (b.run_id = sql_job_register.run_id OR b.kill_after <= now())
    LOOP
        PERFORM pg_catalog.pg_terminate_backend(v_orphan);
        DELETE FROM switchboard.sql_job_backends b WHERE b.pid = v_orphan;
    END LOOP;
    INSERT INTO switchboard.sql_job_backends AS b (pid, backend_start, run_id, kill_after)
    VALUES (pg_catalog.pg_backend_pid(), v_start, sql_job_register.run_id, now() + kill_after)
    ON CONFLICT ON CONSTRAINT sql_job_backends_pkey DO UPDATE
       SET backend_start = excluded.backend_start, run_id = excluded.run_id,
           kill_after = excluded.kill_after, registered_at = now();
    RETURN pg_catalog.pg_backend_pid();
END
$$;
COMMENT ON FUNCTION switchboard.sql_job_register(bigint, interval) IS
    'Called by a sql task''s own backend before its statement: registers this backend (pid, backend_start) for run_id, which must be a running run of the sql handler, so that terminate_sql_job may end it after kill_after. Returns the pid.';
REVOKE ALL ON FUNCTION switchboard.sql_job_register(bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.sql_job_register(bigint, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.terminate_sql_job(pid integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;
BEGIN
    SELECT b.* INTO v FROM switchboard.sql_job_backends b
      JOIN pg_catalog.pg_stat_activity a ON a.pid = b.pid AND a.backend_start = b.backend_start
     WHERE b.pid = terminate_sql_job.pid;
    IF NOT FOUND THEN
        -- Not registered, or that backend has ended: nothing of ours to stop.
        DELETE FROM switchboard.sql_job_backends b WHERE b.pid = terminate_sql_job.pid;
        RETURN false;
    END IF;
    IF now() < v.kill_after THEN
        RAISE EXCEPTION 'sql job backend % (run %) may not be terminated before %', v.pid, v.run_id, v.kill_after
            USING ERRCODE = '55000', HINT = 'Its timeout plus grace has not passed yet.';
    END IF;
    -- Waits (up to 5 s) until the backend has exited: its locks are free on return.
    IF NOT pg_catalog.pg_terminate_backend(v.pid, 5000) THEN
        RAISE EXCEPTION 'sql job backend % (run %) did not exit within 5 s of being terminated', v.pid, v.run_id
            USING ERRCODE = '57000', HINT = 'Retry; see pg_stat_activity for the backend.';
    END IF;
    DELETE FROM switchboard.sql_job_backends b WHERE b.pid = v.pid;
    RETURN true;
END
$$;
COMMENT ON FUNCTION switchboard.terminate_sql_job(integer) IS
    'Terminate the backend of a sql task that ran past its timeout plus grace: only a backend registered by sql_job_register, still the same backend, after its kill_after. Waits until it has exited. False if it had already ended.';
REVOKE ALL ON FUNCTION switchboard.terminate_sql_job(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.terminate_sql_job(integer) TO switchboard_app;
