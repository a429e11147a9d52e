"""Trust boundary: nothing a replica believes comes from a NOTIFY payload or a shared session.

PostgreSQL has no permissions on NOTIFY channels or advisory locks: every role
that may connect can pg_notify anything and take any advisory key. These tests
attack as such a role would — a LOGIN role with nothing but CONNECT, and a
`sql` task (switchboard_job) — with every payload format the README documents,
and check that nothing changes (docs/explanation/security.md).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from psycopg import sql
from pgtap import throws_ok

from harness import ROOT, WS, app_url_for, auth, make_user

INTRUDER = f"sb_intruder_{os.getpid()}"


@pytest.fixture
def intruder_url(pg, db: str) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A LOGIN role with nothing but the CONNECT that PUBLIC has on every database."""
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP ROLE IF EXISTS {INTRUDER}")
        c.execute(f"CREATE ROLE {INTRUDER} LOGIN")
    yield db.replace("postgres@", f"{INTRUDER}@", 1)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (INTRUDER,))
        c.execute(f"DROP ROLE IF EXISTS {INTRUDER}")


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


# -- the ticker row -------------------------------------------------------------------------------
def test_nobody_but_the_owner_can_take_the_ticker_rows(db: str, app_url: str, intruder_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as su:
        uid = su.execute("SELECT switchboard.create_user('pub', '$argon2id$x')").fetchone()[0]
    for url in (intruder_url, app_url):
        with psycopg.connect(url) as c:
            for table in ("event_ticker", "event_ticks"):
                throws_ok(c, f"SELECT 1 FROM switchboard.{table} FOR UPDATE", "42501")
                throws_ok(c, f"LOCK TABLE switchboard.{table}", "42501")
    with psycopg.connect(intruder_url) as c:
        throws_ok(c, "SELECT switchboard.event_tick()", "42501")
    with psycopg.connect(app_url) as app:
        throws_ok(app, "SELECT switchboard.run_job_sql('SELECT 1 FROM switchboard.event_ticker FOR UPDATE')", "42501")
        throws_ok(app, "SELECT switchboard.run_job_sql('SELECT switchboard.event_tick()')", "42501")
    # The old advisory key, held by a sql task's session, blocks nobody now.
    with psycopg.connect(app_url, autocommit=True) as job:
        job.execute("SELECT switchboard.run_job_sql('SELECT pg_advisory_lock(1937204836, 1)')")
        with psycopg.connect(app_url) as pub:
            pub.execute("SET lock_timeout = '2s'")
            t0 = time.monotonic()
            pub.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
            pub.commit()
            assert time.monotonic() - t0 < 2.0  # a wait would have ended in 55P03 at 2 s


def test_a_publisher_never_waits_for_another_publisher_or_the_ticker(db: str) -> None:
    """The event_order lock is gone (unused since V0009, dropped by V0014): an open
    publisher, and a ticker holding the ticker row, make no other publisher wait."""
    with psycopg.connect(db, autocommit=True) as su:
        uid = su.execute("SELECT switchboard.create_user('pub', '$argon2id$x')").fetchone()[0]
        assert su.execute("SELECT to_regclass('switchboard.event_order'), "
                          "to_regprocedure('switchboard._lock_event_order()')").fetchone() == (None, None)
    t1, t2, ticker = psycopg.connect(db), psycopg.connect(db), psycopg.connect(db)
    try:
        id1 = t1.execute("SELECT switchboard.notify_user(%s, 'first', '{}')", (uid,)).fetchone()[0]
        ticker.execute("SELECT switchboard.event_tick()")  # holds the ticker row
        t2.execute("SET lock_timeout = '100ms'")
        id2 = t2.execute("SELECT switchboard.notify_user(%s, 'second', '{}')", (uid,)).fetchone()[0]
        t2.commit()
        assert id2 > id1
        ticker.commit()
        t1.commit()
    finally:
        t1.close()
        t2.close()
        ticker.close()


# -- roles are cluster-wide -----------------------------------------------------------------
def test_a_second_database_on_the_cluster_is_refused_unless_shared_roles_is_on(empty_db: str) -> None:
    from switchboard.migrate import MigrationError, migrate

    with pytest.raises(MigrationError) as e:
        migrate(empty_db + "?options=-c%20switchboard.shared_roles%3Doff")  # overrides conftest's PGOPTIONS
    msg = str(e.value)
    assert "switchboard_app" in msg and "sb_template" in msg and "shared_roles" in msg
    with psycopg.connect(empty_db) as c:
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'switchboard'").fetchone()[0] == 0
    assert migrate(empty_db)  # PGOPTIONS='-c switchboard.shared_roles=on' (conftest)


# -- forged notifications against a real replica -------------------------------------------
def _jwt_claims(token: str) -> dict:
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def _forgeries(member: str, admin: str, member_jti: str, real_event_id: int, call_id: str,
               replica_id: str) -> list[tuple[str, str]]:
    """Every documented payload format, as an attacker would fill it in."""
    ev = "switchboard_events"
    ctl = "switchboard_control"
    return [
        (ctl, json.dumps({"kind": "user", "user_id": member, "role": "admin", "disabled": False})),
        (ctl, json.dumps({"kind": "user", "user_id": admin, "role": "admin", "disabled": True})),
        (ctl, json.dumps({"kind": "revoke", "jti": member_jti, "user_id": member})),
        (ctl, json.dumps({"kind": "member", "room": "lobby", "user_id": member, "member": False})),
        (ctl, json.dumps({"kind": "tool_result", "call_id": call_id, "replica_id": replica_id})),
        (ev, json.dumps({"id": 9000000000, "user_id": member, "room": None, "event": "forged.user",
                         "payload": {"forged": True}, "ts": 1})),
        (ev, json.dumps({"id": 9000000001, "user_id": None, "room": "lobby", "event": "forged.room",
                         "payload": {"forged": True}, "ts": 1})),
        # "truncated": the relay used to fetch that row's body and send it to the named user
        (ev, json.dumps({"id": real_event_id, "user_id": member, "room": None, "event": "forged.truncated",
                         "ts": 1, "truncated": True})),
        (ev, json.dumps({"id": None, "user_id": None, "room": "lobby", "event": "typing", "ts": 1,
                         "from": admin, "ephemeral": True, "payload": {"forged": True}})),
        (ev, json.dumps({"id": None, "user_id": member, "room": None, "event": f"tool.call.{uuid.uuid4()}",
                         "ts": 1, "ephemeral": True, "payload": {"name": "rm", "args": {"path": "/"}}})),
        (ev, json.dumps({"eph": 1})),
        (ev, json.dumps({"id": 9000000002})),
        ("switchboard_runs", ""),
    ]


def _forge_as_intruder(url: str, notes: list[tuple[str, str]]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for channel, payload in notes:
            c.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def _forge_from_sql_task(su_url: str, notes: list[tuple[str, str]], name: str) -> None:
    with psycopg.connect(su_url, autocommit=True) as c:
        lits = ", ".join(
            sql.SQL("pg_notify({}, {})").format(sql.Literal(ch), sql.Literal(p)).as_string(c) for ch, p in notes)
        task = c.execute("SELECT id FROM switchboard.create_task(%s, NULL, 'sql', %s::jsonb)",
                         (name, json.dumps({"sql": f"SELECT {lits}", "timeout_seconds": 5}))).fetchone()[0]
        c.execute("SELECT * FROM switchboard.create_run_exclusive(%s)", (task,))
        assert _wait(lambda: c.execute("SELECT status FROM switchboard.task_runs WHERE task_id = %s",
                                       (task,)).fetchone()[0] in ("succeeded", "failed"), 15)
        status, error = c.execute("SELECT status, error FROM switchboard.task_runs WHERE task_id = %s",
                                  (task,)).fetchone()
        assert status == "succeeded", error


@pytest.mark.parametrize("forger", ["connect_only_role", "sql_task"])
def test_forged_notifications_change_nothing(server_factory, db: str, intruder_url: str,  # type: ignore[no-untyped-def]
                                             forger: str) -> None:
    admin = make_user(db, "admin", role="admin")
    member = make_user(db, "mia")
    other = make_user(db, "olly")
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.add_room_member('lobby', %s)", (member,))
        c.execute("SELECT switchboard.add_room_member('lobby', %s)", (admin,))
        # someone else's private event: a forged "truncated" hint must not leak it
        secret_id = c.execute("SELECT switchboard.notify_user(%s, 'private', '{\"secret\": 42}')",
                              (other,)).fetchone()[0]
    s = server_factory()
    h_admin = auth(s.login("admin"))
    tok_member = s.login("mia")
    h_member = auth(tok_member)
    ws = s.ws(tok_member)
    assert ws.join("lobby")["event"] == "joined"
    replica_id = httpx.get(s.base + "/me", headers=h_member).json()["replica"]
    assert httpx.post(s.base + "/events", headers=h_member,
                      json={"user_id": member, "event": "x", "payload": {}}).status_code == 403

    # A tool call in flight: a forged tool_result must not end it.
    result: dict = {}

    def call() -> None:
        result["r"] = httpx.post(s.base + "/tools/call", headers=h_admin, timeout=30,
                                 json={"user_id": member, "name": "echo", "args": {}, "timeout_ms": 30000})

    caller = threading.Thread(target=call)
    caller.start()
    # 15 s, not the milliseconds it takes: CI runs three lanes on two cores (the call's own
    # timeout is 30 s, so it is still waiting when the forgeries arrive).
    f = ws.recv_until(lambda f: f["event"].startswith("tool.call."), timeout=15)
    call_id = f["event"].split(".", 2)[2]

    notes = _forgeries(member, admin, _jwt_claims(tok_member)["jti"], secret_id, call_id, replica_id)
    with psycopg.connect(db, autocommit=True) as c:
        runs_before = c.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id IS NULL").fetchone()[0]
    if forger == "sql_task":
        _forge_from_sql_task(db, notes, "forger")
    else:
        _forge_as_intruder(intruder_url, notes)

    frames = ws.drain(quiet=1.0)
    assert frames == [], frames    # not even a role change: forged hints deliver nothing
    # no role, no 401, no revocation
    assert httpx.post(s.base + "/events", headers=h_member,
                      json={"user_id": member, "event": "x", "payload": {}}).status_code == 403
    assert httpx.get(s.base + "/me", headers=h_member).status_code == 200
    assert httpx.get(s.base + "/me", headers=h_admin).status_code == 200
    # no answer: the caller is still waiting, and the real answer still gets through
    assert caller.is_alive(), result.get("r") and result["r"].text
    ws.send({"action": "publish", "event": f"tool.result.{call_id}", "payload": {"real": True}})
    caller.join(30)
    assert result["r"].status_code == 200 and result["r"].json() == {"result": {"real": True}}
    # cursor intact, membership intact: real events published afterwards arrive
    r = httpx.post(s.base + "/events", headers=h_admin, json={"user_id": member, "event": "real.user", "payload": {}})
    assert r.status_code == 202
    got = ws.recv_until(lambda f: f["event"] == "real.user", timeout=5)
    assert got["id"] == r.json()["id"] and got["id"] < 9000000000
    r = httpx.post(s.base + "/events", headers=h_admin, json={"room": "lobby", "event": "real.room", "payload": {}})
    assert ws.recv_until(lambda f: f["event"] == "real.room", timeout=5)["id"] == r.json()["id"]
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id IS NULL").fetchone()[0] == runs_before
        assert c.execute("SELECT switchboard.is_room_member('lobby', %s)", (member,)).fetchone()[0] is True
    ws.close()


def test_typing_reaches_the_room_but_cannot_be_forged(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                      intruder_url: str) -> None:
    a = make_user(db, "amy")
    make_user(db, "ben")
    with psycopg.connect(db, autocommit=True) as c:
        for name in ("amy", "ben"):
            c.execute("SELECT switchboard.add_room_member('team', u.id) FROM switchboard.users u "
                      "WHERE u.username = %s", (name,))
    s = server_factory()
    wa, wb = s.ws(s.login("amy")), s.ws(s.login("ben"))
    assert wa.join("team")["event"] == "joined" and wb.join("team")["event"] == "joined"
    _forge_as_intruder(intruder_url, [("switchboard_events", json.dumps(
        {"id": None, "user_id": None, "room": "team", "event": "typing", "ts": 1, "from": a,
         "ephemeral": True, "payload": {"forged": True}}))])
    assert wb.drain(quiet=0.5) == []
    wa.send({"action": "publish", "event": "typing", "room": "team", "payload": {"on": True}})
    f = wb.recv_until(lambda f: f["event"] == "typing", timeout=5)
    assert f["from"] == a and f["payload"] == {"on": True} and f["room"] == "team" and f["id"] is None


# -- the sql handler leaves nothing behind -----------------------------------------------
def test_sql_tasks_leave_no_session_state_and_need_a_timeout(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    uid = make_user(db, "una")
    s = server_factory(env={"SWITCHBOARD_POOL_SIZE": "3"})
    h = auth(s.login("admin"))

    def run(name: str, args: dict) -> dict:
        tid = httpx.post(s.base + "/tasks", headers=h, json={"name": name, "handler": "sql", "max_attempts": 1,
                                                             "args": args}).json()["id"]
        assert httpx.post(f"{s.base}/tasks/{tid}/trigger", headers=h).status_code == 202
        with psycopg.connect(db, autocommit=True) as c:
            assert _wait(lambda: c.execute("SELECT status FROM switchboard.task_runs WHERE task_id = %s "
                                           "ORDER BY id DESC LIMIT 1", (tid,)).fetchone()[0]
                         in ("succeeded", "failed"), 15)
            return dict(zip(("status", "error"), c.execute(
                "SELECT status, error FROM switchboard.task_runs WHERE task_id = %s ORDER BY id DESC LIMIT 1",
                (tid,)).fetchone()))

    poison = [
        "SELECT set_config('default_transaction_read_only', 'on', false)",
        "SELECT set_config('statement_timeout', '1', false)",
        "SELECT pg_advisory_lock(1937204836, 1)",
        "LISTEN switchboard_events",
        "CREATE TEMP TABLE leftover (n int)",
    ]
    for i, stmt in enumerate(poison):
        assert run(f"poison{i}", {"sql": stmt, "timeout_seconds": 5})["status"] == "succeeded", stmt
    # every pooled connection behaves normally afterwards: writes succeed, no stray locks
    for i in range(8):
        r = httpx.post(s.base + "/events", headers=h, json={"user_id": uid, "event": "after", "payload": {"i": i}})
        assert r.status_code == 202, r.text
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SET lock_timeout = '2s'")
        c.execute("SELECT switchboard.notify_user(%s, 'su', '{}')", (uid,))
        assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                         "(SELECT oid FROM pg_database WHERE datname = current_database())").fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND query ILIKE 'LISTEN switchboard_events%%' AND application_name <> "
                         "'switchboard-listen'").fetchone()[0] == 0
    # no timeout means no timeout: refused unless the operator allowed it
    r = run("forever", {"sql": "SELECT 1", "timeout_seconds": 0})
    assert r["status"] == "failed" and "timeout_seconds" in r["error"]


# -- least privilege --------------------------------------------------------------------------
def test_members_see_no_task_definitions_and_role_or_password_changes_revoke_tokens(  # type: ignore[no-untyped-def]
        server_factory, db: str) -> None:
    make_user(db, "admin", role="admin")
    uid = make_user(db, "max")
    s = server_factory()
    h_admin = auth(s.login("admin"))
    r = httpx.post(s.base + "/tasks", headers=h_admin,
                   json={"name": "secret", "handler": "sql", "args": {"sql": "SELECT 'hunter2'"}})
    tid = r.json()["id"]
    h = auth(s.login("max"))
    for path in ("/tasks", f"/tasks/{tid}", f"/tasks/{tid}/runs"):
        r = httpx.get(s.base + path, headers=h)
        assert r.status_code == 403 and "hunter2" not in r.text and r.json()["title"], (path, r.text)
        assert httpx.get(s.base + path, headers=h_admin).status_code == 200
    ready = httpx.get(s.base + "/healthz/ready")
    assert ready.status_code == 200 and ready.json().get("reasons") == []
    # a role change revokes existing tokens on every replica
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.set_user_role(%s, 'admin')", (uid,))
    assert _wait(lambda: httpx.get(s.base + "/me", headers=h).status_code == 401, 10)
    h = auth(s.login("max"))
    assert httpx.get(s.base + "/tasks", headers=h).status_code == 200
    # and so does a password change
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.set_user_password_hash(%s, password_hash) FROM switchboard.users "
                  "WHERE id = %s", (uid, uid))
    assert _wait(lambda: httpx.get(s.base + "/me", headers=h).status_code == 401, 10)


def _close_code(ws: WS, timeout: float) -> int | None:
    """Read until the server closes the socket; its close code (None: still open at timeout)."""
    from websockets.exceptions import ConnectionClosed
    deadline = time.time() + timeout
    try:
        while (left := deadline - time.time()) > 0:
            ws.conn.recv(timeout=left)
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else -1
    return None


def test_a_password_change_closes_the_users_sockets_on_every_replica(  # type: ignore[no-untyped-def]
        server_factory, db: str, intruder_url: str) -> None:
    uid = make_user(db, "pia")
    s1, s2 = server_factory(), server_factory()

    def sockets() -> tuple[WS, WS]:
        a, b = s1.ws(s1.login("pia")), s2.ws(s2.login("pia"))
        for w in (a, b):
            assert w.hello["payload"]["user_id"] == uid
        return a, b

    def still_open(a: WS, b: WS, tag: str) -> None:
        with psycopg.connect(db, autocommit=True) as c:
            eid = c.execute("SELECT switchboard.notify_user(%s, %s, '{}')", (uid, tag)).fetchone()[0]
        for w in (a, b):
            assert w.recv_until(lambda f: f["event"] == tag, timeout=5)["id"] == eid

    ws1, ws2 = sockets()
    # Forged announcements (a CONNECT-only role, any payload) close nothing: the replicas
    # re-read the user and find its epoch unchanged.
    _forge_as_intruder(intruder_url, [
        ("switchboard_control", json.dumps({"kind": "user", "user_id": uid, "disabled": True})),
        ("switchboard_control", json.dumps({"kind": "user", "user_id": uid, "token_epoch": 1 << 20})),
        ("switchboard_control", json.dumps({"kind": "password", "user_id": uid})),
    ])
    assert _close_code(ws1, 1.5) is None and _close_code(ws2, 0.1) is None
    still_open(ws1, ws2, "after.forgery")
    # A role change ends the user's sessions too (issue 19): both sockets close with 1008.
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.set_user_role(%s, 'admin')", (uid,))
    assert _close_code(ws1, 5) == 1008
    assert _close_code(ws2, 5) == 1008
    ws1, ws2 = sockets()
    still_open(ws1, ws2, "after.role")

    # The password change, in SQL: both sockets close with 1008 within a second or so.
    with psycopg.connect(db, autocommit=True) as c:
        t0 = time.monotonic()
        c.execute("SELECT switchboard.set_user_password_hash(%s, password_hash) FROM switchboard.users "
                  "WHERE id = %s", (uid, uid))
    assert _close_code(ws1, 5) == 1008
    assert _close_code(ws2, 5) == 1008
    elapsed = time.monotonic() - t0
    print(f"password change -> both sockets closed in {elapsed:.3f} s")
    assert elapsed < 5

    # ... and through `switchboard user set-password` (the application login, as documented).
    ws1, ws2 = sockets()
    env = {**os.environ, "DATABASE_URL": app_url_for(db), "PYTHONPATH": str(ROOT / "server")}
    out = subprocess.run([sys.executable, "-m", "switchboard.cli", "user", "set-password", "pia",
                          "--password-stdin"], input="pw-" + "t" * 12 + "\n", env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "password of pia changed" in out.stdout
    t0 = time.monotonic()  # committed: both close within the same bound as the SQL path
    assert _close_code(ws1, 5) == 1008
    assert _close_code(ws2, 5) == 1008
    assert time.monotonic() - t0 < 5
    # the old password is gone, the new one logs in and its socket stays open
    assert httpx.post(s1.base + "/auth/login", json={"username": "pia", "password": "pw-" + "s" * 12}
                      ).status_code == 401
    tok = s2.login("pia", "pw-" + "t" * 12)
    ws3 = s2.ws(tok)
    assert _close_code(ws3, 1.5) is None
    ws3.close()


# -- login throttling -------------------------------------------------------------------------
def test_login_guesses_are_throttled_per_username_before_verifying_but_known_devices_get_in(  # type: ignore[no-untyped-def]
        server_factory, db: str) -> None:
    make_user(db, "vic")
    s = server_factory(env={"SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1/32", "SWITCHBOARD_LOGIN_IP_BURST": "3",
                            "SWITCHBOARD_LOGIN_IP_RATE": "0.01", "SWITCHBOARD_LOGIN_USER_BURST": "3",
                            "SWITCHBOARD_LOGIN_USER_RATE": "0.01"})
    pw = "pw-" + "s" * 12

    def attempt(user: str, password: str, ip: str, cookies: httpx.Cookies | None = None) -> int:
        return httpx.post(s.base + "/auth/login", json={"username": user, "password": password},
                          headers={"X-Forwarded-For": ip}, cookies=cookies, timeout=30).status_code

    s.login("vic")  # the real user, from her laptop: it keeps a device cookie
    # a guesser spread over many addresses: the username bucket (3, one spent above) runs dry
    assert [attempt("vic", f"guess{i}", f"203.0.113.{i}") for i in range(4)] == [401, 401, 429, 429]
    # now even the right password from an unknown device is refused before it is checked
    assert attempt("vic", pw, "203.0.113.99") == 429
    # a forged device cookie is no key
    forged = httpx.Cookies({name: "eyJ1IjoidmljIn0.AAAA" for name in s.cookies.keys()})
    assert attempt("vic", pw, "203.0.113.98", forged) == 429
    # the laptop is exempt: the attacker cannot lock the real user out
    s.login("vic")
    # IPv6 clients share one bucket per /64 (3 attempts), another /64 has its own
    v6 = [attempt(f"nobody{i}", "x", f"2001:db8:0:7::{i + 1:x}") for i in range(4)]
    assert v6 == [401, 401, 401, 429]
    assert attempt("nobody9", "x", "2001:db8:0:8::1") == 401


def test_tool_call_collect_takes_only_answered_calls_and_ephemeral_reads_are_bounded(
        conn: psycopg.Connection) -> None:
    u = conn.execute("SELECT switchboard.create_user('tc_user', '$argon2id$x')").fetchone()[0]
    conn.execute("SELECT switchboard.presence_set('r1', %s, 1)", (u,))
    call = conn.execute("SELECT switchboard.tool_call_send(%s, 'r1', 'ask', '{\"q\": 1}')", (u,)).fetchone()[0]
    # the call travels as an ephemeral row, read by id; never in the events stream
    ((eph_id, event, payload),) = conn.execute(
        "SELECT id, event, payload FROM switchboard.ephemeral_events WHERE user_id = %s", (u,)).fetchall()
    assert (event, payload) == (f"tool.call.{call}", {"name": "ask", "args": {"q": 1}})
    head = conn.execute("SELECT last_tick FROM switchboard.event_window()").fetchone()[0]
    read = ("SELECT kind, event FROM switchboard.relay_read_v3(%s, 9223372036854775807, ARRAY[%s::bigint]) "
            "WHERE kind <> 'window'")
    assert conn.execute(read, (head, eph_id)).fetchall() == [("ephemeral", f"tool.call.{call}")]
    conn.execute("UPDATE switchboard.ephemeral_events SET created_at = now() - interval '31 seconds' "
                 "WHERE id = %s", (eph_id,))
    assert conn.execute(read, (head, eph_id)).fetchall() == []  # a replayed old id delivers nothing
    # a wake-up that was not an answer changes nothing
    assert conn.execute("SELECT * FROM switchboard.tool_call_collect(%s)", (call,)).fetchall() == []
    assert conn.execute("SELECT switchboard.tool_call_answer(%s, %s, '{\"a\": 2}')", (call, u)).fetchone()[0]
    assert conn.execute("SELECT * FROM switchboard.tool_call_collect(%s)", (call,)).fetchall() == [(True, {"a": 2})]
    assert conn.execute("SELECT * FROM switchboard.tool_call_collect(%s, true)", (call,)).fetchall() == []
    late = conn.execute("SELECT switchboard.tool_call_send(%s, 'r1', 'slow')", (u,)).fetchone()[0]
    assert conn.execute("SELECT * FROM switchboard.tool_call_collect(%s, true)", (late,)).fetchall() == [(False, None)]
    throws_ok(conn, "SELECT * FROM switchboard.relay_read_v3(-1, 0)", "22023")
    throws_ok(conn, "SELECT * FROM switchboard.relay_read_v3(0, 0, '{}', 0)", "22023")
