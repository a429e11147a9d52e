"""The leases of the runs a scheduler is running: heartbeats, the lease watch, the
lost-run check, and the hand-back of a run whose lease was lost.

Heartbeats. While a handler runs, its lease is extended every lease/3, counted
from the send time of the last proof (pushing ``ctx.deadline`` forward). The
guards (heartbeat, lease watch) start only when the first heartbeat is due: most
jobs are done long before.

Lease loss. The lease is only as good as the last heartbeat that reached
Postgres: a heartbeat sent at local time t (and acknowledged) moved the
lease to at least t + lease, since the database's now() was later than t.
When no heartbeat has been acknowledged by ``t + lease - margin`` (margin =
20 % of the lease, 0.2 s to 5 s), the run can no longer be proven ours -- the
database may be unreachable, or slow -- so the handler is told
(``ctx.lease_lost``) and, margin/2 later, cancelled: before another replica
can rescue the run. When a heartbeat answers that the run was already
rescued, the handler is told at once and cancelled one heartbeat interval (at
least 1 s) later, time for a cooperative handler to stop and say so. The run is
then handed back with release_run(), which is fenced: it changes nothing if the
run was rescued meanwhile (and the late outcome of the cancelled handler is
never recorded). So "runs never overlap" holds for a handler's side effects,
not only for rows, as long as the handler stops when cancelled.

Cancellation. cancel_run() makes the run final ('cancelled') in the database
and wakes every replica (NOTIFY switchboard_runs at commit). A replica that
hears it while it has runs going asks lost_runs() which of them it no longer
owns -- one round trip, coalesced when wakes come in bursts -- and treats
each exactly like a lost lease: the handler is told (``ctx.cancelled`` and
``ctx.lease_lost``), cancelled CANCEL_GRACE s later, and its outcome is never
recorded (finish_run would be fenced anyway). A replica that misses the
NOTIFY (LISTEN reconnecting) learns it from its next heartbeat, which answers
false.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from ..config import Config
from ..db import Database
from ..handlers import _extend_deadline
from ..metrics import Metrics
from ..replica import ReplicaState
from .slot import RunSlot

LOG = logging.getLogger("switchboard.scheduler")

# How long a cancelled run's handler may take to stop by itself (it sees ctx.cancelled)
# before its task is cancelled.
CANCEL_GRACE = 1.0
# Wakes in a burst (every enqueue wakes every replica) share one lost_runs() round trip.
FENCE_CHECK_MIN_INTERVAL = 0.1


class LeaseKeeper:
    """Keeps the leases of a scheduler's running runs (``slots``: the scheduler's own map,
    only read here) and stops the handlers of runs that are no longer ours."""

    def __init__(self, db: Database, metrics: Metrics, config: Config, replica: ReplicaState,
                 slots: Mapping[int, RunSlot]) -> None:
        self.db = db
        self.metrics = metrics
        self.cfg = config
        self.replica = replica
        self.worker = replica.replica_id
        self._slots = slots
        self._fence_wake = asyncio.Event()
        self._fence_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._handbacks: set[asyncio.Task[None]] = set()   # release_run() after a lost lease, retried

    # -- the fence: which running runs are no longer ours (cancelled, rescued) -----------------
    def start(self) -> None:
        self._fence_task = asyncio.create_task(self._fence_loop(), name="scheduler-fence")

    def wake(self) -> None:
        self._fence_wake.set()

    async def stop_fence(self) -> None:
        self._stopping = True
        if self._fence_task is not None:
            self._fence_task.cancel()
            await asyncio.gather(self._fence_task, return_exceptions=True)

    def cancel_hand_backs(self) -> None:
        """Stop the hand-backs still retrying: their leases expire and the runs are rescued."""
        for t in list(self._handbacks):
            t.cancel()

    async def _fence_loop(self) -> None:
        """After a wake, ask which running runs are no longer ours (cancelled, rescued)."""
        while not self._stopping:
            await self._fence_wake.wait()
            self._fence_wake.clear()
            try:
                await self.check_lost_runs()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # the heartbeat is the fallback
                LOG.warning("lost_runs check failed: %s", str(exc).strip() or type(exc).__name__)
            await asyncio.sleep(FENCE_CHECK_MIN_INTERVAL)

    async def check_lost_runs(self) -> None:
        asked = {rid: slot for rid, slot in self._slots.items() if not slot.lost}
        if not asked:
            return
        for row in await self.db.lost_runs(self.worker, list(asked)):
            slot = asked.get(row["run_id"])
            if slot is None or not slot.in_handler:
                continue        # the handler is done: its outcome is being recorded (or fenced)
            if row["status"] == "cancelled":
                slot.ctx.cancelled.set()
                self.lose(slot, "the run was cancelled", grace=CANCEL_GRACE, cancelled=True)
            else:
                self.lose(slot, f"the run is {row['status'] or 'gone'} (rescued by another worker?)",
                          grace=CANCEL_GRACE)

    # -- the guards of one run ----------------------------------------------------------------
    def arm(self, slot: RunSlot) -> None:
        """Start the run's guards (heartbeat; lease watch while in the handler) when its
        first heartbeat is due: lease/3 after the claim was sent, not with the run. Until
        then neither has anything to do (the watch fires at lease - margin > lease/3), and
        most jobs are done long before. Two tasks created and cancelled per run were a large
        share of the scheduler's own CPU per short job (cProfile on process time,
        bench/profile_jobs.py; docs/explanation/benchmark-journal.md "j23"); a timer handle costs a fraction of that."""
        first_due = slot.lease_until - self.cfg.lease_seconds + self._interval()
        slot.guard_timer = asyncio.get_running_loop().call_later(
            max(0.0, first_due - time.time()), self._start_guards, slot)

    def _start_guards(self, slot: RunSlot) -> None:
        slot.guards.append(asyncio.create_task(self._heartbeat(slot)))
        if slot.in_handler:
            slot.guards.append(asyncio.create_task(self._watch(slot)))

    @staticmethod
    def disarm(slot: RunSlot) -> None:
        if slot.guard_timer is not None:
            slot.guard_timer.cancel()
        for g in slot.guards:
            g.cancel()

    def _interval(self) -> float:
        return max(self.cfg.lease_seconds / 3, 0.2)

    def margin(self) -> float:
        return min(max(self.cfg.lease_seconds * 0.2, 0.2), 5.0)

    async def _heartbeat(self, slot: RunSlot) -> None:
        """Extend the lease every lease/3. An acknowledged heartbeat proves the lease until
        its send time + lease; when the database says this worker no longer owns the run,
        the handler is told (ctx.lease_lost) and cancelled."""
        run_id = slot.run_id
        lease = self.cfg.lease_seconds
        interval = self._interval()
        # Heartbeats keep a fixed cadence from the *send* time of the last proof (the claim,
        # then each heartbeat), not from when its answer arrived: over a slow link (say
        # 0.7 s round trips) "sleep, then send" spaced proofs by interval + RTT and let the
        # margin run out although every heartbeat was answered. With the cadence fixed the
        # lease survives round trips up to lease - margin - interval (1.4 s at lease 3 s).
        # Each heartbeat is one round trip (db.heartbeat_run skips the pool's idle check);
        # one that failed fast (a stale connection, discarded by the pool) is sent again at
        # once rather than an interval later, which the margin could not afford.
        next_send = slot.lease_until - lease + interval
        retried = False
        while True:
            await asyncio.sleep(max(0.0, next_send - time.time()))
            try:
                sent = time.time()
                next_send = sent + interval
                if not await self.db.heartbeat_run(run_id, self.worker, lease):
                    await self._refused(slot, interval)
                    return
                slot.lease_until = max(slot.lease_until, sent + lease)
                if not self.replica.draining:
                    _extend_deadline(slot.ctx, sent + lease)
                retried = False
            except Exception as exc:
                LOG.warning("run %s: heartbeat failed: %s", run_id, exc)
                if not retried and time.time() - sent < interval / 2:
                    retried, next_send = True, time.time()

    async def _refused(self, slot: RunSlot, interval: float) -> None:
        """A heartbeat answered that the run is not ours: already rescued or cancelled, so
        there is no deadline left to meet and a cooperative handler gets one heartbeat
        interval (at least 1 s) to stop by itself and say so. lost_runs() says which (and
        sets ctx.cancelled for a cancel)."""
        try:
            await self.check_lost_runs()
        except Exception as exc:
            LOG.debug("lost_runs after a refused heartbeat: %s", exc)
        self.lose(slot, "the run was rescued by another worker", grace=max(interval, 1.0))

    async def _watch(self, slot: RunSlot) -> None:
        """Cancel the handler once its lease can no longer be proven (see the module docstring)."""
        lease = self.cfg.lease_seconds
        margin = self.margin()
        while slot.in_handler:
            left = slot.lease_until - margin - time.time()
            if left <= 0:
                self.lose(slot, f"no heartbeat acknowledged for {lease - margin:.1f} s")
                return
            await asyncio.sleep(left)

    # -- losing a run ---------------------------------------------------------------------------
    def lose(self, slot: RunSlot, why: str, grace: float | None = None, cancelled: bool = False) -> None:
        """Tell the handler (ctx.lease_lost) and cancel it ``grace`` s later (default
        margin/2): its run may be rescued elsewhere, or was cancelled by an operator."""
        if slot.lost:
            return
        if cancelled:
            LOG.info("run %s: cancelled by an operator; stopping its handler", slot.run_id)
            self.metrics.inc("switchboard_runs_finished_total", outcome="cancelled", handler=slot.label)
        else:
            LOG.warning("run %s: lease lost (%s); cancelling its handler", slot.run_id, why)
            self.metrics.inc("switchboard_leases_lost_total")
        slot.lost = True
        slot.ctx.lease_lost.set()
        if slot.in_handler:
            # A handler that watches ctx.lease_lost gets half the margin to stop by itself
            # (and, say, tell its user); then it is cancelled -- still before the lease can
            # expire in the database.
            asyncio.get_running_loop().call_later(self.margin() / 2 if grace is None else grace,
                                                  self._cancel_handler, slot)

    @staticmethod
    def _cancel_handler(slot: RunSlot) -> None:
        """Cancel a run's handler if its task is still in it (the task then records nothing)."""
        if slot.in_handler:
            slot.task.cancel()

    def hand_back(self, slot: RunSlot) -> None:
        """Hand a lost run back in the background (its outcome is never recorded).

        release_run() is fenced: once the run was rescued it answers false and changes
        nothing. While the database is unreachable it is retried (every second, for up to
        2 x lease + 10 s), so the answer is seen once the link heals: true if the lease had
        not yet expired in the database (the run is queued again at once), false if it was
        rescued meanwhile."""
        run_id = slot.run_id
        task = asyncio.create_task(self._hand_back(run_id, slot.ctx.cancelled.is_set()),
                                   name=f"hand-back-{run_id}")
        self._handbacks.add(task)
        task.add_done_callback(self._handbacks.discard)

    async def _hand_back(self, run_id: int, cancelled: bool) -> None:
        deadline = time.monotonic() + 2 * self.cfg.lease_seconds + 10
        while True:
            try:
                released = await self.db.release_run(run_id, self.worker)
                break
            except Exception as exc:
                if time.monotonic() >= deadline:
                    LOG.warning("run %s: hand-back after lease loss failed (%s); the lease expires "
                                "and the run is rescued", run_id, exc)
                    return
                await asyncio.sleep(1.0)
        if released:
            LOG.info("run %s: handed back after its lease could not be renewed", run_id)
        elif cancelled:
            LOG.info("run %s: cancelled; its handler's outcome is discarded (hand-back fenced: "
                     "returned false, changed nothing)", run_id)
        else:
            LOG.info("run %s: already rescued by another worker; late hand-back fenced "
                     "(returned false, changed nothing)", run_id)
