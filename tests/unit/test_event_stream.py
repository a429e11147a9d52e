"""until_gone(): the loop both text/event-stream responses run (GET /sse and
GET /streams/{id}/events)."""

from __future__ import annotations

import asyncio

from switchboard.http.event_stream import KEEP_ALIVE, KeepAlive, until_gone


def test_items_in_order_keep_alives_in_silence_and_the_end_when_the_client_goes() -> None:
    async def main() -> list[object]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for text in ("a", "b"):
            queue.put_nowait(text)
        seen: list[object] = []
        async for item in until_gone(queue, gone, keepalive_s=0.05):
            seen.append(item)
            if len([i for i in seen if isinstance(i, KeepAlive)]) == 2:
                queue.put_nowait("c")
            if item == "c":
                gone.set_result(None)
        return seen

    seen = asyncio.run(main())
    assert seen == ["a", "b", KEEP_ALIVE, KEEP_ALIVE, "c"]


def test_a_client_gone_during_the_wait_ends_it_without_a_keep_alive() -> None:
    async def main() -> list[object]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.05, gone.set_result, None)
        return [item async for item in until_gone(queue, gone, keepalive_s=30)]

    assert asyncio.run(main()) == []
