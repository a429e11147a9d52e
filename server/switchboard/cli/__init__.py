"""The `switchboard` command line: migrate, serve, dev, user, task, runs, handlers, status, docs.

One module per command group: common.py (exit codes, one-line failures, migrate),
serve.py, dev.py, docs.py (the documentation site), operate.py (the admin chores: user,
task, runs, handlers, status) with connect.py (their database connection) and output.py (tables, JSON), and
parser.py (every command and flag). ``python -m switchboard.cli`` runs __main__.py.
"""

from __future__ import annotations

import logging

from .common import EXIT_USAGE, _die, _migrate, _require_env, cmd_migrate
from .connect import _ensure_user, _run_db, _sql_error, _user_id
from .dev import DEV_EXTRA_HINT, cmd_dev
from .operate import (
    RUN_FIELDS,
    STATUS_EPOCHS,
    _next_run,
    _os_user,
    _print_run,
    _run_line,
    _since,
    cmd_handlers,
    cmd_runs,
    cmd_status,
    cmd_task,
    cmd_user,
)
from .output import _duration, _one_line, _print_json, _table, _when
from .parser import build_parser
from .serve import cmd_serve

__all__ = [
    "DEV_EXTRA_HINT", "EXIT_USAGE", "LOG", "RUN_FIELDS", "STATUS_EPOCHS", "build_parser", "cmd_dev",
    "cmd_handlers", "cmd_migrate", "cmd_runs", "cmd_serve", "cmd_status", "cmd_task", "cmd_user", "main",
    # helpers that tests call (tests/unit/test_operate_units.py) or that were importable from cli.py
    "_die", "_duration", "_ensure_user", "_migrate", "_next_run", "_one_line", "_os_user", "_print_json",
    "_print_run", "_require_env", "_run_db", "_run_line", "_since", "_sql_error", "_table", "_user_id", "_when",
]

LOG = logging.getLogger("switchboard.cli")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)
