"""A run's lease guards (heartbeat, lease watch) start when the first heartbeat is
due, not with the run: a short job never creates them, a long one is heartbeaten
at the same cadence as before (every lease/3 from the claim's send time)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from switchboard.config import Config
from switchboard.handlers import HandlerRegistry
from switchboard.metrics import Metrics
from switchboard.replica import ReplicaState
from switchboard.rows import RUN_FIELDS, Run
from switchboard.scheduler import Scheduler


class _FakeDB:
    def __init__(self) -> None:
        self.heartbeats: list[float] = []
        self.finished: list[int] = []

    async def heartbeat_run(self, run_id: int, worker: str, lease: float) -> bool:
        self.heartbeats.append(time.time())
        return True

    async def finish_runs(self, worker: str, run_ids: list[int], results: list[Any]) -> set[int]:
        self.finished += run_ids
        return set(run_ids)


def _scheduler(db: _FakeDB, lease: float) -> Scheduler:
    reg = HandlerRegistry()

    @reg.register("quick")
    async def quick(ctx: Any) -> Any:
        return {"ok": True}

    @reg.register("slow")
    async def slow(ctx: Any) -> Any:
        await asyncio.sleep(lease * 1.2)
        return {"ok": True}

    cfg = Config(database_url="postgresql://x/y", jwt_secret="s" * 40, lease_seconds=lease)
    return Scheduler(db, Metrics(), cfg, reg, ReplicaState())  # type: ignore[arg-type]


def _run(run_id: int, handler: str) -> Run:
    row: dict[str, Any] = {name: None for name in RUN_FIELDS}
    row.update({"id": run_id, "handler": handler, "args": {}, "status": "running", "attempt": 1,
                "max_attempts": 1})
    return Run.from_row(row)


def test_a_short_job_creates_no_guard_task_and_a_long_one_is_heartbeaten() -> None:
    async def main() -> tuple[int, list[float], list[int], float]:
        db = _FakeDB()
        lease = 1.5                      # heartbeat every 0.5 s
        s = _scheduler(db, lease)
        before = len(asyncio.all_tasks())
        sent = time.time()
        s._lease_until[1] = sent + lease
        quick = asyncio.create_task(s._execute(_run(1, "quick")))
        await asyncio.sleep(0)           # the handler task exists, no guard yet
        extra = len(asyncio.all_tasks()) - before   # _execute itself + its handler
        await quick
        s._lease_until[2] = time.time() + lease
        t0 = time.time()
        await s._execute(_run(2, "slow"))
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return extra, [h - t0 for h in db.heartbeats], db.finished, len(left)

    extra, beats, finished, left = asyncio.run(main())
    assert extra == 2
    assert finished == [1, 2]
    # the slow run (1.8 s) was heartbeaten from lease/3 on, at the lease/3 cadence
    assert len(beats) >= 2, beats
    assert 0.4 <= beats[0] < 1.5, beats   # from lease/3, and before the lease ran out
    assert all(b - a >= 0.4 for a, b in zip(beats, beats[1:])), beats
    assert left == 0                    # no guard outlives its run
