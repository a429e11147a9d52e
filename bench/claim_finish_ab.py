"""Claim + finish for several commits, rotating, same run: PostgreSQL CPU per job and where
the finish's server time goes.

    python bench/claim_finish_ab.py REF [REF ...] [--trios 3] [--rounds 3] [--seconds 10]
    python bench/claim_finish_ab.py HEAD e4fae06 367b156      # issue 35's figures

Each ref is checked out with `git worktree add` into a temp dir. A trio runs every
ref once, in the order given; each ref's turn starts a fresh throwaway cluster through
that checkout's bench/common.py, with pg_stat_statements loaded (track = all,
track_planning), and runs `--rounds` pgbench runs of 4 clients, each transaction
enqueue + claim_due_tasks(w, lease, 1) + finish_runs: bench/history.py's claim +
finish with no history. Reported per ref: PostgreSQL CPU µs per job (every process
of the cluster, polled every 50 ms: a backend that exits counts all but its last
50 ms), tx/s, the median per trio against the last ref, and for the last round
pg_stat_statements' execution and planning µs per job of the top statements.
Raw results: bench/results/claim_finish_ab.json.
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
import json, os, subprocess, sys, tempfile, time, urllib.parse
from pathlib import Path
root, out, rounds, secs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, str(root / "bench"))
import psycopg
from common import Cluster, child_pids, cpu_seconds
TX = """SELECT switchboard.enqueue('bench.noop');
SELECT coalesce(max(id), 0) AS rid FROM switchboard.claim_due_tasks('w' || :client_id, '60 seconds', 1) \\gset
SELECT count(*) FROM switchboard.finish_runs('w' || :client_id, ARRAY[:rid]::bigint[]);
"""
cl = Cluster({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
              "pg_stat_statements.track_planning": "on"})
res = {"rounds": []}
try:
    name = cl.new_db("cf")
    url = cl.url(name)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT switchboard.update_task(id, '{\"is_active\": false}') FROM switchboard.tasks"
                  " WHERE name = 'switchboard.maintenance'")
        c.execute("CREATE EXTENSION pg_stat_statements")
    script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
    script.write(TX)
    script.close()
    u = urllib.parse.urlsplit(url)
    env = dict(os.environ, PGHOST=u.hostname or "", PGPORT=str(u.port), PGUSER="postgres", PGDATABASE=name)
    pgbench = ["/usr/lib/postgresql/15/bin/pgbench", "-n", "-c", "4", "-j", "2", "-f", script.name]
    subprocess.run([*pgbench, "-T", "3"], env=env, capture_output=True, check=True)   # warm-up
    pid = cl.pg.pid
    for r in range(rounds):
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("VACUUM ANALYZE switchboard.task_runs_hot" if c.execute(
                "SELECT to_regclass('switchboard.task_runs_hot')").fetchone()[0] else "VACUUM ANALYZE switchboard.task_runs")
            c.execute("SELECT pg_stat_statements_reset()")
        last = {p: cpu_seconds(p) for p in [pid, *child_pids(pid)]}
        base = dict(last)
        p = subprocess.Popen([*pgbench, "-T", str(secs)], env=env, stdout=subprocess.PIPE, text=True)
        while p.poll() is None:
            for q in [pid, *child_pids(pid)]:
                t = cpu_seconds(q)
                if t:
                    last[q] = t
            time.sleep(0.05)
        text = p.stdout.read() if p.stdout else ""
        tx = int(next(l for l in text.splitlines() if "actually processed" in l).split(":")[1].split("/")[0])
        cpu = sum(v - base.get(q, 0.0) for q, v in last.items())
        with psycopg.connect(url, autocommit=True) as c:
            top = [{"query": q, "exec_us": float(e), "plan_us": float(pl)} for q, e, pl in c.execute(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), total_exec_time * 1000 / %s,"
                " total_plan_time * 1000 / %s FROM pg_stat_statements WHERE calls > 0"
                " ORDER BY total_exec_time + total_plan_time DESC LIMIT 6", (tx, tx))]
        res["rounds"].append({"tx_s": tx / secs, "cpu_us_per_job": cpu / tx * 1e6, "statements": top})
finally:
    cl.stop()
out.write_text(json.dumps(res))
'''


def worktree(ref: str, base: Path) -> Path:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = base / sha
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), sha], check=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("refs", nargs="+", help="commits; the last is the baseline of the ratios")
    ap.add_argument("--trios", type=int, default=3, help="times every ref runs, rotating")
    ap.add_argument("--rounds", type=int, default=3, help="pgbench runs per turn")
    ap.add_argument("--seconds", type=int, default=10, help="per pgbench run")
    a = ap.parse_args()
    results: dict[str, list[dict]] = {r: [] for r in a.refs}
    with tempfile.TemporaryDirectory(prefix="cf-ab-") as tmp:
        trees = {r: worktree(r, Path(tmp)) for r in a.refs}
        try:
            for trio in range(a.trios):
                for ref in a.refs:
                    out = Path(tmp) / f"{trio}-{trees[ref].name}.json"
                    subprocess.run([sys.executable, "-c", ONE, str(trees[ref]), str(out), str(a.rounds),
                                    str(a.seconds)], check=True)
                    turn = json.loads(out.read_text())
                    results[ref].append(turn)
                    cpus = [round(x["cpu_us_per_job"]) for x in turn["rounds"]]
                    print(f"trio {trio} {ref:>10}: PostgreSQL CPU µs/job {cpus}", flush=True)
        finally:
            for t in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(t)], check=False)
    last = a.refs[-1]
    print("\nref        CPU µs/job median (range)   tx/s median   median per trio / " + last)
    for ref, turns in results.items():
        cpu = [x["cpu_us_per_job"] for t in turns for x in t["rounds"]]
        tps = [x["tx_s"] for t in turns for x in t["rounds"]]
        per = [statistics.median(x["cpu_us_per_job"] for x in t["rounds"]) /
               statistics.median(x["cpu_us_per_job"] for x in b["rounds"]) for t, b in zip(turns, results[last])]
        print(f"{ref:>10} {statistics.median(cpu):8.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
              f" {statistics.median(tps):12.0f}   " + ", ".join(f"{x:.2f}" for x in per))
        for s in turns[-1]["rounds"][-1]["statements"][:4]:
            print(f"{'':>12} exec {s['exec_us']:6.1f} + plan {s['plan_us']:5.1f} µs/job  {s['query']}")
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "claim_finish_ab.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
