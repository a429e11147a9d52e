"""CORS for browsers on other origins (SWITCHBOARD_ALLOWED_ORIGINS).

Falcon's CORSMiddleware does the protocol (preflight answered from the
route's Allow header, exposed headers, Access-Control-Max-Age 86400 -- browsers
cap it, Chromium at 2 h); two
things it cannot express are added here:

- credentials per *path*, not per origin: only the session endpoints
  (``/auth/refresh``, ``/auth/logout``, and ``/auth/login`` which sets the
  cookie) answer ``Access-Control-Allow-Credentials: true``. Every other
  endpoint is called with a bearer token, which needs no cookie, so a page
  on an allowed origin never gets credentialed access to anything else.
  Credentials are never granted to the ``*`` wildcard: a refresh response
  carries an access token, and any site able to read it would own the
  session.
- ``Vary: Origin`` whenever the answer depends on the Origin, so a shared
  cache never hands one origin's CORS headers to another.

Off (no middleware at all) when the list is empty, the default.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import falcon

CREDENTIAL_PATHS = frozenset({"/auth/login", "/auth/refresh", "/auth/logout"})
EXPOSE = ("RateLimit", "RateLimit-Policy", "Retry-After", "WWW-Authenticate")


class Cors(falcon.CORSMiddleware):  # type: ignore[type-arg]  # falcon's generic takes the app's request types; this one serves both
    def __init__(self, allowed: list[str]) -> None:
        origins = [o.rstrip("/") for o in allowed]
        self.wildcard = "*" in origins
        super().__init__(allow_origins="*" if self.wildcard else origins, expose_headers=list(EXPOSE),
                         allow_credentials=None)
        self.credentialed = frozenset(o for o in origins if o != "*")

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        origin = req.get_header("Origin")
        if origin is None:
            return
        resp.append_header("Vary", "Origin")
        super().process_response(req, resp, resource, req_succeeded)
        if resp.get_header("Access-Control-Allow-Origin") is None:
            return  # not an allowed origin: no CORS headers, the browser refuses
        if req.path in CREDENTIAL_PATHS and origin in self.credentialed:
            resp.set_header("Access-Control-Allow-Origin", origin)
            resp.set_header("Access-Control-Allow-Credentials", "true")


def origin_allowed(origin: str | None, host: str | None, allowed: list[str]) -> bool:
    if origin is None:
        return True  # non-browser clients: the ticket alone decides
    if "*" in allowed:
        return True
    origin = origin.rstrip("/")
    if origin in [a.rstrip("/") for a in allowed]:
        return True  # the CORS allowlist (SWITCHBOARD_ALLOWED_ORIGINS)
    # and always the server's own origin (its demo page)
    try:
        return urlsplit(origin).netloc.lower() == (host or "").lower()
    except ValueError:
        return False


def cors_middleware(allowed: list[str]) -> list[Cors]:
    """[] when CORS is off (no origins configured)."""
    return [Cors(allowed)] if allowed else []
