"""End-to-end benchmarks: real `switchboard serve` processes, each beside its baseline.

    python bench/e2e.py [--only jobs,trigger,events,http,memory] [--quick]

(bench/run.py runs these together with bench/sql.py and bench/cron_bench.py.)

Figures (ids as in BENCHMARKS.md):
  3b jobs     N replicas (SWITCHBOARD_SCHEDULER_CONCURRENCY=8) drain M enqueued `noop` jobs
              vs procrastinate workers (same processes x concurrency) draining M no-op jobs.
  4  trigger  create_run_exclusive COMMIT -> handler running on one of 3 replicas,
              vs the floor: raw NOTIFY COMMIT -> a LISTENing process, same pacing.
  5  events   notify_user COMMIT -> WebSocket frame (1,000 users on 3 replicas, 1,000 ev/s)
              and notify_room to one room of 1,000 joined members (10 ev/s), latency to the
              last member; vs raw NOTIFY COMMIT -> LISTEN, same rate.
  6  http     GET /tasks with a bearer token vs bench/bare_app.py (the same SELECT, same pool
              size, same uvicorn settings), fixed concurrency.
  7  memory   RSS growth of one replica holding 1,000 idle WebSockets vs the bare Falcon app.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from common import (
    APP_LOGIN,
    BENCH,
    RESULTS,
    ROOT,
    Cluster,
    CpuMeter,
    Proc,
    free_port,
    loadavg,
    log,
    machine_info,
    make_token,
    median,
    pct,
    replica,
    rss_kib,
    stop_all,
    write_json,
)


def _start(procs: list[Proc]) -> list[Proc]:
    for p in procs:
        p.start(wait=False)
    for p in procs:
        p.wait_ready()
    return procs


def _summary(lat_ms: list[float]) -> dict[str, float]:
    return {"n": len(lat_ms), "p50_ms": round(pct(lat_ms, 50), 2), "p99_ms": round(pct(lat_ms, 99), 2),
            "max_ms": round(max(lat_ms), 2)}


# -- 3b: job throughput ---------------------------------------------------------------------
def _cpu_per_job(cpu: dict[str, float], done: int) -> dict[str, float]:
    n = max(done, 1)
    return {"workers_cpu_us_per_job": round(cpu["workers_cpu_s"] / n * 1e6),
            "postgres_cpu_us_per_job": round(cpu["postgres_cpu_s"] / n * 1e6)}


def _sb_jobs_run(cluster: Cluster, db: str, m: int, pids: list[int], timeout: float = 120) -> dict[str, Any]:
    url = cluster.url(db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE switchboard.task_runs_hot, switchboard.task_runs_history")
        c.execute("VACUUM ANALYZE switchboard.task_runs_hot, switchboard.task_runs_history")
    with psycopg.connect(url) as c:
        c.execute("SELECT count(*) FROM (SELECT switchboard.enqueue('noop') FROM generate_series(1, %s)) s", (m,))
        load = loadavg()
        c.commit()
        t0 = time.time()
        meter = CpuMeter(cluster, pids)
        c.autocommit = True
        deadline = t0 + timeout
        while True:
            time.sleep(0.1)
            row = c.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                "       count(*) FILTER (WHERE status IN ('failed', 'abandoned')),"
                "       count(*) FILTER (WHERE attempt > 1),"
                "       count(*), count(DISTINCT id),"
                "       extract(epoch FROM max(finished_at))::float8,"
                "       count(DISTINCT worker)"
                "  FROM switchboard.task_runs WHERE handler = 'noop'").fetchone()
            done, bad, retried, total, distinct, last, workers = row
            if done + bad >= m or time.time() > deadline:
                break
        cpu = meter.stop()
    secs = (last or time.time()) - t0
    return {"jobs": m, "succeeded": done, "failed_or_abandoned": bad, "retried": retried,
            "rows": total, "duplicates": total - distinct, "workers": workers,
            "seconds": round(secs, 3), "jobs_per_s": round(done / secs, 1), "loadavg_before": load,
            **cpu, **_cpu_per_job(cpu, done)}


def _procrastinate_run(cluster: Cluster, url: str, m: int, pids: list[int],
                       timeout: float = 180) -> dict[str, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE procrastinate_jobs CASCADE")
        c.execute("VACUUM ANALYZE procrastinate_jobs")

    async def defer() -> float:
        async with app.open_async():
            await noop.batch_defer_async(*({} for _ in range(m)))
            return time.time()

    load = loadavg()
    t0 = asyncio.run(defer())
    meter = CpuMeter(cluster, pids)
    deadline = t0 + timeout
    with psycopg.connect(url, autocommit=True) as c:
        while True:
            time.sleep(0.1)
            done, bad, total = c.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                "       count(*) FILTER (WHERE status IN ('failed', 'aborted', 'cancelled')), count(*)"
                "  FROM procrastinate_jobs").fetchone()
            if done + bad >= m or time.time() > deadline:
                break
        cpu = meter.stop()
        last, dup = c.execute(
            "SELECT extract(epoch FROM max(at))::float8,"
            "       count(*) - count(DISTINCT job_id)"
            "  FROM procrastinate_events WHERE type = 'succeeded'").fetchone()
    secs = (last or time.time()) - t0
    return {"jobs": m, "succeeded": done, "failed": bad, "duplicates": dup,
            "seconds": round(secs, 3), "jobs_per_s": round(done / secs, 1), "loadavg_before": load,
            **cpu, **_cpu_per_job(cpu, done)}



def start_procrastinate(cluster: Cluster, dbname: str, processes: int, concurrency: int,
                        name: str) -> tuple[str, str, list[subprocess.Popen], list[Any]]:
    """A fresh database with procrastinate's schema and `processes` workers registered
    in it (figure 3b's baseline; bench/jobs_ab.py too). Returns (db, url, workers, logs);
    stop them with stop_procrastinate."""
    import procrastinate

    pdb = cluster.new_db(dbname, template=None)
    purl = cluster.url(pdb)
    papp = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=purl))

    async def schema() -> None:
        async with papp.open_async():
            await papp.schema_manager.apply_schema_async()
    asyncio.run(schema())
    env = dict(os.environ)
    env.update({"BENCH_PROCRASTINATE_URL": purl,
                "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT / "server")])})
    workers: list[subprocess.Popen] = []
    logs: list[Any] = []
    try:
        for i in range(processes):
            lf = open(RESULTS / f"{name}-procrastinate-worker-{i}.log", "wb")
            logs.append(lf)
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "procrastinate", "--app=procrastinate_app.app", "--log-level=warning",
                 "worker", f"--concurrency={concurrency}", f"--name={name}-{i}"],
                env=env, stdout=lf, stderr=subprocess.STDOUT, cwd=str(ROOT)))
        deadline = time.time() + 30
        with psycopg.connect(purl, autocommit=True) as c:
            while c.execute("SELECT count(*) FROM procrastinate_workers").fetchone()[0] < processes:
                if time.time() > deadline or any(w.poll() is not None for w in workers):
                    raise RuntimeError(f"procrastinate workers did not start; see "
                                       f"bench/results/{name}-procrastinate-worker-*.log")
                time.sleep(0.2)
    except BaseException:
        stop_procrastinate(workers, logs)
        raise
    return pdb, purl, workers, logs


def stop_procrastinate(workers: list[subprocess.Popen], logs: list[Any]) -> None:
    for w in workers:
        w.terminate()
    for w in workers:
        try:
            w.wait(timeout=20)
        except subprocess.TimeoutExpired:
            w.kill()
    for lf in logs:
        lf.close()

def bench_jobs(cluster: Cluster, processes: int = 2, concurrency: int = 8, m: int = 5000,
               runs: int = 3) -> dict[str, Any]:
    log(f"3b jobs: Switchboard, {processes} replicas x concurrency {concurrency}, {m} noop jobs x {runs} runs")
    db = cluster.new_db("sb_jobs")
    procs = _start([replica(cluster, db, f"jobs-r{i}",
                            env={"SWITCHBOARD_SCHEDULER_CONCURRENCY": str(concurrency)})
                    for i in range(processes)])
    sb_runs = []
    try:
        time.sleep(1.5)  # start-up jitter of the schedulers is over
        for r in range(runs):
            res = _sb_jobs_run(cluster, db, m, [p.pid for p in procs])
            log(f"   switchboard run {r + 1}: {res['jobs_per_s']} jobs/s ({res['seconds']} s) "
                f"ok={res['succeeded']} bad={res['failed_or_abandoned']} retried={res['retried']}; CPU/job "
                f"replicas {res['workers_cpu_us_per_job']} us + postgres {res['postgres_cpu_us_per_job']} us")
            sb_runs.append(res)
    finally:
        stop_all(procs)
        cluster.drop_db(db)

    log(f"3b jobs: procrastinate, {processes} workers x concurrency {concurrency}")
    pdb, purl, workers, logs = start_procrastinate(cluster, "procr", processes, concurrency, "bench")
    pr_runs = []
    try:
        time.sleep(1.0)
        for r in range(runs):
            res = _procrastinate_run(cluster, purl, m, [w.pid for w in workers])
            log(f"   procrastinate run {r + 1}: {res['jobs_per_s']} jobs/s ({res['seconds']} s) ok={res['succeeded']}; "
                f"CPU/job workers {res['workers_cpu_us_per_job']} us + postgres {res['postgres_cpu_us_per_job']} us")
            pr_runs.append(res)
    finally:
        stop_procrastinate(workers, logs)
        cluster.drop_db(pdb)
    sb = median([r["jobs_per_s"] for r in sb_runs])
    pr = median([r["jobs_per_s"] for r in pr_runs])

    def cpu(runs_: list[dict]) -> dict[str, float]:
        return {"workers": median([r["workers_cpu_us_per_job"] for r in runs_]),
                "postgres": median([r["postgres_cpu_us_per_job"] for r in runs_])}
    return {"processes": processes, "concurrency": concurrency, "jobs": m, "runs": runs,
            "switchboard": {"jobs_per_s_median": sb, "cpu_us_per_job_median": cpu(sb_runs), "runs": sb_runs,
                            "all_succeeded_once": all(r["succeeded"] == m and r["retried"] == 0
                                                      and r["duplicates"] == 0 and r["failed_or_abandoned"] == 0
                                                      for r in sb_runs)},
            "procrastinate": {"jobs_per_s_median": pr, "cpu_us_per_job_median": cpu(pr_runs), "runs": pr_runs,
                              "all_succeeded_once": all(r["succeeded"] == m and r["duplicates"] == 0
                                                        for r in pr_runs)},
            "ratio": round(sb / pr, 2)}


# -- receivers and publishers --------------------------------------------------------------
class Receiver:
    """bench/ws_client.py in its own process (see its docstring for the protocol)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "ws_client.py"), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        self.first = self._read()

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ok"):
            raise RuntimeError(f"receiver: {line!r} (exit {self.proc.poll()})")
        return line.strip()

    def cmd(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read()

    def count(self) -> int:
        return int(self.cmd("count").split()[1])

    def wait_count(self, n: int, timeout: float = 5.0) -> int:
        deadline = time.time() + timeout
        got = self.count()
        while got < n and time.time() < deadline:
            time.sleep(0.05)
            got = self.count()
        return got

    def dump(self) -> list[list]:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        self.cmd(f"dump {path}")
        data = json.loads(Path(path).read_text())
        os.unlink(path)
        return data

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


async def _publish(url: str, sql: str, params: Any, n: int, rate: float | None,
                   conns: int = 4, gaps: tuple[float, float] | None = None) -> dict[int, float]:
    """Send n statements (autocommit: each is one transaction) and record time.time() after each COMMIT.

    rate: a fixed schedule of n/rate seconds over `conns` connections; gaps: one statement at a
    time with a random pause in [lo, hi] seconds between them (an idle system between events)."""
    out: dict[int, float] = {}
    cs = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(conns)]
    try:
        if gaps is not None:
            for k in range(n):
                await asyncio.sleep(random.uniform(*gaps))
                await cs[0].execute(sql, params(k))
                out[k] = time.time()
            return out
        counter = itertools.count()
        t0 = time.time() + 0.1

        async def worker(c: psycopg.AsyncConnection) -> None:
            while True:
                k = next(counter)
                if k >= n:
                    return
                delay = t0 + k / rate - time.time()  # type: ignore[operator]
                if delay > 0:
                    await asyncio.sleep(delay)
                await c.execute(sql, params(k))
                out[k] = time.time()
        await asyncio.gather(*(worker(c) for c in cs))
        out[-1] = time.time() - t0  # elapsed
        return out
    finally:
        for c in cs:
            await c.close()


def _latencies(sent: dict[int, float], recs: list[list]) -> list[float]:
    return [(t - sent[k]) * 1000 for k, t, _ in recs if k in sent]


# -- 4: trigger -> start ---------------------------------------------------------------------
def bench_trigger(cluster: Cluster, replicas: int = 3, samples: int = 200, runs: int = 3) -> dict[str, Any]:
    log(f"4 trigger->start: {replicas} replicas, {runs} runs x {samples} triggers")
    db = cluster.new_db("sb_trigger")
    url = cluster.url(db)
    ntasks = 4
    with psycopg.connect(url, autocommit=True) as c:
        tids = [c.execute("SELECT id FROM switchboard.create_task(%s, NULL, 'bench.mark')",
                          (f"bench-lat-{i}",)).fetchone()[0] for i in range(ntasks)]
    procs = _start([replica(cluster, db, f"trigger-r{i}", env={"SWITCHBOARD_HANDLERS": "bench_handlers"})
                    for i in range(replicas)])
    per_run = []
    all_lat: list[float] = []
    skipped = 0
    try:
        time.sleep(1.5)
        with psycopg.connect(url, autocommit=True) as c:
            for r in range(runs):
                sent: dict[int, float] = {}
                for k in range(samples):
                    time.sleep(random.uniform(0.01, 0.03))
                    row = c.execute("SELECT id FROM switchboard.create_run_exclusive(%s, 'bench')",
                                    (tids[k % ntasks],)).fetchone()
                    t = time.time()
                    if row is None:
                        skipped += 1
                        continue
                    sent[row[0]] = t
                time.sleep(0.5)
                rows = c.execute("SELECT id, (result->>'t')::float8, worker FROM switchboard.task_runs "
                                 "WHERE id = ANY(%s) AND status = 'succeeded'", (list(sent),)).fetchall()
                lat = [(t - sent[i]) * 1000 for i, t, _ in rows]
                workers = len({w for _, _, w in rows})
                s = _summary(lat) | {"replicas_that_ran": workers, "missing": len(sent) - len(rows)}
                log(f"   switchboard run {r + 1}: p50 {s['p50_ms']} ms p99 {s['p99_ms']} ms "
                    f"(n={s['n']}, {workers} replicas ran them)")
                per_run.append(s)
                all_lat += lat
                c.execute("DELETE FROM switchboard.task_runs")
    finally:
        stop_all(procs)
    # The floor: the same pacing, raw NOTIFY at COMMIT -> a LISTENing process.
    base_runs = []
    rcv = Receiver("listen", url, "bench_raw")
    try:
        for r in range(runs):
            sent = asyncio.run(_publish(url, "SELECT pg_notify('bench_raw', %s)", lambda k: (str(k),),
                                        samples, None, conns=1, gaps=(0.01, 0.03)))
            rcv.wait_count(samples, 3)
            lat = _latencies(sent, rcv.dump())
            base_runs.append(_summary(lat))
    finally:
        rcv.close()
        cluster.drop_db(db)
    log(f"   raw NOTIFY->LISTEN: p50 {median([b['p50_ms'] for b in base_runs])} ms "
        f"p99 {median([b['p99_ms'] for b in base_runs])} ms")
    return {"replicas": replicas, "runs": runs, "samples_per_run": samples, "skipped_busy": skipped,
            "switchboard": {"p50_ms": median([s["p50_ms"] for s in per_run]),
                            "p99_ms": median([s["p99_ms"] for s in per_run]),
                            "pooled": _summary(all_lat), "runs": per_run},
            "raw_notify": {"p50_ms": median([b["p50_ms"] for b in base_runs]),
                           "p99_ms": median([b["p99_ms"] for b in base_runs]), "runs": base_runs}}


# -- 5 and 7: events, sockets ---------------------------------------------------------------------
def _users(url: str, n: int, prefix: str, room: str | None = None, role: str = "member") -> list[str]:
    from switchboard.auth import hash_password

    h = hash_password("bench-password")
    with psycopg.connect(url, autocommit=True) as c:
        ids = [str(r[0]) for r in c.execute(
            "SELECT switchboard.create_user(%s || i, %s, %s) FROM generate_series(1, %s) i",
            (prefix, h, role, n)).fetchall()]
        if room:
            c.execute("SELECT switchboard.add_room_member(%s, u::uuid) FROM unnest(%s::text[]) u", (room, ids))
    return ids


def _tickets(url: str, ids: list[str]) -> list[str]:
    with psycopg.connect(url, autocommit=True) as c:
        return [r[0] for r in c.execute(
            "SELECT switchboard.issue_ticket_v2(u::uuid, NULL, interval '10 minutes') FROM unnest(%s::text[]) u",
            (ids,)).fetchall()]


def _spec(urls: list[str], hello: bool = True, deflate: bool = True) -> str:
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"urls": urls, "hello": hello, "deflate": deflate}, f)
    f.close()
    return f.name


def _publish_warm(url: str, user_id: str) -> None:
    """A few events after the live path was switched on: each relay has read the key and
    LISTENs on its channel (event_live_path's {"live": 1} hint) before the measurement."""
    with psycopg.connect(url, autocommit=True) as c:
        for _ in range(3):
            c.execute("SELECT switchboard.notify_user(%s, 'warm', '{}')", (user_id,))
            time.sleep(0.3)
    time.sleep(1.0)


def _per_user_runs(rcv: Receiver, url: str, sql: str, params: Any, n: int, rate: float, runs: int,
                   label: str) -> dict[str, Any]:
    out = []
    for r in range(runs):
        sent = asyncio.run(_publish(url, sql, params, n, rate))
        elapsed = sent.pop(-1)
        got = rcv.wait_count(n, 10)
        lat = _latencies(sent, rcv.dump())
        s = _summary(lat) | {"sent": n, "received": got, "achieved_rate": round(n / elapsed, 1)}
        log(f"   {label} per-user run {r + 1}: p50 {s['p50_ms']} ms p99 {s['p99_ms']} ms, "
            f"{got}/{n} received, {s['achieved_rate']} ev/s published")
        out.append(s)
    return {"p50_ms": median([s["p50_ms"] for s in out]), "p99_ms": median([s["p99_ms"] for s in out]),
            "runs": out}


def _fan_out_runs(rcv: Receiver, url: str, sql: str, params: Any, n: int, rate: float, members: int,
                  runs: int, label: str) -> dict[str, Any]:
    out = []
    for r in range(runs):
        sent = asyncio.run(_publish(url, sql, params, n, rate, conns=1))
        sent.pop(-1)
        got = rcv.wait_count(n * members, 15)
        last: dict[int, float] = {}
        cnt: dict[int, int] = {}
        for k, t, _ in rcv.dump():
            if t > last.get(k, 0):
                last[k] = t
            cnt[k] = cnt.get(k, 0) + 1
        lat = [(last[k] - sent[k]) * 1000 for k in last if k in sent]
        s = _summary(lat) | {"events": n, "frames": got, "frames_expected": n * members,
                             "complete_events": sum(1 for k in cnt if cnt[k] == members)}
        log(f"   {label} fan-out run {r + 1}: last member p50 {s['p50_ms']} ms p99 {s['p99_ms']} ms, "
            f"{got}/{n * members} frames")
        out.append(s)
    return {"p50_ms": median([s["p50_ms"] for s in out]), "p99_ms": median([s["p99_ms"] for s in out]),
            "runs": out}


def _side_by_side(runs: int, ours: Callable[[], dict[str, Any]],
                  bare: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``runs`` rounds of one Switchboard measurement and the bare relay's, alternating
    (ours first in even rounds, the bare relay first in odd ones), both stacks up and
    their sockets open throughout. On a shared 2-core box the tail moves by several
    times from one minute to the next, so each p99 is compared with the bare relay's of
    the same round: ``p99_vs_bare`` is the median of the per-round ratios. Each side's
    p50 / p99 is the median over its rounds, as before."""
    a: list[dict[str, Any]] = []
    b: list[dict[str, Any]] = []
    for r in range(runs):
        for side in ((ours, bare) if r % 2 == 0 else (bare, ours)):
            (a if side is ours else b).append(side())
    ratios = sorted(round(x["p99_ms"] / y["p99_ms"], 2) for x, y in zip(a, b) if y["p99_ms"])

    def summary(xs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"p50_ms": median([x["p50_ms"] for x in xs]), "p99_ms": median([x["p99_ms"] for x in xs]),
                "runs": xs}
    mine = summary(a) | {"p99_vs_bare_rounds": ratios, "p99_vs_bare": median(ratios) if ratios else None}
    return mine, summary(b)


def bench_events(cluster: Cluster, replicas: int = 3, users: int = 1000, rate: float = 1000,
                 seconds: float = 5, fan_rate: float = 10, fan_seconds: float = 10,
                 runs: int = 3) -> dict[str, Any]:
    log(f"5 events: {users} sockets over {replicas} replicas; {rate:.0f} ev/s x {seconds:.0f} s x {runs} runs; "
        f"fan-out {fan_rate:.0f} ev/s x {fan_seconds:.0f} s to {users} members; each against the bare relay "
        f"in alternating rounds")
    db = cluster.new_db("sb_events")
    url = cluster.url(db)
    ids = _users(url, users, "bench_u", room="bench-room")
    n, nf = int(rate * seconds), int(fan_rate * fan_seconds)
    out: dict[str, Any] = {"replicas": replicas, "users": users, "rate_per_s": rate, "seconds": seconds,
                           "fan_rate_per_s": fan_rate, "fan_seconds": fan_seconds, "runs": runs,
                           "client": "one asyncio process (websockets library) per stack holding every socket, "
                                     "on the same 2-core host",
                           "method": "Switchboard and the bare relay both up, rounds alternating; "
                                     "p99_vs_bare = median of the per-round p99 ratios"}
    # Switchboard: notify_user / notify_room -> relay on each replica -> socket; and the
    # same stack without Switchboard: bare Falcon apps relaying raw NOTIFYs to their sockets.
    procs = _start([replica(cluster, db, f"events-r{i}") for i in range(replicas)])
    env = dict(os.environ, DATABASE_URL=cluster.url(db, APP_LOGIN))
    bares = [Proc([sys.executable, str(BENCH / "bare_app.py"), "--port", str(port), "--listen"],
                  env, port, f"events-bare{i}") for i, port in enumerate(free_port() for _ in range(replicas))]
    rcvs: list[Receiver] = []
    try:
        _start(bares)
        tickets = _tickets(url, ids)
        spec = _spec([f"{procs[i % replicas].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets)])
        t0 = time.time()
        rcv = Receiver("ws", spec)
        rcvs.append(rcv)
        os.unlink(spec)
        log(f"   {users} sockets open in {time.time() - t0:.1f} s ({rcv.first})")
        rcvb = Receiver("ws", _spec([f"{bares[i % replicas].ws_base}/ws?u={i}" for i in range(users)], hello=False))
        rcvs.append(rcvb)
        time.sleep(0.5)
        frames = nf * users

        def per_user(rc: Receiver, servers: list[Proc], sql: str, params: Any,
                     label: str) -> Callable[[], dict[str, Any]]:
            def one() -> dict[str, Any]:
                meter = CpuMeter(cluster, [p.pid for p in servers])
                s = _per_user_runs(rc, url, sql, params, n, rate, 1, label)["runs"][0]
                return s | {"cpu": meter.stop()}
            return one

        def fan_out(rc: Receiver, servers: list[Proc], sql: str, params: Any, label: str,
                    servers_key: str) -> Callable[[], dict[str, Any]]:
            def one() -> dict[str, Any]:
                meter = CpuMeter(cluster, [p.pid for p in servers])
                client = CpuMeter(cluster, [rc.proc.pid])
                s = _fan_out_runs(rc, url, sql, params, nf, fan_rate, users, 1, label)["runs"][0]
                return s | {"cpu_us_per_frame": {servers_key: round(meter.stop()["workers_cpu_s"] / frames * 1e6, 1),
                                                 "client": round(client.stop()["workers_cpu_s"] / frames * 1e6, 1)}}
            return one

        sb_user = ("SELECT switchboard.notify_user(%s, 'bench', %s)",
                   lambda k: (ids[k % users], json.dumps({"k": k})))
        sb_room = ("SELECT switchboard.notify_room('bench-room', 'bench', %s)", lambda k: (json.dumps({"k": k}),))
        bare_per_user = per_user(rcvb, bares, "SELECT pg_notify('bare_events', %s)",
                                 lambda k: (json.dumps({"u": str(k % users), "k": k}),), "bare")
        bare_fan_out = fan_out(rcvb, bares, "SELECT pg_notify('bare_events', %s)",
                               lambda k: (json.dumps({"u": None, "k": k}),), "bare", "servers")

        def cpu_per_frame(summary: dict[str, Any], *keys: str) -> dict[str, float]:
            return {k: median([r["cpu_us_per_frame"][k] for r in summary["runs"]]) for k in keys}

        out["per_user"], out["bare_per_user"] = _side_by_side(
            runs, per_user(rcv, procs, *sb_user, "switchboard"), bare_per_user)
        log(f"   room join: {rcv.cmd('join bench-room')}")
        out["fan_out"], out["bare_fan_out"] = _side_by_side(
            runs, fan_out(rcv, procs, *sb_room, "switchboard", "replicas"), bare_fan_out)
        out["fan_out"]["cpu_us_per_frame"] = cpu_per_frame(out["fan_out"], "replicas", "client")
        out["bare_fan_out"]["cpu_us_per_frame"] = cpu_per_frame(out["bare_fan_out"], "servers", "client")
        # The same replicas and sockets with the verified live path on (V0020, off by
        # default): frames from signed NOTIFYs, every event still read once per replica.
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT switchboard.event_live_path(true)")
        _publish_warm(url, ids[0])
        out["per_user_live"], out["bare_per_user_live"] = _side_by_side(
            runs, per_user(rcv, procs, *sb_user, "switchboard live path"), bare_per_user)
        out["fan_out_live"], out["bare_fan_out_live"] = _side_by_side(
            runs, fan_out(rcv, procs, *sb_room, "switchboard live path", "replicas"), bare_fan_out)
        out["fan_out_live"]["cpu_us_per_frame"] = cpu_per_frame(out["fan_out_live"], "replicas")
    finally:
        for r in rcvs:
            r.close()
        stop_all(procs + bares)

    # The floor: raw NOTIFY at COMMIT -> one LISTENing process, no socket at all.
    base_runs = []
    rcv = Receiver("listen", url, "bench_raw")
    try:
        for r in range(runs):
            sent = asyncio.run(_publish(url, "SELECT pg_notify('bench_raw', %s)", lambda k: (str(k),), n, rate))
            elapsed = sent.pop(-1)
            got = rcv.wait_count(n, 5)
            lat = _latencies(sent, rcv.dump())
            base_runs.append(_summary(lat) | {"sent": n, "received": got, "achieved_rate": round(n / elapsed, 1)})
    finally:
        rcv.close()
        cluster.drop_db(db)
    out["raw_notify"] = {"p50_ms": median([b["p50_ms"] for b in base_runs]),
                         "p99_ms": median([b["p99_ms"] for b in base_runs]), "runs": base_runs}
    log(f"   raw NOTIFY->LISTEN at {rate:.0f}/s: p50 {out['raw_notify']['p50_ms']} ms "
        f"p99 {out['raw_notify']['p99_ms']} ms")
    return out


def bench_memory(cluster: Cluster, sockets: int = 1000, runs: int = 3) -> dict[str, Any]:
    log(f"7 memory: RSS growth for {sockets} idle WebSockets on one replica ({runs} runs) vs bare app")
    db = cluster.new_db("sb_mem")
    url = cluster.url(db)
    ids = _users(url, sockets, "bench_m")
    sb, bare = [], []

    def measure(proc: Proc, urls: list[str], hello: bool = True) -> dict[str, Any]:
        _start([proc])
        try:
            # Warm up the code paths (first socket, first query) before the "before" reading.
            warm = Receiver("ws", _spec(urls[:10], hello))
            warm.close()
            time.sleep(1.0)
            before = rss_kib(proc.pid)
            rcv = Receiver("ws", _spec(urls[10:10 + sockets], hello))
            time.sleep(2.0)
            after = rss_kib(proc.pid)
            rcv.close()
            return {"rss_before_kib": before, "rss_after_kib": after,
                    "kib_per_1000": round((after - before) * 1000 / sockets)}
        finally:
            stop_all([proc])

    try:
        for r in range(runs):
            # 10 warm-up users reuse the first ids' neighbours: one ticket per socket.
            tickets = _tickets(url, ids[:10] + ids[:sockets])
            p = replica(cluster, db, f"mem-r{r}")
            sb.append(measure(p, [f"{p.ws_base}/ws?ticket={t}" for t in tickets]))
            port = free_port()
            env = dict(os.environ, DATABASE_URL=cluster.url(db, APP_LOGIN))
            b = Proc([sys.executable, str(BENCH / "bare_app.py"), "--port", str(port)], env, port, f"mem-bare{r}")
            bare.append(measure(b, [f"{b.ws_base}/ws"] * (sockets + 10), hello=False))
            log(f"   run {r + 1}: switchboard {sb[-1]['kib_per_1000']} KiB / 1000 sockets, "
                f"bare {bare[-1]['kib_per_1000']} KiB / 1000 sockets")
    finally:
        cluster.drop_db(db)
    s = median([x["kib_per_1000"] for x in sb])
    b = median([x["kib_per_1000"] for x in bare])
    return {"sockets": sockets, "runs": runs,
            "switchboard": {"kib_per_1000_median": s, "runs": sb},
            "bare": {"kib_per_1000_median": b, "runs": bare},
            "ratio": round(s / b, 2) if b else None,
            "note": "client offers permessage-deflate (as browsers do); uvicorn accepts it"}


# -- 6: HTTP ------------------------------------------------------------------------------------------
def _wrk(url: str, headers: dict[str, str], conns: int, seconds: float) -> dict[str, Any]:
    cmd = ["wrk", "-t2", f"-c{conns}", f"-d{int(seconds)}s", "--latency", "--timeout", "5s"]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errs = re.search(r"Socket errors: (.*)", out)

    def lat(p: str) -> float | None:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        if not m:
            return None
        v, unit = float(m.group(1)), m.group(2)
        return round(v / 1000 if unit == "us" else v * 1000 if unit == "s" else v, 2)
    return {"rps": rps, "non_2xx": int(bad.group(1)) if bad else 0, "socket_errors": errs.group(1) if errs else None,
            "p50_ms": lat("50"), "p99_ms": lat("99")}


async def _pyload(url: str, headers: dict[str, str], conns: int, seconds: float) -> dict[str, Any]:
    """Fallback when wrk is absent: keep-alive HTTP/1.1 over raw asyncio streams."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    req = (f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\n"
           + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    lat: list[float] = []
    bad = 0
    stop = time.time() + seconds

    async def one() -> None:
        nonlocal bad
        r, w = await asyncio.open_connection(u.hostname, u.port)
        while time.time() < stop:
            t = time.perf_counter()
            w.write(req)
            head = await r.readuntil(b"\r\n\r\n")
            m = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
            await r.readexactly(int(m.group(1)) if m else 0)
            lat.append((time.perf_counter() - t) * 1000)
            if not head.startswith(b"HTTP/1.1 200"):
                bad += 1
        w.close()
    await asyncio.gather(*(one() for _ in range(conns)))
    return {"rps": round(len(lat) / seconds, 1), "non_2xx": bad, "socket_errors": None,
            "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2)}


def bench_http(cluster: Cluster, conns: int = 32, seconds: float = 10, runs: int = 3) -> dict[str, Any]:
    tool = "wrk" if shutil.which("wrk") else "python asyncio keep-alive client"
    log(f"6 http: GET /tasks, {conns} connections x {seconds:.0f} s x {runs} runs each, load: {tool}")
    db = cluster.new_db("sb_http")
    url = cluster.url(db)
    with psycopg.connect(url, autocommit=True) as c:
        for i in range(5):
            c.execute("SELECT switchboard.create_task(%s, NULL, 'noop', %s)", (f"bench-task-{i}", json.dumps({"i": i})))
    # GET /tasks is admin-only since the trust-boundary work (V0004): a member's
    # token gets 403, and the figure would measure the refusal path, not the list.
    uid = _users(url, 1, "bench_http", role="admin")[0]
    token = make_token(uid, "bench_http1", role="admin")
    sbp = replica(cluster, db, "http-sb")
    port = free_port()
    env = dict(os.environ, DATABASE_URL=cluster.url(db, APP_LOGIN))
    bare = Proc([sys.executable, str(BENCH / "bare_app.py"), "--port", str(port)], env, port, "http-bare")
    _start([sbp, bare])
    hdr = {"Authorization": f"Bearer {token}"}
    sb_runs, bare_runs = [], []
    try:
        import urllib.request

        answers = []
        for p in (sbp, bare):  # the same rows from both (5 + the built-in maintenance task), and warm
            req = urllib.request.Request(p.base + "/tasks", headers=hdr)
            with urllib.request.urlopen(req, timeout=5) as resp:
                answers.append(sorted(t["name"] for t in json.loads(resp.read())["tasks"]))
        assert answers[0] == answers[1] and len(answers[0]) == 6, answers

        def load(p: Proc, secs: float = seconds) -> dict[str, Any]:
            meter = CpuMeter(cluster, [p.pid])
            if tool == "wrk":
                res = _wrk(p.base + "/tasks", hdr, conns, secs)
            else:
                res = asyncio.run(_pyload(p.base + "/tasks", hdr, conns, secs))
            cpu = meter.stop()
            if res["non_2xx"]:  # a refused request is cheap: counting it would flatter the figure
                raise RuntimeError(f"{p.name}: {res['non_2xx']} non-2xx answers to GET /tasks")
            n = max(res["rps"] * secs, 1)
            return res | {"server_cpu_us_per_req": round(cpu["workers_cpu_s"] / n * 1e6, 1),
                          "postgres_cpu_us_per_req": round(cpu["postgres_cpu_s"] / n * 1e6, 1)}

        for p in (sbp, bare):  # warm-up: pools grown, statements prepared, code paths hot
            load(p, 2)
        for r in range(runs):
            sb_runs.append(load(sbp))
            bare_runs.append(load(bare))
            log(f"   run {r + 1}: switchboard {sb_runs[-1]['rps']} req/s "
                f"({sb_runs[-1]['server_cpu_us_per_req']} us CPU/req), bare {bare_runs[-1]['rps']} req/s "
                f"({bare_runs[-1]['server_cpu_us_per_req']} us CPU/req)")
    finally:
        stop_all([sbp, bare])
        cluster.drop_db(db)
    s = median([r["rps"] for r in sb_runs])
    b = median([r["rps"] for r in bare_runs])

    def cpu(runs_: list[dict]) -> dict[str, float]:
        return {"server": median([r["server_cpu_us_per_req"] for r in runs_]),
                "postgres": median([r["postgres_cpu_us_per_req"] for r in runs_])}
    return {"endpoint": "GET /tasks (6 tasks, bearer)", "connections": conns, "seconds": seconds, "runs": runs,
            "load_generator": tool,
            "switchboard": {"rps_median": s, "cpu_us_per_req_median": cpu(sb_runs), "runs": sb_runs},
            "bare": {"rps_median": b, "cpu_us_per_req_median": cpu(bare_runs), "runs": bare_runs},
            "ratio": round(s / b, 3)}


FIGURES = {"jobs": bench_jobs, "trigger": bench_trigger, "events": bench_events, "http": bench_http,
           "memory": bench_memory}


def run_all(cluster: Cluster, only: list[str], quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in only:
        fn = FIGURES[name]
        kw: dict[str, Any] = {}
        if quick:
            kw = {"jobs": {"m": 2000, "runs": 1}, "trigger": {"samples": 100, "runs": 1},
                  "events": {"seconds": 2, "fan_seconds": 3, "runs": 1}, "http": {"seconds": 3, "runs": 1},
                  "memory": {"runs": 1}}[name]
        t = time.time()
        try:
            out[name] = fn(cluster, **kw)
        except Exception as exc:  # one broken figure must not lose the others
            log(f"   {name} FAILED: {type(exc).__name__}: {exc}")
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out[name]["wall_seconds"] = round(time.time() - t, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(FIGURES))
    p.add_argument("--quick", action="store_true", help="fewer samples, one run each (a smoke test)")
    a = p.parse_args()
    cluster = Cluster()
    try:
        res = run_all(cluster, a.only.split(","), a.quick)
        res["machine"] = machine_info(cluster)
    finally:
        cluster.stop()
    write_json(RESULTS / "e2e.json", res)
    print(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
