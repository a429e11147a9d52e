#!/usr/bin/env python3
"""Issue 35, item 2: what events' partitions cost the live path.

    python bench/events_partition_ops.py [--partitions 1,4,16,64] [--rounds 1500] [--jit-rounds 20] [--seconds 10]

One throwaway PostgreSQL (the suite's settings) migrated with the real migrations.

- reads: the relay's wake-up read (relay_read_v2 from its last position; resumes,
  events_since_v2, go through the same _events_after) against how many partitions
  events has. One database per count K, all driven in the same rounds: K = 1 is every
  range partition detached (rows go to events_default: one table, as before V0037);
  K > 1 is K range partitions, the first K - 2 holding 20,000 retained events each
  (ticked), the last two empty, ahead (the default layout has 2 ahead and 1-3 holding
  the resume window). Each round publishes 5 events (notify_user) in each database,
  then each reader wakes up once; the reader backend's CPU (utime + stime, /proc) over
  the rounds is its cost per wake-up (the tick each round takes is not counted), and
  the read's wall time. Then --jit-rounds more rounds with _events_after's jit = off
  reset (the server default, on, as before f45c467): what JIT cost each wake-up.
- create: P publishers call notify_user in autocommit and one relay reader wakes up
  every 20 ms, for --seconds with no partition created (baseline), then for --seconds
  while events_partitions_ensure() creates one partition every 0.5 s (event_partitioning
  .ahead raised by one before each call; CREATE TABLE + ATTACH PARTITION, with
  ACCESS EXCLUSIVE on events_default). Each publish's and each read's latency, and
  those overlapping a create against the baseline: the stall a create causes.

Raw results: bench/results/events_partition_ops.json.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, Cluster, loadavg, log, machine_info, pct, write_json
from events_retention import ARGON, _detach_ranges, publish_loop
from relay_read_cost import READ_COLS, cpu_s

import psycopg

PER_PART = 20_000
READ = f"SELECT {READ_COLS} FROM switchboard.relay_read_v2(%s, %s, '{{}}', 1000)"


def layout(url: str, k: int) -> str:
    """K range partitions (K - 2 full, 2 ahead), or none (K = 1: events_default only)."""
    with psycopg.connect(url, autocommit=True) as c:
        uid = str(c.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()[0])
        _detach_ranges(c, only_empty=False)
        lo = int(c.execute("SELECT switchboard._event_id_allocated()").fetchone()[0]) + 1
        if k > 1:
            for i in range(k):
                a = lo + i * PER_PART
                c.execute(f"CREATE TABLE switchboard.events_p{a} (LIKE switchboard.events INCLUDING DEFAULTS "
                          "INCLUDING CONSTRAINTS INCLUDING COMMENTS)")
                c.execute(f"ALTER TABLE switchboard.events ATTACH PARTITION switchboard.events_p{a} "
                          f"FOR VALUES FROM ({a}) TO ({a + PER_PART})")
        full = max(k - 2, 1) * PER_PART
        # 100 events a transaction, as publishers write them: the xid column's statistics
        # are what the read's plan is chosen on (one transaction for all rows makes every
        # xid the same, and the generic plan then scans every row of every partition)
        for b in range(0, full, 100):
            c.execute("INSERT INTO switchboard.events (id, room, event, payload) "
                      "SELECT nextval('switchboard.event_id_seq'), 'bench', 'x', jsonb_build_object('n', i) "
                      "FROM generate_series(%s::int, %s::int) i", (b + 1, min(b + 100, full)))
        for _ in range(2):   # the load's tick, then one past it: where a live relay stands
            while c.execute("SELECT switchboard.event_tick()").fetchone()[0] < 0:
                time.sleep(0.01)
        c.execute("VACUUM ANALYZE")
        parts = c.execute("SELECT count(*) FROM switchboard.event_partitions()").fetchone()[0]
        log(f"  K={k}: {parts} partitions in all (with events_default), {full:,} retained events")
    return uid


def live_position(c: psycopg.Connection) -> tuple[int, int]:
    """A live relay's position: the newest tick, wholly read (id = the largest bigint)."""
    return int(c.execute("SELECT last_tick FROM switchboard.event_window()").fetchone()[0]), 9223372036854775807


FN = "switchboard._events_after(uuid, text[], bigint, bigint, bigint, integer)"


def _wakeups(ks: list[int], urls: dict[int, str], uids: dict[int, str], rounds: int) -> dict[int, dict[str, Any]]:
    """Rounds of: 5 publishes and a tick in each database, then one wake-up read per database."""
    pubs = {k: psycopg.connect(u, autocommit=True) for k, u in urls.items()}
    readers = {k: psycopg.connect(u, autocommit=True) for k, u in urls.items()}
    pos = {k: live_position(c) for k, c in readers.items()}
    cpu0 = {k: cpu_s(c.info.backend_pid) for k, c in readers.items()}
    got = {k: 0 for k in ks}
    wall = {k: 0.0 for k in ks}
    for _ in range(rounds):
        for k in ks:
            for _ in range(5):
                pubs[k].execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uids[k],))
            pubs[k].execute("SELECT switchboard.event_tick()")   # the ticker's part (a relay's wake-up follows one)
        for k, c in readers.items():
            t = time.perf_counter()
            rows = c.execute(READ, pos[k]).fetchall()
            wall[k] += time.perf_counter() - t
            if rows:
                pos[k] = (int(rows[-1][0]), int(rows[-1][1]))
                got[k] += len(rows)
    out = {k: {"us_per_wakeup": round((cpu_s(c.info.backend_pid) - cpu0[k]) / rounds * 1e6, 1),
               "ms_per_read": round(wall[k] / rounds * 1000, 3), "rows_read": got[k]} for k, c in readers.items()}
    for c in (*pubs.values(), *readers.values()):
        c.close()
    return out


def fig_reads(cluster: Cluster, ks: list[int], rounds: int, jit_rounds: int) -> dict[str, Any]:
    """As shipped (_events_after with jit = off), then the same databases with the function's
    jit setting reset (the server's default, on: _events_after before f45c467)."""
    urls = {k: cluster.url(cluster.new_db(f"sb_parts_{k}")) for k in ks}
    uids = {k: layout(u, k) for k, u in urls.items()}
    load0 = loadavg()
    shipped = _wakeups(ks, urls, uids, rounds)
    for u in urls.values():
        with psycopg.connect(u, autocommit=True) as c:
            c.execute(f"ALTER FUNCTION {FN} RESET jit")
    jit_on = _wakeups(ks, urls, uids, jit_rounds) if jit_rounds else {}
    for u in urls.values():
        with psycopg.connect(u, autocommit=True) as c:
            c.execute(f"ALTER FUNCTION {FN} SET jit = off")
    base = shipped[ks[0]]["us_per_wakeup"]
    out: dict[str, Any] = {"rounds": rounds, "jit_rounds": jit_rounds, "load": [load0, loadavg()], "points": [
        {"partitions": k, "retained": max(k - 2, 1) * PER_PART, **shipped[k],
         "over_first": round(shipped[k]["us_per_wakeup"] / base, 3), "jit_on": jit_on.get(k)} for k in ks]}
    for p in out["points"]:
        j = p["jit_on"]
        log(f"  reads K={p['partitions']:>3} ({p['retained']:,} retained): {p['us_per_wakeup']:7.1f} µs CPU, "
            f"{p['ms_per_read']:.3f} ms per wake-up ({p['over_first']}x K={ks[0]}; {p['rows_read']} rows)"
            + (f"; with JIT as before: {j['us_per_wakeup']:.0f} µs, {j['ms_per_read']:.1f} ms" if j else ""))
    return out


def _phase(url: str, uid: str, publishers: int, seconds: float, create: bool) -> dict[str, Any]:
    stop = threading.Event()
    pub_lat: list[tuple[float, float]] = []
    read_lat: list[tuple[float, float]] = []
    creates: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def read() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            at = live_position(c)
            while not stop.is_set():
                t = time.monotonic()
                c.execute("SELECT switchboard.event_tick()")
                rows = c.execute(READ, at).fetchall()
                read_lat.append((t, time.monotonic() - t))
                if rows:
                    at = (int(rows[-1][0]), int(rows[-1][1]))
                time.sleep(0.02)

    def creator() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            while not stop.is_set():
                time.sleep(0.5)
                if create:
                    c.execute("UPDATE switchboard.event_partitioning SET ahead = ahead + 1")
                t = time.monotonic()
                n = c.execute("SELECT switchboard.events_partitions_ensure()").fetchone()[0]
                creates.append((t, time.monotonic(), int(n)))

    threads = [threading.Thread(target=publish_loop, args=(url, uid, stop, pub_lat, lock)) for _ in range(publishers)]
    threads += [threading.Thread(target=read), threading.Thread(target=creator)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(30)
    windows = [(a, b) for a, b, n in creates if n > 0]

    def overlapping(lat: list[tuple[float, float]]) -> list[float]:
        return [d for s, d in lat if any(s < b and s + d > a for a, b in windows)]

    def stats(lat: list[float]) -> dict[str, Any]:
        if not lat:
            return {"n": 0}
        return {"n": len(lat), "p50_ms": round(1000 * statistics.median(lat), 3), "p99_ms": round(1000 * pct(lat, 99), 3),
                "max_ms": round(1000 * max(lat), 3)}

    ensure = [b - a for a, b, n in creates if (n > 0) == create]
    return {"seconds": round(time.monotonic() - t0, 1), "created": sum(n for _, _, n in creates),
            "ensure_calls": len(creates), "ensure": stats(ensure),
            "publish": stats([d for _, d in pub_lat]), "publish_per_s": round(len(pub_lat) / seconds),
            "read": stats([d for _, d in read_lat]),
            "publish_overlapping_create": stats(overlapping(pub_lat)),
            "read_overlapping_create": stats(overlapping(read_lat))}


def fig_create(cluster: Cluster, publishers: int, seconds: float) -> dict[str, Any]:
    url = cluster.url(cluster.new_db("sb_parts_create"))
    with psycopg.connect(url, autocommit=True) as c:
        uid = str(c.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()[0])
        c.execute("SELECT switchboard.events_partitions_ensure()")
    out = {"publishers": publishers}
    for name, create in (("baseline", False), ("creating", True), ("baseline_again", False)):
        r = _phase(url, uid, publishers, seconds, create)
        out[name] = r
        log(f"  {name}: {r['created']} created in {r['ensure_calls']} calls (ensure {r['ensure']}); "
            f"publish {r['publish']} at {r['publish_per_s']}/s; read {r['read']}; "
            f"overlapping a create: publish {r['publish_overlapping_create']}, read {r['read_overlapping_create']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", default="1,4,16,64", help="range partitions per database (reads)")
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--jit-rounds", type=int, default=20, help="rounds with _events_after's jit setting reset")
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--only", choices=("reads", "create"))
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the throwaway cluster on the way out
    cluster = Cluster()
    out: dict[str, Any] = {"command": "python " + " ".join(["bench/events_partition_ops.py", *sys.argv[1:]]),
                           "machine": machine_info(cluster)}
    try:
        if a.only in (None, "reads"):
            log("reads: relay wake-up CPU against the number of partitions")
            out["reads"] = fig_reads(cluster, [int(x) for x in a.partitions.split(",")], a.rounds, a.jit_rounds)
        if a.only in (None, "create"):
            log("create: publishes and relay reads while partitions are created")
            out["create"] = fig_create(cluster, a.publishers, a.seconds)
    finally:
        cluster.stop()
    write_json(RESULTS / "events_partition_ops.json", out)


if __name__ == "__main__":
    main()
