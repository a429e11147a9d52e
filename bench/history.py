#!/usr/bin/env python3
"""Issue 35's baseline: today's task_runs (history in the hot table) as history grows.

    python bench/history.py [--sizes 0,1000000,5000000] [--seconds 8] [--rounds 2]
                            [--drain 50000] [--workers 2] [--no-retention]
    python bench/history.py --sizes 0,10000000,50000000   # the issue's full curve (hours, ~40 GB)

One throwaway PostgreSQL (the suite's settings: fsync off, 256 MB shared
buffers, autovacuum on) migrated with the real migrations. For each history
size H, in increasing order, switchboard.task_runs is topped up to H finished
runs (one INSERT ... SELECT generate_series: 95 % succeeded, 5 % failed, six
handler names, finished_at spread over 30 days ending a day ago), then
VACUUM ANALYZE, then measured beside a baseline that has no history: bench_hot,
a table created LIKE task_runs INCLUDING ALL (same columns, indexes,
constraints and storage settings), emptied before each size.

- claim + finish: pgbench, 4 clients, each transaction enqueue + claim 1 +
  finish (three autocommit statements: switchboard.enqueue,
  claim_due_tasks(w, lease, 1), finish_runs) against the same three statements
  as plain SQL on bench_hot. Transactions/s and PostgreSQL CPU per job (utime +
  stime of the cluster's processes, /proc), rounds alternating A B B A.
- drain: N queued noop jobs drained by W worker connections calling
  claim_due_tasks(w, lease, 50) + finish_runs (as bench/scale.py's drain),
  against the same batched UPDATE ... SKIP LOCKED on bench_hot.
- sizes: pg_relation_size and pg_indexes_size of task_runs (and per index) at
  each H, after its measurements.
- retention (largest H, autovacuum off on task_runs): reap_runs(keep, 10000)
  until it returns < 10000: seconds, WAL bytes (pg_current_wal_lsn diff), dead
  tuples left (pg_stat_user_tables), then the VACUUM it obliges (seconds, WAL);
  against DROP TABLE of a copy of the same H rows with the same indexes (what
  dropping a partition costs), measured the same way.

Each size's figure is reported as Switchboard ÷ baseline at that size, and
that ratio at H ÷ the same ratio at H = 0 ("vs H=0"): the box's other load hits
both sides alike, so this is the figure to hold to "flat within 10 %".
Raw results: bench/results/history.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, Cluster, child_pids, cpu_seconds, loadavg, log, machine_info, write_json
from scale import DB, wait_quiet

import psycopg

REAP_BATCH = 10_000
KEEP = "12 hours"  # history ends a day ago; the runs the measurements finish are kept
HANDLERS = "ARRAY['email.send', 'webhook.deliver', 'report.build', 'image.resize', 'billing.charge', 'search.index']"

SB_TX = """SELECT switchboard.enqueue('bench.noop');
SELECT coalesce(max(id), 0) AS rid FROM switchboard.claim_due_tasks('w' || :client_id, '60 seconds', 1) \\gset
SELECT count(*) FROM switchboard.finish_runs('w' || :client_id, ARRAY[:rid]::bigint[]);
"""
PLAIN_CLAIM = """UPDATE bench_hot r SET status = 'running', worker = {w}, lease_expires_at = now() + interval '60 seconds',
       started_at = now()
 WHERE r.id = ANY (ARRAY(SELECT q.id FROM bench_hot q
                          WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= now()
                          ORDER BY q.priority DESC, q.run_at, q.id LIMIT {n} FOR UPDATE OF q SKIP LOCKED))
RETURNING r.id"""
PLAIN_FINISH = """UPDATE bench_hot SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
 WHERE id = ANY ({ids}) AND worker = {w} AND status = 'running'"""
PLAIN_TX = ("INSERT INTO bench_hot (handler, trigger) VALUES ('bench.noop', 'enqueue');\n"
            "WITH c AS (" + PLAIN_CLAIM.format(w="'w' || :client_id", n=1) + ")\n"
            "SELECT coalesce(max(id), 0) AS rid FROM c \\gset\n"
            + PLAIN_FINISH.format(ids="ARRAY[:rid]::bigint[]", w="'w' || :client_id") + ";\n")


def setup_hot(db: DB) -> None:
    """bench_hot: task_runs' shape, indexes and storage settings, never any history."""
    db.execute("CREATE TABLE bench_hot (LIKE switchboard.task_runs INCLUDING ALL)")
    opts = db.execute("SELECT array_to_string(reloptions, ', ') FROM pg_class "
                      "WHERE oid = 'switchboard.task_runs'::regclass")[0][0]
    if opts:
        db.execute(f"ALTER TABLE bench_hot SET ({opts})")


def fill_history(db: DB, have: int, want: int, top: int) -> dict[str, Any]:
    """Top task_runs up from `have` to `want` finished runs; finished_at runs from 31 to 1 days ago over `top`."""
    lsn = db.execute("SELECT pg_current_wal_lsn()")[0][0]
    t = time.perf_counter()
    db.execute(f"""
        INSERT INTO switchboard.task_runs (handler, args, status, trigger, attempt, max_attempts, run_at, worker,
                                           started_at, finished_at, result, error, created_at)
        SELECT ({HANDLERS})[1 + mod(i, 6)], jsonb_build_object('id', i, 'tenant', mod(i, 977)),
               CASE WHEN mod(i, 20) = 0 THEN 'failed' ELSE 'succeeded' END, 'enqueue', 1 + (mod(i, 20) = 0)::int, 3,
               f - interval '2 seconds', 'host-' || mod(i, 4) || ':' || (1000 + mod(i, 7)) || ':a1b2c3',
               f - (mod(i, 900)) * interval '1 millisecond', f,
               CASE WHEN mod(i, 20) = 0 THEN NULL ELSE jsonb_build_object('ok', true) END,
               CASE WHEN mod(i, 20) = 0 THEN 'TimeoutError: upstream did not answer in 30 s' END,
               f - interval '2 seconds'
          FROM generate_series(%s::bigint, %s::bigint) AS i,
               LATERAL (SELECT now() - interval '31 days' + (i::float8 / %s) * interval '30 days' AS f) AS x""",
               (have + 1, want, max(top, 1)))
    ins = time.perf_counter() - t
    db.execute("VACUUM ANALYZE switchboard.task_runs")
    return {"rows": want - have, "insert_s": round(ins, 1), "with_vacuum_s": round(time.perf_counter() - t, 1),
            "wal_bytes": int(db.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,))[0][0])}


def sizes(db: DB, table: str) -> dict[str, Any]:
    rel = db.execute("SELECT pg_relation_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s)",
                     (table, table, table))[0]
    idx = db.execute("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                     "WHERE indrelid = %s::regclass ORDER BY 1", (table,))
    return {"table_bytes": rel[0], "indexes_bytes": rel[1], "total_bytes": rel[2],
            "per_index_bytes": {n.split(".")[-1]: b for n, b in idx}}


class PgCpu:
    """CPU seconds of the cluster's processes (backends, autovacuum, WAL writer ...) over an interval.

    common.CpuMeter reads once at each end and so misses backends that exit in
    between (pgbench's, the drain workers'). This polls every 50 ms and keeps
    each process's last reading, so an exited backend counts all but its last
    50 ms.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.pid = cluster.pg.pid
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._poll(self.base)
        self.last.update(self.base)
        self.done = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _children(self) -> list[int]:
        try:  # one read where the kernel offers it; scanning /proc costs ~30 ms on this box
            return [int(x) for x in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]
        except OSError:
            return child_pids(self.pid)

    def _poll(self, into: dict[int, float]) -> None:
        for p in [self.pid, *self._children()]:
            t = cpu_seconds(p)
            if t:
                into[p] = t

    def _run(self) -> None:
        while not self.done.wait(0.05):
            self._poll(self.last)

    def stop(self) -> float:
        self.done.set()
        self.th.join()
        self._poll(self.last)
        return sum(t - self.base.get(p, 0.0) for p, t in self.last.items())


# -- claim + finish (pgbench) ----------------------------------------------------------------------
def pgbench(cluster: Cluster, db: str, script: str, clients: int, seconds: int) -> dict[str, Any]:
    from sql import pgbench_binary

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"history_{abs(hash(script))}.sql"
    path.write_text(script)
    cmd = [pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients), "-j", "2", "-T", str(seconds),
           "-f", str(path), "-h", "127.0.0.1", "-p", str(cluster.pg.port), "-U", "postgres", db]
    meter = PgCpu(cluster)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 60)
    cpu = meter.stop()
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", p.stdout)
    n = re.search(r"number of transactions actually processed: (\d+)", p.stdout)
    if p.returncode != 0 or not tps or not n:
        raise RuntimeError(f"pgbench failed: {p.stdout[-800:]} {p.stderr[-800:]}")
    jobs = int(n.group(1))
    return {"tps": float(tps.group(1)), "jobs": jobs, "pg_cpu_us_per_job": round(cpu / max(jobs, 1) * 1e6, 1)}


# -- drain -----------------------------------------------------------------------------------------
def _drain_worker(url: str, mode: str, wid: int, batch: int, q: Any, go: Any) -> None:
    w = f"d{wid}"
    claim = PLAIN_CLAIM.format(w="%(w)s", n="%(n)s")
    finish = PLAIN_FINISH.format(ids="%(ids)s", w="%(w)s")
    done, empty, last = 0, 0, 0.0
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT 1")
        go.wait()
        while empty < 3:  # another worker may hold the last rows for a moment
            if mode == "sb":
                ids = [r[0] for r in c.execute(
                    "SELECT id FROM switchboard.claim_due_tasks(%s, '60 seconds', %s)", (w, batch))]
                if ids:
                    c.execute("SELECT count(*) FROM switchboard.finish_runs(%s, %s)", (w, ids))
            else:
                ids = [r[0] for r in c.execute(claim, {"w": w, "n": batch})]
                if ids:
                    c.execute(finish, {"w": w, "ids": ids})
            if ids:
                done, empty = done + len(ids), 0
                last = time.perf_counter()
            else:
                empty += 1
                time.sleep(0.05)
    q.put((done, last))


def drain(cluster: Cluster, db: DB, mode: str, n: int, workers: int, batch: int = 50) -> dict[str, Any]:
    table = "switchboard.task_runs" if mode == "sb" else "bench_hot"
    db.execute(f"""INSERT INTO {table} (handler, args, status, trigger, max_attempts, run_at)
                   SELECT 'bench.noop', '{{}}', 'queued', 'enqueue', 3, now() - interval '1 minute'
                     FROM generate_series(1, %s)""", (n,))
    db.execute(f"ANALYZE {table}")
    meter = PgCpu(cluster)  # before the workers connect: their backends are counted from birth
    ctx = mp.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=_drain_worker, args=(db.url, mode, i, batch, q, go)) for i in range(workers)]
    for p in ps:
        p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    go.set()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    cpu = meter.stop()
    done = sum(d for d, _ in res)
    secs = max(t for _, t in res) - t0
    left = db.execute(f"SELECT count(*) FROM {table} WHERE status IN ('queued', 'running')")[0][0]
    return {"jobs": n, "done": done, "left": left, "seconds": round(secs, 2),
            "jobs_per_s": round(done / secs, 1) if secs > 0 else None,
            "pg_cpu_us_per_job": round(cpu / max(done, 1) * 1e6, 1)}


# -- retention -------------------------------------------------------------------------------------
def _one(c: psycopg.Connection, q: str, p: Any = None) -> Any:
    row = c.execute(q, p).fetchone()
    assert row is not None
    return row[0]


def _wal(c: psycopg.Connection) -> str:
    return str(_one(c, "SELECT pg_current_wal_lsn()"))


def _wal_since(c: psycopg.Connection, lsn: str) -> int:
    return int(_one(c, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)))


def _dead(db: DB, table: str) -> dict[str, int]:
    r = db.execute("SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass", (table,))
    return {"n_live_tup": r[0][0], "n_dead_tup": r[0][1]} if r else {}


def retention(db: DB, h: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": h, "batch": REAP_BATCH, "keep": KEEP}
    db.execute("ALTER TABLE switchboard.task_runs SET (autovacuum_enabled = false)")
    # The floor: the same rows, the same indexes, in a table of their own, dropped.
    db.execute(f"""CREATE TABLE bench_part AS SELECT * FROM switchboard.task_runs
                    WHERE status IN ('succeeded', 'failed') AND finished_at < now() - interval '{KEEP}'""")
    for (d,) in db.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'switchboard' "
                           "AND tablename = 'task_runs'"):
        db.execute(re.sub(r"INDEX (\S+) ON switchboard\.task_runs", r"INDEX \1_bp ON bench_part", d, count=1))
    db.execute("VACUUM ANALYZE bench_part")
    out["drop_table_sizes"] = sizes(db, "bench_part")
    with psycopg.connect(db.url, autocommit=True) as c:
        lsn, t = _wal(c), time.perf_counter()
        c.execute("DROP TABLE bench_part")
        secs = time.perf_counter() - t
        out["drop"] = {"seconds": round(secs, 4), "wal_bytes": _wal_since(c, lsn), "dead_tuples_left": 0}
    log(f"  retention floor: DROP TABLE of {h:,} rows: {out['drop']}")
    db.execute("VACUUM switchboard.task_runs")  # so that every dead tuple counted after is the reap's
    time.sleep(1.5)
    before = {**sizes(db, "switchboard.task_runs"), **_dead(db, "switchboard.task_runs")}
    with psycopg.connect(db.url, autocommit=True) as c:
        lsn, t, calls, deleted = _wal(c), time.perf_counter(), 0, 0
        while True:
            k = _one(c, "SELECT switchboard.reap_runs(%s::interval, %s)", (KEEP, REAP_BATCH))
            calls, deleted = calls + 1, deleted + k
            if k < REAP_BATCH:
                break
        secs = time.perf_counter() - t
        wal = _wal_since(c, lsn)
    time.sleep(1.5)  # the backend has exited: its statistics are flushed
    out["reap_runs"] = {"deleted": deleted, "calls": calls, "seconds": round(secs, 2), "wal_bytes": wal,
                        **_dead(db, "switchboard.task_runs"), "sizes_before": before,
                        "sizes_after": sizes(db, "switchboard.task_runs")}
    log(f"  reap_runs: {deleted:,} rows in {secs:.1f} s ({calls} calls), WAL {wal / 2**20:.0f} MiB, "
        f"dead tuples left {out['reap_runs'].get('n_dead_tup')}")
    with psycopg.connect(db.url, autocommit=True) as c:
        lsn, t = _wal(c), time.perf_counter()
        c.execute("VACUUM switchboard.task_runs")
        secs = time.perf_counter() - t
        wal = _wal_since(c, lsn)
    out["vacuum_after_reap"] = {"seconds": round(secs, 2), "wal_bytes": wal,
                                "sizes_after": sizes(db, "switchboard.task_runs")}
    log(f"  VACUUM after the reap: {secs:.1f} s, WAL {wal / 2**20:.0f} MiB")
    db.execute("ALTER TABLE switchboard.task_runs RESET (autovacuum_enabled)")
    r, v, d = out["reap_runs"], out["vacuum_after_reap"], out["drop"]
    out["reap_plus_vacuum_over_drop"] = {
        "seconds": round((r["seconds"] + v["seconds"]) / max(d["seconds"], 1e-4), 1),
        "wal_bytes": round((r["wal_bytes"] + v["wal_bytes"]) / max(d["wal_bytes"], 1), 1)}
    return out


# -- one size --------------------------------------------------------------------------------------
def _med(xs: list[dict[str, Any]], k: str) -> float:
    return round(float(statistics.median(x[k] for x in xs)), 1)


def measure(cluster: Cluster, db: DB, a: argparse.Namespace) -> dict[str, Any]:
    db.execute("TRUNCATE bench_hot")
    # Warm-up, not counted: a first pgbench on a never-analyzed bench_hot ran on plans made
    # for an empty table (half the rate of the next run); both sides get one short run, then ANALYZE.
    for script in (SB_TX, PLAIN_TX):
        pgbench(cluster, db.name, script, a.clients, 2)
    db.execute("ANALYZE switchboard.task_runs")
    db.execute("ANALYZE bench_hot")
    pt: dict[str, Any] = {"loadavg_before": wait_quiet()}
    runs: dict[str, list[dict[str, Any]]] = {"sb": [], "plain": []}
    order = (["sb", "plain", "plain", "sb"] * a.rounds)[: 2 * a.rounds]
    for mode in order:
        r = pgbench(cluster, db.name, SB_TX if mode == "sb" else PLAIN_TX, a.clients, a.seconds)
        runs[mode].append(r)
        log(f"  claim+finish {mode:<5} {r['tps']:8.0f} tx/s  {r['pg_cpu_us_per_job']:7.1f} µs PG CPU/job")
    pt["claim_finish"] = {m: {"runs": v, "tps": _med(v, "tps"), "pg_cpu_us_per_job": _med(v, "pg_cpu_us_per_job")}
                          for m, v in runs.items()}
    druns: dict[str, list[dict[str, Any]]] = {"sb": [], "plain": []}
    for mode in order:
        r = drain(cluster, db, mode, a.drain, a.workers)
        druns[mode].append(r)
        log(f"  drain {a.drain:,} {mode:<5} {r['jobs_per_s']} jobs/s  {r['pg_cpu_us_per_job']} µs PG CPU/job"
            f"  (left {r['left']})")
    pt["drain"] = {m: {"runs": v, "jobs_per_s": _med(v, "jobs_per_s"),
                       "pg_cpu_us_per_job": _med(v, "pg_cpu_us_per_job")} for m, v in druns.items()}
    pt["sizes_after"] = {"task_runs": sizes(db, "switchboard.task_runs"), "bench_hot": sizes(db, "bench_hot")}
    pt["loadavg_after"] = loadavg()
    return pt


def ratios(points: list[dict[str, Any]]) -> None:
    """Switchboard ÷ baseline at each size, and that ratio ÷ the same at H = 0."""
    base: dict[str, float] = {}
    for pt in points:
        r: dict[str, float] = {}
        for fig, key in (("claim_finish", "tps"), ("claim_finish", "pg_cpu_us_per_job"),
                         ("drain", "jobs_per_s"), ("drain", "pg_cpu_us_per_job")):
            sb, plain = pt[fig]["sb"][key], pt[fig]["plain"][key]
            name = f"{fig}.{key}"
            r[name + ".sb_over_plain"] = round(sb / plain, 3)
            base.setdefault(name, sb / plain)
            r[name + ".vs_h0"] = round(sb / plain / base[name], 3)
            base.setdefault(name + ".raw", sb)
            r[name + ".raw_vs_h0"] = round(sb / base[name + ".raw"], 3)
        pt["ratios"] = r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0,1000000,5000000", help="history sizes, increasing")
    ap.add_argument("--seconds", type=int, default=8, help="per pgbench run")
    ap.add_argument("--rounds", type=int, default=2, help="pgbench runs and drains per side and size")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--drain", type=int, default=50_000, help="queued jobs per drain")
    ap.add_argument("--workers", type=int, default=2, help="drain worker connections")
    ap.add_argument("--no-retention", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the throwaway cluster on the way out
    hs = sorted(int(x) for x in a.sizes.split(","))
    out_path = RESULTS / "history.json"
    t0 = time.time()
    res: dict[str, Any] = {"command": "python " + " ".join(["bench/history.py", *sys.argv[1:]]),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "sizes": hs,
                           "settings": vars(a), "loadavg": {"start": loadavg()}, "points": []}
    cluster = Cluster()
    try:
        res["machine"] = machine_info(cluster)
        db = DB(cluster, "hist")
        setup_hot(db)
        have = 0
        for h in hs:
            log(f"history {h:,}")
            fill = fill_history(db, have, h, hs[-1]) if h > have else {"rows": 0}
            have = max(have, h)
            if fill["rows"]:
                log(f"  filled {fill['rows']:,} runs in {fill['with_vacuum_s']} s (with VACUUM ANALYZE), "
                    f"WAL {fill['wal_bytes'] / 2**20:.0f} MiB")
            # The runs earlier sizes' measurements finished are kept: steady-state history.
            pt = {"history": h, "fill": fill, "sizes_before": sizes(db, "switchboard.task_runs")}
            pt.update(measure(cluster, db, a))
            res["points"].append(pt)
            ratios(res["points"])
            write_json(out_path, res)
        if not a.no_retention and hs[-1] > 0:
            log(f"retention of {hs[-1]:,} runs")
            res["retention"] = retention(db, hs[-1])
    finally:
        cluster.stop()
    res["loadavg"]["end"] = loadavg()
    res["wall_seconds"] = round(time.time() - t0, 1)
    write_json(out_path, res)
    for pt in res["points"]:
        r = pt["ratios"]
        log(f"H={pt['history']:>11,}: claim+finish tx/s {r['claim_finish.tps.vs_h0']}x, "
            f"CPU/job {r['claim_finish.pg_cpu_us_per_job.vs_h0']}x; drain jobs/s {r['drain.jobs_per_s.vs_h0']}x, "
            f"CPU/job {r['drain.pg_cpu_us_per_job.vs_h0']}x (vs H=0, each over its no-history baseline); "
            f"task_runs {pt['sizes_after']['task_runs']['table_bytes'] / 2**20:.0f} MiB + "
            f"{pt['sizes_after']['task_runs']['indexes_bytes'] / 2**20:.0f} MiB indexes")
    log(f"wall {res['wall_seconds']} s -> {out_path}")


if __name__ == "__main__":
    main()
