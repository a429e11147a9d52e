#!/usr/bin/env python3
"""GET /runs on the primary vs on a streaming replica while a drain runs (issue 35, item 4).

    python bench/read_replica.py [--history 200000] [--jobs 30000] [--rounds 4] [--requests 100]

One primary and one pg_basebackup hot standby (tests/standby_kit.py, PostgreSQL 15,
the suite's settings), a database holding --history finished runs, and three real
`switchboard serve` processes: a worker (scheduler on) draining --jobs queued noop
jobs, and two readers with the scheduler off -- one with SWITCHBOARD_READ_DATABASE_URL
(its GET /runs is served by the standby), one without (served by the primary).
While the drain runs, rounds alternate between the readers (A B A B ...): --requests
sequential GET /runs?status=succeeded&limit=50 each. Same run, same box, reported:
p50 / p99 of each reader, their ratio, the drain rate during each reader's rounds,
and the primary's CPU per request (utime + stime of the primary's postmaster and its
children, /proc; the standby's processes are counted apart).

On a shared 2-core box the standby competes with the primary for the same cores,
so what the replica buys here is primary CPU, not latency; on separate hosts the
standby's CPU is its own.

Raw results: bench/results/read_replica.json; a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT / "tests"))

from switchboard.migrate import migrate  # noqa: E402

from common import log, median, pct  # noqa: E402
from harness import APP_LOGIN, Server, app_url_for, auth, make_user  # noqa: E402
from standby_kit import PrimaryAndStandby  # noqa: E402

DB = "sb_bench"
TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds of a postmaster and its direct children (backends, walsender, ...)."""
    total = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(d), int(parts[1])
        if pid == root or ppid == root:
            total += (int(parts[11]) + int(parts[12])) / TICKS
    return total


def finished(url: str) -> int:
    with psycopg.connect(url) as c:
        return int(c.execute("SELECT count(*) FROM switchboard.task_runs WHERE status = 'succeeded'").fetchone()[0])


def seed(url: str, history: int, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("INSERT INTO switchboard.task_runs (handler, status, trigger, run_at, started_at, finished_at, result) "
                  "SELECT 'noop', 'succeeded', 'enqueue', t, t, t + interval '1 ms', '{}' "
                  "FROM (SELECT now() - make_interval(secs => g) AS t FROM generate_series(1, %s) g) s",
                  (history,))
        c.execute("SELECT count(*) FROM (SELECT switchboard.enqueue('noop') FROM generate_series(1, %s)) x", (jobs,))
        c.execute("ANALYZE switchboard.task_runs_hot, switchboard.task_runs_history")


def round_of(s: Server, headers: dict[str, str], n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=s.base, headers=headers, timeout=30) as h:
        for _ in range(n):
            t = time.perf_counter()
            r = h.get("/runs", params={"status": "succeeded", "limit": 50})
            out.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    return out


def idle_rounds(on_replica: Server, on_primary: Server, headers: dict[str, str],
                a: argparse.Namespace) -> dict[str, Any]:
    """The same rounds with nothing else running: whatever the replica costs a read by itself."""
    lat: dict[str, list[float]] = {"replica": [], "primary": []}
    for i in range(a.rounds * 2):
        which, s = (("replica", on_replica), ("primary", on_primary))[(i + i // 2) % 2]
        lat[which] += round_of(s, headers, a.requests)
    out: dict[str, Any] = {k: {"p50_ms": median(v) * 1000, "p99_ms": pct(v, 99) * 1000} for k, v in lat.items()}
    out["ratio_p50_replica_over_primary"] = out["replica"]["p50_ms"] / out["primary"]["p50_ms"]
    out["ratio_p99_replica_over_primary"] = out["replica"]["p99_ms"] / out["primary"]["p99_ms"]
    log(f"no drain: p50 replica {out['replica']['p50_ms']:.1f} ms, primary {out['primary']['p50_ms']:.1f} ms; "
        f"p99 {out['replica']['p99_ms']:.1f} / {out['primary']['p99_ms']:.1f} ms")
    return out


def explain(url: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the listing GET /runs?status=succeeded&limit=50 runs (list_runs' query)."""
    q = ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT v.* FROM switchboard.runs v "
         "WHERE v.status = 'succeeded' ORDER BY v.id DESC LIMIT 50")
    with psycopg.connect(url) as c:
        c.execute(q)   # warm the cache as the server's reads are
        plan = c.execute(q).fetchone()[0][0]
    scans: list[str] = []

    def walk(n: dict[str, Any]) -> None:
        if "Relation Name" in n and n.get("Actual Loops", 0) > 0:
            scans.append(n["Relation Name"])
        for ch in n.get("Plans", []):
            walk(ch)
    walk(plan["Plan"])
    hits = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
    return {"execution_ms": plan["Execution Time"], "planning_ms": plan["Planning Time"],
            "partitions_scanned": len(scans), "relations": sorted(set(scans)), "buffers": hits}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", type=int, default=200_000)
    ap.add_argument("--jobs", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=100)
    a = ap.parse_args()
    pair = PrimaryAndStandby()
    servers: list[Server] = []
    try:
        with psycopg.connect(pair.primary.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
            c.execute(f"CREATE DATABASE {DB}")
        url = pair.primary.url(DB)
        migrate(url)
        with psycopg.connect(pair.primary.url(), autocommit=True) as c:
            c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
        make_user(url, "admin", role="admin")
        log(f"seeding {a.history} finished runs")
        seed(url, a.history, 0)
        pair.start_standby()
        pair.wait_replayed(DB, timeout=300)
        app = app_url_for(url)
        quiet = {"SWITCHBOARD_SCHEDULER": "off", "SWITCHBOARD_LOG_LEVEL": "WARNING"}
        on_replica = Server(app, env={**quiet, "SWITCHBOARD_READ_DATABASE_URL": app_url_for(pair.url(DB))},
                            name="reader-replica").start()
        on_primary = Server(app, env=quiet, name="reader-primary").start()
        servers += [on_replica, on_primary]
        headers = auth(on_replica.login("admin"))
        for s in (on_replica, on_primary):   # warm up (connections, prepared statements)
            round_of(s, headers, 20)
        idle = idle_rounds(on_replica, on_primary, headers, a)
        plans = {k: explain(u) for k, u in (("primary", url), ("replica", pair.url(DB)))}
        log(f"enqueueing {a.jobs} jobs, starting the worker")
        seed(url, 0, a.jobs)
        worker = Server(app, env={"SWITCHBOARD_SCHEDULER_CONCURRENCY": "16", "SWITCHBOARD_LOG_LEVEL": "WARNING"},
                        name="worker").start()
        servers.append(worker)
        standby_pid = pair.proc.pid if pair.proc else -1
        res: dict[str, dict[str, list[float]]] = {k: {"lat": [], "cpu": [], "rate": [], "standby_cpu": [],
                                                      "rps": []} for k in ("replica", "primary")}
        for i in range(a.rounds * 2):
            # A B B A ...: the drain slows as it goes, so neither reader always goes first
            which, s = (("replica", on_replica), ("primary", on_primary))[(i + i // 2) % 2]
            done0, cpu0, scpu0, t0 = finished(url), tree_cpu(pair.primary.pid or -1), tree_cpu(standby_pid), \
                time.perf_counter()
            lat = round_of(s, headers, a.requests)
            dt = time.perf_counter() - t0
            res[which]["lat"] += lat
            res[which]["cpu"].append((tree_cpu(pair.primary.pid or -1) - cpu0) / dt)
            res[which]["standby_cpu"].append((tree_cpu(standby_pid) - scpu0) / dt)
            res[which]["rate"].append((finished(url) - done0) / dt)
            res[which]["rps"].append(a.requests / dt)
            log(f"round {i}: {which} p50 {median(lat) * 1000:.1f} ms p99 {pct(lat, 99) * 1000:.1f} ms, "
                f"drain {res[which]['rate'][-1]:.0f}/s")
        left = a.jobs + a.history - finished(url)
        served = httpx.get(on_replica.base + "/metrics", timeout=30).text
        out = {k: {"p50_ms": median(v["lat"]) * 1000, "p99_ms": pct(v["lat"], 99) * 1000,
                   "drain_per_s": median(v["rate"]), "primary_cores": median(v["cpu"]),
                   "standby_cores": median(v["standby_cpu"]), "requests": len(v["lat"]),
                   "requests_per_s": median(v["rps"])}
               for k, v in res.items()}
        out["ratio_p99_replica_over_primary"] = out["replica"]["p99_ms"] / out["primary"]["p99_ms"]  # type: ignore[assignment]
        out["ratio_p50_replica_over_primary"] = out["replica"]["p50_ms"] / out["primary"]["p50_ms"]  # type: ignore[assignment]
        out["jobs_left_at_end"] = left  # type: ignore[assignment]
        out["idle"] = idle  # type: ignore[assignment]
        out["plans"] = plans  # type: ignore[assignment]
        # primary CPU a GET /runs costs when the primary serves it (the difference of the two, per request)
        rp, rr = out["primary"], out["replica"]
        out["primary_ms_per_request"] = 1000 * (rp["primary_cores"] - rr["primary_cores"]) / rp["requests_per_s"]  # type: ignore[assignment]
        out["replica_reads"] = [ln for ln in served.splitlines()  # type: ignore[assignment]
                                if ln.startswith(("switchboard_history_reads_total", "switchboard_read_fallbacks"))]
        results = ROOT / "bench" / "results"
        results.mkdir(exist_ok=True)
        (results / "read_replica.json").write_text(json.dumps({"args": vars(a), "results": out}, indent=2))
        print("| reader | req/s | p50 ms | p99 ms | drain jobs/s | primary cores | standby cores |\n"
              "|---|---|---|---|---|---|---|")
        for k in ("replica", "primary"):
            r: Any = out[k]
            print(f"| GET /runs on the {k} | {r['requests_per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['drain_per_s']:.0f} | "
                  f"{r['primary_cores']:.2f} | {r['standby_cores']:.2f} |")
        print(f"\np99 replica/primary: {out['ratio_p99_replica_over_primary']:.2f}; "
              f"p50: {out['ratio_p50_replica_over_primary']:.2f}; jobs left at the end: {left}; primary CPU per "
              f"GET /runs served there: {out['primary_ms_per_request']:.2f} ms")
        print("\n".join(out["replica_reads"]))  # type: ignore[arg-type]
        print(f"no drain: p50 replica/primary {idle['ratio_p50_replica_over_primary']:.2f}, "
              f"p99 {idle['ratio_p99_replica_over_primary']:.2f}; the listing's plan: "
              + "; ".join(f"{k} {v['execution_ms']:.2f} ms, {v['partitions_scanned']} partitions"
                          for k, v in plans.items()))
    finally:
        for s in servers:
            try:
                s.terminate()
            except Exception:
                s.kill()
        pair.stop()


if __name__ == "__main__":
    main()
