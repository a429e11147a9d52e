#!/usr/bin/env python3
"""Publishers per second: notify_user (V0009, no lock) against the previous
release's locked path and the raw baselines, on one durable cluster, one run.

Standalone: starts its own throwaway PostgreSQL with fsync and synchronous
commit ON (group commit is what a plain INSERT scales with, so a cluster
without fsync would hide the difference), migrates a fresh database, then for
1 / 4 / 16 / 64 pgbench clients runs, interleaved:

- ``ours``         SELECT switchboard.notify_user(...)      (one NOTIFY per transaction)
- ``ours_silent``  the same with event_ticker.publishers_notify = false (no NOTIFY)
- ``ours_live``    the same with the verified live path on (V0020: + one signed NOTIFY per event)
- ``locked``       the previous release's path: order-row lock until COMMIT + nextval + INSERT + NOTIFY
- ``insert_notify``  INSERT into a plain table with the same indexes + pg_notify
- ``insert``         the INSERT alone

A LISTEN connection is open on every channel during every run (a NOTIFY with
no listener costs less). Reports transactions/s and server CPU per
transaction; writes bench/results/event_publishers.json.

Usage: python bench/event_publishers.py [--duration 5] [--clients 1,4,16,64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "bench" / "pgbench"
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "server"))

import psycopg  # noqa: E402
from switchboard.migrate import migrate  # noqa: E402
from switchboard.pgtest import ThrowawayPostgres, find_bindir  # noqa: E402

DB = "sb_bench_events"
ARGON = "$argon2id$v=19$m=65536,t=3,p=4$YmVuY2hzYWx0$YmVuY2hoYXNoYmVuY2hoYXNo"
BASELINE_DDL = """
CREATE TABLE bench_events (
    id         bigserial PRIMARY KEY,
    user_id    uuid,
    room       text,
    event      text NOT NULL,
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX ON bench_events (user_id, id) WHERE user_id IS NOT NULL;
CREATE INDEX ON bench_events (room, id) WHERE room IS NOT NULL;
CREATE INDEX ON bench_events (created_at);
CREATE INDEX ON bench_events (xid);
CREATE TABLE bench_event_order (singleton boolean PRIMARY KEY DEFAULT true);
INSERT INTO bench_event_order DEFAULT VALUES;
CREATE FUNCTION bench_notify_locked(uid uuid) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v_id bigint;
BEGIN
    PERFORM 1 FROM bench_event_order WHERE singleton FOR UPDATE;
    v_id := nextval('bench_events_id_seq');
    INSERT INTO bench_events (id, user_id, event, payload) VALUES (v_id, uid, 'bench.event', '{"n": 1}');
    PERFORM pg_notify('bench_events', '{"id":' || v_id || '}');
    RETURN v_id;
END $$;
"""
VARIANTS = {
    "ours": "events_notify_user.sql",
    "ours_silent": "events_notify_user.sql",
    "ours_live": "events_notify_user.sql",
    "locked": "events_locked.sql",
    "insert_notify": "events_raw_insert_notify.sql",
    "insert": "events_raw_insert.sql",
}


def pgbench_binary() -> str:
    for cand in (os.path.join(find_bindir(), "pgbench"), "/usr/lib/postgresql/15/bin/pgbench",
                 shutil.which("pgbench") or ""):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit("pgbench not found")


def server_cpu_seconds(postmaster: int) -> float:
    """CPU of the postmaster and its children (live and reaped), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    with open(f"/proc/{postmaster}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in parts[11:15])
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            if int(parts[1]) == postmaster:
                total += int(parts[11]) + int(parts[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--clients", default="1,4,16,64")
    args = ap.parse_args()
    clients = [int(x) for x in args.clients.split(",")]
    pg = ThrowawayPostgres(settings={"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
                                     "max_connections": "200"})
    pgbench = pgbench_binary()
    out: dict = {"duration_s": args.duration, "cpus": os.cpu_count(), "runs": {}}
    try:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{DB}"')
        url = pg.url(DB)
        migrate(url)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                           FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
            uid = str(c.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()[0])
            c.execute(BASELINE_DDL)
        listener = psycopg.connect(url, autocommit=True)
        listener.execute("LISTEN switchboard_events")
        listener.execute("LISTEN bench_events")
        # The live path's channel is named after its key (V0025); the key stays the same here.
        live_channel = listener.execute("SELECT channel FROM switchboard.event_live").fetchone()[0]
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(live_channel)))
        print(f"{'clients':>7} " + " ".join(f"{v:>14}" for v in VARIANTS) + "   (transactions/s; server CPU us/txn)")
        for n in clients:
            row = {}
            for variant, script in VARIANTS.items():
                with psycopg.connect(url, autocommit=True) as c:
                    c.execute("UPDATE switchboard.event_ticker SET publishers_notify = %s",
                              (variant != "ours_silent",))
                    c.execute("SELECT switchboard.event_live_path(%s)", (variant == "ours_live",))
                cmd = [pgbench, "-n", "-M", "prepared", "-c", str(n), "-j", str(min(n, 2)),
                       "-T", str(args.duration), "-f", str(SCRIPTS / script), "-h", "127.0.0.1",
                       "-p", str(pg.port), "-U", "postgres", "-D", f"uid={uid}", DB]
                cpu0 = server_cpu_seconds(pg.pid)
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                      timeout=args.duration * 4 + 60)
                time.sleep(0.3)
                cpu = server_cpu_seconds(pg.pid) - cpu0
                text = proc.stdout + proc.stderr
                tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
                done = re.search(r"number of transactions actually processed: (\d+)", text)
                if proc.returncode != 0 or not tps or not done:
                    raise RuntimeError(f"pgbench {variant} failed:\n{text}")
                # drain the listener so the NOTIFY queue never fills
                for _ in listener.notifies(timeout=0.1):
                    pass
                row[variant] = {"tps": float(tps.group(1)),
                                "cpu_us_per_txn": round(cpu / max(int(done.group(1)), 1) * 1e6, 1)}
            out["runs"][str(n)] = row
            print(f"{n:>7} " + " ".join(f"{row[v]['tps']:>8.0f} {row[v]['cpu_us_per_txn']:>5.0f}" for v in VARIANTS),
                  flush=True)
        listener.close()
    finally:
        pg.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "event_publishers.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
