"""The operators' paths (issue 20): runs, handlers, status, and the console's reads."""

from __future__ import annotations

from typing import Any

from .schema import FREE_OBJECT, JSON, RUN_STATUSES, json_body, op


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
        "args": {"description": "GET /runs/{id} only"}, "result": {"description": "GET /runs/{id} only"},
        "queue": {"type": "string", "description": "GET /runs/{id} only"},
        "priority": {"type": "integer", "description": "GET /runs/{id} only"}}}
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

    bulk_body = {"type": "object", "required": ["status"], "additionalProperties": False, "properties": {
        "status": {"type": "string", "enum": RUN_STATUSES},
        "handler": {"type": ["string", "null"], "maxLength": 128},
        "task": {"type": ["string", "null"], "maxLength": 200, "description": "task name or id"},
        "since": {"type": ["string", "null"], "format": "date-time", "description": "created at or after"},
        "max_rows": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000}}}
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
        "/runs/retry": {"post": op("retryRuns", "operate",
            "Retry the matching finished runs, oldest first, at most max_rows (admin)",
            {"200": {"description": "the retries made", **js({
                "type": "object", "required": ["count", "retries", "more"], "properties": {
                    "count": {"type": "integer"},
                    "retries": {"type": "array", "items": {"type": "object", "required": ["run_id", "retry_id"],
                                "properties": {"run_id": {"type": "integer"}, "retry_id": {"type": "integer"}}}},
                    "more": {"type": "boolean", "description": "this call did something: call again until it is false"}}})}},
            (400, 401, 403, 404, 413, 415, 422, 503), body=bulk_body,
            description="retry_runs(): each chain's newest attempt, once; runs whose task or queueing lock "
                        "is busy are skipped. status: failed, abandoned, cancelled or succeeded.")},
        "/runs/cancel": {"post": op("cancelRuns", "operate",
            "Cancel the matching queued (or running) runs, oldest first, at most max_rows (admin)",
            {"200": {"description": "the runs cancelled", **js({
                "type": "object", "required": ["count", "cancelled", "more"], "properties": {
                    "count": {"type": "integer"}, "cancelled": {"type": "array", "items": {"type": "integer"}},
                    "more": {"type": "boolean", "description": "this call did something: call again until it is false"}}})}},
            (400, 401, 403, 404, 413, 415, 422, 503), body=bulk_body,
            description="cancel_runs(): running handlers are told and stopped by their replicas. "
                        "status: queued or running.")},
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

