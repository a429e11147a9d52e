#!/usr/bin/env python3
"""Enqueue from application code, in the caller's transaction (issue 33), one run.

    python bench/enqueue_tx.py [--jobs 5000] [--clients 1,4] [--rounds 5] [--iterations 3000]
                               [--quick] [--durable]

One throwaway PostgreSQL (common.Cluster: a clone of the migrated template) holds
both queues in one database: Switchboard's (schema ``switchboard``) and
procrastinate's (its schema applied in ``public``), plus an ``orders`` table
and an ``order_lines`` table standing in for the application's own. Every
client connects as the least-privilege app login (GRANTs on procrastinate's
tables for its side). A LISTEN connection is open on both queues' wake-up
channels throughout (a NOTIFY with no listener costs less; it is drained after
every run). No worker runs: this measures putting a job in, not draining it
(bench/jobs_ab.py drains).

1. Jobs enqueued per second from application code: ``--jobs`` jobs per run over
   1 and 4 client *processes* (spawned once, one connection each, so the GIL
   is not the limit; they start together on a barrier), variants rotating per
   round, both queues truncated before every run:

   - ``sb``           ``with conn.transaction(): api.enqueue(conn, "noop", {"i": i})``
   - ``procr``        ``task.defer(i=i)``: procrastinate's own path, a pool of
                      its PsycopgConnector (1 connection per process), one
                      transaction per defer
   - ``procr_conn``   ``with conn.transaction(): task.configure(connection=conn).defer(i=i)``
                      (procrastinate 3.10 defers on a caller-owned connection)
   - ``order``        ``with conn.transaction(): INSERT INTO orders`` (the ceiling)
   - ``sb_order``     the INSERT + ``api.enqueue`` in one transaction
   - ``procr_order``  the INSERT + procrastinate's defer on that connection

   Reported: jobs/s (wall from the barrier to the last process's end), client
   and PostgreSQL CPU per job (/proc), and the ratios Switchboard/procrastinate
   per round and their median.

2. What enqueue adds to a web request's transaction (µs, one connection, this
   process): ``INSERT INTO orders ... RETURNING id`` alone, then + ``api.enqueue``,
   + ``api.notify_user``, + both, + a plain second INSERT into ``order_lines``
   (the reference: what a second INSERT costs), + a bare ``SELECT 1`` (one round
   trip) and + procrastinate's defer on the connection. ``--iterations`` cycles,
   each running every variant once, the order rotating per cycle so drift hits
   all alike. Median and p95 per transaction, the added µs (difference of
   medians against the INSERT alone) and the median of the same cycle's
   differences. Then, in a separate pass with ``track_functions = all``, the
   server time inside each SQL function per call.

The cluster runs with fsync and synchronous_commit off (common.Cluster's
defaults: CPU-bound, as the other job figures); --durable turns them on.
Writes bench/results/enqueue_tx.json.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from common import (APP_LOGIN, RESULTS, Cluster, CpuMeter, loadavg, log, machine_info, median, pct,
                    write_json)
from switchboard import api

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$YmVuY2hzYWx0$YmVuY2hoYXNoYmVuY2hoYXNo"
APP_DDL = f"""
CREATE TABLE orders (
    id          bigserial PRIMARY KEY,
    customer    text NOT NULL,
    total_cents bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_lines (
    id         bigserial PRIMARY KEY,
    order_id   bigint NOT NULL,
    sku        text NOT NULL,
    qty        integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- after procrastinate's schema: its tables too (its defer runs as the caller, triggers included)
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP_LOGIN};
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {APP_LOGIN};
"""
INS_ORDER = "INSERT INTO orders (customer, total_cents) VALUES (%s, %s) RETURNING id"
INS_LINE = "INSERT INTO order_lines (order_id, sku, qty) VALUES (%s, %s, %s)"
CHANNELS = ("switchboard_runs", "switchboard_events", '"procrastinate_queue_v1#default"',
            "procrastinate_any_queue_v1")

# each pair compared below runs side by side (the order rotates, the neighbours stay)
JOB_VARIANTS = ["sb", "procr", "procr_conn", "sb_order", "procr_order", "order"]
# (ours, baseline) pairs whose jobs/s ratio is reported
PAIRS = [("sb", "procr"), ("sb", "procr_conn"), ("sb_order", "procr_order")]
TX_VARIANTS = ["insert", "enqueue", "notify", "both", "second_insert", "select_1", "procr_defer"]


def _procrastinate(url: str, pool: bool) -> tuple[Any, Any]:
    """procrastinate's app and its `noop` task, the same job as bench/procrastinate_app.py's (with an
    argument). pool=True opens its PsycopgConnector's sync pool: 1 connection, as one client needs."""
    import procrastinate

    # it warns that the app lives in __main__ (a worker could not import it); none runs here
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=1))

    @app.task(name="noop")
    def noop(i: int = 0) -> None:
        return None

    if pool:
        app.open()
    return app, noop


# -- part 1: the client processes ------------------------------------------------------------
def _run_jobs(variant: str, conn: psycopg.Connection[Any], task: Any, start: int, count: int) -> None:
    rng = range(start, start + count)
    if variant == "sb":
        for i in rng:
            with conn.transaction():
                api.enqueue(conn, "noop", {"i": i})
    elif variant == "procr":
        for i in rng:
            task.defer(i=i)
    elif variant == "procr_conn":
        for i in rng:
            with conn.transaction():
                task.configure(connection=conn).defer(i=i)
    elif variant == "order":
        for i in rng:
            with conn.transaction():
                conn.execute(INS_ORDER, (f"c{i}", i))
    elif variant == "sb_order":
        for i in rng:
            with conn.transaction():
                conn.execute(INS_ORDER, (f"c{i}", i))
                api.enqueue(conn, "noop", {"i": i})
    elif variant == "procr_order":
        for i in rng:
            with conn.transaction():
                conn.execute(INS_ORDER, (f"c{i}", i))
                task.configure(connection=conn).defer(i=i)
    else:
        raise ValueError(variant)


def client(url: str, pipe: Any, barrier: Any) -> None:
    """One client process: one connection of its own (autocommit, so it never sits idle in a
    transaction between runs) and procrastinate's pool; runs what the parent sends."""
    conn = psycopg.connect(url, autocommit=True)
    app, task = _procrastinate(url, pool=True)
    pipe.send("ready")
    try:
        while True:
            msg = pipe.recv()
            if msg is None:
                break
            variant, start, count = msg
            try:
                # a few untimed transactions first: psycopg prepares a statement on its 5th use
                _run_jobs(variant, conn, task, 10_000_000 + start, 8)
            except Exception as exc:
                barrier.abort()  # the parent stops waiting for this run
                pipe.send((0.0, 0.0, f"{type(exc).__name__}: {exc}"))
                continue
            try:
                barrier.wait()
                t0 = time.monotonic()
                _run_jobs(variant, conn, task, start, count)
                pipe.send((t0, time.monotonic(), None))
            except Exception as exc:  # reported to the parent, which stops the run
                pipe.send((0.0, 0.0, f"{type(exc).__name__}: {exc}"))
    finally:
        app.close()
        conn.close()


class Clients:
    def __init__(self, url: str, n: int) -> None:
        ctx = mp.get_context("spawn")  # no libpq state or sockets inherited from this process
        self.barrier = ctx.Barrier(n + 1)
        self.pipes, self.procs = [], []
        for _ in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=client, args=(url, b, self.barrier), daemon=True)
            p.start()
            self.pipes.append(a)
            self.procs.append(p)
        for a in self.pipes:
            if not a.poll(60) or a.recv() != "ready":
                raise RuntimeError("a client process did not start")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def run(self, variant: str, jobs: int) -> tuple[float, str | None]:
        n = len(self.pipes)
        share = [jobs // n + (1 if k < jobs % n else 0) for k in range(n)]
        start = 0
        for a, c in zip(self.pipes, share):
            a.send((variant, start, c))
            start += c
        try:
            self.barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            pass  # a client failed before the start: its error is in the replies
        res = [a.recv() for a in self.pipes]
        err = next((e for _, _, e in res if e), None)
        return max(t1 for _, t1, _ in res) - min(t0 for t0, _, _ in res), err

    def stop(self) -> None:
        for a in self.pipes:
            try:
                a.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=20)
            if p.is_alive():
                p.terminate()


def _reset(admin: psycopg.Connection[Any]) -> None:
    admin.execute("TRUNCATE switchboard.task_runs_hot, switchboard.task_runs_history")
    admin.execute("TRUNCATE procrastinate_jobs CASCADE")
    admin.execute("TRUNCATE orders, order_lines")
    admin.execute("VACUUM ANALYZE switchboard.task_runs_hot, switchboard.task_runs_history, procrastinate_jobs, orders")


def _counts(admin: psycopg.Connection[Any]) -> dict[str, int]:
    row = admin.execute("SELECT (SELECT count(*) FROM switchboard.task_runs),"
                        "       (SELECT count(*) FROM procrastinate_jobs),"
                        "       (SELECT count(*) FROM orders)").fetchone()
    assert row is not None
    return {"task_runs": row[0], "procrastinate_jobs": row[1], "orders": row[2]}


def _expected(variant: str, jobs: int, clients: int) -> dict[str, int]:
    """Rows a run must leave: one per job in each table the variant writes, plus each client's
    8 untimed warm-up transactions."""
    rows = jobs + 8 * clients
    return {"task_runs": rows if variant.startswith("sb") else 0,
            "procrastinate_jobs": rows if variant.startswith("procr") else 0,
            "orders": rows if variant.endswith("order") else 0}


def _drain(listener: psycopg.Connection[Any]) -> int:
    """Read every notification queued for the listener; how many there were."""
    total = 0
    while True:
        got = sum(1 for _ in listener.notifies(timeout=0.2))
        total += got
        if not got:
            return total


def part1(cluster: Cluster, db: str, admin: psycopg.Connection[Any], listener: psycopg.Connection[Any],
          clients: list[int], jobs: int, rounds: int) -> dict[str, Any]:
    url = cluster.url(db, APP_LOGIN)
    out: dict[str, Any] = {}
    for n in clients:
        log(f"part 1: {n} client process(es), {jobs:,} jobs per run, {rounds} round(s), order rotating")
        cl = Clients(url, n)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in JOB_VARIANTS}
        try:
            for v in JOB_VARIANTS:  # untimed: every path once in fresh processes and backends
                _reset(admin)
                _, err = cl.run(v, min(200, max(50, jobs // 10)))
                if err:
                    raise RuntimeError(f"{v} with {n} client(s): {err}")
            for r in range(rounds):
                k = r % len(JOB_VARIANTS)
                for v in JOB_VARIANTS[k:] + JOB_VARIANTS[:k]:
                    _reset(admin)
                    _drain(listener)
                    load = loadavg()
                    meter = CpuMeter(cluster, cl.pids)
                    secs, err = cl.run(v, jobs)
                    cpu = meter.stop()
                    if err:
                        raise RuntimeError(f"{v} with {n} client(s): {err}")
                    got = _counts(admin)
                    want = _expected(v, jobs, n)
                    notes = _drain(listener)
                    res = {"round": r + 1, "seconds": round(secs, 3), "jobs_per_s": round(jobs / secs, 1),
                           "client_cpu_us_per_job": round(cpu["workers_cpu_s"] / jobs * 1e6, 1),
                           "postgres_cpu_us_per_job": round(cpu["postgres_cpu_s"] / jobs * 1e6, 1),
                           "rows_ok": got == want, "rows": got, "notifications_heard": notes,
                           "loadavg_before": load}
                    runs[v].append(res)
                    log(f"  round {r + 1} {v:<12} {res['jobs_per_s']:>8,.0f} jobs/s  CPU/job client "
                        f"{res['client_cpu_us_per_job']:>6.1f} us + postgres {res['postgres_cpu_us_per_job']:>6.1f} us"
                        f"  rows {'ok' if res['rows_ok'] else f'WRONG {got} != {want}'}  (load {load:.1f})")
        finally:
            cl.stop()
        row: dict[str, Any] = {"runs": runs}
        for v, rs in runs.items():
            row[v] = {"jobs_per_s": median([x["jobs_per_s"] for x in rs]),
                      "client_cpu_us_per_job": median([x["client_cpu_us_per_job"] for x in rs]),
                      "postgres_cpu_us_per_job": median([x["postgres_cpu_us_per_job"] for x in rs]),
                      "all_rows_ok": all(x["rows_ok"] for x in rs)}
        for ours, base in PAIRS:
            per = [a["jobs_per_s"] / b["jobs_per_s"] for a, b in zip(runs[ours], runs[base])]
            cpu = [(a["client_cpu_us_per_job"] + a["postgres_cpu_us_per_job"])
                   / (b["client_cpu_us_per_job"] + b["postgres_cpu_us_per_job"])
                   for a, b in zip(runs[ours], runs[base])]
            row[f"{ours}/{base}"] = {"per_round": [round(x, 2) for x in per], "median": round(median(per), 2),
                                     "cpu_per_job_median": round(median(cpu), 2)}
        out[str(n)] = row
    return out


# -- part 2: the web request's transaction ---------------------------------------------------
def _tx(variant: str, conn: psycopg.Connection[Any], uid: str, task: Any, i: int) -> None:
    with conn.transaction():
        cur = conn.execute(INS_ORDER, (f"c{i}", i))
        row = cur.fetchone()
        assert row is not None
        oid = row[0]
        if variant in ("enqueue", "both"):
            api.enqueue(conn, "noop", {"order": oid})
        if variant in ("notify", "both"):
            api.notify_user(conn, uid, "order.saved", {"order": oid})
        if variant == "second_insert":
            conn.execute(INS_LINE, (oid, "sku-1", 1))
        if variant == "select_1":
            conn.execute("SELECT 1")
        if variant == "procr_defer":
            task.configure(connection=conn).defer(i=oid)


def part2(cluster: Cluster, db: str, admin: psycopg.Connection[Any], listener: psycopg.Connection[Any],
          uid: str, iterations: int) -> dict[str, Any]:
    log(f"part 2: one connection, {iterations:,} cycles of {len(TX_VARIANTS)} transactions, order rotating")
    _reset(admin)
    _, task = _procrastinate(cluster.url(db, APP_LOGIN), pool=False)
    samples: dict[str, list[float]] = {v: [] for v in TX_VARIANTS}
    load = loadavg()
    with psycopg.connect(cluster.url(db, APP_LOGIN), autocommit=True) as conn:
        for i in range(50):  # untimed: statements prepared, caches warm
            for v in TX_VARIANTS:
                _tx(v, conn, uid, task, i)
        for i in range(iterations):
            k = i % len(TX_VARIANTS)
            for v in TX_VARIANTS[k:] + TX_VARIANTS[:k]:
                t0 = time.perf_counter_ns()
                _tx(v, conn, uid, task, i)
                samples[v].append((time.perf_counter_ns() - t0) / 1000)
            if i % 500 == 499:
                _drain(listener)
    _drain(listener)
    base = median(samples["insert"])
    out: dict[str, Any] = {"iterations": iterations, "loadavg_before": load, "loadavg_after": loadavg()}
    for v, s in samples.items():
        m = median(s)
        # also the median of the same cycle's differences: steadier when the box's load moves
        paired = median([x - b for x, b in zip(s, samples["insert"])])
        out[v] = {"median_us": round(m, 1), "p95_us": round(pct(s, 95), 1), "added_us": round(m - base, 1),
                  "added_paired_us": round(paired, 1)}
    return out


def server_time(cluster: Cluster, db: str, admin: psycopg.Connection[Any], uid: str,
                n: int) -> dict[str, Any]:
    """Server time inside each function per call (track_functions, on only for this: it costs
    time itself), from `n` transactions each of enqueue, notify_user and procrastinate's defer."""
    log(f"part 2b: time inside the functions, {n:,} calls each (track_functions = all)")
    admin.execute(f"ALTER DATABASE \"{db}\" SET track_functions = 'all'")
    _, task = _procrastinate(cluster.url(db, APP_LOGIN), pool=False)
    try:
        # a backend flushes its counters at most once a second and as it exits: the warm-up runs on a
        # connection of its own, closed before the reset, and the counted calls on the next one
        for warm, count in ((True, 20), (False, n)):
            with psycopg.connect(cluster.url(db, APP_LOGIN), autocommit=True) as conn:
                for i in range(count):
                    for v in ("enqueue", "notify", "procr_defer"):
                        _tx(v, conn, uid, task, i)
            time.sleep(1.0)
            if warm:
                admin.execute("SELECT pg_stat_reset()")
        admin.execute("SELECT pg_stat_clear_snapshot()")
        rows = admin.execute("SELECT schemaname || '.' || funcname, calls, total_time, self_time"
                             "  FROM pg_stat_user_functions WHERE calls > 0 ORDER BY total_time DESC").fetchall()
    finally:
        admin.execute(f"ALTER DATABASE \"{db}\" RESET track_functions")
    return {name: {"calls": calls, "total_us_per_call": round(total / calls * 1000, 1),
                   "self_us_per_call": round(own / calls * 1000, 1)} for name, calls, total, own in rows}


def report(res: dict[str, Any]) -> None:
    print()
    print("Part 1: jobs/s enqueued from application code (median over rounds); ratios are per round, median")
    for n, row in res["part1"].items():
        print(f"  {n} client process(es):")
        for v in JOB_VARIANTS:
            x = row[v]
            print(f"    {v:<12} {x['jobs_per_s']:>8,.0f} jobs/s  CPU/job client {x['client_cpu_us_per_job']:>6.1f} us"
                  f" + postgres {x['postgres_cpu_us_per_job']:>6.1f} us  rows ok: {x['all_rows_ok']}")
        for ours, base in PAIRS:
            r = row[f"{ours}/{base}"]
            print(f"    {ours} / {base:<12} jobs/s {r['median']:.2f}x (rounds {r['per_round']}), "
                  f"CPU per job {r['cpu_per_job_median']:.2f}x")
    p2 = res["part2"]
    print(f"\nPart 2: one web request's transaction, {p2['iterations']:,} interleaved cycles (us; load "
          f"{p2['loadavg_before']:.1f} -> {p2['loadavg_after']:.1f})")
    print(f"    {'variant':<14} {'median':>8} {'p95':>8} {'added (median - insert)':>24} {'same-cycle added':>17}")
    for v in TX_VARIANTS:
        x = p2[v]
        print(f"    {v:<14} {x['median_us']:>8.1f} {x['p95_us']:>8.1f} {x['added_us']:>+24.1f}"
              f" {x['added_paired_us']:>+17.1f}")
    print("\nPart 2b: server time inside each function per call (us; track_functions, a separate pass)")
    for name, x in res.get("server_time", {}).items():
        print(f"    {name:<60} total {x['total_us_per_call']:>7.1f}  self {x['self_us_per_call']:>7.1f}"
              f"  ({x['calls']:,} calls)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000, help="jobs per run (part 1)")
    ap.add_argument("--clients", default="1,4", help="client process counts (part 1)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per client count (part 1)")
    ap.add_argument("--iterations", type=int, default=3000, help="cycles of all variants (part 2)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 200 jobs, 1 round, 100 cycles")
    ap.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on")
    a = ap.parse_args()
    if a.quick:
        a.jobs, a.rounds, a.iterations = 200, 1, 100
    clients = [int(x) for x in a.clients.split(",") if x]
    t_start = time.time()
    on = "on" if a.durable else "off"
    cluster = Cluster({"fsync": on, "synchronous_commit": on, "full_page_writes": on})
    res: dict[str, Any] = {"command": "python " + " ".join(["bench/enqueue_tx.py", *sys.argv[1:]]),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "durable": a.durable,
                           "jobs": a.jobs, "rounds": a.rounds, "clients": clients}
    try:
        res["machine"] = machine_info(cluster)
        db = cluster.new_db("enqueue_tx")
        admin = psycopg.connect(cluster.url(db), autocommit=True)
        app, _ = _procrastinate(cluster.url(db), pool=True)
        try:
            app.schema_manager.apply_schema()
        finally:
            app.close()
        admin.execute(APP_DDL)
        row = admin.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()
        assert row is not None
        uid = str(row[0])
        listener = psycopg.connect(cluster.url(db), autocommit=True)
        for ch in CHANNELS:
            listener.execute(f"LISTEN {ch}")
        try:
            res["part1"] = part1(cluster, db, admin, listener, clients, a.jobs, a.rounds)
            res["part2"] = part2(cluster, db, admin, listener, uid, a.iterations)
            res["server_time"] = server_time(cluster, db, admin, uid, min(a.iterations, 1000))
        finally:
            listener.close()
            admin.close()
    finally:
        cluster.stop()
    res["wall_seconds"] = round(time.time() - t_start, 1)
    report(res)
    out = RESULTS / "enqueue_tx.json"
    write_json(out, res)
    log(f"{res['wall_seconds']:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
