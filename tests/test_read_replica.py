"""History reads on a real streaming replica (SWITCHBOARD_READ_DATABASE_URL; data/history.py).

A primary and a hot standby made with pg_basebackup (standby_kit.py), a real
`switchboard serve` reading history from the standby. Proven here: reads go to the
replica while it keeps up; a replica that stops replaying is skipped once it is
over the lag bound and the reads return what the primary has; a run created a
moment ago is never a 404; the console's run feed scans on the replica and sees
a job's running and succeeded states; a resume from far back, with a replica that has not
replayed the newest events, delivers every event once, in order (the replica's
part, then the primary's); a stopped replica is skipped without an error, and
used again once it is back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from switchboard.migrate import migrate

from harness import APP_LOGIN, WS, Server, app_url_for, auth, events_of, make_user
from standby_kit import PrimaryAndStandby

DB = "sb_read"


@pytest.fixture(scope="module")
def pair() -> Iterator[PrimaryAndStandby]:
    k = PrimaryAndStandby()
    try:
        with psycopg.connect(k.primary.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
            c.execute(f"CREATE DATABASE {DB}")
        migrate(k.primary.url(DB))
        with psycopg.connect(k.primary.url(), autocommit=True) as c:
            c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
        make_user(k.primary.url(DB), "admin", role="admin")
        make_user(k.primary.url(DB), "mia")
        k.start_standby()
        k.wait_replayed(DB)
        yield k
    finally:
        k.stop()


@pytest.fixture
def serve(pair: PrimaryAndStandby, tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []

    def start(max_lag: str) -> Server:
        s = Server(app_url_for(pair.primary.url(DB)), log_dir=tmp_path,
                   env={"SWITCHBOARD_READ_DATABASE_URL": app_url_for(pair.url(DB)),
                        "SWITCHBOARD_READ_MAX_LAG": max_lag}).start()
        started.append(s)
        return s
    yield start
    for s in started:
        s.terminate()


def metric(s: Server, name: str, **labels: str) -> float:
    text = httpx.get(s.base + "/metrics", timeout=30).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_for(pred: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def on_standby(pair: PrimaryAndStandby, sql: str) -> Any:
    with psycopg.connect(pair.url(DB), autocommit=True) as c:
        return c.execute(sql).fetchone()


def run_ids(s: Server, headers: dict[str, str]) -> list[int]:
    r = httpx.get(s.base + "/runs?limit=20", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return [run["id"] for run in r.json()["runs"]]


def enqueue(s: Server, headers: dict[str, str]) -> int:
    r = httpx.post(s.base + "/jobs", headers=headers, json={"handler": "noop"}, timeout=30)
    assert r.status_code == 201, r.text
    run_id = int(r.json()["run"]["id"])
    # read right after the write: never a stale 404 (a miss on the replica is read on the primary)
    got = httpx.get(f"{s.base}/runs/{run_id}", headers=headers, timeout=30)
    assert got.status_code == 200, got.text
    return run_id


def test_reads_go_to_the_replica_and_skip_it_once_it_stops_replaying(pair: PrimaryAndStandby, serve: Any) -> None:
    s = serve("1")
    admin = auth(s.login("admin"))
    first = enqueue(s, admin)
    pair.wait_replayed(DB)

    def from_replica() -> bool:
        return first in run_ids(s, admin) and metric(s, "switchboard_history_reads_total",
                                                     read="runs", served="replica") > 0
    wait_for(from_replica, "GET /runs never served by the healthy replica")

    on_standby(pair, "SELECT pg_wal_replay_pause()")
    try:
        fresh = enqueue(s, admin)
        # The paused standby does not have the new run; GET /runs shows it once the replica
        # is skipped (over the 1 s bound), read on the primary.
        wait_for(lambda: fresh in run_ids(s, admin), "GET /runs never showed the new run")
        assert on_standby(pair, f"SELECT count(*) FROM switchboard.task_runs WHERE id = {fresh}")[0] == 0
        # skipped for its lag (a sample that timed out on a loaded box would say unreachable
        # first; the next one that answers says lagging, and every read after it counts it)
        wait_for(lambda: run_ids(s, admin) and metric(s, "switchboard_read_fallbacks_total", reason="lagging") > 0
                 and metric(s, "switchboard_read_replica_lag_seconds") > 1, "the paused replica was not lagging")
        assert metric(s, "switchboard_read_replica_usable") == 0
    finally:
        on_standby(pair, "SELECT pg_wal_replay_resume()")
    pair.wait_replayed(DB)
    served = metric(s, "switchboard_history_reads_total", read="runs", served="replica")
    wait_for(lambda: run_ids(s, admin) and metric(s, "switchboard_history_reads_total", read="runs",
                                                  served="replica") > served,
             "the caught-up replica was not used again")


def test_the_run_feed_scans_on_the_replica_and_still_sees_every_state(pair: PrimaryAndStandby,
                                                                         serve: Any) -> None:
    """The console's run feed: its version scan runs on the standby (its windows follow the
    standby's replay time), and a job's queued, running and succeeded states all arrive."""
    s = serve("5")
    admin_token = s.login("admin")
    admin = auth(admin_token)
    wait_for(lambda: metric(s, "switchboard_read_replica_usable") == 1, "replica not in use")
    ws = WS(connect(f"{s.ws_base}/ws?ticket={s.ticket(admin_token)}&feeds=runs", open_timeout=10))
    try:
        assert ws.hello["payload"]["feeds"] == ["runs"]
        r = httpx.post(s.base + "/jobs", headers=admin, json={"handler": "sleep", "args": {"seconds": 2.5}},
                       timeout=30)
        assert r.status_code == 201, r.text
        run_id = r.json()["run"]["id"]
        seen: set[str] = set()

        def saw(f: dict) -> bool:
            if f["event"] == "run.updated":
                seen.update(run["status"] for run in f["payload"]["runs"] if run["id"] == run_id)
            return "succeeded" in seen
        ws.recv_until(saw, timeout=30)
        assert {"running", "succeeded"} <= seen
        assert metric(s, "switchboard_history_reads_total", read="runfeed", served="replica") > 0
    finally:
        ws.close()


def publish_ticked(url: str, user_id: str, first: int, n: int) -> list[int]:
    """n events to the user, each in a tick of its own (a long history of ticks)."""
    ids = []
    with psycopg.connect(url, autocommit=True) as c:
        for i in range(first, first + n):
            ids.append(c.execute("SELECT switchboard.notify_user(%s, 'n', jsonb_build_object('i', %s::int))",
                                 (user_id, i)).fetchone()[0])
            deadline = time.monotonic() + 30
            while c.execute("SELECT switchboard.event_tick()").fetchone()[0] < 0:
                assert time.monotonic() < deadline, "the ticker row stayed held"
                time.sleep(0.01)
    return ids


def resumed_frames(s: Server, user: str, after: int, timeout: float) -> list[dict]:
    """A socket of ``user`` resuming after event ``after``: every frame before "resumed"."""
    ws = WS(connect(f"{s.ws_base}/ws?ticket={s.ticket(s.login(user))}&after={after}", open_timeout=10))
    frames = []
    try:
        while (f := ws.recv(timeout=timeout))["event"] != "resumed":
            frames.append(f)
    finally:
        ws.close()
    return frames


def test_a_resume_from_far_back_with_a_lagging_replica_misses_nothing(pair: PrimaryAndStandby,
                                                                       serve: Any) -> None:
    s = serve("60")      # a replica seconds behind stays in use: its part, then the primary's
    url = pair.primary.url(DB)
    with psycopg.connect(url) as c:
        mia = str(c.execute("SELECT id FROM switchboard.users WHERE username = 'mia'").fetchone()[0])
    ids = publish_ticked(url, mia, 0, 60)
    pair.wait_replayed(DB)
    on_standby(pair, "SELECT pg_wal_replay_pause()")
    try:
        ids += publish_ticked(url, mia, 60, 40)
        replica_tick = on_standby(pair, "SELECT last_tick FROM switchboard.event_window()")[0]
        with psycopg.connect(url) as c:
            primary_tick = c.execute("SELECT last_tick FROM switchboard.event_window()").fetchone()[0]
        assert primary_tick - replica_tick >= 40      # the replica really lacks the newest 40
        wait_for(lambda: metric(s, "switchboard_read_replica_usable") == 1, "replica not in use")
        frames = resumed_frames(s, "mia", ids[0], timeout=15)
        got = [f["payload"]["i"] for f in events_of(frames) if f["event"] == "n"]
        assert got == list(range(1, 100))
        assert [f["id"] for f in events_of(frames)] == ids[1:]
        assert metric(s, "switchboard_history_reads_total", read="resume", served="replica") >= 1
    finally:
        on_standby(pair, "SELECT pg_wal_replay_resume()")


def test_a_read_stuck_behind_a_lock_replay_holds_goes_to_the_primary(pair: PrimaryAndStandby,
                                                                      serve: Any) -> None:
    """A standby replays the primary's ACCESS EXCLUSIVE locks (partition upkeep, a VACUUM
    truncating a table) and holds each until it replays the end of its transaction. With
    replay paused in between, a read there would wait as long as replay does: it gives up
    after lock_timeout and the primary continues the resume, every event once, in order
    (a local CI run hung here for good before)."""
    s = serve("60")      # the replica stays "in use": only the read itself can notice
    url = pair.primary.url(DB)
    with psycopg.connect(url) as c:
        mia = str(c.execute("SELECT id FROM switchboard.users WHERE username = 'mia'").fetchone()[0])
    ids = publish_ticked(url, mia, 0, 30)
    pair.wait_replayed(DB)
    with psycopg.connect(url) as locker:
        locker.execute("LOCK TABLE switchboard.events IN ACCESS EXCLUSIVE MODE")
        pair.wait_replayed(DB)                       # the standby holds the lock now
        on_standby(pair, "SELECT pg_wal_replay_pause()")
        locker.commit()                              # released here, not on the paused standby
    try:
        ids += publish_ticked(url, mia, 30, 30)
        wait_for(lambda: metric(s, "switchboard_read_replica_usable") == 1, "replica not in use")
        before = metric(s, "switchboard_read_fallbacks_total", reason="error")
        frames = resumed_frames(s, "mia", ids[0], timeout=30)
        assert [f["id"] for f in events_of(frames)] == ids[1:]
        assert metric(s, "switchboard_read_fallbacks_total", reason="error") > before
        assert "Traceback" not in s.log()
    finally:
        on_standby(pair, "SELECT pg_wal_replay_resume()")


def test_an_unreachable_replica_is_skipped_without_errors(pair: PrimaryAndStandby, serve: Any) -> None:
    s = serve("1")
    admin = auth(s.login("admin"))
    wait_for(lambda: metric(s, "switchboard_read_replica_usable") == 1, "replica not in use")
    pair.stop_standby()
    try:
        for _ in range(5):            # before and after the watch notices: never an error
            fresh = enqueue(s, admin)
            assert fresh in run_ids(s, admin)
        wait_for(lambda: metric(s, "switchboard_read_fallbacks_total", reason="unreachable") > 0,
                 "the stopped replica was not seen as unreachable")
        assert metric(s, "switchboard_read_replica_usable") == 0
        assert httpx.get(s.base + "/healthz/ready", timeout=30).status_code == 200
        assert "Traceback" not in s.log()
    finally:
        pair.start_standby()
    # back: the replica is used again (its pool reconnects; nothing to restart)
    pair.wait_replayed(DB)
    served = metric(s, "switchboard_history_reads_total", read="runs", served="replica")
    wait_for(lambda: run_ids(s, admin) and metric(s, "switchboard_history_reads_total", read="runs",
                                                  served="replica") > served,
             "the restarted replica was not used again")
