"""This replica's sockets: the local index (by user, by room) and what a socket is sent.

A ``Client`` is one accepted WebSocket as the relay and the resume logic see it:
its user, joined rooms, bounded send queue and de-duplication state. It knows
nothing of Falcon: the WebSocket handler declares how the socket is closed by
passing ``close_hook`` (an async ``(code, reason)`` callable), and
``request_close`` runs it. The ``Registry`` indexes the clients of this process
by user and by room; the relay delivers through it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from . import cursor
from .rows import Event

_ids = itertools.count(1)

CloseHook = Callable[[int, str], Coroutine[Any, Any, None]]


def encode(f: dict[str, Any]) -> str:
    return json.dumps(f, separators=(",", ":"), default=str)


def with_cursor(text: str, cur: str) -> str:
    """``text`` (an encoded frame without a cursor) with ``"cursor": cur`` appended: one
    frame encoded once for many sockets, each with its own cursor (the live path's
    cursors differ per socket). Cursors are [A-Za-z0-9._~-]: nothing to escape."""
    return f'{text[:-1]},"cursor":"{cur}"}}'


def frame(event: str, payload: Any = None, *, id: int | None = None, room: str | None = None,
          ts: int | None = None, **extra: Any) -> dict[str, Any]:
    f = {"id": id, "event": event, "room": room, "payload": {} if payload is None else payload,
         "ts": ts if ts is not None else int(time.time() * 1000)}
    f.update(extra)
    return f


def event_frame(r: dict[str, Any], ts: int, payload: Any = None) -> tuple[tuple[int, int], dict[str, Any]]:
    """A stored event row (with its ``tick``) as (position, frame); the frame carries
    the position as its opaque ``cursor``. (The relay's live read: a dict row, whose
    payload it passes already parsed when it read it as text.)"""
    pos = (int(r["tick"]), int(r["id"]))
    return pos, frame(r["event"], r["payload"] if payload is None else payload, id=r["id"], room=r["room"], ts=ts,
                      cursor=cursor.encode(pos))


def replay_frame(e: Event) -> tuple[tuple[int, int], dict[str, Any]]:
    """A replayed event (events_since_v2) as (position, frame), stamped with its creation
    time: the same frame the relay sent live."""
    pos = e.position
    return pos, frame(e.event, e.payload, id=e.id, room=e.room, ts=int(e.created_at.timestamp() * 1000),
                      cursor=cursor.encode(pos))


class Held(NamedTuple):
    """A live frame a gated socket holds until a read covers ``need`` (relay/live.py)."""

    need: int
    eid: int
    room: str | None
    text: str


class LiveState:
    """One socket's share of the live path's merge (relay/live.py owns the rules): the
    hearing count before which everything must be read before a live frame may go out
    (set when it is registered or joins a room), and the live frames it holds meanwhile."""

    __slots__ = ("gate", "hold")
    HOLD_MAX = 64

    def __init__(self) -> None:
        self.gate = 0
        self.hold: deque[Held] = deque()


class Outbox:
    """A socket's send queue, bounded in frames AND in bytes (a frame may carry a
    1 MiB payload: a frame bound alone let 1,000 of them hold a gigabyte). The
    socket's sender task is its only reader. ``clear`` drops everything at once, so
    a socket closed for being too slow releases its memory the moment it is closed,
    not when its peer finally goes away."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: deque[str | None] = deque()
        self._ready = asyncio.Event()
        self.closed = False

    def put_nowait(self, text: str | None) -> None:
        """Queue ``text`` (None: tell the sender to stop); asyncio.QueueFull over a bound."""
        if text is not None:
            size = len(text)
            if self._items and (len(self._items) >= self.max_frames or self.bytes + size > self.max_bytes):
                raise asyncio.QueueFull
            self.bytes += size
        self._items.append(text)
        self._ready.set()

    def fits(self, size: int) -> bool:
        return not self._items or (len(self._items) < self.max_frames and self.bytes + size <= self.max_bytes)

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> str | None:
        if not self._items:
            raise asyncio.QueueEmpty
        text = self._items.popleft()
        if text is not None:
            self.bytes -= len(text)
        if not self._items:
            self._ready.clear()
        return text

    async def get(self) -> str | None:
        while not self._items:
            if self.closed:
                return None
            await self._ready.wait()
        return self.get_nowait()

    def clear(self) -> None:
        """Drop every queued frame and stop the sender (its next get() returns None)."""
        self._items.clear()
        self.bytes = 0
        self.closed = True
        self._ready.set()


class Client:
    """One accepted WebSocket: its user, joined rooms and bounded send queue.

    ``position`` is where this socket's stream stands, (tick, id) in delivery order
    (cursor.py): the highest position of a stored event queued to it. Every stored
    event frame is offered with its position and carries it as ``cursor``; a frame at
    or below ``position`` is not queued again (a catch-up or a replay that overlaps
    live delivery sends nothing twice), and ``sent_ids`` catches the rest (a resume
    action on a socket that already received live events)."""

    SENT_IDS_MAX = 20000
    QUEUE_BYTES = 16 * 1024 * 1024   # default byte bound of the send queue

    def __init__(self, user_id: uuid.UUID, username: str, role: str, queue_size: int,
                 position: tuple[int, int], on_overflow: Callable[["Client"], None],
                 close_hook: CloseHook | None = None, queue_bytes: int | None = None) -> None:
        self.cid = next(_ids)
        self.user_id = user_id
        self.username = username
        self.role = role
        self.rooms: set[str] = set()
        self.queue = Outbox(queue_size, queue_bytes or self.QUEUE_BYTES)
        self.queue_size = queue_size
        self.sent_ids: OrderedDict[int, None] = OrderedDict()
        self.position = position
        # Ids sent live ahead of ``position`` (in its cursor until a read confirms them),
        # and the socket's share of the live path's merge (relay/live.py: gate, held frames).
        self.ahead: list[int] = []
        self.live = LiveState()
        self.resuming = False
        self.refetch = False          # live events were dropped from the buffer: fetch again
        self.buffer: list[tuple[tuple[int, int] | None, dict[str, Any]]] = []
        self.closing: int | None = None
        self.epoch = 0                # the user's token epoch when the socket was accepted
        self.session_id: uuid.UUID | None = None   # its login session (None: a pre-session token)
        self.session_expires: float | None = None  # until when that session is known to live
        self.close_task: asyncio.Task[Any] | None = None
        self.resume_task: asyncio.Task[Any] | None = None   # a catch-up it does on its own
        self.resume_lock = asyncio.Lock()                    # one resume at a time
        self.close_hook = close_hook
        self._on_overflow = on_overflow

    def __hash__(self) -> int:
        return self.cid

    def request_close(self, code: int, reason: str) -> bool:
        """Mark the socket closing with ``code`` and run the close hook. False if it was
        already closing (the first code wins)."""
        if self.closing is not None:
            return False
        self.closing = code
        self.queue.clear()        # nothing more goes out: its memory is released now
        self.buffer = []
        if self.close_hook is not None:
            # Kept on the client: the socket's handler awaits it before returning, or the
            # ASGI server's implicit close (1000) could overtake this one.
            self.close_task = asyncio.get_running_loop().create_task(self.close_hook(code, reason))
        return True

    def offer(self, f: dict[str, Any], text: str | None = None, replay: bool = False,
              pos: tuple[int, int] | None = None, behind: Callable[["Client"], None] | None = None) -> bool:
        """Queue a frame unless it is a duplicate; overflow closes the socket (1013).
        True if the frame was queued (or buffered during a resume).

        ``pos`` is a stored event's position (None for everything else). ``text`` is
        ``f`` already serialised: a room event goes to many sockets and is encoded once,
        not once per socket. ``behind``: what to do instead of closing when the queue is
        full (the relay's catch-up: the socket then catches up on its own, at its pace)."""
        if self.closing is not None:
            return False
        if self.resuming and not replay:
            return self._buffer(f, pos)
        if behind is not None and not self.queue.fits(len(text) if text is not None else 0):
            # Full during a catch-up: nothing is recorded, so its own catch-up reads this
            # event again (an ephemeral frame is best-effort and dropped).
            if pos is not None and pos > self.position:
                behind(self)
            return False
        if pos is not None:
            if pos <= self.position and not replay:
                return False              # a catch-up overlapping what was already queued
            eid = f["id"]
            if self.has(eid):
                self.confirm(eid, pos)    # if it was sent live: now its position is known
                return False
            self.sent_ids[eid] = None
            if len(self.sent_ids) > self.SENT_IDS_MAX:
                self.sent_ids.popitem(last=False)
            if pos > self.position:
                self.position = pos
            if self.ahead:
                text = with_cursor(encode({k: v for k, v in f.items() if k != "cursor"}),
                                   cursor.encode(pos, self.ahead))
        try:
            self.queue.put_nowait(text if text is not None else encode(f))
        except asyncio.QueueFull:
            self._on_overflow(self)
            return False
        return True

    def _buffer(self, f: dict[str, Any], pos: tuple[int, int] | None) -> bool:
        """A frame offered while the socket resumes: kept for the replay's flush."""
        if len(self.buffer) >= self.queue_size:
            # Every stored event in the buffer was ticked before the relay read it, so
            # the replay's next page will return it: drop them (and ephemeral frames,
            # which are best-effort) and let the replay fetch one more page.
            self.buffer = [b for b in self.buffer if b[0] is None][: self.queue_size // 2]
            self.refetch = True
        self.buffer.append((pos, f))
        # An event this socket has already (sent live, now read) is buffered only so
        # the replay's flush can place it (confirm); it is not a frame to send.
        return pos is None or not self.has(f["id"])

    def has(self, eid: int) -> bool:
        """Whether stored event ``eid`` was queued to this socket (or its client holds it,
        named ahead in the cursor it resumed from)."""
        return eid in self.sent_ids or (bool(self.ahead) and eid in self.ahead)

    def cursor(self) -> str:
        """Where this socket's stream stands, as the cursor a client resumes from."""
        return cursor.encode(self.position, self.ahead)

    def unconfirmable(self, eid: int) -> None:
        """Event ``eid``, sent live, will not be confirmed by a read (relay/live.py): it
        leaves the cursor, so a resume from it falls back on reading it (at worst one
        repeat, never a loss)."""
        if eid in self.ahead:
            self.ahead.remove(eid)

    def confirm(self, eid: int, pos: tuple[int, int]) -> None:
        """Event ``eid``, sent live, was read at ``pos``: it leaves the cursor's ids."""
        if eid in self.ahead:
            self.ahead.remove(eid)
            if pos > self.position:
                self.position = pos

    def offer_live(self, eid: int, text: str) -> int:
        """Queue a verified live frame (``text``: encoded without a cursor) ahead of this
        socket's position. 1 sent, 0 already sent (read or replayed first), -1 refused:
        the cursor would pass cursor.MAX_LEN (the relay then delivers it by reading)."""
        if self.closing is not None or eid in self.sent_ids:
            return 0
        ahead = self.ahead + [eid]
        cur = cursor.encode(self.position, ahead)
        if len(cur) > cursor.MAX_LEN:
            return -1
        self.ahead = ahead
        self.sent_ids[eid] = None
        if len(self.sent_ids) > self.SENT_IDS_MAX:
            self.sent_ids.popitem(last=False)
        try:
            self.queue.put_nowait(with_cursor(text, cur))
        except asyncio.QueueFull:
            self._on_overflow(self)
        return 1

    async def offer_wait(self, f: dict[str, Any], timeout: float, replay: bool = False,
                         text: str | None = None, pos: tuple[int, int] | None = None) -> bool:
        """Like offer(), for replays and catch-ups: waits (up to ``timeout`` s) for room in
        the send queue instead of closing the socket, so a long replay streams at the
        client's pace. A client that does not read for ``timeout`` s is closed 1013.
        False if not sent."""
        if self.closing is not None:
            return False
        if text is None:
            text = encode(f)
        if not self.queue.fits(len(text)):
            deadline = time.monotonic() + timeout
            while not self.queue.fits(len(text)):
                if self.closing is not None:
                    return False  # type: ignore[unreachable]  # closing is set by another task while we sleep
                if time.monotonic() >= deadline:
                    self._on_overflow(self)
                    return False
                await asyncio.sleep(0.005)
        self.offer(f, text, replay=replay, pos=pos)
        return self.closing is None


class Registry:
    """Local sockets indexed by user and by room.

    ``place`` is called with a socket that is added or joins a room (the relay's live
    merge gates it: events published before may reach it only through a read), and
    ``forget`` with one that is removed (the merge drops what it kept of it)."""

    def __init__(self, place: Callable[[Client], None] | None = None,
                 forget: Callable[[Client], None] | None = None) -> None:
        self.by_user: dict[uuid.UUID, set[Client]] = defaultdict(set)
        self.by_room: dict[str, set[Client]] = defaultdict(set)
        self.count = 0
        self.place = place or (lambda c: None)
        self.forget = forget or (lambda c: None)

    def add(self, c: Client) -> int:
        self.place(c)
        self.by_user[c.user_id].add(c)
        self.count += 1
        return len(self.by_user[c.user_id])

    def remove(self, c: Client) -> int:
        self.forget(c)
        for room in list(c.rooms):
            self.leave(c, room)
        peers = self.by_user.get(c.user_id)
        if peers is not None and c in peers:
            peers.discard(c)
            self.count -= 1
            if not peers:
                del self.by_user[c.user_id]
        return len(self.by_user.get(c.user_id, ()))

    def join(self, c: Client, room: str) -> None:
        self.place(c)
        c.rooms.add(room)
        self.by_room[room].add(c)

    def leave(self, c: Client, room: str) -> None:
        c.rooms.discard(room)
        members = self.by_room.get(room)
        if members is not None:
            members.discard(c)
            if not members:
                del self.by_room[room]

    def clients(self) -> list[Client]:
        return [c for peers in self.by_user.values() for c in peers]

    def sockets_of(self, user_id: uuid.UUID) -> int:
        return len(self.by_user.get(user_id, ()))

    def targets(self, user_id: uuid.UUID | None, room: str | None) -> set[Client] | None:
        """The local sockets an event addressed to ``user_id`` or ``room`` goes to."""
        if user_id is not None:
            return self.by_user.get(user_id)
        if room is not None:
            return self.by_room.get(room)
        return None
