"""Real server processes on loopback, and small HTTP/WebSocket clients for tests.

Every server test starts `switchboard serve` as a separate OS process (as on
separate nodes) against a fresh clone of the migrated template, and talks
real HTTP and WebSocket to it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from websockets.sync.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
JWT_SECRET = "test-secret-" + "x" * 40
FAST_ENV = {
    "SWITCHBOARD_POLL_INTERVAL": "0.2",
    "SWITCHBOARD_LISTEN_CHECK_INTERVAL": "0.5",
    "SWITCHBOARD_HEARTBEAT_INTERVAL": "0.5",
    "SWITCHBOARD_LEASE_SECONDS": "3",
    "SWITCHBOARD_SHUTDOWN_GRACE_SECONDS": "5",
    "SWITCHBOARD_LOG_LEVEL": "INFO",
}


APP_LOGIN = "sb_app_login"


def app_url_for(url: str) -> str:
    """The same database, logged in as the least-privilege application login."""
    return url.replace("postgres@", f"{APP_LOGIN}@", 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hash_pw(password: str) -> str:
    sys.path.insert(0, str(ROOT / "server"))
    from switchboard.auth import hash_password

    return hash_password(password)


def make_user(url: str, username: str, password: str = "pw-" + "s" * 12, role: str = "member") -> str:
    with psycopg.connect(url, autocommit=True) as c:
        return str(c.execute("SELECT switchboard.create_user(%s, %s, %s)",
                             (username, hash_pw(password), role)).fetchone()[0])


def tick_covering_everything(url: str, timeout: float = 30) -> None:
    """Take a tick that covers every event committed before this call. event_tick()
    answers -1 while a relay holds the ticker row, and that relay's snapshot may predate
    the caller's last publish, so a caller that needs its own events covered (a test
    about to reap them) asks again until it gets a tick (> 0) or "already covered" (0)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as c:
        while c.execute("SELECT switchboard.event_tick()").fetchone()[0] < 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the ticker row stayed held for %ss" % timeout)
            time.sleep(0.01)


def seal_event_partition(url: str) -> int | None:
    """Let the partition that holds the newest event id fill up at once (V0037): advance
    event_id_seq to its last id, as the rest of its 10,000 publishes would. reap_events
    drops a partition only once its whole range is given out, so a test that publishes a
    handful of events and expects them reaped seals their partition first; later events
    land in the next one. Returns the sequence's new value (None: nothing to seal)."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT setval('switchboard.event_id_seq', p.to_id - 1) FROM switchboard.event_partitions() p"
            " WHERE NOT p.is_default AND NOT p.allocated"
            "   AND coalesce(p.from_id, 0) <= switchboard._event_id_allocated()"
            " ORDER BY p.to_id LIMIT 1").fetchone()
        return None if row is None else int(row[0])


class Server:
    """One replica: `switchboard serve` in its own process."""

    def __init__(self, db_url: str, port: int | None = None, env: dict[str, str] | None = None,
                 migrate: bool = False, log_dir: Path | None = None, name: str = "replica") -> None:
        self.port = port or free_port()
        self.db_url = db_url
        self.base = f"http://127.0.0.1:{self.port}"
        self.ws_base = f"ws://127.0.0.1:{self.port}"
        self.env = dict(os.environ)
        self.env.update({"DATABASE_URL": db_url, "SWITCHBOARD_JWT_SECRET": JWT_SECRET,
                         "PYTHONPATH": str(ROOT / "server")})
        self.env.update(FAST_ENV)
        self.env.update(env or {})
        self.migrate = migrate
        self.log_path = (log_dir or Path("/tmp")) / f"switchboard-{name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.cookies = httpx.Cookies()

    def start(self, wait: bool = True, timeout: float = 30) -> "Server":
        cmd = [sys.executable, "-m", "switchboard.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if not self.migrate:
            cmd.append("--no-migrate")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.base + "/healthz/ready", timeout=1)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    # -- HTTP helpers --------------------------------------------------------------
    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30)

    def login(self, username: str, password: str = "pw-" + "s" * 12) -> str:
        # Like a browser, keep the device cookies: a known device is exempt from the
        # per-username login bucket (which every attempt from unknown devices pays).
        r = httpx.post(self.base + "/auth/login", json={"username": username, "password": password}, timeout=30,
                       cookies=self.cookies)
        assert r.status_code == 200, r.text
        self.cookies.update(r.cookies)
        return r.json()["access_token"]

    def ticket(self, token: str) -> str:
        r = httpx.post(self.base + "/ws/ticket", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()["ticket"]

    def ws(self, token: str, **kw: Any) -> "WS":
        return WS(connect(f"{self.ws_base}/ws?ticket={self.ticket(token)}", open_timeout=10, **kw))


def probe_token() -> str:
    """A valid member token for no particular user, for GET /me: which replica answered
    (anonymous readiness no longer names it)."""
    import jwt

    now = int(time.time())
    return jwt.encode({"sub": str(uuid.uuid4()), "name": "probe", "role": "member", "iat": now,
                       "exp": now + 3600, "jti": uuid.uuid4().hex}, JWT_SECRET, algorithm="HS256")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class WS:
    """A sync WebSocket client that reads JSON frames."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.hello = self.recv(timeout=10)
        assert self.hello["event"] == "hello", self.hello

    def send(self, obj: Any) -> None:
        self.conn.send(json.dumps(obj))

    def recv(self, timeout: float = 5) -> dict:
        return json.loads(self.conn.recv(timeout=timeout))

    def recv_until(self, pred: Any, timeout: float = 15) -> dict:
        # 15 s, not the milliseconds a frame takes: CI runs three lanes on two cores, and a
        # test waits for what the product promises (the frame comes), not for how fast.
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("no matching frame")
            f = self.recv(timeout=left)
            if pred(f):
                return f

    def drain(self, quiet: float = 0.3) -> list[dict]:
        """Frames until nothing arrives for `quiet` seconds."""
        out = []
        while True:
            try:
                out.append(self.recv(timeout=quiet))
            except TimeoutError:
                return out

    def join(self, room: str) -> dict:
        self.send({"action": "join", "room": room})
        return self.recv_until(lambda f: f["event"] in ("joined", "error"))

    def close(self) -> None:
        self.conn.close()


def events_of(frames: Iterable[dict]) -> list[dict]:
    return [f for f in frames if f.get("id") is not None]
