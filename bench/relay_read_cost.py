"""PostgreSQL CPU per relay wake-up, by statement variant (issue 18's per-stage profile).

    python bench/relay_read_cost.py [--rounds 1500] [--per-round 5]

One throwaway cluster, one reader connection per variant. Each round publishes
``--per-round`` events (notify_user, autocommit) and then every variant does one
wake-up from its own position; the CPU of each variant's backend (utime+stime
from /proc) divided by the rounds is its cost per wake-up. Variants run in the
same rounds, so the box's load hits all of them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from common import ROOT, Cluster, loadavg, log  # noqa: E402
from e2e import _users  # noqa: E402

READ_COLS = "tick, id, ephemeral, user_id, room, event, sender, payload::text AS payload, ts"


def cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


VARIANTS = {
    # what the relay sent on every wake-up before relay/reads.py (which adds event_window())
    "tick+read (relay_tick_read)": "BEGIN; SELECT switchboard.event_tick() AS tick; COMMIT; "
                                   f"SELECT {READ_COLS} FROM switchboard.relay_read_v2({{}}, {{}}, '{{{{}}}}', 1000)",
    "read only (relay_read_v2)": f"SELECT {READ_COLS} FROM switchboard.relay_read_v2({{}}, {{}}, '{{{{}}}}', 1000)",
    "_events_after only": "SELECT tick, id, user_id, room, event, payload::text, created_at "
                          "FROM switchboard._events_after(NULL, NULL, {}, {}, NULL, 1000)",
    "event_tick only": "SELECT switchboard.event_tick() AS tick",
    "SELECT 1 (round trip floor)": "SELECT 1 WHERE {} >= 0 AND {} >= 0",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--ticks", type=int, default=0, help="retained ticks stored first (a retention window)")
    ap.add_argument("--base", default="", help="also a database with git revision BASE's 50_events.sql (same rounds)")
    ap.add_argument("--explain", action="store_true", help="then auto_explain (analyze, nested) one wake-up per variant")
    a = ap.parse_args()
    cluster = Cluster()
    try:
        dbs = {"new": cluster.url(cluster.new_db("sb_readcost"))}
        if a.base:
            dbs["base"] = cluster.url(cluster.new_db("sb_readcost_base"))
            src = subprocess.run(["git", "show", f"{a.base}:db/functions/50_events.sql"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            with psycopg.connect(dbs["base"], autocommit=True) as c:
                c.execute(src)
        uid = {}
        for d, url in dbs.items():
            uid[d] = _users(url, 1, "rc")[0]
            with psycopg.connect(url, autocommit=True) as c:
                if a.ticks:
                    c.execute("INSERT INTO switchboard.event_ticks (tick, snap, snap_xmax) "
                              "SELECT nextval('switchboard.event_tick_seq'), pg_current_snapshot(), "
                              "pg_snapshot_xmax(pg_current_snapshot()) FROM generate_series(1, %s)", (a.ticks,))
                    c.execute("ANALYZE switchboard.event_ticks")
                c.execute("SELECT switchboard.event_tick()")
        pubs = {d: psycopg.connect(url, autocommit=True) for d, url in dbs.items()}
        tickers = {d: psycopg.connect(url, autocommit=True) for d, url in dbs.items()}  # for variants that do not
        keys = [(d, v) for d in dbs for v in VARIANTS]
        conns = {key: psycopg.connect(dbs[key[0]], autocommit=True) for key in keys}
        pos = {key: (0, 0) for key in keys}
        pids = {key: c.info.backend_pid for key, c in conns.items()}
        cpu0 = {key: cpu_s(p) for key, p in pids.items()}
        load0 = loadavg()
        t0 = time.time()
        rows = {key: 0 for key in keys}
        for r in range(a.rounds):
            for d in dbs:
                for _ in range(a.per_round):
                    pubs[d].execute("SELECT switchboard.notify_user(%s, 'rc', %s)", (uid[d], json.dumps({"r": r})))
                if r % 2:
                    tickers[d].execute("SELECT switchboard.event_tick()")
            for key, c in conns.items():
                name = key[1]
                q = VARIANTS[name].format(*pos[key])
                cur = c.execute(q)
                last: list = []
                while True:
                    if cur.description is not None:
                        last = cur.fetchall()
                    if not cur.nextset():
                        break
                if name != "event_tick only" and not name.startswith("SELECT 1") and last:
                    pos[key] = (int(last[-1][0]), int(last[-1][1]))
                    rows[key] += len(last)
        wall = time.time() - t0
        out = {key: round((cpu_s(p) - cpu0[key]) / a.rounds * 1e6, 1) for key, p in pids.items()}
        log(f"{a.rounds} wake-ups x {a.per_round} events, {a.ticks} ticks stored first, {wall:.1f} s, "
            f"load {load0} -> {loadavg()}")
        for (d, name), us in out.items():
            log(f"  {d:5s} {name:32s} {us:8.1f} us backend CPU per wake-up  ({rows[(d, name)]} rows read)")
        if a.explain:
            for _ in range(a.per_round):
                pubs["new"].execute("SELECT switchboard.notify_user(%s, 'rc', '{}')", (uid["new"],))
            with psycopg.connect(dbs["new"], autocommit=True) as c:
                notes: list[str] = []
                c.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
                for st in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                           "SET auto_explain.log_analyze = on", "SET auto_explain.log_nested_statements = on",
                           "SET auto_explain.log_level = notice", "SET auto_explain.log_timing = on"):
                    c.execute(st)
                name = "tick+read (relay_tick_read)"
                c.execute(VARIANTS[name].format(*pos[("new", name)]))
                for n_ in notes:
                    print(n_)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
