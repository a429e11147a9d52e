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
