"""GET /sse and POST /sse/{connection}/actions against real replicas: the WebSocket's
frames and actions for networks that block upgrades (issue 34 item 6)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import psycopg
import pytest

from harness import auth, make_user
from sse_client import SSE


def _gauge(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def _wait_gauge(base: str, name: str, value: float, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while _gauge(base, name) != value:
        assert time.monotonic() < deadline, f"{name} never became {value}"
        time.sleep(0.2)


@pytest.fixture
def users(db):  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    make_user(db, "alice")
    make_user(db, "bob")
    return db


def test_user_and_room_events_published_on_another_replica(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    a, b = server_factory(), server_factory()
    adm, tok = b.login("admin"), a.login("alice")
    uid = httpx.get(a.base + "/me", headers=auth(tok)).json()["user_id"]
    assert httpx.put(f"{b.base}/rooms/general/members/{uid}", headers=auth(adm)).status_code == 204
    sse = SSE(a.base, a.ticket(tok), "&rooms=general")
    try:
        assert sse.hello["payload"]["rooms"] == ["general"]
        assert sse.hello["_sse_id"] == sse.hello["cursor"]
        u = httpx.post(b.base + "/events", headers=auth(adm), json={"user_id": uid, "event": "hi", "payload": {"n": 1}})
        r = httpx.post(b.base + "/events", headers=auth(adm), json={"room": "general", "event": "m", "payload": {}})
        got = [sse.recv_until(lambda f: f.get("id") == i) for i in (u.json()["id"], r.json()["id"])]
        assert got[0]["event"] == "hi" and got[0]["payload"] == {"n": 1}
        assert got[1]["room"] == "general"
        for f in got:                               # the SSE id is the frame's resume cursor
            assert f["_sse_id"] == f["cursor"]
        # a silent stream gets a comment now and then (every 15 s), so proxies keep it open
        deadline = time.monotonic() + 60
        while sse.comments == 0:
            assert time.monotonic() < deadline, "no keep-alive comment"
            time.sleep(0.2)
    finally:
        sse.close()


def test_actions_over_http_and_their_refusals(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    s = server_factory()
    adm, tok, bob = s.login("admin"), s.login("alice"), s.login("bob")
    uid = httpx.get(s.base + "/me", headers=auth(tok)).json()["user_id"]
    assert httpx.put(f"{s.base}/rooms/general/members/{uid}", headers=auth(adm)).status_code == 204
    sse, other = SSE(s.base, s.ticket(tok)), SSE(s.base, s.ticket(tok))
    try:
        assert sse.act(tok, {"action": "join", "room": "general"}).json() == {"ok": True}
        assert sse.recv_until(lambda f: f["event"] in ("joined", "error"))["event"] == "joined"
        assert other.act(tok, {"action": "join", "room": "general"}).status_code == 200
        other.recv_until(lambda f: f["event"] == "joined")
        assert sse.act(tok, {"action": "publish", "event": "typing", "room": "general", "payload": {"on": 1}}).status_code == 200
        assert other.recv_until(lambda f: f["event"] == "typing")["payload"] == {"on": 1}
        assert sse.act(tok, {"action": "ping"}).status_code == 200
        sse.recv_until(lambda f: f["event"] == "pong")

        def refused(r: httpx.Response, status: int, code: str) -> dict:
            assert r.status_code == status, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            body = r.json()
            assert body["status"] == status and body["error"]["code"] == code, body
            return body

        refused(sse.act(tok, {"action": "ping"}, secret="not-the-secret"), 403, "forbidden")
        refused(sse.act(tok, {"action": "ping"}, secret=other.secret), 403, "forbidden")   # another stream's
        refused(sse.act(bob, {"action": "ping"}), 403, "forbidden")                     # another user's stream
        refused(sse.act(tok, {"action": "ping"}, connection="f" * 32), 404, "not_connected")
        refused(sse.act(tok, {"action": "ping"}, connection="x" * 500), 404, "not_connected")
        assert sse.act(None, {"action": "ping"}).status_code == 401
        body = refused(sse.act(tok, {"action": "join", "room": "private"}), 403, "forbidden")
        assert body["error"] == {"code": "forbidden", "message": "not a member of room private", "action": "join",
                                 "room": "private"}
        refused(sse.act(tok, {"action": "join", "room": ""}), 400, "bad_room")
        refused(sse.act(tok, {"action": "fly"}), 400, "unknown_action")
        refused(sse.act(tok, {"action": "publish", "event": "x.y"}), 403, "forbidden_event")
        refused(sse.act(tok, {"action": "publish", "event": "typing", "room": "elsewhere"}), 403, "forbidden")
        refused(sse.act(tok, {"action": "resume", "cursor": "garbage!"}), 400, "bad_resume")
        refused(sse.act(tok, {"action": "publish", "event": f"tool.result.{'0' * 8}-0000-0000-0000-{'0' * 12}"}),
                404, "unknown_call")
        url = f"{s.base}/sse/{sse.connection}/actions"
        refused(httpx.post(url, headers=auth(tok), content=b"{nope"), 400, "bad_json")
        refused(httpx.post(url, headers=auth(tok), content=b"[1]"), 400, "bad_frame")
        refused(httpx.post(url, headers=auth(tok), json={"secret": sse.secret, "x": "y" * 70000}), 413, "too_large")
        # none of the refusals reached the stream as an error frame; the stream still works
        assert [f for f in sse.drain(0.5) if f["event"] == "error"] == []
        assert sse.act(tok, {"action": "leave", "room": "general"}).status_code == 200
        assert sse.recv_until(lambda f: f["event"] == "left")["room"] == "general"
    finally:
        sse.close()
        other.close()


def test_resume_with_last_event_id_across_a_replica_kill(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    a, b = server_factory(), server_factory()
    adm, tok = b.login("admin"), a.login("alice")
    uid = httpx.get(a.base + "/me", headers=auth(tok)).json()["user_id"]
    published: list[int] = []
    stop = threading.Event()

    def publisher() -> None:
        with httpx.Client(base_url=b.base, headers=auth(adm), timeout=30) as c:
            n = 0
            while not stop.is_set() and n < 400:
                published.append(c.post("/events", json={"user_id": uid, "event": "e", "payload": {"n": n}}).json()["id"])
                n += 1
                time.sleep(0.005)
    t = threading.Thread(target=publisher)
    sse = SSE(a.base, a.ticket(tok))
    t.start()
    seen: list[int] = []
    last = sse.hello["_sse_id"]
    try:
        while len(seen) < 40:
            f = sse.recv_until(lambda f: f.get("id") is not None, timeout=30)
            seen.append(f["id"])
            last = f["_sse_id"]
        a.kill()                                   # SIGKILL mid-stream
        # whatever was in flight is lost with the connection; the client resumes from its last id
        for f in sse.drain(0.3):
            if f.get("id") is not None:
                seen.append(f["id"])
                last = f["_sse_id"]
    finally:
        sse.close()
    again = SSE(b.base, b.ticket(b.login("alice")), headers={"Last-Event-ID": last})
    try:
        time.sleep(0.5)
        stop.set()
        t.join(60)
        while not published or published[-1] not in seen:
            seen.append(again.recv_until(lambda f: f.get("id") is not None, timeout=30)["id"])
        seen += [f["id"] for f in again.drain(1.0) if f.get("id") is not None]
    finally:
        again.close()
    assert seen == published                       # every event once, in order


def test_limits_connections_per_user_and_action_rate(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    s = server_factory(env={"SWITCHBOARD_WS_MAX_SOCKETS_PER_USER": "2", "SWITCHBOARD_WS_FRAME_RATE": "0.5",
                            "SWITCHBOARD_WS_FRAME_BURST": "3"})
    tok = s.login("alice")
    one, ws = SSE(s.base, s.ticket(tok)), s.ws(tok)       # SSE streams and sockets share the cap
    third = SSE(s.base, s.ticket(tok))
    assert third.status == 403 and third.body["close_code"] == 1008, third.body
    assert SSE(s.base, "zz-not-hex").status == 403
    ws.close()
    try:
        codes = [one.act(tok, {"action": "ping"}).status_code for _ in range(3 + 9)]
        assert codes[:3] == [200, 200, 200] and 429 in codes[3:], codes
        # 3 x burst refusals: the stream ends with a close event, as the socket would be closed 1008
        for _ in range(12):
            if one.ended.is_set():
                break
            one.act(tok, {"action": "ping"})
        close = one.recv_until(lambda f: f.get("_sse_event") == "close", timeout=30)
        assert close["payload"] == {"code": 1008, "reason": "frame rate exceeded"}
        with pytest.raises(EOFError):
            one.recv_until(lambda f: True, timeout=15)
    finally:
        one.close()
    _wait_gauge(s.base, "switchboard_sse_streams_open", 0)


def test_racing_streams_never_exceed_the_per_user_cap(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    s = server_factory(env={"SWITCHBOARD_WS_MAX_SOCKETS_PER_USER": "2"})
    tok = s.login("alice")
    tickets = [s.ticket(tok) for _ in range(10)]
    barrier = threading.Barrier(len(tickets))
    got: list[SSE | None] = [None] * len(tickets)

    def open_one(i: int) -> None:
        barrier.wait()
        try:
            got[i] = SSE(s.base, tickets[i])
        except (EOFError, AssertionError):
            got[i] = None                          # admitted, then refused with a close event
    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(len(tickets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    opened = [g for g in got if g is not None and g.status == 200]
    try:
        assert len(opened) == 2, [g.status if g else "closed" for g in got]
    finally:
        for g in opened:
            g.close()


def test_close_semantics_and_disconnect_frees_the_registration(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    s = server_factory()
    tok = s.login("alice")
    gone = SSE(s.base, s.ticket(tok))
    _wait_gauge(s.base, "switchboard_sse_streams_open", 1)
    gone.close()                                   # the browser goes away
    _wait_gauge(s.base, "switchboard_sse_streams_open", 0)
    _wait_gauge(s.base, "switchboard_websockets_open", 0)
    disabled = SSE(s.base, s.ticket(tok))
    with psycopg.connect(s.db_url.replace("sb_app_login@", "postgres@"), autocommit=True) as c:
        c.execute("SELECT switchboard.disable_user(%s)", (disabled.hello["payload"]["user_id"],))
    f = disabled.recv_until(lambda f: f.get("_sse_event") == "close", timeout=30)
    assert f["payload"]["code"] == 1008 and f["event"] == "close"
    disabled.close()



def test_logout_ends_the_session_s_streams(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    s = server_factory()
    tok = s.login("alice")
    sse = SSE(s.base, s.ticket(tok))
    assert httpx.post(s.base + "/auth/logout", headers=auth(tok)).status_code == 204
    f = sse.recv_until(lambda f: f.get("_sse_event") == "close", timeout=30)
    assert f["payload"] == {"code": 1008, "reason": "session ended"}
    assert sse.ended.wait(30)
    assert sse.act(tok, {"action": "ping"}).status_code in (401, 404)   # neither the token nor the stream is left
    sse.close()


def test_the_server_going_away_ends_the_stream_with_1012(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    s = server_factory()
    sse = SSE(s.base, s.ticket(s.login("alice")))
    s.proc.send_signal(__import__("signal").SIGTERM)
    f = sse.recv_until(lambda f: f.get("_sse_event") == "close", timeout=30)
    assert f["payload"]["code"] == 1012
    assert sse.ended.wait(30)
    assert s.proc.wait(60) == 0
    sse.close()


def test_a_reader_that_does_not_drain_is_cut_off(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    # A reader that keeps up never holds 1 MiB; the sleeper's kernel buffers hold a few MB,
    # then its send queue fills and it is closed 1013.
    s = server_factory(env={"SWITCHBOARD_WS_QUEUE_BYTES": str(1 << 20), "SWITCHBOARD_WS_REPLAY_STALL_SECONDS": "2"})
    adm, tok = s.login("admin"), s.login("alice")
    uid = httpx.get(s.base + "/me", headers=auth(tok)).json()["user_id"]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", s.port))
    sock.sendall(f"GET /sse?ticket={s.ticket(tok)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    _wait_gauge(s.base, "switchboard_sse_streams_open", 1)
    live = SSE(s.base, s.ticket(tok))                # a reader of the same user that keeps up
    big = "x" * 30000
    with httpx.Client(base_url=s.base, headers=auth(adm), timeout=30) as c:
        ids = [c.post("/events", json={"user_id": uid, "event": "big", "payload": {"s": big}}).json()["id"]
               for _ in range(400)]
    try:
        assert live.recv_until(lambda f: f.get("id") == ids[-1], timeout=60)["payload"]["s"] == big
        # the sleeper was closed 1013 and unregistered; the relay never waited for it
        _wait_gauge(s.base, "switchboard_sse_streams_open", 1)
        assert 'switchboard_ws_closed_total{code="1013"}' in httpx.get(s.base + "/metrics").text
        # and its connection is cut: reading now, it finds the end of what was buffered, then EOF
        sock.settimeout(5)
        deadline = time.monotonic() + 60
        while sock.recv(1 << 20):
            assert time.monotonic() < deadline, "the server never closed the sleeper's connection"
        assert "Traceback" not in s.log()
    finally:
        live.close()
        sock.close()


def test_pushed_presence_over_sse(server_factory, users) -> None:  # type: ignore[no-untyped-def]
    """presence.track over POST: the stream gets the room's presence.state with its own
    metadata, and a diff when a WebSocket user on another replica comes online."""
    a = server_factory(env={"SWITCHBOARD_PRESENCE_INTERVAL": "0.3"})
    b = server_factory(env={"SWITCHBOARD_PRESENCE_INTERVAL": "0.3"})
    adm, tok, btok = b.login("admin"), a.login("alice"), b.login("bob")
    for name, t in (("alice", tok), ("bob", btok)):
        uid = httpx.get(a.base + "/me", headers=auth(t)).json()["user_id"]
        assert httpx.put(f"{b.base}/rooms/lobby/members/{uid}", headers=auth(adm)).status_code == 204
    sse = SSE(a.base, a.ticket(tok), "&rooms=lobby")
    try:
        r = sse.act(tok, {"action": "presence.track", "room": "lobby", "meta": {"device": "sse"}})
        assert r.status_code == 200, r.text
        state = sse.recv_until(lambda f: f.get("event") == "presence.state")
        assert [(m["username"], m["metas"]) for m in state["payload"]["members"]] == [("alice", [{"device": "sse"}])]
        bad = sse.act(tok, {"action": "presence.track", "room": "lobby", "meta": {"x": [1]}})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_meta", bad.text
        bob = b.ws(btok)
        bob.send({"action": "join", "room": "lobby"})
        diff = sse.recv_until(lambda f: f.get("event") == "presence.diff", timeout=30)
        assert [m["username"] for m in diff["payload"]["joins"]] == ["bob"]
        bob.close()
    finally:
        sse.close()
