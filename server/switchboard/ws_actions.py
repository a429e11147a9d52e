"""What a WebSocket client may ask for after the handshake, one method per action.

join / leave (membership checked in SQL), resume (cursor or after), publish (typing
to a joined room, tool.result.<id> answers: nothing else), subscribe / unsubscribe
(the admin run feed), presence.subscribe / presence.track (pushed presence of a
joined room: presence.py), ping. Every field is checked with bounds; a bad one gets an
error frame naming the problem, never an exception out of the socket's loop.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from . import bounded, cursor
from .bounded import BadInput
from .config import Config
from .cursor import Position
from .db import Database
from .presence import Presence, check_meta
from .resume import resume
from .runfeed import FEEDS, RunFeed
from .sockets import Client, Registry, frame
from .streams.actions import StreamActions

# A room's naming rule lives in SQL (add_room_member); a name that breaks it can
# never be a member, so is_room_member() refuses it. Here only a bound on what an
# untrusted client may make us send to the database.
ROOM_MAX = 128
FEED_MAX = 32                                   # a feed name's length bound (FEEDS lists the real ones)
TOOL_RESULT_RE = re.compile(r"^tool\.result\.([0-9a-fA-F-]{36})$")
ALLOWED = ["join", "leave", "resume", "publish", "ping", "subscribe", "unsubscribe",
           "stream.subscribe", "stream.unsubscribe", "stream.stop", "presence.subscribe", "presence.track"]


# Error frames of the action being handled go here instead of to the socket when set: an
# SSE client's action is a POST, answered with its error (sse_actions.py). Per task.
_CAPTURED: ContextVar[list[dict[str, Any]] | None] = ContextVar("switchboard_action_errors", default=None)


def error(client: Client, code: str, message: str, **extra: Any) -> None:
    send_error(client, frame("error", {"code": code, "message": message, **extra}))


def send_error(client: Client, f: dict[str, Any]) -> None:
    box = _CAPTURED.get()
    if box is not None:
        box.append(f)
    else:
        client.offer(f)


@contextlib.contextmanager
def captured_errors() -> Iterator[list[dict[str, Any]]]:
    """Within the block, this task's action error frames are collected, not sent."""
    box: list[dict[str, Any]] = []
    token = _CAPTURED.set(box)
    try:
        yield box
    finally:
        _CAPTURED.reset(token)


class Actions:
    def __init__(self, db: Database, registry: Registry, config: Config, feed: RunFeed | None,
                 rejections: bounded.Rejections, streams: StreamActions | None = None,
                 presence: Presence | None = None) -> None:
        self.db = db
        self.presence = presence
        self.streams = streams
        self.registry = registry
        self.cfg = config
        self.feed = feed
        self.rejections = rejections
        self._table: dict[str, Callable[[Client, dict[str, Any]], Awaitable[None]]] = {
            "ping": self._ping, "join": self._join, "leave": self._leave, "resume": self._resume,
            "publish": self._publish, "subscribe": self._feed, "unsubscribe": self._feed,
        }
        if presence is not None:
            self._table.update({"presence.subscribe": self._presence, "presence.track": self._presence})
        if streams is not None:
            self._table.update({"stream.subscribe": streams.subscribe, "stream.unsubscribe": streams.unsubscribe,
                                "stream.stop": streams.stop})

    async def handle(self, client: Client, msg: dict[str, Any]) -> None:
        """Act on one client frame (a JSON object): its action, or publish for {"event"}."""
        action = msg.get("action")
        if action is None and "event" in msg:
            action = "publish"
        fn = self._table.get(action) if isinstance(action, str) else None
        if fn is None:
            error(client, "unknown_action", f"unknown action {str(action)[:50]!r}", allowed=ALLOWED)
            return
        await fn(client, msg)

    async def _ping(self, client: Client, msg: dict[str, Any]) -> None:
        client.offer(frame("pong", {}))

    async def _join(self, client: Client, msg: dict[str, Any]) -> None:
        room = msg.get("room")
        if not isinstance(room, str) or not 0 < len(room) <= ROOM_MAX or "\x00" in room:
            error(client, "bad_room", "room must be a room name", action="join")
            return
        if not await self.db.is_room_member(room, client.user_id):
            error(client, "forbidden", f"not a member of room {room}", action="join", room=room)
            return
        self.registry.join(client, room)
        client.offer(frame("joined", {}, room=room))

    async def _leave(self, client: Client, msg: dict[str, Any]) -> None:
        room = msg.get("room")
        if isinstance(room, str) and room in client.rooms:
            self.registry.leave(client, room)
            if self.presence is not None:
                await self.presence.untrack(client, room)
        client.offer(frame("left", {}, room=room if isinstance(room, str) else None))

    async def _presence(self, client: Client, msg: dict[str, Any]) -> None:
        """presence.subscribe {room}: this socket gets the room's presence.state, then its
        presence.diff frames; presence.track {room, meta}: the same, and its connection shows
        ``meta`` there. Only in a room the socket joined (a member: the join checked)."""
        if self.presence is None:
            return
        action = msg["action"]
        room = msg.get("room")
        if not isinstance(room, str) or not 0 < len(room) <= ROOM_MAX:
            error(client, "bad_room", "room must be a room name", action=action)
            return
        if room not in client.rooms:
            error(client, "forbidden", "presence of a room you have joined only", action=action, room=room)
            return
        if action == "presence.subscribe":
            self.presence.subscribe(client, room)
            return
        meta = msg.get("meta", {})
        why = check_meta(meta)
        if why is not None:
            self.rejections.record("ws", "bad_meta", why)
            error(client, "bad_meta", why, action=action, room=room)
            return
        await self.presence.track(client, room, meta)

    async def _resume(self, client: Client, msg: dict[str, Any]) -> None:
        after: Position | int
        ahead: tuple[int, ...] = ()
        try:
            if "cursor" in msg:
                after, ahead = cursor.decode_ahead(msg["cursor"])
            else:
                after = bounded.bigint(msg.get("after"), name="after", minimum=0)
                if not isinstance(msg.get("after"), int):
                    raise BadInput("bad_number", "after must be an integer")
        except BadInput as exc:
            self.rejections.record("ws", exc.reason, str(exc))
            error(client, "bad_resume", "send the cursor of the last event frame processed "
                                        "({\"cursor\": \"...\"}; or after: the last event id)")
            return
        await resume(self.db, client, after, self.cfg.ws_replay_stall_seconds, ahead)

    async def _feed(self, client: Client, msg: dict[str, Any]) -> None:
        action = msg["action"]
        feed = msg.get("feed")
        if not isinstance(feed, str) or not 0 < len(feed) <= FEED_MAX:
            error(client, "bad_feed", "feed must be a feed name", action=action, allowed=list(FEEDS))
            return
        if action == "subscribe":
            err = self.subscribe(client, feed)
            if err is not None:
                send_error(client, err)
                return
        elif self.feed is not None:
            self.feed.unsubscribe(client)
        client.offer(frame("subscribed", {"feeds": self.feed.feeds_of(client) if self.feed else []}))

    def subscribe(self, client: Client, feed: str) -> dict[str, Any] | None:
        """Subscribe to a feed: admins only (the runs feed shows every run). The error
        frame to send, or None."""
        if feed not in FEEDS or self.feed is None:
            return frame("error", {"code": "bad_feed", "message": f"no feed {feed[:FEED_MAX]!r}",
                                   "action": "subscribe", "allowed": list(FEEDS)})
        if not self.feed.subscribe(client):
            return frame("error", {"code": "forbidden", "message": f"the {feed} feed is for admins",
                                   "action": "subscribe"})
        return None

    async def _publish(self, client: Client, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        payload = msg.get("payload", {})
        if not isinstance(event, str):
            error(client, "bad_event", "event must be a string")
            return
        if event == "typing":
            room = msg.get("room")
            if not isinstance(room, str) or room not in client.rooms:
                error(client, "forbidden", "typing goes to a room you have joined", event=event)
                return
            await self.db.publish_client_event(client.user_id, room, "typing", payload)
            return
        m = TOOL_RESULT_RE.match(event)
        if m:
            try:
                call_id = uuid.UUID(m.group(1))
            except ValueError:
                error(client, "bad_event", "bad tool call id")
                return
            ok = await self.db.tool_call_answer(call_id, client.user_id, payload)
            if not ok:
                error(client, "unknown_call", "no pending tool call with that id for you", event=event)
            return
        error(client, "forbidden_event", "clients may only send typing and tool.result.<id>",
                    event=event[:100])
