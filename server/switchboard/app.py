"""create_app(config): the Falcon ASGI application of one replica.

Resources receive their dependencies (``Services``) in __init__; the pool, the
relay, the scheduler and the heartbeat start in process_startup and stop in
process_shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
import uuid
from datetime import datetime, timezone
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
import falcon.media

from . import errors
from .auth import AuthState, Principal, hash_password, verify_password
from .config import Config
from .db import Database
from .handlers import registry as handler_registry
from .metrics import Metrics
from .openapi import openapi_document
from .ratelimit import RateLimiter, client_ip, too_many
from .relay import Registry, Relay
from .scheduler import Scheduler, worker_name
from .tools import ToolBridge
from .ws import WebSocketResource

LOG = logging.getLogger("switchboard.app")
ACCESS = logging.getLogger("switchboard.access")
STATIC = Path(__file__).parent / "static"
USERNAME_MAX = 64


@dataclass
class Services:
    config: Config
    db: Database
    metrics: Metrics
    auth: AuthState
    registry: Registry
    replica_id: str
    draining: bool = False
    started_at: float = field(default_factory=time.time)
    relay: Relay = None  # type: ignore[assignment]
    scheduler: Scheduler = None  # type: ignore[assignment]
    tools: ToolBridge = None  # type: ignore[assignment]
    limiter: RateLimiter = None  # type: ignore[assignment]


# -- request helpers -------------------------------------------------------------
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
        raise _unprocessable("strings must not contain NUL (\\u0000) characters")
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


def _unprocessable(msg: str) -> falcon.HTTPError:
    return falcon.HTTPUnprocessableEntity(title="Unprocessable Entity", description=msg)


def field_str(body: dict, name: str, *, required: bool = True, max_len: int = 10000,
              nullable: bool = False) -> str | None:
    if name not in body:
        if required:
            raise _unprocessable(f"'{name}' is required")
        return None
    v = body[name]
    if v is None and nullable:
        return None
    if not isinstance(v, str) or not v or len(v) > max_len:
        raise _unprocessable(f"'{name}' must be a non-empty string of at most {max_len} characters")
    return v


def check_fields(body: dict, allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise _unprocessable(f"unknown field(s): {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def parse_uuid(value: Any, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise _unprocessable(f"'{name}' must be a UUID") from None


class Base:
    def __init__(self, svc: Services) -> None:
        self.svc = svc

    def user(self, req: falcon.Request) -> Principal:
        return self.svc.auth.authenticate(req.get_header("Authorization"))

    def admin(self, req: falcon.Request) -> Principal:
        p = self.user(req)
        if not p.is_admin:
            raise falcon.HTTPForbidden(title="Forbidden", description="admin role required")
        return p


# -- auth ---------------------------------------------------------------------------
class Login(Base):
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        cfg = self.svc.config
        ip = client_ip(req, cfg.trusted_proxies)
        d_ip = await self.svc.limiter.check("login-ip", ip, cfg.login_ip_rate, cfg.login_ip_burst)
        if not d_ip.allowed:
            raise too_many(d_ip)
        body = await read_json(req, cfg.max_body_bytes)
        check_fields(body, {"username", "password"})
        username = field_str(body, "username", max_len=USERNAME_MAX)
        password = field_str(body, "password", max_len=1024)
        row = await self.svc.db.login_lookup(username)  # type: ignore[arg-type]
        ok = await verify_password(row["password_hash"] if row else None, password)  # type: ignore[arg-type]
        if ok and row and not row["disabled"]:
            token, ttl = self.svc.auth.issue(row["user_id"], username, row["role"])  # type: ignore[arg-type]
            resp.set_headers(d_ip.headers())
            resp.media = {"access_token": token, "token_type": "bearer", "expires_in": ttl,
                          "user_id": str(row["user_id"]), "role": row["role"]}
            return
        # Failures only count against the username: a correct password always logs in,
        # so nobody can lock a user out by guessing; the per-IP bucket bounds guessing.
        d_user = await self.svc.limiter.check("login-user", username.lower(),  # type: ignore[union-attr]
                                              cfg.login_user_rate, cfg.login_user_burst)
        if not d_user.allowed:
            raise too_many(d_user)
        raise falcon.HTTPUnauthorized(title="Unauthorized", description="wrong username or password",
                                      headers=d_ip.headers())


class Logout(Base):
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = self.user(req)
        await self.svc.db.revoke_token(p.jti, p.user_id,
                                       _ts(p.exp))
        self.svc.auth.apply_revoke(p.jti)
        resp.status = falcon.HTTP_204


def _ts(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


class Ticket(Base):
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = self.user(req)
        ttl = self.svc.config.ticket_ttl
        ticket = await self.svc.db.issue_ticket(p.user_id, ttl)
        resp.status = falcon.HTTP_201
        resp.media = {"ticket": ticket, "expires_in": ttl}


class Me(Base):
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = self.user(req)
        resp.media = {"user_id": str(p.user_id), "username": p.username, "role": p.role,
                      "replica": self.svc.replica_id}


# -- tasks --------------------------------------------------------------------------
TASK_FIELDS = {"name", "schedule", "handler", "args", "timezone", "max_attempts", "is_active"}


def _task_out(t: dict) -> dict:
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in t.items()}


class Tasks(Base):
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.user(req)
        resp.media = {"tasks": [_task_out(t) for t in await self.svc.db.list_tasks()]}

    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.admin(req)
        body = await read_json(req, self.svc.config.max_body_bytes)
        check_fields(body, TASK_FIELDS - {"is_active"})
        name = field_str(body, "name", max_len=200)
        schedule = field_str(body, "schedule", required=False, nullable=True, max_len=200)
        handler = field_str(body, "handler", max_len=128)
        tz = field_str(body, "timezone", required=False, max_len=100) or "UTC"
        args = body.get("args", {})
        if not isinstance(args, dict):
            raise _unprocessable("'args' must be a JSON object")
        attempts = body.get("max_attempts", 3)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
            raise _unprocessable("'max_attempts' must be an integer between 1 and 100")
        task = await self.svc.db.create_task(name, schedule, handler, args, tz, attempts)  # type: ignore[arg-type]
        resp.status = falcon.HTTP_201
        resp.media = _task_out(task)


class Task(Base):
    async def _get(self, task_id: uuid.UUID) -> dict:
        t = await self.svc.db.get_task(task_id)
        if t is None:
            raise falcon.HTTPNotFound(title="Not Found", description=f"task {task_id} does not exist")
        return t

    async def on_get(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        self.user(req)
        resp.media = _task_out(await self._get(task_id))

    async def on_patch(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        self.admin(req)
        body = await read_json(req, self.svc.config.max_body_bytes)
        check_fields(body, TASK_FIELDS)
        if not body:
            raise _unprocessable("nothing to change")
        resp.media = _task_out(await self.svc.db.update_task(task_id, body))

    async def on_delete(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        self.admin(req)
        if not await self.svc.db.delete_task(task_id):
            raise falcon.HTTPNotFound(title="Not Found", description=f"task {task_id} does not exist")
        resp.status = falcon.HTTP_204


class Trigger(Base):
    async def on_post(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        self.admin(req)
        run = await self.svc.db.create_run_exclusive(task_id, "api")
        if run is None:
            active = await self.svc.db.active_run(task_id)
            resp.status = falcon.HTTP_409
            resp.media = {"title": "Conflict", "description": "the task already has a queued or running run",
                          "active_run": _task_out(active) if active else None}
            return
        resp.status = falcon.HTTP_202
        resp.media = {"run": _task_out(run)}


class Runs(Base):
    async def on_get(self, req: falcon.Request, resp: falcon.Response, task_id: uuid.UUID) -> None:
        self.user(req)
        limit = req.get_param_as_int("limit", min_value=1, max_value=1000, default=50)
        if await self.svc.db.get_task(task_id) is None:
            raise falcon.HTTPNotFound(title="Not Found", description=f"task {task_id} does not exist")
        resp.media = {"runs": [_task_out(r) for r in await self.svc.db.task_runs(task_id, limit)]}


# -- events, rooms, tools ---------------------------------------------------------------
class Events(Base):
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.admin(req)
        body = await read_json(req, self.svc.config.max_body_bytes)
        check_fields(body, {"user_id", "room", "event", "payload"})
        event = field_str(body, "event", max_len=128)
        payload = body.get("payload", {})
        if len(json.dumps(payload)) > 1024 * 1024:
            raise falcon.HTTPContentTooLarge(title="Content Too Large",
                                             description="event payloads are limited to 1 MiB")
        if ("user_id" in body) == ("room" in body):
            raise _unprocessable("give exactly one of 'user_id' or 'room'")
        if "user_id" in body:
            eid = await self.svc.db.notify_user(parse_uuid(body["user_id"], "user_id"), event, payload)  # type: ignore[arg-type]
        else:
            room = field_str(body, "room", max_len=128)
            eid = await self.svc.db.notify_room(room, event, payload)  # type: ignore[arg-type]
        resp.status = falcon.HTTP_202
        resp.media = {"id": eid}


class RoomMember(Base):
    async def on_put(self, req: falcon.Request, resp: falcon.Response, room: str, user_id: uuid.UUID) -> None:
        self.admin(req)
        await self.svc.db.add_room_member(room, user_id)
        resp.status = falcon.HTTP_204

    async def on_delete(self, req: falcon.Request, resp: falcon.Response, room: str,
                        user_id: uuid.UUID) -> None:
        self.admin(req)
        if not await self.svc.db.remove_room_member(room, user_id):
            raise falcon.HTTPNotFound(title="Not Found", description=f"{user_id} is not a member of {room}")
        resp.status = falcon.HTTP_204


class RoomMembers(Base):
    async def on_get(self, req: falcon.Request, resp: falcon.Response, room: str) -> None:
        p = self.user(req)
        if not p.is_admin and not await self.svc.db.is_room_member(room, p.user_id):
            raise falcon.HTTPForbidden(title="Forbidden", description=f"not a member of room {room}")
        members = await self.svc.db.room_members(room)
        if not members and not await self.svc.db.room_exists(room):
            raise falcon.HTTPNotFound(title="Not Found", description=f"room {room} does not exist")
        resp.media = {"room": room, "members": [
            {"user_id": str(m["user_id"]), "username": m["username"], "online": m["online"]} for m in members]}


class ToolCall(Base):
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.admin(req)
        body = await read_json(req, self.svc.config.max_body_bytes)
        check_fields(body, {"user_id", "name", "args", "timeout_ms"})
        user_id = parse_uuid(body.get("user_id"), "user_id")
        name = field_str(body, "name", max_len=100)
        args = body.get("args", {})
        timeout_ms = body.get("timeout_ms", 10000)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not 1 <= timeout_ms <= 600000:
            raise _unprocessable("'timeout_ms' must be an integer between 1 and 600000")
        if len(json.dumps(args)) > 6000:
            raise _unprocessable("'args' must serialise to at most 6000 bytes")
        result = await self.svc.tools.call(user_id, name, args, timeout_ms)  # type: ignore[arg-type]
        resp.media = {"result": result}


# -- health, metrics, docs, page -------------------------------------------------------
class Live:
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ok"}


class Ready(Base):
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        svc = self.svc
        reasons = []
        if svc.draining:
            reasons.append("shutting down")
        if not svc.relay.connected:
            reasons.append(svc.relay.last_error or "LISTEN connection down")
        try:
            await svc.db.ping(timeout=2.0)
        except Exception as exc:
            reasons.append(f"database unavailable: {str(exc).strip() or type(exc).__name__}")
        if reasons:
            resp.status = falcon.HTTP_503
            resp.media = {"status": "unavailable", "reasons": reasons, "replica": svc.replica_id}
        else:
            resp.media = {"status": "ready", "replica": svc.replica_id}


class MetricsResource(Base):
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = self.svc.metrics.render()


class OpenAPI:
    def __init__(self) -> None:
        self.doc = openapi_document()

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.doc


class Page:
    def __init__(self) -> None:
        self.html = (STATIC / "index.html").read_text()  # read once, not per request

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.text = self.html


# -- middleware -------------------------------------------------------------------------
class Lifecycle:
    """Starts and stops the per-process machinery around the ASGI lifespan."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self._tasks: list[asyncio.Task] = []

    async def process_startup(self, scope: dict, event: dict) -> None:
        svc = self.svc
        install_log_redaction()
        await svc.db.open()
        svc.relay.start()
        if svc.config.scheduler_enabled:
            svc.scheduler.start()
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="heartbeat"))
        self._install_drain_signal()
        LOG.info("replica %s started (scheduler %s)", svc.replica_id,
                 "on" if svc.config.scheduler_enabled else "off")

    def _install_drain_signal(self) -> None:
        # uvicorn (alone or as a gunicorn worker) installed its SIGTERM/SIGINT handlers
        # before lifespan startup; chain ours in front so readiness fails and claiming
        # stops the moment the signal arrives.
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                prev = signal.getsignal(sig)
            except ValueError:
                continue

            def handler(signum: int, frame: Any, _prev: Any = prev) -> None:
                self.svc.draining = True
                if callable(_prev):
                    _prev(signum, frame)
            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread (tests embedding the app)
                pass

    async def _heartbeat(self) -> None:
        svc = self.svc
        info = {"host": socket.gethostname(), "pid": os.getpid()}
        while True:
            try:
                users = list(svc.registry.by_user.keys())
                counts = [len(svc.registry.by_user[u]) for u in users]
                await svc.db.replica_heartbeat(svc.replica_id, {**info, "sockets": svc.registry.count})
                await svc.db.presence_sync(svc.replica_id, users, counts)
                svc.auth.prune()
            except Exception as exc:
                LOG.debug("heartbeat failed: %s", exc)
            await asyncio.sleep(svc.config.heartbeat_interval)

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        svc = self.svc
        svc.draining = True
        LOG.info("replica %s shutting down", svc.replica_id)
        if svc.config.scheduler_enabled:
            await svc.scheduler.stop(svc.config.shutdown_grace)
        for c in svc.registry.clients():
            svc.relay.close_client(c, 1012, "server restarting")
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(svc.db.replica_stop(svc.replica_id), 3)
        except Exception:
            pass
        await svc.relay.stop()
        await svc.db.close()


class _RedactTickets(logging.Filter):
    """uvicorn logs WebSocket handshakes with their query string; the ticket must never
    reach a log. Rewrites ticket=<value> in the record's message and arguments."""

    import re as _re
    _pattern = _re.compile(r"(ticket=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "ticket=" in record.msg:
            record.msg = self._pattern.sub(r"\1[redacted]", record.msg)
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(self._pattern.sub(r"\1[redacted]", a) if isinstance(a, str) and "ticket=" in a
                                else a for a in record.args)
        return True


def install_log_redaction() -> None:
    f = _RedactTickets()
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "gunicorn.error", "gunicorn.access", ""):
        lg = logging.getLogger(name)
        if not any(isinstance(x, _RedactTickets) for x in lg.filters):
            lg.addFilter(f)
        for h in lg.handlers:
            if not any(isinstance(x, _RedactTickets) for x in h.filters):
                h.addFilter(f)


class AccessLog:
    """Requests by route and status for /metrics; an access log without query strings
    (the WebSocket ticket travels in the query string and must never be logged)."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.t0 = time.perf_counter()
        if req.content_length is not None and req.content_length > self.svc.config.max_body_bytes:
            raise falcon.HTTPContentTooLarge(
                title="Content Too Large",
                description=f"request bodies are limited to {self.svc.config.max_body_bytes} bytes")

    async def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                               req_succeeded: bool) -> None:
        route = req.uri_template or "unmatched"
        status = str(resp.status)[:3] if resp.status else "200"
        self.svc.metrics.inc("switchboard_http_requests_total", route=route, method=req.method, status=status)
        if ACCESS.isEnabledFor(logging.INFO):
            ms = (time.perf_counter() - getattr(req.context, "t0", time.perf_counter())) * 1000
            ACCESS.info("%s %s %s %.1fms", req.method, req.path, status, ms)


class SwitchboardApp(falcon.asgi.App):
    """falcon.asgi.App plus a handle on its Services (for the CLI and tests)."""

    services: Services


def create_app(config: Config) -> SwitchboardApp:
    handler_registry.load_modules(config.handler_modules)
    metrics = Metrics()
    svc = Services(
        config=config,
        db=Database(config.database_url, config.pool_min, config.pool_size, config.pool_timeout),
        metrics=metrics,
        auth=AuthState(config.jwt_secret, config.jwt_ttl),
        registry=Registry(),
        replica_id=worker_name(),
    )
    svc.relay = Relay(svc)
    svc.scheduler = Scheduler(svc)
    svc.relay.on_run_wake = svc.scheduler.wake
    svc.tools = ToolBridge(svc)
    svc.limiter = RateLimiter(svc)

    metrics.gauge("switchboard_websockets_open", "Open WebSockets on this replica", lambda: svc.registry.count)
    metrics.gauge("switchboard_listen_connected", "1 while the LISTEN connection is up",
                  lambda: 1 if svc.relay.connected else 0)
    metrics.gauge("switchboard_runs_running", "Runs executing on this replica", lambda: svc.scheduler.running)
    metrics.gauge("switchboard_pool_size", "Connections in the request pool",
                  lambda: svc.db.pool.get_stats().get("pool_size", 0))
    metrics.gauge("switchboard_pool_available", "Idle connections in the request pool",
                  lambda: svc.db.pool.get_stats().get("pool_available", 0))
    metrics.gauge("switchboard_pool_waiting", "Requests waiting for a connection",
                  lambda: svc.db.pool.get_stats().get("requests_waiting", 0))

    app = SwitchboardApp(middleware=[Lifecycle(svc), AccessLog(svc)], cors_enable=False)
    app.ws_options.max_receive_queue = 8
    json_handler = falcon.media.JSONHandler(dumps=partial(json.dumps, default=str, ensure_ascii=False),
                                            loads=json.loads)
    app.req_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    app.resp_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    app.req_options.strip_url_path_trailing_slash = False
    errors.register(app)

    app.add_route("/", Page())
    app.add_route("/auth/login", Login(svc))
    app.add_route("/auth/logout", Logout(svc))
    app.add_route("/me", Me(svc))
    app.add_route("/ws/ticket", Ticket(svc))
    app.add_route("/ws", WebSocketResource(svc))
    app.add_route("/tasks", Tasks(svc))
    app.add_route("/tasks/{task_id:uuid}", Task(svc))
    app.add_route("/tasks/{task_id:uuid}/trigger", Trigger(svc))
    app.add_route("/tasks/{task_id:uuid}/runs", Runs(svc))
    app.add_route("/events", Events(svc))
    app.add_route("/rooms/{room}/members", RoomMembers(svc))
    app.add_route("/rooms/{room}/members/{user_id:uuid}", RoomMember(svc))
    app.add_route("/tools/call", ToolCall(svc))
    app.add_route("/healthz/live", Live())
    app.add_route("/healthz/ready", Ready(svc))
    app.add_route("/metrics", MetricsResource(svc))
    app.add_route("/openapi.json", OpenAPI())
    app.services = svc
    return app


__all__ = ["create_app", "Services", "hash_password"]
