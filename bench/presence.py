"""Pushed presence (issue 34): frames and CPU per join/leave, and a reconnect storm.

    python bench/presence.py [--quick] [--members 1000] [--churners 100] [--rate 20]
                             [--seconds 20] [--pairs 3] [--storms 2] [--out FILE]

One throwaway cluster, 3 replicas of `switchboard serve` (SWITCHBOARD_PRESENCE_INTERVAL
default 1 s), one room ``lobby`` of --members members. All sockets are opened by this
process (one asyncio loop, like bench/ws_client.py); the CPU measured is the three
replicas' and the whole PostgreSQL cluster's (common.CpuMeter), never this client's.

Churn. members - churners users hold one socket each, joined to the room: the
observers. The other --churners users come and go: every 2/rate s one of them opens a
socket (a fresh ticket, ``?rooms=lobby``: joined at the handshake), stays --hold s and
closes it -- one join and one leave of the room's presence, --rate changes per second.
Rounds alternate (rotated) between ``on`` (every observer sent presence.subscribe and
got its presence.state before the round) and ``off`` (the observers left and re-joined
the room: still members, still joined, nobody subscribed): the same churn, the same
window. Per round: replica and PostgreSQL CPU per change (join or leave), presence
frames the observers received per change, and whether every observer's list (state
plus diffs applied in order) equals the members online once the churn has settled.

Storm. Every member then holds one socket (observers + churners: --members sockets);
all of them close at once and reconnect at once (fresh tickets, ``?rooms=lobby``), and
with presence ``on`` each subscribes as soon as it is greeted. Measured: the time from
the reconnect until every socket is back and joined, until every observer's list is
correct (all members), the presence frames each observer received (against the bound:
one state plus one diff per interval), and the CPU of a fixed window from the close,
with presence vs without (alternating storms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from common import RESULTS, Cluster, CpuMeter, Proc, loadavg, log, machine_info, median, pct, replica, stop_all, write_json
from e2e import _start, _tickets, _users

ROOM = "lobby"


class Sock:
    """One socket and the presence list it has been told (state + diffs applied in order)."""

    def __init__(self, uid: str, base: str) -> None:
        self.uid, self.base = uid, base
        self.ws: Any = None
        self.task: asyncio.Task[None] | None = None
        self.members: set[str] = set()
        self.frames: list[tuple[float, str, float]] = []   # (read at, event, the frame's server ts in s)
        self.correct_at: float | None = None
        self.bytes = 0                                 # of the presence frames, as read
        self.expected: set[str] | None = None
        self.events: dict[str, asyncio.Event] = {}

    def wait_for(self, event: str) -> asyncio.Event:
        self.events[event] = asyncio.Event()
        return self.events[event]

    async def open(self, ticket: str, rooms: bool) -> None:
        from websockets.asyncio.client import connect

        q = f"&rooms={ROOM}" if rooms else ""
        for attempt in range(6):
            try:
                self.ws = await connect(f"{self.base}/ws?ticket={ticket}{q}", open_timeout=60, max_queue=None,
                                        ping_interval=None, compression="deflate")
                break
            except Exception:
                if attempt == 5:
                    raise
                await asyncio.sleep(0.3 * (attempt + 1))
        first = json.loads(await self.ws.recv())
        assert first["event"] == "hello", first
        self.members, self.correct_at = set(), None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                t = time.time()
                f = json.loads(msg)
                ev = f.get("event")
                if ev == "presence.state":
                    self.members = {m["user_id"] for m in f["payload"]["members"]}
                elif ev == "presence.diff":
                    self.members -= {m["user_id"] for m in f["payload"]["leaves"]}
                    self.members |= {m["user_id"] for m in f["payload"]["joins"]}
                if ev in ("presence.state", "presence.diff"):
                    self.frames.append((t, ev, f["ts"] / 1000))
                    self.bytes += len(msg)
                    if self.expected is not None:
                        self.correct_at = t if self.members == self.expected else None
                e = self.events.pop(ev, None)
                if e is not None:
                    e.set()
        except Exception:
            pass

    async def send(self, obj: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(obj))

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.ws.close(), 5)
        except Exception:
            pass
        if self.task is not None:
            self.task.cancel()


async def _all(coros: list[Any], limit: int = 100) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> None:
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def _toggle(obs: list[Sock], on: bool, interval: float) -> None:
    """on: every observer subscribes and has its state; off: every observer leaves and re-joins."""
    async def one(s: Sock, action: str, answer: str) -> None:
        e = s.wait_for(answer)
        await s.send({"action": action, "room": ROOM})
        await asyncio.wait_for(e.wait(), 60)
    if on:
        await _all([one(s, "presence.subscribe", "presence.state") for s in obs], 50)
    else:
        # A subscription ends when the next interval finds the socket out of the room.
        await _all([one(s, "leave", "left") for s in obs], 50)
        await asyncio.sleep(2.5 * interval)
        await _all([one(s, "join", "joined") for s in obs], 50)
    await asyncio.sleep(2 * interval)   # the diffs of the subscription moment have gone by


def _own_cpu() -> float:
    """This client process's CPU seconds (it parses every frame of 1,000 sockets)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _online(url: str) -> int:
    """Members of the room the database counts online (presence_sockets of live replicas)."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT count(DISTINCT user_id) FROM switchboard.presence_sockets WHERE sockets > 0").fetchone()
        return int(row[0]) if row else 0


async def _churn(url: str, bases: list[str], churn_ids: list[str], rate: float, seconds: float,
                 hold: float) -> int:
    """Lifecycles (connect, joined at the handshake, hold, close) started every 2/rate s."""
    n = int(seconds * rate / 2)
    tickets = _tickets(url, [churn_ids[k % len(churn_ids)] for k in range(n)])
    t0 = time.time()
    done = 0

    async def life(k: int) -> None:
        nonlocal done
        await asyncio.sleep(max(0.0, t0 + k * 2 / rate - time.time()))
        s = Sock(churn_ids[k % len(churn_ids)], bases[k % len(bases)])
        await s.open(tickets[k], rooms=True)
        await asyncio.sleep(hold)
        await s.close()
        done += 1
    await asyncio.gather(*(life(k) for k in range(n)))
    return done


async def run(a: argparse.Namespace, cluster: Cluster, db: str, procs: list[Proc], ids: list[str]) -> dict[str, Any]:
    url = cluster.url(db)
    bases = [p.ws_base for p in procs]
    pids = [p.pid for p in procs]
    nobs = a.members - a.churners
    obs_ids, churn_ids = ids[:nobs], ids[nobs:]
    out: dict[str, Any] = {"churn": [], "storm": []}
    obs = [Sock(u, bases[i % len(bases)]) for i, u in enumerate(obs_ids)]
    t = time.time()
    await _all([s.open(tk, rooms=True) for s, tk in zip(obs, _tickets(url, obs_ids))], 50)
    log(f"{nobs} observers open in {time.time() - t:.1f}s; load {loadavg()}")
    expected_idle = set(obs_ids)
    # -- churn rounds ------------------------------------------------------------------------
    if not a.quick:
        await _churn(url, bases, churn_ids, a.rate, 4.0, a.hold)   # warm-up
    for p in range(a.pairs):
        for mode in (("on", "off") if p % 2 == 0 else ("off", "on")):
            await _toggle(obs, mode == "on", a.interval)
            for s in obs:
                s.frames.clear()
                s.bytes = 0
                s.expected = None
            load0 = loadavg()
            meter = CpuMeter(cluster, pids)
            own0 = _own_cpu()
            t0 = time.time()
            lives = await _churn(url, bases, churn_ids, a.rate, a.seconds, a.hold)
            await asyncio.sleep(3 * a.interval)   # the last leaves reach every observer
            cpu = meter.stop()
            own = round(_own_cpu() - own0, 2)
            wall = time.time() - t0
            changes = 2 * lives
            frames = sum(len(s.frames) for s in obs)
            # Outside the CPU window: how long until every observer's list is right again.
            settled = None
            if mode == "on":
                t_end = time.time()
                while time.time() < t_end + a.settle_timeout and any(s.members != expected_idle for s in obs):
                    await asyncio.sleep(0.1)
                settled = round(time.time() - t_end + 3 * a.interval, 2)
            wrong = sum(1 for s in obs if s.members != expected_idle) if mode == "on" else None
            diag = None
            if wrong:
                diag = {"extra_max": max(len(s.members - expected_idle) for s in obs),
                        "missing_max": max(len(expected_idle - s.members) for s in obs), "online_by_sql": _online(url)}
                log(f"   wrong lists: {diag}")
            per_obs: list[float] = [len(s.frames) for s in obs]
            r: dict[str, Any] = {"mode": mode, "changes": changes, "window_s": round(wall, 2), "load1_start": load0,
                 "load1_end": loadavg(), **cpu, "bench_client_cpu_s": own,
                 "cpu_us_per_change": {"replicas": round(cpu["workers_cpu_s"] / changes * 1e6),
                                       "postgres": round(cpu["postgres_cpu_s"] / changes * 1e6)},
                 "presence_frames": frames, "frames_per_change": round(frames / changes, 2),
                 "presence_bytes_per_observer_p50": median([float(s.bytes) for s in obs]),
                 "frames_per_observer": {"p50": median(per_obs), "max": max(per_obs)},
                 "max_frames_bound": int(wall / a.interval) + 1,
                 "lists_right_after_last_change_s": settled,
                 "observers_with_a_wrong_list": wrong, "wrong_list_diagnosis": diag}
            out["churn"].append(r)
            log(f"churn {mode}: {changes} changes in {wall:.1f}s; cpu/change replicas "
                f"{r['cpu_us_per_change']['replicas']} us + postgres {r['cpu_us_per_change']['postgres']} us; "
                f"frames {frames} ({r['frames_per_change']}/change, per observer p50 {median(per_obs)} max "
                f"{max(per_obs)}, bound {r['max_frames_bound']}); lists right {settled if settled is not None else '-'} s after the last change, "
                f"wrong {wrong}; load {loadavg()}")
    # -- storms ------------------------------------------------------------------------------
    socks = obs + [Sock(u, bases[(nobs + i) % len(bases)]) for i, u in enumerate(churn_ids)]
    await _all([s.open(tk, rooms=True) for s, tk in zip(socks[nobs:], _tickets(url, churn_ids))], 50)
    everyone = set(ids)
    for k in range(a.storms):
        for mode in (("on", "off") if k % 2 == 0 else ("off", "on")):
            tickets = _tickets(url, [s.uid for s in socks])
            await asyncio.sleep(2 * a.interval)
            load0 = loadavg()
            meter = CpuMeter(cluster, pids)
            own0 = _own_cpu()
            t0 = time.time()
            await asyncio.gather(*(s.close() for s in socks))
            for s in socks:
                s.frames.clear()
                s.bytes = 0
                s.expected = everyone if mode == "on" else None
            t_rc = time.time()

            async def back(s: Sock, tk: str, on: bool = mode == "on") -> None:
                await s.open(tk, rooms=True)
                if on:
                    await s.send({"action": "presence.subscribe", "room": ROOM})
            await _all([back(s, tk) for s, tk in zip(socks, tickets)], a.storm_concurrency)
            t_back = time.time()
            # Who the database counts online once every socket is back (all of them should be).
            online_back = await asyncio.to_thread(_online, url)
            deadline = t_back + a.settle_timeout
            while mode == "on" and time.time() < deadline and any(s.correct_at is None for s in socks):
                await asyncio.sleep(0.1)
            t_ok = time.time()
            rest = t0 + a.storm_window - time.time()
            if rest > 0:
                await asyncio.sleep(rest)
            cpu = meter.stop()
            own = round(_own_cpu() - own0, 2)
            wall = time.time() - t0
            per_obs = [len(s.frames) for s in socks]
            wrong = sum(1 for s in socks if s.correct_at is None) if mode == "on" else None
            # The bound: one state, then at most one diff per interval (the frames' server ts).
            since = [(s.frames[-1][2] - s.frames[0][2]) if s.frames else 0.0 for s in socks]
            bound = [int(since_ / a.interval) + 2 for since_ in since]
            r = {"mode": mode, "sockets": len(socks), "window_s": round(wall, 2), "load1_start": load0,
                 "load1_end": loadavg(), **cpu, "bench_client_cpu_s": own,
                 "reconnected_and_joined_s": round(t_back - t_rc, 2),
                 "online_by_sql_when_all_back": online_back,
                 "every_list_correct_s": round(t_ok - t_rc, 2) if mode == "on" and not wrong else None,
                 "presence_lag_s": round(t_ok - t_back, 2) if mode == "on" and not wrong else None,
                 "observers_never_correct": wrong,
                 "frames_per_observer": {"p50": median(per_obs), "p99": pct(per_obs, 99), "max": max(per_obs)}
                 if mode == "on" else {"max": max(per_obs)},
                 "observers_over_the_per_interval_bound": sum(1 for n, b in zip(per_obs, bound) if n > b),
                 "presence_frames": sum(per_obs),
                 "presence_bytes_per_observer_p50": median([float(s.bytes) for s in socks])}
            out["storm"].append(r)
            log(f"storm {mode}: back+joined {r['reconnected_and_joined_s']}s (online by SQL then {online_back}), "
                f"every list correct "
                f"{r['every_list_correct_s'] if r['every_list_correct_s'] is not None else '-'} s, frames/observer {r['frames_per_observer']}, over bound "
                f"{r['observers_over_the_per_interval_bound']}; cpu replicas {cpu['workers_cpu_s']}s postgres "
                f"{cpu['postgres_cpu_s']}s (this client {own}s) in {wall:.1f}s; load {loadavg()}")
    await asyncio.gather(*(s.close() for s in socks))
    return out


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    def med(rows: list[dict[str, Any]], f: Any) -> float:
        return median([f(r) for r in rows])

    s: dict[str, Any] = {}
    on = [r for r in out["churn"] if r["mode"] == "on"]
    off = [r for r in out["churn"] if r["mode"] == "off"]
    if on and off:
        # per-pair ratios: round i of on against round i of off (the same pair)
        ratios = [(x["workers_cpu_s"] + x["postgres_cpu_s"]) / (y["workers_cpu_s"] + y["postgres_cpu_s"])
                  for x, y in zip(on, off)]
        s["churn"] = {m: {"cpu_us_per_change_replicas": med(rs, lambda r: r["cpu_us_per_change"]["replicas"]),
                          "cpu_us_per_change_postgres": med(rs, lambda r: r["cpu_us_per_change"]["postgres"]),
                          "frames_per_change": med(rs, lambda r: r["frames_per_change"])}
                      for m, rs in (("on", on), ("off", off))}
        s["churn"]["ratio_cpu_on_off_median"] = round(median(ratios), 2)
        s["churn"]["ratio_cpu_on_off_pairs"] = [round(x, 2) for x in ratios]
    son = [r for r in out["storm"] if r["mode"] == "on"]
    soff = [r for r in out["storm"] if r["mode"] == "off"]
    if son and soff:
        s["storm"] = {
            "every_list_correct_s": [r["every_list_correct_s"] for r in son],
            "presence_lag_s": [r["presence_lag_s"] for r in son],
            "window_s": {"on": [r["window_s"] for r in son], "off": [r["window_s"] for r in soff]},
            "reconnected_and_joined_s": {"on": [r["reconnected_and_joined_s"] for r in son],
                                         "off": [r["reconnected_and_joined_s"] for r in soff]},
            "frames_per_observer_max": max(r["frames_per_observer"]["max"] for r in son),
            "frames_per_observer_p50": median([r["frames_per_observer"]["p50"] for r in son]),
            "ratio_cpu_on_off": [round((x["workers_cpu_s"] + x["postgres_cpu_s"])
                                       / (y["workers_cpu_s"] + y["postgres_cpu_s"]), 2)
                                 for x, y in zip(son, soff)],
        }
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 500 members, 1 pair of 5 s churn rounds, 1 storm pair (about 2 min)")
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--churners", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rate", type=float, default=20.0, help="presence changes (joins + leaves) per second")
    ap.add_argument("--hold", type=float, default=2.0, help="seconds a churner's socket stays open")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--storms", type=int, default=2)
    ap.add_argument("--storm-window", type=float, default=50.0, help="CPU window of a storm, from the close")
    ap.add_argument("--storm-concurrency", type=int, default=200, help="handshakes in flight during a storm")
    ap.add_argument("--settle-timeout", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0, help="SWITCHBOARD_PRESENCE_INTERVAL")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.quick:   # a smoke run: half the room
        a.pairs, a.storms, a.seconds, a.storm_window, a.members, a.churners = 1, 1, 5.0, 20.0, 500, 50
    out_path = Path(a.out or RESULTS / ("presence-quick.json" if a.quick else "presence.json"))
    random.seed(34)
    cluster = Cluster()
    procs: list[Proc] = []
    res: dict[str, Any] = {"args": vars(a), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "load_start": loadavg()}
    try:
        db = cluster.new_db("sb_presence")
        url = cluster.url(db)
        ids = _users(url, a.members, "pres_u", room=ROOM)
        env = {"SWITCHBOARD_PRESENCE_INTERVAL": str(a.interval), "SWITCHBOARD_WS_MAX_SOCKETS_PER_USER": "20"}
        procs = _start([replica(cluster, db, f"presence-r{i}", env=env) for i in range(a.replicas)])
        log(f"{a.replicas} replicas, room of {a.members} members ({a.members - a.churners} observers, "
            f"{a.churners} churners), {a.rate}/s changes x {a.seconds}s, {a.pairs} pairs, {a.storms} storm pairs; "
            f"load {loadavg()}")
        res |= asyncio.run(run(a, cluster, db, procs, ids))
    finally:
        stop_all(procs)
        cluster.stop()
    res["summary"] = summarize(res)
    res["load_end"] = loadavg()
    res["machine"] = machine_info(cluster)
    log(f"summary: {json.dumps(res['summary'])}")
    write_json(out_path, res)


if __name__ == "__main__":
    main()
