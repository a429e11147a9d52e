#!/usr/bin/env python3
"""The replica curve (issue 18 item 5): what each replica costs Postgres per event.

    python bench/replicas.py [--quick] [--replicas 1,3,10,30] [--rates 0,200,600,2000,4000]
                             [--seconds 5] [--modes notify,ticker] [--gaps 20]
                             [--render results.json]

One throwaway PostgreSQL (the suite's settings plus pg_stat_statements). For
each mode and each replica count N: a fresh database cloned from the migrated
template, N real `switchboard serve` processes (small pools:
SWITCHBOARD_POOL_MIN=1, SWITCHBOARD_POOL_SIZE=2,
SWITCHBOARD_SCHEDULER_CONCURRENCY=1), one receiver process (bench/ws_client.py)
holding IDLE_PER_REPLICA idle sockets per replica (users who are sent nothing)
plus TARGETS target users with one socket each, spread round-robin over the
replicas. The load is pgbench (16 clients, `-R` rate; C clients, because on this
shared box a Python publisher could not keep the rate), one `notify_user` per
transaction to a random target; a Python probe adds PROBE_RATE events/s on 2
connections and records their COMMIT times for the latency. Each rate runs for
--seconds; rate 0 is an idle window.

Modes: `notify` (the default product setting: each publishing transaction
NOTIFYs, every replica wakes on it) and `ticker` (event_ticker.publishers_notify
= false: publishers are silent, replicas poll event_tick() every
SWITCHBOARD_EVENT_TICK_INTERVAL and read on the tick's one NOTIFY).

Attribution: every replica connects as a login role of its own
(sb_rep_<i>, a member of switchboard_app), so pg_stat_statements -- keyed by
role -- counts each replica's statements exactly, server side, and
pg_stat_activity maps each backend pid to its replica for the per-backend CPU.
Measured per step, over the window from the first publication until the last
frame arrived (or 10 s after the last publication):
- events published/s and frames delivered;
- Postgres CPU (utime + stime of every postgres process, /proc, plus the
  postmaster's cutime + cstime: backends that exited in the window) per delivered
  and per published event, and the part spent in the replicas' own backends;
- relay statements per replica per second: relay_read_v2 calls + event_tick
  calls x 3 (the tick runs as BEGIN; SELECT event_tick(); COMMIT in the same
  round trip) + event_window() + the liveness SELECT 1; mean and max over
  replicas; also relay round trips (= relay_read_v2 calls: every wake-up ends
  in exactly one) and every statement the replica's role ran;
- COMMIT -> frame p50 / p99 (the publisher's time.time() after COMMIT, the
  receiver's when the frame is read; same host, same clock).

--gaps G[,G2]: notify mode also runs with SWITCHBOARD_RELAY_READ_GAP = G ms (at
most one event read per G ms per replica; docs/explanation/benchmark-journal.md "Many replicas"),
alternating base (gap 0: reads back to back, as before the gap shipped), gap,
base, gap per replica count. Without --gaps the replicas run the product's
default gap.

Raw results: bench/results/replicas.json; a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ (common puts server/ first)

import psycopg
from common import (
    RESULTS,
    Cluster,
    Proc,
    cpu_seconds,
    child_pids,
    loadavg,
    log,
    machine_info,
    pct,
    replica,
    stop_all,
    write_json,
)
from e2e import Receiver, _latencies, _publish, _spec, _tickets, _users

TARGETS = 30
IDLE_PER_REPLICA = 4
PUBLISHERS = 16
PROBE_RATE = 50.0
REPLICA_ENV = {
    "SWITCHBOARD_POOL_MIN": "1",
    "SWITCHBOARD_POOL_SIZE": "2",
    "SWITCHBOARD_SCHEDULER_CONCURRENCY": "1",
}
SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top",
            "pg_stat_statements.max": "10000"}


def role(i: int) -> str:
    return f"sb_rep_{i}"


# -- measurement helpers (pure: unit-tested in tests/test_bench_replicas.py) ----------------------
def classify(query: str) -> str:
    """Which relay statement a pg_stat_statements query text is (normalized: constants are $n)."""
    q = " ".join(query.split())
    if "relay_read_v2" in q:
        return "read"
    if "event_tick()" in q:
        return "tick"
    if "event_window()" in q:
        return "window"
    if q in ("SELECT $1", "SELECT 1"):
        return "liveness"
    if q.upper() in ("BEGIN", "COMMIT"):
        return q.lower()
    return "other"


def per_replica(rows: list[tuple[str, str, int]], roles: list[str], seconds: float) -> dict[str, Any]:
    """rows: (role, query, calls) from pg_stat_statements. Per replica and per second:
    relay statements (read + 3 x tick + window + liveness), round trips (= reads), ticks,
    everything; then mean and max over ``roles`` (a replica that ran nothing counts as 0)."""
    kinds: dict[str, dict[str, int]] = {r: {} for r in roles}
    for rolname, query, calls in rows:
        if rolname in kinds:
            k = classify(query)
            kinds[rolname][k] = kinds[rolname].get(k, 0) + int(calls)
    stats: dict[str, list[float]] = {"relay": [], "reads": [], "ticks": [], "all": []}
    for r in roles:
        c = kinds[r]
        stats["relay"].append((c.get("read", 0) + 3 * c.get("tick", 0) + c.get("window", 0)
                               + c.get("liveness", 0)) / seconds)
        stats["reads"].append(c.get("read", 0) / seconds)
        stats["ticks"].append(c.get("tick", 0) / seconds)
        stats["all"].append(sum(c.values()) / seconds)
    out: dict[str, Any] = {}
    for k, v in stats.items():
        out[f"{k}_per_s_mean"] = round(sum(v) / len(v), 1) if v else 0.0
        out[f"{k}_per_s_max"] = round(max(v), 1) if v else 0.0
    out["total_relay_per_s"] = round(sum(stats["relay"]), 1)
    return out


def reaped_seconds(pid: int) -> float:
    """cutime + cstime of one process: the CPU of its children that exited and were reaped."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def pgbench_script(targets: list[str]) -> str:
    """One notify_user per transaction to a random target (k = -1: the receiver counts the
    frame, latency comes from the probe's events)."""
    arr = "{" + ",".join(targets) + "}"
    return (f"\\set k random(1, {len(targets)})\n"
            f"SELECT switchboard.notify_user(('{arr}'::uuid[])[:k], 'bench', '{{\"k\": -1}}');\n")


def pgbench_processed(out: str) -> int:
    """'number of transactions actually processed: 9876' (pgbench 15; '9876/10000' with -t)."""
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    if m is None:
        raise RuntimeError(f"pgbench said: {out[-500:]}")
    return int(m.group(1))


def per_event_ms(cpu_s: float, events: int) -> float | None:
    return round(cpu_s / events * 1000, 3) if events > 0 else None


# -- the run ------------------------------------------------------------------------------------
class PgCpu:
    """utime + stime of every postgres process, and of the backends of the given roles."""

    def __init__(self, cluster: Cluster, url: str, roles: list[str]) -> None:
        self.cluster, self.url, self.roles = cluster, url, roles

    def read(self) -> tuple[float, dict[int, float]]:
        pg = self.cluster.pg.pid
        pids = ([pg] + child_pids(pg)) if pg else []
        # + the postmaster's cutime + cstime: the CPU of backends that exited (pgbench's
        # connections end inside the window), added to their parent when it reaps them.
        total = sum(cpu_seconds(p) for p in pids) + (reaped_seconds(pg) if pg else 0.0)
        with psycopg.connect(self.url, autocommit=True) as c:
            mine = [int(r[0]) for r in c.execute(
                "SELECT pid FROM pg_stat_activity WHERE usename = ANY(%s)", (self.roles,)).fetchall()]
        return total, {p: cpu_seconds(p) for p in mine}


def _stmts(cluster: Cluster, db: str) -> list[tuple[str, str, int]]:
    """Every statement run in ``db`` since the last reset, by role (the view lives in
    the postgres database, where the extension is created; its counters are cluster-wide)."""
    with psycopg.connect(cluster.url(), autocommit=True) as c:
        return [(r[0], r[1], int(r[2])) for r in c.execute(
            "SELECT r.rolname, s.query, s.calls FROM pg_stat_statements s "
            "JOIN pg_roles r ON r.oid = s.userid JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s", (db,)).fetchall()]


def _reset(cluster: Cluster) -> None:
    with psycopg.connect(cluster.url(), autocommit=True) as c:
        c.execute("SELECT pg_stat_statements_reset()")


async def _paced(cs: list[psycopg.AsyncConnection], targets: list[str], n: int, rate: float,
                 limit: float, started: dict[int, float]) -> dict[int, float]:
    """Up to n notify_user calls on a fixed schedule (k / rate) over the already open
    connections ``cs``, stopping after ``limit`` seconds if the box cannot keep the rate;
    time.time() right after each COMMIT, keyed by k (and in ``started`` right before the
    call was sent); out[-1] = elapsed seconds."""
    out: dict[int, float] = {}
    it = iter(range(n))
    t0 = time.time() + 0.05

    async def worker(c: psycopg.AsyncConnection) -> None:
        for k in it:
            if time.time() > t0 + limit:
                return
            delay = t0 + k / rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            started[k] = time.time()
            await c.execute("SELECT switchboard.notify_user(%s, 'bench', %s)",
                            (targets[k % len(targets)], json.dumps({"k": k})))
            out[k] = time.time()
    await asyncio.gather(*(worker(c) for c in cs))
    out[-1] = time.time() - t0
    return out


async def _step(cluster: Cluster, db: str, rcv: Receiver, targets: list[str], roles: list[str],
                pids: list[int], rate: float, seconds: float) -> dict[str, Any]:
    """The load is pgbench (C clients: on a saturated box a Python publisher could not keep
    the rate) at rate - PROBE_RATE; a Python probe publishes PROBE_RATE/s more on 2 connections
    and records its COMMIT times, for the latency."""
    url = cluster.url(db)
    meter = PgCpu(cluster, url, roles)
    probe_rate = min(PROBE_RATE, rate)
    cs = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(2)]
    script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
    script.write(pgbench_script(targets))
    script.close()
    secs = max(1, round(seconds))
    try:
        rcv.dump()
        _reset(cluster)
        load0 = loadavg()
        pg0, back0 = meter.read()
        rep0 = sum(cpu_seconds(p) for p in pids)
        t0 = time.time()
        sent: dict[int, float] = {}
        started: dict[int, float] = {}
        n = 0
        if rate:
            bench = None
            if rate > probe_rate:
                bench = await asyncio.create_subprocess_exec(
                    "pgbench", "-n", "-f", script.name, "-c", str(PUBLISHERS), "-j", "2",
                    "-R", str(rate - probe_rate), "-T", str(secs), url,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            sent = await _paced(cs, targets, int(probe_rate * secs), probe_rate, secs * 1.5, started)
            sent.pop(-1)
            n = len(sent)
            if bench is not None:
                said, _ = await bench.communicate()
                n += pgbench_processed(said.decode(errors="replace"))
            pub_elapsed = time.time() - t0
            got = rcv.wait_count(n, 10)
        else:
            await asyncio.sleep(secs)
            pub_elapsed, got = secs, 0
        window = time.time() - t0
        pg1, back1 = meter.read()
        rep1 = sum(cpu_seconds(p) for p in pids)
        rows = _stmts(cluster, db)
        load1 = loadavg()
    finally:
        os.unlink(script.name)
        for c in cs:
            await c.close()
    recs = rcv.dump() if n else []
    lat = _latencies(sent, recs)
    lat_send = _latencies(started, recs)
    pg_cpu = pg1 - pg0
    backends = sum(back1[p] - back0.get(p, back1[p]) for p in back1)
    out: dict[str, Any] = {
        "target_rate": rate, "published": n, "publish_rate": round(n / pub_elapsed, 1) if n else 0.0,
        "delivered": got, "window_s": round(window, 2),
        "pg_cpu_s": round(pg_cpu, 3), "pg_cpu_replica_backends_s": round(backends, 3),
        "replica_procs_cpu_s": round(rep1 - rep0, 3),
        "pg_cpu_ms_per_delivered": per_event_ms(pg_cpu, got),
        "pg_cpu_ms_per_published": per_event_ms(pg_cpu, n),
        "pg_backend_ms_per_delivered": per_event_ms(backends, got),
        "pg_rest_ms_per_published": per_event_ms(pg_cpu - backends, n),
        "replica_procs_ms_per_delivered": per_event_ms(rep1 - rep0, got),
        "pg_cpu_cores": round(pg_cpu / window, 2),
        "load": [load0, load1],
    } | per_replica(rows, roles, window)
    if lat:
        # From the COMMIT's return in the probe (as bench/e2e.py): on a saturated box the
        # probe's loop may record that later than the frame arrives (negative values,
        # counted). From the call's send: an upper bound that includes the publish round trip.
        out |= {"p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2),
                "negative": sum(1 for x in lat if x < 0), "probes": len(lat),
                "send_p50_ms": round(pct(lat_send, 50), 2), "send_p99_ms": round(pct(lat_send, 99), 2)}
    return out


def step(cluster: Cluster, db: str, rcv: Receiver, targets: list[str], roles: list[str], pids: list[int],
         rate: float, seconds: float) -> dict[str, Any]:
    return asyncio.run(_step(cluster, db, rcv, targets, roles, pids, rate, seconds))


def run_n(cluster: Cluster, n_rep: int, mode: str, rates: list[float], seconds: float,
          gap_ms: float | None = None) -> dict[str, Any]:
    """gap_ms: SWITCHBOARD_RELAY_READ_GAP in ms (an event read at most every gap_ms; 0 reads
    back to back); None: the product's default."""
    db = cluster.new_db(f"sb_rep{n_rep}_{mode}_{'d' if gap_ms is None else int(gap_ms * 10)}")
    url = cluster.url(db)
    roles = [role(i) for i in range(n_rep)]
    if mode == "ticker":
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("UPDATE switchboard.event_ticker SET publishers_notify = false")
    targets = _users(url, TARGETS, "target_")
    idle = _users(url, IDLE_PER_REPLICA * n_rep, "idle_")
    log(f"{mode}{f' gap {gap_ms:g} ms' if gap_ms else ''}: starting {n_rep} replica(s)")
    t0 = time.time()
    def make(i: int) -> Proc:
        p = replica(cluster, db, f"rep{n_rep}-{mode}-{i}", env=REPLICA_ENV)
        p.env["DATABASE_URL"] = cluster.url(db, role(i))
        if gap_ms is not None:
            p.env["SWITCHBOARD_RELAY_READ_GAP"] = str(gap_ms / 1000)
        return p

    procs = [make(i) for i in range(n_rep)]
    rcv = None
    steps = []
    try:
        for p in procs:
            p.start(wait=False)
        for i in range(n_rep):
            for attempt in range(3):
                try:
                    procs[i].wait_ready(timeout=240)
                    break
                except RuntimeError:
                    # free_port() is a race: another process on the box may take the port
                    # before uvicorn binds it. Exited: try a new port.
                    child = procs[i].proc
                    if attempt == 2 or child is None or child.poll() is None:
                        raise
                    procs[i].stop()
                    procs[i] = make(i).start(wait=False)
        log(f"   {n_rep} ready in {time.time() - t0:.1f} s")
        tickets = _tickets(url, targets + idle)
        urls = [f"{procs[i % n_rep].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets[:TARGETS])]
        urls += [f"{procs[i % n_rep].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets[TARGETS:])]
        spec = _spec(urls)
        rcv = Receiver("ws", spec)
        os.unlink(spec)
        # Warm-up: every replica's statements prepared, caches filled.
        asyncio.run(_publish(url, "SELECT switchboard.notify_user(%s, 'bench', %s)",
                             lambda k: (targets[k % TARGETS], json.dumps({"k": k})), 500, 500, conns=PUBLISHERS))
        rcv.wait_count(500, 5)
        time.sleep(1)
        for rate in rates:
            s = step(cluster, db, rcv, targets, roles, [p.pid for p in procs], rate, seconds)
            log(f"   N={n_rep} {mode} {rate:.0f}/s: published {s['publish_rate']}/s, delivered "
                f"{s['delivered']}/{s['published']}, PG {s['pg_cpu_ms_per_delivered']} ms/ev "
                f"(replica backends {s['pg_backend_ms_per_delivered']}, rest {s['pg_rest_ms_per_published']}; "
                f"replica processes {s['replica_procs_ms_per_delivered']}) "
                f"({s['pg_cpu_cores']} cores), relay stmts/s/replica {s['relay_per_s_mean']} "
                f"(max {s['relay_per_s_max']}), reads {s['reads_per_s_mean']}/s, ticks {s['ticks_per_s_mean']}/s, "
                f"p50/p99 {s.get('p50_ms')}/{s.get('p99_ms')} ms (from send {s.get('send_p50_ms')}/"
                f"{s.get('send_p99_ms')}), load {s['load']}")
            steps.append(s)
    finally:
        if rcv:
            rcv.close()
        stop_all(procs)
        cluster.drop_db(db)
    return {"replicas": n_rep, "mode": mode, "gap_ms": gap_ms, "sockets": len(targets) + len(idle),
            "steps": steps}


def derived(n_rep: int, s: dict[str, Any]) -> dict[str, float | None]:
    """What one wake-up costs and covers: events per relay read on one replica (every replica
    reads every event, so a replica's reads cover all delivered events) and the replicas'
    backend CPU per read (tick + read round trip, rows included)."""
    reads = s["reads_per_s_mean"] * s["window_s"]          # per replica, in the window
    return {"events_per_read": round(s["delivered"] / reads, 1) if reads and s["delivered"] else None,
            "pg_us_per_read": round(s["pg_cpu_replica_backends_s"] / (reads * n_rep) * 1e6) if reads else None}


def render(results: list[dict[str, Any]]) -> str:
    lines = ["| mode | replicas | target ev/s | published ev/s | PG CPU ms / delivered event "
             "(in the replicas' backends) | relay statements/s per replica, mean (max) | "
             "reads/s per replica | ticks/s per replica | events per read | PG µs per read | "
             "p50 / p99 ms (from send) | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for s in r["steps"]:
            d = derived(r["replicas"], s)
            lost = "" if s["delivered"] == s["published"] else f" ({s['delivered']}/{s['published']} delivered)"
            mode = r["mode"] + (f" + {r['gap_ms']:g} ms gap" if r.get("gap_ms") else "")
            lines.append(
                f"| {mode} | {r['replicas']} | {s['target_rate']:.0f} | {s['publish_rate']:.0f}{lost} | "
                f"{s['pg_cpu_ms_per_delivered'] or '-'} ({s['pg_backend_ms_per_delivered'] or '-'}) | "
                f"{s['relay_per_s_mean']} ({s['relay_per_s_max']}) | {s['reads_per_s_mean']} | "
                f"{s['ticks_per_s_mean']} | {d['events_per_read'] or '-'} | {d['pg_us_per_read'] or '-'} | "
                f"{s.get('p50_ms', '-')} / {s.get('p99_ms', '-')} "
                f"({s.get('send_p50_ms', '-')} / {s.get('send_p99_ms', '-')}) | "
                f"{s['load'][0]:.0f}-{s['load'][1]:.0f} |")
    return "\n".join(lines)


def main() -> None:
    global PUBLISHERS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="1,3,10,30")
    p.add_argument("--rates", default="0,200,600,2000,4000")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--modes", default="notify,ticker")
    p.add_argument("--quick", action="store_true", help="1 and 3 replicas, 0/2,000 ev/s, 3 s windows, notify only")
    p.add_argument("--gaps", default="",
                   help="also run notify mode with the proposed read gap (ms, comma-separated), "
                        "alternating with the unpatched relay per replica count: base, gap, base, gap")
    p.add_argument("--publishers", type=int, default=PUBLISHERS, help="publisher connections")
    p.add_argument("--out", default=str(RESULTS / "replicas.json"))
    p.add_argument("--render", metavar="JSON", help="print the table of an earlier run's JSON and exit")
    a = p.parse_args()
    if a.render:
        print(render(json.loads(Path(a.render).read_text())["results"]))
        return
    if a.quick:
        a.replicas, a.rates, a.seconds, a.modes = "1,3", "0,2000", 3.0, "notify"
    PUBLISHERS = a.publishers
    counts = [int(x) for x in a.replicas.split(",")]
    rates = [float(x) for x in a.rates.split(",")]
    cluster = Cluster(SETTINGS)
    results: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as c:
            for i in range(max(counts)):
                c.execute(f"CREATE ROLE {role(i)} LOGIN IN ROLE switchboard_app")
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        uptime0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        gaps = [float(x) for x in a.gaps.split(",") if x]
        for mode in a.modes.split(","):
            for n in counts:
                if gaps and mode == "notify":
                    for _ in range(2):          # A B A B: the box's load moves under both alike
                        for g in [0.0] + gaps:
                            results.append(run_n(cluster, n, mode, rates, a.seconds, g))
                            write_json(Path(a.out), {"results": results})
                    continue
                results.append(run_n(cluster, n, mode, rates, a.seconds))
                write_json(Path(a.out), {"results": results})
        uptime1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        res = {"results": results, "uptime_before": uptime0, "uptime_after": uptime1,
               "elapsed_s": round(time.time() - t0), "machine": machine_info(cluster),
               "settings": {"targets": TARGETS, "idle_per_replica": IDLE_PER_REPLICA, "publishers": PUBLISHERS,
                            "seconds": a.seconds, "replica_env": REPLICA_ENV}}
    finally:
        cluster.stop()
    write_json(Path(a.out), res)
    print(render(results))
    print(f"\nuptime before: {uptime0}\nuptime after:  {uptime1}\nelapsed {res['elapsed_s']} s")


if __name__ == "__main__":
    main()
