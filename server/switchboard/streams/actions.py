"""The WebSocket actions on streams: stream.subscribe, stream.unsubscribe, stream.stop.

Every field is parsed with bounds (a UUID, an ``after`` in [0, 2^31)); the reader is
checked once, in SQL (stream_info(id, reader): owner, admin, room member), and a
stream the socket may not read gets the same answer as one that does not exist.
A socket follows at most ``PER_SOCKET`` streams; closing it drops them all.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from ..sockets import Client, frame
from .hub import StreamHub, Subscription
from .sinks import SocketSink

PER_SOCKET = 64
SEQ_MAX = 2**31 - 1


def _error(client: Client, code: str, message: str, stream: Any = None, action: str | None = None) -> None:
    client.offer(frame("error", {"code": code, "message": message, "stream": stream, "action": action}))


def parse_stream(raw: Any) -> uuid.UUID | None:
    if not isinstance(raw, str) or len(raw) != 36:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


class StreamActions:
    def __init__(self, db: Any, hub: StreamHub, stall: float) -> None:
        self.db = db
        self.hub = hub
        self.stall = stall
        self.by_client: dict[int, dict[uuid.UUID, Subscription]] = {}

    def _target(self, client: Client, msg: dict[str, Any], action: str) -> uuid.UUID | None:
        sid = parse_stream(msg.get("stream"))
        if sid is None:
            _error(client, "bad_stream", "stream must be a stream id (a UUID)", action=action)
        return sid

    async def subscribe(self, client: Client, msg: dict[str, Any]) -> None:
        sid = self._target(client, msg, "stream.subscribe")
        if sid is None:
            return
        after = msg.get("after", 0)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= SEQ_MAX:
            _error(client, "bad_stream", "after must be the last seq you have (an integer >= 0)", str(sid),
                   "stream.subscribe")
            return
        self.forget_ended(client)
        mine = self.by_client.setdefault(client.cid, {})
        if sid not in mine and len(mine) >= PER_SOCKET:
            _error(client, "stream_limit", f"a socket follows at most {PER_SOCKET} streams", str(sid),
                   "stream.subscribe")
            return
        try:
            await self.db.stream_info(sid, client.user_id)
        except psycopg.errors.NoDataFound:
            _error(client, "stream_not_found", f"stream {sid} does not exist", str(sid), "stream.subscribe")
            return
        if client.closing is not None or self.by_client.get(client.cid) is not mine:
            return                          # closed while we asked
        old = mine.get(sid)
        if old is not None:
            self.hub.unsubscribe(old)
        sub = mine[sid] = Subscription(sid, after, SocketSink(client, self.stall), owner=client.cid)
        self.hub.subscribe(sub)

    async def unsubscribe(self, client: Client, msg: dict[str, Any]) -> None:
        sid = self._target(client, msg, "stream.unsubscribe")
        if sid is None:
            return
        sub = self.by_client.get(client.cid, {}).pop(sid, None)
        if sub is not None:
            self.hub.unsubscribe(sub)
        client.offer(frame("stream.unsubscribed", {"stream": str(sid)}))

    async def stop(self, client: Client, msg: dict[str, Any]) -> None:
        sid = self._target(client, msg, "stream.stop")
        if sid is None:
            return
        try:
            await self.db.stream_stop(sid, client.user_id)
        except psycopg.errors.NoDataFound:
            _error(client, "stream_not_found", f"stream {sid} does not exist", str(sid), "stream.stop")

    def drop(self, client: Client) -> None:
        """The socket closed: every subscription of it goes."""
        for sub in self.by_client.pop(client.cid, {}).values():
            self.hub.unsubscribe(sub)

    def forget_ended(self, client: Client) -> None:
        """Subscriptions the hub ended (the stream's end was sent) leave the socket's count."""
        mine = self.by_client.get(client.cid)
        if mine:
            for sid in [s for s, sub in mine.items() if sub.sid not in self.hub.subs.get(s, {})]:
                del mine[sid]
