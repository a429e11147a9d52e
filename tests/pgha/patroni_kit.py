"""A real Patroni cluster on loopback: one etcd, three Patroni-managed PostgreSQL 15 nodes.

Everything is the machine's own Debian packages (etcd-server 3.4, patroni 3.0,
postgresql-15): no mocks. Ports are free ports picked at start, names carry the
pid, all data lives in one temp dir removed by ``stop()``.

- etcd runs as the test's user (root in CI is fine for etcd).
- Patroni, and through it PostgreSQL, runs as the unprivileged ``postgres`` OS
  user when the suite runs as root (``setpriv`` execs in place, so the PID we
  hold is Patroni's own and ``kill -9`` reaches it).
- synchronous_mode is on: a COMMIT is acknowledged only once the synchronous
  standby has the WAL, so an acknowledged COMMIT survives a failover.
- ttl 10 s / loop_wait 1 s / retry_timeout 4 s: a lost primary is replaced in
  about ttl seconds. use_pg_rewind lets the old primary rejoin as a replica.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

PG_BINDIR = "/usr/lib/postgresql/15/bin"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    """The unprivileged OS user PostgreSQL runs as when we are root (as pgtest.py does)."""
    if os.geteuid() != 0:
        return None
    user = os.environ.get("SWITCHBOARD_PG_USER", "postgres")
    pwd.getpwnam(user)  # KeyError: create it (scripts/test.sh does)
    return user


def _chown_tree(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


def _yaml(obj: Any, indent: int = 0) -> str:
    """A tiny YAML writer (JSON scalars are valid YAML), so no PyYAML is needed here."""
    pad = " " * indent
    out = []
    for k, v in obj.items():
        if isinstance(v, dict):
            out.append(f"{pad}{k}:")
            out.append(_yaml(v, indent + 2))
        elif isinstance(v, list):
            out.append(f"{pad}{k}:")
            out.extend(f"{pad}  - {json.dumps(x)}" for x in v)
        else:
            out.append(f"{pad}{k}: {json.dumps(v)}")
    return "\n".join(out)


class Etcd:
    def __init__(self, base: Path) -> None:
        self.dir = base / "etcd"
        self.client_port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = base / "etcd.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        name = f"etcd{os.getpid()}"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([
            "etcd", "--name", name, "--data-dir", str(self.dir),
            "--listen-client-urls", f"http://127.0.0.1:{self.client_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.client_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"{name}=http://127.0.0.1:{self.peer_port}",
            "--initial-cluster-token", name, "--initial-cluster-state", "new",
            "--heartbeat-interval", "100", "--election-timeout", "1000",
            "--unsafe-no-fsync",  # a test cluster on a shared disk; etcd's own durability is not under test
        ], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if httpx.get(f"http://{self.endpoint}/health", timeout=1).json().get("health") == "true":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"etcd not healthy: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc:
            self._log.close()


class Node:
    """One Patroni process and the PostgreSQL it manages."""

    def __init__(self, cluster: "PatroniCluster", name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.dir = cluster.base / name
        self.data_dir = self.dir / "data"
        self.pg_port, self.api_port = free_port(), free_port()
        self.config_path = self.dir / "patroni.yml"
        self.log_path = self.dir / "patroni.log"
        self.proc: subprocess.Popen | None = None

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.pg_port}/{database}"

    def write_config(self) -> None:
        c = self.cluster
        conf = {
            "scope": c.scope,
            "namespace": f"/{c.scope}/",
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.api_port}", "connect_address": f"127.0.0.1:{self.api_port}"},
            "etcd3": {"hosts": [c.etcd.endpoint]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
                            "max_wal_senders": 10, "max_replication_slots": 10,
                            "max_connections": 200, "max_locks_per_transaction": 256,
                            "wal_keep_size": "128MB",
                            # process crashes are under test, not power loss: the OS page
                            # cache survives kill -9, so fsync adds only disk load here
                            "fsync": "off", "full_page_writes": "on",
                            "shared_buffers": "64MB", "log_min_messages": "warning",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data_dir),
                "bin_dir": PG_BINDIR,
                "pgpass": str(self.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.dir)},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }
        # initdb options are a list of scalars or one-key maps: write that part by hand
        text = _yaml({k: v for k, v in conf.items() if k != "bootstrap"})
        boot = conf["bootstrap"]
        text += "\nbootstrap:\n" + _yaml({"dcs": boot["dcs"]}, 2)
        text += "\n  initdb:\n    - encoding: UTF8\n    - locale: C\n    - data-checksums\n"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(text)

    def start(self) -> None:
        self.write_config()
        user = self.cluster.run_as
        if user:
            _chown_tree(self.dir, user)
        cmd = ["patroni", str(self.config_path)]
        if user:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *cmd]
        self._log = open(self.log_path, "ab")
        env = {**os.environ, "HOME": str(self.dir), "PATH": f"{PG_BINDIR}:{os.environ.get('PATH', '')}"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(self.dir))

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def patroni_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict:
        """Patroni's REST API view of this node ({} if it does not answer)."""
        try:
            return httpx.get(self.api + "/patroni", timeout=1).json()
        except (httpx.HTTPError, ValueError):
            return {}

    def timeline(self) -> int | None:
        return self.status().get("timeline")

    def kill9(self) -> int | None:
        """kill -9 Patroni and its postmaster together (the node is gone)."""
        pm = self.postmaster_pid()
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if pm:
            try:
                os.kill(pm, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc:
            self.proc.wait(10)
        return pm

    def kill9_postmaster(self) -> int:
        pm = self.postmaster_pid()
        assert pm, f"{self.name}: no postmaster.pid"
        os.kill(pm, signal.SIGKILL)
        return pm

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)   # Patroni stops its PostgreSQL first
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()
        # a postmaster left behind by a killed Patroni: stop it as well
        pm = self.postmaster_pid()
        if pm:
            try:
                os.kill(pm, signal.SIGQUIT)
                for _ in range(50):
                    os.kill(pm, 0)
                    time.sleep(0.1)
                os.kill(pm, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc:
            try:
                self._log.close()
            except Exception:  # noqa: BLE001 - already closed
                pass

    def log(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


class PatroniCluster:
    def __init__(self, n: int = 3) -> None:
        self.base = Path(tempfile.mkdtemp(prefix=f"sb-pgha-{os.getpid()}-"))
        os.chmod(self.base, 0o755)
        self.scope = f"sbpgha{os.getpid()}"
        self.run_as = _run_as()
        self.etcd = Etcd(self.base)
        self.nodes = [Node(self, f"pg{i}") for i in range(n)]

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 90) -> None:
        self.etcd.start()
        self.nodes[0].start()            # bootstraps (initdb) and takes the leader key
        self.wait_leader(timeout)
        for n in self.nodes[1:]:
            n.start()                    # pg_basebackup from the leader
        self.wait_streaming(len(self.nodes) - 1, timeout)
        self.wait_sync(timeout)

    def stop(self) -> None:
        for n in self.nodes:
            try:
                n.stop()
            except Exception:  # noqa: BLE001 - keep tearing down the rest
                pass
        self.etcd.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- topology ----------------------------------------------------------------------
    def members(self) -> list[dict]:
        for n in self.nodes:
            try:
                return httpx.get(n.api + "/cluster", timeout=1).json()["members"]
            except (httpx.HTTPError, ValueError, KeyError):
                continue
        return []

    def leader(self) -> Node | None:
        for m in self.members():
            if m.get("role") == "leader" and m.get("state") == "running":
                return self.node(m["name"])
        return None

    def sync_standby(self) -> Node | None:
        for m in self.members():
            if m.get("role") == "sync_standby" and m.get("state") in ("streaming", "running"):
                return self.node(m["name"])
        return None

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_leader(self, timeout: float, not_: Node | None = None) -> Node:
        deadline = time.time() + timeout
        while time.time() < deadline:
            lead = self.leader()
            if lead is not None and lead is not not_ and self._writable(lead):
                return lead
            time.sleep(0.1)
        raise RuntimeError(f"no leader after {timeout}s: {self.members()}\n" +
                           "\n".join(f"--- {n.name}\n{n.log()}" for n in self.nodes))

    def _writable(self, n: Node) -> bool:
        try:
            with psycopg.connect(n.url(), connect_timeout=2, autocommit=True) as c:
                return not c.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        except psycopg.Error:
            return False

    def wait_streaming(self, k: int, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            ms = self.members()
            if sum(1 for m in ms if m.get("role") in ("replica", "sync_standby")
                   and m.get("state") in ("streaming", "running") and m.get("lag", 0) in (0, "0")) >= k:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{k} replicas not streaming after {timeout}s: {self.members()}")

    def wait_sync(self, timeout: float) -> Node:
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.sync_standby()
            if s is not None:
                return s
            time.sleep(0.2)
        raise RuntimeError(f"no synchronous standby after {timeout}s: {self.members()}")

    # -- connection strings --------------------------------------------------------------
    def multi_host_url(self, database: str = "postgres", user: str = "postgres") -> str:
        """The libpq multi-host URL Switchboard is given: every node, the writable one wins."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://{user}@{hosts}/{database}?target_session_attrs=read-write&connect_timeout=2"

    def patronictl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["patronictl", "-c", str(self.nodes[0].config_path), *args],
                              capture_output=True, text=True, timeout=timeout)

    def switchover(self, leader: Node, candidate: Node) -> subprocess.CompletedProcess:
        return self.patronictl("switchover", "--leader", leader.name, "--candidate", candidate.name,
                               "--force", self.scope)
