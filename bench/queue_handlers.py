"""Handlers of bench/queues_ab.py's B side, loaded in its replicas
(SWITCHBOARD_HANDLERS=queue_handlers, PYTHONPATH=bench, as bench/bench_handlers.py).

``bench.qa`` (queue "qa") and ``bench.qb`` (queue "qb") do nothing, as the built-in
``noop`` (the default queue) does: the drain measures the claim and finish path of
three queues with priorities, not the handlers.
"""

from __future__ import annotations

from typing import Any

from switchboard.handlers import HandlerContext, registry


@registry.register("bench.qa", queue="qa")
async def qa(ctx: HandlerContext) -> Any:
    return None


@registry.register("bench.qb", queue="qb")
async def qb(ctx: HandlerContext) -> Any:
    return None
