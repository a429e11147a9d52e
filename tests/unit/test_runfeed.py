"""Unit tier: the admin run feed's bounds and lifecycle (runfeed.py), with a scripted
database (no PostgreSQL, no processes). The real-replica proof is
tests/test_console_api.py::test_run_feed_pushes_claims_and_finishes_to_admin_sockets_only."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from switchboard.data.history import HistoryReads
from switchboard.runfeed import RunFeed
from switchboard.sockets import Client

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class FakeDb:
    """Answers FEED_SQL (step 1: ids and row versions) with what the test put in
    ``self.answer``, and ROWS_SQL (step 2) with those runs."""

    def __init__(self) -> None:
        self.history = HistoryReads(self, None)   # no read replica: the version scan comes here too
        self.calls: list[dict[str, Any]] = []
        self.table: dict[int, dict] = {}
        self.answer: dict[str, Any] = self.row([])

    def row(self, runs: list[dict], now: datetime = T0, max_id: int = 0, **counts: Any) -> dict[str, Any]:
        self.table = {r["id"]: r for r in runs}
        ordered = sorted(runs, key=lambda r: -r["id"])
        r: dict[str, Any] = {"now": now, "max_id": max_id, "ids": [x["id"] for x in ordered],
                             # a row version per state, as xmin is
                             "versions": [hash((x["status"], x["started_at"], x["finished_at"])) for x in ordered]}
        for p in ("fresh", "claimed", "finished", "released"):
            r[f"{p}_n"] = counts.get(f"{p}_n", 0)
            r[f"{p}_min"] = counts.get(f"{p}_min")
        return r

    async def fetchone(self, sql: str, params: Any = None, timeout: float | None = None) -> dict[str, Any]:
        self.calls.append(params)
        if "unnest" in sql:
            assert len(params["ids"]) <= RunFeed.MAX_RUNS
            return {"runs": [self.table[i] for i in params["ids"]]}
        return self.answer


def sock(role: str = "admin") -> Client:
    return Client(uuid.uuid4(), "u", role, 100, (0, 0), lambda c: None)


def frames(c: Client) -> list[dict]:
    out = []
    while not c.queue.empty():
        text = c.queue.get_nowait()
        assert text is not None
        out.append(json.loads(text))
    return out


def run(i: int, status: str, error: str | None = None) -> dict:
    return {"id": i, "handler": "h", "status": status, "attempt": 1, "started_at": "s", "finished_at": None,
            "error": error}


def test_members_are_refused_and_nothing_polls_without_a_subscriber() -> None:
    async def main() -> None:
        db = FakeDb()
        feed = RunFeed(db, interval=0.01)  # type: ignore[arg-type]
        assert feed.subscribe(sock("member")) is False
        assert feed.subscribers == set() and feed._task is None
        await asyncio.sleep(0.05)
        assert db.calls == []
        a = sock()
        assert feed.subscribe(a) is True and feed.feeds_of(a) == ["runs"]
        for _ in range(100):
            if len(db.calls) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(db.calls) >= 2
        feed.unsubscribe(a)
        for _ in range(100):
            if feed._task is not None and feed._task.done():
                break
            await asyncio.sleep(0.01)
        assert feed._task is not None and feed._task.done(), "the poller stops with its last subscriber"
        n = len(db.calls)
        await asyncio.sleep(0.05)
        assert len(db.calls) == n
        # A socket that is closing (or was demoted) is dropped at the next poll.
        b = sock()
        feed.subscribe(b)
        b.closing = 1008
        for _ in range(100):
            if feed._task.done():
                break
            await asyncio.sleep(0.01)
        assert feed.subscribers == set() and feed._task.done()
        await feed.stop()
    asyncio.run(main())


def test_each_state_is_sent_once_and_members_never_get_frames() -> None:
    async def main() -> None:
        db = FakeDb()
        feed = RunFeed(db)  # type: ignore[arg-type]
        a, m = sock(), sock("member")
        feed.subscribers.add(a)
        feed.subscribe(m)
        db.answer = db.row([run(1, "running")], max_id=1)
        await feed.poll_once()
        db.answer = db.row([run(1, "running")], now=T0 + timedelta(seconds=1), max_id=1)
        await feed.poll_once()                         # the same state again (the look-back): not resent
        db.answer = db.row([dict(run(1, "succeeded"), finished_at="f")], now=T0 + timedelta(seconds=2), max_id=1)
        await feed.poll_once()
        got = frames(a)
        assert [[r["status"] for r in f["payload"]["runs"]] for f in got] == [["running"], ["succeeded"]]
        assert all(f["id"] is None and f["event"] == "run.updated" and f["payload"]["feed"] == "runs"
                   for f in got)
        assert frames(m) == []
        # Windows reach LOOKBACK s before the previous poll's now().
        polls = [c for c in db.calls if "since" in c]
        assert polls[-1]["since"] == T0 + timedelta(seconds=1) - timedelta(seconds=feed.LOOKBACK)
        assert polls[0]["floor"] is None and polls[1]["floor"] == 1
        # Full rows are read only for versions not sent yet: 3 polls, 2 new states, 2 reads.
        assert len([c for c in db.calls if "ids" in c]) == 2
        await feed.stop()
    asyncio.run(main())


def test_frames_are_bounded_and_say_when_runs_were_left_out() -> None:
    async def main() -> None:
        db = FakeDb()
        feed = RunFeed(db)  # type: ignore[arg-type]
        a = sock()
        feed.subscribers.add(a)
        await feed.poll_once()                          # the first poll sets the marks
        big = [run(i, "failed", "x" * feed.ERROR_CHARS) for i in range(feed.MAX_RUNS, 0, -1)]
        db.answer = db.row(big, now=T0 + timedelta(seconds=1), max_id=500,
                           finished_n=feed.MAX_RUNS, finished_min=T0 + timedelta(seconds=0.5))
        await feed.poll_once()
        (f,) = frames(a)
        assert f["payload"]["truncated"] is True        # the finished part hit its limit after the last poll
        assert len(f["payload"]["runs"]) <= feed.MAX_RUNS
        assert len(json.dumps(f)) <= feed.MAX_FRAME_BYTES
        # The four parts together can find more runs than a frame holds: the newest go, truncated.
        many = [run(i, "queued") for i in range(2000, 2000 - 3 * feed.MAX_RUNS, -1)]
        db.answer = db.row(many, now=T0 + timedelta(seconds=1.5), max_id=2000)
        await feed.poll_once()
        (f,) = frames(a)
        assert f["payload"]["truncated"] is True
        assert [r["id"] for r in f["payload"]["runs"]] == list(range(2000, 2000 - feed.MAX_RUNS, -1))
        # A limit hit only by rows older than the previous poll is the look-back: not a gap.
        db.answer = db.row([run(900, "queued")], now=T0 + timedelta(seconds=2), max_id=900,
                           finished_n=feed.MAX_RUNS, finished_min=T0 + timedelta(seconds=0.2))
        await feed.poll_once()
        (f,) = frames(a)
        assert f["payload"]["truncated"] is False
        # Memory of sent states is capped.
        for i in range(feed.SENT_MAX // feed.MAX_RUNS + 5):
            db.answer = db.row([run(10_000 + i * 1000 + k, "queued") for k in range(feed.MAX_RUNS)],
                               now=T0 + timedelta(seconds=3 + i), max_id=10_000 + i * 1000 + feed.MAX_RUNS)
            await feed.poll_once()
        assert len(feed._sent) <= feed.SENT_MAX
        await feed.stop()
    asyncio.run(main())
