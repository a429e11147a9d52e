"""Request helpers shared by the resources: body parsing, field checks, auth guards."""

from __future__ import annotations

import asyncio
import ipaddress
import uuid
from typing import Any, Literal, overload

import falcon

from .. import bounded
from ..auth import AuthState, Principal


DEFAULT_BODY_TIMEOUT = 30.0  # Config.body_timeout; AccessLog puts the configured one on req.context


def _too_large(req: falcon.Request, limit: int) -> falcon.HTTPError:
    req.context.bad_input = ("too_large", f"body over {limit} bytes")
    return falcon.HTTPContentTooLarge(title="Content Too Large",
                                      description=f"request bodies are limited to {limit} bytes")


def is_json_media_type(content_type: str | None) -> bool:
    """application/json, or a structured-syntax +json type (RFC 6839), any parameters."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_json(req: falcon.asgi.Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, within bounds: at most ``limit`` bytes
    (413), declared as JSON (415: a form post from another origin cannot
    become a JSON request), received within the body timeout (408), nested at most bounded.DEFAULT_MAX_DEPTH deep, no
    NaN/Infinity (400). A refusal is noted on ``req.context.bad_input`` so the
    access middleware counts it (switchboard_bad_input_total) and logs it at
    most once per interval."""
    if req.content_length is not None and req.content_length > limit:
        raise _too_large(req, limit)
    if not is_json_media_type(req.content_type):
        req.context.bad_input = ("bad_content_type", f"Content-Type {req.content_type!r}")
        raise falcon.HTTPUnsupportedMediaType(
            title="Unsupported Media Type",
            description="send the body as JSON with 'Content-Type: application/json'")
    timeout = getattr(req.context, "body_timeout", DEFAULT_BODY_TIMEOUT)
    try:
        raw = await asyncio.wait_for(req.stream.read(limit + 1), timeout)
    except TimeoutError:
        # A client that trickles its body would hold a connection slot and a task for
        # as long as it likes (uvicorn has no body read timeout): 408, and the
        # connection closes (falcon answers before the body was read in full).
        req.context.bad_input = ("too_slow", f"body not received within {timeout:g} s")
        raise falcon.HTTPError(falcon.HTTP_408, title="Request Timeout",
                               description=f"the request body did not arrive within {timeout:g} s "
                                           "(SWITCHBOARD_BODY_TIMEOUT)") from None
    if len(raw) > limit:
        raise _too_large(req, limit)
    if not raw:
        raise falcon.HTTPBadRequest(title="Bad Request", description="a JSON body is required")
    try:
        body = bounded.loads(raw, max_bytes=limit)
    except bounded.BadInput as exc:
        req.context.bad_input = (exc.reason, str(exc))
        raise falcon.HTTPBadRequest(title="Bad Request", description=f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        req.context.bad_input = ("bad_type", "body is not an object")
        raise falcon.HTTPBadRequest(title="Bad Request", description="the body must be a JSON object")
    if _has_nul(body):
        req.context.bad_input = ("bad_text", "NUL in a string")
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


@overload
def field_str(body: dict[str, Any], name: str, *, required: Literal[True] = ..., max_len: int = ...,
              nullable: Literal[False] = ...) -> str: ...
@overload
def field_str(body: dict[str, Any], name: str, *, required: bool = ..., max_len: int = ...,
              nullable: bool = ...) -> str | None: ...
def field_str(body: dict[str, Any], name: str, *, required: bool = True, max_len: int = 10000,
              nullable: bool = False) -> str | None:
    """A required, non-nullable field is a str (the overloads say so to the type checker)."""
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


def check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise unprocessable(f"unknown field(s): {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def parse_uuid(value: Any, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise unprocessable(f"'{name}' must be a UUID") from None


def jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}


def authenticate(auth: AuthState, req: falcon.Request) -> Principal:
    return auth.authenticate(req.get_header("Authorization"))


def require_admin(auth: AuthState, req: falcon.Request) -> Principal:
    p = authenticate(auth, req)
    if not p.is_admin:
        raise falcon.HTTPForbidden(title="Forbidden", description="admin role required")
    return p


def reached_over_tls(req: falcon.Request, trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Did the client reach us over TLS? Directly (the ASGI scheme), or through a
    TLS-terminating proxy: X-Forwarded-Proto counts only when the socket peer is in
    SWITCHBOARD_TRUSTED_PROXIES (anybody else could send it). The right-most value is
    the one the nearest proxy wrote: a client may send its own header, which an
    appending proxy puts first."""
    if req.scheme in ("https", "wss"):   # a WebSocket upgrade's scheme is ws/wss
        return True
    if not trusted:
        return False
    try:
        peer = ipaddress.ip_address((req.remote_addr or "").strip())
    except ValueError:
        return False
    if not any(peer in net for net in trusted):
        return False
    values = [v.strip().lower() for v in (req.get_header("X-Forwarded-Proto") or "").split(",") if v.strip()]
    return bool(values) and values[-1] == "https"
