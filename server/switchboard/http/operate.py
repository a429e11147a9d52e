"""/runs, /runs/{id}, /runs/{id}/retry|cancel, /runs/retry|cancel (by filter), /handlers, /handlers/{name}/pause|resume, /status.

The operator's API (admin only; members get 403): the same SQL functions a DBA
calls from psql (list_runs, retry_run, cancel_run, pause_handler,
resume_handler, status) through the data layer. Cancel and retry also send
``run.updated`` ({"run": {...}}) to every admin's sockets, in the same
transaction (db.Database.cancel_run / retry_run).

Pagination is keyset: ``next_cursor`` is an opaque string (today "v1." and the
last run id of the page); pass it back as ``cursor`` for the next, older page.
New runs never shift a page.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import falcon
import falcon.asgi
import psycopg

from ..auth import AuthState
from ..bounded import BadInput, bigint
from ..db import Database
from ..relay import Relay
from ..replica import ReplicaState
from .common import check_fields, field_str, jsonable_row, read_json, require_admin, unprocessable

MAX_PAGE = 500
CURSOR_RE = re.compile(r"v1\.([0-9]{1,19})")
STATUS_EPOCHS = ("db_started_at", "unlogged_state_since")


def _bad_param(name: str, msg: str) -> falcon.HTTPError:
    return falcon.HTTPBadRequest(title="Bad Request", description=f"query parameter '{name}': {msg}")


def _cursor(value: str | None) -> int | None:
    if value is None:
        return None
    m = CURSOR_RE.fullmatch(value)   # not match(): "$" would accept a trailing newline
    if m is None:
        raise _bad_param("cursor", "not a cursor this API returned (pass next_cursor back unchanged)")
    try:
        return bigint(int(m.group(1)), name="cursor")
    except (BadInput, ValueError):
        raise _bad_param("cursor", "out of range") from None


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise _bad_param("since", "an ISO 8601 time, e.g. 2026-01-31T12:00:00Z") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _short(value: str | None, name: str, max_len: int = 200) -> str | None:
    if value is not None and (not value or len(value) > max_len or "\x00" in value):
        raise _bad_param(name, f"1 to {max_len} characters")
    return value


def _conflict(exc: psycopg.Error) -> falcon.HTTPError:
    d = exc.diag
    desc = d.message_primary or str(exc)
    if d.message_hint:
        desc = f"{desc} (hint: {d.message_hint})"
    return falcon.HTTPConflict(title="Conflict", description=desc)


class Runs:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        limit = req.get_param_as_int("limit", min_value=1, max_value=MAX_PAGE, default=50)
        before = _cursor(req.get_param("cursor"))
        rows = await self.db.history.list_runs(   # the read replica while it keeps up
            status=_short(req.get_param("status"), "status", 20),
            handler=_short(req.get_param("handler"), "handler", 128),
            task=_short(req.get_param("task"), "task"),
            since=_since(req.get_param("since")),
            limit=limit + 1, before_id=before)
        page = rows[:limit]
        resp.media = {"runs": [jsonable_row(r) for r in page],
                      "next_cursor": f"v1.{page[-1]['id']}" if len(rows) > limit else None}


class Run:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response, run_id: int) -> None:
        require_admin(self.auth, req)
        run = await self.db.history.get_run(run_id)   # not on the replica yet: the primary
        if run is None:
            raise falcon.HTTPNotFound(title="Not Found", description=f"run {run_id} does not exist")
        resp.media = {"run": jsonable_row(run)}


class RunRetry:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_post(self, req: falcon.Request, resp: falcon.Response, run_id: int) -> None:
        require_admin(self.auth, req)
        try:
            run = await self.db.retry_run(run_id)
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:   # 55000: not finished / already retried
            raise _conflict(exc) from None
        resp.status = falcon.HTTP_201
        resp.media = {"run": jsonable_row(run)}


class RunCancel:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_post(self, req: falcon.Request, resp: falcon.Response, run_id: int) -> None:
        who = require_admin(self.auth, req)
        ok, run = await self.db.cancel_run(run_id, actor=who.username)   # P0002 (no such run) -> 404
        if not ok:
            status = run["status"] if run else "gone"
            raise falcon.HTTPConflict(
                title="Conflict",
                description=f"run {run_id} is {status}; only a queued or running run can be cancelled")
        assert run is not None  # re-read in cancel_run's transaction, after it succeeded
        resp.media = {"run": jsonable_row(run)}


BULK_FIELDS = {"status", "handler", "task", "since", "max_rows"}


async def _bulk_filter(req: falcon.asgi.Request, max_body: int) -> dict[str, Any]:
    """The body of POST /runs/retry and /runs/cancel: list_runs' filters (status
    required), max_rows 1..10000 (default 1000). The SQL function checks the values."""
    body = await read_json(req, max_body)
    check_fields(body, BULK_FIELDS)
    f: dict[str, Any] = {"status": field_str(body, "status", max_len=20),
                         "handler": field_str(body, "handler", required=False, nullable=True, max_len=128),
                         "task": field_str(body, "task", required=False, nullable=True, max_len=200)}
    since = field_str(body, "since", required=False, nullable=True, max_len=64)
    try:
        f["since"] = _since(since)
    except falcon.HTTPBadRequest:
        raise unprocessable("'since' must be an ISO 8601 time, e.g. 2026-01-31T12:00:00Z") from None
    n = body.get("max_rows", 1000)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10000:
        raise unprocessable("'max_rows' must be an integer from 1 to 10000")
    f["max_rows"] = n
    return f


class RunsRetry:
    """POST /runs/retry {"status": "failed", "handler"?, "task"?, "since"?, "max_rows"?}:
    retry_runs(). 200 {"count", "retries": [{"run_id", "retry_id"}], "more"}; ``more``
    while a call does something: call again until it is false (count 0)."""

    def __init__(self, db: Database, auth: AuthState, max_body: int) -> None:
        self.db = db
        self.auth = auth
        self.max_body = max_body

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        f = await _bulk_filter(req, self.max_body)
        rows = await self.db.retry_runs(f["status"], f["handler"], f["task"], f["since"], f["max_rows"])
        resp.media = {"count": len(rows), "retries": [dict(r) for r in rows], "more": bool(rows)}


class RunsCancel:
    """POST /runs/cancel {"status": "queued" | "running", ...}: cancel_runs().
    200 {"count", "cancelled": [ids], "more"}."""

    def __init__(self, db: Database, auth: AuthState, max_body: int) -> None:
        self.db = db
        self.auth = auth
        self.max_body = max_body

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        who = require_admin(self.auth, req)
        f = await _bulk_filter(req, self.max_body)
        ids = await self.db.cancel_runs(f["status"], f["handler"], f["task"], f["since"], f["max_rows"],
                                        actor=who.username)
        resp.media = {"count": len(ids), "cancelled": ids, "more": bool(ids)}


def _handler(row: dict[str, Any] | None, name: str) -> dict[str, Any]:
    if row is None:   # neither served, wanted nor paused: the view has no row for it
        return {"name": name, "paused": False, "paused_at": None, "served": False, "replicas": 0,
                "versions": [], "active_tasks": 0, "pending_runs": 0}
    return dict(row)


class Handlers:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        resp.media = {"handlers": [_handler(h, h["name"]) for h in await self.db.list_handlers()]}


class HandlerAction:
    """POST /handlers/{name}/pause and /resume (the handler name is checked by SQL: 22023 -> 422)."""

    def __init__(self, db: Database, auth: AuthState, pause: bool) -> None:
        self.db = db
        self.auth = auth
        self.pause = pause

    async def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        require_admin(self.auth, req)
        if len(name) > 128:
            raise falcon.HTTPUnprocessableEntity(title="Unprocessable Entity",
                                                 description="a handler name is at most 128 characters")
        changed = await (self.db.pause_handler(name) if self.pause else self.db.resume_handler(name))
        resp.media = {"handler": _handler(await self.db.get_handler(name), name), "changed": changed}


class Status:
    """status() as an object, and the live replicas. Readiness: this replica's is its
    readiness probe's rule, now; another replica's is what its last heartbeat said
    (it is in the view only while it heartbeats; ``draining`` when it is shutting down)."""

    def __init__(self, db: Database, auth: AuthState, replica: ReplicaState, relay: Relay) -> None:
        self.db = db
        self.auth = auth
        self.replica = replica
        self.relay = relay

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        status = {r["item"]: r["value"] for r in await self.db.status()}
        replicas = []
        for r in await self.db.list_replicas():
            info: dict[str, Any] = r["info"] if isinstance(r["info"], dict) else {}
            if r["id"] == self.replica.replica_id:
                reasons = (["shutting_down"] if self.replica.draining else []) + \
                          ([] if self.relay.connected else ["listen_down"])
            else:
                reasons = ["shutting_down"] if info.get("draining") else []
            replicas.append({**jsonable_row({k: v for k, v in r.items() if k != "info"}),
                             "host": info.get("host"), "pid": info.get("pid"),
                             "this": r["id"] == self.replica.replica_id,
                             "ready": not reasons, "reasons": reasons})
        resp.media = {"status": status, "replicas": replicas}
