-- pgTAP: what V0012 added (issue 21) -- one identity per username
-- (fold_username, the unique index on it, lookups that fold) and the narrow
-- power to end a sql task's backend (sql_job_register, terminate_sql_job).
-- One transaction, rolled back: no user or registration stays.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(20);

SELECT has_function('switchboard', 'fold_username', ARRAY['text']);
SELECT function_returns('switchboard', 'fold_username', ARRAY['text'], 'text');
SELECT function_privs_are('switchboard', 'fold_username', ARRAY['text'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'fold_username', ARRAY['text'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'sql_job_register', ARRAY['bigint', 'interval']);
SELECT function_privs_are('switchboard', 'sql_job_register', ARRAY['bigint', 'interval'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'sql_job_register', ARRAY['bigint', 'interval'], 'switchboard_job', ARRAY[]::text[]);
SELECT has_function('switchboard', 'terminate_sql_job', ARRAY['integer']);
SELECT function_privs_are('switchboard', 'terminate_sql_job', ARRAY['integer'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'terminate_sql_job', ARRAY['integer'], 'switchboard_job', ARRAY[]::text[]);
SELECT table_privs_are('switchboard', 'sql_job_backends', 'switchboard_app', ARRAY[]::text[],
                       'the application reaches sql_job_backends only through the two functions');

SELECT is(switchboard.fold_username('ALICE'), 'alice', 'fold_username: ASCII case is folded');
SELECT is(switchboard.fold_username(U&'\FF21\FF2C\FF29\FF23\FF25'), 'alice', 'fold_username: NFKC folds full-width forms');
SELECT has_index('switchboard', 'users', 'users_username_folded_key', 'unique index on the folded username');
SELECT lives_ok($$SELECT switchboard.create_user('Pgtap_Fold', '$argon2id$x')$$, 'create Pgtap_Fold');
SELECT throws_ok($$SELECT switchboard.create_user('pgtap_fold', '$argon2id$x')$$, '23505', NULL,
                 'a name that differs only by case is taken');
SELECT is((SELECT username FROM switchboard.find_user('PGTAP_FOLD')), 'Pgtap_Fold', 'find_user folds the name');
SELECT is((SELECT count(*) FROM switchboard.login_lookup_v2('pgtap_FOLD'))::int, 1, 'login_lookup_v2 folds the name');

SELECT throws_ok($$SELECT switchboard.sql_job_register(-1, '1 second')$$, '22023', NULL,
                 'only the backend of a running sql run may register');
SELECT is(switchboard.terminate_sql_job(pg_backend_pid()), false, 'an unregistered backend is never terminated');

SELECT * FROM finish();
ROLLBACK;
