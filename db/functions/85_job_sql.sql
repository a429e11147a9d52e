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
    'Run one SQL statement as the restricted role switchboard_job (the sql task handler). The statement cannot switch roles; it must schema-qualify table names. Returns {"rowcount", "role"}.';
REVOKE ALL ON FUNCTION switchboard.run_job_sql(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.run_job_sql(text) TO switchboard_app;
