"""Test handlers for tests/faults, loaded by replicas through SWITCHBOARD_HANDLERS.

``faults.work`` records the start and the end of every execution with the
worker's name in a per-process log file under $FAULTS_LOG_DIR -- outside
PostgreSQL on purpose: a replica cut off from the database can still run its
handler, and "runs never overlap" must hold for side effects, not only rows.
One line per event, appended with O_APPEND (atomic for short lines):

    start <key> <run id> <attempt> <worker> <unix time>
    end   <key> <run id> <attempt> <worker> <unix time> ok|cancelled|lease-lost
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

from switchboard.handlers import registry


def _log(line: str) -> None:
    d = os.environ.get("FAULTS_LOG_DIR")
    if not d:
        return
    fd = os.open(os.path.join(d, f"work-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


WORKER = f"{socket.gethostname()}:{os.getpid()}:-"   # the replica's pid, as in its worker name


@registry.register("faults.work")
async def work(ctx: Any) -> Any:
    args = ctx.args if isinstance(ctx.args, dict) else {}
    key = str(args.get("k", ctx.run_id))
    if ctx.task_id is not None:
        key = f"task:{ctx.task_id}"      # a task's runs must never overlap either
    seconds = float(args.get("s", 0.05))
    who = f"{key} {ctx.run_id} {ctx.attempt} {WORKER}"
    _log(f"start {who} {time.time():.6f}")
    outcome = "ok"
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        outcome = "lease-lost" if ctx.lease_lost.is_set() else "cancelled"
        raise
    finally:
        _log(f"end {who} {time.time():.6f} {outcome}")
    return {"slept": seconds}
