#!/usr/bin/env python3
"""Streams (issue 31): the chunk path end to end, the database side, the peer, light load.

    python bench/streams.py --mode cluster|db|peer|light|all [--quick] [options]

Every figure is a same-run A/B on this (shared, 2-core) box: both sides are up for the
whole mode, rounds alternate and the order rotates from round to round; each table
gives absolute figures and ratios, lost / duplicated / reordered chunks, offered and
delivered rates and the 1-minute load before / after each round.

--mode cluster  3 replicas (`switchboard serve`, SWITCHBOARD_HANDLERS=streams_handlers) on
                a throwaway PostgreSQL; S streams (100), one handler run per stream
                (bench/streams_handlers.py): mode "stream" = ctx.stream + s.send per chunk
                (the group append), mode "notify" = one ctx.notify_user per chunk (the
                per-chunk path). Readers: WebSockets in --readers processes
                (bench/streams_client.py), stream i's socket on a replica other than the one
                running its producer, subscribed ({"action": "stream.subscribe", "after": 0})
                before the first chunk. Chunks carry their send stamp (time.time_ns(), one clock);
                latency = frame read - stamp. Sweep of per-stream rates, --repeats rounds per rate
                and path (order rotating); per path the highest offered rate whose median p99 is
                <= 100 ms with every chunk delivered once, in order, and the median delivered rate
                >= 95 % of the offered one (a path is dropped after two failed rates in a row,
                unless --keep-going). stream_chunks is prefilled (100,000 chunks of closed
                streams) and ANALYZEd once: a steady state (an ANALYZE of the empty table makes
                the hub's read scan the table, BENCHMARKS.md issue 31). --pgss: pg_stat_statements
                and table scan counts per round; --cprofile DIR: the replicas under cProfile.
--mode db       a DURABLE cluster (fsync, synchronous_commit, full_page_writes on), pgbench
                clients: stream_append_many with B chunks per call over 100 streams per client
                (chunk table LOGGED, and UNLOGGED in a copy of the database), against one
                pg_notify per transaction with synchronous_commit = off, and one single-row
                INSERT per transaction (durable). Chunks/s, server CPU and WAL bytes per chunk.
--mode peer     bench/streams_peer/run.mjs (resumable-stream on redis-server) and our stream path
                (the cluster of --mode cluster) with the same streams / chunks / rate, alternating.
--mode light    100 streams x 30 chunks/s: p50 / p99 of the stream path, the per-chunk notify
                path and the bare relay of figure 5 (bench/bare_app.py: pg_notify -> LISTEN ->
                socket, no table; its producer: one Python process per replica, one pg_notify
                per chunk per transaction), rotating.

--quick: a smoke run of each mode in seconds (10 streams, short windows): checks the benchmark
itself, not the product. Results: bench/results/streams-<mode>.json; the last line printed is
the JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from common import (APP_LOGIN, BENCH, RESULTS, ROOT, Cluster, CpuMeter, Proc, free_port, loadavg,
                    log, machine_info, pct, replica, stop_all, write_json)
from e2e import _start, _tickets, _users

PEER_DIR = BENCH / "streams_peer"
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
P99_BOUND_MS = 100.0


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# -- readers ------------------------------------------------------------------------------------------
class Reader:
    """bench/streams_client.py in its own process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "streams_client.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        self.read()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ok"):
            raise RuntimeError(f"reader: {line!r} (exit {self.proc.poll()})")
        return line.strip()

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=20)
        except Exception:
            self.proc.kill()
            self.proc.wait()


def all_cmd(readers: list[Reader], lines: list[str]) -> list[str]:
    for r, line in zip(readers, lines):
        r.send(line)
    return [r.read() for r in readers]


def summarize(dumps: list[dict[str, Any]], n: int, streams: int, rate: float, t0_ns: int) -> dict[str, Any]:
    items = [it for d in dumps for it in d["items"]]
    lat = [x for d in dumps for x in d["lat_ms"]]
    got = sum(it["got"] for it in items)
    dup = sum(it["dup"] for it in items)
    gap = sum(it["gap"] for it in items)
    bad = sum(it["bad"] for it in items)
    lost = sum(max(0, it["n"] - (it["got"] - it["dup"])) for it in items)
    last = max((it["last_recv"] for it in items if it["last_recv"]), default=t0_ns)
    span = max(1e-9, (last - t0_ns) / 1e9)
    frames = sum(it["frames"] for it in items)
    errors = [e for it in items for e in it["errors"]][:5]
    out: dict[str, Any] = {
        "streams": streams, "chunks_per_stream": n, "rate_per_stream": rate,
        "offered_chunks_per_s": round(streams * rate) if rate > 0 else None,
        "expected": streams * n, "delivered": got, "lost": lost, "dup": dup, "gap_or_disorder": gap,
        "text_seq_mismatch": bad, "span_s": round(span, 3), "delivered_chunks_per_s": round(got / span, 1),
        "frames": frames, "chunks_per_frame": round(got / frames, 2) if frames else None,
        "ended": sum(1 for it in items if it["ended"]), "errors": errors}
    if lat:
        out |= {"p50_ms": round(pct(lat, 50), 2), "p90_ms": round(pct(lat, 90), 2), "p99_ms": round(pct(lat, 99), 2),
                "max_ms": round(max(lat), 2), "min_ms": round(min(lat), 3)}
    return out


def rate_passes(rs: list[dict[str, Any]]) -> bool:
    """The repeats of one rate: nothing lost / duplicated / reordered in any, median p99 within the
    bound, median delivered rate >= 95 % of the offered one."""
    if any(r["lost"] or r["dup"] or r["gap_or_disorder"] or r["text_seq_mismatch"] for r in rs):
        return False
    p99 = statistics.median(r.get("p99_ms", 1e9) for r in rs)
    ok = p99 <= P99_BOUND_MS
    if rs[0].get("offered_chunks_per_s"):
        ok = ok and statistics.median(r["delivered_chunks_per_s"] for r in rs) >= 0.95 * rs[0]["offered_chunks_per_s"]
    return ok


def passes(r: dict[str, Any]) -> bool:
    ok = (r["lost"] == 0 and r["dup"] == 0 and r["gap_or_disorder"] == 0 and r["text_seq_mismatch"] == 0
          and r.get("p99_ms", 1e9) <= P99_BOUND_MS)
    if r.get("offered_chunks_per_s"):
        ok = ok and r["delivered_chunks_per_s"] >= 0.95 * r["offered_chunks_per_s"]
    return ok


# -- the Switchboard stack (cluster, peer, light) ---------------------------------------------------------------
class Stack:
    def __init__(self, streams: int, replicas: int, readers: int, fsync: bool, bare: bool = False,
                 cprofile: str = "", pgss: bool = False) -> None:
        self.streams, self.n_rep = streams, replicas
        settings = dict(DURABLE) if fsync else {}
        if pgss:
            settings |= {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
        self.pgss = pgss
        self.cluster = Cluster(settings or None)
        self.procs: list[Proc] = []
        self.bares: list[Proc] = []
        self.readers: list[Reader] = []
        try:
            self.db = self.cluster.new_db("sb_streams")
            self.url = self.cluster.url(self.db)
            self.ids = _users(self.url, streams, "st_u")
            if pgss:
                with psycopg.connect(self.url, autocommit=True) as c:
                    c.execute("CREATE EXTENSION pg_stat_statements")
            self._prefill()
            with psycopg.connect(self.url, autocommit=True) as c:   # no maintenance run in the middle of a round
                c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                               FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
            env = {"SWITCHBOARD_HANDLERS": "streams_handlers",
                   "SWITCHBOARD_SCHEDULER_CONCURRENCY": str(math.ceil(streams / replicas) + 2),
                   "SWITCHBOARD_POLL_INTERVAL": "0.2"}
            self.procs = [replica(self.cluster, self.db, f"streams-r{i}", env=env) for i in range(replicas)]
            if cprofile:    # each replica under cProfile on CPU time (bench/cprofile_serve.py), dumped at exit
                Path(cprofile).mkdir(parents=True, exist_ok=True)
                for i, p in enumerate(self.procs):
                    p.cmd = [sys.executable, str(BENCH / "cprofile_serve.py"), str(Path(cprofile) / f"r{i}.pstats"),
                             *p.cmd[p.cmd.index("serve"):]]
            if bare:
                self.bare_db = self.cluster.new_db("sb_streams_bare")
                benv = dict(os.environ, DATABASE_URL=self.cluster.url(self.bare_db, APP_LOGIN))
                for i in range(replicas):
                    port = free_port()
                    self.bares.append(Proc([sys.executable, str(BENCH / "bare_app.py"), "--port", str(port),
                                            "--listen"], benv, port, f"streams-bare{i}"))
            _start(self.procs + self.bares)
            self.readers = [Reader() for _ in range(readers)]
            self.pid_rep = {p.pid: i for i, p in enumerate(self.procs)}
        except BaseException:
            self.close()
            raise

    def _prefill(self, streams: int = 200, chunks: int = 500) -> None:
        """A steady state rather than an empty table: closed streams' chunks (as within the
        5-minute retention), then ANALYZE. Measured: with the statistics of an EMPTY
        stream_chunks (a VACUUM ANALYZE after every chunk was reaped), the relay's read
        (stream_read_many, its plan cached in the hub's session) scans the whole table once
        per stream per read until the next ANALYZE -- see BENCHMARKS.md, issue 31."""
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("""DO $$ DECLARE u uuid; s uuid; BEGIN
                u := switchboard.create_user('st_prefill', '%s');
                FOR i IN 1..%s LOOP
                    s := switchboard.stream_open(u, 'prefill');
                    PERFORM switchboard.stream_append(s, ARRAY(SELECT g || ':0:xxxxxxxx' FROM generate_series(1, %s) g));
                    PERFORM switchboard.stream_close(s, 'done', NULL);
                END LOOP; END $$""" % (ARGON, int(streams), int(chunks)))
            c.execute("ANALYZE switchboard.stream_chunks")
            c.execute("ANALYZE switchboard.streams")

    def top_statements(self, limit: int = 15) -> list[dict[str, Any]]:
        """pg_stat_statements (track = all: the statements inside the functions too), by total time."""
        with psycopg.connect(self.url, autocommit=True) as c:
            return [dict(zip(("calls", "total_ms", "mean_ms", "rows", "query"), r)) for r in c.execute(
                "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), rows,"
                " left(regexp_replace(query, '\\s+', ' ', 'g'), 160) FROM pg_stat_statements"
                " ORDER BY total_exec_time DESC LIMIT %s", (limit,)).fetchall()]

    def reset_statements(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("SELECT pg_stat_statements_reset()")
            c.execute("SELECT pg_stat_reset()")

    def table_stats(self) -> list[dict[str, Any]]:
        with psycopg.connect(self.url, autocommit=True) as c:
            cols = ("relname", "seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch", "n_tup_upd", "n_tup_hot_upd",
                    "n_live_tup", "n_dead_tup")
            return [dict(zip(cols, r)) for r in c.execute(
                f"SELECT {', '.join(cols)} FROM pg_stat_user_tables WHERE schemaname = 'switchboard'"
                " AND relname IN ('streams', 'stream_chunks', 'events')").fetchall()]

    def close(self) -> None:
        for r in self.readers:
            r.close()
        stop_all(self.procs + self.bares)
        self.cluster.stop()

    def rep_of(self, pid: int, idx: int) -> int:
        if pid in self.pid_rep:
            return self.pid_rep[pid]
        try:   # a child of the replica's process
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            return self.pid_rep.get(ppid, idx % self.n_rep)
        except (OSError, ValueError, IndexError):
            return idx % self.n_rep

    def round(self, mode: str, rate: float, n: int, filler: int = 8) -> dict[str, Any]:
        """One measured run: S streams of n chunks at ``rate`` each, in ``mode`` (stream, notify, bare)."""
        S = self.streams
        d = tempfile.mkdtemp(prefix="sbstreams-")
        os.chmod(d, 0o777)
        load0 = loadavg()
        phase = (lambda i: (i / S) / rate) if rate > 0 else (lambda i: 0.0)
        run_ids: list[int] = []
        pubs: list[subprocess.Popen] = []
        if mode == "bare":
            # one publisher process per replica (as the handlers run on every replica), each with 10 connections
            for k in range(self.n_rep):
                spec = {"url": self.cluster.url(self.bare_db), "streams": S, "n": n, "rate": rate, "dir": d,
                        "filler": filler, "part": k, "parts": self.n_rep}
                pubs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_bare-publisher",
                                              json.dumps(spec)], cwd=str(ROOT)))
            items = [{"idx": i, "n": n, "stream": None,
                      "url": f"{self.bares[(i + 1) % self.n_rep].ws_base}/ws?u={i}"} for i in range(S)]
            while sum(os.path.exists(os.path.join(d, f"ready{k}")) for k in range(self.n_rep)) < self.n_rep:
                if any(p.poll() is not None for p in pubs):
                    raise RuntimeError("a bare publisher exited")
                time.sleep(0.02)
        else:
            with psycopg.connect(self.url) as c:
                for i in range(S):
                    args = {"user_id": self.ids[i], "chunks": n, "rate": rate, "mode": mode, "idx": i, "dir": d,
                            "phase": phase(i), "filler": filler}
                    run_ids.append(c.execute("SELECT id FROM switchboard.enqueue('bench.stream', %s, now(), NULL, 1)",
                                             (json.dumps(args),)).fetchone()[0])
                c.commit()
            ready = self._wait_ready(d, S, run_ids)
            tickets = _tickets(self.url, self.ids[:S])
            items = []
            for i in range(S):
                cons = (self.rep_of(ready[i]["pid"], i) + 1) % self.n_rep
                items.append({"idx": i, "n": n, "stream": ready[i]["stream"],
                              "url": f"{self.procs[cons].ws_base}/ws?ticket={tickets[i]}"})
        R = len(self.readers)
        specs = []
        for k in range(R):
            f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump({"mode": mode, "items": items[k::R]}, f)
            f.close()
            specs.append(f.name)
        opened = all_cmd(self.readers, [f"open {p}" for p in specs])
        for p in specs:
            os.unlink(p)
        time.sleep(0.5)                       # the subscriptions are in place
        servers = self.bares if mode == "bare" else self.procs
        meter = CpuMeter(self.cluster, [p.pid for p in servers])
        cmeter = CpuMeter(self.cluster, [r.proc.pid for r in self.readers] + [p.pid for p in pubs])
        if self.pgss:
            self.reset_statements()
        t0 = time.time_ns() + 200_000_000
        with open(os.path.join(d, ".go"), "w") as f:
            f.write(str(t0))
        os.rename(os.path.join(d, ".go"), os.path.join(d, "go"))
        dur = (n / rate) if rate > 0 else 0.0
        all_cmd(self.readers, [f"wait {dur + 30 + n * S / 2000:.1f}"] * R)
        cpu = meter.stop()
        ccpu = cmeter.stop()
        load1 = loadavg()
        dumps = []
        for r in self.readers:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            r.send(f"dump {path}")
            r.read()
            dumps.append(json.loads(Path(path).read_text()))
            os.unlink(path)
        res = summarize(dumps, n, S, rate, t0)
        res |= {"mode": mode, "load1_before": load0, "load1_after": load1,
                "cpu_s": {"servers": cpu["workers_cpu_s"], "postgres": cpu["postgres_cpu_s"],
                          "clients": ccpu["workers_cpu_s"]}}
        if res["delivered"]:
            res["cpu_us_per_chunk"] = {k: round(v / res["delivered"] * 1e6, 1) for k, v in res["cpu_s"].items()}
        res["open"] = opened
        for pub in pubs:
            try:
                pub.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pub.kill()
                pub.wait()
        if not pubs:
            res["runs"] = self._finish(run_ids)
        shutil.rmtree(d, ignore_errors=True)
        if self.pgss:
            res["pg_stat_statements"] = self.top_statements()
            res["table_stats"] = self.table_stats()
        self._clean(mode)
        return res

    def _wait_ready(self, d: str, S: int, run_ids: list[int], timeout: float = 120) -> dict[int, dict[str, Any]]:
        deadline = time.time() + timeout
        while True:
            names = [x for x in os.listdir(d) if x.startswith("ready-")]
            if len(names) >= S:
                break
            if time.time() > deadline:
                raise RuntimeError(f"only {len(names)}/{S} producers ready after {timeout} s")
            time.sleep(0.05)
        out = {}
        for x in names:
            out[int(x.split("-", 1)[1])] = json.loads(Path(d, x).read_text())
        return out

    def _finish(self, run_ids: list[int], timeout: float = 60) -> dict[str, Any]:
        deadline = time.time() + timeout
        with psycopg.connect(self.url, autocommit=True) as c:
            while True:
                rows = c.execute("SELECT status, result FROM switchboard.task_runs WHERE id = ANY(%s)",
                                 (run_ids,)).fetchall()
                st = [r[0] for r in rows]
                if all(s in ("succeeded", "failed", "cancelled", "abandoned") for s in st):
                    break
                if time.time() > deadline:
                    for rid in run_ids:
                        c.execute("SELECT switchboard.cancel_run(%s)", (rid,))
                    time.sleep(2)
                    deadline = time.time() + 30
            late = sum(int((r[1] or {}).get("late", 0)) for r in rows if isinstance(r[1], dict))
            pids = {(r[1] or {}).get("pid") for r in rows if isinstance(r[1], dict)}
        counts: dict[str, int] = {}
        for s in st:
            counts[s] = counts.get(s, 0) + 1
        return {"status": counts, "chunks_sent_late_over_1ms": late,
                "producer_replicas": len(pids - {None})}

    def _clean(self, mode: str) -> None:
        """The next round starts from the same tables: the round's streams (and their chunks) go;
        stream_chunks keeps the prefill and its statistics (no ANALYZE of a near-empty table)."""
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("DELETE FROM switchboard.streams WHERE status <> 'open' AND kind = 'bench'")
            c.execute("VACUUM switchboard.streams")     # (its dead versions: every append updates the row)


async def bare_publisher(spec: dict[str, Any]) -> None:
    """The bare relay's producer: one pg_notify('bare_events', {"u", "k": chunk}) per chunk,
    autocommit, paced and stamped like the handlers (bench/streams_handlers._paced)."""
    from streams_handlers import _go, _paced

    S, n, rate, d, filler = spec["streams"], spec["n"], spec["rate"], spec["dir"], "x" * spec["filler"]
    part, parts = spec.get("part", 0), spec.get("parts", 1)
    conns = [await psycopg.AsyncConnection.connect(spec["url"], autocommit=True) for _ in range(min(S, 10))]
    Path(d, f"ready{part}").write_text("1")
    t0 = await _go(d)

    async def one(i: int) -> None:
        c = conns[i % len(conns)]
        phase = int((i / S) / rate * 1e9) if rate > 0 else 0

        async def send(k: int, ts: int) -> None:
            await c.execute("SELECT pg_notify('bare_events', %s)", (json.dumps({"u": str(i), "k": f"{k}:{ts}:{filler}"}),))
        await _paced(n, rate, t0 + phase, send)
    await asyncio.gather(*(one(i) for i in range(part, S, parts)))
    for c in conns:
        await c.close()


# -- tables --------------------------------------------------------------------------------------------------------
def fmt_round(r: dict[str, Any]) -> str:
    off = r.get("offered_chunks_per_s") or "max"
    return (f"| {r['mode']} | {r['streams']}x{r['chunks_per_stream']} @ {r['rate_per_stream']:g}/s | {off} | "
            f"{r['delivered_chunks_per_s']:.0f} | {r.get('p50_ms', '-')} | {r.get('p99_ms', '-')} | "
            f"{r.get('max_ms', '-')} | {r['delivered']}/{r['expected']} | {r['lost']}/{r['dup']}/{r['gap_or_disorder']} | "
            f"{r.get('chunks_per_frame') or '-'} | "
            f"{r.get('cpu_us_per_chunk', {}).get('servers', '-')}/{r.get('cpu_us_per_chunk', {}).get('postgres', '-')}/"
            f"{r.get('cpu_us_per_chunk', {}).get('clients', '-')} | {r['load1_before']:.1f}-{r['load1_after']:.1f} | "
            f"{'ok' if passes(r) else 'FAIL'} |")


ROUND_HEAD = ("| path | load | offered /s | delivered /s | p50 ms | p99 ms | max ms | delivered | lost/dup/disorder | "
              "chunks/frame | CPU µs/chunk servers/PG/clients | load1 | ≤100 ms |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


# -- --mode cluster -------------------------------------------------------------------------------------------
def mode_cluster(a: argparse.Namespace) -> dict[str, Any]:
    rates = [float(x) for x in a.rates.split(",")]
    st = Stack(a.streams, a.replicas, a.readers, a.fsync, cprofile=a.cprofile, pgss=a.pgss)
    rounds: list[dict[str, Any]] = []
    try:
        log(f"cluster: {a.streams} streams on {a.replicas} replicas, {a.readers} reader processes, rates/stream "
            f"{rates}, {a.seconds} s windows; load {loadavg()}")
        for mode in a.modes.split(","):                                 # warm-up: connections, plans
            st.round(mode, rates[0], max(10, int(rates[0])))
        fails: dict[str, int] = {}
        paths = a.modes.split(",")
        k = 0
        for rate in rates:
            for rep in range(a.repeats):
                order = paths[k % len(paths):] + paths[:k % len(paths)]     # rotates every round
                k += 1
                for mode in order:
                    if fails.get(mode, 0) >= 2 and not a.keep_going:
                        continue
                    r = st.round(mode, rate, max(1, int(rate * a.seconds)))
                    r["repeat"] = rep
                    if a.pgss:
                        log(f"   tables: {r['table_stats']}")
                        for x in r["pg_stat_statements"][:8]:
                            log(f"   {x['calls']:>7} calls {x['total_ms']:>9} ms {x['mean_ms']:>8} ms/call  {x['query']}")
                    rounds.append(r)
                    log(fmt_round(r))
            for mode in paths:
                rs = [r for r in rounds if r["mode"] == mode and r["rate_per_stream"] == rate]
                if rs:
                    fails[mode] = 0 if rate_passes(rs) else fails.get(mode, 0) + 1
            if all(fails.get(m, 0) >= 2 for m in paths) and not a.keep_going:
                break
    finally:
        st.close()
    summ: dict[str, Any] = {"p99_bound_ms": P99_BOUND_MS, "repeats": a.repeats,
                            "rule": "a rate passes when every repeat lost / duplicated / reordered nothing, the "
                                    "median p99 of its repeats is <= the bound and the median delivered rate is "
                                    ">= 95 % of the offered one"}
    per_rate: list[dict[str, Any]] = []
    for rate in rates:
        row: dict[str, Any] = {"rate_per_stream": rate, "offered": round(a.streams * rate)}
        for mode in ("stream", "notify"):
            rs = [r for r in rounds if r["mode"] == mode and r["rate_per_stream"] == rate]
            if rs:
                row[mode] = {"p50_ms": statistics.median(r["p50_ms"] for r in rs),
                             "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                             "delivered_per_s": statistics.median(r["delivered_chunks_per_s"] for r in rs),
                             "lost_dup_disorder": sum(r["lost"] + r["dup"] + r["gap_or_disorder"] for r in rs),
                             "pass": rate_passes(rs), "rounds": len(rs)}
        if "stream" in row and "notify" in row:
            row["p99_notify_over_stream"] = round(row["notify"]["p99_ms"] / row["stream"]["p99_ms"], 2)
        per_rate.append(row)
    summ["per_rate"] = per_rate
    for mode in ("stream", "notify"):
        ok = [x for x in per_rate if mode in x and x[mode]["pass"]]
        best = max(ok, key=lambda x: x["offered"], default=None)
        summ[mode] = {"max_offered_ok": best["offered"] if best else 0, "at_max": best[mode] if best else None}
    if summ["notify"]["max_offered_ok"]:
        summ["ratio_max_offered_ok"] = round(summ["stream"]["max_offered_ok"] / summ["notify"]["max_offered_ok"], 1)
    print("\n| offered /s | stream: delivered /s, p50 / p99 ms (median of repeats) | notify: delivered /s, p50 / p99 ms | "
          "p99 notify / stream | lost+dup+disorder stream / notify |\n|---|---|---|---|---|")
    for x in per_rate:
        cell = {m: (f"{x[m]['delivered_per_s']:.0f}, {x[m]['p50_ms']} / {x[m]['p99_ms']} "
                    f"{'ok' if x[m]['pass'] else 'FAIL'}") if m in x else "-" for m in ("stream", "notify")}
        print(f"| {x['offered']} | {cell['stream']} | {cell['notify']} | {x.get('p99_notify_over_stream', '-')} | "
              f"{x.get('stream', {}).get('lost_dup_disorder', '-')} / {x.get('notify', {}).get('lost_dup_disorder', '-')} |")
    print("\n" + ROUND_HEAD + "\n" + "\n".join(fmt_round(r) for r in rounds))
    return {"rounds": rounds, "summary": summ}


# -- --mode light -----------------------------------------------------------------------------------------------
def mode_light(a: argparse.Namespace) -> dict[str, Any]:
    st = Stack(a.streams, a.replicas, a.readers, a.fsync, bare=not a.no_bare)
    paths = ["stream", "notify"] + ([] if a.no_bare else ["bare"])
    n = int(a.light_rate * a.light_seconds)
    rounds: list[dict[str, Any]] = []
    try:
        log(f"light: {a.streams} streams x {a.light_rate:g} chunks/s x {a.light_seconds} s, {a.pairs} rounds of "
            f"{paths} (rotating); load {loadavg()}")
        for p in paths:
            st.round(p, a.light_rate, max(10, int(a.light_rate)))    # warm-up
        for k in range(a.pairs):
            for p in paths[k % len(paths):] + paths[:k % len(paths)]:
                r = st.round(p, a.light_rate, n)
                r["pair"] = k
                rounds.append(r)
                log(fmt_round(r))
    finally:
        st.close()
    med = statistics.median
    summ: dict[str, Any] = {}
    for p in paths:
        rs = [r for r in rounds if r["mode"] == p]
        summ[p] = {"p50_ms": med(r["p50_ms"] for r in rs), "p99_ms": med(r["p99_ms"] for r in rs),
                   "lost": sum(r["lost"] for r in rs), "dup": sum(r["dup"] for r in rs),
                   "cpu_us_per_chunk": {w: med(r["cpu_us_per_chunk"][w] for r in rs)
                                        for w in ("servers", "postgres", "clients")}}
    for p in paths[1:]:
        rat = [x["p99_ms"] / y["p99_ms"] for x, y in zip([r for r in rounds if r["mode"] == p],
                                                           [r for r in rounds if r["mode"] == "stream"])]
        rat50 = [x["p50_ms"] / y["p50_ms"] for x, y in zip([r for r in rounds if r["mode"] == p],
                                                             [r for r in rounds if r["mode"] == "stream"])]
        summ[f"p99_{p}_over_stream_median"] = round(med(rat), 2)
        summ[f"p50_{p}_over_stream_median"] = round(med(rat50), 2)
    print("\n" + ROUND_HEAD + "\n" + "\n".join(fmt_round(r) for r in rounds))
    return {"rounds": rounds, "summary": summ}


# -- --mode peer ----------------------------------------------------------------------------------------------
def run_peer(streams: int, chunks: int, rate: float, consumer_procs: int) -> dict[str, Any]:
    opts = {"streams": streams, "chunks": chunks, "rate": rate, "chunkBytes": 8, "consumerProcs": consumer_procs}
    p = subprocess.run(["node", "run.mjs", "-"], cwd=str(PEER_DIR), input=json.dumps(opts), capture_output=True,
                       text=True, timeout=600)
    line = (p.stdout.strip().splitlines() or ["{}"])[-1]
    out = json.loads(line)
    if p.returncode != 0 or "error" in out:
        raise RuntimeError(f"peer failed: {line} {p.stderr[-1000:]}")
    return out


def mode_peer(a: argparse.Namespace) -> dict[str, Any]:
    if not (PEER_DIR / "node_modules").exists():
        subprocess.run(["npm", "ci"], cwd=str(PEER_DIR), check=True)
    configs = [tuple(float(x) for x in c.split("x")) for c in a.peer_configs.split(",")]   # streams x chunks x rate
    S = int(max(c[0] for c in configs))
    st = Stack(S, a.replicas, a.readers, a.fsync)
    rows: list[dict[str, Any]] = []
    try:
        log(f"peer: configs {configs}, {a.pairs} rounds each, alternating ours / peer; load {loadavg()}")
        st.round("stream", 30, 30)
        run_peer(10, 50, 50, a.readers)
        for streams, chunks, rate in configs:
            st.streams = int(streams)
            for k in range(a.pairs):
                pair: dict[str, Any] = {"streams": int(streams), "chunks": int(chunks), "rate": rate, "pair": k}
                for side in (["ours", "peer"] if k % 2 == 0 else ["peer", "ours"]):
                    if side == "ours":
                        pair["ours"] = st.round("stream", rate, int(chunks))
                    else:
                        l0 = loadavg()
                        pair["peer"] = run_peer(int(streams), int(chunks), rate, a.readers) | {"load1_before": l0}
                o, p = pair["ours"], pair["peer"]
                pair["rate_ours_over_peer"] = round(o["delivered_chunks_per_s"] / p["chunks_per_s"], 2)
                pair["p99_ours_over_peer"] = round(o["p99_ms"] / p["p99_ms"], 2) if p.get("p99_ms") else None
                rows.append(pair)
                log(f"{int(streams)}x{int(chunks)}@{rate:g}: ours {o['delivered_chunks_per_s']:.0f}/s p50 {o['p50_ms']} "
                    f"p99 {o['p99_ms']} lost {o['lost']} dup {o['dup']} | peer {p['chunks_per_s']:.0f}/s p50 "
                    f"{p['p50_ms']} p99 {p['p99_ms']} lost {p['lost']} dup {p['dup_or_disorder']} | load "
                    f"{o['load1_before']:.1f}/{p['load1_before']:.1f}")
    finally:
        st.close()
    med = statistics.median
    summ = []
    print("\n| load | ours delivered/s | ours p50 / p99 ms | peer delivered/s | peer p50 / p99 ms | rate ours/peer | "
          "p99 ours/peer | lost+dup ours / peer | CPU s ours (servers+PG+clients) / peer (node+redis) | load1 |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o, p = r["ours"], r["peer"]
        print(f"| {r['streams']}x{r['chunks']} @ {r['rate']:g}/s | {o['delivered_chunks_per_s']:.0f} | {o['p50_ms']} / "
              f"{o['p99_ms']} | {p['chunks_per_s']:.0f} | {p['p50_ms']} / {p['p99_ms']} | {r['rate_ours_over_peer']} | "
              f"{r['p99_ours_over_peer']} | {o['lost'] + o['dup']} / {p['lost'] + p['dup_or_disorder']} | "
              f"{sum(o['cpu_s'].values()):.1f} / {p['node_cpu_s'] + p['redis_cpu_s']:.1f} | "
              f"{o['load1_before']:.1f}/{p['load1_before']:.1f} |")
    for streams, chunks, rate in configs:
        rs = [r for r in rows if (r["streams"], r["chunks"], r["rate"]) == (int(streams), int(chunks), rate)]
        summ.append({"streams": int(streams), "chunks": int(chunks), "rate": rate,
                     "ours_chunks_per_s": med(r["ours"]["delivered_chunks_per_s"] for r in rs),
                     "ours_p99_ms": med(r["ours"]["p99_ms"] for r in rs),
                     "peer_chunks_per_s": med(r["peer"]["chunks_per_s"] for r in rs),
                     "peer_p99_ms": med(r["peer"]["p99_ms"] for r in rs),
                     "rate_ours_over_peer_median": med(r["rate_ours_over_peer"] for r in rs),
                     "p99_ours_over_peer_median": med(r["p99_ours_over_peer"] for r in rs),
                     "lost_dup_ours": sum(r["ours"]["lost"] + r["ours"]["dup"] for r in rs),
                     "lost_dup_peer": sum(r["peer"]["lost"] + r["peer"]["dup_or_disorder"] for r in rs)})
    return {"rows": rows, "summary": summ}


# -- --mode db --------------------------------------------------------------------------------------------------
DB_SETUP = """
CREATE TABLE bench_groups (g integer, b integer, ids uuid[], PRIMARY KEY (g, b));
CREATE TABLE bench_chunks (b integer PRIMARY KEY, chunks text[]);
CREATE TABLE bench_rows (stream_id uuid NOT NULL, seq bigint NOT NULL, data text NOT NULL, PRIMARY KEY (stream_id, seq));
CREATE SEQUENCE bench_rows_seq;
"""
ARGON = "$argon2id$v=19$m=65536,t=3,p=4$YmVuY2hzYWx0$YmVuY2hoYXNoYmVuY2hoYXNo"
CHUNK = "1-1700000000000000000-xxxxxxxx"   # 30 characters, as in the other modes (no ":": pgbench variables)


def pgbench_binary(bindir: str) -> str:
    for cand in (os.path.join(bindir, "pgbench"), shutil.which("pgbench") or ""):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit("pgbench not found")


def server_cpu(postmaster: int) -> float:
    """CPU of the postmaster and its children (live and reaped: cutime/cstime of the postmaster)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    parts = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total += sum(int(x) for x in parts[11:15])
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                p = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(p[1]) == postmaster:
                    total += int(p[11]) + int(p[12])
            except (OSError, IndexError, ValueError):
                pass
    return total / tick


def mode_db(a: argparse.Namespace) -> dict[str, Any]:
    from switchboard.migrate import migrate
    from switchboard.pgtest import ThrowawayPostgres

    clients = [int(x) for x in a.db_clients.split(",")]
    batches = [int(x) for x in a.db_batches.split(",")]
    spg = a.db_streams_per_client
    pg = ThrowawayPostgres(dict(DURABLE, max_connections="200", max_wal_size="4GB"))
    pgbench = pgbench_binary(pg.bindir)
    tmp = Path(tempfile.mkdtemp(prefix="sbstreams-db-"))
    rows: list[dict[str, Any]] = []
    listener = None
    try:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute('CREATE DATABASE "sb_st_logged"')
            settings = dict(c.execute("SELECT name, setting FROM pg_settings WHERE name IN ('fsync', "
                                      "'synchronous_commit', 'full_page_writes', 'wal_level', 'max_wal_size', "
                                      "'shared_buffers', 'server_version')").fetchall())
        migrate(pg.url("sb_st_logged"))
        with psycopg.connect(pg.url("sb_st_logged"), autocommit=True) as c:
            c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                           FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
            c.execute(DB_SETUP)
            c.execute("CREATE EXTENSION pg_walinspect")
            c.execute("INSERT INTO bench_chunks SELECT b, array_fill(%s::text, ARRAY[b]) FROM unnest(%s::int[]) b",
                      (CHUNK, batches))
            for g in range(max(clients)):
                uid = c.execute("SELECT switchboard.create_user(%s, %s)", (f"bench{g}", ARGON)).fetchone()[0]
                sids = [c.execute("SELECT switchboard.stream_open(%s, 'bench', '{}', NULL, '1 hour', '1 day')",
                                  (uid,)).fetchone()[0] for _ in range(spg)]
                for b in batches:
                    c.execute("INSERT INTO bench_groups VALUES (%s, %s, %s)", (g, b, [sids[i % spg] for i in range(b)]))
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute('CREATE DATABASE "sb_st_unlogged" TEMPLATE "sb_st_logged"')
        with psycopg.connect(pg.url("sb_st_unlogged"), autocommit=True) as c:
            c.execute("ALTER TABLE switchboard.stream_chunks SET UNLOGGED")
            persistence = c.execute("SELECT relpersistence FROM pg_class WHERE oid = 'switchboard.stream_chunks'::regclass"
                                    ).fetchone()[0]
        assert persistence == "u", persistence
        variants: dict[str, tuple[str, str, int, dict[str, str]]] = {}   # name -> (db, script, chunks/txn, env)
        for b in batches:
            script = tmp / f"group{b}.sql"
            script.write_text(
                "SELECT count(*) FROM switchboard.stream_append_many("
                f"(SELECT ids FROM bench_groups WHERE g = :client_id AND b = {b}), "
                f"(SELECT chunks FROM bench_chunks WHERE b = {b}));\n")
            variants[f"group{b}_logged"] = ("sb_st_logged", str(script), b, {})
            variants[f"group{b}_unlogged"] = ("sb_st_unlogged", str(script), b, {})
        (tmp / "notify.sql").write_text(f"SELECT pg_notify('bench_chunks', '{CHUNK}');\n")
        variants["notify_async"] = ("sb_st_logged", str(tmp / "notify.sql"), 1,
                                    {"PGOPTIONS": "-c synchronous_commit=off"})
        (tmp / "insert.sql").write_text(
            "INSERT INTO bench_rows VALUES (('00000000-0000-0000-0000-' || lpad(:client_id::text, 12, '0'))::uuid, "
            f"nextval('bench_rows_seq'), '{CHUNK}');\n")
        variants["insert"] = ("sb_st_logged", str(tmp / "insert.sql"), 1, {})
        listener = psycopg.connect(pg.url("sb_st_logged"), autocommit=True)
        listener.execute("LISTEN bench_chunks")
        listener.execute("LISTEN switchboard_stream")
        names = list(variants)
        log(f"db: durable cluster {settings}; variants {names}; clients {clients}; {a.db_seconds} s x "
            f"{a.db_rounds} rounds, order rotating; load {loadavg()}")
        print("| round | clients | variant | chunks/s | txn/s | server CPU µs/chunk | WAL B/chunk (of which FPI) | "
              "streams HOT/all updates | load1 |\n|---|---|---|---|---|---|---|---|---|", flush=True)
        k = 0
        upd_prev: dict[str, tuple[int, int]] = {}
        for rnd in range(a.db_rounds):
            for n in clients:
                order = names[k % len(names):] + names[:k % len(names)]
                k += 1
                for v in order:
                    db, script, per, env = variants[v]
                    with psycopg.connect(pg.url(db), autocommit=True) as c:
                        c.execute("TRUNCATE switchboard.stream_chunks, bench_rows")
                        c.execute("CHECKPOINT")
                        lsn0 = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
                    cmd = [pgbench, "-n", "-M", "prepared", "-c", str(n), "-j", str(min(n, 2)), "-T",
                           str(a.db_seconds), "-f", script, "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", db]
                    load0 = loadavg()
                    cpu0 = server_cpu(pg.pid)
                    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env),
                                       timeout=a.db_seconds * 4 + 60)
                    time.sleep(0.3)                   # the backends exit and are reaped (cutime)
                    cpu = server_cpu(pg.pid) - cpu0
                    with psycopg.connect(pg.url(db), autocommit=True) as c:
                        lsn1 = c.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                        wal = c.execute("SELECT %s::pg_lsn - %s::pg_lsn", (lsn1, lsn0)).fetchone()[0]
                        # where the WAL went: record bytes per resource manager, and full-page images
                        ws = c.execute("SELECT \"resource_manager/record_type\", sum(count)::bigint, sum(record_size)::bigint,"
                                       " sum(fpi_size)::bigint FROM pg_get_wal_stats(%s, %s)"
                                       " GROUP BY 1 HAVING sum(combined_size) > 0", (lsn0, lsn1)).fetchall()
                        upd = c.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                                        " WHERE relid = 'switchboard.streams'::regclass").fetchone()
                    for _ in listener.notifies(timeout=0.05):
                        pass
                    text = p.stdout + p.stderr
                    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
                    done = re.search(r"number of transactions actually processed: (\d+)", text)
                    failed = re.search(r"number of failed transactions: (\d+)", text)
                    if p.returncode != 0 or not tps or not done:
                        raise RuntimeError(f"pgbench {v} failed:\n{text[-2000:]}")
                    chunks = int(done.group(1)) * per
                    upd0 = upd_prev.get(db, (0, 0))
                    upd_prev[db] = upd
                    r = {"round": rnd, "clients": n, "variant": v, "chunks_per_txn": per,
                         "txn_per_s": float(tps.group(1)), "chunks_per_s": round(float(tps.group(1)) * per),
                         "failed_txn": int(failed.group(1)) if failed else 0,
                         "server_cpu_us_per_chunk": round(cpu / max(chunks, 1) * 1e6, 2),
                         "wal_bytes_per_chunk": round(float(wal) / max(chunks, 1), 1),
                         "load1_before": load0, "load1_after": loadavg(),
                         "wal_per_chunk_by_rmgr": {w[0]: {"records": round(w[1] / max(chunks, 1), 2),
                                                          "record_bytes": round(w[2] / max(chunks, 1), 1),
                                                          "fpi_bytes": round(w[3] / max(chunks, 1), 1)} for w in ws},
                         "streams_updates": upd[0] - upd0[0], "streams_hot_updates": upd[1] - upd0[1]}
                    rows.append(r)
                    fpi = sum(x["fpi_bytes"] for x in r["wal_per_chunk_by_rmgr"].values())
                    print(f"| {rnd} | {n} | {v} | {r['chunks_per_s']} | {r['txn_per_s']:.0f} | "
                          f"{r['server_cpu_us_per_chunk']} | {r['wal_bytes_per_chunk']} ({fpi:.0f} FPI) | "
                          f"{r['streams_hot_updates']}/{r['streams_updates']} | "
                          f"{load0:.1f}-{r['load1_after']:.1f} |", flush=True)
    finally:
        if listener is not None:
            listener.close()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    summ: dict[str, Any] = {"settings": settings, "chunk_bytes": len(CHUNK), "streams_per_client": spg}
    table = {}
    for n in clients:
        for v in names:
            rs = [r for r in rows if r["clients"] == n and r["variant"] == v]
            table[f"{v}@{n}"] = {"chunks_per_s": med(r["chunks_per_s"] for r in rs),
                                 "server_cpu_us_per_chunk": med(r["server_cpu_us_per_chunk"] for r in rs),
                                 "wal_bytes_per_chunk": med(r["wal_bytes_per_chunk"] for r in rs)}
    summ["median"] = table
    ratios = {}
    for n in clients:
        for b in batches:
            lg = [r for r in rows if r["clients"] == n and r["variant"] == f"group{b}_logged"]
            ul = [r for r in rows if r["clients"] == n and r["variant"] == f"group{b}_unlogged"]
            no = [r for r in rows if r["clients"] == n and r["variant"] == "notify_async"]
            ins = [r for r in rows if r["clients"] == n and r["variant"] == "insert"]
            ratios[f"group{b}@{n}"] = {
                "unlogged_over_logged": med(u["chunks_per_s"] / x["chunks_per_s"] for u, x in zip(ul, lg)),
                "logged_over_notify_async": med(x["chunks_per_s"] / y["chunks_per_s"] for x, y in zip(lg, no)),
                "logged_over_insert": med(x["chunks_per_s"] / y["chunks_per_s"] for x, y in zip(lg, ins))}
    summ["ratios_same_round_median"] = {k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in ratios.items()}
    return {"rows": rows, "summary": summ}


# -- main -----------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["cluster", "db", "peer", "light", "all"], default="all")
    ap.add_argument("--quick", action="store_true", help="a smoke run (seconds) of the benchmark itself")
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--readers", type=int, default=3, help="reader processes (WebSocket clients)")
    ap.add_argument("--fsync", action="store_true", help="cluster/peer/light: fsync + synchronous_commit on")
    ap.add_argument("--rates", default="10,25,50,100,150,200,300",
                    help="cluster: chunks/s per stream to sweep (offered = streams x rate)")
    ap.add_argument("--seconds", type=float, default=5.0, help="cluster: seconds of chunks per round")
    ap.add_argument("--pairs", type=int, default=3, help="light/peer: rounds")
    ap.add_argument("--light-rate", type=float, default=30.0)
    ap.add_argument("--light-seconds", type=float, default=10.0)
    ap.add_argument("--no-bare", action="store_true", help="light: without the bare relay")
    ap.add_argument("--peer-configs", default="100x300x30,100x1000x100,100x3000x0",
                    help="peer: STREAMSxCHUNKSxRATE,... (rate 0 = as fast as it goes)")
    ap.add_argument("--db-clients", default="1,3,16")
    ap.add_argument("--db-batches", default="100,500", help="db: chunks per stream_append_many call")
    ap.add_argument("--db-streams-per-client", type=int, default=100)
    ap.add_argument("--db-seconds", type=int, default=5)
    ap.add_argument("--db-rounds", type=int, default=2)
    ap.add_argument("--cprofile", default="", metavar="DIR",
                    help="cluster: run the replicas under cProfile (CPU time); DIR/r<i>.pstats at exit")
    ap.add_argument("--modes", default="stream,notify", help="cluster: the paths to sweep")
    ap.add_argument("--pgss", action="store_true",
                    help="cluster: pg_stat_statements (track = all), top statements per round")
    ap.add_argument("--repeats", type=int, default=2, help="cluster: rounds per rate and path (order rotating)")
    ap.add_argument("--keep-going", action="store_true",
                    help="cluster: sweep every rate (the default drops a path after two failed rates in a row)")
    ap.add_argument("--out", default="")
    ap.add_argument("--_bare-publisher", dest="bare_publisher", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bare_publisher:
        asyncio.run(bare_publisher(json.loads(a.bare_publisher)))
        return
    if a.quick:
        a.streams, a.readers, a.rates, a.seconds, a.pairs, a.repeats = 10, 2, "20,100", 2.0, 1, 1
        a.light_seconds, a.peer_configs = 3.0, "10x100x50"
        a.db_clients, a.db_batches, a.db_seconds, a.db_rounds = "1,3", "100", 2, 1
    modes = ["db", "cluster", "light", "peer"] if a.mode == "all" else [a.mode]
    for m in modes:
        t0 = time.time()
        head = {"mode": m, "quick": a.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "uptime_before": uptime(), "machine": machine_info(), "args": vars(a)}
        res = {"cluster": mode_cluster, "db": mode_db, "peer": mode_peer, "light": mode_light}[m](a)
        out = head | res | {"uptime_after": uptime(), "elapsed_s": round(time.time() - t0)}
        path = Path(a.out) if a.out and len(modes) == 1 else RESULTS / f"streams-{m}{'-quick' if a.quick else ''}.json"
        write_json(path, out)
        print(f"\nuptime before: {out['uptime_before']}\nuptime after:  {out['uptime_after']}\n"
              f"elapsed {out['elapsed_s']} s; full results in {path}")
        print(json.dumps({"mode": m, "quick": a.quick, "summary": res["summary"]}, default=str), flush=True)


if __name__ == "__main__":
    main()
