"""Why a LISTEN loss was noticed after 11.9 s against a 3 s bound, and the fix.

The relay runs its reader (relay_read, ...) on a second connection through the
same path as LISTEN. When the liveness check failed, the relay cancelled the
reader and only then marked itself down (readiness 503, the deaf-socket clock).
Cancelling a task that is inside a query makes psycopg send a cancel request
and wait for the query to end: 5 s + 5 s over a dead link. Under load the
reader is nearly always inside a query, so the loss was noticed ~10 s late and
the 1012 deaf-close of a short partition never came.

The relay now marks itself down first and abandons the reader with
relay.listener.abandon(): close the connection (local, immediate), then cancel. These
tests drive both through a stalled fault proxy, the reader mid-query.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import psycopg
import pytest
from faultproxy import FaultProxy

from switchboard.relay import abandon as _abandon

pytestmark = pytest.mark.faults


@pytest.fixture
def px(pg):  # type: ignore[no-untyped-def]
    u = urlsplit(pg.url())
    p = FaultProxy((u.hostname or "127.0.0.1", u.port or 5432), name="listen-loss", seed=5).start()
    yield p
    p.stop()


def _via(url: str, px: FaultProxy) -> str:
    u = urlsplit(url)
    return f"postgresql://{u.username}@127.0.0.1:{px.port}{u.path}"


async def _stop_mid_query(url: str, px: FaultProxy, abandon: bool) -> tuple[float, bool]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    task = asyncio.ensure_future(conn.execute("SELECT pg_sleep(3)"))
    await asyncio.sleep(0.3)  # the query is on the wire
    assert not task.done()
    px.stall()  # the link goes dead: nothing passes either way, new connections hang too
    t = time.monotonic()
    if abandon:
        await _abandon(task, conn)
    else:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    took = time.monotonic() - t
    await conn.close()
    return took, task.done()


def test_abandoning_a_reader_mid_query_does_not_wait_on_the_dead_link(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    took, done = asyncio.run(_stop_mid_query(_via(pg.url(), px), px, abandon=True))
    print(f"\nreader abandoned mid-query over a dead link in {took:.2f} s")
    assert done
    assert took < 5.0  # _abandon's own bound is 2 s; psycopg's cancel path takes >= 5 s


def test_the_cause_cancelling_mid_query_waits_on_the_dead_link(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    """What the relay did before (and what any plain task.cancel() of a psycopg query
    does): it waits for a cancel request that cannot arrive. If psycopg ever stops
    doing this, this test says so, and _abandon's close-first becomes a nicety."""
    took, done = asyncio.run(_stop_mid_query(_via(pg.url(), px), px, abandon=False))
    print(f"\nplain cancel mid-query over a dead link took {took:.2f} s")
    assert done
    assert took >= 4.5, took
