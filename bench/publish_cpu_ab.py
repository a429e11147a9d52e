#!/usr/bin/env python3
"""One event's server CPU, before and after, in one run (issue 31).

Standalone, like bench/event_publishers.py, but an A/B: one throwaway PostgreSQL
holds two databases, ``before`` migrated from the db/ of a git ref (default HEAD)
and ``after`` from this tree's db/, and pgbench runs these, interleaved, the order
rotating every round, so both sides see the same load on a noisy box:

- ``before``         SELECT switchboard.notify_user(...) in the ref's functions
- ``after``          the same call in this tree's functions
- ``insert_notify``  INSERT into a plain table with the same indexes + pg_notify
- ``locked``         the previous release's path (order-row lock, nextval, INSERT, NOTIFY)

A LISTEN connection is open on every channel of both databases. By default the
cluster runs with fsync and synchronous_commit off, so the run is CPU-bound (with
them on, NOTIFY's commit lock across the WAL flush caps every notifying variant
alike: see event_publishers.py); --durable turns them on. Reports, per variant,
the median transactions/s and server CPU per transaction (all PostgreSQL
processes, from /proc) over the rounds; writes bench/results/publish_cpu_ab.json.

Usage: python bench/publish_cpu_ab.py [--ref HEAD] [--clients 1,4] [--duration 5] [--rounds 5] [--durable]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "bench" / "pgbench"
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from event_publishers import ARGON, BASELINE_DDL, pgbench_binary, server_cpu_seconds  # noqa: E402
from switchboard.migrate import migrate  # noqa: E402
from switchboard.pgtest import ThrowawayPostgres  # noqa: E402

# variant -> (database, pgbench script)
VARIANTS = {
    "before": ("sb_before", "events_notify_user.sql"),
    "after": ("sb_after", "events_notify_user.sql"),
    "insert_notify": ("sb_after", "events_raw_insert_notify.sql"),
    "locked": ("sb_after", "events_locked.sql"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="HEAD", help="git ref whose db/ is the 'before' side")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on")
    args = ap.parse_args()
    on = "on" if args.durable else "off"
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.ref], capture_output=True,
                         text=True, check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="sb-ab-")
    subprocess.run(f"git -C {ROOT} archive {args.ref} db | tar -x -C {tmp}", shell=True, check=True)
    # Two installations in one cluster share the cluster-wide roles: allowed for throwaway copies.
    os.environ["PGOPTIONS"] = "-c switchboard.shared_roles=on"
    pg = ThrowawayPostgres(settings={"fsync": on, "synchronous_commit": on, "full_page_writes": on,
                                     "max_connections": "200"})
    pgbench = pgbench_binary()
    out: dict = {"ref": sha, "durable": args.durable, "duration_s": args.duration, "rounds": args.rounds,
                 "cpus": os.cpu_count(), "runs": {}}
    listeners = []
    try:
        uids = {}
        for db, base in (("sb_before", Path(tmp) / "db"), ("sb_after", None)):
            with psycopg.connect(pg.url(), autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{db}"')
            migrate(pg.url(db), base=base)
            with psycopg.connect(pg.url(db), autocommit=True) as c:
                c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                               FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
                uids[db] = str(c.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()[0])
                c.execute(BASELINE_DDL)
            lc = psycopg.connect(pg.url(db), autocommit=True)
            for ch in ("switchboard_events", "bench_events", "switchboard_live"):
                lc.execute(f"LISTEN {ch}")
            listeners.append(lc)
        print(f"before = {sha} db/, after = this tree; fsync {on}; {args.rounds} rounds x {args.duration} s, "
              "order rotating; median transactions/s and server CPU us per transaction", flush=True)
        names = list(VARIANTS)
        for n in [int(x) for x in args.clients.split(",")]:
            samples: dict[str, list[tuple[float, float]]] = {v: [] for v in names}
            for r in range(args.rounds):
                for v in names[r % len(names):] + names[:r % len(names)]:
                    db, script = VARIANTS[v]
                    cmd = [pgbench, "-n", "-M", "prepared", "-c", str(n), "-j", str(min(n, 2)),
                           "-T", str(args.duration), "-f", str(SCRIPTS / script), "-h", "127.0.0.1",
                           "-p", str(pg.port), "-U", "postgres", "-D", f"uid={uids[db]}", db]
                    cpu0 = server_cpu_seconds(pg.pid)
                    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                          timeout=args.duration * 4 + 60)
                    time.sleep(0.3)
                    cpu = server_cpu_seconds(pg.pid) - cpu0
                    text = proc.stdout + proc.stderr
                    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
                    done = re.search(r"number of transactions actually processed: (\d+)", text)
                    if proc.returncode != 0 or not tps or not done:
                        raise RuntimeError(f"pgbench {v} failed:\n{text}")
                    for lc in listeners:  # drain, so the NOTIFY queue never fills
                        for _ in lc.notifies(timeout=0.05):
                            pass
                    samples[v].append((float(tps.group(1)), cpu / max(int(done.group(1)), 1) * 1e6))
            row = {v: {"tps": round(statistics.median(t for t, _ in s)),
                       "cpu_us_per_txn": round(statistics.median(c for _, c in s), 1),
                       "cpu_us_all": [round(c) for _, c in s]} for v, s in samples.items()}
            out["runs"][str(n)] = row
            print(f"{n} client(s):")
            for v in names:
                print(f"  {v:>14} {row[v]['tps']:>7} tx/s {row[v]['cpu_us_per_txn']:>7.1f} us/txn  "
                      f"(rounds: {row[v]['cpu_us_all']})")
            a, b = row["after"], row["before"]
            for ref in ("before", "insert_notify", "locked"):
                print(f"  after / {ref:<13} tx/s {a['tps'] / row[ref]['tps']:.2f}x   "
                      f"CPU {a['cpu_us_per_txn'] / row[ref]['cpu_us_per_txn']:.2f}x")
            print(f"  before / insert_notify tx/s {b['tps'] / row['insert_notify']['tps']:.2f}x", flush=True)
    finally:
        for lc in listeners:
            lc.close()
        pg.stop()
        subprocess.run(["rm", "-rf", tmp], check=False)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "publish_cpu_ab.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
