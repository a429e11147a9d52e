"""The paths of the public API: auth, tasks, events and rooms, tools, ops."""

from __future__ import annotations

from typing import Any

from .components import TASK_WRITE
from .schema import (ANY_JSON, EVENT, FREE_OBJECT, NAME, PROBLEM, ROOM, UUID, json_body, op, path_param,
                     ref, schema)


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
             "409": {"description": "refresh-in-progress: a previous-release replica used the cookie "
                                    "a moment ago; retry (the browser holds the newer cookie)",
                     "content": {PROBLEM: {"schema": schema("Problem")}},
                     "headers": {"Retry-After": ref("headers", "RetryAfter")}}},
            (400, 401, 403, 429, 503), secured=False,
            description="Single use: the cookie is used up and replaced. The same client presenting the "
                        "used cookie again within the grace (60 s), before the next one was used, gets "
                        "the same next cookie (a lost response, two tabs). Any other replay ends the "
                        "whole session: 401 refresh-token-reused, and its sockets close with 1008 "
                        "'session revoked'. 400 ambiguous-session-cookie: two refresh cookies were sent. "
                        "429: per client IP, and per session."),
            "security": [{"refreshCookie": []}]}},
        "/auth/logout": {"post": {**op(
            "logout", "auth", "End the session on every replica (its sockets close with 1008)",
            {"204": {"description": "ended; the refresh cookie is cleared",
                     "headers": {"Set-Cookie": ref("headers", "SetRefreshCookie")}}},
            (400, 401, 403, 503)),
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

