"""Slots per queue: how many runs this replica may claim from each queue right now.

Each queue the replica serves has its own number of slots (handler_options.queue_slots:
SWITCHBOARD_SCHEDULER_CONCURRENCY for the default queue, SWITCHBOARD_QUEUES for named
ones), so a queue of slow jobs never takes the slots of a fast one. A queue's free
slots are its limit, less its runs in progress here, less what claims in flight have
asked for (they may come back full)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ..handler_options import DEFAULT_QUEUE


class QueueSlots:
    def __init__(self, limits: Mapping[str, int]) -> None:
        self.limits = {q: n for q, n in limits.items() if n > 0}
        # The common deployment: the default queue alone, claimed with the historical
        # three-argument claim_due_tasks / finish_and_claim (no arrays to build or check).
        self.single = set(self.limits) == {DEFAULT_QUEUE}
        self._reserved: dict[str, int] = {}

    def free(self, running: Mapping[int, Any], finishing: Collection[int] = ()) -> dict[str, int]:
        """Free slots per queue (only queues with some). ``running``: run id -> slot (its
        ``run.queue`` names the queue); runs in ``finishing`` count as free."""
        busy: dict[str, int] = {}
        for rid, slot in running.items():
            if rid not in finishing:
                q = slot.run.queue or DEFAULT_QUEUE
                busy[q] = busy.get(q, 0) + 1
        out = {}
        for q, limit in self.limits.items():
            n = limit - busy.get(q, 0) - self._reserved.get(q, 0)
            if n > 0:
                out[q] = n
        return out

    def reserve(self, want: Mapping[str, int]) -> None:
        for q, n in want.items():
            self._reserved[q] = self._reserved.get(q, 0) + n

    def release(self, want: Mapping[str, int]) -> None:
        for q, n in want.items():
            self._reserved[q] -= n
