"""GET /ws?ticket=…: the WebSocket handshake and the per-socket protocol.

The ticket (and Origin) are checked before accept(): closing before accept
refuses the handshake with HTTP 403. After accept, a sender task drains the
socket's bounded queue; the receive loop enforces frame size and rate, and
only the client actions docs/reference/websocket.md lists. Bad frames get an error frame, or a
close with 1003/1007/1008/1009 -- never an exception out of the relay.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any, NamedTuple

import falcon
import falcon.asgi
import psycopg

from . import bounded, cursor, latency_trace
from .bounded import BadInput
from .config import Config
from .cursor import Position
from .db import Database
from .http.cors import origin_allowed, own_origin
from .presence import Presence
from .relay import Relay
from .replica import ReplicaState
from .resume import resume
from .runfeed import FEEDS, RunFeed
from .sessions import SessionWatch
from .sockets import Client, CloseHook, Registry, encode, frame
from .streams.actions import StreamActions
from .ws_actions import FEED_MAX, ROOM_MAX, Actions, error


LOG = logging.getLogger("switchboard.ws")
# A room's naming rule lives in SQL (add_room_member); a name that breaks it can
# never be a member, so is_room_member() refuses it. Here only a bound on what an
# untrusted client may make us send to the database.
TICKET_RE = re.compile(r"[0-9A-Fa-f]{1,64}")   # issue_ticket_v2's 32 hex digits; more is never a ticket
HANDSHAKE_ROOMS_MAX = 50


class Handshake(NamedTuple):
    """An upgrade request's query, parsed and bounded before any database call:
    /ws?ticket=T[&cursor=C | &after=N][&rooms=a,b][&feeds=runs]. A cursor (or the
    previous release's after=N) asks for a handshake-time resume: the rooms are joined
    and everything after C is replayed *before* any live frame can be sent, so a
    reconnecting client has no window in which a live event overtakes the replay."""

    ticket: str
    after: Position | int | None
    ahead: tuple[int, ...]
    rooms: list[str]
    feeds: list[str]

    @classmethod
    def parse(cls, ticket: str, cursor_raw: str | None, after_raw: str | None, rooms_raw: str | None,
              feeds_raw: str | None) -> "Handshake":
        after: Position | int | None = None
        ahead: tuple[int, ...] = ()
        if cursor_raw is not None:
            after, ahead = cursor.decode_ahead(cursor_raw)
        elif after_raw is not None:
            after = bounded.bigint(after_raw, name="after", minimum=0)
        rooms = [r for r in (rooms_raw or "").split(",") if r]
        if len(rooms) > HANDSHAKE_ROOMS_MAX:
            raise BadInput("too_large", f"more than {HANDSHAKE_ROOMS_MAX} rooms")
        for r in rooms:
            bounded.text(r, name="room", max_len=ROOM_MAX)
        feeds = [f for f in (feeds_raw or "").split(",") if f]
        if len(feeds) > len(FEEDS) + 4:
            raise BadInput("too_large", "too many feeds")
        for f in feeds:
            bounded.text(f, name="feed", max_len=FEED_MAX)
        return cls(ticket, after, ahead, rooms, feeds)


class _FrameBucket:
    """Local per-socket frame-rate limit (it guards this process, so it is local)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.t = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class PresenceWrites:
    """presence_set for one replica, one user at a time, each write with the count of that
    moment. A close and a reconnect of the same user race: each computed its count, then
    awaited a pool connection, and a stale 0 could land after the 1 (a user online, counted
    offline until the heartbeat's repair). Serialised per user, every write reads the
    registry when its turn comes, so the last one written is the current count. The map
    holds only users with a write queued or in flight."""

    def __init__(self, db: Database, registry: Registry, replica: ReplicaState) -> None:
        self.db, self.registry, self.replica = db, registry, replica
        self._locks: dict[uuid.UUID, tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    async def write(self, user_id: uuid.UUID) -> None:
        lock, users = self._locks.setdefault(user_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                n = self.registry.sockets_of(user_id)
                try:
                    await self.db.presence_set(self.replica.replica_id, user_id, n)
                except Exception as exc:
                    LOG.warning("presence update failed (heartbeat will repair): %s", exc)
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[user_id]


class WebSocketResource:
    def __init__(self, db: Database, relay: Relay, registry: Registry, config: Config,
                 replica: ReplicaState, sessions: SessionWatch, feed: RunFeed | None = None,
                 streams: StreamActions | None = None, presence: Presence | None = None) -> None:
        self.db = db
        self.presence = presence        # pushed presence (presence.py); None: no presence frames
        self.feed = feed                # the admin run feed (runfeed.py); None: no feeds
        self.sessions = sessions
        self.relay = relay
        self.registry = registry
        self.cfg = config
        self.replica = replica
        self.rejections = bounded.Rejections(
            lambda source, reason: relay.metrics.inc("switchboard_bad_input_total", source=source, reason=reason),
            LOG)
        self.actions = Actions(db, registry, config, feed, self.rejections, streams, presence)
        self.presence_writes = PresenceWrites(db, registry, replica)

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        raise falcon.HTTPBadRequest(title="Bad Request",
                                    description="This endpoint speaks WebSocket: send an Upgrade request "
                                                "with ?ticket= (POST /ws/ticket issues one).")

    async def on_websocket(self, req: falcon.asgi.Request, ws: falcon.asgi.WebSocket) -> None:
        hs = self._parse(req)
        if isinstance(hs, int):
            await ws.close(hs)              # refused before accept: the client sees HTTP 403
            return
        admitted = await self._admit(hs)
        if isinstance(admitted, int):
            await ws.close(admitted)
            return
        grant, user, rooms, refused = admitted
        await ws.accept()

        async def closer(code: int, reason: str) -> None:
            try:
                await ws.close(code, reason)
            except Exception:
                pass
        client = self._register(closer, hs, grant, user, rooms, refused)
        sender: asyncio.Task[None] | None = None
        try:
            # Presence first, then hello goes out: a client that has its hello is reachable
            # (POST /tools/call finds its user online) -- it was written after the resume, and
            # a tool call right after connecting could get 404 "no socket anywhere".
            await self._presence(client.user_id)
            sender = asyncio.create_task(self._sender(ws, client))
            if hs.after is not None:
                await resume(self.db, client, hs.after, self.cfg.ws_replay_stall_seconds, hs.ahead)
            await self._receive_loop(ws, client)
        except falcon.WebSocketDisconnected:
            pass
        except Exception:
            LOG.exception("socket of user %s failed", client.user_id)
            self.relay.close_client(client, 1011, "internal error")
        finally:
            await self._unregister(client, sender)

    # -- the handshake, step by step ----------------------------------------------------------
    def _parse(self, req: falcon.Request, cursor_raw: str | None = None) -> Handshake | int:
        """What the upgrade request asks for, parsed with bounds; a close code if it is
        refused before any database call (draining, a foreign Origin, a malformed value).
        ``cursor_raw``: a cursor that wins over ?cursor= (SSE's Last-Event-ID)."""
        if self.replica.draining:
            return 1012
        if not origin_allowed(req.get_header("Origin"), own_origin(req, self.cfg.trusted_proxies),
                              self.cfg.allowed_origins, credentialed=False):
            LOG.info("refused WebSocket from origin %s", req.get_header("Origin"))
            return 1008
        ticket = req.get_param("ticket") or ""
        if not TICKET_RE.fullmatch(ticket):   # never a ticket: refused without a database call
            self.rejections.record("handshake", "malformed", "ticket is not hex")
            return 1008
        try:
            return Handshake.parse(ticket, cursor_raw or req.get_param("cursor"), req.get_param("after"),
                                   req.get_param("rooms"), req.get_param("feeds"))
        except BadInput as exc:
            self.rejections.record("handshake", exc.reason, str(exc))
            return 1008

    async def _admit(self, hs: Handshake) -> tuple[dict[str, Any], dict[str, Any], list[str], list[str]] | int:
        """Consume the ticket, read the user and check the rooms: (grant, user, rooms,
        refused rooms), or the close code. A ticket minted under a session that has ended
        since is refused by consume_ticket_v2."""
        try:
            grant = await self.db.consume_ticket_v2(hs.ticket)
            user = await self.db.get_user_session(grant["user_id"]) if grant else None
            if grant is None or user is None or user["disabled"]:
                return 1008
            if self.registry.sockets_of(grant["user_id"]) >= self.cfg.ws_max_sockets_per_user:
                return 1008
            rooms: list[str] = []
            refused: list[str] = []
            for r in hs.rooms:
                (rooms if await self.db.is_room_member(r, grant["user_id"]) else refused).append(r)
        except Exception as exc:  # database error, pool timeout, DB down
            LOG.warning("WebSocket admission failed: %s", exc)
            return 1011
        return grant, user, rooms, refused

    def _register(self, closer: CloseHook, hs: Handshake, grant: dict[str, Any], user: dict[str, Any],
                  rooms: list[str], refused: list[str]) -> Client:
        """Register the accepted socket (or SSE stream: sse.py) and queue hello, in one step
        (no await): once registered the relay may offer live events, and none may overtake
        hello (a client that resumes from "the last id seen" would skip what it missed).
        ``closer`` closes the transport with a code and reason."""
        relay, registry = self.relay, self.registry
        user_id: uuid.UUID = grant["user_id"]
        client = Client(user_id, user["username"], user["role"], self.cfg.ws_queue_size,
                        relay.position, relay.overflow, close_hook=closer, queue_bytes=self.cfg.ws_queue_bytes)
        client.epoch = int(user["token_epoch"])
        self.sessions.bind(client, grant["session_id"], grant["session_expires_at"])
        if hs.after is not None:
            client.resuming = True  # buffer live events from the moment the socket is registered
            client.buffer = []
        for r in rooms:
            registry.join(client, r)
        registry.add(client)
        # An announcement the relay applied between our read and add() found no socket to
        # close: its auth cache has the newer state, so check against that now.
        reason = relay.auth.verdict(user_id, client.role, client.epoch, client.session_id)
        if reason is not None:
            relay.close_client(client, 1008, reason)
        # feeds=runs: subscribed in the same step (no await: no feed frame can precede hello).
        feed_errors = [e for e in (self.actions.subscribe(client, f) for f in dict.fromkeys(hs.feeds)) if e]
        start = client.cursor()
        client.queue.put_nowait(encode(frame(
            "hello", {"replica": self.replica.replica_id, "user_id": str(user_id), "username": user["username"],
                      "role": user["role"], "last_id": relay.last_seen_id,
                      "cursor": start, "rooms": sorted(rooms),
                      "feeds": self.feed.feeds_of(client) if self.feed else []}, cursor=start)))
        for r in refused:
            client.queue.put_nowait(encode(frame(
                "error", {"code": "forbidden", "message": f"not a member of room {r}", "action": "join",
                          "room": r})))
        for err in feed_errors:
            client.queue.put_nowait(encode(err))
        return client

    async def _unregister(self, client: Client, sender: asyncio.Task[None] | None) -> None:
        if client.close_task is not None:  # the close code we chose goes out, not 1000
            await asyncio.gather(client.close_task, return_exceptions=True)
        if client.resume_task is not None:
            client.resume_task.cancel()
        self.registry.remove(client)
        if self.feed is not None:
            self.feed.unsubscribe(client)
        if self.actions.streams is not None:
            self.actions.streams.drop(client)
        if self.presence is not None:
            await self.presence.drop(client)   # never raises: the heartbeat repairs a failed untrack
        client.queue.put_nowait(None)
        if sender is not None:
            sender.cancel()
        try:
            await self._presence(client.user_id)
        except Exception:
            pass  # the heartbeat's presence_sync repairs it

    async def _presence(self, user_id: uuid.UUID) -> None:
        """Write the user's socket count on this replica as it is when the write's turn comes."""
        await self.presence_writes.write(user_id)

    async def _sender(self, ws: falcon.asgi.WebSocket, client: Client) -> None:
        try:
            while True:
                text = await client.queue.get()
                if text is None:
                    return
                await ws.send_text(text)
                if latency_trace.ON:
                    latency_trace.written(text)
        except (falcon.WebSocketDisconnected, asyncio.CancelledError):
            return
        except Exception as exc:
            LOG.info("send to user %s failed: %s", client.user_id, exc)

    def _error(self, client: Client, code: str, message: str, **extra: Any) -> None:
        error(client, code, message, **extra)

    async def _receive_loop(self, ws: falcon.asgi.WebSocket, client: Client) -> None:
        bucket = _FrameBucket(self.cfg.ws_frame_rate, self.cfg.ws_frame_burst)
        strikes = 0
        while client.closing is None:
            try:
                text = await ws.receive_text()
            except falcon.errors.PayloadTypeError:
                self.relay.close_client(client, 1003, "binary frames are not supported")
                return
            if len(text.encode()) > self.cfg.ws_max_frame_bytes:
                self.relay.close_client(client, 1009, "frame too large")
                return
            if not bucket.take():
                strikes += 1
                self._error(client, "rate_limited", "too many frames; slow down")
                if strikes >= 3 * self.cfg.ws_frame_burst:
                    self.relay.close_client(client, 1008, "frame rate exceeded")
                    return
                continue
            try:
                msg = bounded.loads(text, max_bytes=self.cfg.ws_max_frame_bytes)
            except bounded.BadInput as exc:   # deep, malformed, NaN: this frame only
                self.rejections.record("ws", exc.reason, str(exc))
                self._error(client, "bad_json", f"frames must be JSON objects ({exc.reason})")
                continue
            if not isinstance(msg, dict):
                self._error(client, "bad_frame", "frames must be JSON objects")
                continue
            try:
                await self.actions.handle(client, msg)
            except psycopg.Error as exc:
                self._error(client, "refused", exc.diag.message_primary or "refused by the database")
            except falcon.WebSocketDisconnected:
                raise
            except Exception as exc:  # pool timeout, database down
                LOG.warning("frame from user %s failed: %s", client.user_id, exc)
                self._error(client, "unavailable", "temporarily unavailable; retry")
