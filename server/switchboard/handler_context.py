"""What a running handler sees: its context (HandlerContext), the errors it raises
(HandlerError, PermanentError), and how a result or a failure is recorded.

Handler authors import these from ``switchboard.handlers`` (the public surface, which
also holds the registry); this module is the context's own unit, so the registry can
use it without an import cycle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, cast

from typing_extensions import TypeVar
from uuid import UUID

from .db import Database
from .jobargs import ArgsError, dump_args
from .rows import Run
from .streams.producer import Stream

if TYPE_CHECKING:
    from .streams.writer import Producer

LOG = logging.getLogger("switchboard.handlers")
T = TypeVar("T")
A = TypeVar("A", default=dict[str, Any])   # the args type: HandlerContext[InvoiceArgs] for a handler registered with args=InvoiceArgs


class HandlerError(Exception):
    """Raised by a handler to fail a run with a clean message."""


def failure_message(exc: BaseException) -> str:
    """What a run that raised ``exc`` records as its error: a HandlerError's own message,
    any other exception's type and message."""
    return str(exc) if isinstance(exc, HandlerError) else f"{type(exc).__name__}: {exc}"


def stored_result(value: Any) -> Any:
    """What a run's result is stored as: the value if JSON can carry it, else its repr."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return {"repr": repr(value)[:10000]}


class HandlerContext(Generic[A]):
    """What a running handler may know and do. Stable public API.

    The run:
      ``run_id``, ``attempt`` (1 on the first try), ``max_attempts``, ``args``
      (the run's JSON arguments, a dict; an instance of the args type for a handler
      registered with ``args=``: ``HandlerContext[InvoiceArgs]``), ``task_id`` (None for an enqueued
      one-off job), ``handler`` (the name it was started under), ``trigger``
      ('schedule', 'api', 'enqueue', 'retry', ...), ``scheduled_for``.
    A logger: ``logger`` (``switchboard.handler.<name>``, records carry the run id).
    Side effects, each committed in its OWN short transaction the moment it is
    called (not in the run's transaction: the run's outcome is recorded later
    by the scheduler). An event sent before the handler fails is therefore
    delivered; retried runs may send it again, so make events idempotent for
    the client (or send them last):
      ``await ctx.notify_user(user_id, event, payload)`` -> event id
      ``await ctx.notify_room(room, event, payload)``    -> event id
      ``await ctx.enqueue(handler, args, run_at=None, queueing_lock=None,
      max_attempts=None, priority=None, queue=None)`` -> the new job's run id,
      or None when queueing_lock is already held by a queued or running job;
      ``args`` a dict or an args dataclass instance, None options the handler's own.
    Streams (docs/how-to/streams.md): an answer written chunk by chunk to a user on any
    replica, resumable and stoppable::

        async with ctx.stream(user_id, "completion") as s:
            async for token in model(prompt):
                await s.send(token)      # raises StreamStopped once stopped: the block ends quietly
            s.final = {"text": answer}   # the one durable stream.end event carries it
    Time:
      ``deadline`` (aware UTC datetime): after it the run's result may no
      longer count -- the current lease expiry (pushed forward by every
      successful lease heartbeat) or, once the replica drains, the end of the
      shutdown grace, whichever is first. ``seconds_left()`` is the same as a
      number.
      ``lease_lost`` (asyncio.Event): set when this worker no longer owns the
      run: it was rescued by another replica after a stall, or an operator
      cancelled it. The result will be discarded; stop work and return (the
      handler is cancelled about a second later otherwise).
      ``await ctx.wait_lease_lost(timeout)`` waits for it.
      ``cancelled`` (asyncio.Event): set, together with ``lease_lost``, when an
      operator cancelled the run (cancel_run(), ``switchboard runs cancel``,
      ``POST /runs/{id}/cancel``), so a handler can tell the two apart.
    """

    __slots__ = ("run_id", "attempt", "max_attempts", "args", "task_id", "handler", "trigger",
                 "scheduled_for", "_logger", "lease_lost", "cancelled", "_db", "_deadline", "_streams", "_loop")

    def __init__(self, run: Run | Mapping[str, Any], db: Database, *, lease_seconds: float,
                 lease_lost: asyncio.Event | None = None, streams: Producer | None = None) -> None:
        if not isinstance(run, Run):
            run = Run.from_row(run)  # a row of db.RUN_COLUMNS (bench/ passes those)
        self.run_id: int = run.id
        self.attempt: int = run.attempt or 1
        self.max_attempts: int = run.max_attempts or 1
        # the run's JSON arguments; for a handler registered with args=SomeType, an instance
        # of it (checked when the run starts)
        self.args: A = cast("A", run.args or {})
        self.task_id: UUID | None = run.task_id
        self.handler: str = run.handler
        self.trigger: str | None = run.trigger
        self.scheduled_for: datetime | None = run.scheduled_for
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None
        self.lease_lost = lease_lost if lease_lost is not None else asyncio.Event()
        self.cancelled = asyncio.Event()
        self._db = db
        self._streams = streams
        self._deadline = time.time() + lease_seconds
        self._loop: asyncio.AbstractEventLoop | None = None   # set while a plain-def handler runs

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """Made on first use: most handlers never log, and getLogger() takes the logging
        module's lock (a measurable part of a short job's CPU, bench/profile_jobs.py)."""
        if self._logger is None:
            self._logger = logging.LoggerAdapter(logging.getLogger(f"switchboard.handler.{self.handler}"),
                                                 {"run_id": self.run_id})
        return self._logger

    # -- time -------------------------------------------------------------------
    @property
    def deadline(self) -> datetime:
        return datetime.fromtimestamp(self._deadline, tz=timezone.utc)

    def seconds_left(self) -> float:
        return max(0.0, self._deadline - time.time())

    async def wait_lease_lost(self, timeout: float | None = None) -> bool:
        """True once the lease is lost; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self.lease_lost.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    # -- side effects ---------------------------------------------------------------
    async def notify_user(self, user_id: UUID | str, event: str, payload: Any = None) -> int:
        return await self._db.notify_user(UUID(str(user_id)), event, {} if payload is None else payload)

    async def notify_room(self, room: str, event: str, payload: Any = None) -> int:
        return await self._db.notify_room(room, event, {} if payload is None else payload)

    async def enqueue(self, handler: str, args: Any = None, *, args_type: Any = None,
                      run_at: datetime | None = None, queueing_lock: str | None = None,
                      max_attempts: int | None = None, priority: int | None = None,
                      queue: str | None = None) -> int | None:
        """As ``switchboard.api.enqueue`` (a dataclass instance or a dict for ``args``; None
        options take the handler's registered ones), in its own short transaction."""
        try:
            data = dump_args(args, args_type)
        except ArgsError as exc:
            exc.handler = handler
            raise
        row = await self._db.enqueue(handler, data, run_at, queueing_lock, max_attempts, priority, queue)
        return None if row is None else row["id"]

    def stream(self, user_id: UUID | str, kind: str, *, meta: dict[str, Any] | None = None,
               room: str | None = None, lease: float = 30.0, lifetime: float = 3600.0) -> Stream:
        """A new stream owned by ``user_id`` (readable by ``room``'s members too, if given):
        ``async with ctx.stream(user_id, "completion") as s: await s.send(chunk)``. Its chunks
        are written by this replica's group append; ``s.id`` is what the client follows."""
        if self._streams is None:
            raise RuntimeError("streams are not available in this context (no producer)")
        return self._streams.stream(user_id, kind, meta=meta, room=room, lease=lease, lifetime=lifetime)

    # -- plain-def handlers -----------------------------------------------------------------
    def sync(self, awaitable: Awaitable[T]) -> T:
        """From a plain ``def`` handler (it runs in a worker thread): run one of the
        context's coroutines on the replica's event loop and wait for its result, e.g.
        ``ctx.sync(ctx.notify_user(user_id, "done", {}))``."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("ctx.sync() works only while a plain-def handler runs (an async handler "
                               "awaits instead; once its run ended or its lease was lost, nothing more is sent)")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("ctx.sync() called on the event loop; await the coroutine instead")

        async def wrap() -> T:
            return await awaitable
        return asyncio.run_coroutine_threadsafe(wrap(), loop).result()

    def __repr__(self) -> str:
        return f"<HandlerContext run={self.run_id} handler={self.handler!r} attempt={self.attempt}>"


# -- scheduler side (not for handler authors) ---------------------------------------------
def _extend_deadline(ctx: HandlerContext, until: float) -> None:
    ctx._deadline = until


def _cap_deadline(ctx: HandlerContext, until: float) -> None:
    ctx._deadline = min(ctx._deadline, until)


Handler = Callable[[HandlerContext], Coroutine[Any, Any, Any]]  # an `async def` (run as a task)


class PermanentError(HandlerError):
    """Raised by a handler to fail a run for good: it is not retried, whatever attempts
    remain (River's JobCancel). A run whose arguments do not match its handler's args
    type fails this way: no retry can fix them."""
