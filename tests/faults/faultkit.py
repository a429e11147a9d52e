"""A cluster for fault scenarios: ordinary replicas plus replicas behind faults.

Built on the HA suite's kit (tests/ha/hakit.py: Trio, Publisher, StreamClient)
rather than beside it: the ordinary replicas are a Trio's, and an isolated
replica (faultnet.NsServer) joins the same Trio, so stop_all() and the
round-robin helpers cover it too.

Load and the three counts every scenario reports
- jobs: ``JobLoad`` enqueues numbered ``faults.work`` jobs (SQL on loopback,
  never through a fault); a cron task ticks every second with the same handler.
- events: hakit's ``Publisher`` posts a numbered stream to one user, through
  the ordinary replicas only (a publisher that retried through a partitioned
  replica could commit twice after the heal: that would test the publisher,
  not Switchboard); ``StreamClient`` tabs hold sockets on every replica,
  including the isolated one, and resume elsewhere when closed.
- ``Outcome``: overlapping executions (from the handlers' own logs, written
  outside PostgreSQL), jobs lost (no succeeded run), jobs doubled (more than
  one succeeded run), events missed / duplicated per client.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
from faultnet import HERE, NetNS, NsServer, via
from faultproxy import FaultProxy
from hakit import StreamClient, Trio, app_url_for, ready_status
from harness import ROOT, Server

_counter = itertools.count()

FAULT_ENV = {
    "SWITCHBOARD_LEASE_SECONDS": "3",
    "SWITCHBOARD_POLL_INTERVAL": "0.2",
    "SWITCHBOARD_HEARTBEAT_INTERVAL": "0.5",
    "SWITCHBOARD_LISTEN_CHECK_INTERVAL": "0.5",
    "SWITCHBOARD_SHUTDOWN_GRACE_SECONDS": "3",
    "SWITCHBOARD_POOL_TIMEOUT": "3",
    "SWITCHBOARD_WS_DEAF_CLOSE_SECONDS": "2",
    "SWITCHBOARD_LOGIN_IP_BURST": "100000",
    "SWITCHBOARD_LOGIN_IP_RATE": "1000",
    "SWITCHBOARD_WS_MAX_SOCKETS_PER_USER": "100",
    "SWITCHBOARD_HANDLERS": "fault_handlers",
    "SWITCHBOARD_LOG_LEVEL": "INFO",
}


@dataclass
class Isolated:
    """A replica in a namespace and the two proxies that are its only way to PostgreSQL."""
    ns: NetNS
    server: NsServer
    pool: FaultProxy        # DATABASE_URL goes through this one
    listen: FaultProxy      # SWITCHBOARD_LISTEN_DATABASE_URL through this one

    def partition(self, mode: str = "drop") -> None:
        """Cut the replica off from PostgreSQL entirely (pool and LISTEN)."""
        self.ns.partition(self.pool.port, mode)
        self.ns.partition(self.listen.port, mode)

    def partition_listen(self, mode: str = "drop") -> None:
        """Cut only the LISTEN connection's path; the pool keeps working."""
        self.ns.partition(self.listen.port, mode)

    def heal(self) -> None:
        self.ns.heal()
        self.pool.clear()
        self.listen.clear()

    def degrade(self, **toxics: float) -> None:
        for p in (self.pool, self.listen):
            p.set(**toxics)


class LocalView:
    """What hakit.Publisher needs of a Trio (lock, rotation, sql), limited to some replicas."""

    def __init__(self, trio: Trio, servers: list[Server]) -> None:
        self.trio = trio
        self.lock = threading.Lock()
        self.rotation = list(servers)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        return self.trio.sql(query, params)


class FaultCluster:
    def __init__(self, db_url: str, log_dir: Path, netns: Callable[[], NetNS],
                 env: dict[str, str] | None = None) -> None:
        self.work_dir = log_dir / f"work-{os.getpid()}-{next(_counter)}"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        full_env = {**FAULT_ENV, **(env or {}), "FAULTS_LOG_DIR": str(self.work_dir),
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "server"), str(HERE)])}
        self.trio = Trio(db_url, log_dir, full_env)
        self.netns = netns
        u = urlsplit(db_url)
        self.pg_addr = (u.hostname or "127.0.0.1", u.port or 5432)
        self.local: list[Server] = []
        self.isolated: list[Isolated] = []
        self.proxies: list[FaultProxy] = []
        self.trio.user("admin", "admin")

    @property
    def lease(self) -> float:
        return float(self.trio.env["SWITCHBOARD_LEASE_SECONDS"])

    def start_local(self, n: int, env: dict[str, str] | None = None) -> list[Server]:
        """n ordinary replicas (the Trio's), optionally with settings of their own."""
        if not env:
            new = self.trio.start(n) if n else []
        else:
            new = []
            for _ in range(n):
                s = Server(self.trio.app_url, env={**self.trio.env, **env}, log_dir=self.trio.log_dir,
                           name=f"local{next(_counter)}")
                self.trio.servers.append(s)
                s.start(wait=False)
                new.append(s)
            for s in new:
                s.wait_ready(60)
            with self.trio.lock:
                self.trio.rotation.extend(new)
        self.local.extend(new)
        return new

    def start_isolated(self, env: dict[str, str] | None = None) -> Isolated:
        ns = self.netns()
        k = next(_counter)
        pool = FaultProxy(self.pg_addr, listen=(ns.host_ip, 0), name=f"pool{k}", seed=k).start()
        lst = FaultProxy(self.pg_addr, listen=(ns.host_ip, 0), name=f"listen{k}", seed=k + 1000).start()
        self.proxies += [pool, lst]
        app = app_url_for(self.trio.db_url)
        s = NsServer(ns, via(app, ns.host_ip, pool.port),
                     env={**self.trio.env, **(env or {}),
                          "SWITCHBOARD_LISTEN_DATABASE_URL": via(app, ns.host_ip, lst.port)},
                     log_dir=self.trio.log_dir, name=f"ns{k}")
        self.trio.servers.append(s)
        s.start(wait=False)
        s.wait_ready(60)
        with self.trio.lock:
            self.trio.rotation.append(s)
        iso = Isolated(ns, s, pool, lst)
        self.isolated.append(iso)
        return iso

    def close(self) -> None:
        self.trio.stop_all()
        for p in self.proxies:
            p.stop()

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        return self.trio.sql(query, params)

    # -- load -------------------------------------------------------------------------------------
    def pause_maintenance(self) -> None:
        self.sql("UPDATE switchboard.tasks SET is_active = false WHERE name = 'switchboard.maintenance'")

    def add_tick(self, name: str = "faults.tick", seconds: float = 0.3) -> str:
        return str(self.sql("SELECT (switchboard.create_task(%s, '@every 1 second', 'faults.work', %s)).id",
                            (name, json.dumps({"s": seconds})))[0][0])

    def publisher_view(self) -> LocalView:
        return LocalView(self.trio, self.local)

    def outcome(self, keys: list[str]) -> "Outcome":
        return Outcome.collect(self, keys)


class JobLoad(threading.Thread):
    """Enqueues job k = 0, 1, 2, ... every `interval` s; every `long_every`-th one runs `long_s`."""

    def __init__(self, fc: FaultCluster, interval: float = 0.05, short_s: float = 0.05,
                 long_every: int = 10, long_s: float = 4.0, max_attempts: int = 10) -> None:
        super().__init__(daemon=True, name="jobload")
        self.fc, self.interval, self.short_s = fc, interval, short_s
        self.long_every, self.long_s, self.max_attempts = long_every, long_s, max_attempts
        self.keys: list[str] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.fc.trio.db_url, autocommit=True) as c:
            n = 0
            while not self._halt.is_set():
                key = f"job{n}"
                s = self.long_s if self.long_every and n % self.long_every == self.long_every - 1 else self.short_s
                try:
                    c.execute("SELECT switchboard.enqueue('faults.work', %s, now(), NULL, %s)",
                              (json.dumps({"k": key, "s": s}), self.max_attempts))
                    self.keys.append(key)
                except psycopg.Error as exc:
                    self.errors.append(f"{key}: {exc}")
                n += 1
                self._halt.wait(self.interval)

    def stop(self) -> list[str]:
        self._halt.set()
        self.join(10)
        return self.keys


def wait_settled(fc: FaultCluster, timeout: float) -> bool:
    """Every job is finished (no queued or running job runs left)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        n = fc.sql("SELECT count(*) FROM switchboard.task_runs WHERE task_id IS NULL "
                   "AND status IN ('queued', 'running')")[0][0]
        if n == 0:
            return True
        time.sleep(0.2)
    return False


@dataclass
class Execution:
    key: str
    run_id: int
    attempt: int
    worker: str
    start: float
    end: float = float("inf")     # never ended (process killed)
    how: str = ""


@dataclass
class Outcome:
    executions: list[Execution] = field(default_factory=list)
    overlaps: list[tuple[Execution, Execution]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    reexecuted: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    @classmethod
    def collect(cls, fc: FaultCluster, keys: list[str]) -> "Outcome":
        o = cls()
        runs: dict[tuple[int, str], Execution] = {}
        for f in sorted(fc.work_dir.glob("work-*.log")):
            for line in f.read_text().splitlines():
                p = line.split()
                if len(p) < 6:
                    continue
                if p[0] == "start":
                    e = Execution(p[1], int(p[2]), int(p[3]), p[4], float(p[5]))
                    runs[(e.run_id, e.worker)] = e
                elif p[0] == "end" and (int(p[2]), p[4]) in runs:
                    e = runs[(int(p[2]), p[4])]
                    e.end, e.how = float(p[5]), p[6] if len(p) > 6 else ""
        o.executions = list(runs.values())
        by_key: dict[str, list[Execution]] = defaultdict(list)
        for e in o.executions:
            by_key[e.key].append(e)
        for ex in by_key.values():
            ex.sort(key=lambda e: e.start)
            for i, a in enumerate(ex):
                for b in ex[i + 1:]:
                    if b.start < a.end:
                        o.overlaps.append((a, b))
        rows = fc.sql("SELECT args->>'k', count(*) FILTER (WHERE status = 'succeeded'), count(*) "
                      "FROM switchboard.task_runs WHERE task_id IS NULL AND handler = 'faults.work' "
                      "GROUP BY 1")
        ok = {k: s for k, s, _ in rows}
        o.lost = [k for k in keys if ok.get(k, 0) == 0]
        o.doubled = [k for k, s in ok.items() if s > 1]
        o.reexecuted = sorted(k for k, ex in by_key.items() if not k.startswith("task:") and len(ex) > 1)
        o.statuses = dict(fc.sql("SELECT status, count(*) FROM switchboard.task_runs GROUP BY 1"))
        return o

    def summary(self) -> str:
        return (f"executions {len(self.executions)}, overlapping {len(self.overlaps)}, lost {len(self.lost)}, "
                f"doubled {len(self.doubled)}, re-executed {len(self.reexecuted)}, runs {self.statuses}")


class ReadyProbe(threading.Thread):
    """Polls /healthz/ready of one replica every `every` s; records (time of the answer, status)."""

    def __init__(self, s: Server, every: float = 0.1) -> None:
        super().__init__(daemon=True, name=f"probe-{s.port}")
        self.s, self.every = s, every
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=3) as h:
            while not self._halt.is_set():
                try:
                    code = h.get(self.s.base + "/healthz/ready").status_code
                except httpx.HTTPError:
                    code = 0
                self.samples.append((time.monotonic(), code))   # when the answer came
                self._halt.wait(self.every)

    def first(self, pred: Callable[[int], bool], after: float) -> float | None:
        for t, code in self.samples:
            if t >= after and pred(code):
                return t - after
        return None

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def pick_pinned_then(first: Server, others: Callable[[], list[Server]]) -> Callable[[StreamClient], Server]:
    """A StreamClient pick(): `first` for the first socket, then round-robin over others()."""
    state = {"first": first, "rr": itertools.count()}

    def pick(client: StreamClient) -> Server:
        s = state.pop("first", None)
        if s is not None:
            return s  # type: ignore[return-value]
        live = others()
        return live[next(state["rr"]) % len(live)]  # type: ignore[call-overload]
    return pick


__all__ = ["FaultCluster", "Isolated", "JobLoad", "LocalView", "Outcome", "ReadyProbe",
           "pick_pinned_then", "ready_status", "wait_settled"]
