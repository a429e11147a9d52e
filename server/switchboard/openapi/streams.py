"""The streams' paths (docs/how-to/streams.md): your open streams, one stream as Server-Sent
Events, Stop; and /jobs, the admin's one-off enqueue (http/jobs.py)."""

from __future__ import annotations

from typing import Any

from .schema import FREE_OBJECT, HANDLER, UUID, json_body, op, path_param, schema

SEQ = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
SSE = "text/event-stream"


# One event of the SSE response (OpenAPI 3.1: an event-stream's schema describes each event):
# a chunk (`message`, its seq as the id), then `end` once, whose data is JSON.
SSE_EVENT = {
    "type": "object", "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["message", "end", "error"],
                  "description": "message: a chunk; end: the stream ended (the last event); error: refused"},
        "data": {"type": "string", "description": "the chunk's text; JSON for end and error"},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the chunk's seq"},
        "retry": {"type": "integer"}},
    "if": {"properties": {"event": {"const": "end"}}},
    "then": {"properties": {"data": {"contentMediaType": "application/json", "contentSchema": {
        "type": "object", "required": ["status", "last_seq", "final"],
        "properties": {"status": {"type": "string", "enum": ["done", "error", "stopped"]},
                       "last_seq": {"type": "integer", "minimum": 0},
                       "final": {"description": "the producer's final payload (any JSON value)"}}}}}},
}


# -- streams: GET /streams, GET /streams/{id} (SSE), POST /streams/{id}/stop -------------------
def paths_streams() -> dict[str, Any]:
    sid = path_param("stream_id", UUID)
    return {
        "/streams": {"get": op(
            "listStreams", "streams", "Your open streams (to pick up after a reload)",
            {"200": json_body({"type": "object", "required": ["streams"],
                               "properties": {"streams": {"type": "array", "items": schema("StreamInfo")}}},
                              "the caller's open streams")},
            (401, 503))},
        "/streams/{stream_id}": {"get": op(
            "followStream", "streams", "One stream as Server-Sent Events, from a seq on, until it ends",
            {"200": {"description": "text/event-stream: each chunk is `id: <seq>` and `data: <chunk>` (a "
                                    "multi-line chunk is several data lines); the end is `event: end` and "
                                    "`data: {\"status\", \"last_seq\", \"final\"}`. An open stream's response "
                                    "lasts until the stream ends (a `: keep-alive` comment every 15 s).",
                     "content": {SSE: {"schema": SSE_EVENT}}}},
            (400, 401, 404, 429, 503),
            params=[sid,
                    {"name": "after", "in": "query", "required": False, "schema": SEQ,
                     "description": "send the chunks after this seq (default 0: all)"},
                    {"name": "Last-Event-ID", "in": "header", "required": False,
                     "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                     "description": "the last seq the reader has (an EventSource sends it when it "
                                    "reconnects); wins over after"}],
            description="404 for an unknown stream and for one the caller may not read (the same "
                        "answer); 400 when after / Last-Event-ID is not a seq; 429 too-many-streams when "
                        "the caller has 16 open stream responses on this replica.")},
        "/streams/{stream_id}/stop": {"post": op(
            "stopStream", "streams", "Stop a stream: it takes no chunk after, its producer is told",
            {"200": json_body({"type": "object", "required": ["stream", "status"], "properties": {
                "stream": UUID,
                "status": {"type": "string", "enum": ["stopped", "done", "error"],
                           "description": "the status after: stopped, or how it had already ended"}}},
                "stopped (idempotent)")},
            (401, 404, 503), params=[sid],
            description="The owner or an admin; 404 for an unknown stream and for anyone else's.")},
    }


# -- jobs: POST /jobs, a one-off run of a handler (admin) -------------------------------------
def paths_jobs() -> dict[str, Any]:
    return {
        "/jobs": {"post": op(
            "enqueueJob", "jobs", "Enqueue a one-off job: a run of a handler with these args (admin)",
            {"201": json_body({"type": "object", "required": ["run"], "properties": {"run": schema("Run")}},
                              "queued")},
            (400, 401, 403, 409, 413, 422, 503),
            body={"type": "object", "required": ["handler"], "additionalProperties": False, "properties": {
                "handler": HANDLER, "args": FREE_OBJECT,
                "run_at": {"type": ["string", "null"], "format": "date-time",
                           "description": "not due before (default now)"},
                "queueing_lock": {"type": ["string", "null"], "minLength": 1, "maxLength": 200,
                                  "description": "at most one queued-or-running job holds it"},
                "max_attempts": {"type": ["integer", "null"], "minimum": 1, "maximum": 100,
                                 "description": "default: the handler's (handler_options), else 3"},
                "priority": {"type": ["integer", "null"], "minimum": -100, "maximum": 100,
                             "description": "higher is claimed first within the queue; default: the handler's"},
                "queue": {"type": ["string", "null"], "pattern": "^[a-z][a-z0-9_.-]{0,62}$",
                          "description": "a queue some handler's options name, or default; default: the "
                                         "handler's"}}},
            description="switchboard.enqueue over HTTP. 409 active-run when another queued or running job "
                        "holds the queueing_lock (the problem's active_run); 422 unknown-handler when no live "
                        "replica runs the handler (the problem's known_handlers), 422 for a bad field.")},
    }


STREAM_INFO = {
    "type": "object", "required": ["id", "room", "kind", "meta", "status", "last_seq", "opened_at"],
    "properties": {"id": UUID, "room": {"type": ["string", "null"]}, "kind": {"type": "string"},
                   "meta": FREE_OBJECT,
                   "status": {"type": "string", "enum": ["open", "done", "error", "stopped"]},
                   "last_seq": {"type": "integer", "description": "the last chunk's seq (0: none yet)"},
                   "opened_at": {"type": "string", "format": "date-time"}},
}
