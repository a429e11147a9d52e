"""``Producer``: this process's streams being written, their group append, their leases
and the stop hints that concern them.

``producer.stream(user_id, kind)`` makes a ``Stream``; while it is open the producer
keeps it in ``open`` (bounded: the database allows 100 open streams per user). A
stop hint (channel switchboard_stream_stop, whose payload anyone can forge) names
a stream id: only an id of one of OUR open streams counts, and even then the
producer reads the status before it sets ``stopped``. Leases: a stream with
nothing written for a third of its lease is renewed (stream_renew), so a model
that thinks for a minute keeps its stream, and a dead replica's streams end as
error once their lease runs out (reap_streams).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Protocol
from uuid import UUID

from .producer import GroupAppender, Stream

LOG = logging.getLogger("switchboard.streams")
STOP_CHECK_MAX = 1000      # stop hints kept for the next check (forged ones cannot grow it)


class StreamStore(Protocol):
    async def stream_open(self, user_id: UUID, kind: str, meta: dict[str, Any] | None, room: str | None,
                          lease_s: float, lifetime_s: float) -> UUID: ...
    async def stream_append_many(self, ids: Any, chunks: Any) -> list[tuple[Any, ...]]: ...
    async def stream_renew(self, ids: Any) -> int: ...
    async def stream_close(self, sid: UUID, status: str, final: Any) -> int: ...
    async def stream_statuses(self, ids: Any) -> dict[UUID, str]: ...


class Producer:
    def __init__(self, db: StreamStore, window: float = 0.002) -> None:
        self.db = db
        self.appender = GroupAppender(db.stream_append_many, window)
        self.open: dict[UUID, Stream] = {}
        self._to_check: set[UUID] = set()
        self._check = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    def stream(self, user_id: UUID | str, kind: str, *, meta: dict[str, Any] | None = None,
               room: str | None = None, lease: float = 30.0, lifetime: float = 3600.0) -> Stream:
        """A stream to write: ``async with producer.stream(user, "completion") as s: await s.send(t)``."""
        uid = user_id if isinstance(user_id, UUID) else uuid.UUID(str(user_id))
        return Stream(self, uid, kind, meta=meta, room=room, lease_s=lease, lifetime_s=lifetime)

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.appender.run(), name="streams-append"),
                       loop.create_task(self._stop_checks(), name="streams-stop-check"),
                       loop.create_task(self._renewals(), name="streams-renew")]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the streams' side ------------------------------------------------------------------------------
    def _opened(self, s: Stream) -> None:
        assert s.id is not None
        self.open[s.id] = s

    def _closed(self, s: Stream) -> None:
        if s.id is not None:
            self.open.pop(s.id, None)

    # -- stop hints ---------------------------------------------------------------------------------
    def hint_stop(self, payload: str) -> None:
        """A switchboard_stream_stop notification: check the named stream if it is ours."""
        try:
            sid = UUID(payload[:64])
        except ValueError:
            return
        if sid in self.open and len(self._to_check) < STOP_CHECK_MAX:
            self._to_check.add(sid)
            self._check.set()

    def check_all(self) -> None:
        """After a LISTEN reconnect: stop hints may have been missed."""
        self._to_check.update(list(self.open)[:STOP_CHECK_MAX])
        self._check.set()

    async def _stop_checks(self) -> None:
        while True:
            await self._check.wait()
            self._check.clear()
            ids, self._to_check = list(self._to_check), set()
            try:
                statuses = await self.db.stream_statuses(ids)
            except Exception as exc:
                LOG.warning("stream stop check failed: %s", exc)
                self._to_check.update(ids)
                await asyncio.sleep(1.0)
                self._check.set()
                continue
            for sid in ids:
                s = self.open.get(sid)
                if s is not None and statuses.get(sid, "open") != "open":
                    s._stop()

    async def _renewals(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            idle = [s.id for s in self.open.values() if s.id is not None and now - s.last_write > s.lease_s / 3]
            if not idle:
                continue
            try:
                await self.db.stream_renew(idle)
                for sid in idle:
                    if (s := self.open.get(sid)) is not None:
                        s.last_write = now
            except Exception as exc:
                LOG.warning("renewing %d stream leases failed: %s", len(idle), exc)
