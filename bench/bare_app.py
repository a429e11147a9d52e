"""The HTTP/WebSocket baseline: a minimal Falcon ASGI app, no Switchboard code on the request path.

GET /tasks runs the identical SELECT that Switchboard's GET /tasks runs, on an
AsyncConnectionPool of the same size, and returns the same JSON shape; it
does no authentication, no metrics, no access middleware. GET /ws accepts any
WebSocket and just holds it (the per-socket memory baseline); with --listen it
also relays NOTIFYs on channel bare_events to its sockets (the delivery floor
of the same stack: LISTEN -> one encode -> ws.send_text, no events table, no
ticket, no per-socket queue). Served by
uvicorn with the same settings `switchboard serve` uses: 1 worker,
proxy_headers off, access log off, permessage-deflate as SWITCHBOARD_WS_COMPRESSION says,
and the same event loop and HTTP parser as SWITCHBOARD_UVLOOP says (asyncio + h11 by
default). Left to itself uvicorn picks uvloop + httptools whenever they are installed
(they are dependencies since issue 23), which made this baseline faster than the
replicas it is compared with.

    DATABASE_URL=... python bench/bare_app.py --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import falcon
import falcon.asgi
import falcon.media
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from switchboard.config import server_io, uvloop_enabled, ws_compression_enabled
from switchboard.db import TASK_COLUMNS

LIST_TASKS = f"SELECT {TASK_COLUMNS} FROM switchboard.tasks ORDER BY name"


class Tasks:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(LIST_TASKS)
            rows = await cur.fetchall()
        resp.media = {"tasks": rows}


class Ready:
    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ready"}


class Hold:
    """Accept and hold; ?u=<key> registers the socket for Relay's deliveries."""

    def __init__(self, sockets: dict[str, falcon.asgi.WebSocket]) -> None:
        self.sockets = sockets

    async def on_websocket(self, req: falcon.Request, ws: falcon.asgi.WebSocket) -> None:
        await ws.accept()
        key = req.get_param("u")
        if key:
            self.sockets[key] = ws
        try:
            while True:
                await ws.receive_text()
        except falcon.WebSocketDisconnected:
            pass
        finally:
            if key and self.sockets.get(key) is ws:
                del self.sockets[key]


class Relay:
    """The delivery floor: LISTEN on bare_events; {"u": key, "k": n} goes to that socket,
    {"u": null, "k": n} to every socket. One encode per notification, sends in a loop."""

    def __init__(self, url: str | None, sockets: dict[str, falcon.asgi.WebSocket]) -> None:
        self.url, self.sockets = url, sockets
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        await conn.execute("LISTEN bare_events")
        async for n in conn.notifies():
            msg = json.loads(n.payload)
            text = json.dumps({"id": None, "event": "bench", "room": None, "payload": {"k": msg["k"]},
                               "ts": int(time.time() * 1000)}, separators=(",", ":"))
            targets = [self.sockets[msg["u"]]] if msg.get("u") in self.sockets else (
                list(self.sockets.values()) if msg.get("u") is None else [])
            for ws in targets:
                try:
                    await ws.send_text(text)
                except falcon.WebSocketDisconnected:
                    pass


class Lifecycle:
    def __init__(self, pool: AsyncConnectionPool, relay: Relay) -> None:
        self.pool, self.relay = pool, relay

    async def process_startup(self, scope: dict, event: dict) -> None:
        await self.pool.open(wait=False)
        if self.relay.url:
            self.relay.task = asyncio.create_task(self.relay.run())

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        if self.relay.task:
            self.relay.task.cancel()
        await self.pool.close()


def create_app(url: str, min_size: int, max_size: int, listen_url: str | None = None) -> falcon.asgi.App:
    pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, open=False,
                               kwargs={"autocommit": True, "row_factory": dict_row})
    sockets: dict[str, falcon.asgi.WebSocket] = {}
    app = falcon.asgi.App(middleware=[Lifecycle(pool, Relay(listen_url, sockets))])
    handler = falcon.media.JSONHandler(dumps=partial(json.dumps, default=str, ensure_ascii=False),
                                       loads=json.loads)
    app.resp_options.media_handlers.update({falcon.MEDIA_JSON: handler})
    app.add_route("/tasks", Tasks(pool))
    app.add_route("/healthz/ready", Ready())
    app.add_route("/ws", Hold(sockets))
    return app


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--pool-min", type=int, default=int(os.environ.get("SWITCHBOARD_POOL_MIN", 2)))
    p.add_argument("--pool-size", type=int, default=int(os.environ.get("SWITCHBOARD_POOL_SIZE", 10)))
    p.add_argument("--listen", action="store_true", help="relay NOTIFYs on bare_events to the sockets")
    a = p.parse_args()
    url = os.environ["DATABASE_URL"]
    app = create_app(url, a.pool_min, a.pool_size, url if a.listen else None)
    io = server_io(uvloop_enabled())
    uvicorn.run(app, host="127.0.0.1", port=a.port, lifespan="on", proxy_headers=False,
                loop=io["loop"], http=io["http"],
                forwarded_allow_ips="", access_log=False, ws_max_size=2 * 1024 * 1024,
                ws_per_message_deflate=ws_compression_enabled(), log_level="warning", server_header=False)


if __name__ == "__main__":
    main()
