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
from typing import Any

from .common import _migrate
from .connect import _ensure_user


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
        try:
            from ..pgtest import ThrowawayPostgres
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("testing"):
                raise
            print(DEV_EXTRA_HINT, file=sys.stderr)
            return 2
        print("switchboard dev: starting a throwaway PostgreSQL ...", flush=True)
        pg = ThrowawayPostgres(own_session=True)
        import psycopg

        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE switchboard")
        url = pg.url("switchboard")
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False
    failed = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)  # the terminal closed: the children no longer hear it
    try:
        applied = _migrate(url)
        print(f"switchboard dev: migrated ({'versions ' + ', '.join(map(str, applied)) if applied else 'already at head'})",
              flush=True)
        password = os.environ.get("SWITCHBOARD_DEV_PASSWORD") or secrets.token_urlsafe(9)
        _ensure_user(url, "admin", "admin", password)
        env = dict(os.environ)
        env.update({
            "DATABASE_URL": url,
            "SWITCHBOARD_JWT_SECRET": os.environ.get("SWITCHBOARD_JWT_SECRET") or secrets.token_hex(32),
            "SWITCHBOARD_DEV": "1",
            "SWITCHBOARD_ALLOWED_ORIGINS": os.environ.get("SWITCHBOARD_ALLOWED_ORIGINS", "*"),
        })
        if not verbose:
            env["SWITCHBOARD_LOG_LEVEL"] = "WARNING"
        ports = [args.port + i for i in range(args.replicas)]
        # Checked here, just before the replicas bind: a port someone else serves on would
        # otherwise answer the readiness check below for a replica that failed to bind.
        busy = [port for port in ports if not _port_free(args.host, port)]
        if busy:
            print(f"switchboard dev: port {busy[0]} is in use on {args.host or '0.0.0.0'}; the replicas take "
                  f"--port, --port+1, ...: choose free ones (e.g. --port {args.port + 100})", file=sys.stderr)
            return 2
        print(f"switchboard dev: starting {len(ports)} replicas ...", flush=True)
        for port in ports:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "switchboard.cli", "serve", "--host", args.host, "--port", str(port),
                 "--no-migrate"], env=env, start_new_session=True))
        ready = _wait_ready(ports, args.host, procs, lambda: stopping)
        if not ready and not stopping:
            print("switchboard dev: a replica did not become ready (its log is above); stopping", file=sys.stderr)
            failed = True
        elif not stopping:
            shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
            print("\nSwitchboard dev is up:")
            for port in ports:
                print(f"  replica  http://{shown}:{port}/   (ready: http://{shown}:{port}/healthz/ready)")
            print(f"  login    admin / {password}")
            print(f"  database {url}")
            print("Press Ctrl-C to stop.\n", flush=True)
        while not stopping and not failed:
            if any(p.poll() is not None for p in procs):
                print("switchboard dev: a replica exited; stopping", file=sys.stderr)
                failed = True
                break
            time.sleep(0.2)
    finally:
        if procs:
            print("switchboard dev: stopping the replicas ...", flush=True)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if pg is not None:  # only now: the replicas needed it to drain
            pg.stop()
        print("switchboard dev: stopped", flush=True)
    return 1 if failed else 0


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

