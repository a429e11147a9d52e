"""One running run, as the scheduler tracks it: one slot of its concurrency."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..handlers import HandlerContext
from ..rows import Run


@dataclass(eq=False, slots=True)
class RunSlot:
    """Everything the scheduler knows about one run it claimed, from the moment its task
    is started (Scheduler.start_run) until the run is forgotten: its outcome recorded,
    or the run handed back. The scheduler owns the slots (one dict, by run id); the
    lease keeper (leases.py) arms the guards and moves ``lease_until`` and ``lost``.

    A slot is one execution: a run handed back and claimed again here gets a new slot,
    so a timer or guard that still holds the old one can never touch the new one."""

    run: Run
    ctx: HandlerContext
    # the metrics' handler label: the registered name, or "unknown" (a closed set, whatever
    # name a task or job carries)
    label: str
    # local time the lease is proven until: the send time of the last proof (the claim,
    # then each acknowledged heartbeat) + lease
    lease_until: float
    # the run's task; the handler runs inside it (no second task per run), so cancelling
    # the handler is cancelling this task while ``in_handler``
    task: asyncio.Task[None] = field(init=False, repr=False)
    in_handler: bool = False
    started: float = 0.0    # monotonic time the handler was entered (run duration)
    # the lease was lost or the run cancelled: the handler is told and, unless it returns
    # first, cancelled; its outcome is never recorded and the run is handed back
    lost: bool = False
    # starts the guards when the first heartbeat is due (a short job never has any)
    guard_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    # the heartbeat and the lease watch, once started: referenced until the run is done
    guards: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    @property
    def run_id(self) -> int:
        return self.run.id
