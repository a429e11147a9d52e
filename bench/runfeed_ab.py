"""Does the admin run feed cost the job path anything? (issue 20, branch o20)

Two replicas (scheduler concurrency 8) drain M enqueued `noop` jobs, A B A B ...:
  A: no admin socket (the feed is idle: no query at all);
  B: an admin socket on replica 1 subscribed to the runs feed (feeds=runs), read
     by a thread that counts the run.updated frames and the runs in them.
Reported per run: jobs/s (last finish - enqueue commit), replica and PostgreSQL
CPU per job; then medians and the B/A ratios. The job path's SQL is the same in
both (the feed adds one indexed statement a second on replica 1 in B).
Then P: drains during which this process runs the feed's own poll (RunFeed.poll_once,
the same statement and parameters) once a second and times each call: what one
subscribed replica adds per second while the queue is busy.

    PYTHONPATH=server python bench/runfeed_ab.py [--jobs 20000] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import Any

import psycopg
from websockets.sync.client import connect

from common import Cluster, log, make_token, replica, stop_all
from e2e import _sb_jobs_run


def drain(cluster: Cluster, db: str, m: int, pids: list[int], timeout: float = 300) -> dict[str, Any]:
    """Figure 3b's drain (e2e._sb_jobs_run), with the keys this A/B reports."""
    r = _sb_jobs_run(cluster, db, m, pids, timeout)
    return {"jobs_per_s": r["jobs_per_s"], "seconds": r["seconds"], "done": r["succeeded"],
            "load": r["loadavg_before"], "replicas_cpu_us_per_job": r["workers_cpu_us_per_job"],
            "postgres_cpu_us_per_job": r["postgres_cpu_us_per_job"]}


class Watcher(threading.Thread):
    """An admin socket subscribed to the runs feed; counts what it receives."""

    def __init__(self, base: str, token: str) -> None:
        super().__init__(daemon=True)
        import httpx

        ticket = httpx.post(base.replace("ws://", "http://") + "/ws/ticket",
                            headers={"Authorization": f"Bearer {token}"}, timeout=10).json()["ticket"]
        self.ws = connect(f"{base}/ws?ticket={ticket}&feeds=runs", open_timeout=10, max_size=None)
        hello = json.loads(self.ws.recv(timeout=10))
        assert hello["payload"]["feeds"] == ["runs"], hello
        self.frames = self.runs = 0
        self.max_bytes = 0
        self.truncated = 0
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            try:
                text = self.ws.recv(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:
                return
            f = json.loads(text)
            if f["event"] == "run.updated" and f["id"] is None:
                self.frames += 1
                self.runs += len(f["payload"]["runs"])
                self.truncated += bool(f["payload"]["truncated"])
                self.max_bytes = max(self.max_bytes, len(text))

    def close(self) -> dict[str, int]:
        self.stop = True
        self.join(timeout=5)
        self.ws.close()
        return {"frames": self.frames, "runs": self.runs, "truncated_frames": self.truncated,
                "max_frame_bytes": self.max_bytes}


class Poller(threading.Thread):
    """RunFeed.poll_once once a second on a connection of its own, timed."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.ms, self.stop = url, [], False
        self.exec_ms: list[float] = []     # PostgreSQL's own execution time of the statement
        self.buffers: list[int] = []       # shared buffers hit + read (load-independent)

    def run(self) -> None:
        import asyncio

        from psycopg.rows import dict_row

        from switchboard.runfeed import RunFeed

        async def main() -> None:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
                poller = self

                class Db:
                    async def fetchone(self, sql: str, params: Any = None) -> Any:
                        # The plan of this very call first (same snapshot age, same parameters).
                        plan = (await (await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql,
                                                          params)).fetchone())["QUERY PLAN"][0]
                        poller.exec_ms.append(plan["Execution Time"])
                        if os.environ.get("RUNFEED_PLANS"):
                            with open(os.environ["RUNFEED_PLANS"], "a") as fh:
                                fh.write(json.dumps(plan) + "\n")
                        top = plan["Plan"]
                        poller.buffers.append(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))
                        return await (await conn.execute(sql, params)).fetchone()

                feed = RunFeed(Db())  # type: ignore[arg-type]
                while not self.stop:
                    t = time.perf_counter()
                    await feed.poll_once()
                    self.ms.append((time.perf_counter() - t) * 1000 - (self.exec_ms[-1] if self.exec_ms else 0))
                    await asyncio.sleep(max(0.0, 1 - (time.perf_counter() - t)))
        asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--polled", type=int, default=2, help="P drains (the feed's poll timed)")
    args = ap.parse_args()
    cluster = Cluster()
    db = cluster.new_db()
    with psycopg.connect(cluster.url(db), autocommit=True) as c:
        from switchboard.auth import hash_password

        admin_id = str(c.execute("SELECT switchboard.create_user('feedadmin', %s, 'admin')",
                                 (hash_password("feed-admin-pw-1234"),)).fetchone()[0])
    env = {"SWITCHBOARD_SCHEDULER_CONCURRENCY": "8"}
    procs = [replica(cluster, db, f"feed{i}", env=env) for i in range(2)]
    results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    try:
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_ready()
        pids = [p.pid for p in procs]
        token = make_token(admin_id, "feedadmin", "admin")
        drain(cluster, db, 2000, pids)                      # warm-up
        for i in range(args.pairs):
            for mode in ("A", "B"):
                w = Watcher(procs[0].ws_base, token) if mode == "B" else None
                if w:
                    w.start()
                r = drain(cluster, db, args.jobs, pids)
                if w:
                    time.sleep(1.5)                          # the last finishes' frame
                    r["feed"] = w.close()
                results[mode].append(r)
                log(f"{mode}{i}: {r}")
        polls: list[float] = []
        bufs: list[int] = []
        for i in range(args.polled):
            poller = Poller(cluster.url(db, "sb_bench_app"))
            poller.start()
            r = drain(cluster, db, args.jobs, pids)
            poller.stop = True
            poller.join(timeout=5)
            polls += poller.exec_ms
            bufs += poller.buffers
            log(f"P{i}: {r} polls={len(poller.ms)} exec_ms={[round(x, 1) for x in poller.exec_ms]} "
                f"buffers={poller.buffers}")
    finally:
        stop_all(procs)
        cluster.stop()

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    summary = {k: {"A": med("A", k), "B": med("B", k), "B/A": round(med("B", k) / med("A", k), 3)}
               for k in ("jobs_per_s", "replicas_cpu_us_per_job", "postgres_cpu_us_per_job")}
    if polls:
        q = statistics.quantiles(polls, n=100) if len(polls) > 1 else polls * 99
        summary["poll_exec_ms"] = {"n": len(polls), "median": round(statistics.median(polls), 1),
                                   "p90": round(q[89], 1), "max": round(max(polls), 1)}
        summary["poll_buffers"] = {"median": statistics.median(bufs), "max": max(bufs)}
    print(json.dumps({"jobs": args.jobs, "pairs": args.pairs, "runs": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
