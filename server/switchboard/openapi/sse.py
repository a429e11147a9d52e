"""The Server-Sent Events fallback's paths (sse.py, sse_actions.py): the WebSocket's
frames as an event stream, and its client frames as POSTs."""

from __future__ import annotations

from typing import Any

from .schema import FREE_OBJECT, json_body, op, path_param

SSE = "text/event-stream"

# One event of GET /sse (OpenAPI 3.1: an event-stream's schema describes each event).
SSE_FRAME = {
    "type": "object", "required": ["data"],
    "properties": {
        "event": {"type": "string", "enum": ["message", "connection", "close"],
                  "description": "message (no event: line): one WebSocket frame (AsyncAPI document); "
                                 "connection: the first event, {connection, secret}; close: the last, "
                                 "a frame whose payload is {code, reason} (the socket's close code)"},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string", "pattern": "^[A-Za-z0-9._~-]{1,256}$",
               "description": "the frame's cursor (frames that carry one): Last-Event-ID resumes after it"}},
}
CURSOR = {"type": "string", "pattern": "^[A-Za-z0-9._~-]{1,256}$"}


def paths_sse() -> dict[str, Any]:
    return {
        "/sse": {"get": op(
            "followEvents", "realtime", "The WebSocket's frames as Server-Sent Events (no upgrade needed)",
            {"200": {"description": "text/event-stream: `event: connection` {connection, secret}, then one "
                                    "WebSocket frame per `data:` (hello first; `id:` its cursor), a `: keep-alive` "
                                    "comment every 15 s of silence, and `event: close` {code, reason} last.",
                     "content": {SSE: {"schema": SSE_FRAME}}}},
            (403, 503), secured=False,
            params=[{"name": "ticket", "in": "query", "required": True,
                     "schema": {"type": "string", "pattern": "^[0-9a-fA-F]{1,64}$"},
                     "description": "a ticket from POST /ws/ticket (single use)"},
                    {"name": "cursor", "in": "query", "required": False, "schema": CURSOR,
                     "description": "resume after this cursor (the last frame's); replayed before any live frame"},
                    {"name": "after", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 0}, "description": "resume after this event id"},
                    {"name": "rooms", "in": "query", "required": False, "schema": {"type": "string"},
                     "description": "rooms to join, comma-separated (at most 50)"},
                    {"name": "feeds", "in": "query", "required": False, "schema": {"type": "string"},
                     "description": "feeds to receive, comma-separated (runs: admins)"},
                    {"name": "Last-Event-ID", "in": "header", "required": False, "schema": CURSOR,
                     "description": "the last cursor the reader has; wins over cursor"}],
            description="Refused where the WebSocket handshake would be: 403 (`close_code` 1008: a bad, used "
                        "or expired ticket, a foreign Origin, the user's connection cap), 503 (1012 "
                        "draining, 1011 database unavailable).")},
        "/sse/{connection}/actions": {"post": op(
            "sendAction", "realtime", "One client frame for an SSE stream (join, leave, typing, ping, ...)",
            {"200": json_body({"type": "object", "required": ["ok"], "properties": {"ok": {"const": True}}},
                              "accepted; its answers (joined, left, pong, ...) come on the stream")},
            (400, 401, 403, 404, 409, 413, 429, 503),
            params=[path_param("connection", {"type": "string", "maxLength": 64})],
            body={**FREE_OBJECT, "required": ["secret"],
                  "description": "a WebSocket client frame plus `secret` (the stream's connection event)"},
            description="Needs the stream's user's bearer token and its secret. A refusal is a problem whose "
                        "`error` member is the WebSocket error frame's payload {code, message, ...}.")},
    }
