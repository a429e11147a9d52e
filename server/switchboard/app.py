"""create_app(config): the Falcon ASGI application of one replica.

This module holds three things: create_app (wiring), the route table, and the
lifecycle (what starts in process_startup and stops in process_shutdown).
Components are built by services.build_services; resources live in
switchboard/http/<area>.py and receive exactly what they use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from functools import partial
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi
import falcon.media

from . import errors
from .config import Config
from .http import auth, console, events, jobs, operate, ops, rooms, streams, tasks, tools
from .http.cors import cors_middleware
from .http.middleware import AccessLog, install_log_redaction
from .services import Services, build_services
from .streams.actions import StreamActions
from . import sse
from .sse import SseResource, SseStreams
from .sse_actions import SseActions
from .ws import WebSocketResource

LOG = logging.getLogger("switchboard.app")


class Lifecycle:
    """Starts and stops the per-process machinery around the ASGI lifespan."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def process_startup(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        svc = self.svc
        install_log_redaction()
        await svc.db.open()
        svc.relay.start()
        svc.streams.start()
        svc.sessions.start()
        if svc.config.scheduler_enabled:
            svc.scheduler.start()
        await svc.heartbeat.start()
        svc.presence.start()
        svc.sampler.start()
        self._install_drain_signal()
        LOG.info("replica %s started (scheduler %s)", svc.replica.replica_id,
                 "on" if svc.config.scheduler_enabled else "off")

    def _install_drain_signal(self) -> None:
        # uvicorn (alone or as a gunicorn worker) installed its SIGTERM/SIGINT handlers
        # before lifespan startup; chain ours in front so readiness fails and claiming
        # stops the moment the signal arrives.
        replica = self.svc.replica
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                prev = signal.getsignal(sig)
            except ValueError:
                continue

            def handler(signum: int, frame: Any, _prev: Any = prev) -> None:
                replica.draining = True
                if callable(_prev):
                    _prev(signum, frame)
            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread (tests embedding the app)
                pass

    async def process_shutdown(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        svc = self.svc
        svc.replica.draining = True
        LOG.info("replica %s shutting down", svc.replica.replica_id)
        if svc.config.scheduler_enabled:
            await svc.scheduler.stop(svc.config.shutdown_grace)
        for c in svc.registry.clients():
            svc.relay.close_client(c, 1012, "server restarting")
        await svc.sessions.stop()
        await svc.feed.stop()
        await svc.presence.stop()
        await svc.heartbeat.stop()
        await svc.sampler.stop()
        await svc.streams.stop()
        await svc.relay.stop()
        await svc.db.close()


class SwitchboardApp(falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]):
    """falcon.asgi.App plus a handle on its Services (for the CLI and tests)."""

    services: Services

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # type: ignore[override]
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task not in sse.CUT_OFF:
                raise
            task.uncancel()     # an SSE reader cut off (sse.py): uvicorn closes its connection


def create_app(config: Config) -> SwitchboardApp:
    svc = build_services(config)
    db, au, cfg = svc.db, svc.auth, svc.config
    body = cfg.max_body_bytes

    app = SwitchboardApp(middleware=[Lifecycle(svc), *cors_middleware(cfg.allowed_origins),
                                     AccessLog(svc.metrics, body, cfg.body_timeout)], cors_enable=False)
    app.ws_options.max_receive_queue = 8
    json_handler = falcon.media.JSONHandler(dumps=partial(json.dumps, default=str, ensure_ascii=False),
                                            loads=json.loads)
    app.req_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    app.resp_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    app.req_options.strip_url_path_trailing_slash = False
    errors.register(app)

    # -- the route table ---------------------------------------------------------------
    app.add_route("/", ops.Page())
    app.add_route("/auth/login", auth.Login(db, au, svc.limiter, cfg))
    app.add_route("/auth/refresh", auth.Refresh(db, au, svc.limiter, svc.metrics, cfg))
    app.add_route("/auth/logout", auth.Logout(db, au, cfg))
    app.add_route("/me", auth.Me(au, svc.replica.replica_id))
    app.add_route("/ws/ticket", auth.Ticket(db, au, cfg.ticket_ttl, svc.limiter, cfg))
    stream_actions = StreamActions(db, svc.streams.hub, cfg.ws_replay_stall_seconds)
    ws = WebSocketResource(db, svc.relay, svc.registry, cfg, svc.replica, svc.sessions, svc.feed, stream_actions,
                            svc.presence)
    app.add_route("/ws", ws)
    # the WebSocket's frames as Server-Sent Events, its actions as POSTs (issue 34 item 6)
    sse_streams = SseStreams(svc.relay, svc.replica)
    app.add_route("/sse", SseResource(ws, sse_streams))
    app.add_route("/sse/{connection}/actions", SseActions(ws, sse_streams, au))
    svc.sampler.local["switchboard_sse_streams_open"] = lambda: len(sse_streams)
    app.add_route("/tasks", tasks.Tasks(db, au, body, svc.catalog))
    app.add_route("/tasks/{task_id:uuid}", tasks.Task(db, au, body, svc.catalog))
    app.add_route("/tasks/{task_id:uuid}/trigger", tasks.Trigger(db, au))
    app.add_route("/tasks/{task_id:uuid}/runs", tasks.Runs(db, au))
    app.add_route("/jobs", jobs.Jobs(db, au, body, svc.catalog))
    # operate (issue 20): runs, handlers, status -- admin only
    run_id = "{run_id:int(min=1, max=9223372036854775807)}"
    app.add_route("/runs", operate.Runs(db, au))
    app.add_route(f"/runs/{run_id}", operate.Run(db, au))
    app.add_route(f"/runs/{run_id}/retry", operate.RunRetry(db, au))
    app.add_route(f"/runs/{run_id}/cancel", operate.RunCancel(db, au))
    app.add_route("/runs/retry", operate.RunsRetry(db, au, cfg.max_body_bytes))
    app.add_route("/runs/cancel", operate.RunsCancel(db, au, cfg.max_body_bytes))
    app.add_route("/handlers", operate.Handlers(db, au))
    app.add_route("/handlers/{name}/pause", operate.HandlerAction(db, au, pause=True))
    app.add_route("/handlers/{name}/resume", operate.HandlerAction(db, au, pause=False))
    app.add_route("/status", operate.Status(db, au, svc.replica, svc.relay))
    app.add_route("/events", events.Events(db, au, body))
    app.add_route("/rooms/{room}/members", rooms.RoomMembers(db, au))
    app.add_route("/rooms/{room}/members/{user_id:uuid}", rooms.RoomMember(db, au))
    app.add_route("/tools/call", tools.ToolCall(svc.tools, au, body))
    app.add_route("/streams", streams.StreamList(db, au))
    app.add_route("/streams/{stream_id:uuid}", streams.StreamEvents(db, au, svc.streams.hub))
    app.add_route("/streams/{stream_id:uuid}/stop", streams.StreamStop(db, au))
    app.add_route("/healthz/live", ops.Live())
    app.add_route("/healthz/ready", ops.Ready(svc.replica, svc.relay, db))
    app.add_route("/metrics", ops.MetricsResource(svc.metrics, svc.sampler))
    app.add_route("/openapi.json", ops.OpenAPI())
    console.add_routes(app, db, au)  # /console and its two reads (issue 20)
    app.add_route("/asyncapi.json", ops.AsyncAPI())
    app.add_route("/switchboard-client.js", ops.ClientScript())
    app.services = svc
    return app


__all__ = ["create_app", "Services"]
