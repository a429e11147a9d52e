#!/usr/bin/env python3
"""Figure 5 with the verified live path on, against the bare relay, in alternating rounds.

    python bench/live_ab.py [--rounds 4] [--users 1000] [--rate 1000] [--events 5000] [--id-hints on|off]

Both stacks are up at once on one throwaway cluster: 3 Switchboard replicas with
`event_live_path(true)` and 3 bare Falcon apps relaying raw NOTIFYs
(bench/bare_app.py), 1,000 sockets each (two receiver processes). Each round
publishes the same per-user load to one, then to the other, and records p50 / p99
COMMIT -> frame and the CPU per event of the servers and of PostgreSQL. Uses
bench/e2e.py's own publisher, receiver and summaries, so the figures are comparable
with figure 5. Writes bench/results/live_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e  # noqa: E402
from common import RESULTS, Cluster, CpuMeter, log, write_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--id-hints", choices=("on", "off"), default="on",
                    help="event_live_path(send_id_hints => ...): off once no previous-release replica runs")
    a = ap.parse_args()
    users, n, rate = a.users, a.events, a.rate
    cluster = Cluster()
    procs: list[e2e.Proc] = []
    rcvs: list[Any] = []
    out: dict[str, Any] = {"users": users, "events": n, "rate": rate, "id_hints": a.id_hints, "rounds": []}
    try:
        db = cluster.new_db("sb_live_ab")
        url = cluster.url(db)
        ids = e2e._users(url, users, "bench_u", room="bench-room")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT switchboard.event_live_path(true, send_id_hints => %s)", (a.id_hints == "on",))
        sb = e2e._start([e2e.replica(cluster, db, f"live-r{i}") for i in range(3)])
        env = dict(os.environ, DATABASE_URL=cluster.url(db, e2e.APP_LOGIN))
        bares = []
        for i in range(3):
            port = e2e.free_port()
            bares.append(e2e.Proc([sys.executable, str(e2e.BENCH / "bare_app.py"), "--port", str(port), "--listen"],
                                  env, port, f"live-bare{i}"))
        procs = sb + e2e._start(bares)
        tickets = e2e._tickets(url, ids)
        rcv = e2e.Receiver("ws", e2e._spec([f"{sb[i % 3].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets)]))
        rcvs.append(rcv)
        rcvb = e2e.Receiver("ws", e2e._spec([f"{bares[i % 3].ws_base}/ws?u={i}" for i in range(users)], hello=False))
        rcvs.append(rcvb)
        e2e._publish_warm(url, ids[0])

        def one(label: str, servers: list[e2e.Proc], receiver: Any, sql: str, params: Any) -> dict[str, Any]:
            meter = CpuMeter(cluster, [p.pid for p in servers])
            s = e2e._per_user_runs(receiver, url, sql, params, n, rate, 1, label)
            cpu = meter.stop()
            return {"p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"],
                    "servers_cpu_us_per_event": round(cpu["workers_cpu_s"] / n * 1e6),
                    "postgres_cpu_us_per_event": round(cpu["postgres_cpu_s"] / n * 1e6)}

        for r in range(a.rounds):
            live = one("live path", sb, rcv, "SELECT switchboard.notify_user(%s, 'bench', %s)",
                       lambda k: (ids[k % users], json.dumps({"k": k})))
            bare = one("bare", bares, rcvb, "SELECT pg_notify('bare_events', %s)",
                       lambda k: (json.dumps({"u": str(k % users), "k": k}),))
            ratio = round(live["p99_ms"] / bare["p99_ms"], 1) if bare["p99_ms"] else None
            out["rounds"].append({"live": live, "bare": bare, "p99_ratio": ratio})
            log(f"round {r + 1}: live {live['p50_ms']} / {live['p99_ms']} ms, bare {bare['p50_ms']} / "
                f"{bare['p99_ms']} ms, p99 {ratio}x; CPU/event servers {live['servers_cpu_us_per_event']} vs "
                f"{bare['servers_cpu_us_per_event']} us, postgres {live['postgres_cpu_us_per_event']} vs "
                f"{bare['postgres_cpu_us_per_event']} us")
        # How many frames went out live (the rest were held behind a barrier or a gate and
        # sent by the read): per replica, from its own counters.
        shares = []
        for p in sb:
            text = httpx.get(p.base + "/metrics", timeout=10).text
            got = {m[2]: float(m[3]) for m in re.finditer(
                r"^(switchboard_(live_frames|events_relayed)_total) ([0-9.e+]+)$", text, flags=re.M)}
            shares.append({"live_frames": got.get("live_frames", 0.0), "frames": got.get("events_relayed", 0.0)})
        out["frames_per_replica"] = shares
        log(f"frames sent live / all frames, per replica: {shares}")
        ratios = sorted(x["p99_ratio"] for x in out["rounds"] if x["p99_ratio"] is not None)
        out["p99_ratio_median"] = ratios[len(ratios) // 2] if ratios else None
    finally:
        for r in rcvs:
            r.close()
        e2e.stop_all(procs)
        cluster.stop()
    write_json(RESULTS / "live_ab.json", out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
