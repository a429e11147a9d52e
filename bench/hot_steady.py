#!/usr/bin/env python3
"""Issue 35: the claim's table after N jobs at steady state (V0036's hot table against one table).

    python bench/hot_steady.py [--jobs 10000000] [--sides sb,old] [--producers 2] [--workers 2]
                               [--depth 20000] [--every 500000] [--naptime 10s]

One throwaway PostgreSQL (the suite's settings: autovacuum on, with the real
migrations' storage settings on the tables). Each side pushes N jobs through
enqueue -> claim -> finish at a steady state: P producer connections enqueue
in statements of 200 while fewer than --depth jobs wait, W worker connections
claim 50 and finish them, until N jobs have finished.

- sb: the real functions (switchboard.enqueue, claim_due_tasks(w, lease, 50),
  finish_runs): a finish moves the run to task_runs_history, so the claim's
  table is switchboard.task_runs_hot.
- old: the layout before V0036, emulated as bench/history.py does: bench_old,
  created LIKE task_runs_hot INCLUDING ALL (every index of the old task_runs,
  its storage settings), driven by the same claim and finish as plain SQL; a
  finish updates in place, so the finished runs stay in the claim's table
  (retention is days; N jobs at 1,000 jobs/s is under 3 hours).

The hot table's size at steady state is set by how many jobs pass between two
autovacuum visits (autovacuum_naptime, 1 minute by default, is how often the
launcher visits each database): --naptime sets it for the run.

Every --every jobs: heap and index bytes of the claim's table, its live and
dead tuples and autovacuum count (pg_stat_user_tables), and the jobs/s since
the previous sample. Raw results: bench/results/hot_steady.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, Cluster, loadavg, log, machine_info, write_json
from history import PLAIN_CLAIM, PLAIN_FINISH, setup_hot, sizes
from scale import DB

import psycopg
from psycopg import sql

ENQUEUE = {"sb": "SELECT count(*) FROM (SELECT switchboard.enqueue('bench.noop') FROM generate_series(1, %s)) x",
           "old": "INSERT INTO bench_old (handler, trigger) SELECT 'bench.noop', 'enqueue' FROM generate_series(1, %s)"}
CLAIM = {"sb": "SELECT id FROM switchboard.claim_due_tasks(%(w)s, '60 seconds', %(n)s)",
         "old": PLAIN_CLAIM.format(t="bench_old", w="%(w)s", n="%(n)s")}
FINISH = {"sb": "SELECT count(*) FROM switchboard.finish_runs(%(w)s, %(ids)s)",
          "old": PLAIN_FINISH.format(t="bench_old", ids="%(ids)s", w="%(w)s")}
TABLE = {"sb": "switchboard.task_runs_hot", "old": "bench_old"}
BATCH_IN = 200
BATCH_OUT = 50


def _producer(url: str, side: str, n: int, depth: int, made: Any, done: Any, stop: Any) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        while not stop.is_set():
            with made.get_lock():
                if made.value >= n:
                    return
                k = min(BATCH_IN, n - made.value)
                made.value += k
            while made.value - done.value > depth and not stop.is_set():
                time.sleep(0.005)
            c.execute(ENQUEUE[side], (k,))


def _worker(url: str, side: str, wid: int, n: int, done: Any, stop: Any) -> None:
    w = f"w{wid}"
    with psycopg.connect(url, autocommit=True) as c:
        while not stop.is_set() and done.value < n:
            ids = [r[0] for r in c.execute(CLAIM[side], {"w": w, "n": BATCH_OUT})]
            if not ids:
                time.sleep(0.002)
                continue
            c.execute(FINISH[side], {"w": w, "ids": ids})
            with done.get_lock():
                done.value += len(ids)


def sample(db: DB, side: str, done: int, t: float) -> dict[str, Any]:
    table = TABLE[side]
    st = db.execute("SELECT n_live_tup, n_dead_tup, autovacuum_count, vacuum_count FROM pg_stat_user_tables "
                    "WHERE relid = %s::regclass", (table,))[0]
    s = sizes(db, table)
    return {"jobs": done, "t": round(t, 1), "table_bytes": s["table_bytes"], "indexes_bytes": s["indexes_bytes"],
            "total_bytes": s["total_bytes"], "live": st[0], "dead": st[1], "autovacuums": st[2] + st[3]}


def run_side(db: DB, side: str, a: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    made, done, stop = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event()
    ps = [ctx.Process(target=_producer, args=(db.url, side, a.jobs, a.depth, made, done, stop))
          for _ in range(a.producers)]
    ps += [ctx.Process(target=_worker, args=(db.url, side, i, a.jobs, done, stop)) for i in range(a.workers)]
    samples = [sample(db, side, 0, 0.0)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    try:
        nxt = a.every
        while any(p.is_alive() for p in ps):
            time.sleep(0.2)
            if any(p.exitcode for p in ps):
                raise SystemExit(f"{side}: a load process failed (exit codes {[p.exitcode for p in ps]})")
            d = done.value
            if d >= nxt or d >= a.jobs:
                s = sample(db, side, d, time.perf_counter() - t0)
                prev = samples[-1]
                s["jobs_per_s"] = round((s["jobs"] - prev["jobs"]) / max(s["t"] - prev["t"], 1e-6))
                samples.append(s)
                log(f"  {side} {d:>11,} jobs  {s['jobs_per_s']:>6} jobs/s  table {s['table_bytes'] / 2**20:7.1f} MiB"
                    f" + indexes {s['indexes_bytes'] / 2**20:7.1f} MiB  live {s['live']:,} dead {s['dead']:,}"
                    f"  vacuums {s['autovacuums']}")
                nxt = (d // a.every + 1) * a.every
                if d >= a.jobs:
                    break
    finally:
        stop.set()
        for p in ps:
            p.join(10)
    wall = time.perf_counter() - t0
    total = [s["total_bytes"] for s in samples[1:]]
    return {"jobs": done.value, "seconds": round(wall, 1), "jobs_per_s": round(done.value / wall),
            "samples": samples, "final": samples[-1], "max_total_bytes": max(total) if total else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000_000)
    ap.add_argument("--sides", default="sb,old")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--depth", type=int, default=20_000, help="most jobs waiting at once")
    ap.add_argument("--every", type=int, default=500_000, help="jobs between samples")
    ap.add_argument("--naptime", default="", help="autovacuum_naptime for the run (default: PostgreSQL's, 1min)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the throwaway cluster on the way out
    out_path = RESULTS / "hot_steady.json"
    res: dict[str, Any] = {"command": "python " + " ".join(["bench/hot_steady.py", *sys.argv[1:]]),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "settings": vars(a),
                           "loadavg": {"start": loadavg()}, "sides": {}}
    t0 = time.time()
    cluster = Cluster()
    try:
        res["machine"] = machine_info(cluster)
        db = DB(cluster, "steady")
        if a.naptime:
            db.execute("ALTER SYSTEM SET autovacuum_naptime = %s" % sql.quote(a.naptime))
            db.execute("SELECT pg_reload_conf()")
        res["autovacuum_naptime"] = db.execute("SHOW autovacuum_naptime")[0][0]
        setup_hot(db)
        res["reloptions"] = db.execute("SELECT reloptions FROM pg_class WHERE oid = 'switchboard.task_runs_hot'"
                                       "::regclass")[0][0]
        for side in a.sides.split(","):
            log(f"{side}: {a.jobs:,} jobs through {TABLE[side]}")
            res["sides"][side] = run_side(db, side, a)
            if side == "sb":
                res["sides"][side]["history"] = sizes(db, "switchboard.task_runs_history")
            write_json(out_path, res)
    finally:
        cluster.stop()
    res["loadavg"]["end"] = loadavg()
    res["wall_seconds"] = round(time.time() - t0, 1)
    write_json(out_path, res)
    for side, r in res["sides"].items():
        f = r["final"]
        log(f"{side}: {r['jobs']:,} jobs in {r['seconds']} s ({r['jobs_per_s']} jobs/s); claim's table after: "
            f"{f['table_bytes'] / 2**20:.1f} MiB heap + {f['indexes_bytes'] / 2**20:.1f} MiB indexes "
            f"(largest sample {r['max_total_bytes'] / 2**20:.1f} MiB in all)")
    log(f"wall {res['wall_seconds']} s -> {out_path}")


if __name__ == "__main__":
    main()
