"""The producing side: ``Stream`` (what a handler writes to) and the group append.

Every chunk a replica's streams send goes into one ``GroupAppender`` queue; its
flush loop writes everything queued in the last ``window`` seconds (or up to a
size) with ONE ``stream_append_many`` statement: one transaction, one COMMIT,
one wake-up for many chunks of many streams -- group commit. ``send`` returns as
soon as the chunk is queued (it waits only while its stream has too many chunks
unwritten), so a producer is never paced by the round trip; ``flush`` waits for
the chunks to be committed.

A stream that is stopped (``stream_stop``, from any replica, psql, a client's
Stop button) takes no chunk after: the group append reports it for that stream
alone and the next ``send`` raises ``StreamStopped``, which the ``async with``
block swallows (the handler's answer simply ends). ``Stream.stopped`` is set
before that, as soon as the producer hears of it (producer.StopWatch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID

import psycopg

LOG = logging.getLogger("switchboard.streams")

CHUNK_MAX_BYTES = 65536        # stream_append's bound, checked here first for a clear error
PENDING_PER_STREAM = 2000      # chunks of one stream queued but not yet written: send() waits
BATCH_MAX_CHUNKS = 5000        # one group append at most (stream_append_many allows 10000)
BATCH_MAX_BYTES = 4 * 1024 * 1024

AppendMany = Callable[[Sequence[UUID], Sequence[str]], Awaitable[list[tuple[Any, ...]]]]


class StreamError(Exception):
    """The stream can take no more chunks: closed, expired, or a group append failed."""


class StreamStopped(StreamError):
    """Someone stopped the stream (stream_stop): stop producing. ``async with`` ends quietly."""


class GroupAppender:
    """One queue for every stream of this process; one statement per flush."""

    def __init__(self, append_many: AppendMany, window: float = 0.002) -> None:
        self.append_many = append_many
        self.window = window
        self._queue: list[tuple[Stream, str]] = []
        self._bytes = 0
        self._have = asyncio.Event()
        self._flushed = asyncio.Condition()
        self.flushes = 0
        self.chunks = 0

    def put(self, s: Stream, chunk: str) -> None:
        self._queue.append((s, chunk))
        self._bytes += len(chunk)
        self._have.set()

    async def run(self) -> None:
        while True:
            await self._have.wait()
            if len(self._queue) < BATCH_MAX_CHUNKS and self._bytes < BATCH_MAX_BYTES:
                await asyncio.sleep(self.window)    # let the other producers' chunks join
            await self._flush_once()

    async def _flush_once(self) -> None:
        batch: list[tuple[Stream, str]] = []
        size = 0
        for s, chunk in self._queue:
            if len(batch) >= BATCH_MAX_CHUNKS or (batch and size + len(chunk) > BATCH_MAX_BYTES):
                break
            batch.append((s, chunk))
            size += len(chunk)
        del self._queue[:len(batch)]
        self._bytes -= size
        if not self._queue:
            self._have.clear()
        if batch:
            await self._write(batch)
        async with self._flushed:
            self._flushed.notify_all()

    async def _write(self, batch: list[tuple[Stream, str]]) -> None:
        streams = {id(s): s for s, _ in batch}
        try:
            rows = await self.append_many([s.id for s, _ in batch if s.id is not None], [c for _, c in batch])
        except Exception as exc:   # the statement failed: nothing of the batch was written
            LOG.warning("group append of %d chunks failed: %s", len(batch), exc)
            for s in streams.values():
                s._failed(StreamError(f"stream {s.id}: its chunks could not be written ({exc})"), len(batch))
            return
        self.flushes += 1
        self.chunks += len(batch)
        by_id = {r[0]: r for r in rows}
        for s in streams.values():
            _, last_seq, status, accepted = by_id.get(s.id, (s.id, s.seq, "unknown", 0))
            s._written(int(last_seq), str(status), int(accepted))

    async def wait_flushed(self, predicate: Callable[[], bool]) -> None:
        async with self._flushed:
            await self._flushed.wait_for(predicate)


class Stream:
    """One stream being written. ``id`` (send it to the client), ``seq`` (the last chunk
    written), ``stopped`` (someone stopped it), ``final`` (set it: the payload of the one
    durable stream.end event). Use as ``async with producer.stream(...) as s``."""

    def __init__(self, producer: Any, user_id: UUID, kind: str, *, meta: dict[str, Any] | None = None,
                 room: str | None = None, lease_s: float = 30.0, lifetime_s: float = 3600.0) -> None:
        self._producer = producer
        self.user_id = user_id
        self.kind = kind
        self.meta = meta
        self.room = room
        self.lease_s = lease_s
        self.lifetime_s = lifetime_s
        self.id: UUID | None = None
        self.seq = 0               # the last seq written (committed)
        self.final: Any = None
        self.stopped = False
        self.closed = False
        self._pending = 0          # queued, not yet written
        self._error: StreamError | None = None
        self.last_write = time.monotonic()

    # -- the producer's side ------------------------------------------------------------------------
    async def open(self) -> Stream:
        self.id = await self._producer.db.stream_open(self.user_id, self.kind, self.meta, self.room,
                                                      self.lease_s, self.lifetime_s)
        self._producer._opened(self)
        return self

    async def send(self, chunk: str) -> None:
        """Queue one chunk (text up to 64 KiB). Raises StreamStopped once the stream was
        stopped, StreamError once it can take no more (closed, expired, a failed write)."""
        if not isinstance(chunk, str):
            raise TypeError(f"a chunk is a str, not {type(chunk).__name__}")
        if len(chunk) > CHUNK_MAX_BYTES // 4 and len(chunk.encode()) > CHUNK_MAX_BYTES:
            raise ValueError(f"a chunk is at most {CHUNK_MAX_BYTES} bytes; split it")
        self._check()
        if self._pending >= PENDING_PER_STREAM:
            await self._producer.appender.wait_flushed(lambda: self._pending < PENDING_PER_STREAM or self._error)
            self._check()
        self._pending += 1
        self._producer.appender.put(self, chunk)

    async def flush(self) -> int:
        """Wait until every chunk sent so far is written; returns the last seq."""
        if self._pending:
            await self._producer.appender.wait_flushed(lambda: self._pending == 0)
        self._check()
        return self.seq

    async def close(self, status: str = "done", final: Any = None) -> int | None:
        """End the stream (done / error / stopped) with ``final`` (default: ``self.final``).
        Returns the stream.end event's id, None if it was already closed."""
        if self.closed or self.id is None:
            return None
        try:
            try:
                await self.flush()
            except StreamStopped:
                status = "stopped"
            except StreamError:
                status = "error"
            finally:
                self.closed = True
            if self.stopped:
                status = "stopped"
            try:
                event: int = await self._producer.db.stream_close(self.id, status,
                                                                  self.final if final is None else final)
                return event
            except psycopg.errors.DataException as exc:
                # A final the database refuses (too big, too deep): the stream still ends -- as
                # error, saying why -- rather than stay open until its lease runs out.
                reason = (exc.diag.message_primary or str(exc))[:500]
                await self._producer.db.stream_close(self.id, "error", {"error": f"final refused: {reason}"})
                raise StreamError(f"stream {self.id}: its final payload was refused ({reason}); "
                                  "it ended as error") from exc
        finally:
            self._producer._closed(self)

    def _check(self) -> None:
        if self.id is None:
            raise StreamError("the stream is not open yet: use `async with producer.stream(...) as s`")
        if self._error is not None:
            raise self._error
        if self.stopped:
            raise StreamStopped(f"stream {self.id} was stopped")
        if self.closed:
            raise StreamError(f"stream {self.id} is closed")

    # -- the appender's and the stop watch's side ---------------------------------------------------
    def _written(self, last_seq: int, status: str, accepted: int) -> None:
        self.last_write = time.monotonic()
        self.seq = max(self.seq, last_seq)
        if status == "open":
            self._pending -= accepted
            return
        self._pending = 0
        if status == "stopped":
            self.stopped = True
        elif self._error is None:
            self._error = StreamError(f"stream {self.id} is {status}: it takes no more chunks")

    def _failed(self, exc: StreamError, _n: int) -> None:
        self._pending = 0
        if self._error is None:
            self._error = exc

    def _stop(self) -> None:
        self.stopped = True

    async def __aenter__(self) -> Stream:
        if self.id is None:
            await self.open()
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if et is None:
            await self.close("stopped" if self.stopped else "done")
            return False
        if isinstance(exc, StreamStopped) or self.stopped and isinstance(exc, StreamError):
            await self.close("stopped")
            return True          # the answer ends where it was stopped: not an error
        if isinstance(exc, asyncio.CancelledError):
            await asyncio.shield(self._close_quietly("error", {"error": "cancelled"}))
            return False
        await self._close_quietly("error", {"error": f"{type(exc).__name__}: {exc}"[:1000]})
        return False

    async def _close_quietly(self, status: str, final: Any) -> None:
        try:
            await self.close(status, final)
        except Exception as exc:   # the handler's own exception is what matters
            LOG.warning("stream %s: could not close it as %s: %s", self.id, status, exc)
