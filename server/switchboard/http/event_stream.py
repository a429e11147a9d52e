"""The loop every text/event-stream response runs (GET /streams/{id}/events and the
SSE transport, GET /sse): the next item of a queue, or a keep-alive comment after
KEEPALIVE_S of silence so that proxies keep the response open, until the client
goes. The client's going is heard on the ASGI receive channel: a send to a gone
client is a no-op, so without it a closed response would hold what it subscribed
to until its next item."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

KEEPALIVE_S = 15.0
KEEPALIVE_COMMENT = b": keep-alive\n\n"

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ItemQueue(Protocol[T_co]):
    """What until_gone() reads: an asyncio.Queue, or a socket's Outbox."""

    def empty(self) -> bool: ...
    def get_nowait(self) -> T_co: ...
    async def get(self) -> T_co: ...


class KeepAlive:
    """What until_gone() yields after KEEPALIVE_S of silence: write KEEPALIVE_COMMENT."""


KEEP_ALIVE = KeepAlive()


async def disconnected(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
    """Returns when the client has gone (a request body, if any, is skipped)."""
    while (await receive()).get("type") != "http.disconnect":
        pass


async def until_gone(queue: ItemQueue[T], gone: asyncio.Future[Any],
                     keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[T | KeepAlive]:
    """The queue's items, each as soon as it is there, and KEEP_ALIVE after every
    keepalive_s without one, until ``gone`` completes. The caller stops on its own
    end-of-stream item."""
    while not gone.done():
        if not queue.empty():
            yield queue.get_nowait()
            continue
        get: asyncio.Future[T] = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({get, gone}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            yield get.result()
            continue
        get.cancel()
        if gone not in done:
            yield KEEP_ALIVE


__all__ = ["KEEPALIVE_COMMENT", "KEEPALIVE_S", "KEEP_ALIVE", "ItemQueue", "KeepAlive", "disconnected", "until_gone"]
