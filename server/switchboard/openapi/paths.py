"""The OpenAPI 3.1 document served at /openapi.json (kept next to the routes it describes).

3.1 because its schemas are JSON Schema 2020-12 (``type: ["string", "null"]``
is valid there and nowhere in 3.0). tests/test_openapi_contract.py validates
it with openapi-spec-validator, checks every operation has an operationId and
tags, and validates real responses against it; tests/test_openapi_fuzz.py
fuzzes a live replica with it.

Layout: shared schemas, headers and responses in ``components()``; the paths
in blocks, one function per area, merged by ``openapi_document()`` from
PATH_BLOCKS. **Another area adds its paths as a new ``paths_<area>()``
function in its own block at the end of this file and one line in
PATH_BLOCKS** -- so branches never edit the same lines.

Every error response is RFC 9457 ``application/problem+json`` (the Problem
schema; errors.py writes it). Free-form JSON (task ``args``, event
``payload``, tool ``args``/``result``) is declared as such
(``additionalProperties: true`` / any value), so generated types accept it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import __version__

JSON = "application/json"
PROBLEM = "application/problem+json"
UUID = {"type": "string", "format": "uuid"}
TS = {"type": ["string", "null"], "description": "a timestamp (ISO 8601), or null"}
ANY_JSON: dict[str, Any] = {"description": "any JSON value"}
FREE_OBJECT = {"type": "object", "additionalProperties": True}
HANDLER = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"}
EVENT = {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"}
ROOM = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"}
NAME = {"type": "string", "minLength": 1, "maxLength": 200}
RUN_STATUSES = ["queued", "running", "succeeded", "failed", "abandoned", "cancelled"]


def ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def schema(name: str) -> dict[str, str]:
    return ref("schemas", name)


def json_body(s: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {JSON: {"schema": s}}}
    if headers:
        out["headers"] = headers
    return out


def errors(*codes: int) -> dict[str, Any]:
    """Problem responses for these statuses (429 with its rate-limit headers)."""
    return {str(c): ref("responses", "TooManyRequests" if c == 429 else "Problem") for c in codes}


def op(op_id: str, tag: str, summary: str, ok: dict[str, Any], errs: tuple[int, ...], *,
       body: dict[str, Any] | None = None, secured: bool = True, params: list[dict[str, Any]] | None = None,
       description: str | None = None) -> dict[str, Any]:
    o: dict[str, Any] = {"operationId": op_id, "tags": [tag], "summary": summary,
                         "responses": {**ok, **errors(*errs)}}
    if description:
        o["description"] = description
    o["security"] = [{"bearer": []}] if secured else []
    if body is not None:
        o["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    if params:
        o["parameters"] = params
    return o


def path_param(name: str, s: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": s}


# -- components ---------------------------------------------------------------------------------
TASK = {
    "type": "object",
    "properties": {
        "id": UUID, "name": {"type": "string"}, "schedule": {"type": ["string", "null"]},
        "timezone": {"type": "string"}, "handler": {"type": "string"}, "args": FREE_OBJECT,
        "is_active": {"type": "boolean"}, "max_attempts": {"type": "integer"},
        "next_run_at": TS, "skipped_ticks": {"type": "integer"},
        "last_error": {"type": ["string", "null"],
                       "description": "Why the next fire time could not be computed (the task is parked "
                                      "and re-checked every minute); null when healthy."},
        "last_error_at": TS, "created_by": {"type": ["string", "null"]},
        "created_at": {"type": "string"}, "updated_at": {"type": "string"},
    },
    "required": ["id", "name", "handler", "is_active", "args"],
}
RUN = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "task_id": {"type": ["string", "null"], "format": "uuid"},
        "handler": {"type": "string"}, "args": FREE_OBJECT,
        "status": {"type": "string", "enum": ["queued", "running", "succeeded", "failed", "abandoned",
                                              "cancelled"]},
        "trigger": {"type": ["string", "null"]}, "attempt": {"type": "integer"},
        "max_attempts": {"type": "integer"}, "queueing_lock": {"type": ["string", "null"]},
        "run_at": TS, "scheduled_for": TS, "worker": {"type": ["string", "null"]}, "lease_expires_at": TS,
        "started_at": TS, "finished_at": TS, "result": ANY_JSON, "error": {"type": ["string", "null"]},
        "retry_of": {"type": ["integer", "null"]}, "created_at": {"type": "string"},
    },
    "required": ["id", "status", "handler"],
}
TASK_WRITE = {
    "name": NAME, "schedule": {"type": ["string", "null"], "description": "a cron expression; null: manual only"},
    "handler": HANDLER, "args": FREE_OBJECT, "timezone": NAME,
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
}
PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem details. Extension members are top-level; README \"Errors\" lists the types.",
    "properties": {
        "type": {"type": "string", "format": "uri",
                 "description": "https://switchboard.dev/problems/<slug>: stable, compare it, not the title"},
        "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"},
        "description": {"type": "string", "deprecated": True, "description": "= detail; removed after one release"},
        "known_handlers": {"type": "array", "items": {"type": "string"},
                           "description": "unknown-handler (422): the handlers live replicas of this version run"},
        "active_run": {"anyOf": [schema("Run"), {"type": "null"}],
                       "description": "active-run (409): the queued or running run"},
        "reasons": {"type": "array", "items": {"type": "string",
                                               "enum": ["shutting_down", "listen_down", "database_unavailable"]},
                    "description": "not-ready (503)"},
        "sqlstate": {"type": "string", "description": "a database refusal: its SQLSTATE"},
    },
    "required": ["type", "title", "status", "detail"],
    "additionalProperties": True,
}
TOKEN = {
    "type": "object", "required": ["access_token", "token_type", "expires_in", "user_id", "role"],
    "properties": {"access_token": {"type": "string"}, "token_type": {"type": "string", "enum": ["bearer"]},
                   "expires_in": {"type": "integer", "description": "seconds; never beyond the session's expiry"},
                   "user_id": UUID, "role": {"type": "string", "enum": ["admin", "member"]}},
}
ME = {
    "type": "object", "required": ["user_id", "username", "role", "replica", "session_id"],
    "properties": {"user_id": UUID, "username": {"type": "string"},
                   "role": {"type": "string", "enum": ["admin", "member"]},
                   "replica": {"type": "string", "description": "the replica that answered"},
                   "session_id": {"type": ["string", "null"], "format": "uuid",
                                  "description": "the login session of this token (null: a token from before "
                                                 "sessions)"}},
}
MEMBERS = {
    "type": "object", "required": ["room", "members"],
    "properties": {"room": {"type": "string"}, "members": {"type": "array", "items": {
        "type": "object", "required": ["user_id", "username", "online"],
        "properties": {"user_id": UUID, "username": {"type": "string"},
                       "online": {"type": "boolean", "description": "has a socket on some replica now"}}}}},
}


def components() -> dict[str, Any]:
    return {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
            "refreshCookie": {"type": "apiKey", "in": "cookie", "name": "sb_refresh",
                              "description": "HttpOnly refresh cookie set by /auth/login and /auth/refresh "
                                             "(Path=/auth, SameSite=Strict, Secure over TLS)"},
        },
        "headers": {
            "RetryAfter": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}},
            "RateLimit": {"description": "IETF RateLimit: remaining quota and reset of the policy",
                          "schema": {"type": "string"}},
            "RateLimitPolicy": {"description": "IETF RateLimit-Policy: quota and window",
                                "schema": {"type": "string"}},
            "SetRefreshCookie": {"description": "sb_refresh=<token>; HttpOnly; Path=/auth; SameSite=Strict; "
                                                "Max-Age=<session lifetime> (Secure over TLS)",
                                 "schema": {"type": "string"}},
        },
        "schemas": {"Problem": PROBLEM_SCHEMA, "Task": TASK, "Run": RUN, "Token": TOKEN, "Me": ME,
                    "RoomMembers": MEMBERS},
        "responses": {
            "Problem": {"description": "an error (RFC 9457 problem details)",
                        "content": {PROBLEM: {"schema": schema("Problem")}}},
            "TooManyRequests": {
                "description": "rate limited", "content": {PROBLEM: {"schema": schema("Problem")}},
                "headers": {"Retry-After": ref("headers", "RetryAfter"), "RateLimit": ref("headers", "RateLimit"),
                            "RateLimit-Policy": ref("headers", "RateLimitPolicy")}},
        },
    }


TAGS = [
    {"name": "auth", "description": "log in, sessions (refresh cookie), WebSocket tickets"},
    {"name": "tasks", "description": "scheduled tasks and their runs (admin)"},
    {"name": "events", "description": "publish events to users and rooms (admin)"},
    {"name": "rooms", "description": "room membership"},
    {"name": "tools", "description": "call tools in a user's browser (admin)"},
    {"name": "ops", "description": "health, metrics, this document"},
    {"name": "operate", "description": "runs, handlers and status: retry, cancel, pause (admin)"},
]


# -- paths, one block per area ------------------------------------------------------------------
def paths_auth() -> dict[str, Any]:
    token_headers = {"Set-Cookie": ref("headers", "SetRefreshCookie"), "RateLimit": ref("headers", "RateLimit"),
                     "RateLimit-Policy": ref("headers", "RateLimitPolicy")}
    return {
        "/auth/login": {"post": op(
            "login", "auth", "Log in: an access token, and a session (refresh cookie)",
            {"200": json_body(schema("Token"), "an access token; the refresh cookie is set", token_headers)},
            (400, 401, 403, 413, 422, 429, 503),
            body={"type": "object", "required": ["username", "password"], "additionalProperties": False,
                  "properties": {"username": {"type": "string", "minLength": 1, "maxLength": 64},
                                 "password": {"type": "string", "minLength": 1, "maxLength": 1024}}},
            secured=False)},
        "/auth/refresh": {"post": {**op(
            "refreshSession", "auth", "A new access token for the refresh cookie, which is rotated",
            {"200": json_body(schema("Token"), "a new access token; the next refresh cookie is set",
                              {"Set-Cookie": ref("headers", "SetRefreshCookie")}),
             "409": {"description": "refresh-in-progress: the cookie was used by a concurrent refresh "
                                    "a moment ago; retry (the browser holds the newer cookie)",
                     "content": {PROBLEM: {"schema": schema("Problem")}},
                     "headers": {"Retry-After": ref("headers", "RetryAfter")}}},
            (401, 403, 503), secured=False,
            description="Single use: the cookie is used up and replaced. A used cookie presented again "
                        "(after the concurrent-refresh window) ends the whole session: 401 "
                        "refresh-token-reused, and its sockets close with 1008 'session revoked'."),
            "security": [{"refreshCookie": []}]}},
        "/auth/logout": {"post": {**op(
            "logout", "auth", "End the session on every replica (its sockets close with 1008)",
            {"204": {"description": "ended; the refresh cookie is cleared",
                     "headers": {"Set-Cookie": ref("headers", "SetRefreshCookie")}}},
            (401, 403, 503)),
            "security": [{"bearer": []}, {"refreshCookie": []}]}},
        "/me": {"get": op("getMe", "auth", "Who am I", {"200": json_body(schema("Me"), "the caller")},
                          (401, 503))},
        "/ws/ticket": {"post": op(
            "createTicket", "auth", "A single-use WebSocket ticket, bound to the token's session",
            {"201": json_body({"type": "object", "required": ["ticket", "expires_in"],
                               "properties": {"ticket": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                                              "expires_in": {"type": "integer"}}}, "ticket")},
            (401, 403, 503))},
    }


def paths_tasks() -> dict[str, Any]:
    task_path = [path_param("task_id", UUID)]
    common = (400, 401, 403, 413, 422, 503)
    return {
        "/tasks": {
            "get": op("listTasks", "tasks", "List tasks (admin)", {"200": json_body(
                {"type": "object", "required": ["tasks"],
                 "properties": {"tasks": {"type": "array", "items": schema("Task")}}}, "tasks")}, (401, 403, 503)),
            "post": op("createTask", "tasks", "Create a task (admin)",
                       {"201": json_body(schema("Task"), "created")}, common + (404, 409),
                       body={"type": "object", "required": ["name", "handler"], "additionalProperties": False,
                             "properties": TASK_WRITE}),
        },
        "/tasks/{task_id}": {
            "get": op("getTask", "tasks", "A task (admin)", {"200": json_body(schema("Task"), "task")},
                      (401, 403, 404, 503), params=task_path),
            "patch": op("updateTask", "tasks", "Change a task (admin)", {"200": json_body(schema("Task"), "changed")},
                        common + (404, 409), params=task_path,
                        body={"type": "object", "additionalProperties": False, "minProperties": 1,
                              "properties": {**TASK_WRITE, "is_active": {"type": "boolean"}}}),
            "delete": op("deleteTask", "tasks", "Delete a task (admin)", {"204": {"description": "deleted"}},
                         (401, 403, 404, 503), params=task_path),
        },
        "/tasks/{task_id}/trigger": {"post": op(
            "triggerTask", "tasks", "Queue a run now (admin)",
            {"202": json_body({"type": "object", "required": ["run"], "properties": {"run": schema("Run")}},
                              "queued")},
            (401, 403, 404, 409, 503), params=task_path,
            description="409 active-run when a run is already queued or running (the problem's active_run).")},
        "/tasks/{task_id}/runs": {"get": op(
            "listTaskRuns", "tasks", "Runs of a task, newest first (admin)",
            {"200": json_body({"type": "object", "required": ["runs"],
                               "properties": {"runs": {"type": "array", "items": schema("Run")}}}, "runs")},
            (400, 401, 403, 404, 503),
            params=task_path + [{"name": "limit", "in": "query", "required": False,
                                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}])},
    }


def paths_realtime() -> dict[str, Any]:
    room_path = path_param("room", ROOM)
    return {
        "/events": {"post": op(
            "publishEvent", "events", "Publish an event to a user or a room (admin)",
            {"202": json_body({"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}},
                              "published")},
            (400, 401, 403, 404, 413, 422, 503),
            body={"type": "object", "required": ["event"], "additionalProperties": False,
                  "properties": {"user_id": UUID, "room": ROOM, "event": EVENT, "payload": ANY_JSON},
                  "oneOf": [{"required": ["user_id"]}, {"required": ["room"]}]})},
        "/rooms/{room}/members": {"get": op(
            "listRoomMembers", "rooms", "Members of a room, with who is online",
            {"200": json_body(schema("RoomMembers"), "members")}, (401, 403, 404, 503),
            params=[path_param("room", {"type": "string"})])},
        "/rooms/{room}/members/{user_id}": {
            "put": op("addRoomMember", "rooms", "Add a member (admin)", {"204": {"description": "added"}},
                      (401, 403, 404, 422, 503), params=[room_path, path_param("user_id", UUID)]),
            "delete": op("removeRoomMember", "rooms", "Remove a member (admin)", {"204": {"description": "removed"}},
                         (401, 403, 404, 422, 503),
                         params=[path_param("room", {"type": "string"}), path_param("user_id", UUID)]),
        },
        "/tools/call": {"post": op(
            "callTool", "tools", "Call a tool in a user's browser, wherever its socket is (admin)",
            {"200": json_body({"type": "object", "required": ["result"], "properties": {"result": ANY_JSON}},
                              "the browser's answer")},
            (400, 401, 403, 404, 413, 422, 503, 504),
            body={"type": "object", "required": ["user_id", "name"], "additionalProperties": False,
                  "properties": {"user_id": UUID, "name": NAME, "args": ANY_JSON,
                                 "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000}}})},
    }


def paths_ops() -> dict[str, Any]:
    return {
        "/healthz/live": {"get": op(
            "getLiveness", "ops", "Liveness",
            {"200": json_body({"type": "object", "required": ["status"],
                               "properties": {"status": {"type": "string", "enum": ["ok"]}}}, "alive")},
            (), secured=False)},
        "/healthz/ready": {"get": op(
            "getReadiness", "ops", "Readiness: Postgres answers and LISTEN is up",
            {"200": json_body({"type": "object", "required": ["status", "reasons"],
                               "properties": {"status": {"type": "string", "enum": ["ready"]},
                                              "reasons": {"type": "array", "maxItems": 0}}}, "ready")},
            (503,), secured=False, description="503 not-ready: the problem's reasons say why.")},
        "/metrics": {"get": op(
            "getMetrics", "ops", "Prometheus metrics",
            {"200": {"description": "text format", "content": {"text/plain": {"schema": {"type": "string"}}}}},
            (), secured=False)},
        "/openapi.json": {"get": op(
            "getOpenAPI", "ops", "This document",
            {"200": json_body(FREE_OBJECT, "OpenAPI 3.1")}, (), secured=False)},
    }


# -- operate (issue 20): runs, handlers, status -----------------------------------------------
def paths_operate() -> dict[str, Any]:
    def js(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {JSON: {"schema": schema}}}

    nullable_str = {"type": ["string", "null"]}
    run: dict[str, Any] = {"type": "object", "required": ["id", "status", "handler", "attempt"], "properties": {
        "id": {"type": "integer"}, "task_id": nullable_str, "task_name": nullable_str,
        "handler": {"type": "string"},
        "status": {"type": "string",
                   "enum": RUN_STATUSES},
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

    def q(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}

    handler_action = {"200": {"description": "the handler now", **js({
        "type": "object", "required": ["handler", "changed"],
        "properties": {"handler": handler, "changed": {"type": "boolean"}}})}}
    return {
        "/runs": {"get": op("listRuns", "operate",
            "Runs, newest first, filtered; keyset pages (admin)",
            {"200": {"description": "a page of runs", **js({
                "type": "object", "required": ["runs", "next_cursor"],
                "properties": {"runs": {"type": "array", "items": run},
                               "next_cursor": {"type": ["string", "null"],
                                               "description": "pass back as cursor for the next page"}}})}},
            (400, 401, 403, 404, 422, 503),
            params=[q("status", {"type": "string", "enum": RUN_STATUSES}, "run status"),
                    q("handler", {"type": "string"}, "handler name"),
                    q("task", {"type": "string"}, "task name or id"),
                    q("since", {"type": "string", "format": "date-time"}, "created at or after"),
                    q("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "page size (default 50)"),
                    q("cursor", {"type": "string"}, "next_cursor of the previous page")])},
        "/runs/{run_id}": {"get": op("getRun", "operate", "A run, every field (admin)", {"200": {"description": "the run", **one_run}},
                                     (401, 403, 404, 503), params=run_path)},
        "/runs/{run_id}/retry": {"post": op("retryRun", "operate",
            "Queue a new attempt of a finished run (admin)", {"201": {"description": "the new run", **one_run}},
            (401, 403, 404, 409, 503), params=run_path)},
        "/runs/{run_id}/cancel": {"post": op("cancelRun", "operate",
            "Cancel a queued or running run; a running handler is stopped (admin)",
            {"200": {"description": "the cancelled run", **one_run}}, (401, 403, 404, 409, 503),
            params=run_path)},
        "/handlers": {"get": op("listHandlers", "operate", "Task handlers: served, paused, wanted (admin)", {"200": {
            "description": "handlers", **js({"type": "object", "required": ["handlers"], "properties": {
                "handlers": {"type": "array", "items": handler}}})}}, (401, 403, 503))},
        "/handlers/{name}/pause": {"post": op("pauseHandler", "operate", "Hold a handler's queued runs and due ticks (admin)",
                                              handler_action, (401, 403, 422, 503), params=name_path)},
        "/handlers/{name}/resume": {"post": op("resumeHandler", "operate", "Release a paused handler (admin)",
                                               handler_action, (401, 403, 422, 503), params=name_path)},
        "/status": {"get": op("getStatus", "operate", "status() as an object, and the live replicas with readiness (admin)", {"200": {
            "description": "status", **js({"type": "object", "required": ["status", "replicas"], "properties": {
                "status": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
                "replicas": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "string"}, "ready": {"type": "boolean"},
                    "reasons": {"type": "array", "items": {"type": "string"}}}}}}})}},
            (401, 403, 503))},
    }


# -- console (issue 20): the operators' page and its two admin reads (http/console.py) -------
def paths_console() -> dict[str, Any]:
    ts_list = {"type": "array", "items": {"type": "string", "format": "date-time"}}
    html = {"200": {"description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}}}
    return {
        "/console": {"get": op("getConsole", "operate",
                               "The operators' console page (HTML; its data needs an admin token)",
                               html, (), secured=False)},
        "/console/cron-next": {"get": op(
            "previewCronNext", "operate",
            "The next fire times of a schedule, as the scheduler computes them (admin)",
            {"200": json_body({
                "type": "object", "required": ["schedule", "timezone", "next"],
                "properties": {"schedule": {"type": "string"}, "timezone": {"type": "string"},
                               "next": ts_list}}, "the next fires")},
            (400, 401, 403, 422, 503),
            params=[{"name": "schedule", "in": "query", "required": True,
                     "schema": {"type": "string", "minLength": 1, "maxLength": 200}},
                    {"name": "timezone", "in": "query", "required": False,
                     "schema": {"type": "string", "maxLength": 100}},
                    {"name": "count", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": 20}}])},
        "/console/live": {"get": op(
            "getLive", "operate",
            "Live replicas with sockets and users online, and rooms with members online (admin)",
            {"200": json_body({
                "type": "object", "required": ["replicas", "rooms"],
                "properties": {"replicas": {"type": "array", "items": FREE_OBJECT},
                               "rooms": {"type": "array", "items": FREE_OBJECT}}}, "replicas and rooms")},
            (401, 403, 503))},
    }


# Each area's paths: add a paths_<area>() block above and one line here.
PATH_BLOCKS: list[Callable[[], dict[str, Any]]] = [
    paths_auth,
    paths_tasks,
    paths_realtime,
    paths_ops,
    paths_operate,
    paths_console,
]


def openapi_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for block in PATH_BLOCKS:
        for path, item in block().items():
            paths.setdefault(path, {}).update(item)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Switchboard", "version": __version__,
                 "description": "N stateless replicas, PostgreSQL as the only coordination layer. Errors are "
                                "RFC 9457 problem details (application/problem+json)."},
        "tags": TAGS,
        "components": components(),
        "paths": paths,
    }


# -- issue 21 (e21): JSON endpoints refuse other media types ---------------------------------
def with_unsupported_media_type(doc: dict[str, Any]) -> dict[str, Any]:
    """Every operation that takes a JSON request body may answer 415 (the body is read
    only when declared ``application/json``): added here, beside the document, so the
    routes' declarations stay as they are."""
    responses = doc.get("components", {}).get("responses", {})
    name = next((n for n in ("Problem", "Error") if n in responses), None)
    resp: dict[str, Any] = ({"$ref": f"#/components/responses/{name}"} if name
                            else {"description": "Unsupported Media Type: send 'Content-Type: application/json'"})
    for item in doc.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict) and "requestBody" in op:
                op.setdefault("responses", {}).setdefault("415", resp)
    return doc
