"""Per-stage delivery timestamps, for ``bench/latency_ab.py --trace`` only.

Off unless ``SWITCHBOARD_LATENCY_TRACE`` names a directory (read once at import).
When off, every hook is behind ``if latency_trace.ON``: one global lookup per event,
nothing recorded. When on, the relay and the socket senders record ``time.time()``
at each stage of an event's path, and a background task appends them every 0.25 s
to ``<dir>/trace-<pid>.jsonl`` (one JSON object per line, see ``_flush``):

- ``heard``: the LISTEN loop dispatched the publisher's ``{"id": N}`` hint
- per read: ``woke`` (the read loop woke), ``t0`` (read sent), ``t1`` (rows back),
  ``tick`` (event_tick's answer: -1 = another replica was ticking), ``backoff``
  (the retry delay scheduled after a -1), ``n`` (rows)
- per event: its read, ``k`` (the bench's sequence number in the payload),
  ``offered`` (frames queued to its sockets)
- ``written``: a socket's sender finished ``send_text`` of that event's frame

Nothing here is read back by the product; the bench joins it with the publisher's
COMMIT times and the client's receive times.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

DIR = os.environ.get("SWITCHBOARD_LATENCY_TRACE") or None
ON = DIR is not None

_heard: list[tuple[int, float]] = []
_reads: list[dict[str, Any]] = []
_events: list[tuple[int, int, Any, float]] = []
_written: list[tuple[int, float]] = []
_task: asyncio.Task[None] | None = None


def heard(event_id: int) -> None:
    _heard.append((event_id, time.time()))


def read(woke: float, t0: float, t1: float, tick: int | None, backoff: float | None, n: int) -> int:
    _reads.append({"woke": woke, "t0": t0, "t1": t1, "tick": tick, "backoff": backoff, "n": n})
    return len(_reads) - 1 + _read_base


def event(read_no: int, event_id: int, payload: Any) -> None:
    k = payload.get("k") if isinstance(payload, dict) else None
    _events.append((read_no, event_id, k, time.time()))


def written(text: str) -> None:
    t = time.time()
    if text.startswith('{"id":') and not text.startswith('{"id":null'):
        _written.append((int(json.loads(text)["id"]), t))


_read_base = 0


def _flush() -> None:
    global _read_base
    if DIR is None or not (_heard or _reads or _events or _written):
        return
    rec = {"pid": os.getpid(), "read_base": _read_base, "heard": _heard[:], "reads": _reads[:],
           "events": _events[:], "written": _written[:]}
    _read_base += len(_reads)
    for xs in (_heard, _reads, _events, _written):
        xs.clear()
    with open(os.path.join(DIR, f"trace-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


async def _flusher() -> None:
    while True:
        await asyncio.sleep(0.25)
        _flush()


def start() -> None:
    global _task
    if ON and _task is None:
        _task = asyncio.get_running_loop().create_task(_flusher(), name="latency-trace")
