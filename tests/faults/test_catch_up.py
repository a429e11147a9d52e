"""The relay's own catch-up after its LISTEN connection comes back.

One replica whose LISTEN connection goes through a fault proxy on loopback
(the pool does not): the proxy resets and then refuses it, so the relay is
deaf while events are published; then it heals. With a 100-slot send queue,
the catch-up must stream 1,500+ events per socket without a 1013, in order,
with no gap and no duplicate; it must re-check room membership that changed
while it was deaf (the removal notice was missed too); and when events were
reaped past a socket's cursor meanwhile, that socket gets resume_gap.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import psycopg
import pytest
from faultnet import via
from faultproxy import FaultProxy
from hakit import app_url_for, wait_until
from harness import make_user, seal_event_partition

pytestmark = pytest.mark.faults


def _publish(db: str, sql: str, params: tuple) -> list[int]:
    with psycopg.connect(db, autocommit=True) as c, c.transaction():
        return [r[0] for r in c.execute(sql, params).fetchall()]


def _ready(s) -> int:  # type: ignore[no-untyped-def]
    import httpx
    try:
        return httpx.get(s.base + "/healthz/ready", timeout=3).status_code
    except httpx.HTTPError:
        return 0


def test_catch_up_after_listen_outage_streams_in_order_and_rechecks_membership(
        db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    u = urlsplit(db)
    px = FaultProxy((u.hostname or "127.0.0.1", u.port or 5432), name="listen").start()
    try:
        ann, bob = make_user(db, "ann"), make_user(db, "bob")
        with psycopg.connect(db, autocommit=True) as c:
            for uid in (ann, bob):
                c.execute("SELECT switchboard.add_room_member('ops', %s)", (uid,))
        s = server_factory(env={"SWITCHBOARD_LISTEN_DATABASE_URL": via(app_url_for(db), "127.0.0.1", px.port),
                                "SWITCHBOARD_WS_QUEUE_SIZE": "100", "SWITCHBOARD_WS_DEAF_CLOSE_SECONDS": "120"})
        wa, wb = s.ws(s.login("ann")), s.ws(s.login("bob"))
        assert wa.join("ops")["event"] == "joined" and wb.join("ops")["event"] == "joined"
        first = _publish(db, "SELECT switchboard.notify_user(%s, 'x', '{}')", (ann,))[0]
        assert wa.recv_until(lambda f: f.get("id") == first)["id"] == first

        # deaf: the LISTEN connection is reset and cannot come back
        px.set(refuse=True)
        px.reset_all()
        assert wait_until(lambda: _ready(s) == 503, 10)
        mine = _publish(db, "SELECT switchboard.notify_user(%s, 'n', jsonb_build_object('n', g)) "
                            "FROM generate_series(1, 1500) g ORDER BY g", (ann,))
        room1 = _publish(db, "SELECT switchboard.notify_room('ops', 'r', jsonb_build_object('n', g)) "
                             "FROM generate_series(1, 300) g ORDER BY g", ())
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("SELECT switchboard.remove_room_member('ops', %s)", (bob,))
        room2 = _publish(db, "SELECT switchboard.notify_room('ops', 'r', jsonb_build_object('n', g)) "
                             "FROM generate_series(301, 400) g ORDER BY g", ())
        time.sleep(0.5)
        assert wa.drain(0.3) == [] and wb.drain(0.3) == []    # really deaf

        t0 = time.monotonic()
        px.clear()
        assert wait_until(lambda: _ready(s) == 200, 30), s.log()
        want = sorted(mine + room1 + room2)
        got: list[int] = []
        deadline = time.time() + 30
        while len(got) < len(want) and time.time() < deadline:
            f = wa.recv(timeout=5)
            if f.get("id") is not None:
                got.append(f["id"])
                if len(got) % 100 == 0:
                    time.sleep(0.02)                          # a slowish reader: the queue fills
        took = time.monotonic() - t0
        print(f"\ncatch-up: {len(got)} events to ann through a 100-slot queue in {took:.2f} s "
              f"after the heal", flush=True)
        assert got == want                                    # all, in order, once, no 1013
        bob_ids = [f["id"] for f in wb.drain(1.0) if f.get("id") is not None]
        assert not set(bob_ids) & set(room2), "bob was removed from ops while the relay was deaf"
        assert wa.drain(0.5) == []                            # nothing twice

        # events reaped past the sockets' cursors while deaf: resume_gap first
        px.set(refuse=True)
        px.reset_all()
        assert wait_until(lambda: _ready(s) == 503, 10)
        lost = _publish(db, "SELECT switchboard.notify_user(%s, 'n', '{}') FROM generate_series(1, 5)", (ann,))
        seal_event_partition(db)      # their partition is full: reap_events may drop it (V0037)
        with psycopg.connect(db, autocommit=True) as c:
            # The deaf relay ticks nothing; a tick must cover them before they can be reaped
            # (retention counts from the tick that made an event visible).
            c.execute("SELECT switchboard.event_tick()")
            c.execute("SELECT switchboard.reap_events('0 seconds')")
            horizon = c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0]
        assert horizon >= lost[-1]
        kept = _publish(db, "SELECT switchboard.notify_user(%s, 'n', '{}') FROM generate_series(1, 3)", (ann,))
        px.clear()
        assert wait_until(lambda: _ready(s) == 200, 30)
        gap = wa.recv_until(lambda f: f["event"] == "resume_gap", timeout=10)
        assert gap["payload"]["horizon"] == horizon
        after = [f["id"] for f in wa.drain(1.0) if f.get("id") is not None]
        assert after == kept
        wa.close()
        wb.close()
    finally:
        px.stop()
