"""/streams (your open streams), /streams/{id} (Server-Sent Events), /streams/{id}/stop.

The SSE response follows one stream through the replica's stream hub, exactly as a
WebSocket subscription does, so it resumes (``?after=N`` or ``Last-Event-ID``),
falls behind and catches up on its own, and ends with the stream:

    id: 813
    data: Hel

    event: end
    data: {"status": "done", "last_seq": 814, "final": {...}}

A chunk with line breaks is several ``data:`` lines (the EventSource joins them with
"\\n"). A comment line (``: keep-alive``) goes out every 15 s of silence so proxies
keep the connection. A stream the caller may not read is 404, like an unknown one.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import falcon
import falcon.asgi

from ..auth import AuthState
from ..db import Database
from ..errors import Problem
from ..streams.actions import SEQ_MAX
from ..streams.hub import StreamHub, Subscription
from ..streams.sinks import QueueSink
from .common import authenticate
from .event_stream import KEEPALIVE_COMMENT, KeepAlive, disconnected, until_gone

SSE_PER_USER = 16          # open SSE responses per user and replica (each holds a subscription)


def sse_event(text: str) -> tuple[bytes, bool]:
    """One WebSocket stream frame (encoded) as SSE events, and whether it was the last."""
    f = json.loads(text)
    p = f.get("payload") or {}
    if f.get("event") == "stream.chunks":
        out = []
        for i, chunk in enumerate(p.get("chunks", [])):
            lines = chunk.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            out.append(f"id: {p['seq'] + i}\n" + "".join(f"data: {ln}\n" for ln in lines) + "\n")
        return "".join(out).encode(), False
    if f.get("event") == "stream.end":
        body = {k: p.get(k) for k in ("status", "last_seq", "final")}
        return f"event: end\ndata: {json.dumps(body, ensure_ascii=False, default=str)}\n\n".encode(), True
    return f"event: error\ndata: {json.dumps(p, ensure_ascii=False, default=str)}\n\n".encode(), True


def _after(req: falcon.Request) -> int:
    values = [v for v in (req.get_header("Last-Event-ID"), req.get_param("after")) if v is not None]
    for raw in values:                     # both checked; the header wins (an EventSource's reconnect)
        if not raw.isdigit() or len(raw) > 10 or int(raw) > SEQ_MAX:
            raise falcon.HTTPBadRequest(title="Bad Request",
                                        description="after / Last-Event-ID must be a chunk seq (an integer >= 0)")
    return int(values[0]) if values else 0


class StreamList:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        rows = await self.db.streams_of(p.user_id)
        resp.media = {"streams": [
            {"id": str(r["id"]), "room": r["room"], "kind": r["kind"], "meta": r["meta"], "status": r["status"],
             "last_seq": r["last_seq"], "opened_at": r["opened_at"].isoformat()} for r in rows]}


class StreamEvents:
    def __init__(self, db: Database, auth: AuthState, hub: StreamHub) -> None:
        self.db = db
        self.auth = auth
        self.hub = hub
        self.open: dict[uuid.UUID, int] = {}     # user -> open SSE responses here (no entry at 0)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, stream_id: uuid.UUID) -> None:
        p = authenticate(self.auth, req)
        after = _after(req)
        await self.db.stream_info(stream_id, p.user_id)  # P0002 -> 404
        if self.open.get(p.user_id, 0) >= SSE_PER_USER:
            raise Problem(429, "too-many-streams",
                          f"at most {SSE_PER_USER} open stream responses per user on a replica; close one",
                          headers={"Retry-After": "1"})
        resp.content_type = "text/event-stream"
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Accel-Buffering", "no")      # nginx: do not buffer the stream
        # The ASGI receive channel says when the client goes: send() to a gone client is a
        # no-op, so without it a closed response would hold its subscription until the end.
        resp.stream = self._events(stream_id, after, p.user_id, req._receive)

    async def _events(self, stream_id: uuid.UUID, after: int, user: uuid.UUID,
                      receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> AsyncIterator[bytes]:
        # Everything is taken here, when the response starts, and given back in the finally:
        # a response that never starts (the client left at once) holds nothing.
        self.open[user] = self.open.get(user, 0) + 1
        sink = QueueSink()
        sub = Subscription(stream_id, after, sink)
        self.hub.subscribe(sub)
        gone = asyncio.ensure_future(disconnected(receive))
        try:
            async for text in until_gone(sink.queue, gone):
                if isinstance(text, KeepAlive):
                    yield KEEPALIVE_COMMENT
                    continue
                data, last = sse_event(text)
                yield data
                if last:
                    return
        finally:
            gone.cancel()
            sink.gone = True
            self.hub.unsubscribe(sub)
            left = self.open.get(user, 1) - 1
            if left > 0:
                self.open[user] = left
            else:
                self.open.pop(user, None)


class StreamStop:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_post(self, req: falcon.Request, resp: falcon.Response, stream_id: uuid.UUID) -> None:
        p = authenticate(self.auth, req)
        status = await self.db.stream_stop(stream_id, p.user_id)  # P0002 -> 404
        resp.media = {"stream": str(stream_id), "status": status}
