"""One slow socket never holds a replica hostage (the relay's isolation), on real replicas.

Each test is an attack an ordinary member account can make (or a phone in a tunnel
makes without meaning harm), with the LISTEN connection dropped the way a failover
or a network blip drops it (pg_terminate_backend), and the replica paused with
SIGSTOP so that what happens "meanwhile" is deterministic, not timed:

1. sockets that never read, full during a reconnect's catch-up, while another
   user's events, a disable_user and a demotion must take effect on that replica;
2. a relay held behind the retention window: every socket gets resume_gap, nothing
   is skipped silently;
3. ids sent live whose rows were reaped before the read: the live path's
   bookkeeping returns to nothing and live delivery goes on;
4. a socket closed for overflow is unregistered at once, its memory returned, and
   it no longer counts against its user's socket cap.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

from harness import Server, auth, make_user, seal_event_partition, tick_covering_everything

pytestmark = pytest.mark.ha


def _sql(db: str, q: str, *args: Any) -> Any:
    with psycopg.connect(db, autocommit=True) as c:
        row = c.execute(q, args).fetchone()
        return row[0] if row else None


def _publish_many(db: str, uid: str, n: int, size: int, event: str = "flood") -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pad = "x" * size
        for i in range(n):
            c.execute("SELECT switchboard.notify_user(%s, %s, %s)", (uid, event, json.dumps({"i": i, "pad": pad})))


def _metric(s: Server, name: str) -> float:
    text = httpx.get(s.base + "/metrics", timeout=10).text
    return sum(float(m.group(2)) for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", text, flags=re.M))


def _until(pred: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def stuck_socket(s: Server, token: str) -> socket.socket:
    """A WebSocket whose client never reads a byte after the handshake (tiny receive
    buffer): the server's writes to it block as soon as the kernel buffers are full."""
    ticket = s.ticket(token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", s.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws?ticket={ticket} HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:          # exactly the response headers, then never again
        b = sock.recv(1)
        assert b, "closed during the handshake"
        head += b
    assert b" 101 " in head.split(b"\r\n")[0], head
    return sock


class Paused:
    """The replica stopped (SIGSTOP) with its LISTEN connection terminated meanwhile, as a
    network blip does; what the test does inside happens while it hears nothing."""

    def __init__(self, s: Server, db: str, drop_listen: bool = True) -> None:
        self.s, self.db, self.drop = s, db, drop_listen

    def __enter__(self) -> "Paused":
        os.kill(self.s.pid, signal.SIGSTOP)
        if self.drop:
            n = _sql(self.db, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE application_name = 'switchboard-listen'")
            assert n >= 1
        return self

    def __exit__(self, *exc: Any) -> None:
        os.kill(self.s.pid, signal.SIGCONT)


def test_sockets_full_during_a_catch_up_hold_nothing_else_back(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    # A long stall bound: a relay that waited on each full socket in turn would hold the
    # position for 10 x 120 s; every bound below is a fraction of ONE such wait.
    s = server_factory(env={"SWITCHBOARD_WS_QUEUE_SIZE": "50", "SWITCHBOARD_WS_REPLAY_STALL_SECONDS": "120"},
                       name="isolated")
    _sql(db, "SELECT switchboard.event_live_path(true)")
    mallory = make_user(db, "mallory")
    carol = make_user(db, "carol")
    bob = make_user(db, "bob")
    dana = make_user(db, "dana", role="admin")
    m_tok, c_tok, b_tok, d_tok = (s.login(u) for u in ("mallory", "carol", "bob", "dana"))
    stuck = [stuck_socket(s, m_tok) for _ in range(10)]
    carol_ws = s.ws(c_tok)
    bob_ws = s.ws(b_tok)
    assert httpx.get(s.base + "/runs", headers=auth(d_tok), timeout=10).status_code == 200
    try:
        with Paused(s, db):
            # What the replica must catch up on after the blip: far more than the 50-frame
            # queues (and the kernel buffers) of mallory's sockets hold.
            _publish_many(db, mallory, 300, 60000)
        # The catch-up is under way (or about to be): everything else must go on.
        _until(lambda: _metric(s, "switchboard_ws_behind_total") >= 1, 60, "the catch-up found a full socket")
        t0 = time.monotonic()
        for i in range(75):
            _sql(db, "SELECT switchboard.notify_user(%s, 'hello', %s)", carol, json.dumps({"i": i}))
        _sql(db, "SELECT switchboard.disable_user(%s)", bob)
        _sql(db, "SELECT switchboard.set_user_role(%s, 'member')", dana)
        got: list[int] = []
        while len(got) < 75:
            f = carol_ws.recv(timeout=30)
            if f.get("event") == "hello":
                got.append(f["payload"]["i"])
        assert got == list(range(75))
        bob_closed = None
        try:
            while True:
                bob_ws.recv(timeout=30)
        except Exception as exc:   # websockets ConnectionClosed
            bob_closed = getattr(getattr(exc, "rcvd", None), "code", None)
        assert bob_closed == 1008, bob_closed
        _until(lambda: httpx.get(s.base + "/me", headers=auth(b_tok), timeout=10).status_code == 401, 30,
               "the disabled user's token refused on this replica")
        _until(lambda: httpx.get(s.base + "/runs", headers=auth(d_tok), timeout=10).status_code in (401, 403), 30,
               "the demoted admin refused on this replica")
        took = time.monotonic() - t0
        # One wait on one full socket would be 120 s: all of the above within a fraction of it.
        assert took < 60, took
    finally:
        for sock in stuck:
            sock.close()


@pytest.mark.parametrize("live", [False, True], ids=["read-path", "live-path"])
def test_a_relay_behind_retention_sends_resume_gap_never_skips_silently(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                                        live: bool) -> None:
    s = server_factory(env={"SWITCHBOARD_LIVE_UNCONFIRMED_TTL": "2"}, name="behind")
    _sql(db, "SELECT switchboard.event_live_path(%s)", live)
    dave = make_user(db, "dave")
    ws = s.ws(s.login("dave"))
    _sql(db, "SELECT switchboard.notify_user(%s, 'before', '{}')", dave)
    ws.recv_until(lambda f: f.get("event") == "before")
    with Paused(s, db, drop_listen=False):
        # Published, ticked and reaped while this replica read nothing: its position is
        # now below the retained window (another replica ticked; the reaper ran).
        _publish_many(db, dave, 20, 10, event="reaped")
        seal_event_partition(db)          # their partition is full: reap_events may drop it
        tick_covering_everything(db)
        time.sleep(0.05)
        assert _sql(db, "SELECT switchboard.reap_events('0 seconds')") >= 20
        _publish_many(db, dave, 5, 10, event="after")
    frames: list[dict[str, Any]] = []
    while not ("resume_gap" in [f.get("event") for f in frames]
               and sum(1 for f in frames if f.get("event") == "after") == 5):
        frames.append(ws.recv(timeout=30))
    kinds = [f["event"] for f in frames]
    gap = frames[kinds.index("resume_gap")]
    assert gap["payload"]["cursor"] and gap["payload"]["horizon"] >= 1
    assert _metric(s, "switchboard_relay_gaps_total") >= 1
    if not live:
        # The read path: the reaped events never arrive, and the gap says so before
        # anything after it.
        assert "reaped" not in kinds and kinds.index("resume_gap") < kinds.index("after"), kinds
        return
    # The live path sent the reaped events ahead of any read; their ids are never
    # confirmed by one. They leave the live path's bookkeeping after the TTL, and live
    # delivery goes on.
    _until(lambda: _metric(s, "switchboard_live_unconfirmed") == 0, 30, "unconfirmed ids dropped")
    held = psycopg.connect(db)
    held.execute("SELECT 1 FROM switchboard.event_ticker WHERE singleton FOR UPDATE")
    try:
        # No tick can be recorded: only the live path can deliver this.
        _sql(db, "SELECT switchboard.notify_user(%s, 'live', '{}')", dave)
        f = ws.recv_until(lambda f: f.get("event") == "live", timeout=30)
        assert f["id"] is not None
    finally:
        held.rollback()
        held.close()
    # and once read, the socket's cursor names nothing that can no longer be confirmed
    _until(lambda: _metric(s, "switchboard_live_unconfirmed") == 0, 30, "the live frame confirmed")
    ws.send({"action": "resume", "cursor": f["cursor"]})
    r = ws.recv_until(lambda f: f.get("event") == "resumed")
    assert r["payload"]["replayed"] == 0 and r["cursor"].startswith("v1."), r


def test_a_socket_closed_for_overflow_is_unregistered_and_its_memory_returned(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    s = server_factory(env={"SWITCHBOARD_WS_QUEUE_SIZE": "1000"}, name="overflow")
    erin = make_user(db, "erin")
    tok = s.login("erin")
    watcher = s.ws(tok)                 # one socket that reads: it gets everything
    time.sleep(1.5)
    rss0 = s.rss_kib()
    stuck = [stuck_socket(s, tok) for _ in range(7)]
    _until(lambda: _metric(s, "switchboard_websockets_open") == 8, 20, "8 sockets registered")
    try:
        # 60 x 1 MiB payloads: each stuck socket's queue passes its 16 MiB byte bound
        # long before its 1,000-frame bound.
        with psycopg.connect(db, autocommit=True) as c:
            for i in range(60):
                c.execute("SELECT switchboard.notify_user(%s, 'big', %s)",
                          (erin, json.dumps({"i": i, "pad": "y" * 1_000_000})))
                watcher.recv_until(lambda f: f.get("event") == "big", timeout=30)
        _until(lambda: _metric(s, "switchboard_websockets_open") == 1, 30, "the overflowed sockets unregistered")
        assert _metric(s, "switchboard_ws_queued_bytes") < 2_000_000
        closed = _metric(s, 'switchboard_ws_closed_total{code="1013"}')
        assert closed >= 7 or _metric(s, "switchboard_ws_closed_total") >= 7
        # The cap counts live sockets only: 9 more for erin are accepted (10 per user).
        more = [s.ws(tok) for _ in range(9)]
        for w in more:
            w.close()
        # Memory returned: not the ~7 x 16 MiB the queues held.
        _until(lambda: s.rss_kib() < rss0 + 48 * 1024, 20,
               f"RSS back within 48 MiB of {rss0} KiB (now {s.rss_kib()} KiB)")
    finally:
        for sock in stuck:
            sock.close()
