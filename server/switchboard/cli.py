"""The `switchboard` command line: migrate, serve, dev, user, task, runs, handlers, status."""

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
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__

if TYPE_CHECKING:   # imported where used: `switchboard --help` stays quick
    from .db import Database
    from .rows import Task

EXIT_USAGE = 2
LOG = logging.getLogger("switchboard.cli")


def _die(msg: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"switchboard: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _require_env(name: str) -> str:
    val = os.environ.get(name)
    if not val:
        _die(f"{name} is not set (required); see README 'Configuration'")
    return val


def _migrate(url: str) -> list[int]:
    from .migrate import MigrationError, migrate

    try:
        return migrate(url)
    except MigrationError as exc:
        _die(str(exc), 1)
    except Exception as exc:  # connection errors: one line, no traceback
        _die(f"migration failed: {str(exc).strip()}", 1)


def cmd_migrate(args: argparse.Namespace) -> int:
    url = os.environ.get("SWITCHBOARD_MIGRATION_DATABASE_URL") or _require_env("DATABASE_URL")
    _migrate(url)
    return 0


# -- serve ----------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    from .config import Config, ConfigError, header_timeout, server_limits

    dev = os.environ.get("SWITCHBOARD_DEV") == "1"
    try:
        config = Config.from_env(dev=dev)
        limits = server_limits()    # read here too: a bad value is a usage error, not a traceback
        header_timeout()
    except ConfigError as exc:
        _die(str(exc))
    if not args.no_migrate:
        _migrate(config.migration_database_url or config.database_url)
    if args.workers > 1:
        return _serve_gunicorn(args, config)
    import uvicorn

    from .app import create_app
    from .handlers import HandlerLoadError
    from .http import protocol

    # uvicorn's own 400/503 answers as problem+json, and h11 with a header read timeout
    io = protocol.uvicorn_io(config.uvloop, header_timeout())

    try:
        app = create_app(config)
    except HandlerLoadError as exc:
        _die(str(exc))
    uconf = uvicorn.Config(
        app, host=args.host, port=args.port, lifespan="on", proxy_headers=False,
        forwarded_allow_ips="", access_log=False, ws_max_size=2 * 1024 * 1024,
        ws_per_message_deflate=config.ws_compression, **io,
        timeout_graceful_shutdown=max(1, int(config.shutdown_grace) + 5),
        log_level=config.log_level.lower(), server_header=False, **limits,
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

    class _App(BaseApplication):  # type: ignore[misc]  # gunicorn ships no types (no py.typed)
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


# -- the admin chores: user, task, runs, handlers, status ------------------------------------
# Every one goes through the server's own data layer (switchboard.db.Database), so the
# CLI sends exactly the SQL the HTTP API sends, reads timestamps the same way (a task
# parked at 'infinity' lists as "never" instead of crashing the command), and there is
# one place to review it. One connection, opened per command.
def _run_db(op: Any, url: str | None = None) -> int:
    """Run ``await op(db)`` against DATABASE_URL; SQL errors become one line and exit 1."""
    import asyncio

    import psycopg
    import psycopg_pool

    from .db import Database

    url = url or _require_env("DATABASE_URL")

    async def main() -> int:
        # The pool retries quietly and then only says it timed out; one plain connect first
        # fails fast and says why.
        try:
            await (await psycopg.AsyncConnection.connect(url, connect_timeout=5)).close()
        except psycopg.Error as exc:
            _die(f"cannot connect to the database: {str(exc).strip()}", 1)
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        db = Database(url, min_size=1, max_size=1, timeout=10.0, name="switchboard-cli", prepare_threshold=None)
        try:
            await db.pool.open(wait=True, timeout=10.0)
        except psycopg_pool.PoolTimeout:
            _die("cannot connect to the database: timed out", 1)
        try:
            return int(await op(db) or 0)
        except psycopg.Error as exc:
            _sql_error(exc)
            return 1
        finally:
            await db.close()

    return asyncio.run(main())


def _sql_error(exc: Exception) -> None:
    import psycopg

    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        hint = f" (hint: {exc.diag.message_hint})" if exc.diag.message_hint else ""
        _die(f"{exc.diag.message_primary}{hint}", 1)
    _die(str(exc), 1)


def _ensure_user(url: str, username: str, role: str, password: str) -> None:
    from .auth import hash_password

    async def op(db: Database) -> None:
        uid = await db.find_user_id(username)
        if uid is None:
            await db.create_user(username, hash_password(password), role)
        else:
            await db.set_user_password_hash(uid, hash_password(password))
            await db.set_user_role(uid, role)

    _run_db(op, url)


async def _user_id(db: Any, name: str) -> Any:
    uid = await db.find_user_id(name)
    if uid is None:
        _die(f"no user named {name!r}", 1)
    return uid


def cmd_user(args: argparse.Namespace) -> int:
    from .auth import hash_password

    password = ""
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

    async def op(db: Any) -> None:
        if args.user_cmd == "set-password":
            await db.set_user_password_hash(await _user_id(db, args.name), hash_password(password))
            print(f"password of {args.name} changed; its tokens are refused and its sockets "
                  "close on every replica")
        elif args.user_cmd == "add":
            uid = await db.create_user(args.name, hash_password(password), args.role)
            print(f"user {args.name} ({args.role}) created: {uid}")
        elif args.user_cmd == "set-role":
            await db.set_user_role(await _user_id(db, args.name), args.role)
            print(f"user {args.name} is now {args.role}")
        elif args.user_cmd == "disable":
            await db.disable_user(await _user_id(db, args.name))
            print(f"user {args.name} disabled; its sockets close on every replica")
        elif args.user_cmd == "enable":
            await db.enable_user(await _user_id(db, args.name))
            print(f"user {args.name} enabled")

    return _run_db(op)


# -- output ------------------------------------------------------------------------------------
def _when(v: Any) -> str:
    """A timestamp for a terminal: UTC, to the second; '-' for none."""
    from datetime import datetime, timezone

    if v is None:
        return "-"
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def _duration(ms: Any) -> str:
    if ms is None:
        return "-"
    ms = int(ms)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{ms // 60_000}m{(ms % 60_000) // 1000:02d}s"
    return f"{ms // 3_600_000}h{(ms % 3_600_000) // 60_000:02d}m"


def _one_line(text: Any, width: int) -> str:
    from .bounded import escape

    return "-" if text is None else escape(str(text), width)


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths[:-1]) + "  {}"
    print(fmt.format(*headers).rstrip())
    for r in rows:
        print(fmt.format(*r).rstrip())


def _print_json(obj: Any) -> None:
    from uuid import UUID

    def default(v: Any) -> Any:
        if isinstance(v, UUID):
            return str(v)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return str(v)

    print(json.dumps(obj, default=default, indent=2, ensure_ascii=False))


# -- task ----------------------------------------------------------------------------------------
def cmd_task(args: argparse.Namespace) -> int:
    async def op(db: Database) -> int:
        if args.task_cmd == "add":
            try:
                task_args = json.loads(args.args)
            except ValueError:
                _die(f"--args is not JSON: {args.args!r}")
            t = await db.create_task(args.name, args.schedule, args.handler, task_args, args.timezone,
                                     args.max_attempts)
            print(f"task {args.name} created: {t.id} (next run {_when(t.next_run_at)})")
        elif args.task_cmd == "list":
            tasks = await db.list_tasks()
            if getattr(args, "json", False):
                _print_json([t.as_dict() for t in tasks])
                return 0
            _table(["NAME", "SCHEDULE", "HANDLER", "ACTIVE", "NEXT RUN"],
                   [[t.name, t.schedule or "(trigger only)", t.handler, str(t.is_active),
                     _next_run(t)] for t in tasks])
        elif args.task_cmd == "trigger":
            found = await db.find_task(args.name)
            if found is None:
                _die(f"no task named {args.name!r}", 1)
            run = await db.create_run_exclusive(found.id, "cli")
            if run is None:
                _die(f"task {args.name} already has a queued or running run", 1)
            print(f"run {run['id']} queued")
        return 0

    return _run_db(op)


def _next_run(t: Task) -> str:
    if t.next_run_at is not None:
        return _when(t.next_run_at)
    if t.schedule is None:
        return "-"
    # A scheduled task whose next_run_at cannot be shown is parked ('infinity', the
    # README's way to park a task for good) or was set to a date out of range by hand.
    return "never (parked)"


# -- runs ----------------------------------------------------------------------------------------
RUN_FIELDS = ("id", "status", "handler", "task_name", "task_id", "trigger", "attempt", "max_attempts",
              "worker", "created_at", "run_at", "started_at", "finished_at", "duration_ms",
              "lease_expires_at", "scheduled_for", "queueing_lock", "retry_of", "error", "args", "result")


def _since(text: str | None) -> Any:
    """--since: an ISO timestamp, or an age such as 30m, 2h, 7d (before now)."""
    import re
    from datetime import datetime, timedelta

    if text is None:
        return None
    m = re.fullmatch(r"(\d{1,6})([smhd])", text.strip())
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        return timedelta(**{unit: int(m.group(1))})
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        _die(f"--since {text!r}: give an ISO timestamp (2026-01-31T12:00:00+00:00) or an age (30m, 2h, 7d)")


def _run_line(r: dict[str, Any]) -> list[str]:
    return [str(r["id"]), r["status"], r["handler"], r["task_name"] or "-", str(r["attempt"]),
            r["worker"] or "-", _when(r["created_at"]), _duration(r["duration_ms"]), _one_line(r["error"], 60)]


def _print_run(r: dict[str, Any]) -> None:
    for k in RUN_FIELDS:
        if k not in r:
            continue
        v = r[k]
        if k in ("args", "result"):
            shown = "-" if v is None else json.dumps(v, ensure_ascii=False)
        elif k == "duration_ms":
            shown = _duration(v)
        elif k == "error":
            shown = _one_line(v, 2000)
        else:
            shown = _when(v)
        print(f"{k + ':':17} {shown}")


def cmd_runs(args: argparse.Namespace) -> int:
    async def op(db: Any) -> int:
        if args.runs_cmd == "list":
            runs = await db.list_runs(args.status, args.handler, args.task, _since(args.since), args.limit,
                                      args.before)
            if args.json:
                _print_json({"runs": runs,
                             "next_before": runs[-1]["id"] if len(runs) == args.limit else None})
                return 0
            _table(["ID", "STATUS", "HANDLER", "TASK", "ATTEMPT", "WORKER", "CREATED", "DURATION", "ERROR"],
                   [_run_line(r) for r in runs])
            if len(runs) == args.limit:
                print(f"(more: --before {runs[-1]['id']})")
            return 0
        if args.runs_cmd == "show":
            r = await db.get_run(args.id)
            if r is None:
                _die(f"run {args.id} does not exist", 1)
            _print_json(r) if args.json else _print_run(r)
            return 0
        if args.runs_cmd == "retry":
            r = await db.retry_run(args.id)
            print(f"run {r['id']} queued: attempt {r['attempt']}, a retry of run {args.id}")
            return 0
        if args.runs_cmd == "cancel":
            ok, r = await db.cancel_run(args.id, actor=_os_user())
            if not ok:
                _die(f"run {args.id} is {r['status'] if r else 'gone'}; only a queued or running run "
                     "can be cancelled", 1)
            print(f"run {args.id} cancelled" + (" (its handler is being stopped)" if r and r["started_at"]
                                                 else ""))
            return 0
        return EXIT_USAGE

    return _run_db(op)


def _os_user() -> str:
    """Who ran the command, for the record a cancel leaves (``cli:<login>``)."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):   # a container user with no passwd entry
        return "cli"


# -- handlers --------------------------------------------------------------------------------------
def cmd_handlers(args: argparse.Namespace) -> int:
    async def op(db: Any) -> int:
        if args.handlers_cmd == "list":
            hs = await db.list_handlers()
            if args.json:
                _print_json({"handlers": hs})
                return 0
            _table(["NAME", "PAUSED", "SERVED", "REPLICAS", "ACTIVE TASKS", "PENDING RUNS"],
                   [[h["name"], f"since {_when(h['paused_at'])}" if h["paused"] else "no",
                     "yes" if h["served"] else "NO", str(h["replicas"]), str(h["active_tasks"]),
                     str(h["pending_runs"])] for h in hs])
            return 0
        if args.handlers_cmd == "pause":
            changed = await db.pause_handler(args.name)
            print(f"handler {args.name} paused: claims skip its queued runs and due ticks "
                  "(running runs go on; cancel them with 'switchboard runs cancel ID')"
                  if changed else f"handler {args.name} was already paused")
            return 0
        if args.handlers_cmd == "resume":
            changed = await db.resume_handler(args.name)
            print(f"handler {args.name} resumed" if changed else f"handler {args.name} was not paused")
            return 0
        return EXIT_USAGE

    return _run_db(op)


# -- status ------------------------------------------------------------------------------------------
STATUS_EPOCHS = ("db_started_at", "unlogged_state_since")


def cmd_status(args: argparse.Namespace) -> int:
    async def op(db: Any) -> int:
        rows = await db.status()
        if args.json:
            _print_json({"status": {r["item"]: r["value"] for r in rows}})
            return 0
        from datetime import datetime, timezone

        out = []
        for r in rows:
            v = r["value"]
            if r["item"] in STATUS_EPOCHS and v is not None:
                shown = datetime.fromtimestamp(v, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            elif r["item"] == "event_backlog_seconds" and v is not None:
                shown = f"{v} s"
            else:
                shown = "-" if v is None else str(v)
            out.append([r["item"], shown])
        _table(["ITEM", "VALUE"], out)
        return 0

    return _run_db(op)


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
    tl = tsub.add_parser("list")
    tl.add_argument("--json", action="store_true", help="JSON instead of a table")
    tt = tsub.add_parser("trigger")
    tt.add_argument("name")
    t.set_defaults(func=cmd_task)

    r = sub.add_parser("runs", help="list, show, retry and cancel runs")
    rsub = r.add_subparsers(dest="runs_cmd", required=True)
    rl = rsub.add_parser("list", help="runs, newest first")
    rl.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "abandoned", "cancelled"])
    rl.add_argument("--handler")
    rl.add_argument("--task", help="task name or id")
    rl.add_argument("--since", help="ISO timestamp, or an age: 30m, 2h, 7d")
    rl.add_argument("--limit", type=int, default=50, help="page size, 1..1000 (default 50)")
    rl.add_argument("--before", type=int, help="the next page: runs older than this id")
    rl.add_argument("--json", action="store_true", help="JSON instead of a table")
    rs = rsub.add_parser("show", help="one run, every field")
    rs.add_argument("id", type=int)
    rs.add_argument("--json", action="store_true")
    for name, help_ in (("retry", "queue a new attempt of a finished run"),
                        ("cancel", "cancel a queued or running run (a running handler is stopped)")):
        rx = rsub.add_parser(name, help=help_)
        rx.add_argument("id", type=int)
    r.set_defaults(func=cmd_runs)

    h = sub.add_parser("handlers", help="list, pause and resume task handlers")
    hsub = h.add_subparsers(dest="handlers_cmd", required=True)
    hl = hsub.add_parser("list")
    hl.add_argument("--json", action="store_true")
    for name, help_ in (("pause", "claims skip the handler's queued runs and due ticks"),
                        ("resume", "release a paused handler's work")):
        hx = hsub.add_parser(name, help=help_)
        hx.add_argument("name")
    h.set_defaults(func=cmd_handlers)

    st = sub.add_parser("status", help="one look at the system: switchboard.status()")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
