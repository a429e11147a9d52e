"""The reading side: every subscription of this replica to a stream, fed by one read.

A wake-up (channel switchboard_stream) names stream ids, or '*'. It is a hint: an
id counts only if a local subscription follows that stream, and then the hub
reads the rows itself (stream_read_many: each stream's state and its chunks after
``hub_pos``, in one statement for all the streams hinted) and delivers what it
read. So a forged NOTIFY costs at most one read that returns nothing new.

Each subscription has its own position (the last seq its consumer was given). A
*live* subscription takes the hub's rows without waiting: a frame is queued only
if its consumer has room, and a subscription whose consumer is full, or that
would see a gap, leaves the live set and catches up on its own task from its own
position (``_catch_up``: reads from the pool, waits for room in its consumer's
queue, at that consumer's pace), then joins again. A slow reader of one stream
never delays a frame of any other. A subscription ends with the stream's end
frame (status, last_seq, final) once every chunk up to last_seq was given.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol
from uuid import UUID

from ..sockets import encode, frame

LOG = logging.getLogger("switchboard.streams")

READ_ROWS = 1000               # chunk rows per stream and read
FRAME_BYTES = 256 * 1024       # a stream.chunks frame carries at most this much text (plus one chunk)
HINT_IDS_MAX = 256             # ids read from one wake-up payload (8000 bytes hold ~210)
POLL_S = 5.0                   # a read of every followed stream this often, in case a wake-up was lost

ReadMany = Callable[[Sequence[UUID], Sequence[int], int], Awaitable[list[tuple[Any, ...]]]]


class Sink(Protocol):
    """Where a subscription's frames go: a WebSocket's send queue, an SSE response."""

    def push(self, text: str) -> bool:
        """Queue without waiting; False when there is no room (the subscription catches up)."""

    async def send(self, text: str) -> bool:
        """Queue, waiting for room; False when the consumer is gone."""


class Subscription:
    __slots__ = ("sid", "stream", "pos", "sink", "live", "task", "owner")
    _ids = itertools.count(1)

    def __init__(self, stream: UUID, after: int, sink: Sink, owner: object = None) -> None:
        self.sid = next(self._ids)
        self.stream = stream
        self.pos = after
        self.sink = sink
        self.live = False
        self.task: asyncio.Task[None] | None = None
        self.owner = owner


def chunk_frames(stream: UUID, first: int, chunks: Sequence[str]) -> list[tuple[str, int]]:
    """stream.chunks frames for consecutive chunks from seq ``first``, split by size: (text,
    the seq of its last chunk) each."""
    out: list[tuple[str, int]] = []
    start, size = 0, 0
    for i, c in enumerate(chunks):
        if i > start and size + len(c) > FRAME_BYTES:
            out.append(_chunks_frame(stream, first + start, chunks[start:i]))
            start, size = i, 0
        size += len(c)
    if start < len(chunks):
        out.append(_chunks_frame(stream, first + start, chunks[start:]))
    return out


def _chunks_frame(stream: UUID, seq: int, chunks: Sequence[str]) -> tuple[str, int]:
    return (encode(frame("stream.chunks", {"stream": str(stream), "seq": seq, "chunks": list(chunks)})),
            seq + len(chunks) - 1)


def end_frame(stream: UUID, status: str, last_seq: int, final: Any) -> str:
    return encode(frame("stream.end", {"stream": str(stream), "status": status, "last_seq": last_seq,
                                       "final": final}))


def gone_frame(stream: UUID) -> str:
    return encode(frame("error", {"code": "stream_not_found", "stream": str(stream),
                                  "message": f"stream {stream} no longer exists"}))


class Read(NamedTuple):
    """One stream as stream_read_many returns it: its state, and its chunks from seq
    ``first`` (consecutive: a stream's log has no gaps)."""
    status: str
    last_seq: int
    final: Any
    end_event: int | None     # the durable stream.end event: a reader's end waits for it
    first: int
    chunks: list[str]


def split_rows(rows: list[tuple[Any, ...]]) -> dict[UUID, Read]:
    """stream_read_many rows (stream_id, status, last_seq, final, end_event, first_seq, chunks) by stream."""
    return {r[0]: Read(r[1], int(r[2]), r[3], r[4], int(r[5]), r[6]) for r in rows}


class StreamHub:
    def __init__(self, read_many: ReadMany, on_error: Callable[[str], None] | None = None,
                 on_behind: Callable[[], None] | None = None) -> None:
        self.read_many = read_many           # the pool's read, for catch-ups
        self.subs: dict[UUID, dict[int, Subscription]] = {}
        self.hub_pos: dict[UUID, int] = {}
        self.dirty: set[UUID] = set()
        self.all_dirty = False
        self.wake = asyncio.Event()
        self.on_error = on_error or (lambda what: None)
        self.on_behind = on_behind or (lambda: None)
        self.delivered = 0

    # -- subscriptions --------------------------------------------------------------------------------
    def subscribe(self, sub: Subscription) -> None:
        self.subs.setdefault(sub.stream, {})[sub.sid] = sub
        self._behind(sub)

    def unsubscribe(self, sub: Subscription) -> None:
        if sub.task is not None and sub.task is not asyncio.current_task():
            sub.task.cancel()
        subs = self.subs.get(sub.stream)
        if subs is not None:
            subs.pop(sub.sid, None)
            if not subs:
                del self.subs[sub.stream]
                self.hub_pos.pop(sub.stream, None)
                self.dirty.discard(sub.stream)

    def count(self) -> int:
        return sum(len(s) for s in self.subs.values())

    # -- wake-ups -------------------------------------------------------------------------------------
    def hint(self, payload: str) -> None:
        """A switchboard_stream notification (untrusted: only ids we follow count)."""
        if payload == "*":
            self.all_dirty = True
            self.wake.set()
            return
        for part in payload.split(",", HINT_IDS_MAX)[:HINT_IDS_MAX]:
            try:
                sid = UUID(part) if len(part) == 36 else None
            except ValueError:
                continue
            if sid is not None and sid in self.subs:
                self.dirty.add(sid)
                self.wake.set()

    def reconnected(self) -> None:
        self.all_dirty = True
        self.wake.set()

    # -- the shared read --------------------------------------------------------------------------------
    async def run(self, read_on: ReadMany) -> None:
        """The read loop (on the listener's reader connection; returns only by raising)."""
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), POLL_S)
            except asyncio.TimeoutError:
                self.all_dirty = True
            self.wake.clear()
            # Only streams someone follows live: a subscription catching up reads for itself.
            ids = [s for s in (list(self.subs) if self.all_dirty else self.dirty) if self._followed_live(s)]
            self.dirty.clear()
            self.all_dirty = False
            for i in range(0, len(ids), 1000):
                part = ids[i:i + 1000]
                reads = split_rows(await read_on(part, [self.hub_pos.get(s, 0) for s in part], READ_ROWS))
                for stream, rd in reads.items():
                    self._deliver(stream, rd)
                for stream in set(part) - reads.keys():        # no row: the stream is gone
                    self._gone(stream)

    def _followed_live(self, stream: UUID) -> bool:
        return any(sub.live for sub in self.subs.get(stream, {}).values())

    def _deliver(self, stream: UUID, rd: Read) -> None:
        subs = self.subs.get(stream)
        if not subs:
            return
        if rd.chunks:
            self._give(stream, subs, rd.first, rd.chunks)
            self.hub_pos[stream] = max(self.hub_pos.get(stream, 0), rd.first + len(rd.chunks) - 1)
            if len(rd.chunks) >= READ_ROWS:
                self.dirty.add(stream)
                self.wake.set()
                return
        last_seq = rd.last_seq
        if rd.end_event is not None:          # ended, and its final written (a stop waits for the producer's)
            text = end_frame(stream, rd.status, last_seq, rd.final)
            for sub in list(subs.values()):
                if sub.live and sub.pos >= last_seq:
                    if sub.sink.push(text):
                        self.unsubscribe(sub)
                    else:
                        self._behind(sub)         # its catch-up sends the end, waiting for room

    def _give(self, stream: UUID, subs: dict[int, Subscription], first: int, chunks: list[str]) -> None:
        top = first + len(chunks) - 1
        encoded: dict[int, list[tuple[str, int]]] = {}   # frames per starting seq: encoded once for all at it
        for sub in list(subs.values()):
            if not sub.live or sub.pos >= top:
                continue
            start = sub.pos + 1
            if start < first:                     # a gap: it catches up from the database
                self._behind(sub)
                continue
            texts = encoded.get(start)
            if texts is None:
                texts = encoded[start] = chunk_frames(stream, start, chunks[start - first:])
            for text, last in texts:
                if not sub.sink.push(text):
                    self._behind(sub)             # from sub.pos: what was queued is not sent again
                    break
                self.delivered += last - sub.pos
                sub.pos = last

    def _gone(self, stream: UUID) -> None:
        for sub in list(self.subs.get(stream, {}).values()):
            if sub.live:
                if sub.sink.push(gone_frame(stream)):
                    self.unsubscribe(sub)
                else:
                    self._behind(sub)

    # -- one subscription on its own ----------------------------------------------------------------------
    def _behind(self, sub: Subscription) -> None:
        """Out of the live set; its own task catches it up (one task per subscription)."""
        sub.live = False
        if sub.task is None or sub.task.done():
            self.on_behind()
            sub.task = asyncio.get_running_loop().create_task(self._catch_up(sub), name="stream-catch-up")

    async def _catch_up(self, sub: Subscription) -> None:
        try:
            while sub.sid in self.subs.get(sub.stream, {}):
                rd = split_rows(await self.read_many([sub.stream], [sub.pos], READ_ROWS)).get(sub.stream)
                if rd is None:
                    await sub.sink.send(gone_frame(sub.stream))
                    break
                chunks = rd.chunks
                if chunks:
                    for text, last in chunk_frames(sub.stream, rd.first, chunks):
                        if not await sub.sink.send(text):
                            self.unsubscribe(sub)
                            return
                        self.delivered += last - sub.pos
                        sub.pos = last
                    if len(chunks) >= READ_ROWS:
                        continue
                if rd.end_event is not None and sub.pos >= rd.last_seq:
                    await sub.sink.send(end_frame(sub.stream, rd.status, rd.last_seq, rd.final))
                    break
                if self.hub_pos.get(sub.stream, 0) > sub.pos:
                    continue                      # the hub delivered past us while we read
                if not any(s.live for s in self.subs.get(sub.stream, {}).values()):
                    self.hub_pos[sub.stream] = sub.pos   # (never past a live one's position)
                sub.live = True
                return
            self.unsubscribe(sub)
        except asyncio.CancelledError:
            raise
        except Exception as exc:                  # the database is away: the consumer resumes later
            LOG.warning("stream %s: catch-up failed: %s", sub.stream, exc)
            self.on_error("catch_up")
            await sub.sink.send(encode(frame("error", {"code": "stream_unavailable", "stream": str(sub.stream),
                                                       "message": "the stream could not be read; subscribe again"})))
            self.unsubscribe(sub)
