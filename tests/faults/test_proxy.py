"""The fault proxy itself, against the suite's real PostgreSQL (no replica yet).

Each fault is checked from the client's side (what psycopg sees) and, where it
matters, from the server's side (pg_stat_activity): a test of a fault
scenario is only as good as the fault it injects.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import psycopg
import pytest
from faultproxy import FaultProxy

pytestmark = pytest.mark.faults


def _pg_addr(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return (u.hostname or "127.0.0.1", u.port or 5432)


def _via(url: str, px: FaultProxy, **extra: str) -> str:
    u = urlsplit(url)
    q = "&".join(f"{k}={v}" for k, v in extra.items())
    return f"postgresql://{u.username}@127.0.0.1:{px.port}{u.path}" + (f"?{q}" if q else "")


@pytest.fixture
def px(pg):  # type: ignore[no-untyped-def]
    p = FaultProxy(_pg_addr(pg.url()), name="selftest", seed=13).start()
    yield p
    p.stop()


def _rtt(c: psycopg.Connection) -> float:
    t = time.monotonic()
    assert c.execute("SELECT 1").fetchone() == (1,)
    return time.monotonic() - t


def test_latency_and_jitter_apply_while_traffic_flows(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(_via(pg.url(), px), autocommit=True) as c:
        base = min(_rtt(c) for _ in range(5))
        px.set(latency_ms=100, jitter_ms=20)           # on an open connection
        slow = [_rtt(c) for _ in range(5)]
        px.clear()
        after = min(_rtt(c) for _ in range(5))
    print(f"\nproxy RTT: base {base * 1000:.1f} ms, 100+-20 ms each way {[round(x * 1000) for x in slow]} ms, "
          f"cleared {after * 1000:.1f} ms", flush=True)
    assert all(0.16 <= x <= 0.6 for x in slow), slow    # two legs of 80..120 ms
    assert base < 0.1 and after < 0.1
    assert px.stats()["delayed_chunks"] >= 10


def test_loss_is_retransmission_delay_never_corruption(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    px.set(loss=0.3, rto_ms=150)
    with psycopg.connect(_via(pg.url(), px), autocommit=True) as c:
        times = []
        for i in range(30):
            t = time.monotonic()
            assert c.execute("SELECT %s::int, repeat('x', 5000)", (i,)).fetchone() == (i, "x" * 5000)
            times.append(time.monotonic() - t)
    lost = px.stats()["lost_chunks"]
    slow = sum(1 for x in times if x > 0.07)
    print(f"\nloss 30 %: {lost} chunks retransmitted, {slow}/30 queries slow, max {max(times) * 1000:.0f} ms",
          flush=True)
    assert lost >= 5 and slow >= 5


def test_stall_holds_bytes_until_resume(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(_via(pg.url(), px), autocommit=True) as c:
        px.stall()
        got: list[float] = []
        t0 = time.monotonic()
        th = threading.Thread(target=lambda: (c.execute("SELECT 1"), got.append(time.monotonic() - t0)))
        th.start()
        th.join(1.0)
        assert got == [], "a query went through a stalled proxy"
        px.resume()
        th.join(5)
        assert got and got[0] >= 1.0


def test_reset_all_resets_open_connections_and_refuse_new_ones(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    c = psycopg.connect(_via(pg.url(), px), autocommit=True)
    assert px.reset_all() == 1
    with pytest.raises(psycopg.OperationalError):
        c.execute("SELECT 1")
    c.close()
    px.set(refuse=True)
    t = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(_via(pg.url(), px, connect_timeout="5"))
    assert time.monotonic() - t < 2                     # refused at once, not a timeout
    px.clear()
    with psycopg.connect(_via(pg.url(), px), autocommit=True) as c2:
        assert c2.execute("SELECT 1").fetchone() == (1,)


def test_half_open_server_side_gone_client_hears_nothing(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    c = psycopg.connect(_via(pg.url(), px, application_name="halfopen"), autocommit=True)
    pid = c.info.backend_pid
    with psycopg.connect(pg.url(), autocommit=True) as admin:
        assert px.half_open() == 1

        def gone() -> bool:
            return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                 (pid,)).fetchone()[0] == 0
        deadline = time.time() + 5
        while not gone() and time.time() < deadline:
            time.sleep(0.05)
        assert gone(), "the server side of a half-open connection should be gone"
    got: list[object] = []
    th = threading.Thread(target=lambda: got.append(_safe(c)), daemon=True)
    th.start()
    th.join(1.5)
    assert got == [], f"the client should hear nothing, got {got}"
    px.reset_all()                                      # let the thread finish
    th.join(5)
    c.close()


def _safe(c: psycopg.Connection) -> object:
    try:
        return c.execute("SELECT 1").fetchone()
    except psycopg.Error as exc:
        return exc


def test_blackhole_swallows_new_connections(pg, px: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    px.set(blackhole=True)
    t = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(_via(pg.url(), px, connect_timeout="2"))
    took = time.monotonic() - t
    assert 1.5 <= took <= 6, took                       # a timeout, not a refusal
    assert px.stats()["discarded_bytes"] > 0
