"""Delivery latency, Switchboard vs the bare relay, ALTERNATING in one run (issue 18's target).

    python bench/latency_ab.py [--users 1000] [--replicas 3] [--rate 1000] [--seconds 3]
                               [--pairs 3] [--fsync] [--settings k=v,...] [--out FILE]

Figure 5 of bench/run.py measures every Switchboard run and then every bare run, so
the two halves see different moments of a shared, noisy box. Here both stacks run
side by side for the whole benchmark (N replicas of `switchboard serve` and N bare
Falcon apps from bench/bare_app.py, on one throwaway cluster, the same sockets per
stack) and the runs alternate S B S B ...: each pair is one ratio. Per pair it
prints p50/p99 of COMMIT -> frame for both, the p99 ratio, and the 1-minute load.
The summary is the median over pairs of each figure and of the per-pair ratios.

Publishers: `notify_user(<user k mod N>, 'bench', {"k": k})` against
`pg_notify('bare_events', {"u": .., "k": k})`, autocommit, a fixed schedule of
rate/s over 4 connections (bench/e2e.py's _publish). --fsync runs the cluster with
fsync and synchronous_commit on (durable: the tick's COMMIT pays a flush).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import APP_LOGIN, BENCH, RESULTS, Cluster, Proc, free_port, loadavg, log, replica, stop_all, write_json
from e2e import Receiver, _latencies, _publish, _spec, _start, _summary, _tickets, _users


def _one(rcv: Receiver, url: str, sql: str, params: Any, n: int, rate: float) -> dict[str, Any]:
    sent = asyncio.run(_publish(url, sql, params, n, rate))
    elapsed = sent.pop(-1)
    got = rcv.wait_count(n, 15)
    lat = _latencies(sent, rcv.dump())
    return _summary(lat) | {"sent": n, "received": got, "achieved_rate": round(n / elapsed, 1),
                            "load1": loadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--fsync", action="store_true", help="fsync + synchronous_commit on")
    ap.add_argument("--settings", default="", help="extra postgres settings k=v,k=v")
    ap.add_argument("--env", default="", help="extra replica env K=V,K=V")
    ap.add_argument("--pgss", action="store_true",
                    help="load pg_stat_statements (track=all) and report the top statements by total time")
    ap.add_argument("--out", default=str(RESULTS / "latency_ab.json"))
    a = ap.parse_args()
    settings: dict[str, str] = {}
    if a.pgss:
        settings.update({"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"})
    if a.fsync:
        settings.update({"fsync": "on", "synchronous_commit": "on"})
    for kv in filter(None, a.settings.split(",")):
        k, _, v = kv.partition("=")
        settings[k] = v
    renv = dict(kv.split("=", 1) for kv in filter(None, a.env.split(",")))
    cluster = Cluster.__new__(Cluster)
    if settings:
        # Cluster() with non-default settings: same steps as Cluster.__init__.
        import psycopg
        from switchboard.migrate import migrate
        from switchboard.pgtest import ThrowawayPostgres

        from common import TEMPLATE

        cluster.pg = ThrowawayPostgres(settings)
        cluster._n = 0
        with psycopg.connect(cluster.pg.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
            c.execute(f'CREATE DATABASE "{TEMPLATE}"')
            cluster.version = c.execute("SHOW server_version").fetchone()[0]
        migrate(cluster.pg.url(TEMPLATE))
        with psycopg.connect(cluster.pg.url(), autocommit=True) as c:
            c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
    else:
        cluster = Cluster()
    n = int(a.rate * a.seconds)
    out: dict[str, Any] = {"users": a.users, "replicas": a.replicas, "rate": a.rate, "seconds": a.seconds,
                           "settings": settings, "replica_env": renv, "pairs": [],
                           "load_start": loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    procs: list[Proc] = []
    bares: list[Proc] = []
    rs = rb = None
    try:
        db = cluster.new_db("sb_lat")
        url = cluster.url(db)
        ids = _users(url, a.users, "lat_u")
        if a.pgss:
            import psycopg

            with psycopg.connect(url, autocommit=True) as c:
                c.execute("CREATE EXTENSION pg_stat_statements")
        procs = [replica(cluster, db, f"lat-r{i}", env=renv) for i in range(a.replicas)]
        env = dict(os.environ, DATABASE_URL=cluster.url(db, APP_LOGIN))
        for i in range(a.replicas):
            port = free_port()
            bares.append(Proc([sys.executable, str(BENCH / "bare_app.py"), "--port", str(port), "--listen"],
                              env, port, f"lat-bare{i}"))
        _start(procs + bares)
        out["pids"] = {"switchboard": [p.pid for p in procs], "bare": [p.pid for p in bares]}
        tickets = _tickets(url, ids)
        spec = _spec([f"{procs[i % a.replicas].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets)])
        rs = Receiver("ws", spec)
        os.unlink(spec)
        spec = _spec([f"{bares[i % a.replicas].ws_base}/ws?u={i}" for i in range(a.users)], hello=False)
        rb = Receiver("ws", spec)
        os.unlink(spec)
        log(f"{a.users} sockets per stack on {a.replicas} replicas each; {a.rate:.0f} ev/s x {a.seconds} s; "
            f"{a.pairs} alternating pairs; settings {settings or 'bench default (fsync off)'}")
        time.sleep(1.0)
        # A warm-up of each (first frames, JIT-less but caches, connections).
        _one(rs, url, "SELECT switchboard.notify_user(%s, 'bench', %s)",
             lambda k: (ids[k % a.users], json.dumps({"k": k})), min(n, 300), a.rate)
        _one(rb, url, "SELECT pg_notify('bare_events', %s)",
             lambda k: (json.dumps({"u": str(k % a.users), "k": k}),), min(n, 300), a.rate)
        for p in range(a.pairs):
            s = _one(rs, url, "SELECT switchboard.notify_user(%s, 'bench', %s)",
                     lambda k: (ids[k % a.users], json.dumps({"k": k})), n, a.rate)
            time.sleep(0.5)
            b = _one(rb, url, "SELECT pg_notify('bare_events', %s)",
                     lambda k: (json.dumps({"u": str(k % a.users), "k": k}),), n, a.rate)
            time.sleep(0.5)
            pair = {"switchboard": s, "bare": b, "ratio_p50": round(s["p50_ms"] / b["p50_ms"], 2),
                    "ratio_p99": round(s["p99_ms"] / b["p99_ms"], 2)}
            out["pairs"].append(pair)
            log(f"pair {p + 1}: ours p50 {s['p50_ms']} p99 {s['p99_ms']} ms ({s['received']}/{n}) | "
                f"bare p50 {b['p50_ms']} p99 {b['p99_ms']} ms ({b['received']}/{n}) | "
                f"p99 ratio {pair['ratio_p99']} | load {b['load1']}")
        if a.pgss:
            import psycopg

            with psycopg.connect(url, autocommit=True) as c:
                out["pgss"] = [dict(zip(("calls", "total_ms", "mean_ms", "rows", "query"), r)) for r in c.execute(
                    "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), rows,"
                    " left(regexp_replace(query, '\\s+', ' ', 'g'), 160) FROM pg_stat_statements"
                    " ORDER BY total_exec_time DESC LIMIT 25").fetchall()]
            for r in out["pgss"]:
                log(f"   {r['calls']:>7} calls {r['total_ms']:>9} ms {r['mean_ms']:>8} ms/call  {r['query']}")
    finally:
        for r in (rs, rb):
            if r:
                r.close()
        stop_all(procs + bares)
        cluster.stop()
    med = statistics.median
    ps = out["pairs"]
    if ps:
        out["summary"] = {
            "ours_p50_ms": med(x["switchboard"]["p50_ms"] for x in ps),
            "ours_p99_ms": med(x["switchboard"]["p99_ms"] for x in ps),
            "bare_p50_ms": med(x["bare"]["p50_ms"] for x in ps),
            "bare_p99_ms": med(x["bare"]["p99_ms"] for x in ps),
            "ratio_p99_median": med(x["ratio_p99"] for x in ps),
            "ratio_p50_median": med(x["ratio_p50"] for x in ps),
            "load_end": loadavg()}
        log(f"summary: {json.dumps(out['summary'])}")
    write_json(Path(a.out), out)


if __name__ == "__main__":
    main()
