"""Long absences: a resume from any cursor inside the retention window delivers
everything after it, in order, without overflowing the send queue.

Before, the replay was pushed into the bounded send queue in one go: a client
that missed 3,000 events was closed 1013 after 1,000 of them, reconnected,
resumed and was closed again. These tests use a 100-slot queue so that 3,000
missed events are 30 queues' worth: the replay must be paged and streamed at
the client's pace (action "resume" and handshake /ws?after= alike), live
events published during the replay must neither be lost nor overtake it, and
a cursor below the event horizon must get resume_gap.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
from harness import WS, make_user, seal_event_partition, tick_covering_everything
from websockets.sync.client import connect

ENV = {"SWITCHBOARD_WS_QUEUE_SIZE": "100"}
MISSED = 3000


def _publish(db: str, uid: str, first: int, n: int) -> list[int]:
    with psycopg.connect(db, autocommit=True) as c, c.transaction():
        return [r[0] for r in c.execute(
            "SELECT switchboard.notify_user(%s, 'num', jsonb_build_object('n', g)) "
            "FROM generate_series(%s::int, %s::int) g ORDER BY g", (uid, first, first + n - 1)).fetchall()]


def _read_until_resumed(ws: WS, timeout: float = 60) -> tuple[list[dict], dict]:
    frames = []
    deadline = time.time() + timeout
    while True:
        f = ws.recv(timeout=max(0.1, deadline - time.time()))
        if f.get("event") == "resumed":
            return frames, f
        frames.append(f)


def _slow_reader_frames(ws: WS, frames: list[dict], every: int = 100, pause: float = 0.05) -> None:
    """Read like a slow client: a pause every `every` frames (the queue fills meanwhile)."""
    if len(frames) % every == 0:
        time.sleep(pause)


def test_resume_after_3000_missed_events_delivers_all_in_order(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "ann")
    srv = server_factory(env=ENV)
    tok = srv.login("ann")
    ws = srv.ws(tok)
    first = _publish(db, uid, 0, 1)[0]
    assert ws.recv(timeout=5)["id"] == first
    ws.close()
    ids = _publish(db, uid, 1, MISSED)                     # away for 3,000 events
    # reconnect once the relay has heard them all (hello's last_id), so no live frame
    # can come first: this is the action-resume path, which does not hold live frames back
    deadline = time.time() + 20
    while True:
        ws = srv.ws(tok)
        if ws.hello["payload"]["last_id"] >= ids[-1] or time.time() > deadline:
            break
        ws.close()
        time.sleep(0.2)
    ws.send({"action": "resume", "after": first})
    got: list[dict] = []
    deadline = time.time() + 60
    while True:
        f = ws.recv(timeout=max(0.1, deadline - time.time()))
        if f.get("event") == "resumed":
            break
        got.append(f)
        _slow_reader_frames(ws, got)
    replayed = [f for f in got if f.get("id") is not None]
    assert [f["id"] for f in replayed] == ids                # all of them, in order, once
    assert [f["payload"]["n"] for f in replayed] == list(range(1, MISSED + 1))
    assert not [f for f in got if f.get("event") == "resume_gap"]
    assert f["payload"]["replayed"] == MISSED
    # the socket is still open and live
    live = _publish(db, uid, MISSED + 1, 1)[0]
    assert ws.recv(timeout=5)["id"] == live
    ws.close()


def test_handshake_resume_streams_3000_with_live_events_interleaved(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "bob")
    srv = server_factory(env=ENV)
    tok = srv.login("bob")
    ids = _publish(db, uid, 0, MISSED)
    after = ids[99]                                          # saw the first 100

    # live events keep coming while the replay streams
    live_ids: list[int] = []
    stop = threading.Event()

    def live() -> None:
        n = MISSED
        while not stop.is_set() and n < MISSED + 200:
            live_ids.extend(_publish(db, uid, n, 5))
            n += 5
            time.sleep(0.01)
    th = threading.Thread(target=live)
    ticket = srv.ticket(tok)
    conn = connect(f"{srv.ws_base}/ws?ticket={ticket}&after={after}", open_timeout=10)
    hello = json.loads(conn.recv(timeout=10))
    assert hello["event"] == "hello"
    th.start()
    frames: list[dict] = []
    resumed = None
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            try:
                f = json.loads(conn.recv(timeout=3))
            except TimeoutError:
                if resumed is not None and not th.is_alive():
                    break                                # quiet: everything arrived
                continue
            if f.get("event") == "resumed":
                resumed = f
            elif f.get("id") is not None:
                frames.append(f)
                if len(frames) % 150 == 0:
                    time.sleep(0.05)                     # a slow reader
    finally:
        stop.set()
        th.join(30)
    conn.close()
    want = ids[100:] + live_ids
    got = [f["id"] for f in frames]
    assert resumed is not None
    assert got == sorted(got), "out of order"
    assert len(got) == len(set(got)), "duplicates"
    assert got == want, (len(got), len(want), sorted(set(want) - set(got))[:10])


def test_cursor_below_the_horizon_gets_resume_gap(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "cid")
    srv = server_factory(env=ENV)
    tok = srv.login("cid")
    old = _publish(db, uid, 0, 10)
    seal_event_partition(db)                           # their partition is full: reap_events may drop it
    tick_covering_everything(db)                       # a tick covers them (the relay's may not have yet)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.reap_events('0 seconds')")
        horizon = c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0]
    assert horizon >= old[-1]
    new = _publish(db, uid, 10, 5)
    ws = srv.ws(tok)
    ws.send({"action": "resume", "after": old[2]})
    frames, resumed = _read_until_resumed(ws)
    assert frames[0]["event"] == "resume_gap" and frames[0]["payload"]["horizon"] == horizon
    assert [f["id"] for f in frames[1:]] == new
    ws.close()
    # the same through the handshake
    conn = connect(f"{srv.ws_base}/ws?ticket={srv.ticket(tok)}&after={old[2]}", open_timeout=10)
    assert json.loads(conn.recv(timeout=5))["event"] == "hello"
    f = json.loads(conn.recv(timeout=5))
    assert f["event"] == "resume_gap", f
    conn.close()
