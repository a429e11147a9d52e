"""Task handlers: a registry plus the built-ins.

A handler is ``async def handler(ctx: HandlerContext) -> result`` where the
result is JSON-serialisable (stored in task_runs.result). Register your own:

    from switchboard.handlers import registry

    @registry.register("myapp.send_digest")
    async def send_digest(ctx):
        ...

and point SWITCHBOARD_HANDLERS at the module(s) that do so.
"""

from __future__ import annotations

import asyncio
import importlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import Services


class HandlerError(Exception):
    """Raised by a handler to fail a run with a clean message."""


@dataclass
class HandlerContext:
    svc: "Services"
    run: dict

    @property
    def args(self) -> dict:
        return self.run.get("args") or {}


Handler = Callable[[HandlerContext], Awaitable[Any]]


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, name: str) -> Callable[[Handler], Handler]:
        def deco(fn: Handler) -> Handler:
            self._handlers[name] = fn
            return fn
        return deco

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def load_modules(self, modules: list[str]) -> None:
        for m in modules:
            importlib.import_module(m)


registry = HandlerRegistry()


@registry.register("noop")
async def noop(ctx: HandlerContext) -> Any:
    return None


@registry.register("sleep")
async def sleep(ctx: HandlerContext) -> Any:
    seconds = float(ctx.args.get("seconds", 1))
    await asyncio.sleep(min(max(seconds, 0), 3600))
    return {"slept": seconds}


@registry.register("fail")
async def fail(ctx: HandlerContext) -> Any:
    raise HandlerError(str(ctx.args.get("message", "failed on purpose")))


@registry.register("sql")
async def sql(ctx: HandlerContext) -> Any:
    """Run args.sql as the restricted role switchboard_job (tasks only, never one-off jobs:
    tasks are created by admins or DBAs, jobs by application code)."""
    if ctx.run.get("task_id") is None:
        raise HandlerError("the sql handler runs only for tasks (admin-created), not enqueued jobs")
    statement = ctx.args.get("sql")
    if not isinstance(statement, str) or not statement.strip():
        raise HandlerError('args.sql must be a SQL statement, e.g. {"sql": "SELECT 1"}')
    timeout = float(ctx.args.get("timeout_seconds", ctx.svc.config.lease_seconds))
    return await ctx.svc.db.run_job_sql(statement, timeout)


@registry.register("notify")
async def notify(ctx: HandlerContext) -> Any:
    a = ctx.args
    event = a.get("event")
    payload = a.get("payload", {})
    if a.get("user_id"):
        return {"event_id": await ctx.svc.db.notify_user(uuid.UUID(str(a["user_id"])), event, payload)}
    if a.get("room"):
        return {"event_id": await ctx.svc.db.notify_room(str(a["room"]), event, payload)}
    raise HandlerError('notify needs args {"user_id" or "room", "event", "payload"}')


@registry.register("maintenance")
async def maintenance(ctx: HandlerContext) -> Any:
    cfg = ctx.svc.config
    return await ctx.svc.db.maintenance(cfg.event_retention_seconds, cfg.replica_stale_seconds)
