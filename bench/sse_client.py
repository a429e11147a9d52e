"""Receiver process for bench/sse_ab.py: many GET /sse streams in one asyncio loop.

The SSE twin of bench/ws_client.py, with the same control protocol (count, dump PATH,
quit; see its docstring) and the same record: ``time.time()`` the moment an event's
``data:`` line is read, keyed by the publisher's k. Plain asyncio streams and a small
HTTP/1.1 chunked-body reader, to keep the receiver (one process for 1,000 streams)
cheap: it shares the box's two cores with the replicas it measures.

    sse_client.py SPEC.json     SPEC: {"urls": ["http://127.0.0.1:PORT/sse?ticket=...", ...]}
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from urllib.parse import urlsplit

from ws_client import RECS, _raise_nofile, commands, reply


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port, limit=1 << 20)
    writer.write((f"GET {u.path}?{u.query} HTTP/1.1\r\nHost: {u.netloc}\r\nAccept: text/event-stream\r\n"
                  "Cache-Control: no-cache\r\n\r\n").encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    if status != b"200":
        raise RuntimeError(f"GET /sse answered {head[:200]!r}")
    if b"transfer-encoding: chunked" not in head.lower():
        raise RuntimeError("expected a chunked body")
    return reader, writer


async def _chunks(reader: asyncio.StreamReader):  # type: ignore[no-untyped-def]
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def stream(i: int, url: str, ready: asyncio.Event) -> None:
    reader, writer = await _open(url)
    buf = b""
    try:
        async for chunk in _chunks(reader):
            t = time.time()
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    if b'"bench"' in line:
                        RECS.append((json.loads(line[6:])["payload"]["k"], t, i))
                    elif b'"hello"' in line:
                        ready.set()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def run(spec_path: str) -> None:
    urls = json.load(open(spec_path))["urls"]
    sem = asyncio.Semaphore(50)
    readies = [asyncio.Event() for _ in urls]
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        async with sem:   # a ticket is spent by its first use: no retry
            tasks.append(asyncio.create_task(stream(i, urls[i], readies[i])))
            await asyncio.wait_for(readies[i].wait(), 60)

    t0 = time.time()
    await asyncio.gather(*(one(i) for i in range(len(urls))))
    reply(f"ok open {len(urls)} {time.time() - t0:.2f}s")
    await commands({})
    for t in tasks:
        t.cancel()


def main() -> None:
    _raise_nofile()
    asyncio.run(run(sys.argv[1]))


if __name__ == "__main__":
    main()
