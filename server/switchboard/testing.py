"""Run a handler against a real throwaway database, without a replica.

What River's ``rivertest`` and procrastinate's in-memory connector give, but on the
real functions: the job is enqueued, claimed and finished by switchboard's own SQL,
so what the handler publishes and enqueues through ``ctx`` lands in real tables::

    from switchboard.testing import throwaway_database, run_handler_sync

    def test_send_digest():
        with throwaway_database() as url:                 # PostgreSQL + migrations, then gone
            out = run_handler_sync(send_digest, {"user_id": uid}, database_url=url)
        assert out.ok and out.result == {"sent": 3}
        assert [e.event for e in out.events] == ["digest.sent"]
        assert [j.handler for j in out.jobs] == ["digest.cleanup"]

``throwaway_database()`` needs the PostgreSQL server binaries and the ``dev``
extra (testing.postgresql), as ``switchboard dev`` does; pass ``database_url`` of
any migrated database instead (one per test: events and jobs are read back by id).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .db import Database
from .handlers import HandlerContext, HandlerRegistry, stored_result
from .jobargs import dump_args
from .rows import Run
from .scheduler.invoke import invoke

__all__ = ["Outcome", "PublishedEvent", "QueuedJob", "run_handler", "run_handler_sync", "throwaway_database"]


@dataclass(frozen=True)
class PublishedEvent:
    id: int
    user_id: uuid.UUID | None
    room: str | None
    event: str
    payload: Any


@dataclass(frozen=True)
class QueuedJob:
    id: int
    handler: str
    args: dict[str, Any]
    run_at: datetime | None
    queueing_lock: str | None


@dataclass(frozen=True)
class Outcome:
    """How the run ended, as the scheduler would record it, and what it left behind."""

    run_id: int
    ok: bool
    result: Any
    error: str | None
    events: list[PublishedEvent] = field(default_factory=list)
    jobs: list[QueuedJob] = field(default_factory=list)


@contextmanager
def throwaway_database() -> Iterator[str]:
    """A PostgreSQL of its own, migrated; its URL. Stopped and deleted on exit."""
    from .migrate import migrate
    from .pgtest import ThrowawayPostgres

    with ThrowawayPostgres() as pg:
        url = pg.url()
        migrate(url)
        yield url


async def run_handler(handler: Any, args: Any = None, *, database_url: str, name: str = "test.handler",
                      lease_seconds: float = 60.0, args_type: Any = None, timeout: float | None = None) -> Outcome:
    """Enqueue one job for ``handler`` (an ``async def`` or a plain ``def``, as the replica
    runs it), claim it, run the handler with a real ``HandlerContext``, finish the run.
    ``ok`` False with ``error`` as the run would record it when the handler raised.
    ``args``: a dict or an args dataclass instance; ``args_type`` and ``timeout`` as the
    handler's registration gives them (the handler then gets an instance of its type,
    and a mismatch fails the run naming the field, as on a replica)."""
    reg = HandlerRegistry()
    reg.add(name, handler, args=args_type, timeout=timeout)
    registration = reg.registration(name)
    assert registration is not None
    worker = f"switchboard-testing:{uuid.uuid4().hex[:8]}"
    db = Database(database_url, min_size=1, max_size=4, name="switchboard-testing")
    await db.pool.open(wait=True)
    try:
        before = await db.scalar("SELECT coalesce(max(id), 0) FROM switchboard.events")
        queued = await db.enqueue(name, dump_args(args, args_type), None, None, 1, None, "default")
        assert queued is not None
        run = await _claim(db, worker, queued["id"], lease_seconds)
        jobs_before = run.id
        ctx: HandlerContext[Any] = HandlerContext(run, db, lease_seconds=lease_seconds)
        result, error, _ = await invoke(registration, ctx)
        stored = None if result is None else stored_result(result)
        await db.finish_run(run.id, worker, error is None, stored, error)
        return Outcome(run.id, error is None, stored, error, await _events(db, before),
                       await _jobs(db, jobs_before))
    finally:
        await db.close()


def run_handler_sync(handler: Any, args: Any = None, *, database_url: str, name: str = "test.handler",
                     lease_seconds: float = 60.0, args_type: Any = None, timeout: float | None = None) -> Outcome:
    """:func:`run_handler` from synchronous test code."""
    return asyncio.run(run_handler(handler, args, database_url=database_url, name=name,
                                   lease_seconds=lease_seconds, args_type=args_type, timeout=timeout))


async def _claim(db: Database, worker: str, run_id: int, lease: float) -> Run:
    """Claim the job just queued; anything else due (the maintenance task's tick) goes back."""
    for _ in range(100):
        runs = await db.claim_due_tasks(worker, lease, 10)
        mine = [r for r in runs if r.id == run_id]
        for r in runs:
            if r.id != run_id:
                await db.release_run(r.id, worker)
        if mine:
            return mine[0]
        if not runs:
            await asyncio.sleep(0.05)   # not claimable yet (a paused handler is never)
    raise RuntimeError(f"job {run_id} could not be claimed (is its handler paused?)")


async def _events(db: Database, after_id: int) -> list[PublishedEvent]:
    rows = await db.fetchall("SELECT id, user_id, room, event, payload FROM switchboard.events "
                             "WHERE id > %s ORDER BY id", (after_id,))
    return [PublishedEvent(r["id"], r["user_id"], r["room"], r["event"], r["payload"]) for r in rows]


async def _jobs(db: Database, after_id: int) -> list[QueuedJob]:
    rows = await db.fetchall("SELECT id, handler, args, run_at, queueing_lock FROM switchboard.task_runs "
                             "WHERE id > %s AND trigger = 'enqueue' ORDER BY id", (after_id,))
    return [QueuedJob(r["id"], r["handler"], r["args"], r["run_at"], r["queueing_lock"]) for r in rows]
