"""Faults against real server processes: Postgres down and back, SIGTERM mid-run,
socket abuse, logout/disable, the tool bridge, the CLI's refusals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import psycopg
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from harness import APP_LOGIN, ROOT, Server, auth, make_user


@pytest.fixture
def own_pg():  # type: ignore[no-untyped-def]
    """A dedicated cluster this test may stop and start (the session's stays up)."""
    from switchboard.migrate import migrate
    from switchboard.pgtest import ThrowawayPostgres

    pg = ThrowawayPostgres()
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("CREATE DATABASE sb")
    migrate(pg.url("sb"))
    yield pg
    pg.stop()


def _ready(s: Server) -> int:
    try:
        return httpx.get(s.base + "/healthz/ready", timeout=5).status_code
    except httpx.HTTPError:
        return -1


def _wait(pred, timeout: float, step: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def test_postgres_down_and_back(own_pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = own_pg.url("sb")
    make_user(url, "admin", role="admin")
    s = Server(url, log_dir=tmp_path, env={"SWITCHBOARD_POOL_TIMEOUT": "2"}).start()
    try:
        tok = s.login("admin")
        ws = s.ws(tok)
        uid = ws.hello["payload"]["user_id"]
        before = httpx.post(s.base + "/events", headers=auth(tok),
                            json={"user_id": uid, "event": "before", "payload": {}}).json()["id"]
        assert ws.recv_until(lambda f: f.get("id") == before)["event"] == "before"

        own_pg.stop_server()
        assert _wait(lambda: _ready(s) == 503, 10), "readiness did not go 503"
        body = httpx.get(s.base + "/healthz/ready", timeout=5).json()
        assert body["reasons"], body
        # login: the limiter fails open within its bound (the login itself then fails: no DB)
        t0 = time.time()
        r = httpx.post(s.base + "/auth/login", json={"username": "admin", "password": "x"}, timeout=30)
        assert r.status_code == 503, r.text  # not 429, not 500: the database is unavailable
        assert r.json()["title"]
        assert time.time() - t0 < 10
        metrics = httpx.get(s.base + "/metrics").text
        assert 'switchboard_ratelimit_fail_open_total{policy="login-ip"} 1.0' in metrics, metrics
        assert s.proc.poll() is None and _ready(s) == 503

        own_pg.start_server()
        assert _wait(lambda: _ready(s) == 200, 30), s.log()
        after = httpx.post(s.base + "/events", headers=auth(tok),
                           json={"user_id": uid, "event": "after", "payload": {}}).json()["id"]
        got = ws.recv_until(lambda f: f.get("id") == after, timeout=10)
        assert got["event"] == "after"
    finally:
        assert s.terminate() == 0


def test_sigterm_hands_a_running_run_back(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    env = {"SWITCHBOARD_SHUTDOWN_GRACE_SECONDS": "1", "SWITCHBOARD_LEASE_SECONDS": "60"}
    s1 = server_factory(env=env)
    h = auth(s1.login("admin"))
    tid = httpx.post(s1.base + "/tasks", headers=h,
                     json={"name": "long", "handler": "sleep", "args": {"seconds": 30}}).json()["id"]
    assert httpx.post(f"{s1.base}/tasks/{tid}/trigger", headers=h).status_code == 202
    with psycopg.connect(db, autocommit=True) as c:
        assert _wait(lambda: c.execute("SELECT status FROM switchboard.task_runs WHERE task_id = %s",
                                       (tid,)).fetchone()[0] == "running", 15)
        run_id, worker = c.execute("SELECT id, worker FROM switchboard.task_runs WHERE task_id = %s",
                                   (tid,)).fetchone()
        t0 = time.time()
        assert s1.terminate() == 0
        assert time.time() - t0 < 10
        status, attempt, w = c.execute("SELECT status, attempt, worker FROM switchboard.task_runs WHERE id = %s",
                                       (run_id,)).fetchone()
        # handed back: queued again (same attempt), lease released, no worker
        assert (status, attempt, w) == ("queued", 1, None)
        # another replica takes it at once, not after the 60 s lease
        s2 = server_factory(env=env)

        def rerun_elsewhere() -> bool:
            st, w2 = c.execute("SELECT status, worker FROM switchboard.task_runs WHERE id = %s",
                               (run_id,)).fetchone()
            return st == "running" and w2 not in (None, worker)

        assert _wait(rerun_elsewhere, 10)
        assert s2.proc.poll() is None


def test_socket_abuse_gets_errors_or_close_codes(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "alice")
    s = server_factory(env={"SWITCHBOARD_WS_MAX_FRAME_BYTES": "1024", "SWITCHBOARD_WS_MAX_SOCKETS_PER_USER": "3"})
    tok = s.login("alice")
    ws = s.ws(tok)
    ws.conn.send("{not json")
    assert ws.recv()["payload"]["code"] == "bad_json"
    ws.send({"action": "dance"})
    assert ws.recv()["payload"]["code"] == "unknown_action"
    ws.send({"action": "publish", "event": "admin.stuff", "payload": {}})
    assert ws.recv()["payload"]["code"] == "forbidden_event"
    ws.send({"action": "publish", "event": "typing", "room": "nope", "payload": {}})
    assert ws.recv()["payload"]["code"] == "forbidden"
    ws.send({"action": "resume", "after": "x"})
    assert ws.recv()["payload"]["code"] == "bad_resume"
    ws.send({"action": "ping"})
    assert ws.recv()["event"] == "pong"
    ws.conn.send("x" * 2000)  # oversized
    with pytest.raises(ConnectionClosed) as e:
        ws.recv(timeout=5)
    assert e.value.rcvd.code == 1009
    ws2 = s.ws(tok)
    ws2.conn.send(b"\x00\x01")  # binary
    with pytest.raises(ConnectionClosed) as e:
        ws2.recv(timeout=5)
    assert e.value.rcvd.code == 1003
    # per-user socket cap (3 on this replica)
    keep = [s.ws(tok) for _ in range(3)]
    with pytest.raises(InvalidStatus):
        s.ws(tok)
    for k in keep:
        k.close()
    # the relay survived all of it
    assert httpx.get(s.base + "/healthz/ready").status_code == 200
    ws3 = s.ws(tok)
    ws3.send({"action": "ping"})
    assert ws3.recv()["event"] == "pong"


def _raw_ws(host: str, port: int, ticket: str) -> "socket.socket":
    """A WebSocket client that completes the handshake and then never reads."""
    import base64

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws?ticket={ticket} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_slow_consumer_is_closed_1013(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    s = server_factory(env={"SWITCHBOARD_WS_QUEUE_SIZE": "5"})
    tok = s.login("admin")
    uid = str(httpx.get(s.base + "/me", headers=auth(tok)).json()["user_id"])
    sock = _raw_ws("127.0.0.1", s.port, s.ticket(tok))  # handshake done, never reads again
    try:
        with psycopg.connect(db, autocommit=True) as c:
            big = json.dumps({"blob": "z" * 7000})
            c.execute("SELECT count(switchboard.notify_user(%s, 'flood', %s::jsonb)) FROM generate_series(1, 2000)",
                      (uid, big))

        def closed_1013() -> bool:
            return 'switchboard_ws_closed_total{code="1013"} 1.0' in httpx.get(s.base + "/metrics").text

        assert _wait(closed_1013, 20), httpx.get(s.base + "/metrics").text
        assert "send queue full" in s.log()
        # the replica is fine, and other sockets still work
        assert httpx.get(s.base + "/healthz/ready").status_code == 200
        ws = s.ws(tok)
        ws.send({"action": "ping"})
        assert ws.recv_until(lambda f: f["event"] == "pong")["event"] == "pong"
    finally:
        sock.close()


def test_logout_disable_and_role_change(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    make_user(db, "dave")
    s = server_factory()
    tok = s.login("dave")
    assert httpx.get(s.base + "/me", headers=auth(tok)).status_code == 200
    assert httpx.post(s.base + "/auth/logout", headers=auth(tok)).status_code == 204
    assert httpx.get(s.base + "/me", headers=auth(tok)).status_code == 401
    tok2 = s.login("dave")
    ws = s.ws(tok2)
    assert httpx.post(s.base + "/tasks", headers=auth(tok2), json={"name": "n", "handler": "noop"}).status_code == 403
    subprocess.run([sys.executable, "-m", "switchboard.cli", "user", "set-role", "dave", "admin"], check=True,
                   env={**os.environ, "DATABASE_URL": db, "PYTHONPATH": str(ROOT / "server")})
    # a role change revokes existing tokens (token epoch) and ends the sessions: the socket closes
    assert _wait(lambda: httpx.get(s.base + "/me", headers=auth(tok2)).status_code == 401, 10)
    with pytest.raises(ConnectionClosed) as e:
        while True:
            ws.recv(timeout=3)
    assert (e.value.rcvd.code, e.value.rcvd.reason) == (1008, "session revoked")
    tok2 = s.login("dave")
    ws = s.ws(tok2)
    assert httpx.post(s.base + "/tasks", headers=auth(tok2), json={"name": "n", "handler": "noop"}).status_code == 201
    subprocess.run([sys.executable, "-m", "switchboard.cli", "user", "disable", "dave"], check=True,
                   env={**os.environ, "DATABASE_URL": db, "PYTHONPATH": str(ROOT / "server")})
    t0 = time.time()  # the CLI has committed: the close is ms away (a second is the promise)
    with pytest.raises(ConnectionClosed) as e:
        while True:
            ws.recv(timeout=5)
    assert e.value.rcvd.code == 1008
    assert time.time() - t0 < 3
    assert httpx.get(s.base + "/me", headers=auth(tok2)).status_code == 401


def test_tool_bridge_on_one_replica(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    uid = make_user(db, "erin")
    other = make_user(db, "frank")
    s = server_factory()
    h = auth(s.login("admin"))
    assert httpx.post(s.base + "/tools/call", headers=h, json={"user_id": uid, "name": "echo"}).status_code == 404
    ws = s.ws(s.login("erin"))
    wf = s.ws(s.login("frank"))
    result: dict = {}

    def call() -> None:
        result["r"] = httpx.post(s.base + "/tools/call", headers=h, timeout=30,
                                 json={"user_id": uid, "name": "echo", "args": {"x": 1}, "timeout_ms": 5000})

    t = threading.Thread(target=call)
    t.start()
    try:
        f = ws.recv_until(lambda f: f["event"].startswith("tool.call."))
    except TimeoutError:  # say what the call got (404: erin offline; 504: the frame was lost)
        t.join(30)
        r = result.get("r")
        raise AssertionError((r.status_code, r.text) if r is not None else None, s.log()) from None
    call_id = f["event"].split(".", 2)[2]
    assert f["payload"] == {"name": "echo", "args": {"x": 1}}
    # frank may not answer erin's call
    wf.send({"action": "publish", "event": f"tool.result.{call_id}", "payload": {"evil": True}})
    assert wf.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "unknown_call"
    ws.send({"action": "publish", "event": f"tool.result.{call_id}", "payload": {"echo": {"x": 1}}})
    t.join(30)
    assert result["r"].status_code == 200 and result["r"].json() == {"result": {"echo": {"x": 1}}}
    assert other
    r = httpx.post(s.base + "/tools/call", headers=h, timeout=30,
                   json={"user_id": uid, "name": "echo", "timeout_ms": 300})
    assert r.status_code == 504


def test_a_tool_call_sent_while_the_relay_is_reconnecting_still_reaches_the_browser(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """tool.call.<id> is an ephemeral event: no position, so a relay whose LISTEN
    connection was down when its NOTIFY went out never heard of it, and the call waited
    out its timeout (504). After a reconnect the relay asks for the ephemeral ids it
    missed (relay_ephemeral_missed, V0019) and delivers them from their rows -- and
    does not deliver again one it had already delivered before the loss."""
    make_user(db, "admin", role="admin")
    uid = make_user(db, "erin")
    s = server_factory()
    h = auth(s.login("admin"))
    replica = httpx.get(s.base + "/me", headers=h, timeout=10).json()["replica"]
    ws = s.ws(s.login("erin"))
    send = "SELECT switchboard.tool_call_send(%s, %s, 'echo', %s::jsonb, '60 seconds')"
    with psycopg.connect(db, autocommit=True) as c:
        before = c.execute(send, (uid, replica, '{"n": 1}')).fetchone()[0]
        assert ws.recv_until(lambda f: f["event"] == f"tool.call.{before}")["payload"]["args"] == {"n": 1}
        # The relay cannot come back until we say so (its new logins are refused; the
        # request pool keeps its open connections), then its LISTEN and reader sessions
        # end (the relay closes the other when one dies, so not every terminate finds its pid).
        c.execute(f"ALTER ROLE {APP_LOGIN} NOLOGIN")
        try:
            relay = ("FROM pg_stat_activity WHERE datname = current_database() "
                     "AND application_name IN ('switchboard-listen', 'switchboard-relay-read')")
            c.execute(f"SELECT pg_terminate_backend(pid, 10000) {relay}")
            assert _wait(lambda: c.execute(f"SELECT count(*) {relay}").fetchone()[0] == 0, 10)
            missed = c.execute(send, (uid, replica, '{"n": 2}')).fetchone()[0]   # nobody hears it
            time.sleep(0.5)
        finally:
            c.execute(f"ALTER ROLE {APP_LOGIN} LOGIN")
        f = ws.recv_until(lambda f: f["event"].startswith("tool.call."), timeout=30)
        assert f["event"] == f"tool.call.{missed}" and f["payload"] == {"name": "echo", "args": {"n": 2}}, f
        # erin answers it like any call; the waiting replica's collect finds the answer
        ws.send({"action": "publish", "event": f"tool.result.{missed}", "payload": {"ok": True}})
        assert _wait(lambda: c.execute("SELECT answered FROM switchboard.tool_calls WHERE id = %s",
                                       (missed,)).fetchone()[0], 10)
        # ... and the call delivered before the loss was not delivered a second time
        assert [x for x in ws.drain(quiet=1.5) if x["event"].startswith("tool.call.")] == []


def test_cli_missing_settings_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "SWITCHBOARD_"))}
    env["PYTHONPATH"] = str(ROOT / "server")
    for args in (["serve"], ["migrate"], ["user", "disable", "x"]):
        p = subprocess.run([sys.executable, "-m", "switchboard.cli", *args], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "DATABASE_URL" in lines[0], p.stderr
    env["DATABASE_URL"] = "postgresql://u@127.0.0.1:1/x"
    p = subprocess.run([sys.executable, "-m", "switchboard.cli", "serve"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "SWITCHBOARD_JWT_SECRET" in p.stderr and "Traceback" not in p.stderr


def test_rate_limiter_fails_open_within_its_bound(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """A rate_check that hangs (its bucket row is locked) must not hold login hostage:
    after SWITCHBOARD_RATELIMIT_TIMEOUT the login proceeds, and the fail-open is counted."""
    make_user(db, "gina")
    s = server_factory(env={"SWITCHBOARD_RATELIMIT_TIMEOUT": "0.3"})
    s.login("gina")  # creates the bucket row for this client IP
    with psycopg.connect(db) as locker:
        locker.execute("SELECT 1 FROM switchboard.rate_limits WHERE key = 'login-ip:127.0.0.1' FOR UPDATE")
        t0 = time.time()
        r = httpx.post(s.base + "/auth/login", json={"username": "gina", "password": "pw-" + "s" * 12},
                       timeout=30)
        elapsed = time.time() - t0
        assert r.status_code == 200, r.text
        assert elapsed < 8, elapsed  # the bound (0.3 s) plus argon2, nowhere near the pool's wait
        locker.rollback()
    m = httpx.get(s.base + "/metrics").text
    assert 'switchboard_ratelimit_fail_open_total{policy="login-ip"} 1.0' in m
    # the limiter works again once the lock is gone
    r = httpx.post(s.base + "/auth/login", json={"username": "gina", "password": "pw-" + "s" * 12})
    assert r.status_code == 200 and "RateLimit" in r.headers
