"""The document's shared parts: the schemas, headers and responses under
``components``, and the tags."""

from __future__ import annotations

from typing import Any

from .schema import ANY_JSON, FREE_OBJECT, HANDLER, NAME, PROBLEM, TS, UUID, ref, schema
from .streams import STREAM_INFO

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
        "queue": {"type": "string"}, "priority": {"type": "integer"},
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
    "description": "RFC 9457 problem details. Extension members are top-level; docs/how-to/http-api.md (\"Errors\") lists the types.",
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
            "refreshCookie": {"type": "apiKey", "in": "cookie", "name": "__Host-sb_refresh",
                              "description": "HttpOnly refresh cookie set by /auth/login and /auth/refresh "
                                             "(Secure, Path=/, SameSite=Strict); on plain HTTP "
                                             "(development) it is sb_refresh, Path=/auth"},
        },
        "headers": {
            "RetryAfter": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}},
            "RateLimit": {"description": "IETF RateLimit: remaining quota and reset of the policy",
                          "schema": {"type": "string"}},
            "RateLimitPolicy": {"description": "IETF RateLimit-Policy: quota and window",
                                "schema": {"type": "string"}},
            "SetRefreshCookie": {"description": "__Host-sb_refresh=<token>; Secure; HttpOnly; Path=/; "
                                                "SameSite=Strict; Max-Age=<session lifetime> (plain HTTP: "
                                                "sb_refresh, Path=/auth, not Secure)",
                                 "schema": {"type": "string"}},
        },
        "schemas": {"Problem": PROBLEM_SCHEMA, "Task": TASK, "Run": RUN, "Token": TOKEN, "Me": ME,
                    "RoomMembers": MEMBERS, "StreamInfo": STREAM_INFO},
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
    {"name": "streams", "description": "answers streamed chunk by chunk: your open streams, SSE, stop"},
    {"name": "jobs", "description": "enqueue a one-off job (admin)"},
    {"name": "realtime", "description": "the WebSocket's frames as Server-Sent Events, and its actions as POSTs"},
]

