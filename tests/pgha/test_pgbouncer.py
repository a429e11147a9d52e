"""Switchboard behind a real PgBouncer in transaction mode (Debian's pgbouncer 1.18).

The deployment docs/how-to/operations/poolers.md recommends: DATABASE_URL through PgBouncer in
transaction mode for the request pool, SWITCHBOARD_LISTEN_DATABASE_URL direct
(LISTEN needs a session of its own; a transaction pooler would hand it to
someone else after the first transaction).

- psycopg prepares a statement server-side after 5 executions; through a
  transaction pooler the next execution can land on a server connection that
  never saw it. Shown raw, then handled by the server (setting + detection).
- The HTTP and WebSocket server tests, run again through PgBouncer.
- GET /tasks req/s and jobs/s through PgBouncer beside direct, same run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from harness import ROOT, Server, app_url_for, auth, make_user
from failover_load import FIGURES
from pgbouncer_kit import PgBouncer

pytestmark = pytest.mark.pgha


@pytest.fixture
def bouncer(pg) -> Iterator[PgBouncer]:  # type: ignore[no-untyped-def]
    b = PgBouncer(pg.port, pool_size=20).start()
    try:
        yield b
    finally:
        b.stop()


def test_prepared_statements_break_under_transaction_pooling(db: str, bouncer: PgBouncer) -> None:
    """The trap, raw: a statement psycopg prepared on one server connection is executed
    on another one. (This is why the server turns preparation off behind a pooler.)"""
    url = bouncer.url_for(db)
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as c1, \
            psycopg.connect(url, autocommit=True) as c2:
        c1.execute("SELECT count(*) FROM switchboard.tasks").fetchone()      # prepared on server conn A
        with c2.transaction():
            c2.execute("SELECT 1")                                          # c2 now holds A
            with pytest.raises(psycopg.Error) as e:
                c1.execute("SELECT count(*) FROM switchboard.tasks")        # runs on B: not prepared there
    assert e.value.sqlstate in ("26000", "42P05"), e.value
    print(f"\nraw psycopg through PgBouncer (transaction mode): {e.value.sqlstate} {str(e.value).strip()}")


def test_server_detects_lost_prepared_statements_and_stops_preparing(db: str, bouncer: PgBouncer,
                                                                      tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Forced to prepare at once (SWITCHBOARD_PREPARE_THRESHOLD=0) behind PgBouncer: the data
    layer notices the first lost statement, turns preparation off, retries -- no 500."""
    make_user(db, "pat", role="admin")
    direct = app_url_for(db)
    s = Server(bouncer.url_for(direct), env={"SWITCHBOARD_LISTEN_DATABASE_URL": direct,
                                             "SWITCHBOARD_PREPARE_THRESHOLD": "0",
                                             "SWITCHBOARD_LOG_LEVEL": "WARNING"},
               log_dir=tmp_path, name="prep").start()
    try:
        tok = s.login("pat")
        statuses = asyncio.run(_hammer(s.base + "/tasks", auth(tok), conns=16, seconds=2.0))
        assert set(statuses) == {200}, statuses
        log = s.log_path.read_text(errors="replace")
        assert log.count("prepared statements are now off") == 1, log[-3000:]
    finally:
        s.terminate()


def test_http_and_websocket_suite_through_pgbouncer() -> None:
    """A representative subset of the server tests again, every server with DATABASE_URL
    through a real PgBouncer (transaction mode) and LISTEN direct (SWITCHBOARD_TEST_PGBOUNCER=1,
    see tests/conftest.py): all of tests/test_server_basics.py (login, tickets, WebSocket
    delivery, resume, rate limits, triggers, errors, the sql handler) and the WebSocket-heavy
    part of tests/test_server_faults.py (socket abuse, slow consumers, the tool bridge).
    Left out for the time budget, and passing the same way when run by hand
    (``SWITCHBOARD_TEST_PGBOUNCER=1 pytest tests/test_server_faults.py tests/test_openapi_fuzz.py``):
    the rest of test_server_faults and the OpenAPI fuzz; tests that start no server through
    server_factory (own PostgreSQL, gunicorn) do not use PgBouncer either way."""
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/test_server_basics.py", "tests/test_server_faults.py",
         "-k", "test_server_basics and not gunicorn or socket_abuse or slow_consumer or tool_bridge"],
        cwd=ROOT, env={**os.environ, "SWITCHBOARD_TEST_PGBOUNCER": "1"}, capture_output=True, text=True,
        timeout=600)
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    print(f"\nserver suite through PgBouncer: {tail.strip().splitlines()[-1]} ({time.monotonic() - t0:.0f}s)")
    assert r.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail
    assert int(tail.strip().splitlines()[-1].split(" passed")[0].split()[-1]) >= 10, tail


# -- throughput, beside direct ---------------------------------------------------------------------
async def _hammer(url: str, headers: dict[str, str], conns: int, seconds: float) -> Counter[int]:
    out: Counter[int] = Counter()
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(headers=headers, timeout=30,
                                 limits=httpx.Limits(max_connections=conns)) as client:
        async def one() -> None:
            while time.monotonic() < stop:
                r = await client.get(url)
                out[r.status_code] += 1
        await asyncio.gather(*(one() for _ in range(conns)))
    return out


def _drain_jobs(s: Server, db: str, m: int, tag: str) -> float:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.update_task(id, '{\"is_active\": false}') FROM switchboard.tasks")
        t0 = time.monotonic()
        with c.transaction():
            c.execute("SELECT count(*) FROM generate_series(1, %s) i, "
                      "LATERAL switchboard.enqueue('noop', jsonb_build_object('tag', %s::text, 'i', i))",
                      (m, tag))
        deadline = t0 + 120
        while time.monotonic() < deadline:
            done = c.execute("SELECT count(*) FROM switchboard.task_runs WHERE args->>'tag' = %s "
                             "AND status = 'succeeded'", (tag,)).fetchone()[0]
            if done == m:
                return m / (time.monotonic() - t0)
            time.sleep(0.02)
    raise AssertionError(f"{tag}: {done}/{m} jobs after 120 s:\n{s.log()}")


def test_throughput_through_pgbouncer_beside_direct(db: str, bouncer: PgBouncer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """GET /tasks req/s and noop jobs/s: one replica direct, one through PgBouncer, same database,
    same run, alternating so machine noise hits both."""
    make_user(db, "bench", role="admin")
    with psycopg.connect(db, autocommit=True) as c:
        for i in range(20):
            c.execute("SELECT switchboard.create_task(%s, '@daily', 'noop')", (f"bench.{i:02d}",))
    direct = app_url_for(db)
    quiet = {"SWITCHBOARD_LOG_LEVEL": "WARNING", "SWITCHBOARD_LOGIN_IP_BURST": "1000"}
    conns, secs, rounds = 16, 2.0, 3
    req: dict[str, list[float]] = {"direct": [], "pgbouncer": []}
    servers = {
        "direct": Server(direct, env={**quiet, "SWITCHBOARD_SCHEDULER": "off"}, log_dir=tmp_path, name="direct"),
        "pgbouncer": Server(bouncer.url_for(direct), env={**quiet, "SWITCHBOARD_SCHEDULER": "off",
                                                          "SWITCHBOARD_LISTEN_DATABASE_URL": direct},
                            log_dir=tmp_path, name="bouncer"),
    }
    try:
        for s in servers.values():
            s.start()
        tok = servers["direct"].login("bench")
        for _ in range(rounds):
            for k, s in servers.items():
                st = asyncio.run(_hammer(s.base + "/tasks", auth(tok), conns, secs))
                assert set(st) == {200}, (k, st)
                req[k].append(sum(st.values()) / secs)
    finally:
        for s in servers.values():
            s.terminate()
    jobs: dict[str, float] = {}
    m = 2000
    for k, url, extra in (("direct", direct, {}),
                          ("pgbouncer", bouncer.url_for(direct), {"SWITCHBOARD_LISTEN_DATABASE_URL": direct})):
        s = Server(url, env={**quiet, **extra}, log_dir=tmp_path, name=f"jobs-{k}").start()
        try:
            jobs[k] = _drain_jobs(s, db, m, k)
        finally:
            s.terminate()
    stats = bouncer.stats(db.rsplit("/", 1)[1])
    best = {k: max(v) for k, v in req.items()}
    print(f"\nGET /tasks ({conns} connections, best of {rounds} x {secs:.0f}s): direct {best['direct']:.0f} req/s, "
          f"PgBouncer {best['pgbouncer']:.0f} req/s ({best['pgbouncer'] / best['direct']:.2f}x); "
          f"all rounds {req}", flush=True)
    print(f"jobs ({m} noop, 1 replica, concurrency 8): direct {jobs['direct']:.0f} jobs/s, "
          f"PgBouncer {jobs['pgbouncer']:.0f} jobs/s ({jobs['pgbouncer'] / jobs['direct']:.2f}x); "
          f"PgBouncer served {stats.get('total_xact_count')} transactions", flush=True)
    FIGURES["pgbouncer vs direct"] = {
        "get_tasks_req_per_s": {k: round(v) for k, v in best.items()},
        "jobs_per_s": {k: round(v) for k, v in jobs.items()}}
    assert stats.get("total_xact_count", 0) > sum(req["pgbouncer"]) * secs, stats  # the traffic went through it
    # not a race between the two, but a guard against a pathology (e.g. a retry storm)
    assert best["pgbouncer"] > 0.3 * best["direct"] and jobs["pgbouncer"] > 0.3 * jobs["direct"], (best, jobs)
