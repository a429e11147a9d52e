"""Where a subscription's frames go: a WebSocket's send queue, or an SSE response's queue."""

from __future__ import annotations

import asyncio

from ..sockets import Client


class SocketSink:
    """A WebSocket client's bounded send queue. ``push`` never waits and never closes the
    socket (no room: the subscription catches up on its own); ``send`` waits for room up to
    ``stall`` s, after which the socket is closed 1013 like any client that stopped reading."""

    __slots__ = ("client", "stall")

    def __init__(self, client: Client, stall: float) -> None:
        self.client = client
        self.stall = stall

    def push(self, text: str) -> bool:
        c = self.client
        if c.closing is not None or c.resuming or not c.queue.fits(len(text)):
            return False
        try:
            c.queue.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    async def send(self, text: str) -> bool:
        c = self.client
        while c.resuming and c.closing is None:   # a resume's replay goes first, whole
            await asyncio.sleep(0.01)
        return await c.offer_wait({}, self.stall, replay=True, text=text)


class QueueSink:
    """An SSE response: frames wait in a bounded queue its generator drains."""

    def __init__(self, size: int = 256) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue(size)
        self.gone = False

    def push(self, text: str) -> bool:
        if self.gone:
            return False
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    async def send(self, text: str) -> bool:
        if self.gone:
            return False
        await self.queue.put(text)
        return True
