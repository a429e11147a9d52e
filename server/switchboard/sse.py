"""GET /sse?ticket=…: the WebSocket's frames as Server-Sent Events, for networks that
block WebSocket upgrades.

The query is the WebSocket handshake's (ws.Handshake: ticket, cursor or after, rooms,
feeds), checked by the same code with the same bounds, and ``Last-Event-ID`` stands in
for ``cursor`` (it wins). A refusal is an HTTP status with a problem body (the
WebSocket's close code as ``close_code``): 403 for a bad ticket or Origin, or the
user's connection cap, 503 while draining or when the database is down. Once
admitted the stream is registered with the relay exactly like a socket -- same
Client, same bounded send queue, same resume -- and written as::

    event: connection
    data: {"connection": "<id>", "secret": "<secret>"}

    id: <cursor>
    data: {"id": null, "event": "hello", ..., "cursor": "<cursor>"}

    id: <cursor>
    data: {"id": 812, "event": "chat.message", ..., "cursor": "<cursor>"}

    : keep-alive

    event: close
    data: {"id": null, "event": "close", "payload": {"code": 1012, "reason": "server restarting"}, ...}

One WebSocket frame per ``data:`` line; a frame that carries a cursor has it as the
SSE ``id:`` (so an EventSource's ``lastEventId`` is the resume position). A comment
every SSE_KEEPALIVE_S of silence keeps proxies from closing it. What the server
would close a socket with (1008 session ended / user disabled, 1012 restarting, 1013
too slow) ends the stream after a ``close`` event with the code; a client that goes
away is noticed through the ASGI receive channel and unregistered at once. The
connection id and secret of the first event authorise the client's actions (POST
/sse/{connection}/actions, sse_actions.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import falcon
import falcon.asgi

from .errors import Problem
from .http.event_stream import KEEPALIVE_COMMENT, KEEPALIVE_S, KeepAlive, disconnected, until_gone
from .relay import Relay
from .replica import ReplicaState
from .resume import resume
from .sockets import Client, frame
from .ws import Handshake, WebSocketResource, _FrameBucket

LOG = logging.getLogger("switchboard.sse")
SSE_KEEPALIVE_S = KEEPALIVE_S
DRAIN_POLL_S = 0.25          # how often the watcher looks for a shutdown (one task per process)
_CURSOR_TAIL = re.compile(r',"cursor":"([A-Za-z0-9._~-]{1,256})"\}$')
# Response tasks cancelled because their reader stopped draining after the stream was closed
# (SwitchboardApp.__call__ lets them end quietly: uvicorn then closes the connection).
CUT_OFF: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
# A refusal's close code (ws.py) as an HTTP status.
_STATUS = {1008: 403, 1011: 503, 1012: 503, 1013: 503}


class SseConnection:
    """One open SSE stream: its Client (registered with the relay like a socket), the
    secret its actions must present, and its action rate bucket."""

    __slots__ = ("id", "secret", "client", "bucket", "strikes")

    def __init__(self, client: Client, bucket: _FrameBucket) -> None:
        self.id = secrets.token_hex(16)
        self.secret = secrets.token_urlsafe(24)
        self.client = client
        self.bucket = bucket
        self.strikes = 0


def sse_data(text: str) -> bytes:
    """One encoded frame as an SSE event: its cursor (if it has one) as ``id:``."""
    m = _CURSOR_TAIL.search(text[-300:])
    head = f"id: {m.group(1)}\n" if m else ""
    if "\n" in text or "\r" in text:     # never for our JSON; a multi-line value stays one event
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        return (head + "".join(f"data: {ln}\n" for ln in lines) + "\n").encode()
    return f"{head}data: {text}\n\n".encode()


def _named(event: str, body: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(body, separators=(',', ':'), default=str)}\n\n".encode()




def _cut(task: asyncio.Task[Any], done: asyncio.Event) -> None:
    """The stream was closed but its response is still blocked writing to a reader that does
    not read: cancel the response (uvicorn closes the connection)."""
    if not done.is_set() and not task.done():
        LOG.info("cutting off an SSE reader that does not drain")
        CUT_OFF.add(task)
        task.cancel()


class SseStreams:
    """The open SSE streams of this process, by connection id, and the watcher that
    ends them all (1012) when the replica starts draining: uvicorn waits for open
    responses before the lifespan shutdown that closes the sockets."""

    def __init__(self, relay: Relay, replica: ReplicaState) -> None:
        self.relay = relay
        self.replica = replica
        self.open: dict[str, SseConnection] = {}
        self._watch: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.open)

    def add(self, conn: SseConnection) -> None:
        self.open[conn.id] = conn
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._drain_watch(), name="sse-drain-watch")

    def remove(self, conn: SseConnection) -> None:
        self.open.pop(conn.id, None)

    async def _drain_watch(self) -> None:
        while self.open:
            if self.replica.draining:
                for conn in list(self.open.values()):
                    self.relay.close_client(conn.client, 1012, "server restarting")
            await asyncio.sleep(DRAIN_POLL_S)


class SseResource:
    """GET /sse: admission through the WebSocket endpoint's own steps, then the stream."""

    def __init__(self, ws: WebSocketResource, streams: SseStreams) -> None:
        self.ws = ws
        self.streams = streams

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        hs = self.ws._parse(req, req.get_header("Last-Event-ID"))
        if isinstance(hs, int):
            self._refuse(hs, "the ticket, Origin or query was refused" if hs == 1008 else "draining")
        assert isinstance(hs, Handshake)
        admitted = await self.ws._admit(hs)
        if isinstance(admitted, int):
            self._refuse(admitted, "the ticket was refused, or the user is at the connection limit"
                         if admitted == 1008 else "temporarily unavailable; retry")
        assert not isinstance(admitted, int)
        resp.content_type = "text/event-stream"
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Accel-Buffering", "no")      # nginx: do not buffer the stream
        resp.stream = self._events(hs, admitted, req._receive)

    @staticmethod
    def _refuse(code: int, detail: str) -> None:
        status = _STATUS.get(code, 403)
        raise Problem(status, "forbidden" if status == 403 else "unavailable", detail, close_code=code,
                      headers={"Retry-After": "1"} if status == 503 else None)

    async def _events(self, hs: Handshake, admitted: tuple[Any, ...],
                      receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> AsyncIterator[bytes]:
        # Registered when the response starts, unregistered in the finally: a response that
        # never starts (the client left at once) holds nothing.
        ws, cfg = self.ws, self.ws.cfg
        reasons: dict[str, str] = {}
        conn: SseConnection | None = None
        task, done = asyncio.current_task(), asyncio.Event()

        async def closer(code: int, reason: str) -> None:
            # The stream's loop writes the close event. Out of the table at once: a reader
            # that does not drain may hold this response in a blocked write for a while,
            # but nothing of the relay's (the relay unregistered it already).
            reasons["reason"] = reason
            if conn is not None:
                self.streams.remove(conn)
            if task is not None:   # a write that does not finish in time: the connection is cut
                asyncio.get_running_loop().call_later(cfg.ws_replay_stall_seconds, _cut, task, done)
        if ws.registry.sockets_of(admitted[0]["user_id"]) >= cfg.ws_max_sockets_per_user:
            # Checked again with no await before the registration: requests that all passed
            # admission (its database calls interleave) cannot exceed the cap together.
            yield _named("close", frame("close", {"code": 1008, "reason": "too many connections"}))
            return
        client = ws._register(closer, hs, *admitted)
        conn = SseConnection(client, _FrameBucket(cfg.ws_frame_rate, cfg.ws_frame_burst))
        self.streams.add(conn)
        gone = asyncio.ensure_future(disconnected(receive))
        replay: asyncio.Task[None] | None = None
        try:
            yield _named("connection", {"connection": conn.id, "secret": conn.secret})
            await ws._presence(client.user_id)
            if hs.after is not None:
                replay = asyncio.ensure_future(resume(ws.db, client, hs.after, cfg.ws_replay_stall_seconds, hs.ahead))
                replay.add_done_callback(lambda t: self._replayed(client, t))
            async for chunk in self._drain(client, gone):
                yield chunk
            if client.closing is not None and not gone.done():
                if client.close_task is not None:
                    await asyncio.gather(client.close_task, return_exceptions=True)
                yield _named("close", frame("close", {"code": client.closing, "reason": reasons.get("reason", "")}))
        finally:
            done.set()
            gone.cancel()
            if replay is not None:
                replay.cancel()
            self.streams.remove(conn)
            await ws._unregister(client, None)

    def _replayed(self, client: Client, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            LOG.warning("replay to the SSE stream of user %s failed: %s", client.user_id, task.exception())
            self.ws.relay.close_client(client, 1011, "internal error")

    @staticmethod
    async def _drain(client: Client, gone: asyncio.Future[Any]) -> AsyncIterator[bytes]:
        """The client's send queue as SSE bytes until it is closed (None) or the peer goes;
        a comment every SSE_KEEPALIVE_S of silence."""
        async for text in until_gone(client.queue, gone, SSE_KEEPALIVE_S):
            if isinstance(text, KeepAlive):
                yield KEEPALIVE_COMMENT
            elif text is None:
                return
            else:
                yield sse_data(text)


__all__ = ["SseConnection", "SseResource", "SseStreams", "sse_data"]
