"""Reader process of bench/streams.py: many WebSockets in one asyncio loop, each
following one stream, checking every chunk arrives once and in order.

Started by bench/streams.py (several of them, so the client side is not the
bottleneck). Control protocol, one command per line on stdin, one answer per line:

    open SPEC.json   SPEC: {"mode": "stream"|"notify"|"bare", "items": [{"idx", "url", "stream", "n"}]}
                     opens a socket per item (Switchboard: reads the hello; mode stream:
                     sends {"action": "stream.subscribe", "stream": id, "after": 0});
                     answers "ok <opened> <seconds>"
    wait SECONDS     until every item has its n chunks (and, mode stream, the end frame),
                     or the timeout; answers "ok <complete items> <items>"
    dump PATH        writes the run's records to PATH, closes the sockets; answers "ok <chunks>"
    quit

Chunks are texts ``<seq>:<stamp_ns>:<filler>`` (bench/streams_handlers.py). Each
frame is stamped ``time.time_ns()`` when read; latency = that - stamp. Frames:
mode stream: ``stream.chunks`` (payload.chunks[i] has seq payload.seq + i; the
text's own seq must agree) and ``stream.end``; mode notify: one ``bench.chunk``
event per chunk (payload.c); mode bare (bench/bare_app.py): ``bench`` frames whose
payload.k is the chunk.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from typing import Any

try:
    import orjson
    loads = orjson.loads
except ImportError:  # pragma: no cover
    loads = json.loads


def reply(msg: str) -> None:
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


class Item:
    __slots__ = ("idx", "n", "stream", "last", "got", "dup", "gap", "bad", "ended", "end_seq", "done", "frames",
                 "lat", "first_stamp", "last_recv", "errors")

    def __init__(self, spec: dict[str, Any]) -> None:
        self.idx = spec["idx"]
        self.n = spec["n"]
        self.stream = spec.get("stream")
        self.last = 0            # the highest seq seen in order
        self.got = 0             # chunks received (with duplicates)
        self.dup = 0             # seq <= last
        self.gap = 0             # seq > last + 1 (a chunk skipped or reordered)
        self.bad = 0             # the text's seq disagrees with the frame's
        self.ended = False
        self.end_seq = None
        self.done = asyncio.Event()
        self.frames = 0
        self.lat: list[float] = []
        self.first_stamp = 0
        self.last_recv = 0
        self.errors: list[Any] = []

    def chunk(self, seq: int, text: str, t: int) -> None:
        s, ts, _ = text.split(":", 2)
        if int(s) != seq:
            self.bad += 1
        ts_ = int(ts)
        if not self.first_stamp or ts_ < self.first_stamp:
            self.first_stamp = ts_
        self.lat.append((t - ts_) / 1e6)
        self.got += 1
        if seq == self.last + 1:
            self.last = seq
        elif seq <= self.last:
            self.dup += 1
        else:
            self.gap += 1
            self.last = seq
        self.last_recv = t

    def check_done(self, mode: str) -> None:
        if self.last >= self.n and (mode != "stream" or self.ended):
            self.done.set()


async def follow(ws: Any, it: Item, mode: str) -> None:
    try:
        async for msg in ws:
            t = time.time_ns()
            f = loads(msg)
            ev = f.get("event")
            p = f.get("payload") or {}
            if mode == "stream":
                if ev == "stream.chunks":
                    it.frames += 1
                    first = p["seq"]
                    for j, c in enumerate(p["chunks"]):
                        it.chunk(first + j, c, t)
                elif ev == "stream.end" and f.get("id") is None:
                    it.ended = True
                    it.end_seq = p.get("last_seq")
                elif ev == "error":
                    it.errors.append(p)
            elif mode == "notify":
                if ev == "bench.chunk":
                    it.frames += 1
                    c = p["c"]
                    it.chunk(int(c.split(":", 1)[0]), c, t)
                elif ev == "error":
                    it.errors.append(p)
            else:
                if ev == "bench":
                    it.frames += 1
                    c = p["k"]
                    it.chunk(int(c.split(":", 1)[0]), c, t)
            it.check_done(mode)
    except Exception as exc:  # a closed socket ends the item; the summary shows what it lacks
        it.errors.append(f"{type(exc).__name__}: {exc}"[:200])


class Run:
    def __init__(self) -> None:
        self.items: list[Item] = []
        self.socks: list[Any] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.mode = "stream"

    async def open(self, path: str) -> str:
        from websockets.asyncio.client import connect

        spec = json.load(open(path))
        self.mode = spec["mode"]
        self.items = [Item(x) for x in spec["items"]]
        urls = [x["url"] for x in spec["items"]]
        sem = asyncio.Semaphore(50)
        socks: list[Any] = [None] * len(urls)

        async def one(i: int) -> None:
            async with sem:
                for attempt in range(5):
                    try:
                        ws = await connect(urls[i], open_timeout=30, max_queue=None, ping_interval=None,
                                           compression=None, max_size=None)
                        break
                    except Exception:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.2 * (attempt + 1))
                if self.mode != "bare":
                    first = loads(await ws.recv())
                    assert first["event"] == "hello", first
                socks[i] = ws

        t0 = time.time()
        await asyncio.gather(*(one(i) for i in range(len(urls))))
        self.socks = socks
        self.tasks = [asyncio.create_task(follow(ws, it, self.mode)) for ws, it in zip(socks, self.items)]
        if self.mode == "stream":
            for ws, it in zip(socks, self.items):
                await ws.send(json.dumps({"action": "stream.subscribe", "stream": it.stream, "after": 0}))
        return f"ok {len(socks)} {time.time() - t0:.2f}"

    async def wait(self, timeout: float) -> str:
        try:
            await asyncio.wait_for(asyncio.gather(*(it.done.wait() for it in self.items)), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            pass
        return f"ok {sum(it.done.is_set() for it in self.items)} {len(self.items)}"

    async def dump(self, path: str) -> str:
        for ws in self.socks:
            try:
                await asyncio.wait_for(ws.close(), 1)
            except Exception:
                pass
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        out = {"mode": self.mode, "items": [
            {"idx": it.idx, "n": it.n, "got": it.got, "last": it.last, "dup": it.dup, "gap": it.gap,
             "bad": it.bad, "ended": it.ended, "end_seq": it.end_seq, "frames": it.frames,
             "first_stamp": it.first_stamp, "last_recv": it.last_recv, "errors": it.errors[:5]}
            for it in self.items],
            "lat_ms": [round(x, 3) for it in self.items for x in it.lat]}
        with open(path, "w") as f:
            json.dump(out, f)
        n = sum(it.got for it in self.items)
        self.items, self.socks, self.tasks = [], [], []
        return f"ok {n}"


async def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run = Run()
    reply("ok ready")
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        cmd, _, arg = line.strip().partition(" ")
        try:
            if cmd == "quit":
                return
            if cmd == "open":
                reply(await run.open(arg))
            elif cmd == "wait":
                reply(await run.wait(float(arg)))
            elif cmd == "dump":
                reply(await run.dump(arg))
            else:
                reply(f"error unknown command {cmd}")
        except Exception as exc:
            reply(f"error {type(exc).__name__}: {exc}"[:500].replace("\n", " "))


if __name__ == "__main__":
    asyncio.run(main())
