"""``switchboard enqueue HANDLER``: queue a one-off job from a shell (switchboard.enqueue)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from typing import Any

from .common import _die
from .connect import _run_db
from .output import _print_json


def _args(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        _die(f"--args is not JSON ({exc}): {text[:200]!r}")
    if not isinstance(value, dict):
        _die(f"--args must be a JSON object, not {type(value).__name__}: {text[:200]!r}")
    return value


def _run_at(text: str | None) -> datetime | None:
    """--run-at: an ISO timestamp (no zone: UTC), or a delay from now: 30s, 10m, 2h, 1d."""
    import re
    from datetime import timedelta

    if text is None:
        return None
    m = re.fullmatch(r"(\d{1,6})([smhd])", text.strip())
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        return datetime.now(timezone.utc) + timedelta(**{unit: int(m.group(1))})
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        _die(f"--run-at {text!r}: give an ISO timestamp (2030-01-31T12:00:00+00:00) or a delay (30s, 10m, 2h)")
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def cmd_enqueue(args: argparse.Namespace) -> int:
    job_args = _args(args.args)
    run_at = _run_at(args.run_at)

    async def op(db: Any) -> int:
        if not args.unserved_ok:
            names = await db.known_handlers(None)
            if args.handler not in names:
                _die(f"no live replica runs handler {args.handler!r} (running: {', '.join(names) or 'none'}); "
                     "its job would wait or fail. --unserved-ok queues it anyway (a handler about to be "
                     "deployed)", 1)
        run = await db.enqueue(args.handler, job_args, run_at, args.queueing_lock, args.max_attempts,
                               args.priority, args.queue)
        if run is None:
            active = await db.active_run_by_lock(args.queueing_lock)
            _die(f"queueing lock {args.queueing_lock!r} is held by "
                 + (f"run {active['id']} ({active['status']})" if active else "a job that just finished; retry")
                 + ": nothing queued", 1)
        if args.json:
            _print_json({"run": run})
        else:
            print(f"run {run['id']} queued: {args.handler}" + (f", not before {run['run_at']}" if run_at else ""))
        return 0

    return _run_db(op)
