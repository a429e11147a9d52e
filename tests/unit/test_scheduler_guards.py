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
from switchboard.scheduler import RunSlot, Scheduler


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
    async def main() -> tuple[list[str], list[float], list[int], float]:
        db = _FakeDB()
        lease = 1.5                      # heartbeat every 0.5 s
        s = _scheduler(db, lease)
        before = set(asyncio.all_tasks())
        sent = time.time()
        quick = s.start_run(_run(1, "quick"), sent + lease)
        assert s.slots[1] is quick and s.running == 1
        await asyncio.sleep(0)           # the handler is running, no guard yet
        extra = sorted(t.get_coro().__qualname__ for t in asyncio.all_tasks() - before)  # type: ignore[union-attr]
        assert quick.guard_timer is not None and not quick.guards
        await quick.task
        t0 = time.time()
        slow = s.start_run(_run(2, "slow"), time.time() + lease)
        await slow.task
        assert len(slow.guards) == 2     # heartbeat and lease watch, started at lease/3
        assert all(g.cancelled() for g in slow.guards)
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return extra, [h - t0 for h in db.heartbeats], db.finished, len(left)

    extra, beats, finished, left = asyncio.run(main())
    # _execute (which runs the handler itself) and the finish's group commit; no guard
    assert extra == ["Scheduler._execute", "Scheduler._flush"], extra
    assert finished == [1, 2]
    # the slow run (1.8 s) was heartbeaten from lease/3 on, at the lease/3 cadence
    assert len(beats) >= 2, beats
    assert 0.4 <= beats[0] < 1.5, beats   # from lease/3, and before the lease ran out
    assert all(b - a >= 0.4 for a, b in zip(beats, beats[1:])), beats
    assert left == 0                    # no guard outlives its run


class _RescuedDB(_FakeDB):
    """Every heartbeat answers "not yours any more" (another worker rescued the run)."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[int] = []

    async def heartbeat_run(self, run_id: int, worker: str, lease: float) -> bool:
        self.heartbeats.append(time.time())
        return False

    async def lost_runs(self, worker: str, run_ids: list[int]) -> list[dict[str, Any]]:
        return [{"run_id": r, "status": "running"} for r in run_ids]

    async def release_run(self, run_id: int, worker: str) -> bool:
        self.released.append(run_id)
        return False


def test_a_rescued_runs_handler_is_cancelled_in_place_and_its_outcome_never_recorded() -> None:
    """The handler runs inside the run's own task: a lost lease still reaches it as
    ctx.lease_lost and then a cancel, the task survives that cancel to hand the run back
    (fenced), and a cooperative handler that returns first is not cancelled afterwards."""
    seen: dict[str, Any] = {}

    async def main() -> tuple[Scheduler, list[RunSlot]]:
        db = _RescuedDB()
        lease = 0.6                                   # heartbeat at 0.2 s: refused
        s = _scheduler(db, lease)

        @s.handlers.register("stubborn")
        async def stubborn(ctx: Any) -> Any:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen["stubborn_cancelled_after_lost"] = ctx.lease_lost.is_set()
                raise
            return {"never": True}

        @s.handlers.register("polite")
        async def polite(ctx: Any) -> Any:
            seen["polite_saw_loss"] = await ctx.wait_lease_lost(30)
            await asyncio.sleep(0.05)                 # stops by itself, within the grace
            seen["polite_finished"] = True
            return {"late": True}

        slots = [s.start_run(_run(rid, name), time.time() + lease)
                 for rid, name in ((1, "stubborn"), (2, "polite"))]
        t0 = time.time()
        await asyncio.wait_for(asyncio.gather(*(slot.task for slot in slots)), 10)
        seen["seconds"] = time.time() - t0
        await asyncio.sleep(1.2)                      # the fenced hand-backs; the polite one's cancel timer fires
        seen["finished"], seen["released"] = db.finished, sorted(db.released)
        return s, slots

    s, slots = asyncio.run(main())
    assert seen["stubborn_cancelled_after_lost"] is True
    assert seen["polite_saw_loss"] is True and seen["polite_finished"] is True
    assert seen["finished"] == []                     # neither outcome was recorded
    assert seen["released"] == [1, 2]                 # both handed back (fenced: false)
    assert all(slot.lost and not slot.in_handler for slot in slots)
    assert s.running == 0 and not s.slots              # both slots freed
