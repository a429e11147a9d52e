"""The in-process scheduler: every replica claims its share through SQL.

Nothing is decided here: claim_due_task picks the work (SKIP LOCKED), the
lease fences stale workers, finish_run records the outcome and schedules
retries. This loop only decides *when to ask*: at once when the relay hears
switchboard_runs (a triggered run starts within milliseconds), otherwise
every poll interval (with jitter, so replicas do not poll in lockstep), and
never more than ``concurrency`` runs at a time. While a handler runs, its
lease is extended every lease/3 (pushing ``ctx.deadline`` forward); when the
database says the lease is gone, ``ctx.lease_lost`` is set. On shutdown it
stops claiming, caps every running handler's deadline at the end of the grace
period, lets them finish within it and hands the rest back with release_run()
so another replica takes them at once.
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

LOG = logging.getLogger("switchboard.scheduler")


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
        self._wake = asyncio.Event()
        self._stopping = False
        self._running: dict[int, asyncio.Task] = {}
        self._loop_task: asyncio.Task | None = None
        self._done: list[tuple[int, Any, asyncio.Future[bool]]] = []
        self._flushing = False

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="scheduler")

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
            free = self.cfg.scheduler_concurrency - len(self._running)
            if free <= 0:
                return
            runs = await self.db.claim_many(self.worker, self.cfg.lease_seconds, free)
            for run in runs:
                self.metrics.inc("switchboard_claims_total", handler=run["handler"])
                if run.get("started_at") and run.get("run_at"):  # both on the database clock
                    self.metrics.observe("switchboard_claim_latency_seconds",
                                         (run["started_at"] - run["run_at"]).total_seconds())
                self._running[run["id"]] = asyncio.create_task(self._execute(run), name=f"run-{run['id']}")
            if len(runs) < free:
                return  # nothing more is due right now

    async def _execute(self, run: dict) -> None:
        run_id = run["id"]
        ctx = HandlerContext(run, self.db, lease_seconds=self.cfg.lease_seconds)
        self._contexts[run_id] = ctx
        hb = asyncio.create_task(self._heartbeat(ctx))
        ok, result, error = False, None, None
        try:
            handler = self.handlers.get(run["handler"])
            if handler is None:
                error = f"unknown handler {run['handler']!r} (registered: {', '.join(self.handlers.names())})"
            else:
                try:
                    result = await handler(ctx)
                    ok = True
                except asyncio.CancelledError:
                    raise
                except HandlerError as exc:
                    error = str(exc)
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    LOG.warning("run %s (%s) failed:\n%s", run_id, run["handler"], traceback.format_exc())
        except asyncio.CancelledError:
            hb.cancel()
            self._running.pop(run_id, None)
            self._contexts.pop(run_id, None)
            raise
        hb.cancel()
        try:
            if ok:
                finished = await self._finish_ok(run_id, _jsonable(result))
            else:
                finished = await self.db.finish_run(run_id, self.worker, False, None, error)
            if not finished:
                LOG.warning("run %s: lease lost before finish (another worker rescued it)", run_id)
            self.metrics.inc("switchboard_runs_finished_total", outcome="ok" if ok else "failed")
        except Exception as exc:
            LOG.warning("run %s: finish failed (%s); the lease will expire and it is retried", run_id, exc)
        finally:
            self._running.pop(run_id, None)
            self._contexts.pop(run_id, None)
            self._wake.set()

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
        try:
            while self._done:
                batch, self._done = self._done, []
                try:
                    finished = await self.db.finish_runs(self.worker, [b[0] for b in batch],
                                                             [b[1] for b in batch])
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for run_id, _, fut in batch:
                    if not fut.done():
                        fut.set_result(run_id in finished)
        finally:
            self._flushing = False

    async def _heartbeat(self, ctx: HandlerContext) -> None:
        """Extend the lease every lease/3; when the database says this worker no longer
        owns the run, tell the handler through ctx.lease_lost."""
        run_id = ctx.run_id
        interval = max(self.cfg.lease_seconds / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                sent = time.time()
                if not await self.db.heartbeat_run(run_id, self.worker, self.cfg.lease_seconds):
                    LOG.warning("run %s: lease lost", run_id)
                    ctx.lease_lost.set()
                    return
                if not self.replica.draining:
                    _extend_deadline(ctx, sent + self.cfg.lease_seconds)
            except Exception as exc:
                LOG.warning("run %s: heartbeat failed: %s", run_id, exc)

    async def stop(self, grace: float) -> None:
        """Stop claiming; wait up to grace for running handlers; hand back the rest."""
        self._stopping = True
        self._wake.set()
        until = time.time() + grace
        for ctx in self._contexts.values():
            _cap_deadline(ctx, until)
        if self._loop_task:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
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


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return {"repr": repr(v)[:10000]}
