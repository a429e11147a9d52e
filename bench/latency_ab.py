"""Delivery latency, Switchboard vs the bare relay, ALTERNATING in one run (issue 18's target).

    python bench/latency_ab.py [--users 1000] [--replicas 3] [--rate 1000] [--seconds 3]
                               [--pairs 3] [--fsync] [--settings k=v,...] [--out FILE]

Figure 5 of bench/run.py measures every Switchboard run and then every bare run, so
the two halves see different moments of a shared, noisy box. The order within a
round rotates from round to round (the first slot measured worse whatever ran in it). Here both stacks run
side by side for the whole benchmark (N replicas of `switchboard serve` and N bare
Falcon apps from bench/bare_app.py, on one throwaway cluster, the same sockets per
stack) and the runs alternate S B S B ...: each pair is one ratio. Per pair it
prints p50/p99 of COMMIT -> frame for both, the p99 ratio, and the 1-minute load.
The summary is the median over pairs of each figure and of the per-pair ratios.

--before adds a third stack, run in the same rotation (S S0 B ...): Switchboard with
0.2.0's event_tick() and _events_after() re-installed in its database (read from
git, RELEASE_REV), i.e. the event functions before V0014, so before/after/bare come from one run. --prefill N stores N
events (one transaction, then a tick) in each Switchboard database first: the steady
state of a retention window (1,000 ev/s x 5 minutes = 300,000). Every run also
reports CPU per event: the stack's server processes, and the whole PostgreSQL cluster.

Publishers: `notify_user(<user k mod N>, 'bench', {"k": k})` against
`pg_notify('bare_events', {"u": .., "k": k})`, autocommit, a fixed schedule of
rate/s over 4 connections (bench/e2e.py's _publish). --fsync runs the cluster with
fsync and synchronous_commit on (durable: the tick's COMMIT pays a flush).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import subprocess
import tempfile

from common import (APP_LOGIN, BENCH, RESULTS, ROOT, Cluster, CpuMeter, Proc, free_port, loadavg, log, pct, replica,
                    stop_all, write_json)
from e2e import Receiver, _latencies, _publish, _spec, _start, _summary, _tickets, _users


RELEASE_REV = "v0.2.0"


def old_event_functions() -> str:
    """event_tick() and _events_after() as 0.2.0 shipped them (before V0014), from git."""
    src = subprocess.run(["git", "show", f"{RELEASE_REV}:db/functions/50_events.sql"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    out = []
    for head in ("CREATE OR REPLACE FUNCTION switchboard.event_tick()",
                 "CREATE OR REPLACE FUNCTION switchboard._events_after("):
        a = src.index(head)
        out.append(src[a:src.index("$$;", src.index("AS $$", a) + 5) + 3])
    return "\n".join(out)


def base_tree(rev: str) -> Path:
    """server/ and db/functions/ of git revision ``rev``, exported to a temporary directory
    (--base: the same run's baseline is that revision's relay code and event functions)."""
    d = Path(tempfile.mkdtemp(prefix="lat-base-"))
    tar = subprocess.run(["git", "archive", rev, "server", "db/functions/50_events.sql"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=tar, check=True)
    return d


def stuck_socket(port: int, ticket: str) -> socket.socket:
    """A WebSocket whose client never reads a byte after the handshake (4 KiB receive
    buffer): a phone in a tunnel, or a hostile client."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws?ticket={ticket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = sock.recv(1)
        if not b:
            raise RuntimeError("stuck socket closed during the handshake")
        head += b
    return sock


def prefill(url: str, n: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("INSERT INTO switchboard.events (id, user_id, event, payload, created_at) "
                  "SELECT nextval('switchboard.event_id_seq'), (SELECT id FROM switchboard.users LIMIT 1), "
                  "'prefill', jsonb_build_object('k', -i), clock_timestamp() FROM generate_series(1, %s) i", (n,))
        c.execute("SELECT switchboard.event_tick()")
        c.execute("ANALYZE switchboard.events")


def _pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50": round(pct(xs, 50), 3), "p99": round(pct(xs, 99), 3), "max": round(max(xs), 3)}


def stages(trace_dir: Path, sent: dict[int, float], recs: list[list[Any]]) -> dict[str, Any]:
    """Join the replicas' latency_trace files (server/switchboard/latency_trace.py) with the
    publisher's COMMIT times and the client's receive times: per-stage gaps in ms, per event,
    and the reads' tick answers (-1 = another replica was ticking) and backoff delays."""
    time.sleep(0.6)  # the replicas flush every 0.25 s
    per_pid: dict[int, dict[str, Any]] = {}
    for f in sorted(trace_dir.glob("trace-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            d = per_pid.setdefault(r["pid"], {"heard": {}, "reads": {}, "events": {}, "written": {}})
            for i, t in r["heard"]:
                d["heard"].setdefault(i, t)
            for j, rd in enumerate(r["reads"]):
                d["reads"][r["read_base"] + j] = rd
            for rn, i, k, t in r["events"]:
                d["events"][k] = (rn, i, t)
            for i, t in r["written"]:
                d["written"].setdefault(i, t)
        f.unlink()
    client = {k: t for k, t, _ in recs}
    gaps: dict[str, list[float]] = {g: [] for g in (
        "commit_to_heard", "heard_to_read_start", "woke_to_read_start", "read_start_to_rows", "rows_to_offered",
        "offered_to_written", "written_to_client", "commit_to_client")}
    busy_before = 0
    after_busy: list[float] = []
    read_started_before_heard = 0
    reads: list[dict[str, Any]] = []
    for d in per_pid.values():
        reads += d["reads"].values()
        busy_t0 = sorted(r["t0"] for r in d["reads"].values() if r["tick"] == -1)
        for k, (rn, i, off) in d["events"].items():
            if k not in sent or k not in client or i not in d["written"]:
                continue  # every replica reads every event: only the one with its socket counts
            rd = d["reads"].get(rn)
            if rd is None:
                continue
            h = d["heard"].get(i)
            w = d["written"].get(i)
            ms = 1000.0
            gaps["commit_to_client"].append((client[k] - sent[k]) * ms)
            gaps["read_start_to_rows"].append((rd["t1"] - rd["t0"]) * ms)
            gaps["woke_to_read_start"].append((rd["t0"] - rd["woke"]) * ms)
            gaps["rows_to_offered"].append((off - rd["t1"]) * ms)
            if h is not None:
                gaps["commit_to_heard"].append((h - sent[k]) * ms)
                gaps["heard_to_read_start"].append((rd["t0"] - h) * ms)
                if rd["t0"] < h:
                    read_started_before_heard += 1
                elif any(h <= t < rd["t0"] for t in busy_t0):
                    busy_before += 1
                    after_busy.append((client[k] - sent[k]) * ms)
            if w is not None:
                gaps["offered_to_written"].append((w - off) * ms)
                gaps["written_to_client"].append((client[k] - w) * ms)
    ticks = [r["tick"] for r in reads if r["tick"] is not None]
    backoffs = [r["backoff"] * 1000 for r in reads if r["backoff"] is not None]
    return {"gaps_ms": {g: _pcts(v) for g, v in gaps.items()},
            "reads": len(reads), "tick_reads": len(ticks), "tick_busy": sum(1 for t in ticks if t < 0),
            "tick_nothing_new": sum(1 for t in ticks if t == 0), "backoff_ms": _pcts(backoffs),
            "rows_per_read": _pcts([float(r["n"]) for r in reads]),
            "events_after_a_busy_tick": busy_before, "commit_to_client_after_busy_ms": _pcts(after_busy), "events_read_before_heard": read_started_before_heard}


def _one(rcv: Receiver, url: str, sql: str, params: Any, n: int, rate: float,
         meter: CpuMeter | None = None, trace_dir: Path | None = None) -> dict[str, Any]:
    sent = asyncio.run(_publish(url, sql, params, n, rate))
    elapsed = sent.pop(-1)
    got = rcv.wait_count(n, 15)
    recs = rcv.dump()
    lat = _latencies(sent, recs)
    st = {"stages": stages(trace_dir, sent, recs)} if trace_dir is not None else {}
    cpu = {}
    if meter is not None:
        c = meter.stop()
        cpu = {"cpu_us_per_event": {"servers": round(c["workers_cpu_s"] / n * 1e6, 1),
                                    "postgres": round(c["postgres_cpu_s"] / n * 1e6, 1)}}
    return _summary(lat) | {"sent": n, "received": got, "achieved_rate": round(n / elapsed, 1),
                            "load1": loadavg()} | cpu | st


def log_stages(name: str, s: dict[str, Any]) -> None:
    log(f"  {name} stages (ms, p50 / p99):  " + "  ".join(
        f"{g} {v.get('p50')}/{v.get('p99')}" for g, v in s["gaps_ms"].items()))
    log(f"  {name} reads {s['reads']}, tick answers busy(-1) {s['tick_busy']} / {s['tick_reads']}, "
        f"nothing new {s['tick_nothing_new']}; backoff ms {s['backoff_ms']}; rows/read {s['rows_per_read']}; "
        f"events delivered after a busy tick {s['events_after_a_busy_tick']} "
        f"(their commit->client ms {s['commit_to_client_after_busy_ms']}), "
        f"by a read started before their NOTIFY was heard {s['events_read_before_heard']}")


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
    ap.add_argument("--before", action="store_true", help="also run 0.2.0's event functions (same rotation)")
    ap.add_argument("--alt-env", default="",
                    help="also run this code with extra replica env K=V,K=V as stack 'alt' (same rotation)")
    ap.add_argument("--base", default="",
                    help="also run git revision BASE's relay (server/) and 50_events.sql, same rotation, as 'base'")
    ap.add_argument("--prefill", type=int, default=0, help="events stored in each Switchboard database first")
    ap.add_argument("--pgss", action="store_true",
                    help="load pg_stat_statements (track=all) and report the top statements by total time")
    ap.add_argument("--trace", action="store_true",
                    help="per-stage timestamps from our replicas (SWITCHBOARD_LATENCY_TRACE); costs them some CPU")
    ap.add_argument("--live", action="store_true", help="the verified live path on in every Switchboard stack")
    ap.add_argument("--stuck-alt", type=float, default=0.0,
                    help="percent of extra sockets on the 'alt' stack that never read a byte (issue 30)")
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
    stuck: list[socket.socket] = []
    bares: list[Proc] = []
    rcvs: list[Receiver] = []
    stacks: list[dict[str, Any]] = []   # name, url, receiver, sql, params, pids
    try:
        import psycopg

        names = (["switchboard"] + (["alt"] if a.alt_env else []) + (["base"] if a.base else [])
                 + (["before"] if a.before else []))
        base_dir = base_tree(a.base) if a.base else None
        url = ""
        for name in names:
            db = cluster.new_db(f"sb_lat_{name}")
            url_s = cluster.url(db)
            ids = _users(url_s, a.users, "lat_u")
            with psycopg.connect(url_s, autocommit=True) as c:
                if a.pgss and name == "switchboard":
                    c.execute("CREATE EXTENSION pg_stat_statements")
                if name == "before":
                    c.execute(old_event_functions())
                if name == "base" and base_dir is not None:
                    c.execute((base_dir / "db/functions/50_events.sql").read_text())
                if a.live:
                    c.execute("SELECT switchboard.event_live_path(true)")
            if a.prefill:
                prefill(url_s, a.prefill)
            tdir = None
            env_ = dict(renv)
            if a.trace and name != "base":  # (another revision may have no trace hooks)
                tdir = Path(tempfile.mkdtemp(prefix=f"lat-trace-{name}-"))
                env_["SWITCHBOARD_LATENCY_TRACE"] = str(tdir)
            if name == "alt":
                env_.update(kv.split("=", 1) for kv in filter(None, a.alt_env.split(",")))
            if name == "base" and base_dir is not None:
                env_["PYTHONPATH"] = os.pathsep.join([str(base_dir / "server"), str(BENCH)])
            ps_ = [replica(cluster, db, f"lat-{name}{i}", env=env_) for i in range(a.replicas)]
            procs += ps_
            stacks.append({"name": name, "url": url_s, "db": db, "procs": ps_, "ids": ids, "trace": tdir,
                           "sql": "SELECT switchboard.notify_user(%s, 'bench', %s)",
                           "params": (lambda ids_: lambda k: (ids_[k % a.users], json.dumps({"k": k})))(ids)})
            url = url or url_s
        # The bare relay gets a database of its own: NOTIFY wakes every LISTENing backend
        # of its database, so sharing the first stack's put its 1,000 NOTIFYs/s on that
        # stack's LISTEN connections (the first stack measured worse, whatever its code).
        bare_db = cluster.new_db("sb_lat_bare")
        url = cluster.url(bare_db)
        env = dict(os.environ, DATABASE_URL=cluster.url(bare_db, APP_LOGIN))
        for i in range(a.replicas):
            port = free_port()
            bares.append(Proc([sys.executable, str(BENCH / "bare_app.py"), "--port", str(port), "--listen"],
                              env, port, f"lat-bare{i}"))
        stacks.append({"name": "bare", "url": url, "procs": bares, "sql": "SELECT pg_notify('bare_events', %s)",
                       "params": lambda k: (json.dumps({"u": str(k % a.users), "k": k}),)})
        _start(procs + bares)
        for st in stacks:
            if st["name"] == "bare":
                spec = _spec([f"{bares[i % a.replicas].ws_base}/ws?u={i}" for i in range(a.users)], hello=False)
            else:
                tickets = _tickets(st["url"], st["ids"])
                spec = _spec([f"{st['procs'][i % a.replicas].ws_base}/ws?ticket={t}" for i, t in enumerate(tickets)])
            st["rcv"] = Receiver("ws", spec)
            rcvs.append(st["rcv"])
            os.unlink(spec)
        if a.stuck_alt:
            alt = next(st for st in stacks if st["name"] == "alt")
            k = int(a.users * a.stuck_alt / 100)
            tickets = _tickets(alt["url"], alt["ids"][:k])
            stuck = [stuck_socket(alt["procs"][i % a.replicas].port, t) for i, t in enumerate(tickets)]
            log(f"{len(stuck)} sockets that never read on the alt stack (users 0..{k - 1}, who also have a "
                f"reading socket)")
        log(f"{a.users} sockets per stack on {a.replicas} replicas each; {a.rate:.0f} ev/s x {a.seconds} s; "
            f"{a.pairs} rounds of {' '.join(st['name'] for st in stacks)}; prefill {a.prefill}; "
            f"settings {settings or 'bench default (fsync off)'}; load {loadavg()}")
        time.sleep(1.0)
        for st in stacks:  # warm-up: first frames, plan caches, connections
            _one(st["rcv"], st["url"], st["sql"], st["params"], min(n, 300), a.rate, trace_dir=st.get("trace"))
        for p in range(a.pairs):
            rnd: dict[str, Any] = {}
            # Each round starts with another stack: the first slot of a round measured
            # worse whatever ran in it (p99 1.6x for the same code, BENCHMARKS.md issue 30).
            for st in stacks[p % len(stacks):] + stacks[:p % len(stacks)]:
                meter = CpuMeter(cluster, [x.pid for x in st["procs"]])
                rnd[st["name"]] = _one(st["rcv"], st["url"], st["sql"], st["params"], n, a.rate, meter,
                                       trace_dir=st.get("trace"))
                if "stages" in rnd[st["name"]]:
                    log_stages(st["name"], rnd[st["name"]]["stages"])
                time.sleep(0.5)
            b = rnd["bare"]
            for name in names:
                rnd[f"ratio_p99_{name}"] = round(rnd[name]["p99_ms"] / b["p99_ms"], 2)
                rnd[f"ratio_p50_{name}"] = round(rnd[name]["p50_ms"] / b["p50_ms"], 2) if b["p50_ms"] > 0 else None
            out["pairs"].append(rnd)
            log(f"round {p + 1}: " + " | ".join(
                f"{k} p50 {v['p50_ms']} p99 {v['p99_ms']} ms ({v['received']}/{n}) cpu/ev "
                f"{v['cpu_us_per_event']['servers']}+{v['cpu_us_per_event']['postgres']} us"
                for k, v in rnd.items() if isinstance(v, dict))
                + " | p99 ratios " + ", ".join(f"{name} {rnd[f'ratio_p99_{name}']}" for name in names)
                + f" | load {b['load1']}")
        if a.pgss:
            with psycopg.connect(url, autocommit=True) as c:
                out["pgss"] = [dict(zip(("calls", "total_ms", "mean_ms", "rows", "query"), r)) for r in c.execute(
                    "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), rows,"
                    " d.datname || ': ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 140)"
                    " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                    " ORDER BY total_exec_time DESC LIMIT 30").fetchall()]
            for r in out["pgss"]:
                log(f"   {r['calls']:>7} calls {r['total_ms']:>9} ms {r['mean_ms']:>8} ms/call  {r['query']}")
    finally:
        for s_ in stuck:
            s_.close()
        for r in rcvs:
            r.close()
        stop_all(procs + bares)
        cluster.stop()
    med = statistics.median
    ps = out["pairs"]
    if ps:
        summ: dict[str, Any] = {"load_end": loadavg()}
        for st in stacks:
            k = st["name"]
            summ[k] = {"p50_ms": med(x[k]["p50_ms"] for x in ps), "p99_ms": med(x[k]["p99_ms"] for x in ps),
                       "cpu_us_per_event": {w: med(x[k]["cpu_us_per_event"][w] for x in ps)
                                            for w in ("servers", "postgres")}}
        for name in names:
            summ[f"ratio_p99_{name}_median"] = med(x[f"ratio_p99_{name}"] for x in ps)
        out["summary"] = summ
        log(f"summary: {json.dumps(summ)}")
    write_json(Path(a.out), out)


if __name__ == "__main__":
    main()
