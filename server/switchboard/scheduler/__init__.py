"""The in-process scheduler: every replica claims its share through SQL.

Nothing is decided here: claim_due_task picks the work (SKIP LOCKED), the
lease fences stale workers, finish_run records the outcome and schedules
retries. This loop only decides *when to ask*: at once when the relay hears
switchboard_runs (a triggered run starts within milliseconds), otherwise
every poll interval (with jitter, so replicas do not poll in lockstep), and
never more than ``concurrency`` runs at a time. While a handler runs, its
lease is extended every lease/3 (leases.py: heartbeats, lease loss and
cancellation). On shutdown it
stops claiming, caps every running handler's deadline at the end of the grace
period, lets them finish within it and hands the rest back with release_run()
so another replica takes them at once.

Each running run has one slot (slot.RunSlot: the run, its task, its context,
its lease and guards), kept in one map by run id; every task started here is
referenced until it is done.

Batches. Claims take as many runs as there are free slots in one call
(claim_due_tasks); successes are recorded in group commits (finish_runs), and
when that frees slots the same round trip claims work for them
(finish_and_claim), so a busy replica makes one statement per batch of runs.
A run's handler runs inside the run's own task.

Shutdown never strands a claim. A claim round trip that is in flight when the
scheduler stops is not cancelled (Postgres may already have committed it,
and a cancelled caller would never learn which runs it got): it is shielded,
awaited, and whatever it claimed is handed back with release_run().
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..config import Config
from ..db import Database
from ..handler_options import DEFAULT_QUEUE, queue_slots
from ..handlers import HandlerContext, HandlerRegistry, _cap_deadline, stored_result
from ..metrics import Metrics
from ..replica import ReplicaState
from ..rows import Run
from ..streams.writer import Producer
from ..registry import Registration
from .invoke import Outcome, invoke
from .leases import CANCEL_GRACE, FENCE_CHECK_MIN_INTERVAL, LeaseKeeper
from .queues import QueueSlots
from .slot import RunSlot

__all__ = ["CANCEL_GRACE", "FENCE_CHECK_MIN_INTERVAL", "LeaseKeeper", "QueueSlots", "RunSlot", "Scheduler"]

LOG = logging.getLogger("switchboard.scheduler")


def count_successes(metrics: Metrics, batch: list[tuple[int, Any, asyncio.Future[bool], str]]) -> None:
    """Successes counted once per handler per batch, not per run: a labelled
    prometheus-client call is a few microseconds, a visible share of a no-op job."""
    per_handler: dict[str, int] = {}
    for b in batch:
        per_handler[b[3]] = per_handler.get(b[3], 0) + 1
    for label, n in per_handler.items():
        metrics.inc("switchboard_runs_finished_total", n, outcome="ok", handler=label)


async def register_options(db: Database, handlers: HandlerRegistry, worker: str) -> bool:
    """Store the handlers' options (handler_options: what enqueue() and finish_run() read).
    Until it succeeds (a database down at start) the loop tries again each round and the
    options stored last hold; claiming does not wait for it."""
    try:
        await db.set_handler_options({n: o.as_json() for n, o in handlers.options().items()}, worker)
        return True
    except Exception as exc:
        LOG.warning("storing the handlers' options failed (tried again): %s", str(exc).strip() or exc)
        return False


async def release_claimed(db: Database, worker: str, runs: list[Run], why: str) -> None:
    """Hand back runs that were claimed but never started here (fenced: release_run)."""
    for run in runs:
        try:
            if await db.release_run(run.id, worker):
                LOG.info("run %s (%s) handed back", run.id, why)
        except Exception as exc:
            LOG.warning("run %s: hand-back failed (%s); its lease will expire", run.id, exc)


class Scheduler:
    def __init__(self, db: Database, metrics: Metrics, config: Config, handlers: HandlerRegistry,
                 replica: ReplicaState, producer: Producer | None = None) -> None:
        self.db = db
        self.producer = producer          # ctx.stream(): this replica's streams (streams/writer.py)
        self.metrics = metrics
        self.cfg = config
        self.handlers = handlers
        self.replica = replica
        self.worker = replica.replica_id
        self._slots: dict[int, RunSlot] = {}       # run id -> its slot, from start_run() until forgotten
        self.leases = LeaseKeeper(db, metrics, config, replica, self._slots)
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._done: list[tuple[int, Any, asyncio.Future[bool], str]] = []
        self._flush_task: asyncio.Task[None] | None = None    # the group commit in flight, if any
        self._claims: set[asyncio.Future[list[Run]]] = set()   # claim round trips in flight
        # slots per queue, and the free slots claims in flight asked for (loop and finish_and_claim)
        self.queues = QueueSlots(queue_slots(config.scheduler_concurrency, config.queues, handlers.queues()))

    def wake(self) -> None:
        self._wake.set()
        if self._slots:
            self.leases.wake()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="scheduler")
        self.leases.start()

    @property
    def running(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> Mapping[int, RunSlot]:
        """The running runs' slots by run id (a read-only view)."""
        return MappingProxyType(self._slots)

    async def _loop(self) -> None:
        # Start-up jitter: replicas restarted together do not claim in lockstep.
        await asyncio.sleep(random.random() * min(self.cfg.poll_interval, 1.0))
        registered = False
        while not self._stopping:
            if not registered:
                registered = await register_options(self.db, self.handlers, self.worker)
            try:
                await self._claim_available()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                LOG.warning("claim failed: %s", str(exc).strip() or type(exc).__name__)
            timeout = self.cfg.poll_interval * (0.8 + 0.4 * random.random())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _claim_available(self) -> None:
        """Claim as many runs as there are free slots, in one round trip per batch."""
        while not self._stopping and not self.replica.draining:
            free = self.queues.free(self._slots)
            if not free:
                return
            sent = time.time()
            lease = self.cfg.lease_seconds
            # Shielded: if this task is cancelled mid-claim, the claim itself runs to its end
            # and stop() hands back what it got (see the module docstring).
            claim = asyncio.ensure_future(
                self.db.claim_due_tasks(self.worker, lease, free[DEFAULT_QUEUE]) if self.queues.single
                else self.db.claim_queues(self.worker, lease, free))
            self._claims.add(claim)
            self.queues.reserve(free)
            try:
                runs = await asyncio.shield(claim)
            except asyncio.CancelledError:
                raise                           # stays in _claims: stop() hands its runs back
            except Exception:
                self._claims.discard(claim)
                raise
            finally:
                self.queues.release(free)
            self._claims.discard(claim)
            self._start_runs(runs, sent)
            if len(runs) < sum(free.values()):
                return  # nothing more is due right now (in some queue)

    def _start_runs(self, runs: list[Run], sent: float) -> None:
        """Start the handlers of runs claimed by a call sent at local time ``sent``."""
        # Counted once per handler per batch, not per run: a labelled prometheus-client
        # call is a few microseconds, a visible share of a no-op job's CPU.
        claimed: dict[str, int] = {}
        lease_until = sent + self.cfg.lease_seconds
        for run in runs:
            # a label from the registry (a closed set), whatever name a task or job carries
            label = run.handler if self.handlers.get(run.handler) else "unknown"
            claimed[label] = claimed.get(label, 0) + 1
            if run.started_at and run.run_at:  # both on the database clock
                self.metrics.observe("switchboard_claim_latency_seconds",
                                     (run.started_at - run.run_at).total_seconds())
            self.start_run(run, lease_until)
        for label, n in claimed.items():
            self.metrics.inc("switchboard_claims_total", n, handler=label)

    def start_run(self, run: Run, lease_until: float | None = None) -> RunSlot:
        """Run ``run``, claimed by this worker, in a task of its own, in a new slot.
        ``lease_until``: the local time its lease is proven until (the claim's send time
        + lease); now + lease when not given."""
        lease = self.cfg.lease_seconds
        slot = RunSlot(run, HandlerContext(run, self.db, lease_seconds=lease, streams=self.producer),
                       run.handler if self.handlers.get(run.handler) else "unknown",
                       time.time() + lease if lease_until is None else lease_until)
        self._slots[run.id] = slot
        slot.task = asyncio.create_task(self._execute(slot), name=f"run-{run.id}")
        return slot

    def _refill_slots(self, finishing: list[int]) -> dict[str, int]:
        """How many runs per queue a finish of ``finishing`` may claim in the same round
        trip: the slots free once they are finished, less those that claims in flight asked
        for. None while stopping or draining, and before start() (the loop owns claiming)."""
        if self._stopping or self.replica.draining or self._loop_task is None:
            return {}
        return self.queues.free(self._slots, set(finishing))

    async def _execute(self, slot: RunSlot) -> None:
        """The run's task: the handler (in this task), then its outcome recorded -- or, when
        the lease was lost meanwhile, never recorded and the run handed back."""
        # The handler runs in this task, not in one of its own: a second task per run (and
        # its scheduling and done callbacks) was the largest part of the event loop's work
        # per short job (bench/profile_jobs.py --cprofile). Cancelling "the handler" is
        # cancelling this task while it is in the handler (slot.in_handler).
        reg = self.handlers.registration(slot.run.handler)
        slot.in_handler = reg is not None
        slot.started = time.monotonic()
        self.leases.arm(slot)
        try:
            result, error, retry = await self._call_handler(slot, reg)
        except asyncio.CancelledError:
            self.leases.disarm(slot)
            self._forget(slot)
            raise
        self.leases.disarm(slot)
        if slot.lost:
            # Free the slot, then hand the run back in the background.
            self._forget(slot)
            self._wake.set()
            self.leases.hand_back(slot)
            return
        await self._record(slot, result, error, retry)

    async def _call_handler(self, slot: RunSlot, reg: Registration | None) -> Outcome:
        """invoke()'s (result, error, retry). A cancel after a lost lease is consumed here:
        the task lives on to hand the run back (slot.lost)."""
        run = slot.run
        if reg is None:
            return None, f"unknown handler {run.handler!r} (registered: {', '.join(self.handlers.names())})", True
        try:
            return await invoke(reg, slot.ctx)
        except asyncio.CancelledError:
            if not slot.lost:
                raise                       # this run is being cancelled (shutdown)
            slot.task.uncancel()            # the lease-loss cancel, consumed here
            return None, None, True         # never recorded: the run is lost
        finally:
            slot.in_handler = False         # out of the handler: nothing left to cancel

    async def _record(self, slot: RunSlot, result: Any, error: str | None, retry: bool = True) -> None:
        """Record the run's outcome (successes in group commits), then free its slot."""
        run_id = slot.run_id
        try:
            outcome = "ok" if error is None else "failed"
            self.metrics.observe("switchboard_run_duration_seconds", time.monotonic() - slot.started,
                                 handler=slot.label, outcome=outcome)
            if error is None:
                # counted in _flush, once per handler per batch
                finished = await self._finish_ok(run_id, None if result is None else stored_result(result),
                                                  slot.label)
            else:
                finished = await self.db.finish_run(run_id, self.worker, False, None, error, retry)
                self.metrics.inc("switchboard_runs_finished_total", outcome="failed", handler=slot.label)
            if not finished:
                LOG.warning("run %s: lease lost before finish (another worker rescued it)", run_id)
        except Exception as exc:
            LOG.warning("run %s: finish failed (%s); the lease will expire and it is retried", run_id, exc)
        finally:
            self._forget(slot)
            self._wake.set()

    def _forget(self, slot: RunSlot) -> None:
        if self._slots.get(slot.run_id) is slot:
            del self._slots[slot.run_id]

    async def _finish_ok(self, run_id: int, result: Any, label: str) -> bool:
        """Successes are recorded in batches: while one finish_runs() call is in flight,
        the next ones queue up and go together (group commit), with no added delay."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._done.append((run_id, result, fut, label))
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        """One finish_runs() per batch of successes; when slots will be free, the same round
        trip claims work for them (finish_and_claim: one statement, one transaction, where
        a finish and then a claim were two). The claimed runs start before the finished
        ones are forgotten, so the loop (woken by each finish) sees no free slot and sends
        no claim of its own unless this one came back short."""
        try:
            while self._done:
                batch, self._done = self._done, []
                await self._flush_batch(batch)
        finally:
            self._flush_task = None

    async def _flush_batch(self, batch: list[tuple[int, Any, asyncio.Future[bool], str]]) -> None:
        ids = [b[0] for b in batch]
        results = [b[1] for b in batch]
        want = self._refill_slots(ids)
        sent = time.time()
        runs: list[Run] = []
        self.queues.reserve(want)
        try:
            if not want:
                finished = await self.db.finish_runs(self.worker, ids, results)
            elif self.queues.single:
                finished, runs = await self.db.finish_and_claim(
                    self.worker, ids, results, self.cfg.lease_seconds, want[DEFAULT_QUEUE])
            else:
                finished, runs = await self.db.finish_and_claim_queues(
                    self.worker, ids, results, self.cfg.lease_seconds, want)
        except Exception as exc:
            for _, _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        finally:
            self.queues.release(want)
        count_successes(self.metrics, batch)
        if runs:
            if self._stopping or self.replica.draining:
                # stop() began while the call was in flight: never start them; hand them
                # back before the finished runs' tasks end (stop() waits for those).
                await release_claimed(self.db, self.worker, runs, "claimed with a finish while stopping")
            else:
                self._start_runs(runs, sent)
        for run_id, _, fut, _ in batch:
            if not fut.done():
                fut.set_result(run_id in finished)

    async def stop(self, grace: float) -> None:
        """Stop claiming; wait up to grace for running handlers; hand back the rest."""
        self._stopping = True
        self._wake.set()
        await self.leases.stop_fence()
        until = time.time() + grace
        for slot in self._slots.values():
            _cap_deadline(slot.ctx, until)
        if self._loop_task:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self._hand_back_inflight_claims(max(grace, 5.0))
        self.leases.cancel_hand_backs()
        if self._slots:
            LOG.info("waiting up to %.1fs for %d running run(s)", grace, len(self._slots))
            await asyncio.wait([slot.task for slot in self._slots.values()], timeout=grace)
        for slot in list(self._slots.values()):
            slot.task.cancel()
            await asyncio.gather(slot.task, return_exceptions=True)
            try:
                if await self.db.release_run(slot.run_id, self.worker):
                    LOG.info("run %s handed back", slot.run_id)
            except Exception as exc:
                LOG.warning("run %s: hand-back failed (%s); its lease will expire", slot.run_id, exc)

    async def _hand_back_inflight_claims(self, timeout: float) -> None:
        """A claim that was in flight when the loop was cancelled may have committed: wait
        for it and release every run it got (they never started here)."""
        for claim in list(self._claims):
            try:
                runs = await asyncio.wait_for(asyncio.shield(claim), timeout)
            except Exception as exc:
                LOG.warning("a claim in flight at shutdown failed (%s); if it committed, its leases "
                            "expire and the runs are rescued", exc)
                continue
            finally:
                self._claims.discard(claim)
            await release_claimed(self.db, self.worker, runs, "claimed while stopping")
