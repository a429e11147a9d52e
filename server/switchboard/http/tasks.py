"""/tasks, /tasks/{id}, /tasks/{id}/trigger, /tasks/{id}/runs.

Admin only, reads included: a task holds its args (a sql task its SQL text),
and its runs hold results and error texts. Members own no tasks (only admins
create them), so "what is theirs" would always be nothing: 403 says so
plainly (docs/explanation/security.md)."""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from typing import Any

import falcon

from ..auth import AuthState
from ..catalog import HandlerCatalog
from ..db import Database
from ..errors import Problem
from ..rows import Task as TaskRow
from .common import (check_fields, field_str, jsonable_row, read_json, require_admin,
                     unprocessable)

INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
TASK_FIELDS = {"name", "schedule", "handler", "args", "timezone", "max_attempts", "is_active"}


def _not_found(task_id: uuid.UUID) -> falcon.HTTPError:
    return falcon.HTTPNotFound(title="Not Found", description=f"task {task_id} does not exist")


class UnknownHandler(falcon.HTTPUnprocessableEntity):
    """422 that also lists the handlers the deployment knows (``known_handlers``)."""

    def __init__(self, handler: str, known: list[str]) -> None:
        super().__init__(title="Unprocessable Entity",
                         description=f"no live replica of this version runs handler {handler!r}; "
                                     f"known handlers: {', '.join(known) or '(none)'}")
        self.known = known
        self.problem = "unknown-handler"

    def to_dict(self, obj_type: type[MutableMapping[str, Any]] = dict) -> MutableMapping[str, Any]:
        d: MutableMapping[str, Any] = super().to_dict(obj_type)
        d["known_handlers"] = self.known
        return d


async def check_handler(catalog: HandlerCatalog, handler: object) -> None:
    """A task whose handler nobody runs would fail every run max_attempts times:
    refuse it here. (SQL's create_task stays permissive for DBAs.)"""
    if not isinstance(handler, str):
        return  # the type is refused where the value is read
    known = await catalog.known()
    if handler not in known:
        raise UnknownHandler(handler, known)


class Tasks:
    def __init__(self, db: Database, auth: AuthState, max_body: int, catalog: HandlerCatalog) -> None:
        self.db = db
        self.catalog = catalog
        self.auth = auth
        self.max_body = max_body

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        resp.media = {"tasks": [jsonable_row(t.as_dict()) for t in await self.db.list_tasks()]}

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        require_admin(self.auth, req)
        body = await read_json(req, self.max_body)
        check_fields(body, TASK_FIELDS - {"is_active"})
        name = field_str(body, "name", max_len=200)
        schedule = field_str(body, "schedule", required=False, nullable=True, max_len=200)
        handler = field_str(body, "handler", max_len=128)
        tz = field_str(body, "timezone", required=False, max_len=100) or "UTC"
        # The rules (args is an object, max_attempts in 1..100, name/schedule/zone syntax)
        # live in create_task, which raises 22023 naming the value (-> 422). Here only
        # what SQL cannot see: JSON types that would not bind to the function's types.
        args = body.get("args", {})
        attempts = body.get("max_attempts", 3)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not INT4_MIN <= attempts <= INT4_MAX:
            raise unprocessable("'max_attempts' must be an integer")
        await check_handler(self.catalog, handler)
        task = await self.db.create_task(name, schedule, handler, args, tz, attempts)
        resp.status = falcon.HTTP_201
        resp.media = jsonable_row(task.as_dict())


class Task:
    def __init__(self, db: Database, auth: AuthState, max_body: int, catalog: HandlerCatalog) -> None:
        self.db = db
        self.catalog = catalog
        self.auth = auth
        self.max_body = max_body

    async def _get(self, task_id: uuid.UUID) -> TaskRow:
        t = await self.db.get_task(task_id)
        if t is None:
            raise _not_found(task_id)
        return t

    async def on_get(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        resp.media = jsonable_row((await self._get(task_id)).as_dict())

    async def on_patch(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, task_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        body = await read_json(req, self.max_body)
        check_fields(body, TASK_FIELDS)
        if not body:
            raise unprocessable("nothing to change")
        if "handler" in body:
            await check_handler(self.catalog, body["handler"])
        resp.media = jsonable_row((await self.db.update_task(task_id, body)).as_dict())

    async def on_delete(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        if not await self.db.delete_task(task_id):
            raise _not_found(task_id)
        resp.status = falcon.HTTP_204


class Trigger:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_post(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        run = await self.db.create_run_exclusive(task_id, "api")
        if run is None:
            active = await self.db.active_run(task_id)
            raise Problem(409, "active-run", "the task already has a queued or running run",
                          active_run=jsonable_row(active) if active else None)
        resp.status = falcon.HTTP_202
        resp.media = {"run": jsonable_row(run)}


class Runs:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        limit = req.get_param_as_int("limit", min_value=1, max_value=1000, default=50)
        if await self.db.get_task(task_id) is None:
            raise _not_found(task_id)
        resp.media = {"runs": [jsonable_row(r) for r in await self.db.history.task_runs(task_id, limit)]}
