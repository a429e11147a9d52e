"""The OpenAPI 3 document served at /openapi.json (kept next to the routes it describes)."""

from __future__ import annotations

from typing import Any

from . import __version__

ERR = {"$ref": "#/components/responses/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): ERR for c in codes}


def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def _op(summary: str, ok: dict[str, Any], errs: tuple[int, ...], body: dict | None = None,
        secured: bool = True, params: list | None = None) -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": {**ok, **_errors(*errs)}}
    if secured:
        op["security"] = [{"bearer": []}]
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    if params:
        op["parameters"] = params
    return op


UUID = {"type": "string", "format": "uuid"}
TASK = {
    "type": "object",
    "properties": {
        "id": UUID, "name": {"type": "string"}, "schedule": {"type": ["string", "null"]},
        "timezone": {"type": "string"}, "handler": {"type": "string"}, "args": {"type": "object"},
        "is_active": {"type": "boolean"}, "max_attempts": {"type": "integer"},
        "next_run_at": {"type": ["string", "null"]}, "skipped_ticks": {"type": "integer"},
        "last_error": {"type": ["string", "null"],
                       "description": "Why the next fire time could not be computed (the task is parked "
                                      "and re-checked every minute); null when healthy."},
        "last_error_at": {"type": ["string", "null"]},
        "created_by": {"type": "string"}, "created_at": {"type": "string"}, "updated_at": {"type": "string"},
    },
    "required": ["id", "name", "handler", "is_active"],
}
RUN = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "task_id": {"type": ["string", "null"]}, "handler": {"type": "string"},
        "status": {"type": "string", "enum": ["queued", "running", "succeeded", "failed", "abandoned"]},
        "attempt": {"type": "integer"}, "trigger": {"type": "string"},
    },
    "required": ["id", "status", "handler"],
}
TASK_PATH = [{"name": "task_id", "in": "path", "required": True, "schema": UUID}]
COMMON = (400, 401, 403, 413, 422, 503)


HANDLER = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"}
EVENT = {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"}
ROOM = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"}


def openapi_document() -> dict[str, Any]:
    name_str = {"type": "string", "minLength": 1, "maxLength": 200}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Switchboard", "version": __version__,
                 "description": "N stateless replicas, PostgreSQL as the only coordination layer."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": {
                "Error": {"type": "object", "properties": {
                    "title": {"type": "string"}, "description": {"type": "string"},
                    "known_handlers": {"type": "array", "items": {"type": "string"},
                                       "description": "422 of POST/PATCH /tasks: the handlers live replicas run"}},
                    "required": ["title", "description"]},
                "Task": TASK, "Run": RUN,
            },
            "responses": {"Error": {"description": "Error", **_json({"$ref": "#/components/schemas/Error"})}},
        },
        "paths": {
            "/auth/login": {"post": _op(
                "Log in: a bearer token", {"200": {"description": "token", **_json({
                    "type": "object", "required": ["access_token", "token_type", "expires_in"],
                    "properties": {"access_token": {"type": "string"},
                                   "token_type": {"type": "string", "enum": ["bearer"]},
                                   "expires_in": {"type": "integer"}}})}},
                (400, 401, 413, 422, 429, 503),
                body={"type": "object", "required": ["username", "password"], "additionalProperties": False,
                      "properties": {"username": {"type": "string", "minLength": 1, "maxLength": 64},
                                     "password": {"type": "string", "minLength": 1, "maxLength": 1024}}},
                secured=False)},
            "/auth/logout": {"post": _op("Revoke this token on every replica",
                                         {"204": {"description": "revoked"}}, (401, 503))},
            "/me": {"get": _op("Who am I", {"200": {"description": "the caller", **_json({"type": "object"})}},
                               (401, 503))},
            "/ws/ticket": {"post": _op("A single-use WebSocket ticket", {"201": {"description": "ticket", **_json({
                "type": "object", "required": ["ticket", "expires_in"],
                "properties": {"ticket": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                               "expires_in": {"type": "integer"}}})}}, (401, 403, 503))},
            "/tasks": {
                "get": _op("List tasks (admin)", {"200": {"description": "tasks", **_json({
                    "type": "object", "properties": {"tasks": {"type": "array",
                                                               "items": {"$ref": "#/components/schemas/Task"}}}})}},
                    (401, 403, 503)),
                "post": _op("Create a task (admin)", {"201": {"description": "created",
                                                               **_json({"$ref": "#/components/schemas/Task"})}},
                            COMMON + (404, 409),
                            body={"type": "object", "required": ["name", "handler"], "additionalProperties": False,
                                  "properties": {"name": name_str, "schedule": {"type": ["string", "null"]},
                                                 "handler": HANDLER, "args": {"type": "object"},
                                                 "timezone": name_str,
                                                 "max_attempts": {"type": "integer", "minimum": 1,
                                                                  "maximum": 100}}}),
            },
            "/tasks/{task_id}": {
                "get": _op("A task (admin)", {"200": {"description": "task",
                                                       **_json({"$ref": "#/components/schemas/Task"})}},
                           (401, 403, 404, 503), params=TASK_PATH),
                "patch": _op("Change a task (admin)", {"200": {"description": "changed",
                                                               **_json({"$ref": "#/components/schemas/Task"})}},
                             COMMON + (404, 409), params=TASK_PATH,
                             body={"type": "object", "additionalProperties": False, "minProperties": 1,
                                   "properties": {"name": name_str, "schedule": {"type": ["string", "null"]},
                                                  "handler": HANDLER, "args": {"type": "object"},
                                                  "timezone": name_str, "is_active": {"type": "boolean"},
                                                  "max_attempts": {"type": "integer", "minimum": 1,
                                                                   "maximum": 100}}}),
                "delete": _op("Delete a task (admin)", {"204": {"description": "deleted"}}, (401, 403, 404, 503),
                              params=TASK_PATH),
            },
            "/tasks/{task_id}/trigger": {"post": _op(
                "Queue a run now (admin)", {
                    "202": {"description": "queued", **_json({"type": "object", "properties": {
                        "run": {"$ref": "#/components/schemas/Run"}}})},
                    "409": {"description": "a run is already queued or running", **_json({
                        "type": "object", "properties": {"active_run": {}}})}},
                (401, 403, 404, 503), params=TASK_PATH)},
            "/tasks/{task_id}/runs": {"get": _op(
                "Runs of a task, newest first (admin)", {"200": {"description": "runs", **_json({
                    "type": "object", "properties": {"runs": {"type": "array",
                                                              "items": {"$ref": "#/components/schemas/Run"}}}})}},
                (400, 401, 403, 404, 503),
                params=TASK_PATH + [{"name": "limit", "in": "query", "required": False,
                                     "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}])},
            "/events": {"post": _op(
                "Publish an event to a user or a room (admin)",
                {"202": {"description": "published", **_json({"type": "object", "required": ["id"],
                                                               "properties": {"id": {"type": "integer"}}})}},
                COMMON + (404,),
                body={"type": "object", "required": ["event"], "additionalProperties": False,
                      "properties": {"user_id": UUID, "room": ROOM, "event": EVENT, "payload": {}},
                      "oneOf": [{"required": ["user_id"]}, {"required": ["room"]}]})},
            "/rooms/{room}/members": {"get": _op(
                "Members of a room, with who is online", {"200": {"description": "members", **_json({
                    "type": "object", "properties": {"room": {"type": "string"}, "members": {"type": "array"}}})}},
                (401, 403, 404, 503),
                params=[{"name": "room", "in": "path", "required": True, "schema": {"type": "string"}}])},
            "/rooms/{room}/members/{user_id}": {
                "put": _op("Add a member (admin)", {"204": {"description": "added"}}, (401, 403, 404, 422, 503),
                           params=[{"name": "room", "in": "path", "required": True, "schema": ROOM},
                                   {"name": "user_id", "in": "path", "required": True, "schema": UUID}]),
                "delete": _op("Remove a member (admin)", {"204": {"description": "removed"}},
                              (401, 403, 404, 422, 503),
                              params=[{"name": "room", "in": "path", "required": True,
                                       "schema": {"type": "string"}},
                                      {"name": "user_id", "in": "path", "required": True, "schema": UUID}]),
            },
            "/tools/call": {"post": _op(
                "Call a tool in a user's browser, wherever its socket is (admin)",
                {"200": {"description": "the browser's answer", **_json({"type": "object",
                                                                          "properties": {"result": {}}})}},
                COMMON + (404, 504),
                body={"type": "object", "required": ["user_id", "name"], "additionalProperties": False,
                      "properties": {"user_id": UUID, "name": name_str, "args": {},
                                     "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000}}})},
            "/healthz/live": {"get": _op("Liveness", {"200": {"description": "alive", **_json({"type": "object"})}},
                                         (), secured=False)},
            "/healthz/ready": {"get": _op("Readiness: Postgres answers and LISTEN is up", {
                "200": {"description": "ready", **_json({"type": "object"})},
                "503": {"description": "not ready", **_json({"type": "object", "properties": {
                    "reasons": {"type": "array", "items": {"type": "string"}}}})}}, (), secured=False)},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
                "200": {"description": "text format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {
                "200": {"description": "OpenAPI 3", **_json({"type": "object"})}}}},
            **console_paths(),
        },
    }


def console_paths() -> dict[str, Any]:
    """/console and its two admin reads (issue 20; http/console.py)."""
    ts_list = {"type": "array", "items": {"type": "string", "format": "date-time"}}
    return {
        "/console": {"get": {"summary": "The operators' console page (HTML; its data needs an admin token)",
                             "responses": {"200": {
                                 "description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
        "/console/cron-next": {"get": _op(
            "The next fire times of a schedule, as the scheduler computes them (admin)",
            {"200": {"description": "the next fires", **_json({
                "type": "object", "required": ["schedule", "timezone", "next"],
                "properties": {"schedule": {"type": "string"}, "timezone": {"type": "string"},
                               "next": ts_list}})}},
            (400, 401, 403, 422, 503),
            params=[{"name": "schedule", "in": "query", "required": True,
                     "schema": {"type": "string", "minLength": 1, "maxLength": 200}},
                    {"name": "timezone", "in": "query", "required": False,
                     "schema": {"type": "string", "maxLength": 100}},
                    {"name": "count", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": 20}}])},
        "/console/live": {"get": _op(
            "Live replicas with sockets and users online, and rooms with members online (admin)",
            {"200": {"description": "replicas and rooms", **_json({
                "type": "object", "required": ["replicas", "rooms"],
                "properties": {"replicas": {"type": "array", "items": {"type": "object"}},
                               "rooms": {"type": "array", "items": {"type": "object"}}}})}},
            (401, 403, 503))},
    }


# -- operate (issue 20): runs, handlers, status -----------------------------------------------
# A block of its own, merged into the document by http/ops.py, so it stays independent of
# the document's own helpers and version.
def operate_paths() -> dict[str, Any]:
    def js(schema: dict) -> dict:
        return {"content": {"application/json": {"schema": schema}}}

    err = {"description": "Error", **js({"type": "object", "properties": {
        "title": {"type": "string"}, "description": {"type": "string"}}})}

    def op(summary: str, ok: dict, errs: tuple[int, ...], params: list | None = None) -> dict:
        o: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}],
                             "responses": {**ok, **{str(c): err for c in errs}}}
        if params:
            o["parameters"] = params
        return o

    nullable_str = {"type": ["string", "null"]}
    run = {"type": "object", "required": ["id", "status", "handler", "attempt"], "properties": {
        "id": {"type": "integer"}, "task_id": nullable_str, "task_name": nullable_str,
        "handler": {"type": "string"},
        "status": {"type": "string",
                   "enum": ["queued", "running", "succeeded", "failed", "abandoned", "cancelled"]},
        "trigger": {"type": "string"}, "attempt": {"type": "integer"}, "max_attempts": {"type": "integer"},
        "worker": nullable_str, "created_at": {"type": "string"}, "run_at": nullable_str,
        "started_at": nullable_str, "finished_at": nullable_str,
        "duration_ms": {"type": ["integer", "null"]}, "error": nullable_str,
        "retry_of": {"type": ["integer", "null"]},
        "args": {"description": "GET /runs/{id} only"}, "result": {"description": "GET /runs/{id} only"}}}
    handler = {"type": "object", "required": ["name", "paused", "served", "replicas"], "properties": {
        "name": {"type": "string"}, "paused": {"type": "boolean"}, "paused_at": nullable_str,
        "served": {"type": "boolean"}, "replicas": {"type": "integer"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "active_tasks": {"type": "integer"}, "pending_runs": {"type": "integer"}}}
    one_run = js({"type": "object", "required": ["run"], "properties": {"run": run}})
    run_path = [{"name": "run_id", "in": "path", "required": True,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 9223372036854775807}}]
    name_path = [{"name": "name", "in": "path", "required": True,
                  "schema": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"}}]

    def q(name: str, schema: dict, description: str) -> dict:
        return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}

    handler_action = {"200": {"description": "the handler now", **js({
        "type": "object", "required": ["handler", "changed"],
        "properties": {"handler": handler, "changed": {"type": "boolean"}}})}}
    return {
        "/runs": {"get": op(
            "Runs, newest first, filtered; keyset pages (admin)",
            {"200": {"description": "a page of runs", **js({
                "type": "object", "required": ["runs", "next_cursor"],
                "properties": {"runs": {"type": "array", "items": run},
                               "next_cursor": {"type": ["string", "null"],
                                               "description": "pass back as cursor for the next page"}}})}},
            (400, 401, 403, 404, 422, 503),
            params=[q("status", {"type": "string", "enum": run["properties"]["status"]["enum"]}, "run status"),
                    q("handler", {"type": "string"}, "handler name"),
                    q("task", {"type": "string"}, "task name or id"),
                    q("since", {"type": "string", "format": "date-time"}, "created at or after"),
                    q("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "page size (default 50)"),
                    q("cursor", {"type": "string"}, "next_cursor of the previous page")])},
        "/runs/{run_id}": {"get": op("A run, every field (admin)", {"200": {"description": "the run", **one_run}},
                                     (401, 403, 404, 503), params=run_path)},
        "/runs/{run_id}/retry": {"post": op(
            "Queue a new attempt of a finished run (admin)", {"201": {"description": "the new run", **one_run}},
            (401, 403, 404, 409, 503), params=run_path)},
        "/runs/{run_id}/cancel": {"post": op(
            "Cancel a queued or running run; a running handler is stopped (admin)",
            {"200": {"description": "the cancelled run", **one_run}}, (401, 403, 404, 409, 503),
            params=run_path)},
        "/handlers": {"get": op("Task handlers: served, paused, wanted (admin)", {"200": {
            "description": "handlers", **js({"type": "object", "required": ["handlers"], "properties": {
                "handlers": {"type": "array", "items": handler}}})}}, (401, 403, 503))},
        "/handlers/{name}/pause": {"post": op("Hold a handler's queued runs and due ticks (admin)",
                                              handler_action, (401, 403, 422, 503), params=name_path)},
        "/handlers/{name}/resume": {"post": op("Release a paused handler (admin)",
                                               handler_action, (401, 403, 422, 503), params=name_path)},
        "/status": {"get": op("status() as an object, and the live replicas with readiness (admin)", {"200": {
            "description": "status", **js({"type": "object", "required": ["status", "replicas"], "properties": {
                "status": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
                "replicas": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "string"}, "ready": {"type": "boolean"},
                    "reasons": {"type": "array", "items": {"type": "string"}}}}}}})}},
            (401, 403, 503))},
    }
