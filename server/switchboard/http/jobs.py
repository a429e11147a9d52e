"""/jobs: enqueue a one-off job over HTTP (admin), switchboard.enqueue's door.

    POST /jobs {"handler": "ai_chat.complete", "args": {...}, "run_at"?: ISO 8601,
                "queueing_lock"?: "...", "max_attempts"?: 1..100, "priority"?: -100..100,
                "queue"?: "emails"}
    -> 201 {"run": {...}}

Admin only, like /tasks: a job runs a handler with the args it is given. A handler
no live replica runs is refused (422 unknown-handler, with known_handlers), as for a
task: its run would only fail. With a queueing_lock that a queued or running job
holds, nothing is queued: 409 active-run with that job (active_run). The rules
enqueue() checks itself (args an object, max_attempts 1..100, the lock's length,
the handler's name, the priority, a queue that does not exist) come back as 422 naming
the value. max_attempts, priority and queue left out take the handler's options."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import falcon
import falcon.asgi

from ..auth import AuthState
from ..catalog import HandlerCatalog
from ..db import Database
from ..errors import Problem
from .common import check_fields, field_str, jsonable_row, read_json, require_admin, unprocessable
from .tasks import check_handler

JOB_FIELDS = {"handler", "args", "run_at", "queueing_lock", "max_attempts", "priority", "queue"}
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1


def _run_at(body: dict[str, Any]) -> datetime | None:
    raw = body.get("run_at")
    if raw is None:
        return None
    try:
        if not isinstance(raw, str) or len(raw) > 64:
            raise ValueError
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise unprocessable("'run_at' must be an ISO 8601 timestamp (e.g. 2030-01-01T12:00:00Z) or null") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)   # no zone: UTC


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not INT4_MIN <= value <= INT4_MAX:
        raise unprocessable(f"'{name}' must be an integer or null")
    return value


class Jobs:
    def __init__(self, db: Database, auth: AuthState, max_body: int, catalog: HandlerCatalog) -> None:
        self.db = db
        self.auth = auth
        self.max_body = max_body
        self.catalog = catalog

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        require_admin(self.auth, req)
        body = await read_json(req, self.max_body)
        check_fields(body, JOB_FIELDS)
        handler = field_str(body, "handler", max_len=128)
        args = body.get("args", {})
        if not isinstance(args, dict):
            raise unprocessable("'args' must be a JSON object")
        lock = field_str(body, "queueing_lock", required=False, nullable=True, max_len=200)
        attempts, priority = _optional_int(body, "max_attempts"), _optional_int(body, "priority")
        queue = field_str(body, "queue", required=False, nullable=True, max_len=63)
        run_at = _run_at(body)
        await check_handler(self.catalog, handler)
        for _ in range(3):
            run = await self.db.enqueue(handler, args, run_at, lock, attempts, priority, queue)
            if run is not None:
                resp.status = falcon.HTTP_201
                resp.media = {"run": jsonable_row(run)}
                return
            assert lock is not None     # only a held lock queues nothing
            active = await self.db.active_run_by_lock(lock)
            if active is not None:
                raise Problem(409, "active-run", f"a queued or running job holds the queueing_lock {lock!r}",
                              active_run=jsonable_row(active))
            # the holder finished between the two statements: the lock is free, try again
        raise Problem(409, "active-run", f"the queueing_lock {lock!r} is busy; retry", active_run=None)
