"""HA checklist, destructive part: each test gets its own database and replicas.

4 the login rate limit is one limit across replicas, 6 kill -9 of a replica
mid-run, 7 rolling restart under a numbered event stream, 8 PostgreSQL
restart, 10 three replicas migrating an empty database at the same instant.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time

import httpx
import psycopg
import pytest
from hakit import (
    APP_LOGIN,
    PASSWORD,
    Publisher,
    StreamClient,
    Trio,
    exactly_once,
    ready_all,
    ready_status,
    replica_of_worker,
    wait_until,
)
from harness import ROOT, auth

pytestmark = pytest.mark.ha


def _assert_stream(clients: list[StreamClient], n: int, timeout: float = 15) -> None:
    """Every client ends up with every number 0..n-1 exactly once."""
    for c in clients:
        c.wait_for(lambda c: not exactly_once(c.numbers(), n)[0], timeout)
    for c in clients:
        missing, dups = exactly_once(c.numbers(), n)
        raw = c.raw_ids()
        redelivered = sorted(i for i, k in raw.items() if k > 1)
        print(f"  {c.name}: {n} published, connections on ports {c.conn_ports}, close codes "
              f"{c.close_codes}, re-delivered ids {len(redelivered)}, unacked losses {c.unacked_losses}",
              flush=True)
        assert c.client_errors == [], c.client_errors   # e.g. a frame before hello
        assert missing == [], f"{c.name} missed {missing}"
        assert dups == [], f"{c.name} got numbers twice under different ids: {dups}"
        assert c.per_conn_dups == [], f"{c.name}: one socket got an id twice: {c.per_conn_dups}"
        # An id may only come twice if a socket was lost before its replay was acked
        # (the client then legitimately resumes from the older cursor again).
        if c.unacked_losses == 0:
            assert redelivered == [], f"{c.name}: re-delivered {redelivered}"


def _pinned_then_any(trio: Trio, first: object):  # type: ignore[no-untyped-def]
    """A pick() for StreamClient: the given replica first, then any live one (round-robin)."""
    state = {"first": first}

    def pick(client: StreamClient):  # type: ignore[no-untyped-def]
        s = state.pop("first", None)
        if s is not None:
            return s
        live = [x for x in trio.live() if x is not client.current] or trio.live()
        return live[int(time.monotonic() * 1000) % len(live)]
    return pick


# -- 4. one login limit, not one per replica --------------------------------------------------------------
def test_login_rate_limit_is_one_bucket_across_replicas(fresh_trio) -> None:  # type: ignore[no-untyped-def]
    # RATELIMIT_TIMEOUT 2 s: on a loaded 2-core box the 500 ms default could fail open,
    # which is the documented behaviour but not what this test measures.
    # (The per-username bucket, paid before verifying by clients without a device
    # cookie, is kept out of the way: this test measures the per-IP one.)
    trio = fresh_trio(env={"SWITCHBOARD_LOGIN_IP_BURST": "6", "SWITCHBOARD_LOGIN_IP_RATE": "0.001",
                           "SWITCHBOARD_LOGIN_USER_BURST": "1000", "SWITCHBOARD_RATELIMIT_TIMEOUT": "2"})
    trio.user("kate")
    codes = []
    for i in range(12):
        s = trio.rr()
        r = httpx.post(s.base + "/auth/login", json={"username": "kate", "password": PASSWORD}, timeout=30)
        codes.append((s.port, r.status_code))
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1
    print(f"\nlogins round-robin: {codes}", flush=True)
    assert [c for _, c in codes] == [200] * 6 + [429] * 6
    assert len({p for p, c in codes if c == 200}) == 3  # the 6 admitted ones hit all three replicas


# -- 6. kill -9 mid-run -----------------------------------------------------------------------------------------
def test_kill9_replica_mid_run(fresh_trio) -> None:  # type: ignore[no-untyped-def]
    trio = fresh_trio()
    lease = float(trio.env["SWITCHBOARD_LEASE_SECONDS"])
    uid = trio.user("liam")
    admin_tok = trio.login("admin")
    h = auth(admin_tok)
    tok = trio.login("liam")
    trio.sql("SELECT switchboard.update_task(id, '{\"is_active\": false}') FROM switchboard.tasks "
             "WHERE name = 'switchboard.maintenance'")
    tick = httpx.post(trio.rr().base + "/tasks", headers=h, json={
        "name": "ha.tick", "schedule": "@every 1 second", "handler": "noop"}).json()["id"]
    slow = httpx.post(trio.rr().base + "/tasks", headers=h, json={
        "name": "ha.slow", "handler": "sleep", "args": {"seconds": 30}}).json()["id"]
    r = httpx.post(f"{trio.rr().base}/tasks/{slow}/trigger", headers=h)
    assert r.status_code == 202, r.text
    run1 = r.json()["run"]["id"]
    assert wait_until(lambda: trio.sql("SELECT status FROM switchboard.task_runs WHERE id = %s",
                                       (run1,))[0][0] == "running", 15)
    worker = trio.sql("SELECT worker FROM switchboard.task_runs WHERE id = %s", (run1,))[0][0]
    victim = replica_of_worker(trio.live(), worker)
    assert victim is not None, worker
    survivors = [s for s in trio.live() if s is not victim]

    # one browser tab per replica, all for liam; a numbered stream to liam
    clients = [StreamClient(tok, _pinned_then_any(trio, s), name=f"tab{i}") for i, s in enumerate(trio.live())]
    for c in clients:
        c.start()
    assert all(c.connected.wait(10) for c in clients)
    pub = Publisher(trio, admin_tok, uid)
    pub.start()
    # survivors' readiness, polled all along
    ready_codes: list[tuple[int, int]] = []
    stop_probe = threading.Event()

    def probe() -> None:
        while not stop_probe.is_set():
            for s in survivors:
                ready_codes.append((s.port, ready_status(s)))
            stop_probe.wait(0.1)
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    wait_until(lambda: pub.n >= 20, 10)

    trio.out_of_rotation(victim)          # under the publisher's lock: nothing in flight to it
    t_kill = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(5)
    killed_at_db = trio.sql("SELECT now()")[0][0]
    n_at_kill = pub.n

    # the slow run is rescued after the lease: abandoned + attempt 2, running on a survivor
    def rescued() -> bool:
        rows = trio.sql("SELECT id, status, attempt, worker, retry_of FROM switchboard.task_runs "
                        "WHERE task_id = %s ORDER BY id", (slow,))
        return len(rows) == 2 and rows[0][1] == "abandoned" and rows[1][1] == "running"
    assert wait_until(rescued, lease + 6), trio.sql(
        "SELECT id, status, attempt, worker FROM switchboard.task_runs WHERE task_id = %s", (slow,))
    t_rescue = time.monotonic() - t_kill
    rows = trio.sql("SELECT id, status, attempt, worker, retry_of, error FROM switchboard.task_runs "
                    "WHERE task_id = %s ORDER BY id", (slow,))
    assert rows[0][0] == run1 and "lease expired" in rows[0][5]
    assert rows[1][2] == 2 and rows[1][4] == run1
    assert replica_of_worker(survivors, rows[1][3]) is not None
    # publish through the outage a while longer; let the tick task fire a few more times
    time.sleep(3)
    n = pub.stop()
    assert not pub.errors, pub.errors
    stop_probe.set()
    prober.join(5)

    # the tick task kept firing, on the survivors, once per tick
    def after_kill() -> list[tuple]:
        return trio.sql("SELECT scheduled_for, count(*), array_agg(worker), array_agg(status) "
                        "FROM switchboard.task_runs WHERE task_id = %s AND scheduled_for > %s "
                        "GROUP BY 1 ORDER BY 1", (tick, killed_at_db))
    assert wait_until(lambda: len(after_kill()) >= 6, 10), after_kill()
    late = after_kill()
    assert all(r[1] == 1 for r in late), late
    assert all(replica_of_worker(survivors, w) for r in late for w in r[2]), late
    ticks = [r[0] for r in late]
    gaps = [(a, b) for a, b in itertools.pairwise(ticks) if (b - a).total_seconds() != 1.0]
    # A gap is allowed only if the victim died holding a tick's run: later ticks are then
    # skipped (never overlapped) until that run's lease expires and it is rescued.
    held = trio.sql("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s AND status = 'abandoned'",
                    (tick,))[0][0]
    assert gaps == [] or held == 1, (gaps, held)

    bad = [c for c in ready_codes if c[1] != 200]
    print(f"\nkill -9 of :{victim.port}: slow run rescued {t_rescue:.1f}s after the kill (lease {lease}s); "
          f"{len(ready_codes)} readiness probes of survivors, non-200: {bad}; {n} events "
          f"({n - n_at_kill} during the outage)", flush=True)
    assert bad == []
    _assert_stream(clients, n)
    moved = [c for c in clients if c.conn_ports[0] == victim.port]
    assert len(moved) == 1 and len(moved[0].conn_ports) >= 2 and moved[0].conn_ports[-1] != victim.port
    for c in clients:
        c.stop()


# -- 7. rolling restart -------------------------------------------------------------------------------------------
def test_rolling_restart_loses_nothing(fresh_trio) -> None:  # type: ignore[no-untyped-def]
    trio = fresh_trio()
    uid = trio.user("mia")
    admin_tok = trio.login("admin")
    h = auth(admin_tok)
    tok = trio.login("mia")
    trio.sql("SELECT switchboard.update_task(id, '{\"is_active\": false}') FROM switchboard.tasks "
             "WHERE name = 'switchboard.maintenance'")
    tick = httpx.post(trio.rr().base + "/tasks", headers=h, json={
        "name": "ha.tick", "schedule": "@every 1 second", "handler": "noop"}).json()["id"]
    # a long run that must be handed back (not abandoned) each time its replica drains
    slow = httpx.post(trio.rr().base + "/tasks", headers=h, json={
        "name": "ha.slow", "handler": "sleep", "args": {"seconds": 60}, "max_attempts": 1}).json()["id"]
    run = httpx.post(f"{trio.rr().base}/tasks/{slow}/trigger", headers=h).json()["run"]["id"]
    run_workers: list[str] = []

    def slow_run() -> tuple:
        return trio.sql("SELECT status, attempt, worker FROM switchboard.task_runs WHERE id = %s", (run,))[0]
    assert wait_until(lambda: slow_run()[0] == "running", 15)
    t_start = trio.sql("SELECT now()")[0][0]

    originals = trio.live()
    clients = [StreamClient(tok, _pinned_then_any(trio, s), name=f"tab{i}") for i, s in enumerate(originals)]
    for c in clients:
        c.start()
    assert all(c.connected.wait(10) for c in clients)
    # SIGTERM lands while the replica is still in the publisher's rotation (the load
    # balancer notices later): requests in flight must complete, later ones must fail
    # cleanly (never half-done), and the publisher sends those again elsewhere.
    pub = Publisher(trio, admin_tok, uid, retry=True)
    pub.start()
    wait_until(lambda: pub.n >= 10, 10)
    exits = []
    for old in originals:
        new = trio.start(1)[0]            # surge first, like a RollingUpdate with maxUnavailable 0
        run_workers.append(slow_run()[2])
        t0 = time.monotonic()
        old.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        trio.out_of_rotation(old)         # the load balancer catches up
        code = old.proc.wait(timeout=30)  # (one SIGTERM: a second one means "force")
        exits.append((old.port, code, round(time.monotonic() - t0, 2)))
        assert code == 0, f"replica :{old.port} exited {code} after SIGTERM:\n{old.log()}"
        n_before = pub.n
        wait_until(lambda n_before=n_before: pub.n >= n_before + 10, 10)
        assert new.proc.poll() is None
    time.sleep(1)
    n = pub.stop()
    assert not pub.errors, pub.errors
    print(f"\nrolling restart: exits (port, code, seconds) {exits}; {n} events, by replica "
          f"{dict(pub.by_port)}; refused while draining (not committed, sent again): "
          f"{len(pub.failed_uncommitted)}", flush=True)
    assert pub.failed_committed == [], pub.failed_committed  # no request was cut half-way
    _assert_stream(clients, n)
    for c in clients:
        # every original socket was closed with 1012 (service restart) and moved on
        assert c.close_codes and c.close_codes[0] == 1012, c.close_codes
        assert c.conn_ports[-1] not in {s.port for s in originals}
        c.stop()

    # the long run was handed back on every drain and lives on a new replica, same attempt
    assert wait_until(lambda: slow_run()[0] == "running", 15), slow_run()
    _, attempt, worker = slow_run()
    new_pids = {s.pid for s in trio.live()}
    print(f"slow run moved through workers {run_workers + [worker]}", flush=True)
    assert attempt == 1 and int(worker.split(":")[1]) in new_pids
    assert trio.sql("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s", (slow,))[0][0] == 1
    # and the @every 1 second task fired once per tick all along
    rows = trio.sql("SELECT scheduled_for, count(*) FROM switchboard.task_runs WHERE task_id = %s "
                    "AND scheduled_for > %s GROUP BY 1 ORDER BY 1", (tick, t_start))
    ticks = [r[0] for r in rows]
    assert all(r[1] == 1 for r in rows), rows
    gaps = [(a, b) for a, b in itertools.pairwise(ticks) if (b - a).total_seconds() != 1.0]
    assert gaps == [] and len(ticks) >= 5, (gaps, len(ticks))


# -- 8. PostgreSQL restart ------------------------------------------------------------------------------------------
@pytest.fixture
def own_pg():  # type: ignore[no-untyped-def]
    """A PostgreSQL of this test's own (it is stopped and started; the session's `pg` is not)."""
    from switchboard.migrate import migrate
    from switchboard.pgtest import ThrowawayPostgres

    server = ThrowawayPostgres()
    try:
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
            c.execute("CREATE DATABASE sb_ha_restart")
        url = server.url("sb_ha_restart")
        migrate(url)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
        yield server, url
    finally:
        server.stop()


def test_postgres_restart_replicas_recover_and_nothing_is_lost(fresh_trio, own_pg) -> None:  # type: ignore[no-untyped-def]
    server, url = own_pg
    trio = fresh_trio(db_url=url)
    uid = trio.user("noah")
    admin_tok = trio.login("admin")
    tok = trio.login("noah")
    tick = httpx.post(trio.rr().base + "/tasks", headers=auth(admin_tok), json={
        "name": "ha.tick", "schedule": "@every 1 second", "handler": "noop"}).json()["id"]
    stay = StreamClient(tok, _pinned_then_any(trio, trio[0]), name="stays")
    moves = StreamClient(tok, _pinned_then_any(trio, trio[1]), name="reconnects")
    for c in (stay, moves):
        c.start()
        assert c.connected.wait(10)
    pub = Publisher(trio, admin_tok, uid)
    for _ in range(10):
        pub.publish_one()
    assert stay.wait_for(lambda c: len(c.numbers()) == 10, 10)
    for _ in range(5):        # committed, and Postgres stops before anyone waits for delivery
        pub.publish_one()
    stopped_at = trio.sql("SELECT now()")[0][0]
    server.stop_server()
    t0 = time.monotonic()
    moves.drop()  # this tab loses its socket during the outage and keeps trying to come back
    assert wait_until(lambda: ready_all(trio.live()) == [503] * 3, 15), \
        ready_all(trio.live())
    t_down = time.monotonic() - t0
    reasons = httpx.get(trio[0].base + "/healthz/ready", timeout=5).json()["reasons"]
    time.sleep(2)
    assert ready_all(trio.live()) == [503] * 3
    assert all(s.proc.poll() is None for s in trio.live())
    server.start_server()
    t1 = time.monotonic()
    # When PostgreSQL itself started, not when this query ran: on a loaded machine the
    # replicas claim the first post-restart tick before the test's own query gets through.
    started_at = trio.sql("SELECT pg_postmaster_start_time()")[0][0]
    assert wait_until(lambda: ready_all(trio.live()) == [200] * 3, 30), \
        [(s.port, ready_status(s), s.log()[-2000:]) for s in trio.live()]
    t_up = time.monotonic() - t1
    for _ in range(15):
        pub.publish_one()
    print(f"\npostgres restart: all replicas 503 {t_down:.1f}s after stop ({reasons}); all 200 again "
          f"{t_up:.1f}s after start; reconnecting tab failed {moves.connect_failures} connects", flush=True)
    _assert_stream([stay, moves], 30)
    assert stay.conn_ports == [trio[0].port]  # never needed to reconnect
    assert len(moves.conn_ports) >= 2
    for c in (stay, moves):
        c.stop()

    # the scheduler came back by itself: the missed ticks fire once (not once each), on the grid
    def ticks_after(t):  # type: ignore[no-untyped-def]
        return [r[0] for r in trio.sql("SELECT scheduled_for FROM switchboard.task_runs WHERE task_id = %s "
                                       "AND scheduled_for > %s ORDER BY 1", (tick, t))]
    assert wait_until(lambda: len(ticks_after(started_at)) >= 3, 10)
    rows = trio.sql("SELECT scheduled_for, count(*) FROM switchboard.task_runs WHERE task_id = %s "
                    "GROUP BY 1 ORDER BY 1", (tick,))
    ticks = [r[0] for r in rows]
    assert all(r[1] == 1 for r in rows), rows
    assert all((b - a).total_seconds() % 1 == 0 for a, b in itertools.pairwise(ticks)), ticks  # fixed-rate grid
    # Ticks due inside the outage window: a grid tick may still have been claimed between
    # `SELECT now()` and the moment Postgres actually stopped (its run was created before the
    # restart); after the restart the missed ticks fire exactly once.
    created = dict(trio.sql("SELECT scheduled_for, created_at FROM switchboard.task_runs "
                            "WHERE task_id = %s", (tick,)))
    during = [t for t in ticks if stopped_at < t < started_at]
    # The catch-up fires once: its scheduled_for is the newest grid point at the moment of the
    # first claim after the restart, which is inside the outage window or (when that claim comes
    # later than one period after the restart) already past it -- never one run per missed tick.
    caught_up = [t for t in during if created[t] >= started_at]
    assert len(caught_up) <= 1, (during, caught_up, stopped_at, started_at)
    assert len(during) - len(caught_up) <= 1, (during, stopped_at, started_at)


# -- 10. concurrent start on an empty database ---------------------------------------------------------------------
def test_three_replicas_migrate_an_empty_database_at_once(pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    name = f"sb_ha_empty_{int(time.time() * 1000)}"
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = pg.url(name)  # superuser: the owner role that migrates
    # The replicas serve as the least-privilege app role and migrate as the owner.
    trio = Trio(url, tmp_path, env={"SWITCHBOARD_MIGRATION_DATABASE_URL": url})
    try:
        new = trio.start(3, wait=False, migrate=True)   # Popen all three back to back
        for s in new:
            s.wait_ready(90)
        versions = trio.sql("SELECT version, count(*) FROM switchboard.schema_version GROUP BY 1 ORDER BY 1")
        files = sorted(p.name for p in (ROOT / "db" / "migrations").glob("V*.sql"))
        logs = [s.log() for s in new]
        applied = [lg for lg in logs if "applied migrations" in lg]
        print(f"\nconcurrent start: schema_version {versions}; replicas that applied: {len(applied)}, "
              f"the others: {sum('nothing applied' in lg for lg in logs)} x 'nothing applied'", flush=True)
        assert len(versions) == len(files) and all(k == 1 for _, k in versions), versions
        assert len(applied) == 1, logs
        assert sum("nothing applied" in lg for lg in logs) == 2, logs
        assert all(ready_status(s) == 200 for s in new)
        # and they work together: a ticket from one is consumed on another
        trio.user("olga")
        tok = new[0].login("olga", PASSWORD)
        from harness import WS
        from websockets.sync.client import connect
        WS(connect(f"{new[2].ws_base}/ws?ticket={new[1].ticket(tok)}", open_timeout=5)).close()
    finally:
        trio.stop_all()
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
