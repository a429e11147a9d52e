"""Users, rooms, presence, replicas, status() and the tool bridge."""

from __future__ import annotations

import json

import psycopg
import pytest
from pgtap import listener, notifications, throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
BCRYPT = "$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW"
CONTROL = "switchboard_control"


def new_user(c: psycopg.Connection, name: str, role: str = "member") -> str:
    return c.execute("SELECT switchboard.create_user(%s, %s, %s)", (name, ARGON, role)).fetchone()[0]


@pytest.mark.parametrize("plain", ["hunter2", "", "$5$rounds=5000$salt$hash", "argon2id$v=19$x", "$1$abc$def"])
def test_create_user_refuses_anything_but_a_hash(conn: psycopg.Connection, plain: str) -> None:
    throws_ok(conn, "SELECT switchboard.create_user('pat', %s)", "22023", (plain,), match="hash")
    assert conn.execute("SELECT count(*) FROM switchboard.users WHERE username = 'pat'").fetchone()[0] == 0


@pytest.mark.parametrize("name", ["", "-dash", ".dot", "has space", "x" * 65, "ümlaut", "semi;colon", None])
def test_create_user_refuses_bad_usernames(conn: psycopg.Connection, name: str | None) -> None:
    throws_ok(conn, "SELECT switchboard.create_user(%s, %s)", "22023", (name, ARGON), match="username")


def test_create_user_and_login_lookup(conn: psycopg.Connection) -> None:
    a = new_user(conn, "ada.lovelace@example")
    b = conn.execute("SELECT switchboard.create_user('bob_2', %s, 'admin')", (BCRYPT,)).fetchone()[0]
    assert conn.execute("SELECT * FROM switchboard.login_lookup_v2('ada.lovelace@example')").fetchone() == (
        a, ARGON, "member", False, 0)
    assert conn.execute("SELECT * FROM switchboard.login_lookup_v2('bob_2')").fetchone() == (
        b, BCRYPT, "admin", False, 0)
    assert conn.execute("SELECT * FROM switchboard.login_lookup_v2('nobody')").fetchall() == []
    assert conn.execute("SELECT * FROM switchboard.find_user('bob_2')").fetchone() == (b, "bob_2", "admin", False)
    throws_ok(conn, "SELECT switchboard.create_user('bob_2', %s)", "23505", (ARGON,), match="bob_2")
    throws_ok(conn, "SELECT switchboard.create_user('carl', %s, 'root')", "22023", (ARGON,), match="root")
    conn.execute("SELECT switchboard.set_user_password_hash(%s, %s)", (a, BCRYPT))
    # a password change revokes the user's tokens: its token epoch moves on
    assert conn.execute("SELECT password_hash, token_epoch FROM switchboard.login_lookup_v2('ada.lovelace@example')"
                        ).fetchone() == (BCRYPT, 1)
    throws_ok(conn, "SELECT switchboard.set_user_password_hash(%s, 'plain')", "22023", (a,))
    throws_ok(conn, "SELECT switchboard.set_user_password_hash(gen_random_uuid(), %s)", "P0002", (ARGON,))


def test_disable_user_and_role_change_are_announced_at_commit(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "mallory")
    lst = listener(db, CONTROL)
    try:
        with psycopg.connect(db) as c:
            c.execute("SELECT switchboard.disable_user(%s)", (uid,))
            c.rollback()
            assert notifications(lst, 0.3) == []
            assert c.execute("SELECT disabled FROM switchboard.users WHERE id = %s", (uid,)).fetchone()[0] is False
            c.rollback()

            c.execute("SELECT switchboard.disable_user(%s)", (uid,))
            assert notifications(lst, 0.3) == [], "announced before COMMIT"
            c.commit()
            (note,) = notifications(lst, 2.0, stop_after=1)
            assert note.channel == CONTROL
            # ids only: a replica reads the state itself (user_states)
            assert json.loads(note.payload) == {"kind": "user", "user_id": str(uid)}
            assert c.execute("SELECT disabled, token_epoch FROM switchboard.login_lookup_v2('mallory')"
                             ).fetchone() == (True, 1)

            c.execute("SELECT switchboard.set_user_role(%s, 'admin')", (uid,))
            c.commit()
            (note,) = notifications(lst, 2.0, stop_after=1)
            assert json.loads(note.payload) == {"kind": "user", "user_id": str(uid)}
            assert c.execute("SELECT * FROM switchboard.user_states(ARRAY[%s, gen_random_uuid()])",
                             (uid,)).fetchall() == [(uid, "admin", True, 2)]
            c.execute("SELECT switchboard.set_user_role(%s, 'admin')", (uid,))  # no change: tokens stay
            assert c.execute("SELECT token_epoch FROM switchboard.user_states(ARRAY[%s])", (uid,)).fetchone() == (2,)
            c.commit()
            throws_ok(c, "SELECT switchboard.disable_user(gen_random_uuid())", "P0002")
            throws_ok(c, "SELECT switchboard.set_user_role(%s, 'god')", "22023", (uid,), match="god")
    finally:
        lst.close()


def test_room_membership(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        u = new_user(c, "member1")
        lst = listener(db, CONTROL)
        try:
            assert c.execute("SELECT switchboard.add_room_member('ops', %s)", (u,)).fetchone()[0] is True
            assert c.execute("SELECT switchboard.add_room_member('ops', %s)", (u,)).fetchone()[0] is False
            assert c.execute("SELECT switchboard.is_room_member('ops', %s)", (u,)).fetchone()[0] is True
            assert c.execute("SELECT user_id, username, online FROM switchboard.room_members_online('ops')"
                             ).fetchall() == [(u, "member1", False)]
            assert c.execute("SELECT switchboard.remove_room_member('ops', %s)", (u,)).fetchone()[0] is True
            assert c.execute("SELECT switchboard.remove_room_member('ops', %s)", (u,)).fetchone()[0] is False
            assert c.execute("SELECT switchboard.is_room_member('ops', %s)", (u,)).fetchone()[0] is False
            notes = [json.loads(n.payload) for n in notifications(lst, 1.0, stop_after=2)]
        finally:
            lst.close()
        # hints only; a replica re-checks is_room_member before acting
        assert notes == [{"kind": "member", "room": "ops", "user_id": str(u)}] * 2
        throws_ok(c, "SELECT switchboard.add_room_member('bad room', %s)", "22023", (u,), match="bad room")
        throws_ok(c, "SELECT switchboard.add_room_member('ops', gen_random_uuid())", "P0002")


def test_presence_follows_replica_liveness(conn: psycopg.Connection) -> None:
    u = new_user(conn, "present")
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is False
    conn.execute("SELECT switchboard.replica_heartbeat('r1', '{\"host\": \"pod-1\"}', '{}', '5 seconds', NULL)")
    conn.execute("SELECT switchboard.presence_set('r1', %s, 2)", (u,))
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is True
    assert conn.execute("SELECT username, replica_id, sockets FROM switchboard.presence WHERE user_id = %s",
                        (u,)).fetchall() == [("present", "r1", 2)]
    assert conn.execute("SELECT info, sockets FROM switchboard.replicas WHERE id = 'r1'").fetchone() == (
        {"host": "pod-1"}, 2)
    conn.execute("SELECT switchboard.presence_set('r1', %s, 0)", (u,))
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is False
    conn.execute("SELECT switchboard.presence_set('r1', %s, 1)", (u,))
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is True
    # the replica stops heartbeating: its users are offline at once, and reaped later
    conn.execute("UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '1 minute' "
                 "WHERE id = 'r1'")
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is False
    assert conn.execute("SELECT count(*) FROM switchboard.replicas WHERE id = 'r1'").fetchone()[0] == 0
    assert conn.execute("SELECT switchboard.reap_replicas('30 seconds')").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM switchboard.presence_sockets WHERE replica_id = 'r1'"
                        ).fetchone()[0] == 0
    throws_ok(conn, "SELECT switchboard.presence_set('r1', %s, -1)", "22023", (u,))
    assert conn.execute("SELECT switchboard.replica_stop('r1')").fetchone()[0] is False


def test_status_counts_what_is_there(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                       FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
        u = new_user(c, "stat")
        for _ in range(3):
            c.execute("SELECT switchboard.enqueue('s')")
        run = c.execute("SELECT id FROM switchboard.claim_due_task('w')").fetchone()[0]
        c.execute("SELECT switchboard.claim_due_task('w2')")
        c.execute("SELECT switchboard.finish_run(%s, 'w', true)", (run,))
        c.execute("SELECT switchboard.issue_ticket_v2(%s, NULL) FROM generate_series(1, 2)", (u,))
        c.execute("SELECT switchboard.rate_check(k, 1, 1) FROM unnest(ARRAY['a', 'b', 'c']) k")
        last = c.execute("SELECT max(switchboard.notify_user(%s, 'e', '{}')) FROM generate_series(1, 4)",
                         (u,)).fetchone()[0]
        c.execute("SELECT switchboard.replica_heartbeat('r1', '{}', '{}', '5 seconds', NULL)")
        c.execute("SELECT switchboard.presence_set('r1', %s, 3)", (u,))
        status = dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())
        c.execute("SELECT switchboard.db_instance()")      # a replica's LISTEN connect sets the epoch
        since = dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())["unlogged_state_since"]
        started = c.execute("SELECT extract(epoch FROM pg_postmaster_start_time())::bigint").fetchone()[0]
    # the server itself (failover awareness, tests/pgha for a real failover)
    server = {k: status.pop(k) for k in ("db_in_recovery", "db_timeline", "db_started_at", "unlogged_state_since")}
    assert server == {"db_in_recovery": 0, "db_timeline": 1, "db_started_at": started, "unlogged_state_since": None}
    assert since is not None and since >= started
    # run history (V0036): day partitions made ahead at migration, counted from the clock
    # (a template migrated just before midnight has one day fewer ahead, one day older)
    ahead, oldest = status.pop("runs_partitions_ahead"), status.pop("runs_partition_oldest_age_seconds")
    assert 2 <= ahead <= 3
    assert 0 <= oldest <= 2 * 86400
    assert status == {
        "runs_history_default": 0, "runs_backfill_pending": 0,
        "tasks_due": 0, "tasks_active": 0,
        "runs_queued": 1, "runs_running": 1, "runs_succeeded": 1, "runs_failed": 0, "runs_abandoned": 0,
        "runs_cancelled": 0, "handlers_paused": 0, "runs_due": 1, "expired_leases": 0, "live_tickets": 2, "rate_limit_keys": 3,
        "events_retained": 4, "event_backlog_seconds": 0, "last_event_id": last, "events_default_rows": 0,
        "live_replicas": 1, "users_online": 1, "sockets_open": 3,
        "handlers_unserved": 1,  # 's' has pending runs; r1 registers no handler
        "tasks_broken": 0,
    }


def test_tool_call_bridge(conn: psycopg.Connection) -> None:
    target, other = new_user(conn, "target"), new_user(conn, "other")
    assert conn.execute("SELECT switchboard.tool_call_send(%s, 'r1', 'pick_file')", (target,)).fetchone()[0] is None
    conn.execute("SELECT switchboard.replica_heartbeat('r1', '{}', '{}', '5 seconds', NULL)")
    conn.execute("SELECT switchboard.presence_set('r1', %s, 1)", (target,))
    call = conn.execute("SELECT switchboard.tool_call_send(%s, 'r1', 'pick_file', '{\"ext\": \"pdf\"}')",
                        (target,)).fetchone()[0]
    assert call is not None
    assert conn.execute("SELECT switchboard.tool_call_answer(%s, %s, '{\"path\": \"/evil\"}')",
                        (call, other)).fetchone()[0] is False
    assert conn.execute("SELECT switchboard.tool_call_answer(%s, %s, '{\"path\": \"/a.pdf\"}')",
                        (call, target)).fetchone()[0] is True
    assert conn.execute("SELECT switchboard.tool_call_answer(%s, %s, '{\"path\": \"/b.pdf\"}')",
                        (call, target)).fetchone()[0] is False
    assert conn.execute("SELECT * FROM switchboard.tool_call_collect(%s)", (call,)).fetchone() == (
        True, {"path": "/a.pdf"})
    assert conn.execute("SELECT * FROM switchboard.tool_call_collect(%s)", (call,)).fetchall() == []
    # an expired call takes no answer
    late = conn.execute("SELECT switchboard.tool_call_send(%s, 'r1', 'slow')", (target,)).fetchone()[0]
    conn.execute("UPDATE switchboard.tool_calls SET expires_at = now() - interval '1 second' WHERE id = %s", (late,))
    assert conn.execute("SELECT switchboard.tool_call_answer(%s, %s, '{}')", (late, target)).fetchone()[0] is False
    throws_ok(conn, "SELECT switchboard.tool_call_send(%s, 'r1', 'x', '{}', '1 hour')", "22023", (target,))


def test_tool_call_reaches_the_user_at_commit(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        u = new_user(c, "tooluser")
        c.execute("SELECT switchboard.presence_set('r1', %s, 1)", (u,))
        lst = listener(db, "switchboard_events", CONTROL)
        try:
            call = c.execute("SELECT switchboard.tool_call_send(%s, 'r1', 'ask')", (u,)).fetchone()[0]
            (note,) = notifications(lst, 2.0, stop_after=1)
            # the hint names an ephemeral row; the call itself is that row
            eph = json.loads(note.payload)["eph"]
            assert note.channel == "switchboard_events"
            assert c.execute("SELECT user_id, event, payload FROM switchboard.ephemeral_events WHERE id = %s",
                             (eph,)).fetchone() == (u, f"tool.call.{call}", {"name": "ask", "args": {}})
            c.execute("SELECT switchboard.tool_call_answer(%s, %s, '{\"ok\": 1}')", (call, u))
            (note,) = notifications(lst, 2.0, stop_after=1)
            assert (note.channel, json.loads(note.payload)) == (
                CONTROL, {"kind": "tool_result", "call_id": str(call), "replica_id": "r1"})
        finally:
            lst.close()
