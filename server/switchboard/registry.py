"""Handler registration: which function runs a handler name, with which options and
args type, and how a replica finds them (built-ins, entry points, modules).

Handler authors import all of this from ``switchboard.handlers`` (the public
surface); it lives here so that the context a handler sees and the registry that
finds it stay two units.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from .handler_options import DEFAULT_QUEUE, HandlerOptions, RetryStrategy
from .jobargs import check_args_type

if TYPE_CHECKING:
    from .handler_context import Handler, HandlerContext

ENTRY_POINT_GROUP = "switchboard.handlers"
LOG = logging.getLogger("switchboard.handlers")
T = TypeVar("T")
SYNC_THREADS = 32   # worker threads for plain-def handlers, per replica process
_threads: ThreadPoolExecutor | None = None


class HandlerLoadError(RuntimeError):
    """A handler source (SWITCHBOARD_HANDLERS module, entry point) could not be loaded, or
    a registration is invalid: the replica refuses to start, with one line naming it."""


@dataclass(frozen=True, slots=True)
class Registration:
    """One handler as registered: the callable the scheduler awaits, its options, and
    the type its args are checked against (None: a plain dict)."""

    fn: Handler
    options: HandlerOptions
    args_type: Any = None


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


def _options(name: str, queue: str | None, priority: int | None, max_attempts: int | None,
             retry: RetryStrategy | None, timeout: float | None) -> HandlerOptions:
    try:
        return HandlerOptions(queue=DEFAULT_QUEUE if queue is None else queue,
                              priority=0 if priority is None else priority,
                              max_attempts=3 if max_attempts is None else max_attempts,
                              retry=RetryStrategy() if retry is None else retry, timeout=timeout)
    except (TypeError, ValueError) as exc:
        raise HandlerLoadError(f"handler {name!r}: {exc}") from exc


class HandlerRegistry:
    def __init__(self) -> None:
        self._regs: dict[str, Registration] = {}

    def register(self, name: str, *, args: Any = None, queue: str | None = None, priority: int | None = None,
                 max_attempts: int | None = None, retry: RetryStrategy | None = None,
                 timeout: float | None = None) -> Callable[[T], T]:
        """Decorator: ``@registry.register("invoice.send", args=InvoiceArgs, queue="emails",
        priority=5, max_attempts=5, retry=RetryStrategy(base=2, cap=600, jitter=0.2),
        timeout=30)``. Every option is checked here: a bad one stops the replica at start
        (HandlerLoadError naming the handler), never a run later."""
        def deco(fn: T) -> T:
            self.add(name, fn, args=args, queue=queue, priority=priority, max_attempts=max_attempts,
                     retry=retry, timeout=timeout)
            return fn
        return deco

    def add(self, name: str, fn: Any, *, args: Any = None, queue: str | None = None, priority: int | None = None,
            max_attempts: int | None = None, retry: RetryStrategy | None = None,
            timeout: float | None = None) -> None:
        options = _options(name, queue, priority, max_attempts, retry, timeout)
        if args is not None:
            try:
                check_args_type(args)
            except TypeError as exc:
                raise HandlerLoadError(f"handler {name!r}: args type: {exc}") from exc
        self._regs[name] = Registration(as_handler(name, fn), options, args)

    def get(self, name: str) -> Handler | None:
        reg = self._regs.get(name)
        return None if reg is None else reg.fn

    def registration(self, name: str) -> Registration | None:
        return self._regs.get(name)

    def names(self) -> list[str]:
        return sorted(self._regs)

    def options(self) -> dict[str, HandlerOptions]:
        """Every handler's options, by name (what the replica stores at start)."""
        return {name: reg.options for name, reg in sorted(self._regs.items())}

    def queues(self) -> set[str]:
        """The named queues the handlers' options name."""
        return {reg.options.queue for reg in self._regs.values()} - {DEFAULT_QUEUE}

    def update(self, other: HandlerRegistry) -> None:
        self._regs.update(other._regs)

    def load_modules(self, modules: list[str]) -> None:
        for m in modules:
            try:
                importlib.import_module(m)
            except HandlerLoadError:
                raise
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
