"""What a replica concludes about its PostgreSQL, without Patroni (tests/pgha has the real failovers).

One standalone PostgreSQL of its own, one replica:
- a clean restart (fast shutdown, start) keeps the UNLOGGED state: restarts +1, no reset;
- a crash (kill -9 of the postmaster, crash recovery) empties it: restarts +1, UNLOGGED
  reset +1, a pre-crash ticket is refused, a waiting tool call fails fast with 503;
- neither is a promotion: the timeline stays, failovers 0;
- a replica on a schema without db_instance() (an older release, --no-migrate) still
  becomes ready: the watch only observes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from harness import Server, auth, make_user
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

COUNTERS = ("switchboard_db_failovers_total", "switchboard_db_restarts_total",
            "switchboard_db_unlogged_resets_total", "switchboard_db_timeline")


@pytest.fixture
def own_pg() -> Iterator:  # type: ignore[type-arg]
    from switchboard.migrate import migrate
    from switchboard.pgtest import ThrowawayPostgres

    pg = ThrowawayPostgres()
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("CREATE DATABASE sb")
    migrate(pg.url("sb"))
    yield pg
    pg.stop()


def _metrics(s: Server) -> dict[str, float]:
    out = {}
    for line in httpx.get(s.base + "/metrics", timeout=5).text.splitlines():
        name, _, val = line.partition(" ")
        if name in COUNTERS:
            out[name] = float(val)
    return out


def _wait(pred, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def _ready(s: Server) -> int:
    try:
        return httpx.get(s.base + "/healthz/ready", timeout=5).status_code
    except httpx.HTTPError:
        return -1


def _ticket_accepted(s: Server, ticket: str) -> bool:
    try:
        with connect(f"{s.ws_base}/ws?ticket={ticket}", open_timeout=5) as c:
            c.recv(timeout=5)
            return True
    except InvalidStatus:
        return False


def _bounce(s: Server, restart) -> None:  # type: ignore[no-untyped-def]
    """Restart PostgreSQL; return once the replica has seen the new server and is ready."""
    before = _metrics(s)["switchboard_db_restarts_total"]
    restart()
    assert _wait(lambda: _metrics(s)["switchboard_db_restarts_total"] > before, 30), s.log()
    assert _wait(lambda: _ready(s) == 200, 30), s.log()


def test_clean_restart_keeps_unlogged_state_and_a_crash_resets_it(own_pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = own_pg.url("sb")
    make_user(url, "admin", role="admin")
    uid = make_user(url, "tab")
    s = Server(url, log_dir=tmp_path, env={"SWITCHBOARD_TICKET_TTL": "300", "SWITCHBOARD_POOL_TIMEOUT": "2"}).start()
    try:
        admin = s.login("admin")
        tab = s.login("tab")
        base = _metrics(s)
        assert base == {"switchboard_db_failovers_total": 0.0, "switchboard_db_restarts_total": 0.0,
                        "switchboard_db_unlogged_resets_total": 0.0, "switchboard_db_timeline": 1.0}, base

        # 1. clean restart: UNLOGGED tables survive a shutdown checkpoint
        kept = s.ticket(tab)
        _bounce(s, lambda: (own_pg.stop_server(), own_pg.start_server()))
        m = _metrics(s)
        assert m["switchboard_db_restarts_total"] == 1 and m["switchboard_db_unlogged_resets_total"] == 0, m
        assert _ticket_accepted(s, kept)

        # 2. crash: crash recovery resets every UNLOGGED table
        lost = s.ticket(tab)
        ws = s.ws(tab)                                  # the browser that will never answer
        call: dict = {}

        def tool_call() -> None:
            t0 = time.monotonic()
            r = httpx.post(s.base + "/tools/call", headers=auth(admin), timeout=90,
                           json={"user_id": uid, "name": "probe", "timeout_ms": 60000})
            call.update(status=r.status_code, body=r.text, seconds=time.monotonic() - t0)
        th = threading.Thread(target=tool_call)
        th.start()
        time.sleep(0.5)                                 # registered and waiting

        def crash() -> None:
            own_pg.kill_server()
            time.sleep(1)                               # backends notice the postmaster's death
            own_pg.start_server()
        t0 = time.monotonic()
        _bounce(s, crash)
        t_ready = time.monotonic() - t0
        th.join(90)
        m = _metrics(s)
        assert m == {"switchboard_db_failovers_total": 0.0, "switchboard_db_restarts_total": 2.0,
                     "switchboard_db_unlogged_resets_total": 1.0, "switchboard_db_timeline": 1.0}, m
        assert not _ticket_accepted(s, lost), "a ticket from before the crash must be refused"
        assert call["status"] == 503 and "was lost" in call["body"], call
        assert call["seconds"] < t_ready + 5, (call, t_ready)   # not the 60 s timeout
        print(f"\ncrash of a standalone PostgreSQL: replica ready again {t_ready:.1f}s after the kill; "
              f"waiting tool call answered 503 after {call['seconds']:.1f}s", flush=True)
        with psycopg.connect(url, autocommit=True) as c:
            st = dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())
            online = c.execute("SELECT switchboard.user_online(%s)", (uid,)).fetchone()[0]
        assert st["db_timeline"] == 1 and st["db_in_recovery"] == 0 and st["live_replicas"] == 1, st
        assert online, "presence rebuilt for the socket that stayed open"
        ws.close()
    finally:
        assert s.terminate() == 0


def test_replica_on_a_schema_without_db_instance_still_becomes_ready(db: str, app_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("DROP FUNCTION switchboard.db_instance()")
    s = Server(app_url, log_dir=tmp_path).start()      # start() waits for /healthz/ready 200
    try:
        assert "cannot tell whether PostgreSQL failed over" in s.log_path.read_text()
    finally:
        assert s.terminate() == 0
