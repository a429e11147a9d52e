"""Delivery latency over the SSE fallback transport against the WebSocket path (issue 34).

    python bench/sse_ab.py [--users 1000] [--replicas 3] [--rate 1000] [--seconds 3] [--pairs 4]
                           [--out FILE]

Figure 5's load: `notify_user` COMMIT -> frame, 1,000 users with one connection each over
3 replicas of `switchboard serve`, 1,000 events/s, each to one user (publisher:
bench/e2e.py's _publish, 4 connections, autocommit, time.time() after the COMMIT).
One stack, two sets of users in the same database: --users hold a WebSocket
(bench/ws_client.py) and --users others hold a GET /sse stream (bench/sse_client.py),
spread the same way over the same replicas, all connected for the whole run. Rounds
alternate WS / SSE (the first slot rotates): each round publishes n = rate x seconds events
to that set's users only, so both transports carry the same load on the same processes in
the same minutes. Per round: p50 / p99 of COMMIT -> frame read, the replicas' and
PostgreSQL's CPU per event, the 1-minute load; per pair the SSE / WS ratios; the summary is
the median of each over the pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BENCH, RESULTS, ROOT, Cluster, CpuMeter, Proc, loadavg, log, machine_info, median, replica, \
    stop_all, write_json
from e2e import Receiver, _latencies, _publish, _spec, _start, _summary, _tickets, _users


class SseReceiver(Receiver):
    """bench/sse_client.py in its own process (Receiver's control protocol)."""

    def __init__(self, spec: str) -> None:   # noqa: D107 -- the parent's, with another script
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "sse_client.py"), spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                                     env=dict(os.environ, PYTHONPATH=str(BENCH)))
        self.first = self._read()


def one_round(rcv: Receiver, url: str, ids: list[str], n: int, rate: float, meter: CpuMeter) -> dict[str, Any]:
    sql = "SELECT switchboard.notify_user(%s, 'bench', %s)"
    sent = asyncio.run(_publish(url, sql, lambda k: (ids[k % len(ids)], json.dumps({"k": k})), n, rate))
    elapsed = sent.pop(-1)
    got = rcv.wait_count(n, 20)
    c = meter.stop()
    lat = _latencies(sent, rcv.dump())
    return _summary(lat) | {"sent": n, "received": got, "achieved_rate": round(n / elapsed, 1),
                            "cpu_us_per_event": {"replicas": round(c["workers_cpu_s"] / n * 1e6, 1),
                                                 "postgres": round(c["postgres_cpu_s"] / n * 1e6, 1)},
                            "load1": loadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--out", default=str(RESULTS / "sse_ab.json"))
    a = ap.parse_args()
    n = int(a.rate * a.seconds)
    cluster = Cluster()
    procs: list[Proc] = []
    rcvs: list[Receiver] = []
    out: dict[str, Any] = {"users": a.users, "replicas": a.replicas, "rate": a.rate, "seconds": a.seconds,
                           "pairs": [], "load_start": loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        db = cluster.new_db("sb_sse_ab")
        url = cluster.url(db)
        ws_ids = _users(url, a.users, "ws_u")
        sse_ids = _users(url, a.users, "sse_u")
        procs = _start([replica(cluster, db, f"sse-ab-r{i}") for i in range(a.replicas)])
        spec = _spec([f"{procs[i % a.replicas].ws_base}/ws?ticket={t}" for i, t in enumerate(_tickets(url, ws_ids))])
        rcvs.append(Receiver("ws", spec))
        os.unlink(spec)
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump({"urls": [f"{procs[i % a.replicas].base}/sse?ticket={t}"
                            for i, t in enumerate(_tickets(url, sse_ids))]}, f)
        f.close()
        rcvs.append(SseReceiver(f.name))
        os.unlink(f.name)
        log(f"{a.users} WebSockets ({rcvs[0].first}) and {a.users} SSE streams ({rcvs[1].first}) on "
            f"{a.replicas} replicas; {a.rate:.0f} ev/s x {a.seconds}s; {a.pairs} pairs; load {loadavg()}")
        stacks = [("ws", rcvs[0], ws_ids), ("sse", rcvs[1], sse_ids)]
        pids = [p.pid for p in procs]
        time.sleep(1.0)
        for name, rcv, ids in stacks:   # warm-up
            one_round(rcv, url, ids, min(n, 300), a.rate, CpuMeter(cluster, pids))
        for p in range(a.pairs):
            rnd: dict[str, Any] = {}
            for name, rcv, ids in stacks[p % 2:] + stacks[:p % 2]:
                rnd[name] = one_round(rcv, url, ids, n, a.rate, CpuMeter(cluster, pids))
                time.sleep(0.5)
            rnd["ratio_p50"] = round(rnd["sse"]["p50_ms"] / rnd["ws"]["p50_ms"], 2)
            rnd["ratio_p99"] = round(rnd["sse"]["p99_ms"] / rnd["ws"]["p99_ms"], 2)
            out["pairs"].append(rnd)
            log(f"pair {p + 1}: " + " | ".join(
                f"{k} p50 {rnd[k]['p50_ms']} p99 {rnd[k]['p99_ms']} ms ({rnd[k]['received']}/{n}, "
                f"{rnd[k]['achieved_rate']} ev/s) cpu/ev {rnd[k]['cpu_us_per_event']['replicas']}+"
                f"{rnd[k]['cpu_us_per_event']['postgres']} us" for k in ("ws", "sse"))
                + f" | sse/ws p50 {rnd['ratio_p50']} p99 {rnd['ratio_p99']} | load {loadavg()}")
    finally:
        for r in rcvs:
            r.close()
        stop_all(procs)
        cluster.stop()
    ps = out["pairs"]
    if ps:
        out["summary"] = {
            **{k: {"p50_ms": median([x[k]["p50_ms"] for x in ps]), "p99_ms": median([x[k]["p99_ms"] for x in ps]),
                   "cpu_us_per_event_replicas": median([x[k]["cpu_us_per_event"]["replicas"] for x in ps]),
                   "cpu_us_per_event_postgres": median([x[k]["cpu_us_per_event"]["postgres"] for x in ps]),
                   "lost": sum(x[k]["sent"] - x[k]["received"] for x in ps)} for k in ("ws", "sse")},
            "ratio_p50_median": median([x["ratio_p50"] for x in ps]),
            "ratio_p99_median": median([x["ratio_p99"] for x in ps]),
            "load_end": loadavg()}
        log(f"summary: {json.dumps(out['summary'])}")
    out["machine"] = machine_info(cluster)
    write_json(Path(a.out), out)


if __name__ == "__main__":
    main()
