"""The building blocks of the OpenAPI document: media types, shared JSON Schemas, and
the helpers every path block writes its operations with."""

from __future__ import annotations

from typing import Any

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

