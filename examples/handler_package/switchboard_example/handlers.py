"""Two handlers that use the whole public HandlerContext API.

Install the package next to the server (``pip install .``); every replica
finds the handlers through the ``switchboard.handlers`` entry-point group
declared in pyproject.toml -- no SWITCHBOARD_HANDLERS setting needed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from switchboard.handlers import HandlerContext, HandlerError


async def greet(ctx: HandlerContext) -> dict[str, Any]:
    """Send a user a greeting, then queue a follow-up job (at most one at a time)."""
    user_id = ctx.args.get("user_id")
    if not user_id:
        raise HandlerError('greet needs args {"user_id": "...", "name": "..."}')
    name = str(ctx.args.get("name", "there"))
    ctx.logger.info("greeting %s (attempt %d of %d)", name, ctx.attempt, ctx.max_attempts)
    event_id = await ctx.notify_user(user_id, "greeting", {"text": f"Hello, {name}!"})
    followup = await ctx.enqueue("noop", {"after": ctx.run_id}, queueing_lock=f"greet-followup:{user_id}")
    return {"event_id": event_id, "followup_run": followup, "run": ctx.run_id,
            "task": None if ctx.task_id is None else str(ctx.task_id)}


async def report(ctx: HandlerContext) -> dict[str, Any]:
    """Long work in chunks: report progress, stop early when the lease is lost
    (another replica now owns the run, so this result would not count) or the
    deadline is near."""
    user_id = ctx.args["user_id"]
    chunks = int(ctx.args.get("chunks", 10))
    done = 0
    for _ in range(chunks):
        if ctx.lease_lost.is_set():
            await ctx.notify_user(user_id, "report.abandoned", {"done": done, "run": ctx.run_id})
            return {"done": done, "abandoned": True}
        if ctx.seconds_left() < 0.5:
            raise HandlerError(f"out of time after {done} chunks")
        await asyncio.sleep(float(ctx.args.get("chunk_seconds", 0.2)))  # the actual work
        done += 1
        await ctx.notify_user(user_id, "report.progress", {"done": done, "of": chunks})
    return {"done": done, "abandoned": False}
