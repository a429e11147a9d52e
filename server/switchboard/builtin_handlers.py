"""The built-in task handlers.

They are ordinary handlers: what they need beyond the public HandlerContext
(the job role's SQL runner, the maintenance sweep and their settings) is
handed to ``builtin_handlers`` by the composition root and closed over, so the
context stays the small public API.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .config import Config
from .db import Database
from .handlers import HandlerContext, HandlerError, HandlerRegistry

# reap_runs / reap_rate_limits delete at most this many rows per call and
# transaction (V0013); a full batch back means more are due.
REAP_BATCH = 10_000
# How long one maintenance tick keeps sweeping while a reaper comes back full.
MAINTENANCE_BUDGET_S = 5.0


def builtin_handlers(db: Database, config: Config) -> HandlerRegistry:
    reg = HandlerRegistry()

    @reg.register("noop")
    async def noop(ctx: HandlerContext) -> Any:
        return None

    @reg.register("sleep")
    async def sleep(ctx: HandlerContext) -> Any:
        seconds = float(ctx.args.get("seconds", 1))
        await asyncio.sleep(min(max(seconds, 0), 3600))
        return {"slept": seconds}

    @reg.register("fail")
    async def fail(ctx: HandlerContext) -> Any:
        raise HandlerError(str(ctx.args.get("message", "failed on purpose")))

    @reg.register("sql")
    async def sql(ctx: HandlerContext) -> Any:
        """Run args.sql as the restricted role switchboard_job (tasks only, never one-off jobs:
        tasks are created by admins or DBAs, jobs by application code)."""
        if ctx.task_id is None:
            raise HandlerError("the sql handler runs only for tasks (admin-created), not enqueued jobs")
        statement = ctx.args.get("sql")
        if not isinstance(statement, str) or not statement.strip():
            raise HandlerError('args.sql must be a SQL statement, e.g. {"sql": "SELECT 1"}')
        raw = ctx.args.get("timeout_seconds", config.lease_seconds)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 86400:
            raise HandlerError(f"args.timeout_seconds must be a number of seconds (0 < t <= 86400), not {raw!r}")
        if raw == 0 and not config.sql_allow_no_timeout:
            raise HandlerError("args.timeout_seconds 0 (no timeout) is refused; give a bound, or set "
                               "SWITCHBOARD_SQL_ALLOW_NO_TIMEOUT=on on the replicas to allow it")
        return await db.run_job_sql(statement, float(raw))

    @reg.register("notify")
    async def notify(ctx: HandlerContext) -> Any:
        a = ctx.args
        event = a.get("event")
        payload = a.get("payload", {})
        if a.get("user_id"):
            return {"event_id": await ctx.notify_user(str(a["user_id"]), event, payload)}  # type: ignore[arg-type]
        if a.get("room"):
            return {"event_id": await ctx.notify_room(str(a["room"]), event, payload)}  # type: ignore[arg-type]
        raise HandlerError('notify needs args {"user_id" or "room", "event", "payload"}')

    @reg.register("maintenance")
    async def maintenance(ctx: HandlerContext) -> Any:
        # Every sweep is one short transaction with bounded reapers; a backlog
        # (a first run over a big history) drains sweep by sweep, not in one
        # transaction that would stall publishers, claims and vacuum.
        total = await db.maintenance(config.event_retention_seconds, config.replica_stale_seconds)
        res = total
        deadline = time.monotonic() + MAINTENANCE_BUDGET_S
        while (any(int(res.get(k) or 0) >= REAP_BATCH for k in ("runs", "rate_limits"))
               and time.monotonic() < deadline):
            await asyncio.sleep(0.05)
            res = await db.maintenance(config.event_retention_seconds, config.replica_stale_seconds)
            total = {k: int(total.get(k) or 0) + int(v or 0) for k, v in res.items()}
        return total

    return reg
