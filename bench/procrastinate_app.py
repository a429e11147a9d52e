"""The procrastinate baseline: one no-op task, the same job the Switchboard side runs.

Run by `procrastinate --app=procrastinate_app.app worker` (bench/ on PYTHONPATH);
the connection string comes from BENCH_PROCRASTINATE_URL.
"""

from __future__ import annotations

import os

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_PROCRASTINATE_URL", "")),
)


@app.task(name="noop")
async def noop() -> None:
    return None
