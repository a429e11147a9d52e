"""Health, metrics, the OpenAPI document and the demo page."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from pathlib import Path

import falcon

from ..db import Database
from ..errors import Problem
from ..metrics import CONTENT_TYPE, GaugeSampler, Metrics
from ..openapi import openapi_document, with_unsupported_media_type
from ..relay import Relay
from ..replica import ReplicaState

LOG = logging.getLogger("switchboard.health")
STATIC = Path(__file__).resolve().parent.parent / "static"


class Live:
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ok"}


class Ready:
    def __init__(self, replica: ReplicaState, relay: Relay, db: Database) -> None:
        self.replica = replica
        self.relay = relay
        self.db = db

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        # Reason codes, not driver error texts: this endpoint is anonymous, and
        # an error text names hosts, ports, users and databases. The details go to
        # the log (LISTEN loss is logged by the relay).
        reasons = []
        if self.replica.draining:
            reasons.append("shutting_down")
        if not self.relay.connected:
            reasons.append("listen_down")
        try:
            await self.db.ping(timeout=2.0)
        except Exception as exc:
            LOG.warning("readiness: database ping failed: %s", str(exc).strip() or type(exc).__name__)
            reasons.append("database_unavailable")
        # No replica id: the probe is anonymous, and an id tells an outsider how many
        # replicas answer and which one it reached (GET /me names it to a user).
        if reasons:
            # A problem document like every other error; the reason codes are its
            # extension (no replica id: see above).
            raise Problem(503, "not-ready", f"this replica is not ready: {', '.join(reasons)}",
                          reasons=reasons)
        else:
            resp.media = {"status": "ready", "reasons": []}


class MetricsResource:
    def __init__(self, metrics: Metrics, sampler: GaugeSampler) -> None:
        self.metrics = metrics
        self.sampler = sampler

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        await self.sampler.refresh()  # this worker's gauges as of now
        resp.content_type = CONTENT_TYPE
        resp.data = self.metrics.render()


class OpenAPI:
    def __init__(self) -> None:
        self.doc = with_unsupported_media_type(openapi_document())

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.doc


_HOST_RE = re.compile(r"[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]{2,45}\](:[0-9]{1,5})?")


def page_csp(html: str, host: str | None) -> str:
    """The page's Content-Security-Policy: its one inline script allowed by hash (no
    'unsafe-inline' for scripts: an injected <script> does not run), inline styles
    (the page uses style attributes), requests and its WebSocket to its own origin
    only, never framed (clickjacking), no plugins, no <base> rewrites. Scripts from
    our own origin are allowed too (the page's module imports the client package)."""
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, flags=re.S)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(sc.encode()).digest()).decode()}'"
                      for sc in scripts)
    # CSP3 lets 'self' cover ws(s): to the same host; older engines need it spelled out.
    ws = f" ws://{host} wss://{host}" if host and _HOST_RE.fullmatch(host) else ""
    # 'self' after the hashes: the page's module imports ./switchboard-client.js.
    return (f"default-src 'self'; script-src {hashes + ' ' if hashes else ''}'self'; "
            f"style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'{ws}; "
            "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
class AsyncAPI:
    """The WebSocket protocol as an AsyncAPI 3.0 document (the client's frame types come from it)."""

    def __init__(self) -> None:
        self.data = (STATIC / "asyncapi.json").read_bytes()

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.data


class ClientScript:
    """The built @switchboard/client (clients/js, copied here by `npm run copy:static`) for the demo page."""

    def __init__(self) -> None:
        self.data = (STATIC / "switchboard-client.js").read_bytes()

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "text/javascript; charset=utf-8"
        resp.cache_control = ["no-cache"]
        resp.data = self.data


class Page:
    def __init__(self) -> None:
        self.html = (STATIC / "index.html").read_text()  # read once, not per request

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.set_header("Content-Security-Policy", page_csp(self.html, req.get_header("Host")))
        resp.text = self.html
