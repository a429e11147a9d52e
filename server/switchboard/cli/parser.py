"""The argument parser: every command, its flags, and the function that runs it."""

from __future__ import annotations

import argparse
import os

from .. import __version__
from .common import cmd_migrate
from .dev import cmd_dev
from .docs import cmd_docs
from .jobs import cmd_enqueue
from .operate import cmd_handlers, cmd_runs, cmd_status, cmd_task, cmd_user
from .serve import cmd_serve


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

    e = sub.add_parser("enqueue", help="queue a one-off job (switchboard.enqueue)")
    e.add_argument("handler")
    e.add_argument("--args", default="{}", help="the job's arguments, a JSON object")
    e.add_argument("--run-at", help="not before: an ISO timestamp, or a delay (30s, 10m, 2h)")
    e.add_argument("--queueing-lock", help="at most one queued or running job holds it")
    e.add_argument("--max-attempts", type=int, help="default: the handler's option, else 3")
    e.add_argument("--priority", type=int, help="-100..100, higher first within its queue; default: the handler's")
    e.add_argument("--queue", help="a queue some handler's options name; default: the handler's")
    e.add_argument("--unserved-ok", action="store_true", help="queue it even if no live replica runs the handler")
    e.add_argument("--json", action="store_true", help="print the queued run as JSON")
    e.set_defaults(func=cmd_enqueue)

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
    for name, help_ in (("retry", "queue a new attempt of a finished run, or of every run a filter matches"),
                        ("cancel", "cancel a queued or running run (a running handler is stopped), or every "
                                   "run a filter matches")):
        rx = rsub.add_parser(name, help=help_)
        rx.add_argument("id", type=int, nargs="?", help="one run; or filter with --status and the rest")
        rx.add_argument("--status", help="retry: failed, abandoned, cancelled, succeeded; cancel: queued, running")
        rx.add_argument("--handler")
        rx.add_argument("--task", help="task name or id")
        rx.add_argument("--since", help="created since: ISO timestamp, or an age: 30m, 2h, 7d")
        rx.add_argument("--max", type=int, default=1000, help="at most this many runs per call (1..10000)")
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

    dc = sub.add_parser("docs", help="serve the documentation site locally (mkdocs serve; from a checkout)")
    dc.add_argument("--addr", default="127.0.0.1:8001", help="host:port to serve on")
    dc.add_argument("--config-file", help="the site's mkdocs.yml (default: the checkout's)")
    dc.set_defaults(func=cmd_docs)
    return p
