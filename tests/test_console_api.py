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
