"""A job handler for the failover suite (loaded by the replicas via SWITCHBOARD_HANDLERS).

``pgha.job`` works for ``args.seconds`` and then records the interval it worked
in ``pgha_job_log`` (started, ended, worker, run id), through its own
connection (PGHA_LOG_URL, the cluster's multi-host URL), independent of the
server's pool. The row is written after the work, retried until it lands (a
failover may be in progress) and idempotent on (run_id, worker), so every
execution that ran is recorded exactly once. The test then checks that no two
executions of one job overlap in time.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from datetime import datetime, timezone

import psycopg
from switchboard.handlers import HandlerContext, registry

_conn: psycopg.AsyncConnection | None = None
WORKER = f"{socket.gethostname()}:{os.getpid()}"   # one replica per process


async def _record(n: int, run_id: int, worker: str, started: float, ended: float) -> None:
    global _conn
    deadline = time.monotonic() + 60
    while True:
        try:
            if _conn is None or _conn.closed:
                _conn = await psycopg.AsyncConnection.connect(os.environ["PGHA_LOG_URL"], autocommit=True)
            await _conn.execute(
                "INSERT INTO public.pgha_job_log (n, run_id, worker, started_at, ended_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, worker) DO NOTHING",
                (n, run_id, worker, datetime.fromtimestamp(started, timezone.utc),
                 datetime.fromtimestamp(ended, timezone.utc)))
            return
        except psycopg.Error:
            if _conn is not None:
                await _conn.close()
            _conn = None
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


@registry.register("pgha.job")
async def job(ctx: HandlerContext) -> dict:
    started = time.time()
    await asyncio.sleep(float(ctx.args.get("seconds", 0.3)))
    ended = time.time()
    await _record(int(ctx.args["n"]), ctx.run_id, WORKER, started, ended)
    return {"n": ctx.args["n"]}
