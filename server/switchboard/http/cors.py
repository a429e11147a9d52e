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

import ipaddress
from typing import Any

import falcon

from ..origins import normalize_origin
from .common import reached_over_tls

CREDENTIAL_PATHS = frozenset({"/auth/login", "/auth/refresh", "/auth/logout"})
EXPOSE = ("RateLimit", "RateLimit-Policy", "Retry-After", "WWW-Authenticate")


class Cors(falcon.CORSMiddleware):  # type: ignore[type-arg]  # falcon's generic takes the app's request types; this one serves both
    def __init__(self, allowed: list[str]) -> None:
        origins = list(allowed)   # normalised by Config (config.allowed_origins_list)
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


def own_origin(req: falcon.Request, trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str | None:
    """This server's origin as the client reached it: the scheme it came over (TLS
    directly or through a trusted proxy, see reached_over_tls) and the Host header."""
    scheme = "https" if reached_over_tls(req, trusted) else "http"
    return normalize_origin(f"{scheme}://{req.get_header('Host') or ''}")


def origin_allowed(origin: str | None, own: str | None, allowed: list[str], *, credentialed: bool) -> bool:
    """May a browser page on ``origin`` use this endpoint?

    No Origin header: not a browser (the credential alone decides). Otherwise the
    origin, normalised, must equal the server's own origin (scheme, host and port) or
    an entry of SWITCHBOARD_ALLOWED_ORIGINS. ``*`` there admits any origin only where
    no ambient credential is involved (``credentialed=False``: ``/ws``, which needs a
    ticket bought with a bearer token); it never admits one to the cookie endpoints."""
    if origin is None:
        return True
    o = normalize_origin(origin)
    if o is None:
        return False
    if o == own:
        return True
    if not credentialed and "*" in allowed:
        return True
    return o in allowed


def cors_middleware(allowed: list[str]) -> list[Cors]:
    """[] when CORS is off (no origins configured)."""
    return [Cors(allowed)] if allowed else []
