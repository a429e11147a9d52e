#!/usr/bin/env python3
"""SQL-level benchmark: Switchboard's functions beside their raw-SQL physical limits.

Standalone: starts its own throwaway PostgreSQL, migrates a fresh database with
the real migrations, then drives each figure with pgbench (prepared statements,
``-j 2``), switchboard and baseline interleaved run by run on the same cluster,
and reports the median of the runs:

- ``rate_check`` (16 clients, random key out of 10,000) vs a raw UNLOGGED
  one-row-per-key upsert (target >= 0.8x), with ``SELECT 1`` as the floor;
- ``issue_ticket`` + ``consume_ticket`` pairs (16 clients) vs the same
  insert + delete (and hashing) on an UNLOGGED table, in one bare PL/pgSQL
  call (a single statement cannot insert a row and delete it again);
- ``claim_due_task`` + ``finish_run`` cycles (8 clients, fresh 150k-job backlog
  per run) vs the same two writes as plain SQL on a plain table with the same
  partial index (target >= 0.7x). After every run the table is checked: every
  pgbench transaction finished exactly one distinct job (a job claimed twice
  would leave succeeded < transactions) and nothing is left running.

Usage: python bench/sql.py [--duration 10] [--runs 3] [--only rate|tickets|claims]
                           [--strict] [--diagnose]
Writes bench/results/sql.json. Besides tps, every run reports the server CPU
time per transaction (all PostgreSQL processes, from /proc), which moves far
less than tps when other work shares the machine. --diagnose loads
pg_stat_statements (track=all) and prints the top statements inside the
functions after each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "bench" / "pgbench"
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "server"))

import psycopg
from switchboard.migrate import migrate
from switchboard.pgtest import ThrowawayPostgres, find_bindir

DB = "sb_bench_sql"
BACKLOG = 150_000
ARGON = "$argon2id$v=19$m=65536,t=3,p=4$YmVuY2hzYWx0$YmVuY2hoYXNoYmVuY2hoYXNo"

BASELINE_DDL = """
CREATE UNLOGGED TABLE bench_raw (key text PRIMARY KEY, tat bigint NOT NULL);

CREATE UNLOGGED TABLE bench_tickets (
    hash bytea PRIMARY KEY, user_id uuid NOT NULL, expires_at timestamptz NOT NULL);
-- PL/pgSQL, not LANGUAGE sql: on PostgreSQL 15 a SQL function is parsed and planned
-- again on every call, which would make this baseline slower than it needs to be.
CREATE FUNCTION bench_ticket_pair(u uuid, raw bytea) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v uuid;
BEGIN
    INSERT INTO bench_tickets (hash, user_id, expires_at)
    VALUES (sha256(raw), u, now() + interval '30 seconds');
    DELETE FROM bench_tickets WHERE hash = sha256(raw) RETURNING user_id INTO v;
    RETURN v;
END
$$;

CREATE TABLE bench_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    handler          text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL DEFAULT 'queued',
    run_at           timestamptz NOT NULL DEFAULT now(),
    worker           text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz
);
CREATE INDEX bench_jobs_queued ON bench_jobs (run_at, id) WHERE status = 'queued';
"""


def _proc_ticks(pid: int) -> tuple[int, int, int]:
    """(ppid, own utime+stime, reaped children's cutime+cstime) of pid, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def server_cpu_seconds(postmaster: int) -> float:
    """CPU time used so far by the whole PostgreSQL server: the postmaster, its live
    children, and (through cutime/cstime) every backend that has already exited."""
    _, own, reaped = _proc_ticks(postmaster)
    total = own + reaped
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid, child_own, _ = _proc_ticks(int(entry))
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                total += child_own
    return total / os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pgbench_binary() -> str:
    for cand in (os.path.join(find_bindir(), "pgbench"), "/usr/bin/pgbench",
                 "/usr/lib/postgresql/15/bin/pgbench", shutil.which("pgbench") or ""):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit("pgbench not found (install postgresql-client or postgresql-contrib)")


class Bench:
    def __init__(self, pg: ThrowawayPostgres, duration: int, diagnose: bool) -> None:
        self.pg = pg
        self.url = pg.url(DB)
        self.duration = duration
        self.diagnose = diagnose
        self.pgbench = pgbench_binary()
        self.uid = ""

    # -- setup ------------------------------------------------------------------------
    def setup(self) -> None:
        with psycopg.connect(self.pg.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{DB}"')
        migrate(self.url)
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                           FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
            self.uid = str(c.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()[0])
            c.execute(BASELINE_DDL)
            if self.diagnose:
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else []

    # -- one pgbench run ----------------------------------------------------------------
    def run(self, script: str, clients: int) -> dict[str, float]:
        cmd = [self.pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", "2",
               "-T", str(self.duration), "-f", str(SCRIPTS / script),
               "-h", "127.0.0.1", "-p", str(self.pg.port), "-U", "postgres",
               "-D", f"uid={self.uid}", DB]
        cpu0 = server_cpu_seconds(self.pg.pid)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              timeout=self.duration * 4 + 60)
        time.sleep(0.3)  # let the backends exit and be reaped into the postmaster's cutime
        cpu = server_cpu_seconds(self.pg.pid) - cpu0
        out = proc.stdout + proc.stderr
        if proc.returncode != 0 or "aborted" in out:
            raise RuntimeError(f"pgbench {script} failed ({proc.returncode}):\n{out}")
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        done = re.search(r"number of transactions actually processed: (\d+)", out)
        lat = re.search(r"latency average = ([\d.]+) ms", out)
        if not (tps and done):
            raise RuntimeError(f"cannot parse pgbench output:\n{out}")
        n = int(done.group(1))
        return {"tps": float(tps.group(1)), "transactions": n,
                "latency_ms": float(lat.group(1)) if lat else float("nan"),
                "server_cpu_us_per_txn": round(cpu / max(n, 1) * 1e6, 1)}

    def top_statements(self, title: str) -> None:
        if not self.diagnose:
            return
        rows = self.sql("""SELECT calls, round(total_exec_time::numeric, 1),
                                  round((total_exec_time / greatest(calls, 1) * 1000)::numeric, 1),
                                  left(regexp_replace(query, '\\s+', ' ', 'g'), 110)
                             FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 12""")
        print(f"\n  pg_stat_statements after {title}: calls, total ms, mean us, query")
        for r in rows:
            print(f"  {r[0]:>9} {r[1]:>10} {r[2]:>8}  {r[3]}")
        self.sql("SELECT pg_stat_statements_reset()")

    # -- figures ---------------------------------------------------------------------------
    def rate_limits(self, runs: int) -> list[dict]:
        res: dict[str, list[dict]] = {"rate_check.sql": [], "raw_upsert.sql": [], "select1.sql": []}
        for i in range(runs):
            for script, runs_of in res.items():
                r = self.run(script, 16)
                runs_of.append(r)
                log(f"  run {i + 1} {script:<18} {r['tps']:>10.0f} tps  {r['server_cpu_us_per_txn']:>7.1f} us server CPU/txn")
        keys = self.sql("SELECT count(*) FROM switchboard.rate_limits")[0][0]
        raw_keys = self.sql("SELECT count(*) FROM bench_raw")[0][0]
        assert 0 < keys <= 10_000 and 0 < raw_keys <= 10_000, (keys, raw_keys)
        self.top_statements("rate_check")
        sb, raw, one = (median([r["tps"] for r in res[s]]) for s in res)
        return [
            figure("rate_check (16 clients)", "raw UNLOGGED upsert", sb, raw, 0.8, res["rate_check.sql"],
                   res["raw_upsert.sql"]),
            figure("rate_check (16 clients)", "SELECT 1", sb, one, None, res["rate_check.sql"],
                   res["select1.sql"]),
        ]

    def tickets(self, runs: int) -> list[dict]:
        res: dict[str, list[dict]] = {"ticket_pair.sql": [], "raw_ticket_pair.sql": []}
        for i in range(runs):
            for script, runs_of in res.items():
                r = self.run(script, 16)
                runs_of.append(r)
                log(f"  run {i + 1} {script:<20} {r['tps']:>10.0f} pairs/s  {r['server_cpu_us_per_txn']:>7.1f} us server CPU/pair")
        left = self.sql("SELECT (SELECT count(*) FROM switchboard.tickets), (SELECT count(*) FROM bench_tickets)")[0]
        assert left == (0, 0), f"tickets left behind: {left}"
        self.top_statements("tickets")
        sb, raw = (median([r["tps"] for r in res[s]]) for s in res)
        return [figure("issue+consume ticket pairs (16 clients)", "insert+delete, 1 plpgsql call (UNLOGGED)", sb, raw, None,
                       res["ticket_pair.sql"], res["raw_ticket_pair.sql"])]

    def _fill(self, table: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            if table == "switchboard":
                c.execute("TRUNCATE switchboard.task_runs")
                # the row enqueue() writes, in bulk (enqueue per row would take longer than a run)
                c.execute("""INSERT INTO switchboard.task_runs (handler, args, status, trigger, max_attempts, run_at)
                             SELECT 'bench', '{}', 'queued', 'enqueue', 3, now() - interval '1 minute'
                               FROM generate_series(1, %s)""", (BACKLOG,))
                c.execute("VACUUM ANALYZE switchboard.task_runs")
            else:
                c.execute("TRUNCATE bench_jobs")
                c.execute("""INSERT INTO bench_jobs (handler, args, status, run_at)
                             SELECT 'bench', '{}', 'queued', now() - interval '1 minute'
                               FROM generate_series(1, %s)""", (BACKLOG,))
                c.execute("VACUUM ANALYZE bench_jobs")

    def _check_jobs(self, table: str, transactions: int) -> dict[str, int]:
        name = "switchboard.task_runs" if table == "switchboard" else "bench_jobs"
        succeeded, running, other = self.sql(
            f"""SELECT count(*) FILTER (WHERE status = 'succeeded'),
                       count(*) FILTER (WHERE status = 'running'),
                       count(*) FILTER (WHERE status NOT IN ('succeeded', 'running', 'queued'))
                  FROM {name}""")[0]
        assert succeeded == transactions, f"{name}: {succeeded} succeeded != {transactions} cycles (a double claim?)"
        assert running == 0 and other == 0, f"{name}: {running} running, {other} other after the run"
        assert succeeded < BACKLOG, "backlog ran dry; raise BACKLOG"
        return {"succeeded": succeeded, "duplicates": transactions - succeeded}

    def claims(self, runs: int) -> list[dict]:
        res: dict[str, list[dict]] = {"claim_finish.sql": [], "raw_claim_finish.sql": []}
        for i in range(runs):
            for script, table in (("claim_finish.sql", "switchboard"), ("raw_claim_finish.sql", "raw")):
                self._fill(table)
                r = self.run(script, 8)
                r.update(self._check_jobs(table, r["transactions"]))
                res[script].append(r)
                log(f"  run {i + 1} {script:<20} {r['tps']:>10.0f} cycles/s  {r['server_cpu_us_per_txn']:>7.1f} us server CPU/cycle"
                    f"  ({r['succeeded']} jobs, 0 duplicates)")
        self.top_statements("claim+finish")
        sb, raw = (median([r["tps"] for r in res[s]]) for s in res)
        return [figure("claim_due_task+finish_run cycles (8 clients)", "plain SQL UPDATE...SKIP LOCKED + UPDATE",
                       sb, raw, 0.7, res["claim_finish.sql"], res["raw_claim_finish.sql"])]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def figure(name: str, baseline: str, sb: float, base: float, target: float | None,
           sb_runs: list[dict], base_runs: list[dict]) -> dict:
    ratio = sb / base if base else float("nan")
    sb_cpu = median([r["server_cpu_us_per_txn"] for r in sb_runs])
    base_cpu = median([r["server_cpu_us_per_txn"] for r in base_runs])
    return {"figure": name, "baseline": baseline, "switchboard_tps": round(sb, 1),
            "baseline_tps": round(base, 1), "ratio": round(ratio, 3), "target": target,
            "met": None if target is None else ratio >= target,
            # Server CPU per transaction (all PostgreSQL processes): far less sensitive to
            # other load on the machine than tps; cpu_ratio = baseline / switchboard.
            "switchboard_server_cpu_us": sb_cpu, "baseline_server_cpu_us": base_cpu,
            "cpu_ratio": round(base_cpu / sb_cpu, 3) if sb_cpu else None,
            "switchboard_runs": sb_runs, "baseline_runs": base_runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds per pgbench run (default 10)")
    ap.add_argument("--runs", type=int, default=3, help="runs per side; the median is reported (default 3)")
    ap.add_argument("--only", choices=["rate", "tickets", "claims"], action="append",
                    help="run only these figures (repeatable)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--diagnose", action="store_true",
                    help="load pg_stat_statements (track=all) and print the top statements per figure")
    args = ap.parse_args()

    settings = {"max_connections": "100"}
    if args.diagnose:
        settings.update({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"})
    pg = ThrowawayPostgres(settings=settings)
    started = time.monotonic()
    try:
        b = Bench(pg, args.duration, args.diagnose)
        b.setup()
        version = b.sql("SHOW server_version")[0][0]
        log(f"PostgreSQL {version} on port {pg.port}; pgbench {b.pgbench}; {os.cpu_count()} CPUs")
        figures: list[dict] = []
        only = set(args.only or ["rate", "tickets", "claims"])
        if "rate" in only:
            log("rate_check vs raw upsert vs SELECT 1")
            figures += b.rate_limits(args.runs)
        if "tickets" in only:
            log("ticket pairs vs raw insert+delete")
            figures += b.tickets(args.runs)
        if "claims" in only:
            log("claim+finish vs plain SQL")
            figures += b.claims(args.runs)
    finally:
        pg.stop()

    print()
    print(f"{'figure':<46} {'baseline':<40} {'switchboard':>11} {'baseline':>9} {'ratio':>6}"
          f"  {'target':<13} {'CPU us/txn sb/base':>18} {'cpu ratio':>9}")
    for f in figures:
        tgt = "" if f["target"] is None else f"{'>=' + str(f['target'])} {'met' if f['met'] else 'MISSED'}"
        cpu = f"{f['switchboard_server_cpu_us']:.0f}/{f['baseline_server_cpu_us']:.0f}"
        print(f"{f['figure']:<46} {f['baseline']:<40} {f['switchboard_tps']:>11.0f} {f['baseline_tps']:>9.0f}"
              f" {f['ratio']:>6.2f}  {tgt:<13} {cpu:>18} {f['cpu_ratio']:>9.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "benchmark": "sql",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "postgres": version},
        "pgbench": {"duration_s": args.duration, "runs": args.runs, "mode": "prepared", "threads": 2},
        "figures": figures,
        "wall_s": round(time.monotonic() - started, 1),
    }
    (RESULTS / "sql.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {RESULTS / 'sql.json'} ({out['wall_s']} s)")
    missed = [f["figure"] for f in figures if f["met"] is False]
    if missed:
        print("targets missed: " + "; ".join(missed))
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
