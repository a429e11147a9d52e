"""EXPERIMENT, not product code: what would a batched claim + batched finish buy?

    python bench/proto_batch_claim.py [--jobs 5000] [--runs 2]

Figure 3b (bench/e2e.py) is bound by CPU per job: every job costs two round
trips (claim_due_task, finish_run), each a separate statement, transaction,
psycopg result and pool checkout. This script measures, on one throwaway
cluster and the same 2 x concurrency-8 replicas, the product scheduler beside
a prototype that claims up to the free slots in one statement and finishes
every completed run in one statement:

  switchboard.claim_queued_batch(worker, lease, n)  UPDATE ... WHERE id IN
      (SELECT ... ORDER BY run_at, id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING *
  switchboard.finish_runs_ok(ids bigint[], worker)   one fenced UPDATE for many

The prototype is monkeypatched into the replicas by loading this module as a
handler module (SWITCHBOARD_HANDLERS=proto_batch_claim, bench/ on PYTHONPATH).
It covers queued runs only (no cron ticks, no heartbeats, no failure/retry
path, no metrics): an upper bound for the real change, which would be
claim_due_task(worker, lease, max_runs) returning SETOF and a finish_runs()
taking arrays of outcomes, keeping ticks, fencing and retries.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

PROTO_SQL = """
CREATE FUNCTION switchboard.claim_queued_batch(worker text, lease interval, n int)
RETURNS SETOF switchboard.task_runs
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
UPDATE switchboard.task_runs
   SET status = 'running', worker = $1, lease_expires_at = now() + $2, started_at = now()
 WHERE id IN (SELECT id FROM switchboard.task_runs WHERE status = 'queued' AND run_at <= now()
               ORDER BY run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING * $$;
GRANT EXECUTE ON FUNCTION switchboard.claim_queued_batch(text, interval, int) TO switchboard_app;
CREATE FUNCTION switchboard.finish_runs_ok(ids bigint[], worker text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
WITH u AS (UPDATE switchboard.task_runs
              SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
            WHERE id = ANY($1) AND worker = $2 AND status = 'running' RETURNING 1)
SELECT count(*)::int FROM u $$;
GRANT EXECUTE ON FUNCTION switchboard.finish_runs_ok(bigint[], text) TO switchboard_app;
"""


def _patch_scheduler() -> None:
    """Inside a replica: replace the claim loop and the per-run finish."""
    from switchboard import scheduler as sched
    from switchboard.db import RUN_COLUMNS
    from switchboard.handlers import HandlerContext

    async def _claim_available(self: Any) -> None:
        while not self._stopping and not self.replica.draining:
            free = self.cfg.scheduler_concurrency - len(self._running)
            if free <= 0:
                return
            rows = await self.db.fetchall(
                f"SELECT {RUN_COLUMNS} FROM switchboard.claim_queued_batch(%s, %s, %s)",
                (self.worker, timedelta(seconds=self.cfg.lease_seconds), free))
            if not rows:
                return
            for run in rows:
                self._running[run["id"]] = asyncio.create_task(self._execute(run))

    async def _execute(self: Any, run: dict) -> None:
        handler = self.handlers.get(run["handler"])
        if handler is not None:
            await handler(HandlerContext(run, self.db, lease_seconds=self.cfg.lease_seconds))
        if not hasattr(self, "_done"):
            self._done, self._done_ev = [], asyncio.Event()
            asyncio.create_task(_finisher(self))
        self._done.append(run["id"])
        self._done_ev.set()

    async def _finisher(self: Any) -> None:
        while True:
            await self._done_ev.wait()
            self._done_ev.clear()
            ids, self._done = self._done, []
            if ids:
                await self.db.fetchone("SELECT switchboard.finish_runs_ok(%s, %s)", (ids, self.worker))
                for i in ids:
                    self._running.pop(i, None)
                self._wake.set()

    sched.Scheduler._claim_available = _claim_available
    sched.Scheduler._execute = _execute


def main() -> None:
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import e2e
    import psycopg
    from common import Cluster, log, replica, stop_all

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    cluster = Cluster()
    try:
        db = cluster.new_db("sb_proto")
        with psycopg.connect(cluster.url(db), autocommit=True) as c:
            c.execute(PROTO_SQL)
        for mode in ("product", "batched prototype"):
            env = {"SWITCHBOARD_SCHEDULER_CONCURRENCY": "8"}
            if mode != "product":
                env["SWITCHBOARD_HANDLERS"] = "proto_batch_claim"
            procs = e2e._start([replica(cluster, db, f"proto-r{i}", env=env) for i in range(2)])
            try:
                time.sleep(1.5)
                for _ in range(a.runs):
                    r = e2e._sb_jobs_run(cluster, db, a.jobs, [p.pid for p in procs])
                    log(f"{mode}: {r['jobs_per_s']} jobs/s, CPU/job replicas {r['workers_cpu_us_per_job']} us "
                        f"+ postgres {r['postgres_cpu_us_per_job']} us, succeeded {r['succeeded']}/{a.jobs}")
            finally:
                stop_all(procs)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
elif os.environ.get("SWITCHBOARD_HANDLERS", "").split(",").count("proto_batch_claim"):
    _patch_scheduler()  # imported by a replica as its handler module
