"""Receiver process for the delivery benchmarks: many WebSockets (or one LISTEN) in one asyncio loop.

Started by bench/e2e.py as a separate OS process so the publisher and the
receivers do not share an event loop. It records ``time.time()`` the moment a
frame (or notification) is read, keyed by the publisher's sequence number k;
the publisher records ``time.time()`` right after its COMMIT returned. Same
host, same clock.

Control protocol: one command per line on stdin, one answer per line on stdout.
    join ROOM    every socket joins ROOM; answers "ok <joined>"
    count        answers "ok <frames recorded so far>"
    dump PATH    writes [[k, t, socket], ...] to PATH, clears; answers "ok <n>"
    quit         closes everything and exits
Modes:
    ws_client.py ws SPEC.json      SPEC: {"urls": ["ws://.../ws?ticket=...", ...], "hello": true, "deflate": true}
    ws_client.py listen URL CHANNEL
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

RECS: list[tuple[int, float, int]] = []


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def reply(msg: str) -> None:
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


async def commands(handlers: dict) -> None:
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            return
        if cmd == "count":
            reply(f"ok {len(RECS)}")
        elif cmd == "dump":
            data = list(RECS)
            RECS.clear()
            with open(arg, "w") as f:
                json.dump(data, f)
            reply(f"ok {len(data)}")
        elif cmd in handlers:
            reply(await handlers[cmd](arg))
        else:
            reply(f"error unknown command {cmd}")


async def run_ws(spec_path: str) -> None:
    from websockets.asyncio.client import connect

    spec = json.load(open(spec_path))
    urls = spec["urls"]
    hello = spec.get("hello", True)  # Switchboard greets every socket; the bare app does not
    # Browsers always offer permessage-deflate; "deflate": false makes a client that does not.
    compression = "deflate" if spec.get("deflate", True) else None
    conns: list = [None] * len(urls)
    joined: dict[int, asyncio.Event] = {}
    sem = asyncio.Semaphore(50)

    async def open_one(i: int) -> None:
        async with sem:
            for attempt in range(5):
                try:
                    ws = await connect(urls[i], open_timeout=30, max_queue=None, ping_interval=None,
                                       compression=compression)
                    break
                except Exception:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.2 * (attempt + 1))
            if hello:
                first = json.loads(await ws.recv())
                assert first["event"] == "hello", first
            conns[i] = ws

    t0 = time.time()
    await asyncio.gather(*(open_one(i) for i in range(len(urls))))
    opened = time.time() - t0

    async def reader(i: int, ws) -> None:  # type: ignore[no-untyped-def]
        try:
            async for msg in ws:
                t = time.time()
                if '"bench"' in msg:
                    RECS.append((json.loads(msg)["payload"]["k"], t, i))
                elif '"joined"' in msg:
                    ev = joined.get(i)
                    if ev:
                        ev.set()
        except Exception:
            pass

    readers = [asyncio.create_task(reader(i, ws)) for i, ws in enumerate(conns)]

    async def join(room: str) -> str:
        for i in range(len(conns)):
            joined[i] = asyncio.Event()
        for i, ws in enumerate(conns):
            await ws.send(json.dumps({"action": "join", "room": room}))
            if i % 20 == 19:
                await asyncio.sleep(0.01)  # stay under the per-socket frame limits' radar
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in joined.values())), 60)
        except TimeoutError:
            pass
        return f"ok {sum(e.is_set() for e in joined.values())}"

    reply(f"ok open {len(conns)} {opened:.2f}s")
    await commands({"join": join})
    for ws in conns:
        try:
            await asyncio.wait_for(ws.close(), 1)
        except Exception:
            pass
    for r in readers:
        r.cancel()


async def run_listen(url: str, channel: str) -> None:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(f"LISTEN {channel}")

    async def listen() -> None:
        async for n in conn.notifies():
            RECS.append((int(n.payload), time.time(), 0))

    task = asyncio.create_task(listen())
    reply("ok listening")
    await commands({})
    task.cancel()
    await conn.close()


def main() -> None:
    _raise_nofile()
    mode = sys.argv[1]
    if mode == "ws":
        asyncio.run(run_ws(sys.argv[2]))
    elif mode == "listen":
        asyncio.run(run_listen(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
