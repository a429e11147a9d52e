"""The verified live path on real replicas (V0020): a signed event is delivered
before any replica has read it; what does not verify is never delivered from the
bus; a cursor that names events sent ahead resumes exactly, on another replica.

"Before any replica has read it" is made observable, not timed: a session holds
the ticker row (switchboard.event_ticker FOR UPDATE), so no tick can be recorded
and relay_read_v2 returns nothing new. With the live path off, that holds every
frame back (the control case below proves the hold works); with it on, the frame
arrives anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time

import httpx
import psycopg
import pytest

from harness import events_of, make_user


def _live(db: str, on: bool, id_hints: bool = True) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.event_live_path(%s, send_id_hints => %s)", (on, id_hints))


def _channel(db: str) -> str:
    """The live channel's name (V0025: secret like the key; read here as the owner, as if
    it had leaked)."""
    with psycopg.connect(db, autocommit=True) as c:
        return str(c.execute("SELECT channel FROM switchboard.event_live").fetchone()[0])


class TickerHeld:
    """Hold the ticker row: no tick is recorded, so no relay reads a new event."""

    def __init__(self, db: str) -> None:
        self.conn = psycopg.connect(db)
        self.conn.execute("SELECT 1 FROM switchboard.event_ticker WHERE singleton FOR UPDATE")

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def _publish(db: str, uid: str, event: str, payload: dict | None = None) -> int:
    with psycopg.connect(db, autocommit=True) as c:
        return int(c.execute("SELECT switchboard.notify_user(%s, %s, %s)",
                             (uid, event, json.dumps(payload or {}))).fetchone()[0])


def _settled(ws, cur: str) -> str:  # type: ignore[no-untyped-def]
    """Wait until the relay has read everything this socket was sent (its cursor names
    no id ahead any more): a resume from ``cur`` answers with the socket's own cursor."""
    deadline = time.monotonic() + 15
    while True:
        ws.send({"action": "resume", "cursor": cur})
        r = ws.recv_until(lambda f: f.get("event") == "resumed")
        assert r["payload"]["replayed"] == 0, r   # from the last frame processed: nothing missed
        if r["cursor"].startswith("v1.") or time.monotonic() > deadline:
            assert r["cursor"].startswith("v1."), r
            return str(r["cursor"])
        time.sleep(0.2)


def _metric(s, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    text = httpx.get(s.base + "/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for m in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? ([0-9.e+-]+)$", text, flags=re.M):
        if not want or want in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def test_control_without_the_live_path_a_held_ticker_holds_every_frame(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "ann")
    s = server_factory(name="off")
    ws = s.ws(s.login("ann"))
    held = TickerHeld(db)
    try:
        eid = _publish(db, uid, "waits")
        assert events_of(ws.drain(quiet=1.5)) == [], "delivered without a tick: the hold proves nothing"
    finally:
        held.release()
    f = ws.recv_until(lambda f: f.get("id") == eid)
    assert f["cursor"].startswith("v1.")
    ws.close()


@pytest.mark.parametrize("id_hints", [True, False], ids=["id-hints", "live-messages-only"])
def test_a_signed_event_is_delivered_before_any_read_and_confirmed_by_the_read(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                                              id_hints: bool) -> None:
    """Also with send_id_hints => false: then no {"id"} hint wakes the relay, only the
    live messages do, and every event is still read (its cursor settles to v1)."""
    uid = make_user(db, "ann")
    _live(db, True, id_hints)
    s = server_factory(name="on")
    ws = s.ws(s.login("ann"))
    # A first event, read the usual way: a socket registered just now is gated until a
    # read covers what came before it (nothing live overtakes an earlier event).
    first = _publish(db, uid, "warm")
    _settled(ws, ws.recv_until(lambda f: f.get("id") == first)["cursor"])
    held = TickerHeld(db)
    try:
        ids = [_publish(db, uid, "live", {"n": n}) for n in range(3)]
        frames = [ws.recv_until(lambda f: f.get("id") is not None, timeout=15) for _ in ids]
        assert [f["id"] for f in frames] == ids
        assert [f["payload"] for f in frames] == [{"n": 0}, {"n": 1}, {"n": 2}]
        # Each cursor: the socket's position, plus the ids sent ahead of it so far.
        assert all(f["cursor"].startswith("v2.") for f in frames)
        assert frames[2]["cursor"].split(".")[:3] == frames[0]["cursor"].split(".")[:3]
        assert [len(f["cursor"].split(".")) - 3 for f in frames] == [1, 2, 3]
        assert _metric(s, "switchboard_live_frames_total") >= 3
    finally:
        held.release()
    # Once read, the events leave the socket's cursor: a resume from the last frame's
    # cursor replays nothing, and its "resumed" cursor is a plain position past them.
    _settled(ws, frames[-1]["cursor"])
    assert events_of(ws.drain(quiet=0.3)) == [], "a resume from the last frame replayed something"
    # Later events: the cursor names at most themselves ahead, never the three again.
    last = _publish(db, uid, "after")
    f = ws.recv_until(lambda f: f.get("id") is not None)
    assert f["id"] == last, f
    assert [int(x, 36) for x in f["cursor"].split(".")[3:]] in ([], [last]), f
    _settled(ws, f["cursor"])
    # One frame counted per frame sent: an event sent live and then read is not counted
    # twice (warm, three live, after).
    assert _metric(s, "switchboard_events_relayed_total") == 5
    assert events_of(ws.drain(quiet=0.5)) == []
    ws.close()


def test_forged_live_messages_are_never_delivered(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """A role that can connect (here: one that may not even read the key) and knows the
    live channel's name NOTIFYs well-formed live messages on it: a wrong MAC, a MAC under
    a guessed key, a barrier storm, garbage. None is delivered; each is counted; genuine
    events still arrive, once."""
    uid = make_user(db, "ann")
    _live(db, True)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE ROLE mallory LOGIN PASSWORD 'm'")
        c.execute("GRANT CONNECT ON DATABASE " + c.info.dbname + " TO mallory")
    s = server_factory(name="forged")
    ws = s.ws(s.login("ann"))
    warm = _publish(db, uid, "warm")
    ws.recv_until(lambda f: f.get("id") == warm)
    msg = json.dumps({"id": 99999999, "u": uid, "r": None, "e": "forged", "t": int(time.time() * 1000),
                      "p": {"give": "me"}}, separators=(",", ":"))
    forged = [
        "0" * 64 + msg,
        hmac.new(b"\x00" * 32, msg.encode(), hashlib.sha256).hexdigest() + msg,
        hmac.new(b"guess", msg.encode(), hashlib.sha256).hexdigest() + msg,
        *(['{"b":%d}' % n for n in range(1, 200)]),
        "x" * 7000, '{"b":"1"}', "{}", "",
    ]
    mallory = psycopg.conninfo.make_conninfo(db, user="mallory", password="m")
    channel = _channel(db)
    with psycopg.connect(mallory, autocommit=True) as m:
        for p in forged:
            m.execute("SELECT pg_notify(%s, %s)", (channel, p))
    real = _publish(db, uid, "real", {"ok": True})
    f = ws.recv_until(lambda f: f.get("id") is not None)
    assert f["id"] == real and f["payload"] == {"ok": True}
    assert all(g.get("event") != "forged" for g in ws.drain(quiet=1.0))
    assert _metric(s, "switchboard_notify_rejected_total", reason="bad_mac") >= 3
    assert _metric(s, "switchboard_notify_rejected_total", reason="malformed") >= 3
    assert httpx.get(s.base + "/healthz/ready", timeout=10).status_code == 200
    ws.close()


def test_a_v2_cursor_resumes_exactly_on_another_replica(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """Sent live on replica 1 (position unknown yet), then the socket drops; resumed on
    replica 2 from that frame's cursor while the events are still unread: the ones the
    client has never come again, the one it missed arrives, once."""
    uid = make_user(db, "ann")
    _live(db, True)
    r1, r2 = server_factory(name="l1"), server_factory(name="l2")
    tok = r1.login("ann")
    ws = r1.ws(tok)
    warm = _publish(db, uid, "warm")
    _settled(ws, ws.recv_until(lambda f: f.get("id") == warm)["cursor"])
    held = TickerHeld(db)
    try:
        a = _publish(db, uid, "a")
        fa = ws.recv_until(lambda f: f.get("id") is not None)
        assert fa["id"] == a and fa["cursor"].startswith("v2."), fa
        ws.close()
        b = _publish(db, uid, "b")
        from websockets.sync.client import connect

        from harness import WS
        ws2 = WS(connect(f"{r2.ws_base}/ws?ticket={r2.ticket(tok)}&cursor={fa['cursor']}", open_timeout=10))
        # Nothing is ticked yet: the replay has nothing, and replica 2's socket was just
        # registered (gated), so b waits for the read. Then the ticker is released.
        time.sleep(0.5)
    finally:
        held.release()
    got = [f for f in ws2.drain(quiet=2.0) if f.get("id") is not None]
    assert [f["id"] for f in got] == [b], got
    c = _publish(db, uid, "c")
    fc = ws2.recv_until(lambda f: f.get("id") is not None)
    assert fc["id"] == c
    ws2.close()


@pytest.mark.parametrize("bad", ["v2.1.e", "v2.1.e.", "v2.1.2.0", "v2.1.2.ZZ", "v2.1.2." + ".".join(["1"] * 65),
                                 "v2.1.2.1y2p0ij32e8e8", "v3.1.2.3"])
def test_malformed_v2_cursors_are_refused(server_factory, db: str, bad: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "ann")
    s = server_factory(name="cur")
    ws = s.ws(s.login("ann"))
    ws.send({"action": "resume", "cursor": bad})
    f = ws.recv_until(lambda f: f.get("event") == "error")
    assert f["payload"]["code"] == "bad_resume"
    ws.close()


def test_a_genuine_message_replayed_later_is_not_delivered_again(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """A signed message verifies whenever it is sent: a role that recorded one from the
    bus and replays it must not get it delivered again -- neither to the replica that
    read it, nor to one started afterwards (no memory of it at all)."""
    from pgtap import listener

    uid = make_user(db, "ann")
    _live(db, True)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE ROLE eve LOGIN PASSWORD 'e'")
    channel = _channel(db)
    lst = listener(db, channel)
    s = server_factory(name="replay1")
    tok = s.login("ann")
    ws = s.ws(tok)
    warm = _publish(db, uid, "warm")
    ws.recv_until(lambda f: f.get("id") == warm)
    orig = _publish(db, uid, "once", {"pay": 1})
    assert ws.recv_until(lambda f: f.get("id") is not None)["id"] == orig
    recorded = [n.payload for n in lst.notifies(timeout=3.0) if f'"id":{orig},' in n.payload]
    lst.close()
    assert len(recorded) == 1
    eve = psycopg.conninfo.make_conninfo(db, user="eve", password="e")
    time.sleep(0.5)                       # read by now: the relay knows the id
    with psycopg.connect(eve, autocommit=True) as e:
        e.execute("SELECT pg_notify(%s, %s)", (channel, recorded[0]))
    assert [f for f in ws.drain(quiet=1.0) if f.get("id") == orig] == []
    ws.close()
    # A replica started after the event knows nothing of it: the stamp predates its
    # connection, so the message is only a reason to read (and the read has nothing new).
    s2 = server_factory(name="replay2")
    ws2 = s2.ws(s2.login("ann"))
    with psycopg.connect(eve, autocommit=True) as e:
        e.execute("SELECT pg_notify(%s, %s)", (channel, recorded[0]))
    assert [f for f in ws2.drain(quiet=1.5) if f.get("id") == orig] == []
    after = _publish(db, uid, "after")
    assert ws2.recv_until(lambda f: f.get("id") is not None)["id"] == after
    ws2.close()
