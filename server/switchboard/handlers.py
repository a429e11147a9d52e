"""The public handler API: what a task handler sees, and how it is found.

A handler is ``async def handler(ctx: HandlerContext) -> result`` where the
result is JSON-serialisable (stored in task_runs.result). A plain ``def`` is
run in a worker thread (``as_handler``), never on the event loop. Raise
``HandlerError("message")`` to fail the run with a clean message (it is
retried while attempts remain).

Handlers are found three ways, all merged into one ``HandlerRegistry`` when a
replica starts (``load_handlers``):

* the built-ins (noop, sleep, fail, sql, notify, maintenance);
* the ``switchboard.handlers`` entry-point group of installed distributions --
  the packaging convention; the entry point's name is the handler name::

      [project.entry-points."switchboard.handlers"]
      "myapp.send_digest" = "myapp.jobs:send_digest"

* modules named in ``SWITCHBOARD_HANDLERS`` that register with the decorator::

      from switchboard.handlers import registry

      @registry.register("myapp.send_digest")
      async def send_digest(ctx): ...

This module is the stable surface for handler authors: ``HandlerContext``,
``HandlerError``, ``registry``. It imports nothing of the server's internals
but the data layer it wraps; the server's components are never reachable from
a context.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from .db import Database
from .rows import Run
from .streams.producer import Stream

if TYPE_CHECKING:
    from .streams.writer import Producer

ENTRY_POINT_GROUP = "switchboard.handlers"
LOG = logging.getLogger("switchboard.handlers")
T = TypeVar("T")
SYNC_THREADS = 32   # worker threads for plain-def handlers, per replica process


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


class HandlerLoadError(RuntimeError):
    """A handler source (SWITCHBOARD_HANDLERS module, entry point) could not be loaded:
    the replica refuses to start, with one line naming it."""


class HandlerContext:
    """What a running handler may know and do. Stable public API.

    The run:
      ``run_id``, ``attempt`` (1 on the first try), ``max_attempts``, ``args``
      (the run's JSON arguments, a dict), ``task_id`` (None for an enqueued
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
      max_attempts=3)`` -> the new job's run id, or None when queueing_lock is
      already held by a queued or running job.
    Streams (docs/streams.md): an answer written chunk by chunk to a user on any
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
        self.args: dict[str, Any] = run.args or {}
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

    async def enqueue(self, handler: str, args: dict[str, Any] | None = None, *, run_at: datetime | None = None,
                      queueing_lock: str | None = None, max_attempts: int = 3) -> int | None:
        row = await self._db.enqueue(handler, args or {}, run_at, queueing_lock, max_attempts)
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
_threads: ThreadPoolExecutor | None = None


def _thread_pool() -> ThreadPoolExecutor:
    """Plain-def handlers' own threads: never the loop's default executor, which password
    hashing and DNS share, so blocking jobs cannot hold up a login."""
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="switchboard-handler")
    return _threads


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def as_handler(name: str, fn: Any) -> Handler:
    """``fn`` as the scheduler calls it. An ``async def`` as it is. A plain ``def`` runs in
    a worker thread (SYNC_THREADS per process), so its blocking calls never stall the
    event loop that serves every socket; it reaches the context's coroutines through
    ``ctx.sync(...)``. A thread cannot be cancelled: after a lost lease its result is
    discarded but its body runs to the end (check ``ctx.lease_lost.is_set()``). Refused
    with HandlerLoadError: anything not callable, and generators (they return before
    their body runs)."""
    if not callable(fn):
        raise HandlerLoadError(f"handler {name!r}: {fn!r} is not callable")
    if _is_async(fn):
        return fn  # type: ignore[no-any-return]
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise HandlerLoadError(f"handler {name!r}: {getattr(fn, '__qualname__', fn)!r} is a generator; "
                               "a handler is an async def or a plain def returning its result")

    @functools.wraps(fn)
    async def in_thread(ctx: HandlerContext) -> Any:
        loop = asyncio.get_running_loop()
        ctx._loop = loop
        try:
            result = await loop.run_in_executor(_thread_pool(), contextvars.copy_context().run, fn, ctx)
        finally:
            ctx._loop = None
        if inspect.isawaitable(result):   # a plain callable that returns a coroutine
            result = await result
        return result
    return in_thread


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(fn: T) -> T:
            self.add(name, fn)
            return fn
        return deco

    def add(self, name: str, fn: Any) -> None:
        self._handlers[name] = as_handler(name, fn)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def update(self, other: "HandlerRegistry") -> None:
        self._handlers.update(other._handlers)

    def load_modules(self, modules: list[str]) -> None:
        for m in modules:
            try:
                importlib.import_module(m)
            except Exception as exc:
                raise HandlerLoadError(f"SWITCHBOARD_HANDLERS: cannot import {m!r}: "
                                       f"{type(exc).__name__}: {exc}") from exc


# Decorator target for SWITCHBOARD_HANDLERS modules (public API).
registry = HandlerRegistry()


def discover_entry_points(into: HandlerRegistry, group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Load the ``switchboard.handlers`` entry points. An entry point naming a callable
    registers it under the entry point's name; one naming a module imports it (the
    module registers itself with the decorator). Returns the names added."""
    added = []
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
        except Exception as exc:  # name the package: a replica must not die with a bare traceback
            dist = getattr(ep.dist, "name", "?")
            raise HandlerLoadError(f"handler entry point {ep.name} = {ep.value} (distribution {dist}) "
                               f"failed to load: {type(exc).__name__}: {exc}") from exc
        if isinstance(obj, ModuleType):
            continue
        if not callable(obj):
            raise HandlerLoadError(f"entry point {ep.name} = {ep.value} in group {group} is not callable")
        into.add(ep.name, obj)
        added.append(ep.name)
    return added


def load_handlers(modules: list[str], builtins: HandlerRegistry) -> HandlerRegistry:
    """One registry for this replica: built-ins, then entry points, then the
    decorator-registered handlers of SWITCHBOARD_HANDLERS modules (later wins)."""
    out = HandlerRegistry()
    out.update(builtins)
    discover_entry_points(out)
    registry.load_modules(modules)
    out.update(registry)
    LOG.debug("handlers: %s", ", ".join(out.names()))
    return out

