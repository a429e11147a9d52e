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


def _run_of(ctx: Any) -> dict:
    run = getattr(ctx, "run", None)
    return run if isinstance(run, dict) else {}


@registry.register("faults.work")
async def work(ctx: Any) -> Any:
    run = _run_of(ctx)
    args = run.get("args") or {}
    key = str(args.get("k", run.get("task_id") or run.get("id")))
    if run.get("task_id") is not None:
        key = f"task:{run.get('task_id')}"      # a task's runs must never overlap either
    seconds = float(args.get("s", 0.05))
    who = f"{key} {run.get('id')} {run.get('attempt')} {run.get('worker')}"
    _log(f"start {who} {time.time():.6f}")
    outcome = "ok"
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        _log(f"end {who} {time.time():.6f} {outcome}")
    return {"slept": seconds}
