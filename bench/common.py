"""Shared plumbing for the benchmarks: the throwaway cluster, databases, replica processes.

Everything runs on this one machine: PostgreSQL, the replicas, the load
generators and the baselines share its cores, so every figure is measured
beside a baseline taken on the same cluster with the same client count.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
sys.path.insert(0, str(ROOT / "server"))

import psycopg
from switchboard.migrate import migrate
from switchboard.pgtest import ThrowawayPostgres

APP_LOGIN = "sb_bench_app"
JWT_SECRET = "bench-secret-" + "x" * 40
TEMPLATE = "sb_bench_template"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


class Cluster:
    """One throwaway PostgreSQL with a migrated template database and an app login role."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.pg = ThrowawayPostgres(settings)
        self._n = 0
        with psycopg.connect(self.pg.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
            c.execute(f'CREATE DATABASE "{TEMPLATE}"')
            self.version = c.execute("SHOW server_version").fetchone()[0]
        migrate(self.pg.url(TEMPLATE))
        with psycopg.connect(self.pg.url(), autocommit=True) as c:
            c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")

    def url(self, db: str = "postgres", user: str = "postgres") -> str:
        return self.pg.url(db, user)

    def new_db(self, prefix: str = "sb_bench", template: str | None = TEMPLATE) -> str:
        """A fresh database (a clone of the migrated template unless template=None); returns its name."""
        self._n += 1
        name = f"{prefix}_{self._n}"
        with psycopg.connect(self.pg.url(), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if template:
                c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            else:
                c.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_db(self, name: str) -> None:
        with psycopg.connect(self.pg.url(), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        self.pg.stop()


_HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (0 if it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / _HZ
    except (OSError, IndexError, ValueError):
        return 0.0


def child_pids(ppid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


class CpuMeter:
    """CPU seconds spent by the given processes and by the cluster's postgres processes.

    On a shared 2-core box wall-clock throughput moves with whatever else runs;
    CPU time per unit of work is the steadier figure, so the job benchmark
    reports both. Backends that exit during the interval are not counted.
    """

    def __init__(self, cluster: Cluster, pids: list[int]) -> None:
        self.cluster, self.pids = cluster, pids
        self.t0 = self._read()

    def _read(self) -> tuple[float, float]:
        pg = self.cluster.pg.pid
        pg_pids = ([pg] + child_pids(pg)) if pg else []
        return sum(cpu_seconds(p) for p in self.pids), sum(cpu_seconds(p) for p in pg_pids)

    def stop(self) -> dict[str, float]:
        a, b = self._read()
        return {"workers_cpu_s": round(a - self.t0[0], 3), "postgres_cpu_s": round(b - self.t0[1], 3)}


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return -1.0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Proc:
    """A server process on loopback (a Switchboard replica or the bare app)."""

    def __init__(self, cmd: list[str], env: dict[str, str], port: int, name: str,
                 ready_path: str = "/healthz/ready") -> None:
        self.cmd, self.env, self.port, self.name = cmd, env, port, name
        self.base = f"http://127.0.0.1:{port}"
        self.ws_base = f"ws://127.0.0.1:{port}"
        self.ready_path = ready_path
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.log_path = RESULTS / f"{name}-{port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> Proc:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=str(ROOT))
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        import urllib.request

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.base + self.ready_path, timeout=1) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout}s: {self.tail()}")

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def replica(cluster: Cluster, db: str, name: str, env: dict[str, str] | None = None,
            port: int | None = None) -> Proc:
    """One `switchboard serve` replica (uvicorn, 1 worker) as the least-privilege app role."""
    port = port or free_port()
    e = dict(os.environ)
    e.update({
        "DATABASE_URL": cluster.url(db, APP_LOGIN),
        "SWITCHBOARD_MIGRATION_DATABASE_URL": cluster.url(db),
        "SWITCHBOARD_JWT_SECRET": JWT_SECRET,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "server"), str(BENCH)]),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    })
    e.update(env or {})
    cmd = [sys.executable, "-m", "switchboard.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--no-migrate"]
    return Proc(cmd, e, port, name)


def stop_all(procs: list[Proc]) -> None:
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        p.stop()


def make_token(user_id: str, username: str, role: str = "member") -> str:
    """A bearer token exactly as POST /auth/login issues it (same secret as the replicas)."""
    import uuid

    from switchboard.auth import AuthState

    return AuthState(JWT_SECRET, 3600).issue(uuid.UUID(user_id), username, role)[0]


def machine_info(cluster: Cluster | None = None) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass

    def ver(mod: str) -> str | None:
        try:
            from importlib.metadata import version

            return version(mod)
        except Exception:
            return None

    wrk = shutil.which("wrk")
    wrk_v = None
    if wrk:
        try:
            out = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=5)
            wrk_v = (out.stdout + out.stderr).splitlines()[0].strip()
        except Exception:
            wrk_v = "wrk"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "mem_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": cluster.version if cluster else None,
        "packages": {m: ver(m) for m in ("psycopg", "psycopg-pool", "falcon", "uvicorn", "websockets",
                                         "procrastinate", "croniter")},
        "uvloop": ver("uvloop"), "httptools": ver("httptools"),
        "wrk": wrk_v,
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
