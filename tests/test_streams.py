"""Streams end to end: real replicas, real WebSockets, real SSE.

A handler on one replica streams to a user whose socket is on another; the reader
gets every chunk once and in order and then the end; a Stop from any replica stops
the producer; SSE resumes with Last-Event-ID; nobody else can read or stop it."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import psycopg
import pytest
from harness import ROOT, WS, auth, make_user
from websockets.sync.client import connect

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


def follow(ws, sid: str, after: int = 0, timeout: float = 60,  # type: ignore[no-untyped-def]
           others: list[dict] | None = None) -> tuple[list[tuple[int, str]], dict]:
    """Subscribe and collect (seq, chunk) until the stream's end frame; other frames go to ``others``."""
    ws.send({"action": "stream.subscribe", "stream": sid, "after": after})
    got: list[tuple[int, str]] = []
    deadline = time.time() + timeout
    while True:
        f = ws.recv(timeout=max(0.1, deadline - time.time()))
        p = f["payload"]
        if others is not None and (not f["event"].startswith("stream.") or f["id"] is not None):
            others.append(f)
        if f["event"] == "stream.chunks" and p["stream"] == sid:
            got.extend((p["seq"] + i, c) for i, c in enumerate(p["chunks"]))
        elif f["event"] == "stream.end" and p["stream"] == sid and f["id"] is None:
            return got, p                  # (the durable stream.end event has an id: it is not the stream's end frame)
        elif f["event"] == "error":
            raise AssertionError(f)


def test_a_handler_on_one_replica_streams_to_a_socket_on_another(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(env={**HANDLERS_ENV, "SWITCHBOARD_SCHEDULER": "off"}, name="a")
    b = server_factory(env=HANDLERS_ENV, name="b")          # only b runs handlers
    uid = make_user(db, "ann")
    ws = a.ws(a.login("ann"))
    run = enqueue(db, uid, prompt="hello", tokens=3000, rate=0, chunk=1)
    sid = stream_of_answer(ws)
    others: list[dict] = []
    got, end = follow(ws, sid, others=others)
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
    if not any(f["event"] == "stream.end" and f["id"] is not None for f in others):
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
    b = server_factory(env={**HANDLERS_ENV, "SWITCHBOARD_SCHEDULER": "off"}, name="b")
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


def test_the_reader_s_replica_is_killed_mid_stream_and_the_client_finishes_on_another(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    off = {**HANDLERS_ENV, "SWITCHBOARD_SCHEDULER": "off"}
    a = server_factory(env=off, name="a")
    b = server_factory(env=HANDLERS_ENV, name="b")          # the producer's replica
    c = server_factory(env=off, name="c")
    uid = make_user(db, "gil")
    tok = a.login("gil")
    ws = a.ws(tok)
    run = enqueue(db, uid, prompt="failover", tokens=5000, rate=1000)
    sid = stream_of_answer(ws)
    ws.send({"action": "stream.subscribe", "stream": sid, "after": 0})
    raw: list[int] = []
    while len(raw) < 1000:
        f = ws.recv(timeout=30)
        if f["event"] == "stream.chunks":
            raw.extend(f["payload"]["seq"] + i for i in range(len(f["payload"]["chunks"])))
    a.kill()                                                # SIGKILL the reader's replica mid-stream
    try:
        while True:
            f = ws.recv(timeout=5)
            if f["event"] == "stream.chunks":
                raw.extend(f["payload"]["seq"] + i for i in range(len(f["payload"]["chunks"])))
    except Exception:
        pass                                                # the connection is gone
    ws2 = c.ws(tok)                                         # the client comes back on another replica
    got, end = follow(ws2, sid, after=raw[-1])
    raw.extend(s for s, _ in got)
    assert raw == list(range(1, 5001)), (len(raw), raw[-3:], end)   # every chunk once, in order, across the kill
    assert end["status"] == "done" and end["last_seq"] == 5000
    assert run_result(db, run)["chunks"] == 5000
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM switchboard.events WHERE event = 'stream.end' "
                            "AND payload->>'stream' = %s", (sid,)).fetchone()[0] == 1
    ws2.close()
    assert b.proc.poll() is None


def test_a_reader_that_does_not_read_slows_no_other_stream(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """One socket follows a big stream and stops reading (its TCP window closes, its send
    queue fills); another socket on the same replica gets its own stream whole meanwhile.
    The stuck one, when it reads again, still gets every chunk once and in order."""
    a = server_factory(env={**HANDLERS_ENV, "SWITCHBOARD_WS_QUEUE_SIZE": "50", "SWITCHBOARD_WS_QUEUE_BYTES": "65536",
                            "SWITCHBOARD_WS_REPLAY_STALL_SECONDS": "120"}, name="a")
    slow_uid, fast_uid = make_user(db, "slow"), make_user(db, "fast")
    sock = socket.create_connection(("127.0.0.1", a.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)   # no autotuned 32 MB window
    slow = WS(connect(f"{a.ws_base}/ws?ticket={a.ticket(a.login('slow'))}", sock=sock, open_timeout=10, ping_interval=None, max_queue=1,
                      max_size=None))
    fast = a.ws(a.login("fast"))
    enqueue(db, slow_uid, prompt="big", tokens=1000000, rate=0, chunk=100)    # ~6.5 MB in 10,000 chunks
    slow_sid = stream_of_answer(slow)
    slow.send({"action": "stream.subscribe", "stream": slow_sid, "after": 0})
    with psycopg.connect(db, autocommit=True) as c:        # the slow stream is written whole, unread
        deadline = time.time() + 60
        while c.execute("SELECT status FROM switchboard.streams WHERE id = %s", (slow_sid,)).fetchone()[0] == "open":
            assert time.time() < deadline
            time.sleep(0.1)
    enqueue(db, fast_uid, prompt="small", tokens=500, rate=0)
    fast_sid = stream_of_answer(fast)
    got, end = follow(fast, fast_sid, timeout=30)
    assert [s for s, _ in got] == list(range(1, 501)) and end["status"] == "done"
    queued = [float(x.split()[-1]) for x in httpx.get(f"{a.base}/metrics", timeout=30).text.splitlines()
              if x.startswith("switchboard_ws_queued_bytes")]
    assert queued and queued[0] > 0          # the slow socket was still stuck while the fast one finished
    got_slow, end_slow = _drain_subscribed(slow, slow_sid)
    assert end_slow["status"] == "done", end_slow
    assert [s for s, _ in got_slow] == list(range(1, 10001))
    slow.close()
    fast.close()


def _drain_subscribed(ws, sid: str, timeout: float = 120) -> tuple[list[tuple[int, str]], dict]:  # type: ignore[no-untyped-def]
    got: list[tuple[int, str]] = []
    deadline = time.time() + timeout
    while True:
        f = ws.recv(timeout=max(0.1, deadline - time.time()))
        p = f["payload"]
        if f["event"] == "stream.chunks" and p["stream"] == sid:
            got.extend((p["seq"] + i, c) for i, c in enumerate(p["chunks"]))
        elif f["event"] == "stream.end" and p["stream"] == sid and f["id"] is None:
            return got, p


def test_a_producer_killed_mid_stream_leaves_its_stream_error_after_its_lease(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """No stream stays open for ever: the producer's replica dies, its lease runs out, the
    maintenance task (every 10 s) ends the stream as error, and the reader gets that end."""
    a = server_factory(env={**HANDLERS_ENV, "SWITCHBOARD_SCHEDULER": "off"}, name="a")
    b = server_factory(env=HANDLERS_ENV, name="b")                   # the producer's replica
    uid = make_user(db, "hal")
    ws = a.ws(a.login("hal"))
    enqueue(db, uid, prompt="doomed", tokens=100000, rate=100, lease=2)
    sid = stream_of_answer(ws)
    ws.send({"action": "stream.subscribe", "stream": sid, "after": 0})
    ws.recv_until(lambda f: f["event"] == "stream.chunks")
    b.kill()
    # a: the maintenance task needs a scheduler; a third replica with one takes it over
    server_factory(env={"SWITCHBOARD_SCHEDULER": "on"}, name="c")
    end = ws.recv_until(lambda f: f["event"] == "stream.end" and f["id"] is None, timeout=60)["payload"]
    assert end["status"] == "error" and end["final"] == {"error": "the producer stopped renewing its lease"}
    with psycopg.connect(db, autocommit=True) as c:
        last, n = c.execute("SELECT s.last_seq, (SELECT count(*) FROM switchboard.stream_chunks k "
                            "WHERE k.stream_id = s.id) FROM switchboard.streams s WHERE s.id = %s", (sid,)).fetchone()
    assert end["last_seq"] == last == n                      # every chunk it wrote is still readable
    ws.close()


def test_an_oversized_chunk_is_refused_before_it_is_queued(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """The Python producer checks a chunk's size and type itself: a clear error in the
    handler, nothing queued, the stream still usable."""
    import asyncio
    import sys

    sys.path.insert(0, str(ROOT / "server"))
    from switchboard.data.database import Database
    from switchboard.streams import Producer, StreamStopped

    uid = make_user(db, "ivy")

    async def main() -> tuple[int, str]:
        d = Database(db.replace("postgres@", "sb_app_login@", 1), min_size=1, max_size=4)
        await d.open()
        p = Producer(d)
        p.start()
        try:
            async with p.stream(uid, "completion") as s:
                with pytest.raises(ValueError):
                    await s.send("x" * 70000)
                with pytest.raises(TypeError):
                    await s.send(b"bytes")  # type: ignore[arg-type]
                await s.send("fine")
                await s.flush()
                await d.stream_stop(s.id, None)            # a stop from anywhere
                with pytest.raises(StreamStopped):
                    await s.send("after stop")
                    await s.flush()
            return s.seq, str(s.id)
        finally:
            await p.stop()
            await d.close()

    seq, sid = asyncio.run(main())
    with psycopg.connect(db, autocommit=True) as c:
        rows = c.execute("SELECT seq, data FROM switchboard.stream_chunks WHERE stream_id = %s", (sid,)).fetchall()
        status, end_event = c.execute("SELECT status, end_event FROM switchboard.streams WHERE id = %s", (sid,)).fetchone()
    assert seq == 1 and rows == [(1, "fine")] and status == "stopped" and end_event is not None


def test_sse_responses_per_user_are_bounded_and_given_back(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(name="a")
    uid = make_user(db, "jay")
    tok = a.login("jay")
    with psycopg.connect(db, autocommit=True) as c:
        sid = c.execute("SELECT switchboard.stream_open(%s, 'k')", (uid,)).fetchone()[0]
    with httpx.Client(base_url=a.base, headers=auth(tok), timeout=30) as http:
        held = [http.stream("GET", f"/streams/{sid}") for _ in range(16)]
        responses = [h.__enter__() for h in held]
        assert all(r.status_code == 200 for r in responses)
        over = httpx.get(f"{a.base}/streams/{sid}", headers=auth(tok), timeout=30)
        assert over.status_code == 429 and over.headers["content-type"].startswith("application/problem+json")
        for h in held:
            h.__exit__(None, None, None)
    deadline = time.time() + 30                # the server notices the closed responses (keep-alive: 15 s)
    while True:
        with httpx.stream("GET", f"{a.base}/streams/{sid}", headers=auth(tok), timeout=30) as r:
            if r.status_code == 200:
                break
        assert time.time() < deadline, "the closed SSE responses were never given back"
        time.sleep(0.5)
