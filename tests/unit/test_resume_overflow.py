"""A resume whose live buffer overflows while it replays loses nothing.

The buffer drops its stored events when it fills (sockets.Client._buffer) and the
replay reads again. It used to send what the buffer held after the drop first,
which moved the socket's position past the dropped events, so the read again
started after them: 100 live events lost in tests/test_long_absence.py, now and then.
Here the overflow is made to happen on purpose, during the first page."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone
from typing import Any

from switchboard.data.history import HistoryReads
from switchboard.resume import resume
from switchboard.rows import Event
from switchboard.sockets import Client

USER = uuid.UUID(int=7)


class Db:
    """events_since_v2 / event_window over a list; live events commit (and reach the
    socket live, buffered) while the first page is being read."""

    def __init__(self, client: Client, missed: int, live: int) -> None:
        self.client = client
        self.history = HistoryReads(self, None)   # no read replica: every read here
        self.events = [self._ev(1, i) for i in range(1, missed + 1)]
        self.live = live
        self.tick = 1
        self.pages = 0

    @staticmethod
    def _ev(tick: int, eid: int) -> Event:
        return Event(tick, eid, None, "e", {"n": eid}, datetime.now(timezone.utc))

    async def event_window(self) -> dict[str, Any]:
        return {"first_tick": 0, "last_tick": self.tick, "reaped_through": 0}

    async def event_batch(self, eid: int) -> int:
        return 1

    async def events_since_v2(self, user: uuid.UUID, after: tuple[int, int], rooms: list[str],
                              through: int | None, limit: int) -> list[Event]:
        self.pages += 1
        if self.pages == 1:
            # Live events commit, each in a tick of its own, and the relay offers them
            # to the resuming socket: more than its buffer holds.
            base = len(self.events)
            for k in range(1, self.live + 1):
                self.tick += 1
                e = self._ev(self.tick, base + k)
                self.events.append(e)
                self.client.offer(json.loads(json.dumps({"event": "e", "id": e.id, "payload": e.payload})),
                                  pos=e.position)
        out = [e for e in self.events if e.position > after and (through is None or e.tick <= through)]
        return out[:limit]


def test_an_overflowing_live_buffer_during_a_resume_loses_nothing() -> None:
    async def main() -> list[int]:
        client = Client(USER, "u", "member", 50, (0, 0), lambda c: None)
        db = Db(client, missed=300, live=120)   # 120 live frames into a buffer of 50
        got: list[int] = []

        async def drain() -> None:
            while True:
                while not client.queue.empty():
                    text = client.queue.get_nowait()
                    if text:
                        f = json.loads(text)
                        if f.get("id") is not None:
                            got.append(f["id"])
                await asyncio.sleep(0)

        d = asyncio.create_task(drain())
        await resume(db, client, (0, 0), stall=5.0, quiet=True)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        d.cancel()
        while not client.queue.empty():
            text = client.queue.get_nowait()
            if text and json.loads(text).get("id") is not None:
                got.append(json.loads(text)["id"])
        return got

    got = asyncio.run(main())
    assert len(got) == len(set(got)), "duplicates"
    assert got == sorted(got), "out of order"
    assert got == list(range(1, 421)), sorted(set(range(1, 421)) - set(got))[:10]
