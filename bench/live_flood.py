"""Real events' delivery under NOTIFY floods, the live path on, all floods in one run (issue 32).

    python bench/live_flood.py [--base REV] [--replicas 2] [--users 200] [--rate 200]
                               [--seconds 3] [--flood-rate 2000] [--rounds 2]

Any role that can connect may NOTIFY anything on any channel. Per stack (this tree's
Switchboard, and with --base the relay code and 50_events.sql of git revision REV, in
a database of its own), each round measures COMMIT -> WebSocket frame of real events
(`notify_user`, `rate` ev/s for `seconds` s to `users` sockets on `replicas` replicas,
bench/e2e.py's publisher and receiver) with no flood and then under each flood, sent
by a LOGIN role that holds nothing but CONNECT, at `flood-rate` NOTIFYs/s, one
transaction each, from a process of its own:

  junk         {"id": N} on switchboard_events: well-formed forged hints (each asks
               for a read: the most a role that knows nothing can make a relay do)
  live-hint    {"live": 1} on switchboard_events (V0025's "re-read the key": coalesced)
  barrier      {"b": N} on the live channel (its real name: as if it had leaked)
  badmac-old   <64 hex digits>{event} on switchboard_live, the public channel before V0025
  badmac-real  the same on the live channel's real name (leaked)

Before V0025 the live channel is switchboard_live, so "old" and "real" are one channel
there. The order of the floods rotates from round to round. Per case: p50 / p99 and
their ratio to the same stack's no-flood run of the same round, the flood rate
achieved, relay_live_key() calls (track_functions) and relay reads per second.
Writes bench/results/live_flood.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import psycopg
from common import BENCH, RESULTS, Cluster, Proc, loadavg, log, median, replica, stop_all, write_json
from e2e import Receiver, _per_user_runs, _spec, _start, _tickets, _users
from latency_ab import base_tree

FLOODER = "sb_flooder"
CASES = ("junk", "live-hint", "barrier", "badmac-old", "badmac-real")

# The flooding process: NOTIFY on channel at a fixed rate until its stdin closes; in the
# payload {n} is the message's number, {mac} 64 hex digits that differ per message.
FLOOD = r"""
import sys, threading, time, psycopg
url, channel, payload, rate = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
n = 0
with psycopg.connect(url, autocommit=True, prepare_threshold=0) as c:
    t0 = time.monotonic()
    print("ok", flush=True)
    while not stop.is_set():
        ahead = t0 + n / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        c.execute("SELECT pg_notify(%s, %s)",
                  (channel, payload.replace("{n}", str(n + 1)).replace("{mac}", format(n, "064x"))))
        n += 1
print(n, round(n / (time.monotonic() - t0)), flush=True)
"""
BAD_MAC = "{mac}" + json.dumps({"id": 1, "u": "00000000-0000-0000-0000-000000000001", "r": None,
                                   "e": "forged", "t": 1, "p": {"x": "y" * 100}}, separators=(",", ":"))


def flood_spec(case: str, channel: str) -> tuple[str, str]:
    return {"junk": ("switchboard_events", '{"id":{n}}'),
            "live-hint": ("switchboard_events", '{"live":1}'),
            "barrier": (channel, '{"b":{n}}'),
            "badmac-old": ("switchboard_live", BAD_MAC),
            "badmac-real": (channel, BAD_MAC)}[case]


class Flood:
    def __init__(self, url: str, channel: str, payload: str, rate: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FLOOD, url, channel, payload, str(rate)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ok":
            raise RuntimeError("the flooder did not start")

    def stop(self) -> dict[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        sent, rate = self.proc.stdout.readline().split()
        self.proc.wait(timeout=30)
        return {"sent": int(sent), "rate": int(rate)}


def key_calls(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        return int(c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                             "WHERE schemaname = 'switchboard' AND funcname = 'relay_live_key'").fetchone()[0])


def metric(procs: list[Proc], name: str) -> float:
    """A counter summed over the replicas (0 where a revision does not have it)."""
    total = 0.0
    for p in procs:
        for line in httpx.get(p.base + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                total += float(line.split()[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="", help="also run git revision BASE's relay and 50_events.sql")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--flood-rate", type=float, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    n = int(a.rate * a.seconds)
    cluster = Cluster()
    procs: list[Proc] = []
    rcvs: list[Receiver] = []
    out: dict[str, Any] = {"replicas": a.replicas, "users": a.users, "rate": a.rate, "seconds": a.seconds,
                           "flood_rate": a.flood_rate, "base": a.base, "rounds": [],
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_start": loadavg()}
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {FLOODER} LOGIN")          # CONNECT (PUBLIC's) and nothing else
        stacks: list[dict[str, Any]] = []
        base_dir = base_tree(a.base) if a.base else None
        for name in ["this"] + (["base"] if a.base else []):
            db = cluster.new_db(f"sb_flood_{name}")
            url = cluster.url(db)
            ids = _users(url, a.users, "fl_u")
            with psycopg.connect(url, autocommit=True) as c:
                if name == "base" and base_dir is not None:
                    # That revision's event functions (its relay_live_key() returns the key only).
                    c.execute("DROP FUNCTION switchboard.relay_live_key()")
                    c.execute((base_dir / "db/functions/50_events.sql").read_text())
                c.execute("SELECT switchboard.event_live_path(true)")
                c.execute(f'ALTER DATABASE "{db}" SET track_functions = \'pl\'')
                try:
                    channel = str(c.execute("SELECT channel FROM switchboard.relay_live_key()").fetchone()[0])
                except psycopg.Error:
                    channel = "switchboard_live"
            env = {"SWITCHBOARD_LOG_LEVEL": "WARNING"}
            if name == "base" and base_dir is not None:
                env["PYTHONPATH"] = os.pathsep.join([str(base_dir / "server"), str(BENCH)])
            ps = _start([replica(cluster, db, f"flood-{name}{i}", env=env) for i in range(a.replicas)])
            procs += ps
            tickets = _tickets(url, ids)
            rcv = Receiver("ws", _spec([f"{ps[i % a.replicas].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets)]))
            rcvs.append(rcv)
            with psycopg.connect(url, autocommit=True) as c:   # warm: every relay holds the key
                for _ in range(3):
                    c.execute("SELECT switchboard.notify_user(%s, 'warm', '{}')", (ids[0],))
                    time.sleep(0.3)
            time.sleep(1.0)
            stacks.append({"name": name, "url": url, "procs": ps, "rcv": rcv, "channel": channel,
                           "flood_url": cluster.url(db, FLOODER),
                           "params": (lambda ids_: lambda k: (ids_[k % a.users], json.dumps({"k": k})))(ids)})
        log(f"stacks up: {[s['name'] for s in stacks]}; {n} events per run at {a.rate}/s, floods at "
            f"{a.flood_rate}/s")

        def run(st: dict[str, Any], case: str) -> dict[str, Any]:
            flood = None
            if case != "none":
                ch, payload = flood_spec(case, st["channel"])
                flood = Flood(st["flood_url"], ch, payload, a.flood_rate)
                time.sleep(0.5)
            k0, t0 = key_calls(st["url"]), time.monotonic()
            r0 = metric(st["procs"], "switchboard_relay_reads_total")
            m0 = metric(st["procs"], "switchboard_live_key_reads_total")
            s = _per_user_runs(st["rcv"], st["url"], "SELECT switchboard.notify_user(%s, 'bench', %s)",
                               st["params"], n, a.rate, 1, f"{st['name']} {case}")["runs"][0]
            elapsed = time.monotonic() - t0
            sent = flood.stop() if flood else {"sent": 0, "rate": 0}
            time.sleep(1.5)     # statistics flushed (1 s), the flood's backlog drained
            res = {"p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "received": s["received"], "sent": s["sent"],
                   "flood_sent": sent["sent"], "flood_rate": sent["rate"],
                   "key_reads": key_calls(st["url"]) - k0,
                   "key_reads_metric": metric(st["procs"], "switchboard_live_key_reads_total") - m0,
                   "relay_reads_per_s": round((metric(st["procs"], "switchboard_relay_reads_total") - r0) / elapsed, 1)}
            log(f"  {st['name']:>4} {case:<11} p50 {res['p50_ms']:7.2f} p99 {res['p99_ms']:7.2f} ms, "
                f"{res['received']}/{n}, flood {res['flood_rate']}/s, {res['key_reads']} key reads "
                f"({res['key_reads_metric']:.0f} counted), "
                f"{res['relay_reads_per_s']} reads/s")
            return res

        for r in range(a.rounds):
            order = list(CASES[r % len(CASES):] + CASES[:r % len(CASES)])
            rnd: dict[str, Any] = {"order": order, "load": loadavg()}
            for st in stacks:
                cases = {"none": run(st, "none")}
                for case in order:
                    cases[case] = run(st, case)
                base = cases["none"]
                for case, res in cases.items():
                    res["p50_vs_none"] = round(res["p50_ms"] / base["p50_ms"], 2) if base["p50_ms"] else None
                    res["p99_vs_none"] = round(res["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None
                rnd[st["name"]] = cases
            out["rounds"].append(rnd)
        summary: dict[str, Any] = {}
        for st in stacks:
            summary[st["name"]] = {case: {f: median([rd[st["name"]][case][f] for rd in out["rounds"]])
                                          for f in ("p50_ms", "p99_ms", "p50_vs_none", "p99_vs_none", "key_reads",
                                                    "flood_rate", "relay_reads_per_s")}
                                   for case in ("none",) + CASES}
        out["summary"] = summary
        out["load_end"] = loadavg()
        for name, cases in summary.items():
            log(f"{name}: " + "; ".join(f"{c} {v['p50_ms']}/{v['p99_ms']} ms ({v['p50_vs_none']}x/{v['p99_vs_none']}x)"
                                        for c, v in cases.items()))
    finally:
        for rc in rcvs:
            rc.close()
        stop_all(procs)
        cluster.stop()
    write_json(RESULTS / "live_flood.json", out)


if __name__ == "__main__":
    main()
