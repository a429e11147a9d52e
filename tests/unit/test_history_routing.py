"""Unit tier: the history reads' routing and the lag arithmetic (data/history.py), and the run
feed moving between the replica and the primary (runfeed.py), with scripted databases. The
real-replica proof is tests/test_read_replica.py (a pg_basebackup standby)."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from switchboard.data.history import HistoryReads
from switchboard.runfeed import RunFeed

from test_runfeed import T0, FakeDb, frames, run, sock


class Side:
    """A database answering get_run/list_runs with what the test scripts."""

    def __init__(self, name: str, run_row: Any = None, exc: Exception | None = None) -> None:
        self.name = name
        self.run_row = run_row
        self.exc = exc
        self.calls = 0

    async def get_run(self, run_id: int) -> Any:
        self.calls += 1
        if self.exc is not None:
            raise self.exc
        return self.run_row

    async def list_runs(self, **kw: Any) -> list[Any]:
        self.calls += 1
        if self.exc is not None:
            raise self.exc
        return [self.name]


def routed(replica: Side, primary: Side, reason: str | None = None) -> tuple[HistoryReads, list[tuple[str, dict]]]:
    counted: list[tuple[str, dict]] = []
    h = HistoryReads(primary, "postgresql://nobody@127.0.0.1:1/none", max_lag=1.0,
                     count=lambda name, value, **labels: counted.append((name, labels)))
    h.replica = replica  # type: ignore[assignment]
    assert h.watch is not None
    h.watch.reason = reason
    return h, counted


def test_a_usable_replica_serves_and_every_other_state_falls_back_to_the_primary() -> None:
    async def main() -> None:
        h, counted = routed(Side("replica"), Side("primary"))
        assert await h.list_runs(limit=5) == ["replica"]
        assert counted[-1] == ("switchboard_history_reads_total", {"read": "runs", "served": "replica"})
        for reason in ("unknown", "lagging", "not_in_recovery", "unreachable"):
            h, counted = routed(Side("replica"), Side("primary"), reason)
            assert await h.list_runs() == ["primary"]
            assert counted == [("switchboard_read_fallbacks_total", {"reason": reason}),
                               ("switchboard_history_reads_total", {"read": "runs", "served": "primary"})]
    asyncio.run(main())


def test_a_run_the_replica_lacks_is_read_on_the_primary() -> None:
    async def main() -> None:
        rep, pri = Side("replica", run_row=None), Side("primary", run_row={"id": 7})
        h, counted = routed(rep, pri)
        assert await h.get_run(7) == {"id": 7}
        assert ("switchboard_read_fallbacks_total", {"reason": "not_found"}) in counted
        assert rep.calls == pri.calls == 1
    asyncio.run(main())


def test_a_lost_connection_skips_the_replica_and_bad_input_is_not_retried() -> None:
    async def main() -> None:
        h, counted = routed(Side("replica", exc=psycopg.OperationalError("server closed the connection")),
                            Side("primary"))
        assert await h.list_runs() == ["primary"]
        assert ("switchboard_read_fallbacks_total", {"reason": "error"}) in counted
        assert h.watch is not None and h.watch.reason == "unreachable" and not h.usable()
        bad = psycopg.errors.InvalidParameterValue("status 'nope' is not a run status")
        pri = Side("primary")
        h, counted = routed(Side("replica", exc=bad), pri)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            await h.list_runs(status="nope")
        assert pri.calls == 0 and h.usable()
    asyncio.run(main())


def test_without_a_read_url_everything_goes_to_the_primary_uncounted() -> None:
    async def main() -> None:
        counted: list[Any] = []
        h = HistoryReads(Side("primary"), None, count=lambda *a, **k: counted.append(a))
        assert await h.list_runs() == ["primary"] and counted == [] and not h.usable()
        assert math.isnan(h.lag)
        assert await h.replay_source(0, 1000, 20) is None
    asyncio.run(main())


def test_lag_is_the_age_of_the_oldest_primary_position_not_replayed() -> None:
    h, _ = routed(Side("replica"), Side("primary"))
    w = h.watch
    assert w is not None
    now = time.monotonic()
    w._wal.extend([(now - 3.0, 100), (now - 2.0, 200), (now - 1.0, 300)])
    assert w.lag_of(300) == 0.0 and w.lag_of(10_000) == 0.0      # has everything (an idle primary too)
    assert 1.9 < w.lag_of(150) < 2.5                              # lacks what the primary had 2 s ago
    assert 2.9 < w.lag_of(0) < 3.5
    assert w.lag_of(None) == math.inf                             # never replayed anything


class SwitchingHistory:
    def __init__(self, db: FakeDb) -> None:
        self.db = db
        self.where = "replica"

    async def feed_versions(self, sql: str, params: dict[str, Any]) -> tuple[Any, str]:
        return await self.db.fetchone(sql, params), self.where


def test_the_run_feed_starts_its_windows_again_when_the_scan_moves() -> None:
    async def main() -> None:
        db = FakeDb()
        db.history = SwitchingHistory(db)  # type: ignore[assignment]
        feed = RunFeed(db)  # type: ignore[arg-type]
        a = sock()
        feed.subscribers.add(a)
        db.answer = db.row([run(1, "running")], max_id=1)
        await feed.poll_once()
        db.answer = db.row([run(1, "running")], now=T0 + timedelta(seconds=1), max_id=1)
        await feed.poll_once()
        assert [f["payload"]["truncated"] for f in frames(a)] == [False]
        db.history.where = "primary"  # type: ignore[attr-defined]
        db.answer = db.row([run(1, "running")], now=T0 + timedelta(seconds=2), max_id=5)
        await feed.poll_once()
        # nothing new, but the windows were the replica's: the console is told to re-read
        assert [f["payload"]["truncated"] for f in frames(a)] == [True]
        db.answer = db.row([run(1, "running")], now=T0 + timedelta(seconds=3), max_id=5)
        await feed.poll_once()
        assert frames(a) == []
        assert [c["floor"] for c in db.calls if "floor" in c][-1] == 5   # floors from the primary only
        await feed.stop()
    asyncio.run(main())
