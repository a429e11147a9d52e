"""``switchboard dev``: a throwaway PostgreSQL and N replicas, for trying it out."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from .common import _migrate
from .connect import _ensure_user

if TYPE_CHECKING:   # the dev extra: imported where used
    from ..pgtest import ThrowawayPostgres


DEV_EXTRA_HINT = ("switchboard dev: the throwaway PostgreSQL needs testing.postgresql, which is not installed; "
                  "install the dev extra (pip install -e '.[dev]') or set DATABASE_URL to use your own database")


def cmd_dev(args: argparse.Namespace) -> int:
    """Throwaway PostgreSQL + N replicas. Output is what a person needs (URLs,
    login, problems): INFO logs only with SWITCHBOARD_LOG_LEVEL / --log-level.
    Ctrl-C reaches the whole foreground process group, so PostgreSQL and the
    replicas run in sessions of their own and dev stops them in order: the
    replicas drain first (while the database still answers), then PostgreSQL."""
    verbose = "SWITCHBOARD_LOG_LEVEL" in os.environ or args.log_level.upper() != "INFO"
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)
    pg = None
    url = os.environ.get("DATABASE_URL")
    if not url:
        pg = _throwaway_postgres()
        if pg is None:
            return 2
        url = pg.url("switchboard")
    return _DevSession(args, url, verbose).run(pg)


def _throwaway_postgres() -> ThrowawayPostgres | None:
    """A PostgreSQL of its own with a database "switchboard"; None (and a hint on how to
    get it) without the dev extra."""
    try:
        from ..pgtest import ThrowawayPostgres
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("testing"):
            raise
        print(DEV_EXTRA_HINT, file=sys.stderr)
        return None
    print("switchboard dev: starting a throwaway PostgreSQL ...", flush=True)
    pg = ThrowawayPostgres(own_session=True)
    import psycopg

    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("CREATE DATABASE switchboard")
    return pg


class _DevSession:
    """The replicas of one `switchboard dev`, from migrating to stopping them.

    A signal (Ctrl-C, SIGTERM, the terminal closing) only sets ``stopping``; the loops
    notice it, and ``run`` stops the replicas and then PostgreSQL whatever happened."""

    def __init__(self, args: argparse.Namespace, url: str, verbose: bool) -> None:
        self.args = args
        self.url = url
        self.verbose = verbose
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.failed = False

    def _stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self, pg: ThrowawayPostgres | None) -> int:
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGHUP, self._stop)  # the terminal closed: the children no longer hear it
        try:
            return self._serve()
        finally:
            self._shut_down(pg)

    def _serve(self) -> int:
        applied = _migrate(self.url)
        print(f"switchboard dev: migrated ({'versions ' + ', '.join(map(str, applied)) if applied else 'already at head'})",
              flush=True)
        password = os.environ.get("SWITCHBOARD_DEV_PASSWORD") or secrets.token_urlsafe(9)
        _ensure_user(self.url, "admin", "admin", password)
        host, first = self.args.host, self.args.port
        ports = [first + i for i in range(self.args.replicas)]
        # Checked here, just before the replicas bind: a port someone else serves on would
        # otherwise answer the readiness check below for a replica that failed to bind.
        busy = [port for port in ports if not _port_free(host, port)]
        if busy:
            print(f"switchboard dev: port {busy[0]} is in use on {host or '0.0.0.0'}; the replicas take "
                  f"--port, --port+1, ...: choose free ones (e.g. --port {first + 100})", file=sys.stderr)
            return 2
        print(f"switchboard dev: starting {len(ports)} replicas ...", flush=True)
        env = self._replica_env()
        for port in ports:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "switchboard.cli", "serve", "--host", host, "--port", str(port),
                 "--no-migrate"], env=env, start_new_session=True))
        self._wait_up(ports, password)
        self._watch()
        return 1 if self.failed else 0

    def _replica_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "DATABASE_URL": self.url,
            "SWITCHBOARD_JWT_SECRET": os.environ.get("SWITCHBOARD_JWT_SECRET") or secrets.token_hex(32),
            "SWITCHBOARD_DEV": "1",
            "SWITCHBOARD_ALLOWED_ORIGINS": os.environ.get("SWITCHBOARD_ALLOWED_ORIGINS", "*"),
        })
        if not self.verbose:
            env["SWITCHBOARD_LOG_LEVEL"] = "WARNING"
        return env

    def _wait_up(self, ports: list[int], password: str) -> None:
        """Wait for every replica to be ready, then say where they are and how to log in."""
        ready = _wait_ready(ports, self.args.host, self.procs, lambda: self.stopping)
        if self.stopping:
            return
        if not ready:
            print("switchboard dev: a replica did not become ready (its log is above); stopping", file=sys.stderr)
            self.failed = True
            return
        shown = "127.0.0.1" if self.args.host in ("0.0.0.0", "") else self.args.host
        print("\nSwitchboard dev is up:")
        for port in ports:
            print(f"  replica  http://{shown}:{port}/   (ready: http://{shown}:{port}/healthz/ready)")
        print(f"  login    admin / {password}")
        print(f"  origins  {_origins_line(self._replica_env()['SWITCHBOARD_ALLOWED_ORIGINS'], shown, ports)}")
        print(f"  database {self.url}")
        print("Press Ctrl-C to stop.\n", flush=True)

    def _watch(self) -> None:
        """Until a signal: a replica that exits stops them all."""
        while not self.stopping and not self.failed:
            if any(p.poll() is not None for p in self.procs):
                print("switchboard dev: a replica exited; stopping", file=sys.stderr)
                self.failed = True
                break
            time.sleep(0.2)

    def _shut_down(self, pg: ThrowawayPostgres | None) -> None:
        if self.procs:
            print("switchboard dev: stopping the replicas ...", flush=True)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if pg is not None:  # only now: the replicas needed it to drain
            pg.stop()
        print("switchboard dev: stopped", flush=True)


def _origins_line(allowed: str, host: str, ports: list[int]) -> str:
    """What SWITCHBOARD_ALLOWED_ORIGINS lets browsers do, in one line (the rules: http/cors.py)."""
    named = [o.strip() for o in allowed.split(",") if o.strip() and o.strip() != "*"]
    own = ", ".join(f"http://{host}:{p}" for p in ports)
    cookie = ", ".join([own, *named])
    wildcard = "*" in [o.strip() for o in allowed.split(",")]
    bearer = "any origin" if wildcard else cookie
    return (f"CORS and /ws: {bearer}; the session cookie (/auth/refresh, /auth/logout): {cookie} "
            "(set SWITCHBOARD_ALLOWED_ORIGINS=http://localhost:5173,... to add a dev server)")


def _port_free(host: str, port: int) -> bool:
    """Whether a replica could bind host:port now (SO_REUSEADDR, as uvicorn binds)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError as exc:        # anything but "in use" is the replica's to report
            return exc.errno != errno.EADDRINUSE
    return True


def _wait_ready(ports: list[int], host: str, procs: list[subprocess.Popen[bytes]], stop: Any) -> bool:
    """True once every replica answers ready; False if one exited or 60 s passed."""
    import urllib.request

    h = "127.0.0.1" if host in ("0.0.0.0", "") else host
    deadline = time.time() + 60
    pending = set(ports)
    while pending and time.time() < deadline and not stop():
        for port in list(pending):
            try:
                with urllib.request.urlopen(f"http://{h}:{port}/healthz/ready", timeout=1) as r:
                    if r.status == 200:
                        pending.discard(port)
            except Exception:
                pass
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.2)
    return not pending and all(p.poll() is None for p in procs)

