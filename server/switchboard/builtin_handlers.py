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
from uuid import UUID

import psycopg

from . import bounded
from .config import Config
from .db import Database, SqlJobTimeout
from .handlers import HandlerContext, HandlerError, HandlerRegistry

# The bounded reapers (reap_runs, reap_rate_limits since V0013, reap_events
# since V0015) delete at most this many rows per sweep and transaction; a full
# batch back means more are due.
REAP_BATCH = 10_000
REAPED_IN_BATCHES = ("runs", "runs_backfilled", "rate_limits", "events")
# How long one maintenance tick keeps sweeping while a reaper comes back full.
MAINTENANCE_BUDGET_S = 5.0
NOTIFY_USAGE = 'notify needs args {"user_id" or "room", "event": "<name>", "payload": {...}}'


def builtin_handlers(db: Database, config: Config, rejections: bounded.Rejections | None = None) -> HandlerRegistry:
    """``rejections`` counts refused job arguments (switchboard_bad_input_total{source="job"})."""
    b = _Builtins(db, config, rejections)
    reg = HandlerRegistry()
    reg.add("noop", _noop)
    reg.add("sleep", b.sleep)
    reg.add("fail", _fail)
    reg.add("sql", b.sql)
    reg.add("notify", b.notify)
    reg.add("maintenance", b.maintenance)
    return reg


async def _noop(ctx: HandlerContext) -> Any:
    return None


async def _fail(ctx: HandlerContext) -> Any:
    raise HandlerError(str(ctx.args.get("message", "failed on purpose")))


class _Builtins:
    """The handlers that need more than the context: what the composition root handed
    ``builtin_handlers`` (the data layer, the settings, the bad-input counter)."""

    def __init__(self, db: Database, config: Config, rejections: bounded.Rejections | None) -> None:
        self.db = db
        self.config = config
        self.rejections = rejections

    def refused(self, ctx: HandlerContext, reason: str, message: str) -> HandlerError:
        """Job args are outside input (whoever created the task or job): a refusal fails
        the run with ``message`` and is counted and logged like any refused input."""
        if self.rejections is not None:
            self.rejections.record("job", reason, f"{ctx.handler} run {ctx.run_id}: {message}")
        return HandlerError(message)

    async def sleep(self, ctx: HandlerContext) -> Any:
        raw = ctx.args.get("seconds", 1)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 3600:
            raise self.refused(ctx, _number_reason(raw),
                               f"args.seconds must be a number of seconds in [0, 3600], not {raw!r:.50}")
        seconds = float(raw)
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    async def sql(self, ctx: HandlerContext) -> Any:
        """Run args.sql as the restricted role switchboard_job (tasks only, never one-off jobs:
        tasks are created by admins or DBAs, jobs by application code)."""
        statement, timeout = self._sql_args(ctx)
        try:
            return await self.db.run_job_sql(statement, timeout, run_id=ctx.run_id,
                                             grace_s=self.config.sql_kill_grace_seconds)
        except SqlJobTimeout as exc:
            if exc.terminated:
                ctx.logger.warning("sql run %s: %s", ctx.run_id, exc)
            raise HandlerError(str(exc)) from None
        except psycopg.Error as exc:   # the statement's own error: the run's error, not a traceback
            raise HandlerError(_db_message(exc)) from None

    def _sql_args(self, ctx: HandlerContext) -> tuple[str, float]:
        """The sql handler's statement and timeout, or a HandlerError saying what is wrong."""
        if ctx.task_id is None:
            raise HandlerError("the sql handler runs only for tasks (admin-created), not enqueued jobs")
        statement = ctx.args.get("sql")
        if not isinstance(statement, str) or not statement.strip():
            raise self.refused(ctx, "bad_type" if not isinstance(statement, str) else "bad_text",
                               'args.sql must be a SQL statement, e.g. {"sql": "SELECT 1"}')
        raw = ctx.args.get("timeout_seconds", self.config.lease_seconds)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 86400:
            raise self.refused(ctx, _number_reason(raw),
                               f"args.timeout_seconds must be a number of seconds (0 < t <= 86400), not {raw!r:.50}")
        if raw == 0 and not self.config.sql_allow_no_timeout:
            raise HandlerError("args.timeout_seconds 0 (no timeout) is refused; give a bound, or set "
                               "SWITCHBOARD_SQL_ALLOW_NO_TIMEOUT=on on the replicas to allow it")
        return statement, float(raw)

    async def notify(self, ctx: HandlerContext) -> Any:
        # Job args are outside input too (whoever created the task or job): checked
        # here, so a bad one fails the run with a message, not a traceback.
        a = ctx.args
        try:
            event = bounded.text(a.get("event"), name="args.event", max_len=128)
            payload = a.get("payload", {})
            if a.get("user_id"):
                try:
                    user_id = UUID(str(a["user_id"]))
                except ValueError:
                    raise self.refused(ctx, "malformed", f"args.user_id must be a UUID; {NOTIFY_USAGE}") from None
                return {"event_id": await ctx.notify_user(user_id, event, payload)}
            if a.get("room"):
                room = bounded.text(a.get("room"), name="args.room", max_len=128)
                return {"event_id": await ctx.notify_room(room, event, payload)}
        except bounded.BadInput as exc:
            raise self.refused(ctx, exc.reason, f"{exc}; {NOTIFY_USAGE}") from None
        except psycopg.Error as exc:
            raise HandlerError(_db_message(exc)) from None
        raise HandlerError(NOTIFY_USAGE)

    async def maintenance(self, ctx: HandlerContext) -> Any:
        # Every sweep is one short transaction with bounded reapers; a backlog
        # (a first run over a big history) drains sweep by sweep, not in one
        # transaction that would stall publishers, claims and vacuum.
        db, config = self.db, self.config
        total = await db.maintenance(config.event_retention_seconds, config.replica_stale_seconds, REAP_BATCH)
        res = total
        deadline = time.monotonic() + MAINTENANCE_BUDGET_S
        while (any(int(res.get(k) or 0) >= REAP_BATCH for k in REAPED_IN_BATCHES)
               and time.monotonic() < deadline):
            await asyncio.sleep(0.05)
            res = await db.maintenance(config.event_retention_seconds, config.replica_stale_seconds, REAP_BATCH)
            total = {k: int(total.get(k) or 0) + int(v or 0) for k, v in res.items()}
        return total


def _number_reason(raw: object) -> str:
    """The bad_input reason of a job argument that should have been a number in range."""
    return "out_of_range" if isinstance(raw, (int, float)) and not isinstance(raw, bool) else "bad_type"


def _db_message(exc: psycopg.Error) -> str:
    diag = exc.diag
    text = diag.message_primary or str(exc).strip() or type(exc).__name__
    hint = f" (hint: {diag.message_hint})" if diag.message_hint else ""
    return f"{exc.sqlstate or type(exc).__name__}: {bounded.escape(text + hint, 2000)}"
