#!/usr/bin/env python3
"""Issue 35: run history apart from the hot table (V0036) against today's layout, as history grows.

    python bench/history.py [--sizes 0,1000000,5000000] [--seconds 8] [--rounds 2]
                            [--drain 50000] [--workers 2] [--no-retention]
    python bench/history.py --sizes 0,10000000,50000000   # the issue's full curve (hours, ~40 GB)

One throwaway PostgreSQL (the suite's settings: fsync off, 256 MB shared
buffers, autovacuum on) migrated with the real migrations. Three sides, same run:

- sb: Switchboard as it is now (V0036): H finished runs in
  switchboard.task_runs_history, one partition per day (the bench creates the
  31 past days' partitions), queued/running runs in task_runs_hot; the real
  functions (enqueue, claim_due_tasks, finish_runs: a finish moves the run).
- old: today's layout before V0036, emulated: bench_old, a table created LIKE
  task_runs_hot INCLUDING ALL (the columns, every index of the old task_runs,
  its storage settings) holding the same H finished runs, driven by the same
  claim/finish statements as plain SQL (a finish is an UPDATE in place).
- plain: bench_hot, the same table with no history at all, the same plain SQL.

For each history size H, in increasing order, both histories are topped up to H
finished runs (one INSERT ... SELECT generate_series each: 95 % succeeded, 5 %
failed, six handler names, finished_at spread over 30 days ending a day ago),
then VACUUM ANALYZE. bench_hot is emptied before each size.

- claim + finish: pgbench, 4 clients, each transaction enqueue + claim 1 +
  finish (three autocommit statements: switchboard.enqueue,
  claim_due_tasks(w, lease, 1), finish_runs) against the same three statements
  as plain SQL on bench_old and bench_hot. Transactions/s and PostgreSQL CPU per
  job (utime + stime of the cluster's processes, /proc), rounds rotating the sides.
- drain: N queued noop jobs drained by W worker connections calling
  claim_due_tasks(w, lease, 50) + finish_runs (as bench/scale.py's drain),
  against the same batched UPDATE ... SKIP LOCKED on bench_old and bench_hot.
- sizes: pg_relation_size and pg_indexes_size of task_runs_hot, of the
  history and of bench_old at each H, after its measurements.
- retention (largest H, autovacuum off): sb: reap_runs(keep, 10000), which
  detaches and drops every day partition older than keep; old: the batched
  DELETE reap_runs did before V0036 (10,000 rows a statement, ctid, SKIP LOCKED)
  on bench_old until it deletes < 10000, then the VACUUM it obliges.

Each size's figure is reported as side ÷ plain at that size, and that ratio at
H ÷ the same ratio at H = 0 ("vs H=0"), for sb and for old: the box's other load
hits every side alike, so this is the figure to hold to "flat within 10 %".
Retention (largest H): reap_runs dropping the day partitions of H runs (sb)
against the batched DELETE of the same H rows from bench_old plus the VACUUM it
obliges (old): seconds, WAL bytes, dead tuples left.
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
KEEP = "1 second"  # every filled day (ending a day ago) is older; today's partition (the runs the
                   # measurements finished) is not: its range ends tomorrow
OLD_KEEP = "12 hours"  # bench_old: the filled history (ending a day ago), not the measurements' runs
HANDLERS = "ARRAY['email.send', 'webhook.deliver', 'report.build', 'image.resize', 'billing.charge', 'search.index']"

SB_TX = """SELECT switchboard.enqueue('bench.noop');
SELECT coalesce(max(id), 0) AS rid FROM switchboard.claim_due_tasks('w' || :client_id, '60 seconds', 1) \\gset
SELECT count(*) FROM switchboard.finish_runs('w' || :client_id, ARRAY[:rid]::bigint[]);
"""
PLAIN_CLAIM = """UPDATE {t} r SET status = 'running', worker = {w}, lease_expires_at = now() + interval '60 seconds',
       started_at = now()
 WHERE r.id = ANY (ARRAY(SELECT q.id FROM {t} q
                          WHERE q.status = 'queued' AND q.queue = 'default' AND q.run_at <= now()
                          ORDER BY q.priority DESC, q.run_at, q.id LIMIT {n} FOR UPDATE OF q SKIP LOCKED))
RETURNING r.id"""
PLAIN_FINISH = """UPDATE {t} SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
 WHERE id = ANY ({ids}) AND worker = {w} AND status = 'running'"""


def plain_tx(t: str) -> str:
    return (f"INSERT INTO {t} (handler, trigger) VALUES ('bench.noop', 'enqueue');\n"
            "WITH c AS (" + PLAIN_CLAIM.format(t=t, w="'w' || :client_id", n=1) + ")\n"
            "SELECT coalesce(max(id), 0) AS rid FROM c \\gset\n"
            + PLAIN_FINISH.format(t=t, ids="ARRAY[:rid]::bigint[]", w="'w' || :client_id") + ";\n")


TABLES = {"sb": "switchboard.task_runs_hot", "old": "bench_old", "plain": "bench_hot"}
SCRIPTS = {"sb": SB_TX, "old": plain_tx("bench_old"), "plain": plain_tx("bench_hot")}


def setup_hot(db: DB) -> None:
    """bench_hot and bench_old: the hot table's shape, every index of the old task_runs
    (task_runs_hot keeps them all), its storage settings. Past days' partitions of
    the history: the bench fills 30 days ending a day ago."""
    opts = db.execute("SELECT array_to_string(reloptions, ', ') FROM pg_class "
                      "WHERE oid = 'switchboard.task_runs_hot'::regclass")[0][0]
    for t in ("bench_hot", "bench_old"):
        db.execute(f"CREATE TABLE {t} (LIKE switchboard.task_runs_hot INCLUDING ALL)")
        if opts:
            db.execute(f"ALTER TABLE {t} SET ({opts})")
    db.execute("DROP TABLE switchboard.task_runs_history_before")
    db.execute("""DO $$
        DECLARE d date;
        BEGIN
            FOR i IN 1..32 LOOP
                d := (now() AT TIME ZONE 'UTC')::date - i;
                EXECUTE format('CREATE TABLE switchboard.%I PARTITION OF switchboard.task_runs_history'
                               ' FOR VALUES FROM (%L) TO (%L)', 'task_runs_history_p' || to_char(d, 'YYYYMMDD'),
                               d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
            END LOOP;
        END $$""")


FILL_SELECT = f"""
        SELECT 1000000000000 + i, ({HANDLERS})[1 + mod(i, 6)], jsonb_build_object('id', i, 'tenant', mod(i, 977)),
               CASE WHEN mod(i, 20) = 0 THEN 'failed' ELSE 'succeeded' END, 'enqueue', 1 + (mod(i, 20) = 0)::int, 3,
               f - interval '2 seconds', 'host-' || mod(i, 4) || ':' || (1000 + mod(i, 7)) || ':a1b2c3',
               f - (mod(i, 900)) * interval '1 millisecond', f,
               CASE WHEN mod(i, 20) = 0 THEN NULL ELSE jsonb_build_object('ok', true) END,
               CASE WHEN mod(i, 20) = 0 THEN 'TimeoutError: upstream did not answer in 30 s' END,
               f - interval '2 seconds'
          FROM generate_series(%s::bigint, %s::bigint) AS i,
               LATERAL (SELECT now() - interval '31 days' + (i::float8 / %s) * interval '30 days' AS f) AS x"""
FILL_COLS = ("(id, handler, args, status, trigger, attempt, max_attempts, run_at, worker, started_at, finished_at,"
             " result, error, created_at)")


def fill_history(db: DB, have: int, want: int, top: int) -> dict[str, Any]:
    """Top both histories up from `have` to `want` finished runs (the same rows; ids far above
    the hot table's); finished_at runs from 31 to 1 days ago over `top`."""
    lsn = db.execute("SELECT pg_current_wal_lsn()")[0][0]
    t = time.perf_counter()
    for table in ("switchboard.task_runs_history", "bench_old"):
        over = " OVERRIDING SYSTEM VALUE" if table == "bench_old" else ""
        db.execute(f"INSERT INTO {table} {FILL_COLS}{over} {FILL_SELECT}", (have + 1, want, max(top, 1)))
    ins = time.perf_counter() - t
    db.execute("VACUUM ANALYZE switchboard.task_runs_history")
    db.execute("VACUUM ANALYZE bench_old")
    return {"rows": want - have, "insert_s": round(ins, 1), "with_vacuum_s": round(time.perf_counter() - t, 1),
            "wal_bytes": int(db.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,))[0][0])}


def sizes(db: DB, table: str) -> dict[str, Any]:
    """Table and index bytes; a partitioned table counts its partitions."""
    parts = [r[0] for r in db.execute("SELECT relid::text FROM pg_partition_tree(%s::regclass) WHERE isleaf",
                                      (table,))] or [table]
    tb = ib = 0
    per: dict[str, int] = {}
    for t in parts:
        rel = db.execute("SELECT pg_relation_size(%s), pg_indexes_size(%s)", (t, t))[0]
        tb, ib = tb + rel[0], ib + rel[1]
        for n, b in db.execute("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                               "WHERE indrelid = %s::regclass ORDER BY 1", (t,)):
            per[n.split(".")[-1]] = b
    return {"table_bytes": tb, "indexes_bytes": ib, "total_bytes": tb + ib,
            "per_index_bytes": per if len(parts) == 1 else {}}


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
    claim = PLAIN_CLAIM.format(t=TABLES[mode], w="%(w)s", n="%(n)s")
    finish = PLAIN_FINISH.format(t=TABLES[mode], ids="%(ids)s", w="%(w)s")
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
    table = TABLES[mode]
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


OLD_REAP = """DELETE FROM bench_old r
 WHERE r.ctid = ANY (ARRAY(SELECT o.ctid FROM bench_old o
                            WHERE o.status IN ('succeeded', 'failed', 'abandoned', 'cancelled')
                              AND o.finished_at < now() - %(keep)s::interval
                            ORDER BY o.finished_at LIMIT %(n)s FOR UPDATE SKIP LOCKED))
   AND r.status IN ('succeeded', 'failed', 'abandoned', 'cancelled') AND r.finished_at < now() - %(keep)s::interval"""


def _history_dead(db: DB) -> dict[str, int]:
    r = db.execute("SELECT coalesce(sum(n_live_tup), 0), coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
                   "WHERE schemaname = 'switchboard' AND relname LIKE 'task_runs_history%%'")
    return {"n_live_tup": int(r[0][0]), "n_dead_tup": int(r[0][1])}


def retention(db: DB, h: int) -> dict[str, Any]:
    """The same H finished runs: dropped as day partitions (sb) vs deleted in batches + VACUUM (old)."""
    out: dict[str, Any] = {"rows": h, "batch": REAP_BATCH, "keep": KEEP}
    db.execute("ALTER TABLE bench_old SET (autovacuum_enabled = false)")
    db.execute("VACUUM bench_old")  # so that every dead tuple counted after is the reap's
    n_parts = db.execute("SELECT count(*) FROM switchboard._runs_history_parts() p "
                         "WHERE NOT p.is_default AND p.upper_bound <= now() - %s::interval", (KEEP,))[0][0]
    before = {**sizes(db, "switchboard.task_runs_history"), **_history_dead(db)}
    with psycopg.connect(db.url, autocommit=True) as c:
        lsn, t = _wal(c), time.perf_counter()
        k = _one(c, "SELECT switchboard.reap_runs(%s::interval, %s)", (KEEP, REAP_BATCH))
        secs = time.perf_counter() - t
        wal = _wal_since(c, lsn)
    gone = db.execute("SELECT count(*) FROM switchboard._runs_history_parts() p "
                      "WHERE NOT p.is_default AND p.upper_bound <= now() - %s::interval", (KEEP,))[0][0]
    time.sleep(1.5)
    out["sb_drop_partitions"] = {"partitions": n_parts, "left": gone, "rows_deleted_one_by_one": k,
                                 "seconds": round(secs, 4), "wal_bytes": wal, **_history_dead(db),
                                 "sizes_before": before, "sizes_after": sizes(db, "switchboard.task_runs_history")}
    log(f"  sb reap_runs: {n_parts} day partitions ({h:,} runs) dropped in {secs:.3f} s, WAL {wal / 2**10:.0f} KiB, "
        f"dead tuples {out['sb_drop_partitions']['n_dead_tup']}")
    before = {**sizes(db, "bench_old"), **_dead(db, "bench_old")}
    with psycopg.connect(db.url, autocommit=True) as c:
        lsn, t, calls, deleted = _wal(c), time.perf_counter(), 0, 0
        while True:
            k = c.execute(OLD_REAP, {"keep": OLD_KEEP, "n": REAP_BATCH}).rowcount
            calls, deleted = calls + 1, deleted + k
            if k < REAP_BATCH:
                break
        secs = time.perf_counter() - t
        wal = _wal_since(c, lsn)
    time.sleep(1.5)  # the backend has exited: its statistics are flushed
    out["old_batched_delete"] = {"deleted": deleted, "calls": calls, "seconds": round(secs, 2), "wal_bytes": wal,
                                 **_dead(db, "bench_old"), "sizes_before": before, "sizes_after": sizes(db, "bench_old")}
    log(f"  old batched DELETE: {deleted:,} rows in {secs:.1f} s ({calls} calls), WAL {wal / 2**20:.0f} MiB, "
        f"dead tuples left {out['old_batched_delete'].get('n_dead_tup')}")
    with psycopg.connect(db.url, autocommit=True) as c:
        lsn, t = _wal(c), time.perf_counter()
        c.execute("VACUUM bench_old")
        secs = time.perf_counter() - t
        wal = _wal_since(c, lsn)
    out["old_vacuum_after_delete"] = {"seconds": round(secs, 2), "wal_bytes": wal,
                                      "sizes_after": sizes(db, "bench_old")}
    log(f"  VACUUM after the DELETE: {secs:.1f} s, WAL {wal / 2**20:.0f} MiB")
    db.execute("ALTER TABLE bench_old RESET (autovacuum_enabled)")
    r, v, d = out["old_batched_delete"], out["old_vacuum_after_delete"], out["sb_drop_partitions"]
    out["old_delete_plus_vacuum_over_sb_drop"] = {
        "seconds": round((r["seconds"] + v["seconds"]) / max(d["seconds"], 1e-4), 1),
        "wal_bytes": round((r["wal_bytes"] + v["wal_bytes"]) / max(d["wal_bytes"], 1), 1)}
    return out


# -- one size --------------------------------------------------------------------------------------
def _med(xs: list[dict[str, Any]], k: str) -> float:
    return round(float(statistics.median(x[k] for x in xs)), 1)


def measure(cluster: Cluster, db: DB, a: argparse.Namespace) -> dict[str, Any]:
    db.execute("TRUNCATE bench_hot")
    # Warm-up, not counted: a first pgbench on a never-analyzed bench_hot ran on plans made
    # for an empty table (half the rate of the next run); every side gets one short run, then ANALYZE.
    for script in SCRIPTS.values():
        pgbench(cluster, db.name, script, a.clients, 2)
    for t in TABLES.values():
        db.execute(f"ANALYZE {t}")
    pt: dict[str, Any] = {"loadavg_before": wait_quiet()}
    runs: dict[str, list[dict[str, Any]]] = {"sb": [], "old": [], "plain": []}
    order = (["sb", "old", "plain", "plain", "old", "sb"] * a.rounds)[: 3 * a.rounds]
    for mode in order:
        r = pgbench(cluster, db.name, SCRIPTS[mode], a.clients, a.seconds)
        runs[mode].append(r)
        log(f"  claim+finish {mode:<5} {r['tps']:8.0f} tx/s  {r['pg_cpu_us_per_job']:7.1f} µs PG CPU/job")
    pt["claim_finish"] = {m: {"runs": v, "tps": _med(v, "tps"), "pg_cpu_us_per_job": _med(v, "pg_cpu_us_per_job")}
                          for m, v in runs.items()}
    druns: dict[str, list[dict[str, Any]]] = {"sb": [], "old": [], "plain": []}
    for mode in order:
        r = drain(cluster, db, mode, a.drain, a.workers)
        druns[mode].append(r)
        log(f"  drain {a.drain:,} {mode:<5} {r['jobs_per_s']} jobs/s  {r['pg_cpu_us_per_job']} µs PG CPU/job"
            f"  (left {r['left']})")
    pt["drain"] = {m: {"runs": v, "jobs_per_s": _med(v, "jobs_per_s"),
                       "pg_cpu_us_per_job": _med(v, "pg_cpu_us_per_job")} for m, v in druns.items()}
    pt["sizes_after"] = {"task_runs_hot": sizes(db, "switchboard.task_runs_hot"),
                         "task_runs_history": sizes(db, "switchboard.task_runs_history"),
                         "bench_old": sizes(db, "bench_old"), "bench_hot": sizes(db, "bench_hot")}
    pt["loadavg_after"] = loadavg()
    return pt


def ratios(points: list[dict[str, Any]]) -> None:
    """sb and old ÷ plain (no history) at each size, and that ratio ÷ the same at H = 0."""
    base: dict[str, float] = {}
    for pt in points:
        r: dict[str, float] = {}
        for fig, key in (("claim_finish", "tps"), ("claim_finish", "pg_cpu_us_per_job"),
                         ("drain", "jobs_per_s"), ("drain", "pg_cpu_us_per_job")):
            for side in ("sb", "old"):
                v, plain = pt[fig][side][key], pt[fig]["plain"][key]
                name = f"{fig}.{key}.{side}"
                r[name + "_over_plain"] = round(v / plain, 3)
                base.setdefault(name, v / plain)
                r[name + ".vs_h0"] = round(v / plain / base[name], 3)
            r[f"{fig}.{key}.sb_over_old"] = round(pt[fig]["sb"][key] / pt[fig]["old"][key], 3)
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
            pt = {"history": h, "fill": fill, "sizes_before": sizes(db, "switchboard.task_runs_history")}
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
        log(f"H={pt['history']:>11,}: vs H=0 (each over no history) sb|old: claim+finish CPU/job "
            f"{r['claim_finish.pg_cpu_us_per_job.sb.vs_h0']}x|{r['claim_finish.pg_cpu_us_per_job.old.vs_h0']}x, "
            f"tx/s {r['claim_finish.tps.sb.vs_h0']}x|{r['claim_finish.tps.old.vs_h0']}x; drain jobs/s "
            f"{r['drain.jobs_per_s.sb.vs_h0']}x|{r['drain.jobs_per_s.old.vs_h0']}x, CPU/job "
            f"{r['drain.pg_cpu_us_per_job.sb.vs_h0']}x|{r['drain.pg_cpu_us_per_job.old.vs_h0']}x; "
            f"hot {pt['sizes_after']['task_runs_hot']['total_bytes'] / 2**20:.0f} MiB, "
            f"bench_old {pt['sizes_after']['bench_old']['total_bytes'] / 2**20:.0f} MiB")
    log(f"wall {res['wall_seconds']} s -> {out_path}")


if __name__ == "__main__":
    main()
