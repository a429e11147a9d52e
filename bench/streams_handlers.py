"""The producer of bench/streams.py, loaded in the replicas
(SWITCHBOARD_HANDLERS=streams_handlers, PYTHONPATH=bench).

``bench.stream`` args: ``user_id`` (the reader), ``chunks`` (n), ``rate`` (chunks/s of
this stream; 0 = as fast as the path takes them), ``mode`` ("stream": ``ctx.stream`` +
``s.send`` per chunk, the product's group append; "notify": one ``ctx.notify_user``
per chunk, the per-chunk path streams replace), ``idx`` (the stream's number in the
run), ``dir`` (the run's coordination directory), ``phase`` (seconds: the streams'
schedules are spread over one interval), ``filler`` (characters of padding).

Coordination through files, since the bench and the replicas share one box: once
its stream is open the handler writes ``dir/ready-<idx>`` ({"pid", "stream"}: the
bench opens the reader's socket on another replica than this one), then waits
for ``dir/go`` (the start time, ns since the epoch) so no chunk is sent before
every reader is subscribed.

Chunk ``i`` (1..n) is the text ``<i>:<stamp_ns>:<filler>``; it is due at
``t0 + phase + (i - 1) / rate``. Like bench/streams_peer: a producer that is
early sleeps until the chunk is due and stamps the wake-up time
(``time.time_ns()``, the same clock as the readers'); one that is late stamps
the due time, so a producer that falls behind shows up as latency.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from switchboard.handlers import HandlerContext, HandlerError, registry


def _ready(d: str, idx: int, stream: str | None) -> None:
    tmp = os.path.join(d, f".ready-{idx}.tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "stream": stream}, f)
    os.rename(tmp, os.path.join(d, f"ready-{idx}"))


async def _go(d: str, timeout: float = 300.0) -> int:
    path = os.path.join(d, "go")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise HandlerError(f"no go signal in {d} after {timeout} s")
        await asyncio.sleep(0.005)
    with open(path) as f:
        return int(f.read().strip())


async def _paced(n: int, rate: float, start_ns: int, send: Callable[[int, int], Awaitable[None]]) -> int:
    """Send chunks 1..n on schedule; returns how many were sent late (stamped at their due time)."""
    late = 0
    if rate <= 0:
        now = time.time_ns()
        if now < start_ns:
            await asyncio.sleep((start_ns - now) / 1e9)
        for i in range(1, n + 1):
            await send(i, time.time_ns())
            if i % 256 == 0:
                await asyncio.sleep(0)          # unpaced, but never hog the loop
        return 0
    step = 1e9 / rate
    for i in range(1, n + 1):
        due = start_ns + int((i - 1) * step)
        now = time.time_ns()
        if now < due:
            await asyncio.sleep((due - now) / 1e9)
            stamp = time.time_ns()
        else:
            stamp = due
            late += now - due > 1_000_000
        await send(i, stamp)
    return late


@registry.register("bench.stream")
async def produce(ctx: HandlerContext) -> Any:
    a = ctx.args
    user, n, rate, mode = a["user_id"], int(a["chunks"]), float(a["rate"]), a["mode"]
    idx, d, phase = int(a["idx"]), str(a["dir"]), float(a.get("phase", 0.0))
    filler = "x" * int(a.get("filler", 8))
    if mode == "stream":
        async with ctx.stream(user, "bench", meta={"idx": idx}) as s:
            _ready(d, idx, str(s.id))
            t0 = await _go(d)

            async def send(i: int, ts: int) -> None:
                await s.send(f"{i}:{ts}:{filler}")
            late = await _paced(n, rate, t0 + int(phase * 1e9), send)
            s.final = {"chunks": n}
        return {"stream": str(s.id), "seq": s.seq, "stopped": s.stopped, "late": late, "pid": os.getpid()}
    if mode == "notify":
        _ready(d, idx, None)
        t0 = await _go(d)

        async def notify(i: int, ts: int) -> None:
            await ctx.notify_user(user, "bench.chunk", {"c": f"{i}:{ts}:{filler}"})
        late = await _paced(n, rate, t0 + int(phase * 1e9), notify)
        return {"late": late, "pid": os.getpid()}
    raise HandlerError(f"mode must be stream or notify, not {mode!r}")
