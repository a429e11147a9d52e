"""Streams end to end: real replicas, real WebSockets, real SSE.

A handler on one replica streams to a user whose socket is on another; the reader
gets every chunk once and in order and then the end; a Stop from any replica stops
the producer; SSE resumes with Last-Event-ID; nobody else can read or stop it."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import psycopg
from harness import ROOT, auth, make_user

HANDLERS_ENV = {"SWITCHBOARD_HANDLERS": "ai_chat",
                "PYTHONPATH": f"{ROOT / 'server'}:{ROOT / 'examples' / 'ai_chat'}"}


def enqueue(db: str, user: str, **args: object) -> int:
    with psycopg.connect(db, autocommit=True) as c:
        return int(c.execute("SELECT id FROM switchboard.enqueue('ai_chat.complete', %s)",
                             (json.dumps({"user_id": user, **args}),)).fetchone()[0])


def run_result(db: str, run_id: int, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    with psycopg.connect(db, autocommit=True) as c:
        while time.time() < deadline:
            row = c.execute("SELECT status, result, error FROM switchboard.task_runs WHERE id = %s", (run_id,)).fetchone()
            if row[0] in ("succeeded", "failed", "cancelled"):
                assert row[0] == "succeeded", row
                return row[1]
            time.sleep(0.1)
    raise TimeoutError(f"run {run_id} did not finish")


def stream_of_answer(ws, timeout: float = 30) -> str:  # type: ignore[no-untyped-def]
    f = ws.recv_until(lambda f: f["event"] == "chat.answer", timeout)
    return f["payload"]["stream"]


def follow(ws, sid: str, after: int = 0, timeout: float = 60) -> tuple[list[tuple[int, str]], dict]:  # type: ignore[no-untyped-def]
    """Subscribe and collect (seq, chunk) until stream.end."""
    ws.send({"action": "stream.subscribe", "stream": sid, "after": after})
    got: list[tuple[int, str]] = []
    deadline = time.time() + timeout
    while True:
        f = ws.recv(timeout=max(0.1, deadline - time.time()))
        p = f["payload"]
        if f["event"] == "stream.chunks" and p["stream"] == sid:
            got.extend((p["seq"] + i, c) for i, c in enumerate(p["chunks"]))
        elif f["event"] == "stream.end" and p["stream"] == sid:
            return got, p
        elif f["event"] == "error":
            raise AssertionError(f)


def test_a_handler_on_one_replica_streams_to_a_socket_on_another(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(env={**HANDLERS_ENV, "SWITCHBOARD_SCHEDULER_ENABLED": "off"}, name="a")
    b = server_factory(env=HANDLERS_ENV, name="b")          # only b runs handlers
    uid = make_user(db, "ann")
    ws = a.ws(a.login("ann"))
    run = enqueue(db, uid, prompt="hello", tokens=3000, rate=0, chunk=1)
    sid = stream_of_answer(ws)
    got, end = follow(ws, sid)
    assert [s for s, _ in got] == list(range(1, 3001))
    assert end["status"] == "done" and end["last_seq"] == 3000, end
    assert end["final"]["text"] == "".join(c for _, c in got)
    res = run_result(db, run)
    assert res["chunks"] == 3000 and not res["stopped"]
    with psycopg.connect(db, autocommit=True) as c:
        ends = c.execute("SELECT count(*) FROM switchboard.events WHERE event = 'stream.end' "
                         "AND payload->>'stream' = %s", (sid,)).fetchone()[0]
        assert ends == 1                                    # one durable row per answer, not per token
    # the durable end event reaches the socket too
    ws.recv_until(lambda f: f["event"] == "stream.end" and f["id"] is not None)
    # resume from the middle: exactly what follows
    got2, _ = follow(ws, sid, after=2990)
    assert [s for s, _ in got2] == list(range(2991, 3001))
    ws.close()
    b.terminate()


def test_sse_follows_resumes_with_last_event_id_and_refuses_others(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(env=HANDLERS_ENV, name="a")
    uid = make_user(db, "bea")
    make_user(db, "cal")
    tok = a.login("bea")
    ws = a.ws(tok)
    enqueue(db, uid, prompt="sse", tokens=200, rate=400)
    sid = stream_of_answer(ws)
    seen: list[int] = []
    text: list[str] = []
    with httpx.stream("GET", f"{a.base}/streams/{sid}", headers=auth(tok), timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event, data, eid = "message", [], None
        for line in r.iter_lines():
            if line.startswith("id: "):
                eid = int(line[4:])
            elif line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and data:
                if event == "end":
                    end = json.loads(data[0])
                    break
                seen.append(eid)
                text.append("\n".join(data))
                event, data = "message", []
    assert seen == list(range(1, 201)) and end["status"] == "done" and end["last_seq"] == 200
    assert end["final"]["text"] == "".join(text)
    r = httpx.get(f"{a.base}/streams/{sid}", headers={**auth(tok), "Last-Event-ID": "195"}, timeout=30)
    ids = [int(line[4:]) for line in r.text.splitlines() if line.startswith("id: ")]
    assert ids == [196, 197, 198, 199, 200] and "event: end" in r.text
    other = a.login("cal")
    assert httpx.get(f"{a.base}/streams/{sid}", headers=auth(other), timeout=30).status_code == 404
    assert httpx.post(f"{a.base}/streams/{sid}/stop", headers=auth(other), timeout=30).status_code == 404
    assert httpx.get(f"{a.base}/streams/{uuid.uuid4()}", headers=auth(tok), timeout=30).status_code == 404
    bad = httpx.get(f"{a.base}/streams/{sid}?after=-1", headers=auth(tok), timeout=30)
    assert bad.status_code == 400 and bad.headers["content-type"].startswith("application/")
    ws.close()


def test_stop_from_another_replica_stops_the_producer(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(env=HANDLERS_ENV, name="a")
    b = server_factory(env={**HANDLERS_ENV, "SWITCHBOARD_SCHEDULER_ENABLED": "off"}, name="b")
    assert a.pid != b.pid                                   # the handler runs on a, the Stop reaches b
    uid = make_user(db, "dan")
    tok = b.login("dan")
    ws = b.ws(tok)
    run = enqueue(db, uid, prompt="stop me", tokens=100000, rate=200)
    sid = stream_of_answer(ws)
    ws.send({"action": "stream.subscribe", "stream": sid, "after": 0})
    ws.recv_until(lambda f: f["event"] == "stream.chunks" and f["payload"]["seq"] + len(f["payload"]["chunks"]) > 20)
    r = httpx.post(f"{b.base}/streams/{sid}/stop", headers=auth(tok), timeout=30)
    assert r.status_code == 200 and r.json() == {"stream": sid, "status": "stopped"}
    end = ws.recv_until(lambda f: f["event"] == "stream.end" and f["id"] is None)["payload"]
    assert end["status"] == "stopped"
    res = run_result(db, run)
    assert res["stopped"] is True and res["chunks"] == end["last_seq"] < 100000
    with psycopg.connect(db, autocommit=True) as c:
        st, last, final = c.execute("SELECT status, last_seq, final FROM switchboard.streams WHERE id = %s",
                                    (sid,)).fetchone()
        n = c.execute("SELECT count(*), max(seq) FROM switchboard.stream_chunks WHERE stream_id = %s", (sid,)).fetchone()
    assert st == "stopped" and n == (last, last)              # no chunk after the stop
    assert final["text"].startswith(" ".join(final["text"].split()[:3]))
    ws.close()


def test_bad_subscriptions_get_error_frames_and_forged_wakeups_deliver_nothing(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(name="a")
    uid = make_user(db, "eve")
    make_user(db, "fox")
    ws = a.ws(a.login("eve"))
    for msg, code in (({"action": "stream.subscribe", "stream": "nope"}, "bad_stream"),
                      ({"action": "stream.subscribe", "stream": str(uuid.uuid4()), "after": -1}, "bad_stream"),
                      ({"action": "stream.subscribe", "stream": str(uuid.uuid4()), "after": True}, "bad_stream"),
                      ({"action": "stream.subscribe", "stream": str(uuid.uuid4())}, "stream_not_found"),
                      ({"action": "stream.stop", "stream": str(uuid.uuid4())}, "stream_not_found")):
        ws.send(msg)
        f = ws.recv_until(lambda f: f["event"] == "error")
        assert f["payload"]["code"] == code, (msg, f)
    with psycopg.connect(db, autocommit=True) as c:
        fox = c.execute("SELECT id FROM switchboard.users WHERE username = 'fox'").fetchone()[0]
        foreign = c.execute("SELECT switchboard.stream_open(%s, 'k')", (fox,)).fetchone()[0]
        mine = c.execute("SELECT switchboard.stream_open(%s, 'k')", (uid,)).fetchone()[0]
    ws.send({"action": "stream.subscribe", "stream": str(foreign)})
    assert ws.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "stream_not_found"
    ws.send({"action": "stream.subscribe", "stream": str(mine)})
    with psycopg.connect(db, autocommit=True) as c:     # any role can NOTIFY: hints name nothing into being
        for payload in ("*", str(mine), f"{mine},{foreign}", "garbage," * 500):
            c.execute("SELECT pg_notify('switchboard_stream', %s)", (payload[:7999],))
            c.execute("SELECT pg_notify('switchboard_stream_stop', %s)", (payload[:7999],))
    assert [f for f in ws.drain(1.0) if f["event"].startswith("stream.")] == []
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['real'])", (mine,))
        assert c.execute("SELECT status FROM switchboard.streams WHERE id = %s", (mine,)).fetchone()[0] == "open"
    f = ws.recv_until(lambda f: f["event"] == "stream.chunks")
    assert f["payload"] == {"stream": str(mine), "seq": 1, "chunks": ["real"]}
    ws.close()
