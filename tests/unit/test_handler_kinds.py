"""What may be registered as a handler, and how each kind is run (handlers.as_handler)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from switchboard.handlers import HandlerContext, HandlerLoadError, HandlerRegistry
from switchboard.rows import Run


def ctx() -> HandlerContext:
    row = {name: None for name in Run.FIELDS} | {"id": 1, "handler": "h", "args": {"x": 2}, "attempt": 1,
                                                 "max_attempts": 1, "status": "running"}
    return HandlerContext(Run.from_row(row), None, lease_seconds=30)  # type: ignore[arg-type]


def test_a_plain_def_runs_in_a_worker_thread_and_reaches_the_loop_through_sync() -> None:
    reg = HandlerRegistry()
    seen: dict[str, Any] = {}

    async def side_effect(v: int) -> int:
        seen["loop_thread"] = threading.current_thread().name
        return v * 10

    @reg.register("blocking")
    def blocking(c: HandlerContext) -> dict[str, Any]:
        return {"thread": threading.current_thread().name, "got": c.sync(side_effect(c.args["x"]))}

    async def main() -> None:
        loop_thread = threading.current_thread().name
        ticks = 0

        async def ticker() -> None:   # the loop keeps serving while the handler runs
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        fn = reg.get("blocking")
        assert fn is not None
        out = await fn(ctx())
        t.cancel()
        assert out["thread"].startswith("switchboard-handler") and out["thread"] != loop_thread
        assert out["got"] == 20 and seen["loop_thread"] == loop_thread
        assert ticks > 0

    asyncio.run(main())


def test_sync_outside_a_plain_def_handler_is_a_clear_error() -> None:
    async def main() -> None:
        c = ctx()

        async def nothing() -> None:
            return None

        coro = nothing()
        with pytest.raises(RuntimeError, match="only while a plain-def handler runs"):
            c.sync(coro)
        coro.close()

    asyncio.run(main())


def test_an_async_def_is_kept_as_is_and_a_coroutine_returning_callable_is_awaited() -> None:
    reg = HandlerRegistry()

    async def a(c: HandlerContext) -> int:
        return 1

    reg.add("a", a)
    assert reg.get("a") is a

    class Callable_:
        async def __call__(self, c: HandlerContext) -> int:
            return 2

    obj = Callable_()
    reg.add("obj", obj)
    assert reg.get("obj") is obj
    reg.add("lam", lambda c: a(c))
    fn = reg.get("lam")
    assert fn is not None and asyncio.run(fn(ctx())) == 1


def test_what_cannot_be_a_handler_is_refused_at_registration() -> None:
    reg = HandlerRegistry()

    def gen(c: HandlerContext):  # type: ignore[no-untyped-def]
        yield 1

    async def agen(c: HandlerContext):  # type: ignore[no-untyped-def]
        yield 1

    for name, fn, msg in (("g", gen, "is a generator"), ("ag", agen, "is a generator"),
                          ("n", 42, "is not callable")):
        with pytest.raises(HandlerLoadError, match=f"handler '{name}'.*{msg}"):
            reg.add(name, fn)
        assert reg.get(name) is None
