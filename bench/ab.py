"""A/B: figure 3b (Switchboard side) and figure 6 (GET /tasks + the bare-app baseline)
for two commits, alternating, on this machine in the same run.

    python bench/ab.py BEFORE_REF [AFTER_REF=HEAD] [--rounds 2]

Each ref is checked out with `git worktree add` into a temp dir; every round runs
BEFORE then AFTER (then the next round AFTER then BEFORE, so drift in the
machine's load does not favour one side). Each side starts its own throwaway
cluster through that checkout's bench/common.py. Prints medians and bests of
jobs/s and req/s, with replica CPU per job / per request, which is steadier than
throughput on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = r'''
import json, sys, time
from pathlib import Path
root, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(root / "bench"))
import e2e
from common import Cluster, replica, stop_all
cluster = Cluster()
res = {}
try:
    db = cluster.new_db("sb_jobs")
    procs = e2e._start([replica(cluster, db, f"jobs-r{i}", env={"SWITCHBOARD_SCHEDULER_CONCURRENCY": "8"})
                        for i in range(2)])
    try:
        time.sleep(1.5)
        res["jobs"] = [e2e._sb_jobs_run(cluster, db, 5000, [p.pid for p in procs]) for _ in range(3)]
    finally:
        stop_all(procs)
        cluster.drop_db(db)
    res["http"] = e2e.bench_http(cluster, seconds=5, runs=3)
finally:
    cluster.stop()
out.write_text(json.dumps(res, default=str))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default="HEAD")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sb-ab-"))
    trees = {}
    for side, ref in (("before", a.before), ("after", a.after)):
        trees[side] = tmp / side
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(trees[side]), ref],
                       check=True, capture_output=True)
    results: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        for r in range(a.rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                out = tmp / f"{side}-{r}.json"
                print(f"round {r + 1}: {side} ({trees[side].name})", file=sys.stderr, flush=True)
                subprocess.run([sys.executable, "-c", ONE, str(trees[side]), str(out)], check=True,
                               stdout=subprocess.DEVNULL)
                results[side].append(json.loads(out.read_text()))
    finally:
        for t in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(t)], capture_output=True)
    for side, runs in results.items():
        jobs = [j["jobs_per_s"] for d in runs for j in d["jobs"]]
        jcpu = [j["workers_cpu_us_per_job"] for d in runs for j in d["jobs"]]
        rps = [x["rps"] for d in runs for x in d["http"]["switchboard"]["runs"]]
        hcpu = [x["server_cpu_us_per_req"] for d in runs for x in d["http"]["switchboard"]["runs"]]
        bare = [x["rps"] for d in runs for x in d["http"]["bare"]["runs"]]
        print(f"{side:6} jobs/s median {statistics.median(jobs):.0f} best {max(jobs):.0f} "
              f"(replica CPU/job median {statistics.median(jcpu):.0f} us, min {min(jcpu):.0f}) | "
              f"GET /tasks req/s median {statistics.median(rps):.0f} best {max(rps):.0f} "
              f"(CPU/req median {statistics.median(hcpu):.0f} us, min {min(hcpu):.0f}) | "
              f"bare app median {statistics.median(bare):.0f} req/s")


if __name__ == "__main__":
    main()
