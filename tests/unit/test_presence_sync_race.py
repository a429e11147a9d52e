"""presence.Presence.sync: the heartbeat re-asserts presence_meta from a snapshot of what
this replica's sockets track. A track or untrack that lands while that sync waits (for a
pool connection, say) must not be undone by it: found by tests/test_presence_push.py, where
200 sockets closing during a heartbeat left 3 stray rows until the next one."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from switchboard.presence import Presence
from switchboard.sockets import Client, Registry

ALICE, BOB = uuid.UUID(int=1), uuid.UUID(int=2)


class Table:
    """presence_meta as the two functions write it; the sync lands when released."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str], Any] = {}
        self.release = asyncio.Event()

    async def presence_track(self, replica_id: str, conn: int, user_id: uuid.UUID, room: str | None,
                             meta: Any) -> None:
        if meta is None:
            for key in [k for k in self.rows if k[0] == conn and room in (None, k[1])]:
                del self.rows[key]
        else:
            assert room is not None
            self.rows[(conn, room)] = meta

    async def presence_meta_sync(self, replica_id: str, tracked: list[dict[str, Any]]) -> None:
        await self.release.wait()
        self.rows = {(r["conn"], r["room"]): r["meta"] for r in tracked}


def client(user: uuid.UUID, room: str) -> Client:
    c = Client(user, str(user), "member", 100, (0, 0), lambda c: None)
    c.rooms.add(room)
    return c


def test_an_untrack_during_a_sync_stays_untracked() -> None:
    async def run() -> dict[tuple[int, str], Any]:
        db = Table()
        p = Presence(db, Registry(), "r1", 1.0)   # type: ignore[arg-type]
        a, b = client(ALICE, "lobby"), client(BOB, "lobby")
        await p.track(a, "lobby", {"n": 1})
        await p.track(b, "lobby", {"n": 2})
        sync = asyncio.create_task(p.sync())      # its snapshot holds both
        await asyncio.sleep(0)
        await p.drop(a)                           # a closes: its row goes at once
        assert (a.cid, "lobby") not in db.rows
        db.release.set()                          # the sync lands after, from its snapshot
        await sync
        return db.rows

    rows = asyncio.run(run())
    assert list(rows.values()) == [{"n": 2}]


def test_a_track_during_a_sync_stays_tracked() -> None:
    async def run() -> tuple[dict[tuple[int, str], Any], int]:
        db = Table()
        p = Presence(db, Registry(), "r1", 1.0)   # type: ignore[arg-type]
        a = client(ALICE, "lobby")
        sync = asyncio.create_task(p.sync())      # its snapshot is empty
        await asyncio.sleep(0)
        await p.track(a, "lobby", {"status": "here"})
        db.release.set()                          # the sync lands after: it deletes a's row
        await sync
        return db.rows, a.cid

    rows, cid = asyncio.run(run())
    assert rows == {(cid, "lobby"): {"status": "here"}}


def test_a_quiet_sync_writes_nothing_more() -> None:
    class Counting(Table):
        tracks = syncs = 0

        async def presence_track(self, *a: Any) -> None:
            self.tracks += 1
            await super().presence_track(*a)

        async def presence_meta_sync(self, *a: Any) -> None:
            self.syncs += 1
            await super().presence_meta_sync(*a)

    async def run() -> tuple[int, int]:
        db = Counting()
        db.release.set()
        p = Presence(db, Registry(), "r1", 1.0)   # type: ignore[arg-type]
        await p.track(client(ALICE, "lobby"), "lobby", {"n": 1})
        await p.sync()
        await p.sync()
        return db.tracks, db.syncs

    assert asyncio.run(run()) == (1, 2)           # the track itself; one statement per sync
