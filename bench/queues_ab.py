#!/usr/bin/env python3
"""Issue 33: figure 3b's job drain with 3 queues and priorities, against today's single
queue, side by side in one run on one cluster.

    python bench/queues_ab.py [--pairs 5] [--jobs 21000] [--order abab|abba] [--quick]
                              [--a-spread 0] [--b-spread 5] [--track-functions] [--pgss]

A (today's single queue): 2 replicas with SWITCHBOARD_SCHEDULER_CONCURRENCY=8 drain M
built-in `noop` jobs, all in the default queue at priority 0 (the replicas serve only
the default queue: the three-argument claim_due_tasks / finish_and_claim).
B (3 queues + priorities): 2 replicas with the same 8 slots each split over three
queues -- SWITCHBOARD_SCHEDULER_CONCURRENCY=2, SWITCHBOARD_QUEUES=qa=3,qb=3,
SWITCHBOARD_HANDLERS=queue_handlers (bench/queue_handlers.py: `bench.qa` in queue qa,
`bench.qb` in qb, both no-ops) -- drain M jobs split evenly over noop, bench.qa and
bench.qb, each at a random priority in -5..5 (enqueue(..., priority => p); the queue
comes from the handler's options), so they claim through the four-argument
claim_due_tasks and the six-argument finish_and_claim.

Each side has a database of its own in the same cluster, and all four replicas stay up
for the whole run, so every drain sees the same idle neighbours. A drain is figure 3b's
(bench/e2e.py _sb_jobs_run): task_runs emptied and analysed, the M jobs enqueued in one
transaction, the clock from its COMMIT to the last finished_at, CPU of the side's
replicas and of every PostgreSQL process over the drain (common.CpuMeter). One
difference: the end is polled through the partial indexes, not with figure 3b's count
of the whole table (see PENDING). Every run is checked: each job succeeded exactly once
(no failure, no retry, no duplicate), in the queue its handler names, at a priority in
the given range; B also reports how well the claims followed the priorities
(corr(priority, started_at) per queue: -1 is perfect) and its rate while every queue
still had work (its 2/3/3 split over equal thirds leaves a default-queue tail on 4 of
16 slots: "all busy").
After one unmeasured warm-up drain per side, the pairs run A B A B ... (--order abba
flips every other pair, which cancels a steady drift); reported per pair and as
medians: jobs/s, CPU per job, and the ratio B/A (the issue's bar: median >= 0.9x).
Decomposition and diagnosis (not the issue's figure): --a-spread / --b-spread set the
sides' priority ranges (B without priorities: --b-spread 0; both with: --a-spread 5);
--track-functions (track_functions = pl; adds 11 s per drain) and --pgss
(pg_stat_statements, nested statements included) add per drain the calls, time and
buffers per job of the claim and finish functions and statements. Raw results:
bench/results/queues_ab.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from common import (
    RESULTS,
    Cluster,
    CpuMeter,
    Proc,
    loadavg,
    log,
    machine_info,
    median,
    replica,
    stop_all,
    write_json,
)
from e2e import _cpu_per_job, _start

QUEUE_OF = {"noop": "default", "bench.qa": "qa", "bench.qb": "qb"}
HANDLERS = {"A": ["noop"], "B": list(QUEUE_OF)}


def enqueue_sql(side: str, spread: int) -> str:
    """A (spread 0): exactly figure 3b's enqueue. B: handler i % 3, the queue from
    handler_options. With a spread, each job's priority is uniform in -spread..spread
    (random(), setseed'd per drain); B's default spread is 5, A's 0 (--a-spread,
    --b-spread: a decomposition of the cost)."""
    prio = f", priority => floor(random() * {2 * spread + 1})::integer - {spread}" if spread else ""
    if side == "A":
        return ("SELECT count(*) FROM (SELECT switchboard.enqueue('noop'" + prio + ")"
                " FROM generate_series(1, %s)) s")
    return ("SELECT count(*) FROM (SELECT switchboard.enqueue((%s::text[])[1 + i %% %s]" + prio + ")"
            " FROM generate_series(0, %s - 1) AS i) s")


def pattern(side: str, weights: tuple[int, ...]) -> list[str]:
    """Job i goes to handler pattern[i % len(pattern)]: B's handlers, each repeated by its
    weight (1,1,1: even thirds, the issue's figure; 2,3,3: in proportion to the slots)."""
    return [h for h, w in zip(HANDLERS[side], weights if side == "B" else (1,)) for _ in range(w)]


# Polled every 100 ms during a drain: through the partial indexes (queued; running with a
# lease), a few buffers. Figure 3b's poll (PROGRESS below, a count of the whole table) took
# 25-40 ms per call at 10,000-21,000 rows on the loaded 2-core box, i.e. CPU that grows
# with the drain's length (so it taxed the slower side more) and a snapshot held for a
# third of every 100 ms, which keeps the claims' dead index entries from being killed.
PENDING = """
SELECT EXISTS (SELECT 1 FROM switchboard.task_runs WHERE status = 'queued' AND handler = ANY (%s))
    OR EXISTS (SELECT 1 FROM switchboard.task_runs
                WHERE status = 'running' AND lease_expires_at IS NOT NULL AND handler = ANY (%s))"""
PROGRESS = """
SELECT count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status IN ('failed', 'abandoned')),
       count(*) FILTER (WHERE attempt > 1),
       count(*), count(DISTINCT id),
       extract(epoch FROM max(finished_at))::float8,
       count(DISTINCT worker)
  FROM switchboard.task_runs WHERE handler = ANY (%s)"""
PER_HANDLER = """
SELECT handler, queue, count(*), count(*) FILTER (WHERE status = 'succeeded'),
       min(priority), max(priority),
       round(corr(priority, extract(epoch FROM started_at))::numeric, 3)::float8,
       extract(epoch FROM max(finished_at))::float8
  FROM switchboard.task_runs WHERE handler = ANY (%s)
 GROUP BY handler, queue ORDER BY handler, queue"""
FUNCS = """
SELECT funcid::regprocedure::text, calls, self_time, total_time
  FROM pg_stat_user_functions
 WHERE schemaname = 'switchboard'
   AND funcname IN ('claim_due_tasks', 'claim_due_task', 'finish_and_claim', 'finish_runs', 'finish_run')"""
PGSS = """
SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time, rows, shared_blks_hit + shared_blks_read
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
 ORDER BY total_exec_time DESC LIMIT 12"""


def drain(cluster: Cluster, db: str, side: str, m: int, pids: list[int], seed: float, spread: int,
          track_functions: bool = False, pgss: bool = False, analyzed_history: bool = False,
          weights: tuple[int, ...] = (1, 1, 1)) -> dict[str, Any]:
    """One figure-3b drain of M jobs (side A or B) by the replicas ``pids``; checked.
    ``analyzed_history``: ANALYZE the table while it holds the previous drain's finished
    runs before emptying it (ANALYZE of an empty table keeps the column statistics), so
    the planner sees what autoanalyze leaves on a production table: nearly every run
    finished, almost none queued."""
    url, handlers = cluster.url(db), HANDLERS[side]
    with psycopg.connect(url, autocommit=True) as c:
        if analyzed_history:
            c.execute("ANALYZE switchboard.task_runs_hot, switchboard.task_runs_history")
        c.execute("TRUNCATE switchboard.task_runs_hot, switchboard.task_runs_history")
        c.execute("VACUUM ANALYZE switchboard.task_runs_hot, switchboard.task_runs_history")
        if track_functions:
            c.execute("SELECT pg_stat_reset()")
    timeout = max(120.0, m / 50)
    with psycopg.connect(url) as c:
        c.execute("SELECT setseed(%s)", (seed,))
        pat = pattern(side, weights)
        n = c.execute(enqueue_sql(side, spread), (m,) if side == "A" else (pat, len(pat), m)).fetchone()[0]
        if n != m:
            raise RuntimeError(f"{side}: enqueued {n} jobs, not {m}")
        if pgss:
            c.execute("SELECT pg_stat_statements_reset()")  # not transactional: the enqueue is left out
        load = loadavg()
        c.commit()
        t0 = time.time()
        meter = CpuMeter(cluster, pids)
        c.autocommit = True
        deadline = t0 + timeout
        while True:
            time.sleep(0.1)
            if not c.execute(PENDING, (handlers, handlers)).fetchone()[0] or time.time() > deadline:
                break
        cpu = meter.stop()
        done, bad, retried, total, distinct, last, workers = c.execute(PROGRESS, (handlers,)).fetchone()
        per_handler = [dict(zip(("handler", "queue", "rows", "succeeded", "min_priority", "max_priority",
                                 "corr_priority_started", "last_finished_s"), r))
                       for r in c.execute(PER_HANDLER, (handlers,)).fetchall()]
        for g in per_handler:
            g["last_finished_s"] = round(g["last_finished_s"] - t0, 3) if g["last_finished_s"] else None
        # The rate while every queue still had work: B's slots are split 2/3/3 over equal
        # shares of jobs, so qa and qb run dry first and the default queue's rest drains
        # on 2 slots per replica (A has no such tail).
        first_dry = min((g["last_finished_s"] for g in per_handler if g["last_finished_s"]), default=None)
        busy = None
        if first_dry:
            n_busy = c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = ANY (%s)"
                               " AND finished_at <= to_timestamp(%s)", (handlers, t0 + first_dry)).fetchone()[0]
            busy = {"seconds": first_dry, "jobs": n_busy, "jobs_per_s": round(n_busy / first_dry, 1)}
        funcs = None
        if track_functions:
            time.sleep(11)  # backends flush their function counters at most every 10 s when idle
            funcs = {f: {"calls": calls, "self_us_per_job": round(self_ms * 1000 / m, 1),
                         "total_us_per_job": round(total_ms * 1000 / m, 1)}
                     for f, calls, self_ms, total_ms in c.execute(FUNCS).fetchall()}
        statements = None
        if pgss:
            statements = [{"query": q[:400], "calls": calls, "us_per_job": round(ms * 1000 / m, 1),
                           "us_per_call": round(ms * 1000 / max(calls, 1), 1), "rows": rows,
                           "blocks_per_call": round(blks / max(calls, 1), 1)}
                          for q, calls, ms, rows, blks in c.execute(PGSS).fetchall()]
    secs = (last or time.time()) - t0
    res = {"side": side, "jobs": m, "succeeded": done, "failed_or_abandoned": bad, "retried": retried,
           "rows": total, "duplicates": total - distinct, "workers": workers,
           "seconds": round(secs, 3), "jobs_per_s": round(done / secs, 1), "loadavg_before": load,
           **cpu, **_cpu_per_job(cpu, done), "per_handler": per_handler,
           "all_queues_busy": busy}
    if funcs is not None:
        res["functions"] = funcs
    if statements is not None:
        res["statements"] = statements
    res["priority_spread"] = spread
    res["weights"] = list(weights) if side == "B" else [1]
    res["problems"] = problems(res, side, m, spread, pat)
    res["ok"] = not res["problems"]
    return res


def problems(res: dict[str, Any], side: str, m: int, spread: int, pat: list[str]) -> list[str]:
    """What is wrong with a drain: every job succeeded exactly once, in its handler's queue
    (A: the default queue), at a priority in -spread..spread."""
    out = []
    if res["succeeded"] != m or res["rows"] != m:
        out.append(f"{res['succeeded']} of {m} jobs succeeded ({res['rows']} rows)")
    for key in ("failed_or_abandoned", "retried", "duplicates"):
        if res[key]:
            out.append(f"{res[key]} {key}")
    share = {h: sum(1 for i in range(m) if pat[i % len(pat)] == h) for h in HANDLERS[side]}
    for g in res["per_handler"]:
        if g["queue"] != QUEUE_OF[g["handler"]]:
            out.append(f"{g['rows']} {g['handler']} jobs in queue {g['queue']}")
        if g["rows"] != share[g["handler"]]:
            out.append(f"{g['rows']} {g['handler']} jobs, not {share[g['handler']]}")
        if g["min_priority"] < -spread or g["max_priority"] > spread:
            out.append(f"{g['handler']} priorities {g['min_priority']}..{g['max_priority']}")
    return out


def wait_options(cluster: Cluster, db: str, timeout: float = 30) -> None:
    """B's enqueue takes each handler's queue from handler_options, written by the
    replicas at start: wait until both bench handlers' rows are there."""
    deadline = time.time() + timeout
    with psycopg.connect(cluster.url(db), autocommit=True) as c:
        while True:
            got = dict(c.execute("SELECT handler, queue FROM switchboard.handler_options"
                                 " WHERE handler IN ('bench.qa', 'bench.qb')").fetchall())
            if got == {"bench.qa": "qa", "bench.qb": "qb"}:
                return
            if time.time() > deadline:
                raise RuntimeError(f"handler options not stored after {timeout:.0f} s: {got}")
            time.sleep(0.2)


def line(r: dict[str, Any], label: str) -> str:
    corr = [g["corr_priority_started"] for g in r["per_handler"] if g["corr_priority_started"] is not None]
    extra = f"  corr(prio, start) {', '.join(f'{x:+.2f}' for x in corr)}" if corr else ""
    if len(r["per_handler"]) > 1:
        extra += ("  queues dry at " + ", ".join(f"{g['queue']} {g['last_finished_s']:.2f}" for g in r["per_handler"])
                  + f" s; all busy {r['all_queues_busy']['jobs_per_s']:,.0f} jobs/s")
    return (f"{label} {r['side']} {r['jobs_per_s']:>8,.0f} jobs/s ({r['seconds']:.2f} s)  CPU/job replicas "
            f"{r['workers_cpu_us_per_job']} us + postgres {r['postgres_cpu_us_per_job']} us  "
            f"{'ok' if r['ok'] else 'BAD: ' + '; '.join(r['problems'])} (load {r['loadavg_before']:.1f}){extra}")


def details(r: dict[str, Any]) -> None:
    for f, v in sorted(r.get("functions", {}).items()):
        log(f"   {f:<70} {v['calls'] / r['jobs']:.3f} calls/job  self {v['self_us_per_job']:7.1f} us/job  "
            f"total {v['total_us_per_job']:7.1f} us/job")
    for st in r.get("statements", []):
        log(f"   pgss {st['us_per_job']:7.1f} us/job {st['us_per_call']:8.1f} us/call {st['calls']:>7} calls "
            f"{st['blocks_per_call']:7.1f} blocks/call  {st['query'][:160]}")


def table(pairs: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    head = ("| pair | A jobs/s | B jobs/s | B/A | A pg µs/job | B pg µs/job | A replicas µs/job "
            "| B replicas µs/job | B/A while every queue has work | checks |")
    out = [head, "|" + "---|" * 10]
    for p in pairs:
        a, b = p["A"], p["B"]
        out.append(f"| {p['pair']} | {a['jobs_per_s']:,.0f} | {b['jobs_per_s']:,.0f} | {p['b_over_a']:.3f} | "
                   f"{a['postgres_cpu_us_per_job']} | {b['postgres_cpu_us_per_job']} | "
                   f"{a['workers_cpu_us_per_job']} | {b['workers_cpu_us_per_job']} | {p['busy_b_over_a']:.3f} | "
                   f"{'ok' if a['ok'] and b['ok'] else 'FAILED'} |")
    s = summary
    out.append(f"| median | {s['A']['jobs_per_s']:,.0f} | {s['B']['jobs_per_s']:,.0f} | "
               f"**{s['b_over_a_median']:.3f}** | {s['A']['postgres_cpu_us_per_job']:.0f} | "
               f"{s['B']['postgres_cpu_us_per_job']:.0f} | {s['A']['workers_cpu_us_per_job']:.0f} | "
               f"{s['B']['workers_cpu_us_per_job']:.0f} | {s['busy_b_over_a_median']:.3f} | "
               f"{'all ok' if s['all_ok'] else 'FAILED'} |")
    return "\n".join(out)


def summarize(pairs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    ratios = [p["b_over_a"] for p in pairs]
    out: dict[str, Any] = {"b_over_a_per_pair": ratios, "b_over_a_median": round(median(ratios), 3),
                           "target": target, "met": median(ratios) >= target,
                           "all_ok": all(p["A"]["ok"] and p["B"]["ok"] for p in pairs),
                           "busy_b_over_a_median": round(median([p["busy_b_over_a"] for p in pairs]), 3)}
    for side in ("A", "B"):
        rs = [p[side] for p in pairs]
        out[side] = {k: median([r[k] for r in rs])
                     for k in ("jobs_per_s", "postgres_cpu_us_per_job", "workers_cpu_us_per_job")}
    for k in ("postgres_cpu_us_per_job", "workers_cpu_us_per_job"):
        out[f"{k}_b_over_a_median"] = round(median([p["B"][k] / p["A"][k] for p in pairs if p["A"][k]]), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=None, help="measured A/B pairs (default 5; --quick 3)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per drain (default 21000; --quick 2000)")
    ap.add_argument("--order", choices=("abab", "abba"), default="abab")
    ap.add_argument("--quick", action="store_true", help="a short run (under a minute): 3 pairs of 2,000 jobs")
    ap.add_argument("--processes", type=int, default=2, help="replicas per side")
    ap.add_argument("--concurrency", type=int, default=8, help="A: slots per replica (default queue)")
    ap.add_argument("--b-default", type=int, default=2, help="B: slots per replica of the default queue")
    ap.add_argument("--b-queues", default="qa=3,qb=3", help="B: SWITCHBOARD_QUEUES")
    ap.add_argument("--track-functions", action="store_true",
                    help="per drain, calls and self time of the claim/finish functions (adds 11 s per drain)")
    ap.add_argument("--pgss", action="store_true",
                    help="per drain, the top statements (pg_stat_statements, track = all, nested ones included)")
    ap.add_argument("--a-spread", type=int, default=0, help="A: priorities in -N..N (default 0: figure 3b)")
    ap.add_argument("--b-spread", type=int, default=5, help="B: priorities in -N..N (default 5)")
    ap.add_argument("--analyzed-history", action="store_true",
                    help="each drain starts with the statistics autoanalyze leaves on a production table "
                         "(the previous drain's finished runs analysed): the planner believes almost no "
                         "run is queued")
    ap.add_argument("--b-weights", default="1,1,1",
                    help="B: shares of the jobs for noop, bench.qa, bench.qb (default even thirds; 2,3,3 "
                         "splits them as the slots are, so no queue drains on its own at the end)")
    ap.add_argument("--b-sql", type=Path, default=None,
                    help="SQL run in B's database before its replicas start: a prototype of a change to "
                         "the claim, measured without touching the tree's functions")
    ap.add_argument("--target", type=float, default=0.9)
    a = ap.parse_args()
    spread = {"A": a.a_spread, "B": a.b_spread}
    weights = tuple(int(x) for x in a.b_weights.split(","))
    if len(weights) != 3 or min(weights) < 1:
        ap.error("--b-weights: three whole numbers of at least 1, e.g. 2,3,3")
    pairs_n = a.pairs or (3 if a.quick else 5)
    m = a.jobs or (2000 if a.quick else 21000)
    b_slots = a.b_default + sum(int(x.split("=")[1]) for x in a.b_queues.split(",") if x.strip())
    if b_slots != a.concurrency:
        log(f"note: B has {b_slots} slots per replica, A {a.concurrency}")
    out: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": loadavg(),
                           "args": vars(a) | {"pairs": pairs_n, "jobs": m}, "pairs": [], "warmup": []}
    cluster = Cluster({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
                      if a.pgss else None)
    procs: dict[str, list[Proc]] = {}
    dbs: dict[str, str] = {}
    env = {"A": {"SWITCHBOARD_SCHEDULER_CONCURRENCY": str(a.concurrency)},
           "B": {"SWITCHBOARD_SCHEDULER_CONCURRENCY": str(a.b_default), "SWITCHBOARD_QUEUES": a.b_queues,
                 "SWITCHBOARD_HANDLERS": "queue_handlers"}}
    try:
        out["machine"] = machine_info(cluster)
        for side in ("A", "B"):
            dbs[side] = cluster.new_db(f"queues_ab_{side.lower()}")
            if a.track_functions:
                with psycopg.connect(cluster.url(), autocommit=True) as c:
                    c.execute(f'ALTER DATABASE "{dbs[side]}" SET track_functions = \'pl\'')
            if a.pgss:
                with psycopg.connect(cluster.url(dbs[side]), autocommit=True) as c:
                    c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            if side == "B" and a.b_sql:
                with psycopg.connect(cluster.url(dbs[side]), autocommit=True) as c:
                    c.execute(a.b_sql.read_text())  # a prototype to measure: trusted input
            procs[side] = _start([replica(cluster, dbs[side], f"queues-ab-{side.lower()}-r{i}", env=env[side])
                                  for i in range(a.processes)])
        wait_options(cluster, dbs["B"])
        time.sleep(2.0)  # start-up jitter of the schedulers is over
        pids = {side: [p.pid for p in ps] for side, ps in procs.items()}
        log(f"{a.processes} replicas per side; A: {env['A']}; B: {env['B']}; {m} jobs per drain, {pairs_n} pairs")
        for side in ("A", "B"):
            r = drain(cluster, dbs[side], side, max(m // 4, 300), pids[side], 0.5, spread[side],
                      a.track_functions, a.pgss, a.analyzed_history, weights)
            out["warmup"].append(r)
            log(line(r, "warm-up"))
        for i in range(pairs_n):
            order = ("A", "B") if a.order == "abab" or i % 2 == 0 else ("B", "A")
            pair: dict[str, Any] = {"pair": i + 1, "order": "".join(order)}
            for side in order:
                pair[side] = drain(cluster, dbs[side], side, m, pids[side], (i + 1) / (pairs_n + 1),
                                   spread[side], a.track_functions, a.pgss, a.analyzed_history, weights)
                log(line(pair[side], f"pair {i + 1}"))
                details(pair[side])
            pair["b_over_a"] = round(pair["B"]["jobs_per_s"] / pair["A"]["jobs_per_s"], 3)
            pair["busy_b_over_a"] = round(pair["B"]["all_queues_busy"]["jobs_per_s"]
                                          / pair["A"]["all_queues_busy"]["jobs_per_s"], 3)
            log(f"pair {i + 1}: B/A {pair['b_over_a']:.3f} (while every queue has work: {pair['busy_b_over_a']:.3f})")
            out["pairs"].append(pair)
    finally:
        for ps in procs.values():
            stop_all(ps)
        cluster.stop()
    out["loadavg_end"] = loadavg()
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out["summary"] = summarize(out["pairs"], a.target)
    s = out["summary"]
    path = RESULTS / "queues_ab.json"
    write_json(path, out)
    print()
    print(table(out["pairs"], s))
    print(f"\nB/A per pair: {', '.join(f'{x:.3f}' for x in s['b_over_a_per_pair'])}; median {s['b_over_a_median']:.3f} "
          f"(target >= {a.target}: {'met' if s['met'] else 'NOT met'}); while every queue has work "
          f"{s['busy_b_over_a_median']:.3f}; CPU per job B/A: postgres "
          f"{s['postgres_cpu_us_per_job_b_over_a_median']:.3f}, replicas {s['workers_cpu_us_per_job_b_over_a_median']:.3f}; "
          f"every job succeeded once: {s['all_ok']}")
    print(f"machine: {out['machine']['nproc']} cores ({out['machine']['cpu_model']}); load {out['loadavg_start']} "
          f"-> {out['loadavg_end']}; raw results: {path}")
    if not s["all_ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
