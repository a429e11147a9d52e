"""The scheduler refills the slots of a finished batch in the finish's own round trip
(finish_and_claim), and that second claimer never breaks the scheduler's promises: no
more than ``concurrency`` handlers at once, every run finished once, and a claim that
comes back after stop() began is handed back, never started."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from switchboard.config import Config
from switchboard.handlers import HandlerRegistry
from switchboard.metrics import Metrics
from switchboard.replica import ReplicaState
from switchboard.rows import RUN_FIELDS, Run
from switchboard.scheduler import Scheduler


def _run(run_id: int, handler: str = "job") -> Run:
    row: dict[str, Any] = {name: None for name in RUN_FIELDS}
    row.update({"id": run_id, "handler": handler, "args": {}, "status": "running", "attempt": 1,
                "max_attempts": 1})
    return Run.from_row(row)


class _Queue:
    """A queue of ``n`` runs behind the scheduler's data-layer calls, with a gate that can
    hold finish_and_claim() answers back."""

    def __init__(self, n: int) -> None:
        self.todo = list(range(1, n + 1))
        self.claimed: dict[int, str] = {}          # run id -> which call claimed it
        self.finished: list[int] = []
        self.released: list[int] = []
        self.calls = {"claim_due_tasks": 0, "finish_runs": 0, "finish_and_claim": 0}
        self.gate: asyncio.Event | None = None
        self.in_flight = asyncio.Event()
        self.held: list[int] = []                   # what the call held at the gate claimed

    def _take(self, k: int, by: str) -> list[Run]:
        got, self.todo = self.todo[:k], self.todo[k:]
        for rid in got:
            assert rid not in self.claimed
            self.claimed[rid] = by
        return [_run(rid) for rid in got]

    async def claim_due_tasks(self, worker: str, lease: float, max_runs: int) -> list[Run]:
        self.calls["claim_due_tasks"] += 1
        await asyncio.sleep(0.001)
        return self._take(max_runs, "claim")

    async def finish_runs(self, worker: str, run_ids: list[int], results: list[Any]) -> set[int]:
        self.calls["finish_runs"] += 1
        await asyncio.sleep(0.001)
        self.finished += run_ids
        return set(run_ids)

    async def finish_and_claim(self, worker: str, run_ids: list[int], results: list[Any], lease: float,
                               max_runs: int) -> tuple[set[int], list[Run]]:
        self.calls["finish_and_claim"] += 1
        assert 1 <= max_runs
        self.finished += run_ids
        runs = self._take(max_runs, "refill")       # committed before the answer arrives
        self.in_flight.set()
        if self.gate is not None and not self.gate.is_set():
            self.held = [r.id for r in runs]
            await self.gate.wait()
        await asyncio.sleep(0.001)
        return set(run_ids), runs

    async def release_run(self, run_id: int, worker: str) -> bool:
        self.released.append(run_id)
        return True

    async def heartbeat_run(self, run_id: int, worker: str, lease: float) -> bool:
        return True

    async def lost_runs(self, worker: str, run_ids: list[int]) -> list[dict[str, Any]]:
        return []


def _scheduler(q: _Queue, concurrency: int, started: list[int], active: list[int]) -> Scheduler:
    reg = HandlerRegistry()

    @reg.register("job")
    async def job(ctx: Any) -> None:
        started.append(ctx.run_id)
        active[0] += 1
        active[1] = max(active[1], active[0])
        await asyncio.sleep(random.random() * 0.004)
        active[0] -= 1

    cfg = Config(database_url="postgresql://x/y", jwt_secret="s" * 40, lease_seconds=30.0,
                 scheduler_concurrency=concurrency, poll_interval=0.05)
    return Scheduler(q, Metrics(), cfg, reg, ReplicaState())  # type: ignore[arg-type]


def test_a_drain_refills_slots_with_the_finish_and_never_exceeds_the_concurrency() -> None:
    async def main() -> tuple[_Queue, list[int], list[int]]:
        q = _Queue(600)
        started: list[int] = []
        active = [0, 0]
        s = _scheduler(q, 4, started, active)
        s.start()
        for _ in range(2000):
            if len(q.finished) >= 600:
                break
            await asyncio.sleep(0.01)
        await s.stop(1.0)
        return q, started, active

    q, started, active = asyncio.run(main())
    assert sorted(q.finished) == list(range(1, 601))        # every run finished, once
    assert sorted(started) == list(range(1, 601))           # every run started, once
    assert active[1] <= 4                                   # never more than the concurrency
    assert q.released == []
    refilled = sum(1 for by in q.claimed.values() if by == "refill")
    # the steady state claims through the finish; the loop only starts the drain (and
    # tops up when a refill came back short)
    assert q.calls["finish_and_claim"] > 0 and refilled > 600 // 2, (q.calls, refilled)


def test_a_refill_that_answers_after_stop_began_is_handed_back_not_started() -> None:
    async def main() -> tuple[_Queue, list[int], list[int]]:
        q = _Queue(40)
        started: list[int] = []
        active = [0, 0]
        s = _scheduler(q, 4, started, active)
        s.start()
        for _ in range(500):                                # wait for a drain to be going
            if q.finished:
                break
            await asyncio.sleep(0.01)
        q.gate = asyncio.Event()
        q.in_flight.clear()
        await asyncio.wait_for(q.in_flight.wait(), 5)      # a finish_and_claim has committed ...
        stopping = asyncio.create_task(s.stop(5.0))
        await asyncio.sleep(0.05)                           # ... and stop() began before it answers
        q.gate.set()
        await stopping
        return q, started, active

    q, started, active = asyncio.run(main())
    assert q.held, "the held finish_and_claim claimed runs"
    assert not set(q.held) & set(started)                    # never started ...
    assert set(q.held) <= set(q.released)                    # ... but handed back
    assert len(set(q.finished)) == len(q.finished)           # nothing finished twice
    assert set(started) <= set(q.finished) | set(q.released)
