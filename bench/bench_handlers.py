"""Handlers the benchmarks register in the replicas (SWITCHBOARD_HANDLERS=bench_handlers).

``bench.mark`` records the wall clock the moment the handler starts running;
the value lands in task_runs.result, so trigger-to-start latency is read back
from the database after the run (same host, so the same clock as the client).
"""

from __future__ import annotations

import time
from typing import Any

from switchboard.handlers import HandlerContext, registry


@registry.register("bench.mark")
async def mark(ctx: HandlerContext) -> Any:
    return {"t": time.time()}
