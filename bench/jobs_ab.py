#!/usr/bin/env python3
"""Figure 3b side by side: two Switchboard trees and procrastinate, alternating, one cluster.

    python bench/jobs_ab.py --base /tmp/base-tree [--rounds 4] [--jobs 5000]

``--base`` is another checkout of the repository (say ``git archive <commit> | tar -x
-C DIR``): its server/ runs its replicas and its db/ migrates its database. The
worktree holding this file is "ours". Each round drains M `noop` jobs with base's 2
replicas, then ours (the order flips every round), then procrastinate's 2 workers,
exactly as bench/e2e.py's figure 3b (same drain functions: jobs inserted in one
transaction, clock from COMMIT to the last finish, every job succeeded once, CPU of the
workers and of every backend per job). All processes stay up for the whole run, so
each round sees the same idle neighbours. Reported per round and as medians: jobs/s,
CPU per job, each tree's ratio to the same round's procrastinate, ours / base.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BENCH, RESULTS, ROOT, Cluster, log, median, replica, stop_all
from e2e import _procrastinate_run, _sb_jobs_run, _start, start_procrastinate, stop_procrastinate
from switchboard.migrate import migrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, type=Path, help="the other tree (its server/ and db/)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--no-procrastinate", action="store_true")
    a = ap.parse_args()
    trees = {"base": a.base.resolve(), "ours": ROOT}
    cluster = Cluster()
    procs: dict[str, list[Any]] = {}
    dbs: dict[str, str] = {}
    workers: list[subprocess.Popen[bytes]] = []
    logs = []
    results: dict[str, list[dict[str, Any]]] = {"base": [], "ours": [], "procrastinate": []}
    try:
        for name, tree in trees.items():
            db = cluster.new_db(f"ab_{name}", template=None)
            # a second installation in the bench cluster (the template is the first): trusted copies
            os.environ["PGOPTIONS"] = "-c switchboard.shared_roles=on"
            try:
                migrate(cluster.url(db), base=tree / "db")
            finally:
                del os.environ["PGOPTIONS"]
            dbs[name] = db
            procs[name] = _start([
                replica(cluster, db, f"ab-{name}-r{i}", env={
                    "SWITCHBOARD_SCHEDULER_CONCURRENCY": str(a.concurrency),
                    "PYTHONPATH": os.pathsep.join([str(tree / "server"), str(BENCH)])})
                for i in range(a.processes)])
        purl = ""
        if not a.no_procrastinate:
            _, purl, workers, logs = start_procrastinate(cluster, "ab_procr", a.processes, a.concurrency, "ab")
        time.sleep(2.0)
        for r in range(a.rounds):
            order = ["base", "ours"] if r % 2 == 0 else ["ours", "base"]
            for name in order:
                res = _sb_jobs_run(cluster, dbs[name], a.jobs, [p.pid for p in procs[name]])
                res["round"] = r + 1
                results[name].append(res)
                log(f"round {r + 1} {name:<5} {res['jobs_per_s']:>8,.0f} jobs/s  CPU/job replicas "
                    f"{res['workers_cpu_us_per_job']} us + postgres {res['postgres_cpu_us_per_job']} us  "
                    f"ok={res['succeeded']} bad={res['failed_or_abandoned']} retried={res['retried']} "
                    f"dup={res['duplicates']} (load {res['loadavg_before']:.1f})")
            if workers:
                res = _procrastinate_run(cluster, purl, a.jobs, [w.pid for w in workers])
                res["round"] = r + 1
                results["procrastinate"].append(res)
                log(f"round {r + 1} procr {res['jobs_per_s']:>8,.0f} jobs/s  CPU/job workers "
                    f"{res['workers_cpu_us_per_job']} us + postgres {res['postgres_cpu_us_per_job']} us  "
                    f"ok={res['succeeded']} dup={res['duplicates']} (load {res['loadavg_before']:.1f})")
    finally:
        stop_procrastinate(workers, logs)
        for ps in procs.values():
            stop_all(ps)
        cluster.stop()
    summary: dict[str, Any] = {"jobs": a.jobs, "rounds": a.rounds, "base": str(a.base), "runs": results}
    for name in ("base", "ours", "procrastinate"):
        rs = results[name]
        if not rs:
            continue
        summary[name] = {"jobs_per_s_median": median([x["jobs_per_s"] for x in rs]),
                         "workers_cpu_us_median": median([x["workers_cpu_us_per_job"] for x in rs]),
                         "postgres_cpu_us_median": median([x["postgres_cpu_us_per_job"] for x in rs]),
                         "all_succeeded_once": all(x["succeeded"] == a.jobs and x.get("retried", 0) == 0
                                                   and x["duplicates"] == 0 for x in rs)}
        log(f"{name:<13} median {summary[name]['jobs_per_s_median']:>8,.0f} jobs/s  CPU/job "
            f"{summary[name]['workers_cpu_us_median']:.0f} + {summary[name]['postgres_cpu_us_median']:.0f} us  "
            f"all ok once: {summary[name]['all_succeeded_once']}")
    pr = results["procrastinate"]
    for name in ("base", "ours"):
        if pr:
            ratios = [s["jobs_per_s"] / p["jobs_per_s"] for s, p in zip(results[name], pr)]
            summary[f"{name}_vs_procrastinate"] = {"per_round": [round(x, 2) for x in ratios],
                                                   "median": round(median(ratios), 2)}
            log(f"{name} / procrastinate per round: {', '.join(f'{x:.1f}x' for x in ratios)} "
                f"(median {median(ratios):.1f}x)")
    ob = [o["jobs_per_s"] / b["jobs_per_s"] for o, b in zip(results["ours"], results["base"])]
    summary["ours_vs_base"] = {"per_round": [round(x, 3) for x in ob], "median": round(median(ob), 3)}
    log(f"ours / base per round: {', '.join(f'{x:.2f}x' for x in ob)} (median {median(ob):.2f}x)")
    out = RESULTS / "jobs_ab.json"
    out.write_text(json.dumps(summary, indent=2, default=str))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
