"""Unit tier: the stream hub against a scripted database, under random schedules.

A scripted database plays PostgreSQL (stream_read_many: a stream's state and its chunks
after a position, in one snapshot); producers append chunks and send wake-ups (some
lost, some forged, some duplicated); subscribers join at random positions, their
consumers have small queues and read at random speeds (so pushes fail, subscriptions
fall behind and catch up), and some leave early. Checked for every subscriber that
stayed: every chunk after its position exactly once and in order, then the end,
once. A failure prints the seed.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from typing import Any

import pytest

from switchboard.streams import hub as hub_mod
from switchboard.streams.hub import StreamHub, Subscription


class ScriptedDb:
    def __init__(self) -> None:
        self.chunks: dict[uuid.UUID, list[str]] = {}
        self.status: dict[uuid.UUID, str] = {}
        self.reads = 0

    async def read_many(self, ids: Any, afters: Any, max_rows: int) -> list[tuple[Any, ...]]:
        self.reads += 1
        await asyncio.sleep(0)                    # the round trip: others run meanwhile
        rows: list[tuple[Any, ...]] = []
        for sid, after in zip(ids, afters):       # one snapshot: nothing changes in this loop
            if sid not in self.chunks:
                continue
            log = self.chunks[sid]
            ended = None if self.status[sid] == "open" else 1
            rows.append((sid, self.status[sid], len(log), {"n": len(log)}, ended, after + 1,
                         log[after:after + max_rows]))
        await asyncio.sleep(0)
        return rows


class SmallQueue:
    """A consumer with a bounded queue, read at a random pace."""

    def __init__(self, rng: random.Random, size: int) -> None:
        self.q: asyncio.Queue[str] = asyncio.Queue(size)
        self.rng = rng
        self.gone = False

    def push(self, text: str) -> bool:
        if self.gone or self.q.full():
            return False
        self.q.put_nowait(text)
        return True

    async def send(self, text: str) -> bool:
        if self.gone:
            return False
        await self.q.put(text)
        return True


async def consume(sink: SmallQueue, sid: uuid.UUID, rng: random.Random) -> tuple[list[int], list[dict[str, Any]]]:
    seqs: list[int] = []
    ends: list[dict[str, Any]] = []
    while not ends:
        f = json.loads(await sink.q.get())
        p = f["payload"]
        assert p["stream"] == str(sid)
        if f["event"] == "stream.chunks":
            for i, chunk in enumerate(p["chunks"]):
                assert chunk == f"{sid.hex[:4]}-{p['seq'] + i}", (chunk, p["seq"] + i)   # the right text at its seq
                seqs.append(p["seq"] + i)
        elif f["event"] == "stream.end":
            ends.append(p)
        if rng.random() < 0.3:
            await asyncio.sleep(rng.random() * 0.002)
    await asyncio.sleep(0.01)
    while not sink.q.empty():                     # nothing may follow the end
        ends.append(json.loads(sink.q.get_nowait()))
    return seqs, ends


async def scenario(seed: int) -> None:
    rng = random.Random(seed)
    db = ScriptedDb()
    hub = StreamHub(db.read_many)
    reader = asyncio.create_task(hub.run(db.read_many))
    streams = [uuid.uuid4() for _ in range(3)]
    for sid in streams:
        db.chunks[sid], db.status[sid] = [], "open"
    watchers: list[tuple[uuid.UUID, int, asyncio.Task[Any]]] = []
    leavers: list[tuple[Subscription, SmallQueue]] = []
    for step in range(400):
        sid = rng.choice(streams)
        r = rng.random()
        if r < 0.55 and db.status[sid] == "open":
            base = len(db.chunks[sid])
            db.chunks[sid].extend([f"{sid.hex[:4]}-{base + i + 1}" for i in range(rng.randint(1, 40))])
            if rng.random() < 0.9:                # some wake-ups are lost (the poll covers them)
                hub.hint(",".join(str(s) for s in rng.sample(streams, rng.randint(1, 3))) if rng.random() < 0.3
                         else str(sid))
        elif r < 0.65:
            after = rng.randint(0, len(db.chunks[sid]))
            sink = SmallQueue(rng, rng.choice([1, 2, 5, 50]))
            sub = Subscription(sid, after, sink)
            hub.subscribe(sub)
            if rng.random() < 0.15:
                leavers.append((sub, sink))
            else:
                watchers.append((sid, after, asyncio.create_task(consume(sink, sid, random.Random(rng.random())))))
        elif r < 0.7:
            hub.hint(rng.choice(["*", "garbage", str(uuid.uuid4()), "," * 300]))   # forged
        elif r < 0.72 and leavers:
            sub, sink = leavers.pop(rng.randrange(len(leavers)))
            sink.gone = True
            hub.unsubscribe(sub)
        await asyncio.sleep(0 if rng.random() < 0.7 else 0.001)
    for sid in streams:
        db.status[sid] = rng.choice(["done", "error", "stopped"])
        hub.hint(str(sid))
    for sub, sink in leavers:                     # the rest of the leavers never read: they stay stuck
        sink.gone = True
        hub.unsubscribe(sub)
    results = await asyncio.wait_for(asyncio.gather(*(t for _, _, t in watchers)), 30)
    for (sid, after, _), (seqs, ends) in zip(watchers, results):
        total = len(db.chunks[sid])
        assert seqs == list(range(after + 1, total + 1)), f"seed {seed}: {sid} from {after}"
        assert len(ends) == 1 and ends[0]["status"] == db.status[sid] and ends[0]["last_seq"] == total, \
            f"seed {seed}: {ends}"
    await asyncio.sleep(0.01)
    assert hub.count() == 0, f"seed {seed}: subscriptions left behind"
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


@pytest.mark.parametrize("seed", range(16))
def test_every_subscriber_gets_every_chunk_once_in_order_then_the_end(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_mod, "READ_ROWS", 7)          # pages: more catch-up rounds, more edges
    monkeypatch.setattr(hub_mod, "FRAME_BYTES", 40)       # several frames per page
    monkeypatch.setattr(hub_mod, "POLL_S", 0.05)          # lost wake-ups are covered by the poll
    asyncio.run(scenario(seed))
