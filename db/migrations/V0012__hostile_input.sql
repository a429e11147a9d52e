-- V0012 (issue 21, hostile input): one identity rule for usernames, and sql
-- task backends that the replica may terminate when they outlive their
-- timeout. Functions: db/functions/60_users.sql (lookups fold the name) and
-- db/functions/85_job_sql.sql (sql_job_register / terminate_sql_job).

-- -- usernames --------------------------------------------------------------------------
-- The identity of a username is its NFKC normal form, ASCII case-folded:
-- 'Alice', 'ALICE' and its full-width form (U+FF21...) are one user. Stored names are
-- ASCII (users_username_check), so the index expression needs no normalize()
-- (which also needs a UTF8 database); a looked-up name is normalised first.
-- The server applies the same rule (bounded.fold_username) to its throttle
-- bucket and device cookie. Defined here, not in db/functions, because the
-- index below depends on it.
CREATE OR REPLACE FUNCTION switchboard.fold_username(name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT pg_catalog.lower(
        (CASE WHEN name OPERATOR(pg_catalog.~) '^[\x01-\x7f]*$' THEN name
              ELSE pg_catalog.normalize(name, 'NFKC') END) COLLATE "C")
$$;
COMMENT ON FUNCTION switchboard.fold_username(text) IS
    'The identity of a username: NFKC normal form, ASCII lower case. Unique over users (users_username_folded_key); login and find_user compare with it.';
REVOKE ALL ON FUNCTION switchboard.fold_username(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.fold_username(text) TO switchboard_app;

-- Names that already collide under the rule are reported, never merged: which
-- account is the real one (and what happens to the other's rooms, runs and
-- tokens) is an operator's decision. docs/operations.md "Usernames that differ
-- only by case" gives the resolution; then migrate again.
DO $duplicates$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN SELECT switchboard.fold_username(u.username) AS folded,
                    string_agg(u.username || ' (' || u.id || ')', ', ' ORDER BY u.created_at) AS names
               FROM switchboard.users u
              GROUP BY 1 HAVING count(*) > 1
    LOOP
        n := n + 1;
        RAISE WARNING 'usernames that are one identity under case folding: %', r.names;
    END LOOP;
    IF n > 0 THEN
        RAISE EXCEPTION '% username(s) collide when compared case-insensitively', n
            USING ERRCODE = '23505',
                  DETAIL = 'The WARNINGs above list each group (username (id), oldest first).',
                  HINT = 'Rename or delete all but one account of each group (docs/operations.md, "Usernames that differ only by case"), then migrate again.';
    END IF;
END
$duplicates$;

CREATE UNIQUE INDEX users_username_folded_key ON switchboard.users (switchboard.fold_username(username));

-- -- sql task backends ----------------------------------------------------------------------
-- A sql task's statement may catch query_canceled (PL/pgSQL EXCEPTION WHEN
-- query_canceled) and keep running past statement_timeout, holding locks and
-- the vacuum horizon. The replica registers the backend of each sql job here
-- (sql_job_register, from that backend itself) and, after timeout + grace,
-- terminates it with terminate_sql_job(pid). (pid, backend_start) names one
-- backend for good: a pid reused by a later session has another start time.
-- UNLOGGED: after a crash every registered backend is gone anyway.
CREATE UNLOGGED TABLE switchboard.sql_job_backends (
    pid           integer PRIMARY KEY,
    backend_start timestamptz NOT NULL,
    run_id        bigint NOT NULL,
    kill_after    timestamptz NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON TABLE switchboard.sql_job_backends FROM PUBLIC;
COMMENT ON TABLE switchboard.sql_job_backends IS
    'Backends running a sql task statement, registered by themselves (sql_job_register); terminate_sql_job may end one after its kill_after.';
COMMENT ON COLUMN switchboard.sql_job_backends.pid IS 'The backend running the job''s statement (pg_backend_pid() at registration).';
COMMENT ON COLUMN switchboard.sql_job_backends.backend_start IS 'That backend''s start time: with pid, identifies the backend (a reused pid never matches).';
COMMENT ON COLUMN switchboard.sql_job_backends.run_id IS 'The running sql run this backend executes (task_runs.id).';
COMMENT ON COLUMN switchboard.sql_job_backends.kill_after IS 'Timeout plus grace: terminate_sql_job ends the backend only after this instant.';
COMMENT ON COLUMN switchboard.sql_job_backends.registered_at IS 'When the backend registered itself.';

-- terminate_sql_job runs as the function owner (the migrating role), which must
-- be allowed to signal the application login's backends and to read their
-- backend_start: a superuser can; otherwise it needs pg_signal_backend and
-- pg_read_all_stats. Grant them when this role may; say so when it may not.
DO $signal$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        BEGIN
            EXECUTE pg_catalog.format('GRANT pg_signal_backend, pg_read_all_stats TO %I', current_user);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'role % cannot be granted pg_signal_backend and pg_read_all_stats', current_user
                USING HINT = 'A superuser should run: GRANT pg_signal_backend, pg_read_all_stats TO ' || current_user
                          || '; until then a sql task that ignores its statement_timeout runs until it ends (docs/security.md).';
        END;
    END IF;
END
$signal$;
