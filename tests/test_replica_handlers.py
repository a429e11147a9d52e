"""Replicas register their handlers and heartbeat interval; the API and DBAs use both.

- POST /tasks and PATCH (changing the handler) refuse with 422 a handler that no
  live replica of this version runs, listing the known ones; SQL's create_task
  stays permissive.
- switchboard.handlers / status() show a handler that tasks need and nobody serves.
- Liveness follows each replica's own heartbeat interval (not a fixed 30 s):
  at SWITCHBOARD_HEARTBEAT_INTERVAL=60 a user stays online and /tools/call works
  between heartbeats.
"""

from __future__ import annotations

import threading
from datetime import timedelta
import time

import httpx
import psycopg
from harness import ROOT, auth, make_user
from pgtap import throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"


def _beat(c: psycopg.Connection, rid: str, handlers: list[str], interval: str = "5 seconds",
          version: str = "9.9.9") -> None:
    c.execute("SELECT switchboard.replica_heartbeat(%s, '{}', %s::text[], %s::interval, %s)",
              (rid, handlers, interval, version))


def test_known_handlers_and_the_handlers_view(conn: psycopg.Connection) -> None:
    conn.execute("UPDATE switchboard.tasks SET is_active = false")
    _beat(conn, "w1", ["noop", "mail.send"])
    _beat(conn, "w2", ["noop"], version="9.9.8")
    _beat(conn, "api", [])
    conn.execute("SELECT switchboard.create_task('digest', '@every 1 hour', 'report.build')")  # permissive
    conn.execute("SELECT switchboard.enqueue('mail.send')")
    assert [r[0] for r in conn.execute("SELECT switchboard.known_handlers('9.9.9')")] == ["mail.send", "noop"]
    assert [r[0] for r in conn.execute("SELECT switchboard.known_handlers('9.9.8')")] == ["noop"]
    assert [r[0] for r in conn.execute("SELECT switchboard.known_handlers()")] == ["mail.send", "noop"]
    rows = conn.execute("SELECT handler, served, live_replicas, versions, active_tasks, pending_runs "
                        "FROM switchboard.handlers ORDER BY handler").fetchall()
    assert rows == [("mail.send", True, 1, ["9.9.9"], 0, 1),
                    ("noop", True, 2, ["9.9.8", "9.9.9"], 0, 0),
                    ("report.build", False, 0, [], 1, 0)]
    status = dict(conn.execute("SELECT item, value FROM switchboard.status()").fetchall())
    assert status["handlers_unserved"] == 1
    # w1 dies: mail.send is now wanted by a queued run and served by nobody
    conn.execute("UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '1 minute' "
                 "WHERE id = 'w1'")
    assert [r[0] for r in conn.execute("SELECT switchboard.known_handlers('9.9.9')")] == []
    assert dict(conn.execute("SELECT item, value FROM switchboard.status()").fetchall())["handlers_unserved"] == 2


def test_replica_heartbeat_validates_its_arguments(conn: psycopg.Connection) -> None:
    sql = "SELECT switchboard.replica_heartbeat(%s, '{}', %s::text[], %s::interval, %s)"
    throws_ok(conn, sql, "22023", ("r", ["ok", "bad name!"], "5 seconds", "1"), match="bad name!")
    throws_ok(conn, sql, "22023", ("r", None, "5 seconds", "1"), match="handler list")
    throws_ok(conn, sql, "22023", ("r", [], "0 seconds", "1"), match="heartbeat interval")
    throws_ok(conn, sql, "22023", ("r", [], "2 hours", "1"), match="heartbeat interval")
    throws_ok(conn, sql, "22023", ("", [], "5 seconds", "1"), match="replica id")
    throws_ok(conn, sql, "22023", ("r", [], "5 seconds", "v" * 101), match="invalid version")


def test_liveness_window_follows_the_heartbeat_interval(conn: psycopg.Connection) -> None:
    u = conn.execute("SELECT switchboard.create_user('slowbeat', %s)", (ARGON,)).fetchone()[0]
    _beat(conn, "slow", ["noop"], interval="60 seconds")
    _beat(conn, "fast", ["noop"], interval="0.5 seconds")
    conn.execute("SELECT switchboard.presence_set('slow', %s, 1)", (u,))
    assert conn.execute("SELECT id, live_window FROM switchboard.replicas ORDER BY id").fetchall() == [
        ("fast", timedelta(seconds=30)),   # never below the old 30 s
        ("slow", timedelta(seconds=180))]  # three missed heartbeats
    # 100 s without a heartbeat is normal at a 60 s interval: still live, still online, not reaped
    conn.execute("UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '100 seconds'")
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is True
    assert [r[0] for r in conn.execute("SELECT id FROM switchboard.replicas")] == ["slow"]
    assert conn.execute("SELECT count(*) FROM switchboard.presence WHERE user_id = %s", (u,)).fetchone()[0] == 1
    assert conn.execute("SELECT switchboard.reap_replicas('30 seconds')").fetchone()[0] == 1  # only 'fast'
    # three missed heartbeats: offline, and reaped
    conn.execute("UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '200 seconds'")
    assert conn.execute("SELECT switchboard.user_online(%s)", (u,)).fetchone()[0] is False
    assert conn.execute("SELECT switchboard.reap_replicas('30 seconds')").fetchone()[0] == 1


def test_post_tasks_refuses_a_handler_no_replica_runs(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    worker = server_factory(env={"PYTHONPATH": f"{ROOT / 'server'}:{ROOT / 'bench'}",
                                 "SWITCHBOARD_HANDLERS": "bench_handlers"}, name="worker")
    api = server_factory(env={"SWITCHBOARD_SCHEDULER": "off"}, name="api")
    h = auth(api.login("admin"))
    # the API replica runs no handlers itself; the worker registered bench.mark with its heartbeat
    r = httpx.post(api.base + "/tasks", headers=h, json={"name": "m", "handler": "bench.mark"})
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    r = httpx.post(api.base + "/tasks", headers=h, json={"name": "x", "handler": "no.such.handler"})
    assert r.status_code == 422
    body = r.json()
    assert "no.such.handler" in body["description"] and "bench.mark" in body["description"]
    assert set(body["known_handlers"]) == {"bench.mark", "fail", "maintenance", "noop", "notify", "sleep", "sql"}
    r = httpx.patch(f"{api.base}/tasks/{tid}", headers=h, json={"handler": "nope"})
    assert r.status_code == 422 and r.json()["known_handlers"] == body["known_handlers"]
    assert httpx.patch(f"{api.base}/tasks/{tid}", headers=h, json={"handler": "noop"}).status_code == 200
    assert httpx.patch(f"{api.base}/tasks/{tid}", headers=h, json={"handler": "bench.mark"}).status_code == 200
    # the worker leaves (replica_stop): nobody serves bench.mark, and a DBA sees it
    assert worker.terminate() == 0
    r = httpx.post(api.base + "/tasks", headers=h, json={"name": "m2", "handler": "bench.mark"})
    assert r.status_code == 422 and r.json()["known_handlers"] == []
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT served, active_tasks FROM switchboard.handlers WHERE handler = 'bench.mark'"
                         ).fetchone() == (False, 1)
        status = dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())
    assert status["handlers_unserved"] == 2  # bench.mark and the default task's 'maintenance'


def test_long_heartbeat_interval_keeps_users_online(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    uid = make_user(db, "erin")
    s = server_factory(env={"SWITCHBOARD_HEARTBEAT_INTERVAL": "60"})
    h = auth(s.login("admin"))
    ws = s.ws(s.login("erin"))
    try:
        with psycopg.connect(db, autocommit=True) as c:
            deadline = time.time() + 10
            while not c.execute("SELECT switchboard.user_online(%s)", (uid,)).fetchone()[0]:
                assert time.time() < deadline
                time.sleep(0.05)
            assert c.execute("SELECT heartbeat_interval, live_window FROM switchboard.replica_registry"
                             ).fetchone() == (timedelta(seconds=60),
                                              timedelta(seconds=180))
            # 100 s after the last heartbeat -- normal at a 60 s interval (it was 30 s hard-coded)
            c.execute("UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '100 seconds'")
            assert c.execute("SELECT switchboard.maintenance(replica_stale => '30 seconds') ->> 'replicas'"
                             ).fetchone()[0] == "0"
        result: dict = {}

        def call() -> None:
            result["r"] = httpx.post(s.base + "/tools/call", headers=h, timeout=30,
                                     json={"user_id": uid, "name": "echo", "args": {"x": 1}, "timeout_ms": 5000})

        t = threading.Thread(target=call)
        t.start()
        f = ws.recv_until(lambda f: f["event"].startswith("tool.call."), timeout=10)
        ws.send({"action": "publish", "event": "tool.result." + f["event"].split(".", 2)[2], "payload": {"ok": 1}})
        t.join(30)
        assert result["r"].status_code == 200 and result["r"].json() == {"result": {"ok": 1}}
        assert httpx.put(s.base + "/rooms/lobby/members/" + uid, headers=h).status_code == 204
        members = httpx.get(s.base + "/rooms/lobby/members", headers=h).json()["members"]
        assert members == [{"user_id": uid, "username": "erin", "online": True}]
        # three heartbeats missed: offline, and /tools/call says so
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("UPDATE switchboard.replica_registry SET heartbeat_at = now() - interval '200 seconds'")
        assert httpx.post(s.base + "/tools/call", headers=h,
                          json={"user_id": uid, "name": "echo"}).status_code == 404
    finally:
        ws.close()
