"""The `switchboard` command line: migrate, serve, dev, user, task."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

from . import __version__

EXIT_USAGE = 2
LOG = logging.getLogger("switchboard.cli")


def _die(msg: str, code: int = EXIT_USAGE) -> None:
    print(f"switchboard: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _require_env(name: str) -> str:
    val = os.environ.get(name)
    if not val:
        _die(f"{name} is not set (required); see README 'Configuration'")
    return val  # type: ignore[return-value]


def _migrate(url: str) -> list[int]:
    from .migrate import MigrationError, migrate

    try:
        return migrate(url)
    except MigrationError as exc:
        _die(str(exc), 1)
    except Exception as exc:  # connection errors: one line, no traceback
        _die(f"migration failed: {str(exc).strip()}", 1)
    return []


def cmd_migrate(args: argparse.Namespace) -> int:
    url = os.environ.get("SWITCHBOARD_MIGRATION_DATABASE_URL") or _require_env("DATABASE_URL")
    _migrate(url)
    return 0


# -- serve ----------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    from .config import Config, ConfigError

    dev = os.environ.get("SWITCHBOARD_DEV") == "1"
    try:
        config = Config.from_env(dev=dev)
    except ConfigError as exc:
        _die(str(exc))
    if not args.no_migrate:
        _migrate(config.migration_database_url or config.database_url)
    if args.workers > 1:
        return _serve_gunicorn(args, config)
    import uvicorn

    from .app import create_app
    from .handlers import HandlerLoadError

    try:
        app = create_app(config)
    except HandlerLoadError as exc:
        _die(str(exc))
    uconf = uvicorn.Config(
        app, host=args.host, port=args.port, lifespan="on", proxy_headers=False,
        forwarded_allow_ips="", access_log=False, ws_max_size=2 * 1024 * 1024,
        ws_per_message_deflate=config.ws_compression,
        timeout_graceful_shutdown=max(1, int(config.shutdown_grace) + 5),
        log_level=config.log_level.lower(), server_header=False,
    )
    server = uvicorn.Server(uconf)
    # uvicorn re-raises the captured SIGTERM/SIGINT after a graceful shutdown, restoring
    # the previous handlers first; make those no-ops so a drained replica exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    return 0


def _serve_gunicorn(args: argparse.Namespace, config: Any) -> int:
    import shutil
    import tempfile

    # Each worker is a replica of its own, and any of them may answer a scrape:
    # prometheus-client's multiprocess mode writes every worker's values to files
    # in one directory and /metrics sums them. It must be set before a worker
    # imports prometheus_client, and fresh for every start (old files would add
    # a previous run's counts).
    metrics_dir = tempfile.mkdtemp(prefix="switchboard-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

    from gunicorn.app.base import BaseApplication

    def child_exit(server: Any, worker: Any) -> None:
        from .metrics import mark_process_dead

        mark_process_dead(worker.pid)

    class _App(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", f"{args.host}:{args.port}")
            self.cfg.set("workers", args.workers)
            self.cfg.set("worker_class", "switchboard.gunicorn_worker.Worker")
            self.cfg.set("graceful_timeout", max(1, int(config.shutdown_grace) + 5))
            self.cfg.set("forwarded_allow_ips", "")
            self.cfg.set("accesslog", None)
            self.cfg.set("loglevel", config.log_level.lower())
            self.cfg.set("child_exit", child_exit)

        def load(self) -> Any:
            from .asgi import app

            return app

    try:
        _App().run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


# -- dev ------------------------------------------------------------------------------------
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
            from .pgtest import ThrowawayPostgres
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
    procs: list[subprocess.Popen] = []
    stopping = False

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
        print(f"switchboard dev: starting {len(ports)} replicas ...", flush=True)
        for port in ports:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "switchboard.cli", "serve", "--host", args.host, "--port", str(port),
                 "--no-migrate"], env=env, start_new_session=True))
        _wait_ready(ports, args.host, procs, lambda: stopping)
        if not stopping:
            shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
            print("\nSwitchboard dev is up:")
            for port in ports:
                print(f"  replica  http://{shown}:{port}/   (ready: http://{shown}:{port}/healthz/ready)")
            print(f"  login    admin / {password}")
            print(f"  database {url}")
            print("Press Ctrl-C to stop.\n", flush=True)
        while not stopping:
            if any(p.poll() is not None for p in procs):
                print("switchboard dev: a replica exited; stopping", file=sys.stderr)
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
    return 0


def _wait_ready(ports: list[int], host: str, procs: list[subprocess.Popen], stop: Any) -> None:
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
            return
        time.sleep(0.2)


# -- user / task admin ---------------------------------------------------------------------
def _connect() -> Any:
    import psycopg

    url = _require_env("DATABASE_URL")
    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        _die(f"cannot connect to the database: {str(exc).strip()}", 1)


def _sql_error(exc: Exception) -> None:
    import psycopg

    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        hint = f" (hint: {exc.diag.message_hint})" if exc.diag.message_hint else ""
        _die(f"{exc.diag.message_primary}{hint}", 1)
    _die(str(exc), 1)


def _ensure_user(url: str, username: str, role: str, password: str) -> None:
    import psycopg

    from .auth import hash_password

    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT id FROM switchboard.find_user(%s)", (username,)).fetchone()
        if row is None:
            c.execute("SELECT switchboard.create_user(%s, %s, %s)", (username, hash_password(password), role))
        else:
            c.execute("SELECT switchboard.set_user_password_hash(%s, %s)", (row[0], hash_password(password)))
            c.execute("SELECT switchboard.set_user_role(%s, %s)", (row[0], role))


def _user_id(c: Any, name: str) -> Any:
    row = c.execute("SELECT id FROM switchboard.find_user(%s)", (name,)).fetchone()
    if row is None:
        _die(f"no user named {name!r}", 1)
    return row[0]


def cmd_user(args: argparse.Namespace) -> int:
    import psycopg

    from .auth import hash_password

    with _connect() as c:
        try:
            if args.user_cmd in ("add", "set-password"):
                if args.password_stdin:
                    password = sys.stdin.readline().rstrip("\n")
                elif sys.stdin.isatty():
                    password = getpass.getpass(f"password for {args.name}: ")
                else:
                    password = secrets.token_urlsafe(12)
                    print(f"generated password for {args.name}: {password}")
                if not password:
                    _die("empty password")
            if args.user_cmd == "set-password":
                c.execute("SELECT switchboard.set_user_password_hash(%s, %s)",
                          (_user_id(c, args.name), hash_password(password)))
                print(f"password of {args.name} changed; its tokens are refused and its sockets "
                      "close on every replica")
            elif args.user_cmd == "add":
                uid = c.execute("SELECT switchboard.create_user(%s, %s, %s)",
                                (args.name, hash_password(password), args.role)).fetchone()[0]
                print(f"user {args.name} ({args.role}) created: {uid}")
            elif args.user_cmd == "set-role":
                c.execute("SELECT switchboard.set_user_role(%s, %s)", (_user_id(c, args.name), args.role))
                print(f"user {args.name} is now {args.role}")
            elif args.user_cmd == "disable":
                c.execute("SELECT switchboard.disable_user(%s)", (_user_id(c, args.name),))
                print(f"user {args.name} disabled; its sockets close on every replica")
            elif args.user_cmd == "enable":
                c.execute("SELECT switchboard.enable_user(%s)", (_user_id(c, args.name),))
                print(f"user {args.name} enabled")
        except psycopg.Error as exc:
            _sql_error(exc)
    return 0


def cmd_task(args: argparse.Namespace) -> int:
    import psycopg
    from psycopg.types.json import Jsonb

    with _connect() as c:
        try:
            if args.task_cmd == "add":
                try:
                    task_args = json.loads(args.args)
                except ValueError:
                    _die(f"--args is not JSON: {args.args!r}")
                row = c.execute(
                    "SELECT id, next_run_at FROM switchboard.create_task(%s, %s, %s, %s, %s, %s)",
                    (args.name, args.schedule, args.handler, Jsonb(task_args), args.timezone,
                     args.max_attempts)).fetchone()
                print(f"task {args.name} created: {row[0]} (next run {row[1]})")
            elif args.task_cmd == "list":
                rows = c.execute(
                    "SELECT name, coalesce(schedule, '(trigger only)'), handler, is_active, next_run_at, id "
                    "FROM switchboard.tasks ORDER BY name").fetchall()
                print(f"{'NAME':30} {'SCHEDULE':22} {'HANDLER':14} {'ACTIVE':6} NEXT RUN")
                for r in rows:
                    print(f"{r[0]:30} {r[1]:22} {r[2]:14} {str(r[3]):6} {r[4]}")
            elif args.task_cmd == "trigger":
                row = c.execute("SELECT id FROM switchboard.tasks WHERE name = %s", (args.name,)).fetchone()
                if row is None:
                    _die(f"no task named {args.name!r}", 1)
                run = c.execute("SELECT id FROM switchboard.create_run_exclusive(%s, 'cli')", (row[0],)).fetchone()
                if run is None:
                    _die(f"task {args.name} already has a queued or running run", 1)
                print(f"run {run[0]} queued")
        except psycopg.Error as exc:
            _sql_error(exc)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="switchboard",
                                description="N stateless replicas with PostgreSQL as the only coordination layer")
    p.add_argument("--log-level", default=os.environ.get("SWITCHBOARD_LOG_LEVEL", "INFO"))
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("migrate", help="apply migrations and functions under an advisory lock")
    m.set_defaults(func=cmd_migrate)

    s = sub.add_parser("serve", help="run one replica (HTTP, WebSocket relay, scheduler)")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--workers", type=int, default=1,
                   help="worker processes (gunicorn); each is a replica of its own")
    s.add_argument("--no-migrate", action="store_true", help="do not migrate at start-up")
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("dev", help="throwaway Postgres + 2 replicas, for trying it out")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=8000, help="first replica's port (the next ones follow)")
    d.add_argument("--replicas", type=int, default=2)
    d.set_defaults(func=cmd_dev)

    u = sub.add_parser("user", help="manage users")
    usub = u.add_subparsers(dest="user_cmd", required=True)
    ua = usub.add_parser("add")
    ua.add_argument("name")
    ua.add_argument("--role", choices=["admin", "member"], default="member")
    ua.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    up = usub.add_parser("set-password", help="new password; revokes tokens, closes sockets")
    up.add_argument("name")
    up.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    ur = usub.add_parser("set-role")
    ur.add_argument("name")
    ur.add_argument("role", choices=["admin", "member"])
    for name in ("disable", "enable"):
        ud = usub.add_parser(name)
        ud.add_argument("name")
    u.set_defaults(func=cmd_user)

    t = sub.add_parser("task", help="manage tasks")
    tsub = t.add_subparsers(dest="task_cmd", required=True)
    ta = tsub.add_parser("add")
    ta.add_argument("name")
    ta.add_argument("--schedule", default=None, help="cron, @hourly…, '@every 30 seconds'; omit for trigger-only")
    ta.add_argument("--handler", required=True)
    ta.add_argument("--args", default="{}", help="JSON object")
    ta.add_argument("--timezone", default="UTC")
    ta.add_argument("--max-attempts", type=int, default=3)
    tsub.add_parser("list")
    tt = tsub.add_parser("trigger")
    tt.add_argument("name")
    t.set_defaults(func=cmd_task)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
