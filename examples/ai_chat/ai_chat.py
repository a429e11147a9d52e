"""The seed's own use case: a completion streamed token by token to a user on any replica.

``ai_chat.complete`` is an ordinary Switchboard handler. A deterministic fake model
(no network: the same prompt always gives the same tokens) stands in for the LLM;
the handler streams its tokens to the user with ``ctx.stream`` and stops the moment
anyone presses Stop (on any replica, or ``SELECT switchboard.stream_stop(id)``).

Run it (README "Streams"): ``SWITCHBOARD_HANDLERS=ai_chat PYTHONPATH=examples/ai_chat
switchboard dev`` then open the demo page, or enqueue from psql::

    SELECT * FROM switchboard.enqueue('ai_chat.complete',
        jsonb_build_object('user_id', (SELECT id FROM switchboard.users WHERE username = 'admin'),
                           'prompt', 'tell me about PostgreSQL', 'tokens', 200));

Args: ``user_id`` (who reads it), ``prompt``, ``tokens`` (how many, default 120, at most
1000000), ``rate`` (tokens per second, default 40; 0 = as fast as possible), ``chunk``
(tokens per send, default 1), ``room`` (optional: the room's members read it too), ``lease``
(seconds the stream outlives a dead producer before it ends as error, default 30).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from switchboard.handlers import HandlerContext, HandlerError, registry
from switchboard.streams import StreamError

WORDS = ("postgres", "replica", "stream", "chunk", "lease", "commit", "snapshot", "token", "socket",
         "relay", "listen", "notify", "vacuum", "index", "tuple", "page", "wal", "fsync", "query", "plan")


async def fake_model(prompt: str, tokens: int, rate: float) -> AsyncIterator[str]:
    """Deterministic tokens for a prompt, paced at ``rate`` tokens/s (0: unpaced)."""
    rng = random.Random(hashlib.sha256(prompt.encode()).digest())
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(tokens):
        if rate > 0:
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        elif i % 256 == 255:
            await asyncio.sleep(0)          # unpaced, but never hog the loop
        yield ("" if i == 0 else " ") + rng.choice(WORDS)


def _args(ctx: HandlerContext) -> tuple[UUID, str, int, float, int, str | None, float]:
    a = ctx.args
    try:
        user = UUID(str(a["user_id"]))
    except (KeyError, ValueError):
        raise HandlerError("args.user_id must be the reader's user id (a UUID)") from None
    prompt = a.get("prompt", "")
    tokens, rate, chunk = a.get("tokens", 120), a.get("rate", 40), a.get("chunk", 1)
    room, lease = a.get("room"), a.get("lease", 30)
    if not isinstance(prompt, str) or len(prompt) > 10000:
        raise HandlerError("args.prompt must be a text of at most 10000 characters")
    for name, v, hi in (("tokens", tokens, 1000000), ("rate", rate, 100000), ("chunk", chunk, 1000), ("lease", lease, 3600)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
            raise HandlerError(f"args.{name} must be a number in [0, {hi}], not {v!r:.40}")
    if room is not None and not isinstance(room, str):
        raise HandlerError("args.room must be a room name")
    return user, prompt, int(tokens), float(rate), max(1, int(chunk)), room, max(1.0, float(lease))


@registry.register("ai_chat.complete")
async def complete(ctx: HandlerContext) -> Any:
    user, prompt, tokens, rate, per_send, room, lease = _args(ctx)
    sent: list[str] = []                          # chunk i (from 0) is seq i + 1: this is its only writer
    async with ctx.stream(user, "completion", meta={"prompt": prompt[:200], "run": ctx.run_id},
                          room=room, lease=lease) as s:
        await ctx.notify_user(user, "chat.answer", {"stream": str(s.id), "prompt": prompt[:200]})
        batch: list[str] = []
        try:
            async for token in fake_model(prompt, tokens, rate):
                batch.append(token)
                if len(batch) >= per_send:
                    await s.send("".join(batch))    # StreamStopped here once stopped: the block ends
                    sent.append("".join(batch))
                    batch = []
            if batch:
                await s.send("".join(batch))
                sent.append("".join(batch))
        finally:
            # The answer as written: send() only queues, and after a Stop the chunks still
            # queued are refused, so the final is the first s.seq chunks once all are flushed.
            # Events are at most 1 MB: a longer answer is kept by the application, not the event.
            try:
                await s.flush()
            except StreamError:
                pass                                # stopped: s.seq is where it stopped
            answer = "".join(sent[:s.seq])
            s.final = {"text": answer} if len(answer) < 500_000 else {"chars": len(answer), "truncated": True}
    # s.stopped: someone pressed Stop; the stream ended 'stopped' with the partial text.
    return {"stream": str(s.id), "stopped": s.stopped, "chunks": s.seq}
