"""The two reads /console adds (GET /console/cron-next, GET /console/live), on a real replica."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import httpx

from harness import auth, make_user


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts)


def test_cron_next_previews_what_the_scheduler_computes(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    srv = server_factory()
    h = auth(srv.login("admin"))

    def preview(**params: str) -> httpx.Response:
        return httpx.get(srv.base + "/console/cron-next", params=params, headers=h, timeout=10)

    r = preview(schedule="0 3 * * *", timezone="Europe/Paris")
    assert r.status_code == 200, r.text
    fires = [parse(t) for t in r.json()["next"]]
    assert len(fires) == 5
    assert all(f.astimezone(ZoneInfo("Europe/Paris")).hour == 3 for f in fires)
    assert all(b - a == timedelta(days=1) for a, b in zip(fires, fires[1:]) if a.utcoffset() == b.utcoffset())
    assert fires == sorted(fires) and fires[0] > datetime.now(fires[0].tzinfo)

    r = preview(schedule="@every 30 seconds", count="3")
    every = [parse(t) for t in r.json()["next"]]
    steps = [b - a for a, b in zip(every, every[1:])]
    assert steps == [timedelta(seconds=30)] * 2

    for bad in ({"schedule": "61 * * * *"}, {"schedule": "0 3 * * *", "timezone": "Mars/Olympus"},
                {"schedule": ""}, {"schedule": "x" * 300}):
        r = preview(**bad)
        assert r.status_code == 422, (bad, r.text)
    assert preview(schedule="@hourly", count="21").status_code in (400, 422)
    # Whatever an editor types mid-word is a client error, never a 500.
    for odd in ("@every 0 seconds", "@every -1 seconds", "* * * * * * *", "@", "*/0 * * * *",
                "0 3 * * *\u00e9", "@every 99999999999999 seconds", "1-2-3 * * * *"):
        assert preview(schedule=odd).status_code in (200, 422), odd
    assert preview(schedule="@hourly", timezone="").json()["timezone"] == "UTC"


def test_live_lists_sockets_users_per_replica_and_rooms(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    alice = make_user(db, "alice")
    s1, s2 = server_factory(name="l1"), server_factory(name="l2")
    admin = s1.login("admin")
    assert httpx.put(f"{s1.base}/rooms/ops/members/{alice}", headers=auth(admin), timeout=10).status_code == 204
    ws = s2.ws(s2.login("alice"))
    try:
        s2_id = httpx.get(s2.base + "/me", headers=auth(admin), timeout=10).json()["replica"]
        deadline = time.monotonic() + 20
        while True:
            live = httpx.get(s1.base + "/console/live", headers=auth(admin), timeout=10).json()
            by_id = {r["id"]: r for r in live["replicas"]}
            if by_id.get(s2_id, {}).get("users_online") == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(by_id) == 2
        assert by_id[s2_id]["sockets"] == 1 and by_id[s2_id]["users"] == ["alice"], by_id
        assert live["rooms"] == [{"name": "ops", "members": 1, "online": 1}]
    finally:
        ws.close()


def test_run_feed_pushes_claims_and_finishes_to_admin_sockets_only(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    """The admin run feed (runfeed.py): a claim and a finish made by ANOTHER replica's
    scheduler reach an admin socket subscribed with feeds=runs as run.updated frames
    (id null, not stored); a member asking for the feed is refused, in the handshake
    and with the subscribe action, and receives none of them."""
    from websockets.sync.client import connect

    from harness import WS

    make_user(db, "admin", role="admin")
    make_user(db, "mallory")
    watcher = server_factory(name="feed-watch", env={"SWITCHBOARD_SCHEDULER": "off"})  # claims nothing
    worker = server_factory(name="feed-work")                                          # claims it all
    admin = watcher.login("admin")
    member = watcher.login("mallory")

    def ws(token: str, query: str) -> WS:
        return WS(connect(f"{watcher.ws_base}/ws?ticket={watcher.ticket(token)}{query}", open_timeout=10))

    a = ws(admin, "&feeds=runs")
    m = ws(member, "&feeds=runs")
    plain = ws(admin, "")          # an admin socket that did not ask: no feed frames either
    try:
        assert a.hello["payload"]["feeds"] == ["runs"]
        assert m.hello["payload"]["feeds"] == []
        refused = m.recv_until(lambda f: f["event"] == "error")
        assert refused["payload"]["code"] == "forbidden" and refused["payload"]["action"] == "subscribe"
        m.send({"action": "subscribe", "feed": "runs"})
        again = m.recv_until(lambda f: f["event"] == "error")
        assert again["payload"]["code"] == "forbidden"
        m.send({"action": "subscribe", "feed": "nope"})
        assert m.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "bad_feed"

        r = httpx.post(f"{watcher.base}/tasks", headers=auth(admin), timeout=10,
                       json={"name": "feed-sleep", "handler": "sleep", "args": {"seconds": 2.5}})
        assert r.status_code == 201, r.text
        task_id = r.json()["id"]
        assert httpx.post(f"{watcher.base}/tasks/{task_id}/trigger", headers=auth(admin),
                          timeout=10).status_code == 202

        states: dict[str, dict] = {}

        def saw(status: str):  # type: ignore[no-untyped-def]
            def pred(f: dict) -> bool:
                if f["event"] != "run.updated":
                    return False
                assert f["id"] is None and f["room"] is None, f     # not a stored event
                assert f["payload"]["feed"] == "runs" and len(f["payload"]["runs"]) <= 100, f
                for run in f["payload"]["runs"]:
                    if run["task_id"] == task_id:
                        states[run["status"]] = run
                return status in states
            return pred

        a.recv_until(saw("running"), timeout=30)
        a.recv_until(saw("succeeded"), timeout=30)
        worker_id = httpx.get(worker.base + "/me", headers=auth(admin), timeout=10).json()["replica"]
        assert states["running"]["worker"] == worker_id          # the other replica claimed it
        assert states["succeeded"]["id"] == states["running"]["id"]
        assert "args" not in states["succeeded"] and "result" not in states["succeeded"]

        # The feed's metrics: the watcher polls for its one subscriber and counts what it
        # offered; the worker, with no admin subscribed, runs no feed at all.
        from test_metrics import scrape, total
        mw, mk = scrape(watcher.base), scrape(worker.base)
        assert total(mw["switchboard_runfeed_subscribers"], "switchboard_runfeed_subscribers") == 1
        assert total(mw["switchboard_runfeed_polls_total"], "switchboard_runfeed_polls_total", outcome="ok") >= 2
        assert total(mw["switchboard_runfeed_frames_total"], "switchboard_runfeed_frames_total") >= 2
        assert total(mk["switchboard_runfeed_subscribers"], "switchboard_runfeed_subscribers") == 0
        assert total(mk.get("switchboard_runfeed_polls_total", []), "switchboard_runfeed_polls_total") == 0

        # The member and the admin socket that did not subscribe heard nothing of it.
        for other in (m, plain):
            frames = other.drain(quiet=1.5)
            assert [f for f in frames if f["event"] == "run.updated"] == [], frames

        # Unsubscribing stops the frames; the answer lists the socket's feeds.
        a.send({"action": "unsubscribe", "feed": "runs"})
        assert a.recv_until(lambda f: f["event"] == "subscribed")["payload"] == {"feeds": []}
        a.drain(quiet=1.5)
        assert httpx.post(f"{watcher.base}/tasks/{task_id}/trigger", headers=auth(admin),
                          timeout=10).status_code == 202
        assert [f for f in a.drain(quiet=3) if f["event"] == "run.updated"] == []
        a.send({"action": "subscribe", "feed": "runs"})
        assert a.recv_until(lambda f: f["event"] == "subscribed")["payload"] == {"feeds": ["runs"]}
    finally:
        for w in (a, m, plain):
            w.close()
