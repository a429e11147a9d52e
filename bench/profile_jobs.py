#!/usr/bin/env python3
"""Where a drained job's CPU goes: the claim -> handler -> finish path, profiled.

    python bench/profile_jobs.py [--jobs 20000] [--replicas 2] [--concurrency 8] [--py-spy]

Two replicas (as bench/e2e.py's figure 3b) drain M `noop` jobs. Reported: jobs/s,
replica and PostgreSQL CPU per job, the SQL functions each job costs
(pg_stat_user_functions, track_functions = 'pl': calls and self time per job),
the claim batch sizes (calls of claim_due_tasks per job), and with --py-spy a
flame profile of replica 0 (py-spy record --format raw: collapsed stacks) in
bench/results/profile-jobs-r0.txt, summarised by own time per function.
"""

from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import psycopg.sql
from common import RESULTS, Cluster, CpuMeter, log, loadavg, replica, stop_all


def top_frames(raw: Path, n: int = 25) -> list[tuple[str, float]]:
    """Own (leaf) samples per function from py-spy's collapsed stacks, as a share of all."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, cnt = line.rpartition(" ")
        if not stack:
            continue
        k = int(cnt)
        total += k
        frames = stack.split(";")
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    return [(f, round(100 * c / total, 1)) for f, c in own.most_common(n)], \
        [(f, round(100 * c / total, 1)) for f, c in incl.most_common(n * 2)]  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--py-spy", action="store_true")
    ap.add_argument("--pgss", action="store_true",
                    help="pg_stat_statements (track = all): the nested statements' time per job, per run")
    ap.add_argument("--db-set", action="append", default=[], metavar="NAME=VALUE",
                    help="ALTER DATABASE ... SET NAME = VALUE before the replicas connect (a diagnosis)")
    ap.add_argument("--custom-plans", action="store_true",
                    help="ALTER DATABASE ... SET plan_cache_mode = force_custom_plan (a diagnosis)")
    ap.add_argument("--no-vacuum", action="store_true",
                    help="TRUNCATE between runs without VACUUM ANALYZE (empty-table statistics)")
    ap.add_argument("--cprofile", action="store_true",
                    help="replica 0 under cProfile on process time (bench/cprofile_serve.py)")
    ap.add_argument("--tree", type=Path, default=None,
                    help="profile another checkout (its server/ runs the replicas, its db/ migrates the "
                         "database), e.g. `git archive <commit> | tar -x -C DIR`: the before of a before/after")
    a = ap.parse_args()
    cluster = Cluster({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
                      if a.pgss else None)
    env = {"SWITCHBOARD_SCHEDULER_CONCURRENCY": str(a.concurrency)}
    if a.tree is None:
        db = cluster.new_db("prof_jobs")
    else:
        import os

        from switchboard.migrate import migrate

        db = cluster.new_db("prof_jobs_tree", template=None)
        os.environ["PGOPTIONS"] = "-c switchboard.shared_roles=on"   # a second installation, trusted
        try:
            migrate(cluster.url(db), base=a.tree.resolve() / "db")
        finally:
            del os.environ["PGOPTIONS"]
        env["PYTHONPATH"] = os.pathsep.join([str(a.tree.resolve() / "server"), str(Path(__file__).resolve().parent)])
    url = cluster.url(db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{db}" SET track_functions = \'pl\'')
        for kv in a.db_set:
            name, _, value = kv.partition("=")
            c.execute(psycopg.sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                psycopg.sql.Identifier(db), psycopg.sql.Identifier(name), psycopg.sql.Literal(value)))
        if a.custom_plans:
            c.execute(f'ALTER DATABASE "{db}" SET plan_cache_mode = force_custom_plan')
    procs = [replica(cluster, db, f"prof-r{i}", env=env) for i in range(a.replicas)]
    pstats_path = RESULTS / "profile-jobs-r0.pstats"
    if a.cprofile:
        # the same command, under the CPU-time profiler
        i = procs[0].cmd.index("-m")
        procs[0].cmd[i:i + 2] = [str(Path(__file__).resolve().parent / "cprofile_serve.py"), str(pstats_path)]
    for p in procs:
        p.start(wait=False)
    for p in procs:
        p.wait_ready()
    spy = None
    try:
        time.sleep(1.5)
        for r in range(a.runs):
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("TRUNCATE switchboard.task_runs_hot, switchboard.task_runs_history")
                if not a.no_vacuum:
                    c.execute("VACUUM ANALYZE switchboard.task_runs_hot, switchboard.task_runs_history")
                c.execute("SELECT pg_stat_reset()")
                if a.pgss:
                    c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    c.execute("SELECT pg_stat_statements_reset()")
                time.sleep(0.6)  # the stats collector takes the reset
            last_run = r == a.runs - 1
            if a.py_spy and last_run:
                out = RESULTS / "profile-jobs-r0.txt"
                spy = subprocess.Popen(["py-spy", "record", "--pid", str(procs[0].pid), "--format", "raw",
                                        "-r", "250", "-o", str(out), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            la = loadavg()
            t0 = time.time()
            # As bench/e2e.py figure 3b: M due jobs in one transaction; the drain is timed
            # from the first claim (min started_at) to the last finish, on the database clock,
            # and CPU is metered from COMMIT (the enqueue's own cost is not a drained job's).
            with psycopg.connect(url) as c:
                c.execute("SELECT count(*) FROM (SELECT switchboard.enqueue('noop') "
                          "FROM generate_series(1, %s)) s", (a.jobs,))
                c.commit()
                meter = CpuMeter(cluster, [p.pid for p in procs])
            with psycopg.connect(url, autocommit=True) as c:
                while True:
                    time.sleep(0.1)
                    # pending work through the partial indexes (queued, running): a count of
                    # the whole table every 100 ms was ~50 us of PostgreSQL CPU per job (pgss)
                    if not c.execute("SELECT EXISTS (SELECT 1 FROM switchboard.task_runs WHERE status = 'queued') "
                                     "OR EXISTS (SELECT 1 FROM switchboard.task_runs WHERE status = 'running' "
                                     "AND handler = 'noop')").fetchone()[0] or time.time() - t0 > 300:
                        break
                cpu = meter.stop()
                done = c.execute("SELECT count(*) FROM switchboard.task_runs "
                                 "WHERE handler = 'noop' AND status = 'succeeded'").fetchone()[0]
                first, last = c.execute("SELECT extract(epoch FROM min(started_at))::float8, "
                                        "extract(epoch FROM max(finished_at))::float8 FROM switchboard.task_runs"
                                        ).fetchone()
                time.sleep(0.7)
                funcs = c.execute("""SELECT funcname, calls, round(self_time::numeric, 1), round(total_time::numeric, 1)
                                       FROM pg_stat_user_functions WHERE schemaname = 'switchboard'
                                      ORDER BY self_time DESC""").fetchall()
            secs = last - first
            if a.pgss:
                with psycopg.connect(url, autocommit=True) as c:
                    for q, calls, tot, rows in c.execute(
                            "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time, rows "
                            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
                            "current_database()) ORDER BY total_exec_time DESC LIMIT 8"):
                        log(f"   pgss {tot * 1000 / done:8.1f} us/job {calls:>7} calls {rows:>8} rows  {q[:150]}")
            log(f"run {r + 1}: {done} jobs in {secs:.2f} s = {done / secs:,.0f} jobs/s (load {la:.1f}); CPU/job "
                f"replicas {cpu['workers_cpu_s'] / done * 1e6:.0f} us + postgres {cpu['postgres_cpu_s'] / done * 1e6:.0f} us")
            for f, calls, self_ms, total_ms in funcs:
                log(f"   {f:<28} {calls:>8} calls ({calls / done:.3f}/job)  self {float(self_ms) * 1000 / done:7.1f} us/job "
                    f"total {float(total_ms) * 1000 / done:7.1f} us/job")
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)   # py-spy writes its output on SIGINT, not SIGTERM
            spy.wait(timeout=30)
        stop_all(procs)
        cluster.stop()
    if a.cprofile:
        import pstats

        st = pstats.Stats(str(pstats_path))
        total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
        log(f"cProfile (process time), replica 0: {total:.2f} s own time in total; top by own time:")
        st.sort_stats("tottime").print_stats(30)
        st.sort_stats("cumulative").print_stats(45)
    if spy is not None:
        own, incl = top_frames(RESULTS / "profile-jobs-r0.txt")
        log("py-spy, replica 0: own time (% of samples)")
        for f, p in own:
            log(f"   {p:5.1f} %  {f}")
        log("inclusive")
        for f, p in incl:
            log(f"   {p:5.1f} %  {f}")


if __name__ == "__main__":
    main()
