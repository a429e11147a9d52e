"""The admin chores: user, task, runs, handlers, status (one database connection each)."""

from __future__ import annotations

import argparse
import getpass
import json
import secrets
import sys
from typing import TYPE_CHECKING, Any

from .common import EXIT_USAGE, _die
from .connect import _run_db, _user_id
from .output import _duration, _one_line, _print_json, _table, _when

if TYPE_CHECKING:   # imported where used: `switchboard --help` stays quick
    from ..db import Database
    from ..rows import Task


# -- user ----------------------------------------------------------------------------------------
def cmd_user(args: argparse.Namespace) -> int:
    from ..auth import hash_password

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
    # documented way to park a task for good) or was set to a date out of range by hand.
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
        if args.runs_cmd in ("retry", "cancel") and (args.id is None) == (args.status is None):
            _die(f"runs {args.runs_cmd}: give a run id, or --status (with --handler, --task, --since) "
                 "for every run that matches, not both")
        if args.runs_cmd in ("retry", "cancel") and args.id is None:
            return await _bulk(db, args)
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


async def _bulk(db: Any, args: argparse.Namespace) -> int:
    """runs retry|cancel --status ...: retry_runs / cancel_runs, page after page until a
    page does nothing (each page is one bounded statement of --max runs)."""
    since = _since(args.since)      # an age counts back from the database's clock
    total = 0
    while True:
        if args.runs_cmd == "retry":
            page = len(await db.retry_runs(args.status, args.handler, args.task, since, args.max))
        else:
            page = len(await db.cancel_runs(args.status, args.handler, args.task, since, args.max,
                                            actor=_os_user()))
        total += page
        if page == 0:
            break
    print(f"{total} run{'s' if total != 1 else ''} " + ("retried" if args.runs_cmd == "retry" else "cancelled"))
    return 0


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

