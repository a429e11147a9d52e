"""The in-process scheduler: every replica claims its share through SQL.

Nothing is decided here: claim_due_task picks the work (SKIP LOCKED), the
lease fences stale workers, finish_run records the outcome and schedules
retries. This loop only decides *when to ask*: at once when the relay hears
switchboard_runs (a triggered run starts within milliseconds), otherwise
every poll interval (with jitter, so replicas do not poll in lockstep), and
never more than ``concurrency`` runs at a time. While a handler runs, its
lease is extended every lease/3, counted from the send time of the last proof
(pushing ``ctx.deadline`` forward). On shutdown it
stops claiming, caps every running handler's deadline at the end of the grace
period, lets them finish within it and hands the rest back with release_run()
so another replica takes them at once.

Batches. Claims take as many runs as there are free slots in one call
(claim_due_tasks); successes are recorded in group commits (finish_runs), and
when that frees slots the same round trip claims work for them
(finish_and_claim), so a busy replica makes one statement per batch of runs.
A run's handler runs inside the run's own task.

Lease loss. The lease is only as good as the last heartbeat that reached
Postgres: a heartbeat sent at local time t (and acknowledged) moved the
lease to at least t + lease, since the database's now() was later than t.
When no heartbeat has been acknowledged by ``t + lease - margin`` (margin =
20 % of the lease, 0.2 s to 5 s), the run can no longer be proven ours -- the
database may be unreachable, or slow -- so the handler is told
(``ctx.lease_lost``) and, margin/2 later, cancelled: before another replica
can rescue the run. When a heartbeat answers that the run was already
rescued, the handler is told at once and cancelled one heartbeat interval (at
least 1 s) later, time for a cooperative handler to stop and say so. The run is then handed back with release_run(), which is fenced: it
changes nothing if the run was rescued meanwhile (and the late outcome of
the cancelled handler is never recorded). So "runs never overlap" holds for
a handler's side effects, not only for rows, as long as the handler stops
when cancelled.

Cancellation. cancel_run() makes the run final ('cancelled') in the database
and wakes every replica (NOTIFY switchboard_runs at commit). A replica that
hears it while it has runs going asks lost_runs() which of them it no longer
owns -- one round trip, coalesced when wakes come in bursts -- and treats
each exactly like a lost lease: the handler is told (``ctx.cancelled`` and
``ctx.lease_lost``), cancelled CANCEL_GRACE s later, and its outcome is never
recorded (finish_run would be fenced anyway). A replica that misses the
NOTIFY (LISTEN reconnecting) learns it from its next heartbeat, which answers
false.

Shutdown never strands a claim. A claim round trip that is in flight when the
scheduler stops is not cancelled (Postgres may already have committed it,
and a cancelled caller would never learn which runs it got): it is shielded,
awaited, and whatever it claimed is handed back with release_run().
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import traceback
from typing import Any

from .config import Config
from .db import Database
from .handlers import HandlerContext, HandlerError, HandlerRegistry, _cap_deadline, _extend_deadline
from .metrics import Metrics
from .replica import ReplicaState
from .rows import Run

LOG = logging.getLogger("switchboard.scheduler")

# How long a cancelled run's handler may take to stop by itself (it sees ctx.cancelled)
# before its task is cancelled.
CANCEL_GRACE = 1.0
# Wakes in a burst (every enqueue wakes every replica) share one lost_runs() round trip.
FENCE_CHECK_MIN_INTERVAL = 0.1


class Scheduler:
    def __init__(self, db: Database, metrics: Metrics, config: Config, handlers: HandlerRegistry,
                 replica: ReplicaState) -> None:
        self.db = db
        self.metrics = metrics
        self.cfg = config
        self.handlers = handlers
        self.replica = replica
        self.worker = replica.replica_id
        self._contexts: dict[int, HandlerContext] = {}
        # run id -> the task running its handler, while the handler runs (and only then)
        self._htasks: dict[int, asyncio.Task[Any]] = {}
        self._wake = asyncio.Event()
        self._fence_wake = asyncio.Event()
        self._fence_task: asyncio.Task[Any] | None = None
        self._stopping = False
        self._running: dict[int, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._done: list[tuple[int, Any, asyncio.Future[bool]]] = []
        self._flushing = False
        self._claims: set[asyncio.Future[list[Run]]] = set()   # claim round trips in flight
        self._reserved = 0      # free slots asked for by claims in flight (loop and finish_and_claim)
        self._lease_until: dict[int, float] = {}    # run id -> local time its lease is proven until
        self._lost: set[int] = set()                # runs whose lease was lost (handler cancelled)
        self._handbacks: set[asyncio.Task[None]] = set()   # release_run() after a lost lease, retried

    def wake(self) -> None:
        self._wake.set()
        if self._running:
            self._fence_wake.set()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="scheduler")
        self._fence_task = asyncio.create_task(self._fence_loop(), name="scheduler-fence")

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
        ids = [rid for rid in self._contexts if rid not in self._lost]
        if not ids:
            return
        for row in await self.db.lost_runs(self.worker, ids):
            ctx = self._contexts.get(row["run_id"])
            htask = self._htasks.get(row["run_id"])
            if ctx is None or htask is None:
                continue        # the handler is done: its outcome is being recorded (or fenced)
            if row["status"] == "cancelled":
                ctx.cancelled.set()
                self._lose_lease(ctx, htask, "the run was cancelled", grace=CANCEL_GRACE, cancelled=True)
            else:
                self._lose_lease(ctx, htask, f"the run is {row['status'] or 'gone'} (rescued by another worker?)",
                                 grace=CANCEL_GRACE)

    @property
    def running(self) -> int:
        return len(self._running)

    async def _loop(self) -> None:
        # Start-up jitter: replicas restarted together do not claim in lockstep.
        await asyncio.sleep(random.random() * min(self.cfg.poll_interval, 1.0))
        while not self._stopping:
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
            free = self.cfg.scheduler_concurrency - len(self._running) - self._reserved
            if free <= 0:
                return
            sent = time.time()
            # Shielded: if this task is cancelled mid-claim, the claim itself runs to its end
            # and stop() hands back what it got (see the module docstring).
            claim = asyncio.ensure_future(self.db.claim_due_tasks(self.worker, self.cfg.lease_seconds, free))
            self._claims.add(claim)
            self._reserved += free
            try:
                runs = await asyncio.shield(claim)
            except asyncio.CancelledError:
                raise                           # stays in _claims: stop() hands its runs back
            except Exception:
                self._claims.discard(claim)
                raise
            finally:
                self._reserved -= free
            self._claims.discard(claim)
            self._start_runs(runs, sent)
            if len(runs) < free:
                return  # nothing more is due right now

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
            self._lease_until[run.id] = lease_until
            if run.started_at and run.run_at:  # both on the database clock
                self.metrics.observe("switchboard_claim_latency_seconds",
                                     (run.started_at - run.run_at).total_seconds())
            self._running[run.id] = asyncio.create_task(self._execute(run), name=f"run-{run.id}")
        for label, n in claimed.items():
            self.metrics.inc("switchboard_claims_total", n, handler=label)

    def _refill_slots(self, finishing: list[int]) -> int:
        """How many runs a finish of ``finishing`` may claim in the same round trip: the
        slots free once they are finished, less those that claims in flight asked for.
        Zero while stopping or draining, and before start() (the loop owns claiming)."""
        if self._stopping or self.replica.draining or self._loop_task is None:
            return 0
        done = set(finishing)
        busy = sum(1 for rid in self._running if rid not in done)
        return max(0, self.cfg.scheduler_concurrency - busy - self._reserved)

    async def _execute(self, run: Run) -> None:
        run_id = run.id
        ctx = HandlerContext(run, self.db, lease_seconds=self.cfg.lease_seconds)
        self._contexts[run_id] = ctx
        self._lease_until.setdefault(run_id, time.time() + self.cfg.lease_seconds)
        ok, result, error = False, None, None
        handler = self.handlers.get(run.handler)
        # The handler runs in this task, not in one of its own: a second task per run (and
        # its scheduling and done callbacks) was the largest part of the event loop's work
        # per short job (bench/profile_jobs.py --cprofile). Cancelling "the handler" is
        # cancelling this task while it is in the handler (_cancel_handler checks that).
        htask: asyncio.Task[Any] | None = None
        if handler is not None:
            htask = asyncio.current_task()
            assert htask is not None
            self._htasks[run_id] = htask
        # The lease guards (heartbeat, lease watch) start when the first heartbeat is
        # due (lease/3 after the claim was sent), not with the run: until then neither
        # has anything to do (the watch fires at lease - margin > lease/3), and most
        # jobs are done long before. Two tasks created and cancelled per run were a
        # third of the scheduler's own CPU per short job (cProfile on process time,
        # bench/profile_jobs.py); a timer handle costs a fraction of that.
        guards: list[asyncio.Task[Any]] = []

        def start_guards() -> None:
            guards.append(asyncio.create_task(self._heartbeat(ctx, htask)))
            if htask is not None:
                guards.append(asyncio.create_task(self._watch_lease(ctx, htask)))

        interval = max(self.cfg.lease_seconds / 3, 0.2)
        first_due = self._lease_until[run_id] - self.cfg.lease_seconds + interval
        guard_timer = asyncio.get_running_loop().call_later(max(0.0, first_due - time.time()), start_guards)

        def stop_guards() -> None:
            guard_timer.cancel()
            for g in guards:
                g.cancel()

        try:
            if handler is None or htask is None:
                error = f"unknown handler {run.handler!r} (registered: {', '.join(self.handlers.names())})"
            else:
                try:
                    result = await handler(ctx)
                    ok = True
                except asyncio.CancelledError:
                    if run_id not in self._lost:
                        raise                       # this run is being cancelled (shutdown)
                    htask.uncancel()                # the lease-loss cancel, consumed here
                except HandlerError as exc:
                    error = str(exc)
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    LOG.warning("run %s (%s) failed:\n%s", run_id, run.handler, traceback.format_exc())
                finally:
                    self._htasks.pop(run_id, None)  # out of the handler: nothing left to cancel
        except asyncio.CancelledError:
            stop_guards()
            self._forget(run_id)
            raise
        stop_guards()
        if run_id in self._lost:
            await self._after_lease_lost(run_id, cancelled=ctx.cancelled.is_set())
            return
        try:
            if ok:
                # counted in _flush, once per batch
                finished = await self._finish_ok(run_id, None if result is None else _jsonable(result))
            else:
                finished = await self.db.finish_run(run_id, self.worker, False, None, error)
                self.metrics.inc("switchboard_runs_finished_total", outcome="failed")
            if not finished:
                LOG.warning("run %s: lease lost before finish (another worker rescued it)", run_id)
        except Exception as exc:
            LOG.warning("run %s: finish failed (%s); the lease will expire and it is retried", run_id, exc)
        finally:
            self._forget(run_id)
            self._wake.set()

    def _forget(self, run_id: int) -> None:
        self._running.pop(run_id, None)
        self._contexts.pop(run_id, None)
        self._htasks.pop(run_id, None)
        self._lease_until.pop(run_id, None)
        self._lost.discard(run_id)

    def _lose_lease(self, ctx: HandlerContext, htask: asyncio.Task[Any] | None, why: str,
                    grace: float | None = None, cancelled: bool = False) -> None:
        """Tell the handler (ctx.lease_lost) and cancel it ``grace`` s later (default
        margin/2): its run may be rescued elsewhere, or was cancelled by an operator."""
        if ctx.run_id in self._lost:
            return
        if cancelled:
            LOG.info("run %s: cancelled by an operator; stopping its handler", ctx.run_id)
            self.metrics.inc("switchboard_runs_finished_total", outcome="cancelled")
        else:
            LOG.warning("run %s: lease lost (%s); cancelling its handler", ctx.run_id, why)
            self.metrics.inc("switchboard_leases_lost_total")
        self._lost.add(ctx.run_id)
        ctx.lease_lost.set()
        if htask is not None and self._htasks.get(ctx.run_id) is htask:
            # A handler that watches ctx.lease_lost gets half the margin to stop by itself
            # (and, say, tell its user); then it is cancelled -- still before the lease can
            # expire in the database.
            asyncio.get_running_loop().call_later(self._margin() / 2 if grace is None else grace,
                                                  self._cancel_handler, ctx.run_id, htask)

    def _cancel_handler(self, run_id: int, htask: asyncio.Task[Any]) -> None:
        """Cancel a run's handler if it is still in it (its task then records nothing)."""
        if self._htasks.get(run_id) is htask:
            htask.cancel()

    def _margin(self) -> float:
        return min(max(self.cfg.lease_seconds * 0.2, 0.2), 5.0)

    async def _watch_lease(self, ctx: HandlerContext, htask: asyncio.Task[Any]) -> None:
        """Cancel the handler once its lease can no longer be proven (see the module docstring)."""
        lease = self.cfg.lease_seconds
        margin = self._margin()
        while self._htasks.get(ctx.run_id) is htask:
            left = self._lease_until.get(ctx.run_id, 0.0) - margin - time.time()
            if left <= 0:
                self._lose_lease(ctx, htask, f"no heartbeat acknowledged for {lease - margin:.1f} s")
                return
            await asyncio.sleep(left)

    async def _after_lease_lost(self, run_id: int, cancelled: bool = False) -> None:
        """Free the slot, then hand the run back in the background (never record its outcome).

        release_run() is fenced: once the run was rescued it answers false and changes
        nothing. While the database is unreachable it is retried (every second, for up to
        2 x lease + 10 s), so the answer is seen once the link heals: true if the lease had
        not yet expired in the database (the run is queued again at once), false if it was
        rescued meanwhile."""
        self._forget(run_id)
        self._wake.set()
        task = asyncio.create_task(self._hand_back_lost(run_id, cancelled), name=f"hand-back-{run_id}")
        self._handbacks.add(task)
        task.add_done_callback(self._handbacks.discard)

    async def _hand_back_lost(self, run_id: int, cancelled: bool = False) -> None:
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

    async def _finish_ok(self, run_id: int, result: Any) -> bool:
        """Successes are recorded in batches: while one finish_runs() call is in flight,
        the next ones queue up and go together (group commit), with no added delay."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._done.append((run_id, result, fut))
        if not self._flushing:
            self._flushing = True
            asyncio.create_task(self._flush())
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
                ids = [b[0] for b in batch]
                want = self._refill_slots(ids)
                sent = time.time()
                runs: list[Run] = []
                self._reserved += want
                try:
                    if want:
                        finished, runs = await self.db.finish_and_claim(
                            self.worker, ids, [b[1] for b in batch], self.cfg.lease_seconds, want)
                    else:
                        finished = await self.db.finish_runs(self.worker, ids, [b[1] for b in batch])
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                finally:
                    self._reserved -= want
                self.metrics.inc("switchboard_runs_finished_total", len(batch), outcome="ok")
                if runs:
                    if self._stopping or self.replica.draining:
                        # stop() began while the call was in flight: never start them; hand them
                        # back before the finished runs' tasks end (stop() waits for those).
                        await self._release_claimed(runs, "claimed with a finish while stopping")
                    else:
                        self._start_runs(runs, sent)
                for run_id, _, fut in batch:
                    if not fut.done():
                        fut.set_result(run_id in finished)
        finally:
            self._flushing = False

    async def _heartbeat(self, ctx: HandlerContext, htask: asyncio.Task[Any] | None) -> None:
        """Extend the lease every lease/3. An acknowledged heartbeat proves the lease until
        its send time + lease; when the database says this worker no longer owns the run,
        the handler is told (ctx.lease_lost) and cancelled."""
        run_id = ctx.run_id
        lease = self.cfg.lease_seconds
        interval = max(lease / 3, 0.2)
        # Heartbeats keep a fixed cadence from the *send* time of the last proof (the claim,
        # then each heartbeat), not from when its answer arrived: over a slow link (say
        # 0.7 s round trips) "sleep, then send" spaced proofs by interval + RTT and let the
        # margin run out although every heartbeat was answered. With the cadence fixed the
        # lease survives round trips up to lease - margin - interval (1.4 s at lease 3 s).
        # Each heartbeat is one round trip (db.heartbeat_run skips the pool's idle check);
        # one that failed fast (a stale connection, discarded by the pool) is sent again at
        # once rather than an interval later, which the margin could not afford.
        next_send = self._lease_until.get(run_id, time.time() + lease) - lease + interval
        retried = False
        while True:
            await asyncio.sleep(max(0.0, next_send - time.time()))
            try:
                sent = time.time()
                next_send = sent + interval
                if not await self.db.heartbeat_run(run_id, self.worker, self.cfg.lease_seconds):
                    # Already rescued or cancelled: no deadline left to meet, so a cooperative
                    # handler gets one heartbeat interval (at least 1 s) to stop by itself and
                    # say so. lost_runs() says which (and sets ctx.cancelled for a cancel).
                    try:
                        await self.check_lost_runs()
                    except Exception as exc:
                        LOG.debug("lost_runs after a refused heartbeat: %s", exc)
                    self._lose_lease(ctx, htask, "the run was rescued by another worker",
                                     grace=max(interval, 1.0))
                    return
                if run_id in self._lease_until:
                    self._lease_until[run_id] = max(self._lease_until[run_id], sent + self.cfg.lease_seconds)
                if not self.replica.draining:
                    _extend_deadline(ctx, sent + self.cfg.lease_seconds)
                retried = False
            except Exception as exc:
                LOG.warning("run %s: heartbeat failed: %s", run_id, exc)
                if not retried and time.time() - sent < interval / 2:
                    retried, next_send = True, time.time()

    async def stop(self, grace: float) -> None:
        """Stop claiming; wait up to grace for running handlers; hand back the rest."""
        self._stopping = True
        self._wake.set()
        if self._fence_task is not None:
            self._fence_task.cancel()
            await asyncio.gather(self._fence_task, return_exceptions=True)
        until = time.time() + grace
        for ctx in self._contexts.values():
            _cap_deadline(ctx, until)
        if self._loop_task:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self._hand_back_inflight_claims(max(grace, 5.0))
        for t in list(self._handbacks):
            t.cancel()              # the lease expires; the run is rescued
        if self._running:
            LOG.info("waiting up to %.1fs for %d running run(s)", grace, len(self._running))
            await asyncio.wait(list(self._running.values()), timeout=grace)
        for run_id, task in list(self._running.items()):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            try:
                if await self.db.release_run(run_id, self.worker):
                    LOG.info("run %s handed back", run_id)
            except Exception as exc:
                LOG.warning("run %s: hand-back failed (%s); its lease will expire", run_id, exc)


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
            await self._release_claimed(runs, "claimed while stopping")

    async def _release_claimed(self, runs: list[Run], why: str) -> None:
        """Hand back runs that were claimed but never started here (fenced: release_run)."""
        for run in runs:
            try:
                if await self.db.release_run(run.id, self.worker):
                    LOG.info("run %s (%s) handed back", run.id, why)
            except Exception as exc:
                LOG.warning("run %s: hand-back failed (%s); its lease will expire", run.id, exc)


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return {"repr": repr(v)[:10000]}
