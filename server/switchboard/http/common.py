"""Request helpers shared by the resources: body parsing, field checks, auth guards."""

from __future__ import annotations

import ipaddress
import json
import uuid
from typing import Any

import falcon

from ..auth import AuthState, Principal


async def read_json(req: falcon.Request, limit: int) -> dict:
    if req.content_length is not None and req.content_length > limit:
        raise falcon.HTTPContentTooLarge(title="Content Too Large",
                                         description=f"request bodies are limited to {limit} bytes")
    raw = await req.stream.read(limit + 1)
    if len(raw) > limit:
        raise falcon.HTTPContentTooLarge(title="Content Too Large",
                                         description=f"request bodies are limited to {limit} bytes")
    if not raw:
        raise falcon.HTTPBadRequest(title="Bad Request", description="a JSON body is required")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise falcon.HTTPBadRequest(title="Bad Request", description="the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise falcon.HTTPBadRequest(title="Bad Request", description="the body must be a JSON object")
    if _has_nul(body):
        raise unprocessable("strings must not contain NUL (\\u0000) characters")
    return body


def _has_nul(v: Any) -> bool:
    """PostgreSQL text and jsonb cannot hold U+0000: refuse it at the door (422), not as a 500."""
    if isinstance(v, str):
        return "\x00" in v
    if isinstance(v, dict):
        return any(_has_nul(k) or _has_nul(x) for k, x in v.items())
    if isinstance(v, list):
        return any(_has_nul(x) for x in v)
    return False


def unprocessable(msg: str) -> falcon.HTTPError:
    return falcon.HTTPUnprocessableEntity(title="Unprocessable Entity", description=msg)


def field_str(body: dict, name: str, *, required: bool = True, max_len: int = 10000,
              nullable: bool = False) -> str | None:
    if name not in body:
        if required:
            raise unprocessable(f"'{name}' is required")
        return None
    v = body[name]
    if v is None and nullable:
        return None
    if not isinstance(v, str) or not v or len(v) > max_len:
        raise unprocessable(f"'{name}' must be a non-empty string of at most {max_len} characters")
    return v


def check_fields(body: dict, allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise unprocessable(f"unknown field(s): {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def parse_uuid(value: Any, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise unprocessable(f"'{name}' must be a UUID") from None


def jsonable_row(row: dict) -> dict:
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}


def authenticate(auth: AuthState, req: falcon.Request) -> Principal:
    return auth.authenticate(req.get_header("Authorization"))


def require_admin(auth: AuthState, req: falcon.Request) -> Principal:
    p = authenticate(auth, req)
    if not p.is_admin:
        raise falcon.HTTPForbidden(title="Forbidden", description="admin role required")
    return p


def reached_over_tls(req: falcon.Request, trusted: list[ipaddress._BaseNetwork]) -> bool:
    """Did the client reach us over TLS? Directly (the ASGI scheme), or through a
    TLS-terminating proxy: X-Forwarded-Proto counts only when the socket peer is in
    SWITCHBOARD_TRUSTED_PROXIES (anybody else could send it). The first value is the
    one the client-facing proxy wrote."""
    if req.scheme == "https":
        return True
    if not trusted:
        return False
    try:
        peer = ipaddress.ip_address((req.remote_addr or "").strip())
    except ValueError:
        return False
    if not any(peer in net for net in trusted):
        return False
    proto = (req.get_header("X-Forwarded-Proto") or "").split(",")[0].strip().lower()
    return proto == "https"
