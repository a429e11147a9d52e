#!/usr/bin/env python3
"""SQL-level benchmark: Switchboard's functions beside their raw-SQL physical limits.

Standalone: starts its own throwaway PostgreSQL, migrates a fresh database with
the real migrations, then drives each figure with pgbench (prepared statements,
``-j 2``), switchboard and baseline interleaved run by run on the same cluster,
and reports the median of the runs:

- ``rate_check`` (16 clients, random key out of 10,000) vs a raw UNLOGGED
  one-row-per-key upsert (target >= 0.8x), with ``SELECT 1`` as the floor;
- ``issue_ticket_v2`` + ``consume_ticket_v2`` pairs (16 clients) vs the same
  insert + delete (and hashing) on an UNLOGGED table, in one bare PL/pgSQL
  call (a single statement cannot insert a row and delete it again);
- ``claim_due_task`` + ``finish_run`` cycles (8 clients, fresh 150k-job backlog
  per run) vs the same two writes as plain SQL on a plain table with the same
  partial index (target >= 0.7x). After every run the table is checked: every
  pgbench transaction finished exactly one distinct job (a job claimed twice
  would leave succeeded < transactions) and nothing is left running.
  In the same alternating runs, two floor rows: the baseline's two UPDATEs in
  SECURITY DEFINER PL/pgSQL functions with claim_due_task's SET clauses on
  switchboard.task_runs (what no function on that table can beat), and the two
  plain UPDATEs on switchboard.task_runs; with ``--before REV`` also the
  functions of an earlier commit. Then the statement-level floor: backend CPU
  per cycle of each FLOOR_VARIANTS entry, one client (see claims_floor).

Usage: python bench/sql.py [--duration 10] [--runs 3] [--only rate|tickets|claims]
                           [--before REV] [--strict] [--diagnose]
       python bench/sql.py --floor [--floor-variants a,b] [--floor-rounds 21]
                           [--floor-calls 600] [--before REV] [--diagnose]
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

-- bench_jobs plus the three task_runs indexes a one-off job's claim and finish write
-- entries to besides the primary key (task_runs_running, task_runs_by_handler,
-- task_runs_finished_v2): the --floor profile's index attribution.
CREATE TABLE bench_jobs_idx (LIKE bench_jobs INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE bench_jobs_idx ADD PRIMARY KEY (id);
CREATE INDEX bench_jobs_idx_queued ON bench_jobs_idx (run_at, id) WHERE status = 'queued';
CREATE INDEX bench_jobs_idx_running ON bench_jobs_idx (lease_expires_at)
    WHERE status = 'running' AND lease_expires_at IS NOT NULL;
CREATE INDEX bench_jobs_idx_handler ON bench_jobs_idx (handler, id DESC);
CREATE INDEX bench_jobs_idx_finished ON bench_jobs_idx (finished_at)
    WHERE status IN ('succeeded', 'failed', 'abandoned', 'cancelled');

-- Copies of switchboard.task_runs (its nine indexes and two CHECK constraints, no
-- foreign key) for the --floor profile's attribution: as is; without the CHECK
-- constraints (PostgreSQL 15 re-reads each CHECK from its stored text, stringToNode,
-- and plans it again in every INSERT/UPDATE statement: the 6-element status list is
-- ~100 bytes of array constant); and with the status CHECK as a call of an IMMUTABLE
-- PL/pgSQL function (a small stored expression; the function stays compiled per session).
CREATE TABLE bench_runs_copy (LIKE switchboard.task_runs INCLUDING ALL);
CREATE TABLE bench_runs_nocheck (LIKE switchboard.task_runs INCLUDING ALL);
ALTER TABLE bench_runs_nocheck DROP CONSTRAINT task_runs_status_check,
                               DROP CONSTRAINT task_runs_attempt_check;
CREATE TABLE bench_runs_statuscheck (LIKE switchboard.task_runs INCLUDING ALL);
ALTER TABLE bench_runs_statuscheck DROP CONSTRAINT task_runs_attempt_check;
CREATE TABLE bench_runs_onecheck (LIKE switchboard.task_runs INCLUDING ALL);
ALTER TABLE bench_runs_onecheck DROP CONSTRAINT task_runs_attempt_check, DROP CONSTRAINT task_runs_status_check,
    ADD CONSTRAINT bench_runs_onecheck_check CHECK (
        status IN ('queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled')
        AND attempt >= 1 AND max_attempts >= 1);
CREATE FUNCTION bench_run_status_ok(s text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN s IN ('queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled');
END $$;
CREATE TABLE bench_runs_fcheck (LIKE switchboard.task_runs INCLUDING ALL);
ALTER TABLE bench_runs_fcheck DROP CONSTRAINT task_runs_status_check,
    ADD CONSTRAINT bench_runs_fcheck_status_check CHECK (bench_run_status_ok(status));
-- ... and with the status rule as a domain: a domain's CHECK is parsed and planned once
-- per session (the type cache), then only compiled per statement.
CREATE DOMAIN bench_run_status AS text
    CHECK (VALUE IN ('queued', 'running', 'succeeded', 'failed', 'abandoned', 'cancelled'));
CREATE TABLE bench_runs_domain (LIKE switchboard.task_runs INCLUDING ALL);
ALTER TABLE bench_runs_domain DROP CONSTRAINT task_runs_status_check;
ALTER TABLE bench_runs_domain ALTER COLUMN status TYPE bench_run_status;
"""


# The statement-level floor of figure 3a (``--floor``): the same two writes as the
# plain-SQL baseline, wrapped the way a Switchboard function must be (SECURITY DEFINER
# PL/pgSQL, the run row returned), with and without the SET clauses claim_due_task
# carries, on the baseline's table and on switchboard.task_runs (its nine indexes).
# Nothing in them validates, looks for ticks, expired leases or paused handlers.
FLOOR_DDL = """
CREATE OR REPLACE FUNCTION bench_claim_{tag}(worker text, lease interval DEFAULT '60 seconds')
RETURNS SETOF {table} LANGUAGE plpgsql SECURITY DEFINER {sets} AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {table}
       SET status = 'running', worker = bench_claim_{tag}.worker,
           lease_expires_at = now() + bench_claim_{tag}.lease, started_at = now()
     WHERE id = (SELECT q.id FROM {table} q
                  WHERE q.status = 'queued' AND q.run_at <= now()
                  ORDER BY q.run_at, q.id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING *;
END $$;
CREATE OR REPLACE FUNCTION bench_finish_{tag}(run_id bigint, worker text, ok boolean)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER {sets} AS $$
#variable_conflict use_column
BEGIN
    UPDATE {table}
       SET status = CASE WHEN bench_finish_{tag}.ok THEN 'succeeded' ELSE 'failed' END,
           finished_at = now(), lease_expires_at = NULL
     WHERE id = bench_finish_{tag}.run_id AND worker = bench_finish_{tag}.worker AND status = 'running';
    RETURN FOUND;
END $$;
"""
SETS_ALL = ("SET search_path = pg_catalog, pg_temp SET enable_seqscan = off "
            "SET enable_bitmapscan = off")
SETS_PATH = "SET search_path = pg_catalog, pg_temp"
FLOOR_FUNCS = [  # (tag, table, SET clauses)
    ("set3", "public.bench_jobs", SETS_ALL),
    ("set1", "public.bench_jobs", SETS_PATH),
    ("set0", "public.bench_jobs", ""),
    ("tr_set3", "switchboard.task_runs", SETS_ALL),
    ("dom_set3", "public.bench_runs_domain", SETS_ALL),
]
RAW_CLAIM = """UPDATE {table}
   SET status = 'running', worker = %s, lease_expires_at = now() + interval '60 seconds', started_at = now()
 WHERE id = (SELECT id FROM {table} WHERE status = 'queued' AND run_at <= now()
              ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id"""
RAW_FINISH = """UPDATE {table} SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
 WHERE id = %s AND worker = %s AND status = 'running'"""
def _plain(table: str, what: str) -> tuple[str, str, str]:
    """The plain-SQL claim and finish on `table` (the floor's baseline shape)."""
    return RAW_CLAIM.format(table=table), RAW_FINISH.format(table=table), what


# name -> (claim statement taking the worker, finish statement taking (id, worker), what it is)
FLOOR_VARIANTS: dict[str, tuple[str, str, str]] = {
    "claim_due_task+finish_run": (
        "SELECT id FROM switchboard.claim_due_task(%s)", "SELECT switchboard.finish_run(%s, %s, true)",
        "Switchboard's functions"),
    "plain_sql": _plain("bench_jobs", "the baseline: two plain UPDATEs on bench_jobs (2 indexes)"),
    "plain_sql_3_more_indexes": _plain("bench_jobs_idx",
        "the baseline on bench_jobs_idx: bench_jobs plus task_runs' running, by_handler and finished indexes"),
    "plain_sql_on_task_runs_copy": _plain("bench_runs_copy",
        "the same on a copy of task_runs (LIKE ... INCLUDING ALL: 9 indexes, 2 CHECKs, no foreign key)"),
    "plain_sql_on_task_runs_copy_no_checks": _plain("bench_runs_nocheck",
        "the copy without its two CHECK constraints"),
    "plain_sql_on_task_runs_copy_status_check_only": _plain("bench_runs_statuscheck",
        "the copy with the status CHECK only (attempt CHECK dropped)"),
    "plain_sql_on_task_runs_copy_one_check": _plain("bench_runs_onecheck",
        "the copy with its two CHECKs merged into one (the same rule)"),
    "plain_sql_on_task_runs_copy_function_check": _plain("bench_runs_fcheck",
        "the copy with the status CHECK as an IMMUTABLE PL/pgSQL function call"),
    "plain_sql_on_task_runs_copy_domain": _plain("bench_runs_domain",
        "the copy with the status CHECK as a domain (attempt CHECK kept)"),
    "definer_3_sets_on_task_runs_copy_domain": (
        "SELECT id FROM bench_claim_dom_set3(%s)", "SELECT bench_finish_dom_set3(%s, %s, true)",
        "the 3-SET definer functions on that domain copy"),
    "plain_sql_on_task_runs": _plain("switchboard.task_runs",
        "the same two UPDATEs on switchboard.task_runs (9 indexes)"),
    "definer_3_sets": ("SELECT id FROM bench_claim_set3(%s)", "SELECT bench_finish_set3(%s, %s, true)",
                       "the plain UPDATEs in SECURITY DEFINER PL/pgSQL, SET search_path + enable_seqscan + "
                       "enable_bitmapscan"),
    "definer_1_set": ("SELECT id FROM bench_claim_set1(%s)", "SELECT bench_finish_set1(%s, %s, true)",
                      "the same with SET search_path only"),
    "definer_no_set": ("SELECT id FROM bench_claim_set0(%s)", "SELECT bench_finish_set0(%s, %s, true)",
                       "the same without SET clauses"),
    "definer_3_sets_on_task_runs": (
        "SELECT id FROM bench_claim_tr_set3(%s)", "SELECT bench_finish_tr_set3(%s, %s, true)",
        "the 3-SET functions on switchboard.task_runs: the floor of any function-based design"),
    "before_v0017": ("SELECT id FROM bench_before_claim_due_task(%s)",
                     "SELECT bench_before_finish_run(%s, %s, true)",
                     "claim_due_task + finish_run as of --before REV, installed as public.bench_before_*"),
    "select_1_twice": ("SELECT 1 WHERE %s::text IS NOT NULL", "SELECT 1 WHERE %s::bigint IS NOT NULL AND %s::text IS NOT NULL",
                       "two SELECT 1 round trips: the protocol floor"),
}


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


# What the claims figure's floor profile runs by default (--floor alone runs them all).
FLOOR_DEFAULT = ["claim_due_task+finish_run", "before_v0017", "plain_sql", "plain_sql_on_task_runs",
                 "plain_sql_on_task_runs_copy_no_checks", "definer_3_sets", "definer_no_set",
                 "definer_3_sets_on_task_runs", "select_1_twice"]


def floor_table(variant: str) -> str | None:
    """The queue a floor variant claims from, as a _fill() key (None: no queue)."""
    text = " ".join(FLOOR_VARIANTS[variant][:2])
    for tag, table, _ in FLOOR_FUNCS:
        if f"bench_claim_{tag}(" in text:
            text = table
    if m := re.search(r"\b(bench_runs_\w+|bench_jobs_idx)\b", text):
        return "raw_idx" if m.group(1) == "bench_jobs_idx" else m.group(1)
    if "bench_jobs" in text:
        return "raw"
    if "switchboard" in text or "bench_before_" in text:
        return "switchboard"
    return None


def before_ddl(rev: str) -> str:
    """claim_due_task and finish_run as of git revision rev, renamed public.bench_before_*,
    to measure them beside the current ones in the same run."""
    src = subprocess.run(["git", "show", f"{rev}:db/functions/20_scheduler.sql"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    out = []
    for fn in ("claim_due_task", "finish_run"):
        m = re.search(rf"CREATE OR REPLACE FUNCTION switchboard\.{fn}\(.*?\n\$\$;\n", src, re.S)
        if not m:
            raise SystemExit(f"{rev}: no switchboard.{fn} in db/functions/20_scheduler.sql")
        body = m.group(0).replace(f"switchboard.{fn}(", f"public.bench_before_{fn}(")
        out.append(re.sub(rf"\b{fn}\.", f"bench_before_{fn}.", body))
    return "\n".join(out)


def _backend_cpu(pid: int) -> float:
    """CPU seconds used so far by one backend, in nanoseconds' resolution
    (/proc/<pid>/schedstat; /proc/<pid>/stat counts 10 ms ticks)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return _proc_ticks(pid)[1] / os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pgbench_binary() -> str:
    for cand in (os.path.join(find_bindir(), "pgbench"), "/usr/bin/pgbench",
                 "/usr/lib/postgresql/15/bin/pgbench", shutil.which("pgbench") or ""):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit("pgbench not found (install postgresql-client or postgresql-contrib)")


class Bench:
    def __init__(self, pg: ThrowawayPostgres, duration: int, diagnose: bool, before: str | None = None) -> None:
        self.pg = pg
        self.before = before
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
            for tag, table, sets in FLOOR_FUNCS:
                c.execute(FLOOR_DDL.format(tag=tag, table=table, sets=sets))
            if self.before:
                c.execute(before_ddl(self.before))
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

    def _fill(self, table: str, rows: int = BACKLOG) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            if table == "switchboard" or table.startswith("bench_runs"):
                name = "switchboard.task_runs" if table == "switchboard" else table
                c.execute(f"TRUNCATE {name}")
                # the row enqueue() writes, in bulk (enqueue per row would take longer than a run)
                c.execute(f"""INSERT INTO {name} (handler, args, status, trigger, max_attempts, run_at)
                              SELECT 'bench', '{{}}', 'queued', 'enqueue', 3, now() - interval '1 minute'
                                FROM generate_series(1, %s)""", (rows,))
                c.execute(f"VACUUM ANALYZE {name}")
            else:
                name = "bench_jobs_idx" if table == "raw_idx" else "bench_jobs"
                c.execute(f"TRUNCATE {name}")
                c.execute(f"""INSERT INTO {name} (handler, args, status, run_at)
                              SELECT 'bench', '{{}}', 'queued', now() - interval '1 minute'
                                FROM generate_series(1, %s)""", (rows,))
                c.execute(f"VACUUM ANALYZE {name}")

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
        scripts = [("claim_finish.sql", "switchboard"), ("raw_claim_finish.sql", "raw"),
                   ("floor_claim_finish.sql", "switchboard"), ("raw_claim_finish_task_runs.sql", "switchboard")]
        if self.before:
            scripts.insert(1, ("before_claim_finish.sql", "switchboard"))
        res: dict[str, list[dict]] = {s: [] for s, _ in scripts}
        for i in range(runs):
            for script, table in scripts:
                self._fill(table)
                r = self.run(script, 8)
                r.update(self._check_jobs(table, r["transactions"]))
                res[script].append(r)
                log(f"  run {i + 1} {script:<30} {r['tps']:>10.0f} cycles/s  {r['server_cpu_us_per_txn']:>7.1f} us server CPU/cycle"
                    f"  ({r['succeeded']} jobs, 0 duplicates)")
        self.top_statements("claim+finish")
        tps = {s: median([r["tps"] for r in res[s]]) for s in res}
        raw, base = tps["raw_claim_finish.sql"], res["raw_claim_finish.sql"]
        out = [figure("claim_due_task+finish_run cycles (8 clients)", "plain SQL UPDATE...SKIP LOCKED + UPDATE",
                      tps["claim_finish.sql"], raw, 0.7, res["claim_finish.sql"], base)]
        if self.before:
            out.append(figure(f"claim_due_task+finish_run as of {self.before} (8 clients)", "plain SQL",
                              tps["before_claim_finish.sql"], raw, None, res["before_claim_finish.sql"], base))
        # The floor rows: what no function on task_runs can beat (see FLOOR_DDL).
        out.append(figure("claim+finish floor: the plain UPDATEs in SECURITY DEFINER functions on task_runs (8 clients)",
                          "plain SQL", tps["floor_claim_finish.sql"], raw, None,
                          res["floor_claim_finish.sql"], base))
        out.append(figure("claim+finish floor: the plain UPDATEs on task_runs, no function (8 clients)", "plain SQL",
                          tps["raw_claim_finish_task_runs.sql"], raw, None,
                          res["raw_claim_finish_task_runs.sql"], base))
        return out

    def claims_floor(self, calls: int, rounds: int, variants: list[str] | None = None) -> dict:
        """Backend CPU per claim+finish cycle (from /proc/<backend pid>, so other load on
        the box moves it far less than tps), one client, prepared statements, autocommit
        (one transaction per statement, as in the pgbench figure), each variant in turn
        in every round (A B C ... A B C ...): the statement-level floor. The median over
        rounds. Every claim must return a run and every finish must report success."""
        names = variants or [n for n in FLOOR_VARIANTS if self.before or n != "before_v0017"]
        unknown = set(names) - set(FLOOR_VARIANTS)
        if unknown:
            raise SystemExit(f"unknown --floor-variants {sorted(unknown)}; known: {', '.join(FLOOR_VARIANTS)}")
        tables = {floor_table(n) for n in names} - {None}
        for table in sorted(t for t in tables if t):
            self._fill(table, max(BACKLOG, (calls * rounds + 100) * sum(floor_table(n) == table for n in names)))
        out: dict[str, list[float]] = {n: [] for n in names}
        diag: dict[str, list] = {}
        with psycopg.connect(self.url, autocommit=True) as c:
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
            worker = "floor-worker"
            for rnd in range(rounds):
                for name in names:
                    claim, finish, _ = FLOOR_VARIANTS[name]
                    n_finish = finish.count("%s")
                    # warm the plan caches of this variant before the clock starts
                    for _ in range(20 if rnd == 0 else 0):
                        rid = c.execute(claim, (worker,), prepare=True).fetchone()[0]
                        c.execute(finish, (rid, worker)[:n_finish], prepare=True)
                    if self.diagnose:
                        c.execute("SELECT pg_stat_statements_reset()")
                    t = _backend_cpu(pid)
                    for _ in range(calls):
                        row = c.execute(claim, (worker,), prepare=True).fetchone()
                        assert row is not None and row[0] is not None, f"{name}: the backlog ran dry"
                        done = c.execute(finish, (row[0], worker)[:n_finish], prepare=True)
                        if done.description:
                            assert done.fetchone()[0] in (True, 1), f"{name}: finish did not finish {row[0]}"
                        else:
                            assert done.rowcount == 1, f"{name}: finish did not finish {row[0]}"
                    out[name].append((_backend_cpu(pid) - t) / calls * 1e6)
                    if self.diagnose and rnd == rounds - 1:
                        diag[name] = [[int(r[0]), float(r[1]), r[2]] for r in self.sql(
                            """SELECT calls, round((total_exec_time / greatest(calls, 1) * 1000)::numeric, 1),
                                      left(regexp_replace(query, '\\s+', ' ', 'g'), 150)
                                 FROM pg_stat_statements WHERE calls >= %s
                                 ORDER BY total_exec_time DESC LIMIT 15""", (calls,))]
                log("  round " + str(rnd + 1) + ": " + "  ".join(f"{n} {out[n][-1]:.1f}" for n in names))
        med = {n: round(statistics.median(v), 1) for n, v in out.items()}
        res: dict[str, Any] = {"backend_cpu_us_per_cycle": med, "calls": calls, "rounds": rounds,
                               "runs_us": {n: [round(x, 1) for x in v] for n, v in out.items()},
                               "what": {n: FLOOR_VARIANTS[n][2] for n in names}}
        if "plain_sql" in out:
            # plain / variant within each round (measured minutes apart at most), then the
            # median: the box's load moves both sides of a pair together.
            res["cpu_ratio_plain_over"] = {
                n: round(statistics.median(p / v for p, v in zip(out["plain_sql"], out[n]) if v), 3)
                for n in names}
        if diag:
            res["statements"] = diag
        return res


def floor_row(floor: dict[str, Any]) -> str | None:
    """Figure 3a's floor as one BENCHMARKS-style table row (like scale.py's rate_check floor)."""
    med, ratio = floor["backend_cpu_us_per_cycle"], floor.get("cpu_ratio_plain_over", {})
    need = ("claim_due_task+finish_run", "plain_sql", "definer_3_sets_on_task_runs", "plain_sql_on_task_runs")
    if not all(n in med for n in need):
        return None
    one = f"; two SELECT 1 {med['select_1_twice']} µs" if "select_1_twice" in med else ""
    sb, fl = ratio["claim_due_task+finish_run"], ratio["definer_3_sets_on_task_runs"]
    return (f"| claim+finish statement-level floor: backend CPU per cycle, one client, prepared | "
            f"claim_due_task+finish_run {med['claim_due_task+finish_run']} µs | plain SQL {med['plain_sql']} µs; "
            f"the same UPDATEs on task_runs {med['plain_sql_on_task_runs']} µs; in SECURITY DEFINER PL/pgSQL "
            f"with the 3 SET clauses on task_runs (the function floor) {med['definer_3_sets_on_task_runs']} µs{one} | "
            f"plain/claim+finish {sb}, plain/function floor {fl}, plain/task_runs UPDATEs "
            f"{ratio['plain_sql_on_task_runs']} | ≥ 0.7 | {'yes' if sb >= 0.7 else '**no**'} |")


def print_floor(floor: dict) -> None:
    med, ratio = floor["backend_cpu_us_per_cycle"], floor.get("cpu_ratio_plain_over", {})
    print(f"\n{'variant':<44} {'backend CPU us/cycle':>20} {'plain/variant':>13}  runs"
          "  (median over rounds; plain/variant is the median of the per-round ratios)")
    for n, v in med.items():
        print(f"{n:<44} {v:>20.1f} {ratio.get(n, float('nan')):>13.3f}  {floor['runs_us'][n]}")
    row = floor_row(floor)
    if row:
        print("\n" + row)
    for n, rows in floor.get("statements", {}).items():
        print(f"\n  pg_stat_statements, {n} (last round): calls, mean us, query")
        for r in rows:
            print(f"  {r[0]:>8} {r[1]:>8}  {r[2]}")


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
    ap.add_argument("--before", metavar="REV",
                    help="also measure claim_due_task + finish_run as of this git revision, side by side")
    ap.add_argument("--floor", action="store_true",
                    help="figure 3a's statement-level floor: backend CPU per claim+finish cycle of each "
                         "variant in FLOOR_VARIANTS, one client (instead of the pgbench figures)")
    ap.add_argument("--floor-calls", type=int, default=600, help="cycles per variant per round (default 600)")
    ap.add_argument("--floor-rounds", type=int, default=21, help="rounds, the median is reported (default 5)")
    ap.add_argument("--floor-variants", help="comma-separated subset of FLOOR_VARIANTS")
    ap.add_argument("--diagnose", action="store_true",
                    help="load pg_stat_statements (track=all) and print the top statements per figure")
    args = ap.parse_args()

    settings = {"max_connections": "100"}
    if args.diagnose:
        settings.update({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"})
    pg = ThrowawayPostgres(settings=settings)
    started = time.monotonic()
    try:
        b = Bench(pg, args.duration, args.diagnose, args.before)
        b.setup()
        version = b.sql("SHOW server_version")[0][0]
        log(f"PostgreSQL {version} on port {pg.port}; pgbench {b.pgbench}; {os.cpu_count()} CPUs")
        figures: list[dict] = []
        if args.floor:
            log("figure 3a statement-level floor: backend CPU per claim+finish cycle, one client")
            floor = b.claims_floor(args.floor_calls, args.floor_rounds,
                                   args.floor_variants.split(",") if args.floor_variants else None)
            print_floor(floor)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "sql_floor.json").write_text(json.dumps(floor, indent=2) + "\n")
            print(f"wrote {RESULTS / 'sql_floor.json'}")
            return 0
        only = set(args.only or ["rate", "tickets", "claims"])
        if "rate" in only:
            log("rate_check vs raw upsert vs SELECT 1")
            figures += b.rate_limits(args.runs)
        if "tickets" in only:
            log("ticket pairs vs raw insert+delete")
            figures += b.tickets(args.runs)
        floor = None
        if "claims" in only:
            log("claim+finish vs plain SQL")
            figures += b.claims(args.runs)
            log("figure 3a statement-level floor: backend CPU per claim+finish cycle, one client")
            floor = b.claims_floor(args.floor_calls, args.floor_rounds,
                                   [n for n in FLOOR_DEFAULT if args.before or n != "before_v0017"])
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
        "floor_3a": floor,
        "wall_s": round(time.monotonic() - started, 1),
    }
    (RESULTS / "sql.json").write_text(json.dumps(out, indent=2) + "\n")
    if floor:
        print_floor(floor)
    print(f"\nwrote {RESULTS / 'sql.json'} ({out['wall_s']} s)")
    missed = [f["figure"] for f in figures if f["met"] is False]
    if missed:
        print("targets missed: " + "; ".join(missed))
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
