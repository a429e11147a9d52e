"""Privileges: comments, pinned search_path, least-privilege roles.

`app_url` logs in as sb_app_login, which holds only switchboard_app: exactly
what the server gets in production.
"""

from __future__ import annotations

import psycopg
import pytest
from pgtap import function_privs_are, throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
PINNED = "search_path=pg_catalog, pg_temp"
# Helpers the application role may execute on purpose: cron_next/cron_validate
# run with the caller's rights and call the _cron_* helpers, _every_interval and
# _check_timezone (the zone rule cron_validate shares with create_task). Anything
# else starting with "_" stays private.
APP_HELPERS = {"_every_interval", "_check_timezone"}


# Public functions the application may NOT run: whether event contents may travel on the
# bus (the live path, V0020) is the owner's decision, not the app's.
# The partitions of events (V0037) are the owner's too: reap_events (SECURITY DEFINER)
# creates and drops them; a DBA reads the layout.
OWNER_ONLY = {"event_live_path", "event_partitions", "events_partitions_ensure"}


def _app_may_execute(name: str) -> bool:
    if name in OWNER_ONLY:
        return False
    return not name.startswith("_") or name in APP_HELPERS or name.startswith("_cron_")

FUNCS = """SELECT p.proname, p.oid::regprocedure::text, p.prosecdef, p.proconfig,
                  obj_description(p.oid, 'pg_proc')
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'switchboard' AND p.prokind = 'f' ORDER BY 1, 2"""
TABLES = """SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'switchboard' AND c.relkind IN ('r', 'p') ORDER BY 1"""


def _functions(conn: psycopg.Connection) -> list[tuple]:
    rows = conn.execute(FUNCS).fetchall()
    assert len(rows) > 50, "suspiciously few functions"
    return rows


def test_every_public_function_has_a_comment(conn: psycopg.Connection) -> None:
    missing = [sig for name, sig, _, _, comment in _functions(conn)
               if not name.startswith("_") and not (comment or "").strip()]
    assert missing == []


def test_every_security_definer_function_pins_search_path(conn: psycopg.Connection) -> None:
    definers = [(sig, cfg) for _, sig, secdef, cfg, _ in _functions(conn) if secdef]
    assert len(definers) > 40
    unpinned = [sig for sig, cfg in definers if PINNED not in (cfg or [])]
    assert unpinned == []


def test_public_has_no_execute_and_the_app_role_has_exactly_what_it_needs(conn: psycopg.Connection) -> None:
    for name, sig, *_ in _functions(conn):
        function_privs_are(conn, sig, "public", [])
        if _app_may_execute(name):
            function_privs_are(conn, sig, "switchboard_app", ["EXECUTE"])
        else:
            function_privs_are(conn, sig, "switchboard_app", [])
    # PUBLIC cannot even reach the schema
    assert conn.execute("SELECT has_schema_privilege('public', 'switchboard', 'USAGE')").fetchone()[0] is False


def test_the_app_role_can_do_its_job(db: str, app_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        admin.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                           FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
    with psycopg.connect(app_url, autocommit=True) as app:
        assert app.execute("SELECT current_user").fetchone()[0] == "sb_app_login"
        uid = app.execute("SELECT switchboard.create_user('appuser', %s)", (ARGON,)).fetchone()[0]
        assert app.execute("SELECT user_id, password_hash FROM switchboard.login_lookup_v2('appuser')"
                           ).fetchone() == (uid, ARGON)
        assert app.execute("SELECT id, username, role FROM switchboard.users WHERE id = %s",
                           (uid,)).fetchone() == (uid, "appuser", "member")
        ticket = app.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
        assert app.execute("SELECT user_id FROM switchboard.consume_ticket_v2(%s)", (ticket,)).fetchone()[0] == uid
        assert app.execute("SELECT allowed FROM switchboard.rate_check('app', 1, 1)").fetchone()[0] is True
        job = app.execute("SELECT id FROM switchboard.enqueue('app.job')").fetchone()[0]
        assert app.execute("SELECT id FROM switchboard.claim_due_task('app-w')").fetchone()[0] == job
        assert app.execute("SELECT switchboard.finish_run(%s, 'app-w', true)", (job,)).fetchone()[0] is True
        eid = app.execute("SELECT switchboard.notify_user(%s, 'hello', '{}')", (uid,)).fetchone()[0]
        assert app.execute("SELECT switchboard.event_tick()").fetchone()[0] > 0
        assert app.execute("SELECT id FROM switchboard.events_since_v2(%s, 0, 0)", (uid,)).fetchall() == [(eid,)]
        task = app.execute("SELECT id FROM switchboard.create_task('app-task', '*/5 * * * *', 'sql', "
                           "'{\"sql\": \"SELECT 1\"}')").fetchone()[0]
        assert app.execute("SELECT count(*) FROM switchboard.create_run_exclusive(%s)", (task,)).fetchone()[0] == 1
        assert app.execute("SELECT count(*) FROM switchboard.status()").fetchone()[0] > 10
        assert app.execute("SELECT switchboard.maintenance() ? 'tickets'").fetchone()[0] is True


def test_the_app_role_cannot_read_hashes_or_write_tables(db: str, app_url: str) -> None:
    with psycopg.connect(app_url) as app:
        throws_ok(app, "SELECT password_hash FROM switchboard.users", "42501")
        throws_ok(app, "SELECT * FROM switchboard.users", "42501")
        throws_ok(app, "SELECT * FROM switchboard.tickets", "42501")
        tables = [r[0] for r in app.execute(TABLES)]
        assert len(tables) >= 14
        for t in tables:
            col = app.execute(
                "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped AND attidentity = '' ORDER BY attnum LIMIT 1",
                (t,)).fetchone()[0]
            throws_ok(app, f"INSERT INTO {t} DEFAULT VALUES", "42501")
            throws_ok(app, f"UPDATE {t} SET {col} = {col} WHERE false", "42501")
            throws_ok(app, f"DELETE FROM {t} WHERE false", "42501")
            throws_ok(app, f"TRUNCATE {t}", "42501")
        throws_ok(app, "SELECT nextval('switchboard.event_id_seq')", "42501")
        # the validation in notify_user cannot be bypassed through the helper
        throws_ok(app, "SELECT switchboard._publish(NULL, 'r', 'e', '{}')", "42501")


def test_the_job_role_cannot_touch_switchboard(db: str, app_url: str) -> None:
    with psycopg.connect(db) as su:  # a superuser may SET ROLE to anything
        su.execute("SET ROLE switchboard_job")
        assert su.execute("SELECT current_user").fetchone()[0] == "switchboard_job"
        throws_ok(su, "SELECT * FROM switchboard.tasks", "42501")
        throws_ok(su, "SELECT id FROM switchboard.users", "42501")
        throws_ok(su, "SELECT * FROM switchboard.rate_check('k', 1, 1)", "42501")
        throws_ok(su, "SELECT * FROM switchboard.claim_due_task('sneaky')", "42501")
    with psycopg.connect(app_url) as app:
        # the app role is not a member of the job role: it cannot even switch to it
        throws_ok(app, "SET ROLE switchboard_job", "42501")


def test_sql_jobs_cannot_escape_the_job_role(db: str, app_url: str) -> None:
    """run_job_sql is owned by switchboard_job and SECURITY DEFINER: the statement runs
    as the job role and cannot RESET ROLE back to the caller (a plain SET LOCAL ROLE
    on the app connection could be undone by a DO block)."""
    with psycopg.connect(db, autocommit=True) as su:
        su.execute("CREATE TABLE public.scratch (n int)")
        su.execute("GRANT INSERT, SELECT ON public.scratch TO switchboard_job")
    with psycopg.connect(app_url) as app:
        r = app.execute("SELECT switchboard.run_job_sql('INSERT INTO public.scratch VALUES (1), (2)')").fetchone()[0]
        assert r == {"rowcount": 2, "role": "switchboard_job"}
        throws_ok(app, "SELECT switchboard.run_job_sql('SELECT * FROM switchboard.tasks')", "42501")
        escape = ("DO $x$ BEGIN EXECUTE 'RESET ROLE'; "
                  "PERFORM switchboard.create_user('mallory', '$argon2id$x', 'admin'); END $x$")
        throws_ok(app, "SELECT switchboard.run_job_sql(%s)", "42501", (escape,))
        throws_ok(app, "SELECT switchboard.run_job_sql('SET ROLE switchboard_app')", "42501")
        throws_ok(app, "SELECT switchboard.run_job_sql('SET SESSION AUTHORIZATION postgres')", "42501")
        throws_ok(app, "SELECT switchboard.run_job_sql('  ')", "22023")
        app.commit()
    with psycopg.connect(db) as su:
        assert su.execute("SELECT count(*) FROM switchboard.users WHERE username = 'mallory'").fetchone()[0] == 0
        assert su.execute("SELECT count(*) FROM public.scratch").fetchone()[0] == 2


@pytest.mark.parametrize("table", ["tickets", "rate_limits", "replica_registry", "presence_sockets", "tool_calls"])
def test_ephemeral_tables_are_unlogged(conn: psycopg.Connection, table: str) -> None:
    from pgtap import is_unlogged

    is_unlogged(conn, table)
