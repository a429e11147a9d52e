"""Health, metrics, the OpenAPI document and the demo page."""

from __future__ import annotations

import logging
from pathlib import Path

import falcon

from ..db import Database
from ..errors import Problem
from ..metrics import CONTENT_TYPE, GaugeSampler, Metrics
from ..openapi import openapi_document
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
        rid = self.replica.replica_id
        if reasons:
            # A problem document like every other error; the reason codes are its extension.
            raise Problem(503, "not-ready", f"this replica is not ready: {', '.join(reasons)}",
                          reasons=reasons, replica=rid)
        else:
            resp.media = {"status": "ready", "reasons": [], "replica": rid}


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
        self.doc = openapi_document()

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.doc


class AsyncAPI:
    """The WebSocket protocol as an AsyncAPI 3.0 document (the client's frame types come from it)."""

    def __init__(self) -> None:
        self.data = (STATIC / "asyncapi.json").read_bytes()

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.data


class ClientScript:
    """The built @switchboard/client (clients/js, copied here by its build) for the demo page."""

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
        resp.text = self.html
