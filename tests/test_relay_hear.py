"""The relay's hearing loop (NotifyListener.hear) on a real LISTEN connection.

The relay keeps its LISTEN socket registered with the event loop and drains libpq
on each readable event; during a liveness check psycopg owns the socket and a
notify handler dispatches what arrives meanwhile. Proven here against PostgreSQL:
- every notification is dispatched exactly once, in the order PostgreSQL sent it,
  across bursts, quiet spells and liveness checks; notifications that arrive
  *during* a check (sent while it is in flight, deterministically) are not lost;
- what arrived while LISTEN ran, before the loop started, is dispatched first;
- a backend terminated under the loop ends it with an error at once, not at the
  next liveness check.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import psycopg
import pytest

from switchboard.metrics import Metrics
from switchboard.relay.listener import NotifyListener

CH = "switchboard_events"


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> str:
    """Both event loops a replica can run on (SWITCHBOARD_UVLOOP): add_reader and the
    socket's readiness behave alike, or these tests say so."""
    return str(request.param)


def _run(kind: str, coro: Any) -> None:
    if kind == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(coro)
    else:
        asyncio.run(coro)


def _relay(url: str, interval: float) -> tuple[NotifyListener, list[tuple[str, str]]]:
    got: list[tuple[str, str]] = []

    async def no_session(conn: Any) -> Any:
        raise AssertionError("hear() alone: no session")
    r = NotifyListener(url, [CH], interval, Metrics(), dispatch=lambda channel, payload: got.append((channel, payload)),
                       on_session=no_session, on_idle=lambda: None)
    return r, got


def _send(url: str, payloads: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for p in payloads:
            c.execute("SELECT pg_notify(%s, %s)", (CH, p))


async def _until(pred: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_every_notification_once_in_order_across_liveness_checks(db: str, loop_kind: str) -> None:
    async def run() -> None:
        relay, got = _relay(db, interval=0.1)
        conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
        await conn.execute(f"LISTEN {CH}")
        # Sent after LISTEN, before the loop runs: psycopg holds them (its backlog).
        await asyncio.to_thread(_send, db, ["early-0", "early-1"])
        await asyncio.sleep(0.1)
        # Each liveness check first commits notifications from another session and
        # waits for them to reach this socket, then runs its SELECT 1: they are read
        # by psycopg during the check, never by the loop's own reader.
        checks = 0
        real_execute = conn.execute

        async def execute(query: Any, *a: Any, **k: Any) -> Any:
            nonlocal checks
            if query == "SELECT 1":
                checks += 1
                await asyncio.to_thread(_send, db, [f"during-{checks}-{i}" for i in range(3)])
                await asyncio.sleep(0.05)
            return await real_execute(query, *a, **k)

        conn.execute = execute  # type: ignore[method-assign]
        reader = asyncio.ensure_future(asyncio.sleep(3600))
        hear = asyncio.ensure_future(relay.hear(conn, reader))
        rng = random.Random(18)
        sent = ["early-0", "early-1"]
        for burst in range(12):
            batch = [f"b{burst}-{i}" for i in range(rng.choice((1, 5, 60)))]
            await asyncio.to_thread(_send, db, batch)
            sent += batch
            await asyncio.sleep(rng.choice((0.0, 0.02, 0.25)))   # 0.25 s: quiet, a check runs
        await _until(lambda: sum(1 for _, p in got if not p.startswith("during")) == len(sent), 20)
        await asyncio.sleep(0.3)
        assert not hear.done(), hear
        hear.cancel()
        reader.cancel()
        await asyncio.gather(hear, reader, return_exceptions=True)
        await conn.close()
        payloads = [p for _, p in got]
        assert checks >= 2, "no liveness check ran: the test proves nothing about them"
        during = [p for p in payloads if p.startswith("during")]
        # Every check's notifications were dispatched, once, in order (the last check's
        # may still have been in flight when the loop was cancelled).
        want = [f"during-{c}-{i}" for c in range(1, checks + 1) for i in range(3)]
        assert during == want[:len(during)] and len(during) >= 3 * (checks - 1), (during, checks)
        assert [p for p in payloads if not p.startswith("during")] == sent
        assert len(payloads) == len(set(payloads))
        assert {ch for ch, _ in got} == {CH}

    _run(loop_kind, run())


def test_a_terminated_backend_ends_the_loop_at_once(db: str, loop_kind: str) -> None:
    async def run() -> None:
        relay, got = _relay(db, interval=60.0)    # no liveness check would notice in time
        conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
        await conn.execute(f"LISTEN {CH}")
        pid = conn.info.backend_pid
        reader = asyncio.ensure_future(asyncio.sleep(3600))
        hear = asyncio.ensure_future(relay.hear(conn, reader))
        await asyncio.to_thread(_send, db, ["before"])
        await _until(lambda: got == [(CH, "before")], 10)
        t0 = time.monotonic()
        await asyncio.to_thread(lambda: psycopg.connect(db, autocommit=True).execute(
            "SELECT pg_terminate_backend(%s)", (pid,)).connection.close())
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(hear, 10)
        assert time.monotonic() - t0 < 10
        reader.cancel()
        await conn.close()

    _run(loop_kind, run())
