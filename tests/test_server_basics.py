"""The server against real processes on loopback: auth, tickets, delivery, resume."""

from __future__ import annotations

import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from harness import WS, auth, events_of, make_user


@pytest.fixture
def one(server_factory, db):  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    make_user(db, "alice")
    make_user(db, "bob")
    return server_factory()


def test_login_ticket_websocket_and_refusals(one) -> None:  # type: ignore[no-untyped-def]
    tok = one.login("alice")
    r = httpx.post(one.base + "/auth/login", json={"username": "alice", "password": "wrong"})
    assert r.status_code == 401 and r.json()["title"]
    ws = one.ws(tok)
    assert ws.hello["payload"]["username"] == "alice"
    ws.close()
    # bad ticket, reused ticket, expired ticket: refused before accept (HTTP 403)
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as e:
        connect(f"{one.ws_base}/ws?ticket=deadbeef", open_timeout=5)
    assert e.value.response.status_code == 403
    t = one.ticket(tok)
    WS(connect(f"{one.ws_base}/ws?ticket={t}", open_timeout=5)).close()
    with pytest.raises(InvalidStatus):
        connect(f"{one.ws_base}/ws?ticket={t}", open_timeout=5)
    import psycopg

    t2 = one.ticket(tok)
    with psycopg.connect(one.db_url.replace("sb_app_login@", "postgres@"), autocommit=True) as c:
        c.execute("UPDATE switchboard.tickets SET expires_at = now() - interval '1 second'")
    with pytest.raises(InvalidStatus):
        connect(f"{one.ws_base}/ws?ticket={t2}", open_timeout=5)
    # no ticket ever reaches the log (uvicorn logs handshakes with their query string)
    log = one.log()
    assert "ticket=[redacted]" in log
    assert t not in log and t2 not in log


def test_targeted_and_room_delivery(one, db) -> None:  # type: ignore[no-untyped-def]
    admin = one.login("admin")
    a, b = one.login("alice"), one.login("bob")
    a1, a2, b1 = one.ws(a), one.ws(a), one.ws(b)
    alice_id = a1.hello["payload"]["user_id"]
    bob_id = b1.hello["payload"]["user_id"]
    h = auth(admin)
    assert httpx.put(f"{one.base}/rooms/general/members/{alice_id}", headers=h).status_code == 204
    assert a1.join("general")["event"] == "joined"
    assert b1.join("general")["event"] == "error"  # bob is not a member
    r = httpx.post(one.base + "/events", headers=h, json={"user_id": alice_id, "event": "hi", "payload": {"n": 1}})
    assert r.status_code == 202
    eid = r.json()["id"]
    for ws in (a1, a2):
        f = ws.recv_until(lambda f: f.get("id") == eid)
        assert f["event"] == "hi" and f["payload"] == {"n": 1} and f["room"] is None
    r = httpx.post(one.base + "/events", headers=h, json={"room": "general", "event": "room.msg", "payload": {}})
    rid = r.json()["id"]
    f = a1.recv_until(lambda f: f.get("id") == rid)
    assert f["room"] == "general"
    # a2 did not join the room; bob is not a member: neither gets room.msg, bob gets nothing at all
    assert [f for f in a2.drain() if f.get("id") == rid] == []
    assert events_of(b1.drain()) == []
    assert bob_id != alice_id


def test_resume_returns_exactly_the_missed_events(one) -> None:  # type: ignore[no-untyped-def]
    admin, a = one.login("admin"), one.login("alice")
    h = auth(admin)
    ws = one.ws(a)
    uid = ws.hello["payload"]["user_id"]
    first = httpx.post(one.base + "/events", headers=h, json={"user_id": uid, "event": "e", "payload": {"n": 0}})
    last_seen = ws.recv_until(lambda f: f.get("id") is not None)["id"]
    assert last_seen == first.json()["id"]
    ws.close()
    missed = [httpx.post(one.base + "/events", headers=h,
                         json={"user_id": uid, "event": "e", "payload": {"n": i}}).json()["id"] for i in range(1, 6)]
    ws2 = one.ws(a)
    ws2.send({"action": "resume", "after": last_seen})
    # and one live event while resuming
    live = httpx.post(one.base + "/events", headers=h, json={"user_id": uid, "event": "e", "payload": {"n": 6}})
    frames = ws2.drain(0.8)
    ids = [f["id"] for f in events_of(frames)]
    assert ids == missed + [live.json()["id"]], frames
    assert any(f["event"] == "resumed" for f in frames)


def test_login_rate_limit_exact_burst_and_untrusted_xff(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "carol")
    s = server_factory(env={"SWITCHBOARD_LOGIN_IP_BURST": "4", "SWITCHBOARD_LOGIN_IP_RATE": "0.01"})
    codes = []
    for i in range(7):
        # a spoofed X-Forwarded-For from an untrusted peer must not change the key
        r = httpx.post(s.base + "/auth/login", json={"username": "carol", "password": "nope"},
                       headers={"X-Forwarded-For": f"10.9.9.{i}"})
        codes.append(r.status_code)
        if r.status_code == 429:
            last = r
    assert codes == [401] * 4 + [429] * 3
    assert int(last.headers["Retry-After"]) >= 1
    assert 'q=4' in last.headers["RateLimit-Policy"]
    assert "r=0" in last.headers["RateLimit"]
    assert last.json()["title"] == "Too Many Requests"


def test_triggered_run_starts_fast_and_failures_are_recorded(one) -> None:  # type: ignore[no-untyped-def]
    h = auth(one.login("admin"))
    t = httpx.post(one.base + "/tasks", headers=h, json={"name": "boom", "handler": "fail",
                                                         "args": {"message": "kaput"}, "max_attempts": 1})
    assert t.status_code == 201, t.text
    tid = t.json()["id"]
    t0 = time.time()
    r = httpx.post(f"{one.base}/tasks/{tid}/trigger", headers=h)
    assert r.status_code == 202
    while time.time() - t0 < 10:
        runs = httpx.get(f"{one.base}/tasks/{tid}/runs", headers=h).json()["runs"]
        if runs and runs[0]["status"] == "failed":
            break
        time.sleep(0.02)
    assert runs[0]["status"] == "failed" and "kaput" in runs[0]["error"]
    assert time.time() - t0 < 5  # promptly (ms on a quiet box); generous for a loaded CI box
    # a second trigger while one is active -> 409 with the active run
    s = httpx.post(one.base + "/tasks", headers=h, json={"name": "slow", "handler": "sleep", "args": {"seconds": 2}})
    sid = s.json()["id"]
    assert httpx.post(f"{one.base}/tasks/{sid}/trigger", headers=h).status_code == 202
    r2 = httpx.post(f"{one.base}/tasks/{sid}/trigger", headers=h)
    assert r2.status_code == 409 and r2.json()["active_run"]["status"] in ("queued", "running")


def test_errors_are_json_with_the_right_status(one) -> None:  # type: ignore[no-untyped-def]
    h = auth(one.login("admin"))
    m = auth(one.login("alice"))
    base = one.base
    assert httpx.get(base + "/tasks").status_code == 401
    assert httpx.post(base + "/tasks", headers=m, json={"name": "x", "handler": "noop"}).status_code == 403
    r = httpx.post(base + "/tasks", headers=h, json={"name": "x", "handler": "noop", "schedule": "61 * * * *"})
    assert r.status_code == 422 and "61" in r.json()["description"]
    r = httpx.post(base + "/tasks", headers=h, content=b"{not json")
    assert r.status_code == 415   # not declared as JSON
    r = httpx.post(base + "/tasks", headers={**h, "Content-Type": "application/json"}, content=b"{not json")
    assert r.status_code == 400
    r = httpx.post(base + "/tasks", headers=h, content=b"x" * (2 * 1024 * 1024 + 10))
    assert r.status_code == 413
    assert httpx.get(base + "/tasks/00000000-0000-0000-0000-000000000000", headers=h).status_code == 404
    assert httpx.post(base + "/tasks", headers=h, json={"name": "dup", "handler": "noop"}).status_code == 201
    r = httpx.post(base + "/tasks", headers=h, json={"name": "dup", "handler": "noop"})
    assert r.status_code == 409
    r = httpx.get(base + "/no/such/route", headers=h)
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["title"] == "Not Found" and "/no/such/route" in r.json()["description"]
    r = httpx.delete(base + "/tasks", headers=h)
    assert r.status_code == 405 and "DELETE" in r.json()["description"]
    assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
    r = httpx.post(base + "/tasks", headers=h, json={"name": "y", "handler": "noop", "max_attempts": 0})
    assert r.status_code == 422 and "max_attempts 0" in r.json()["description"]  # SQL's rule, mapped
    r = httpx.post(base + "/tasks", headers=h, json={"name": "y", "handler": "noop", "args": [1]})
    assert r.status_code == 422 and "array" in r.json()["description"]
    r = httpx.post(base + "/tasks", headers=h, json={"name": "y", "handler": "noop", "max_attempts": "3"})
    assert r.status_code == 422 and "integer" in r.json()["description"]
    assert httpx.get(base + "/openapi.json").json()["openapi"].startswith("3.")
    metrics = httpx.get(base + "/metrics").text
    assert "switchboard_http_requests_total" in metrics and "switchboard_websockets_open" in metrics


def test_gunicorn_workers_are_replicas_and_exit_cleanly(db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--workers 2: gunicorn + uvicorn workers, each its own replica (registry row, LISTEN)."""
    import os
    import signal
    import subprocess
    import sys

    import psycopg

    from harness import app_url_for
    from harness import JWT_SECRET, ROOT, free_port, probe_token

    port = free_port()
    env = dict(os.environ, DATABASE_URL=app_url_for(db), SWITCHBOARD_JWT_SECRET=JWT_SECRET,
               PYTHONPATH=str(ROOT / "server"), SWITCHBOARD_HEARTBEAT_INTERVAL="0.5")
    log = open(tmp_path / "gunicorn.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "switchboard.cli", "serve", "--host", "127.0.0.1",
                          "--port", str(port), "--workers", "2", "--no-migrate"],
                         env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        replicas: set[str] = set()
        while time.time() < deadline and len(replicas) < 2:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/me", timeout=2, headers=auth(probe_token()))
                if r.status_code == 200:
                    replicas.add(r.json()["replica"])
            except httpx.HTTPError:
                time.sleep(0.1)
        assert len(replicas) == 2, (tmp_path / "gunicorn.log").read_text()[-3000:]
        with psycopg.connect(db) as c:
            deadline = time.time() + 10
            while time.time() < deadline:
                live = {r[0] for r in c.execute("SELECT id FROM switchboard.replicas").fetchall()}
                if replicas <= live:
                    break
                time.sleep(0.2)
        assert replicas <= live
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
        log.close()


def test_sql_handler_runs_as_the_job_role_and_cannot_escape(one, db) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE TABLE public.pruned (n int)")
        c.execute("INSERT INTO public.pruned SELECT generate_series(1, 5)")
        c.execute("GRANT SELECT, DELETE ON public.pruned TO switchboard_job")
    h = auth(one.login("admin"))

    def run(name: str, sql: str) -> dict:
        tid = httpx.post(one.base + "/tasks", headers=h, json={"name": name, "handler": "sql", "max_attempts": 1,
                                                               "args": {"sql": sql}}).json()["id"]
        assert httpx.post(f"{one.base}/tasks/{tid}/trigger", headers=h).status_code == 202
        deadline = time.time() + 10
        while time.time() < deadline:
            runs = httpx.get(f"{one.base}/tasks/{tid}/runs", headers=h).json()["runs"]
            if runs and runs[0]["status"] in ("succeeded", "failed"):
                return runs[0]
            time.sleep(0.05)
        raise AssertionError("run did not finish")

    ok = run("prune", "DELETE FROM public.pruned WHERE n > 3")
    assert ok["status"] == "succeeded" and ok["result"] == {"rowcount": 2, "role": "switchboard_job"}
    bad = run("escape", "DO $x$ BEGIN EXECUTE 'RESET ROLE'; DELETE FROM switchboard.tasks; END $x$")
    assert bad["status"] == "failed" and "role" in bad["error"]
    nosy = run("nosy", "SELECT * FROM switchboard.users")
    assert nosy["status"] == "failed" and "permission denied" in nosy["error"]
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM public.pruned").fetchone()[0] == 3
        assert c.execute("SELECT count(*) FROM switchboard.tasks").fetchone()[0] >= 4


def test_handshake_resume_replays_before_any_live_frame(one, db) -> None:  # type: ignore[no-untyped-def]
    """/ws?ticket=T&after=N&rooms=r: rooms joined and the gap replayed before any live
    event can be sent. A live event published while the replay query is held up
    (event_horizon locked) is buffered, not sent ahead of older missed events."""
    import json
    import threading

    import psycopg
    from websockets.sync.client import connect

    h = auth(one.login("admin"))
    tok = one.login("alice")
    ws = one.ws(tok)
    uid = ws.hello["payload"]["user_id"]
    ws.close()
    assert httpx.put(f"{one.base}/rooms/general/members/{uid}", headers=h).status_code == 204

    def pub(**body) -> int:  # type: ignore[no-untyped-def]
        r = httpx.post(one.base + "/events", headers=h, json={"event": "e", "payload": {}, **body})
        return r.json()["id"]

    first = pub(user_id=uid)
    missed = [pub(user_id=uid), pub(room="general"), pub(user_id=uid)]
    with psycopg.connect(db) as locker:
        locker.execute("LOCK TABLE switchboard.event_horizon IN ACCESS EXCLUSIVE MODE")
        conn = connect(f"{one.ws_base}/ws?ticket={one.ticket(tok)}&after={first}&rooms=general,secret",
                       open_timeout=10)
        hello = json.loads(conn.recv(timeout=10))
        assert hello["event"] == "hello" and hello["payload"]["rooms"] == ["general"]
        refused = json.loads(conn.recv(timeout=10))
        assert refused["event"] == "error" and refused["payload"]["room"] == "secret"
        live = pub(room="general")  # arrives while the replay is held up
        with pytest.raises(TimeoutError):
            conn.recv(timeout=0.5)  # nothing may be sent before the replay
        threading.Timer(0.2, locker.rollback).start()
        frames = []
        while True:
            f = json.loads(conn.recv(timeout=10))
            frames.append(f)
            if f["event"] == "resumed":
                break
    ids = [f["id"] for f in frames if f.get("id") is not None]
    assert ids == missed + [live], frames
    conn.close()


def test_room_names_are_judged_by_sql_and_bounded_here(one) -> None:  # type: ignore[no-untyped-def]
    """The naming rule lives in add_room_member (SQL); the socket only bounds what a
    client can make it ask: a name breaking the rule can never be a member."""
    h = auth(one.login("admin"))
    r = httpx.put(one.base + "/rooms/bad%20room!/members/00000000-0000-0000-0000-000000000000", headers=h)
    assert r.status_code == 422 and 'invalid room name "bad room!"' in r.json()["description"]
    ws = one.ws(one.login("alice"))
    try:
        assert ws.join("bad room!")["payload"]["code"] == "forbidden"
        assert ws.join("r" * 129)["payload"]["code"] == "bad_room"
        ws.send({"action": "join", "room": 7})
        assert ws.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "bad_room"
        ws.send({"action": "join", "room": "a\x00b"})
        assert ws.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "bad_room"
    finally:
        ws.close()
