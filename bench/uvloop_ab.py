#!/usr/bin/env python3
"""uvloop + httptools against the pure-Python asyncio loop + h11, side by side.

    python bench/uvloop_ab.py [--rounds 3] [--http-seconds 8] [--users 1000] [--extra-path DIR]

One throwaway cluster and database, two `switchboard serve` replicas started
with the same settings except SWITCHBOARD_UVLOOP (off: asyncio + h11; on:
uvloop + httptools), each checked for what it really runs (the uvloop and
httptools shared objects in /proc/<pid>/maps). In alternating rounds (off, on,
off, on, ...):
  - HTTP: GET /tasks (6 tasks, admin bearer) at 32 connections, requests/s and
    server CPU per request (bench/e2e.py figure 6's load);
  - WebSocket delivery: notify_user to U users (one socket each on the replica
    under test) at 500 ev/s, COMMIT -> frame p50/p99; and notify_room to one
    room of the U members at 10 ev/s, COMMIT -> last member's frame p50/p99,
    with the replica's CPU per frame.
--extra-path puts DIR first on the "on" replica's PYTHONPATH (uvloop/httptools
installed with pip --target, without touching the shared site-packages).
Raw results: bench/results/uvloop_ab.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e
import psycopg
from common import RESULTS, Cluster, CpuMeter, Proc, loadavg, log, make_token, median, replica, stop_all, write_json


def _runs_with(pid: int) -> dict[str, bool]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {"uvloop": "uvloop/loop" in maps, "httptools": "httptools/parser" in maps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--http-seconds", type=float, default=8)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--fan-events", type=int, default=30)
    ap.add_argument("--extra-path", default="")
    a = ap.parse_args()
    cluster = Cluster()
    out: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": loadavg(),
                           "args": vars(a), "rounds": []}
    db = cluster.new_db("uv_ab")
    url = cluster.url(db)
    with psycopg.connect(url, autocommit=True) as c:
        for i in range(5):
            c.execute("SELECT switchboard.create_task(%s, NULL, 'noop', %s)", (f"bench-task-{i}", json.dumps({"i": i})))
    admin = e2e._users(url, 1, "uv_admin", role="admin")[0]
    hdr = {"Authorization": f"Bearer {make_token(admin, 'uv_admin1', role='admin')}"}
    ids = e2e._users(url, 2 * a.users, "uv_u", room=None)
    with psycopg.connect(url, autocommit=True) as c:
        for mode, chunk in (("off", ids[:a.users]), ("on", ids[a.users:])):
            c.execute("SELECT switchboard.add_room_member(%s, u::uuid) FROM unnest(%s::text[]) u", (f"room-{mode}", chunk))
    procs: dict[str, Proc] = {}
    users = {"off": ids[:a.users], "on": ids[a.users:]}
    for mode in ("off", "on"):
        env = {"SWITCHBOARD_UVLOOP": mode}
        if mode == "on" and a.extra_path:
            env["PYTHONPATH"] = os.pathsep.join([a.extra_path, os.environ.get("PYTHONPATH", ""),
                                                str(Path(__file__).resolve().parents[1] / "server"),
                                                str(Path(__file__).resolve().parent)])
        procs[mode] = replica(cluster, db, f"uv-{mode}", env=env)
    e2e._start(list(procs.values()))
    rcvs: dict[str, e2e.Receiver] = {}
    try:
        for mode, p in procs.items():
            out[f"{mode}_runs_with"] = _runs_with(p.pid)
            log(f"replica {mode}: {out[f'{mode}_runs_with']}")
        assert not any(out["off_runs_with"].values()), out["off_runs_with"]
        assert all(out["on_runs_with"].values()), out["on_runs_with"]
        for mode, p in procs.items():
            spec = e2e._spec([f"{p.ws_base}/ws?ticket={t}" for t in e2e._tickets(url, users[mode])])
            rcvs[mode] = e2e.Receiver("ws", spec)
            os.unlink(spec)
            log(f"  {mode}: {a.users} sockets ({rcvs[mode].first}); join: {rcvs[mode].cmd(f'join room-{mode}')}")
        tool = "wrk" if shutil.which("wrk") else "python"

        def http(p: Proc, secs: float) -> dict[str, Any]:
            meter = CpuMeter(cluster, [p.pid])
            res = (e2e._wrk(p.base + "/tasks", hdr, 32, secs) if tool == "wrk"
                   else asyncio.run(e2e._pyload(p.base + "/tasks", hdr, 32, secs)))
            cpu = meter.stop()
            if res["non_2xx"]:
                raise RuntimeError(f"{p.name}: {res['non_2xx']} non-2xx answers")
            return res | {"server_cpu_us_per_req": round(cpu["workers_cpu_s"] / max(res["rps"] * secs, 1) * 1e6, 1)}

        for p in procs.values():
            http(p, 2)  # warm-up
        n = int(a.rate * a.seconds)
        for r in range(a.rounds):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                p, rcv, u = procs[mode], rcvs[mode], users[mode]
                res: dict[str, Any] = {"round": r + 1, "mode": mode, "loadavg": loadavg()}
                res["http"] = http(p, a.http_seconds)
                meter = CpuMeter(cluster, [p.pid])
                res["per_user"] = e2e._per_user_runs(
                    rcv, url, "SELECT switchboard.notify_user(%s, 'bench', %s)",
                    lambda k, u=u: (u[k % len(u)], json.dumps({"k": k})), n, a.rate, 1, mode)
                res["per_user"]["cpu_us_per_frame"] = round(meter.stop()["workers_cpu_s"] / n * 1e6, 1)
                meter = CpuMeter(cluster, [p.pid])
                res["fan_out"] = e2e._fan_out_runs(
                    rcv, url, "SELECT switchboard.notify_room(%s, 'bench', %s)",
                    lambda k, m=mode: (f"room-{m}", json.dumps({"k": k})), a.fan_events, 10, a.users, 1, mode)
                res["fan_out"]["cpu_us_per_frame"] = round(
                    meter.stop()["workers_cpu_s"] / (a.fan_events * a.users) * 1e6, 1)
                log(f"round {r + 1} {mode:>3}: http {res['http']['rps']} req/s "
                    f"({res['http']['server_cpu_us_per_req']} us CPU/req); per-user p50 {res['per_user']['p50_ms']} "
                    f"p99 {res['per_user']['p99_ms']} ms ({res['per_user']['cpu_us_per_frame']} us/frame); fan-out "
                    f"last member p50 {res['fan_out']['p50_ms']} p99 {res['fan_out']['p99_ms']} ms "
                    f"({res['fan_out']['cpu_us_per_frame']} us/frame); load {res['loadavg']}")
                out["rounds"].append(res)
    finally:
        for rcv in rcvs.values():
            rcv.close()
        stop_all(list(procs.values()))
        cluster.stop()

    def med(mode: str, get: Any) -> float:
        return median([get(x) for x in out["rounds"] if x["mode"] == mode])

    summary: dict[str, Any] = {}
    for name, get in (("http_rps", lambda x: x["http"]["rps"]),
                      ("http_cpu_us_per_req", lambda x: x["http"]["server_cpu_us_per_req"]),
                      ("per_user_p50_ms", lambda x: x["per_user"]["p50_ms"]),
                      ("per_user_p99_ms", lambda x: x["per_user"]["p99_ms"]),
                      ("per_user_cpu_us_per_frame", lambda x: x["per_user"]["cpu_us_per_frame"]),
                      ("fan_out_p50_ms", lambda x: x["fan_out"]["p50_ms"]),
                      ("fan_out_p99_ms", lambda x: x["fan_out"]["p99_ms"]),
                      ("fan_out_cpu_us_per_frame", lambda x: x["fan_out"]["cpu_us_per_frame"])):
        off, on = med("off", get), med("on", get)
        summary[name] = {"off": off, "on": on, "on_over_off": round(on / off, 3) if off else None}
        log(f"{name:<28} off {off:>10} on {on:>10}  on/off {summary[name]['on_over_off']}")
    out["summary"] = summary
    out["loadavg_end"] = loadavg()
    out["load_generator"] = tool
    write_json(RESULTS / "uvloop_ab.json", out)


if __name__ == "__main__":
    main()
