"""Scheduler: claims, leases, exclusivity, transactional enqueue, retries.

Races run on a fresh clone (`db`) with one real connection per worker; pure
function behaviour runs in a rolled-back transaction (`conn`). Every test
pauses the default 'switchboard.maintenance' task first (it is due at once in
a fresh database and would otherwise be the first thing claimed).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from pgtap import listener, notifications, race, throws_ok
from psycopg.rows import dict_row

WAKE = "switchboard_runs"


def pause_maintenance(c: psycopg.Connection) -> None:
    n = c.execute(
        """SELECT count(switchboard.update_task(id, '{"is_active": false}'))
             FROM switchboard.tasks WHERE name = 'switchboard.maintenance'"""
    ).fetchone()[0]
    assert n == 1


def claim(c: psycopg.Connection, worker: str, lease: str = "60 seconds") -> dict | None:
    return c.cursor(row_factory=dict_row).execute(
        "SELECT * FROM switchboard.claim_due_task(%s, %s::interval)", (worker, lease)
    ).fetchone()


def run_row(c: psycopg.Connection, run_id: int) -> dict:
    return c.cursor(row_factory=dict_row).execute(
        "SELECT * FROM switchboard.task_runs WHERE id = %s", (run_id,)
    ).fetchone()


# --- 1. claim under contention, a killed worker, lease expiry ---------------------

def test_eight_workers_claim_ten_thousand_jobs_exactly_once(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        with c.transaction():
            n = c.execute(
                """SELECT count(r.id) FROM generate_series(1, 10000) g,
                          LATERAL switchboard.enqueue('bulk', jsonb_build_object('i', g)) r"""
            ).fetchone()[0]
        assert n == 10000

    def worker(i: int, barrier: threading.Barrier) -> list[int]:
        got: list[int] = []
        with psycopg.connect(db, autocommit=True) as w:
            barrier.wait()
            while True:
                row = w.execute(
                    "SELECT id, worker, status FROM switchboard.claim_due_task(%s)", (f"w{i}",)
                ).fetchone()
                if row is None:
                    return got
                assert row[1:] == (f"w{i}", "running")
                got.append(row[0])

    per_worker = race(8, worker)
    claimed = [rid for ids in per_worker for rid in ids]
    assert len(claimed) == 10000
    assert len(set(claimed)) == 10000, "a run was claimed twice"
    assert all(per_worker), "some worker never got any work (no real contention)"
    with psycopg.connect(db) as c:
        assert c.execute(
            "SELECT count(*) FROM switchboard.task_runs WHERE status = 'queued'").fetchone()[0] == 0
        in_db = dict(c.execute(
            "SELECT id, worker FROM switchboard.task_runs WHERE handler = 'bulk' AND status = 'running'"
        ).fetchall())
    # the database agrees with the workers about who holds what
    assert in_db == {rid: f"w{i}" for i, ids in enumerate(per_worker) for rid in ids}


def test_killed_worker_keeps_schedule_lease_expires_and_is_fenced(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        task_id = c.execute(
            "SELECT id FROM switchboard.create_task('hourly-report', '@every 1 hour', 'report')"
        ).fetchone()[0]
        anchor = c.execute(
            """UPDATE switchboard.tasks SET next_run_at = now() - interval '1 minute'
                WHERE id = %s RETURNING next_run_at""", (task_id,)).fetchone()[0]

        doomed = psycopg.connect(db, autocommit=True)
        pid = doomed.info.backend_pid
        run = claim(doomed, "w-doomed", "2 seconds")
        assert run is not None and run["task_id"] == task_id and run["attempt"] == 1
        assert c.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0] is True
        doomed.close()
        for _ in range(100):
            if not c.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                break
            time.sleep(0.05)

        # the tick was committed together with the new next_run_at: the task is still scheduled
        next_at, now = c.execute(
            "SELECT next_run_at, now() FROM switchboard.tasks WHERE id = %s", (task_id,)).fetchone()
        assert next_at == anchor + timedelta(hours=1) and next_at > now
        assert run_row(c, run["id"])["status"] == "running"

        # the lease has not expired yet: nothing to reap (unless this machine took 2 s to get here)
        fresh, reaped = c.execute("SELECT now() < %s, switchboard.reap_expired_runs()",
                                  (run["lease_expires_at"],)).fetchone()
        if fresh:
            assert reaped == 0
            while not c.execute("SELECT clock_timestamp() > %s", (run["lease_expires_at"],)).fetchone()[0]:
                time.sleep(0.05)
            reaped = c.execute("SELECT switchboard.reap_expired_runs()").fetchone()[0]
        assert reaped == 1

        old = run_row(c, run["id"])
        assert old["status"] == "abandoned" and "w-doomed" in old["error"]
        retry = c.cursor(row_factory=dict_row).execute(
            "SELECT * FROM switchboard.task_runs WHERE retry_of = %s", (run["id"],)).fetchone()
        assert (retry["status"], retry["attempt"], retry["task_id"], retry["worker"]) == (
            "queued", 2, task_id, None)

        # fencing: the stale worker comes back and tries to finish; nothing changes
        before = c.execute("SELECT r::text FROM switchboard.task_runs r WHERE id IN (%s, %s) ORDER BY id",
                           (run["id"], retry["id"])).fetchall()
        assert c.execute("SELECT switchboard.finish_run(%s, 'w-doomed', true)", (run["id"],)).fetchone()[0] is False
        assert c.execute("SELECT switchboard.finish_run(%s, 'w-doomed', true)", (retry["id"],)).fetchone()[0] is False
        assert c.execute("SELECT switchboard.heartbeat_run(%s, 'w-doomed')", (run["id"],)).fetchone()[0] is False
        after = c.execute("SELECT r::text FROM switchboard.task_runs r WHERE id IN (%s, %s) ORDER BY id",
                          (run["id"], retry["id"])).fetchall()
        assert before == after

        # another worker takes the retry
        again = claim(c, "w-healthy")
        assert again["id"] == retry["id"] and again["attempt"] == 2
        assert c.execute("SELECT switchboard.finish_run(%s, 'w-healthy', true)", (retry["id"],)).fetchone()[0]


# --- 2. exclusivity, transactional enqueue, wake-ups ------------------------------------

def test_create_run_exclusive_sixteen_racers_one_run(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        task_id = c.execute(
            "SELECT id FROM switchboard.create_task('manual-only', NULL, 'export')").fetchone()[0]

    def racer(i: int, barrier: threading.Barrier) -> list:
        with psycopg.connect(db) as w:  # explicit transaction
            w.execute("SELECT 1")
            barrier.wait()
            rows = w.execute(
                "SELECT id, status, trigger FROM switchboard.create_run_exclusive(%s, 'api')", (task_id,)
            ).fetchall()
            time.sleep(0.05)  # hold the transaction open: the others must wait on the index
            w.commit()
            return rows

    results = race(16, racer)
    winners = [r for r in results if r]
    assert len(winners) == 1, results
    assert winners[0][0][1:] == ("queued", "api")
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s",
                         (task_id,)).fetchone()[0] == 1
        # once that run is finished the task can run again
        run = claim(c, "w1")
        assert run["id"] == winners[0][0][0]
        assert c.execute("SELECT count(*) FROM switchboard.create_run_exclusive(%s)",
                         (task_id,)).fetchone()[0] == 0  # still running
        assert c.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (run["id"],)).fetchone()[0]
        assert c.execute("SELECT count(*) FROM switchboard.create_run_exclusive(%s)",
                         (task_id,)).fetchone()[0] == 1
        throws_ok(c, "SELECT * FROM switchboard.create_run_exclusive(gen_random_uuid())", "P0002")


def test_enqueue_is_transactional_and_wakes_workers_at_commit(db: str) -> None:
    lst = listener(db, WAKE)
    try:
        with psycopg.connect(db) as producer, psycopg.connect(db, autocommit=True) as other:
            pause_maintenance(other)
            notifications(lst, 0.1)  # drain the pause's noise, if any

            producer.execute("SELECT * FROM switchboard.enqueue('mail', '{\"to\": \"a\"}')")
            producer.rollback()
            assert notifications(lst, 0.3) == []
            assert other.execute(
                "SELECT count(*) FROM switchboard.task_runs WHERE handler = 'mail'").fetchone()[0] == 0

            job = producer.execute(
                "SELECT id FROM switchboard.enqueue('mail', '{\"to\": \"b\"}')").fetchone()[0]
            assert notifications(lst, 0.3) == [], "woken before COMMIT"
            assert other.execute("SELECT count(*) FROM switchboard.task_runs WHERE id = %s",
                                 (job,)).fetchone()[0] == 0
            assert claim(other, "w-early") is None, "claimed an uncommitted job"
            producer.commit()
            got = notifications(lst, 2.0, stop_after=1)
            assert [n.channel for n in got] == [WAKE]
            run = claim(other, "w1")
            assert run["id"] == job and run["args"] == {"to": "b"} and run["trigger"] == "enqueue"
    finally:
        lst.close()


def test_sixteen_racing_enqueues_with_one_queueing_lock_make_one_job(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)

    def racer(i: int, barrier: threading.Barrier) -> list:
        with psycopg.connect(db) as w:
            w.execute("SELECT 1")
            barrier.wait()
            rows = w.execute(
                "SELECT id FROM switchboard.enqueue('sync', jsonb_build_object('by', %s::int), "
                "queueing_lock => 'sync:user:42')", (i,)).fetchall()
            time.sleep(0.05)
            w.commit()
            return rows

    results = race(16, racer)
    assert sum(1 for r in results if r) == 1, results
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE queueing_lock = 'sync:user:42'"
                         ).fetchone()[0] == 1
        run = claim(c, "w1")
        # still held while running
        assert c.execute("SELECT count(*) FROM switchboard.enqueue('sync', queueing_lock => 'sync:user:42')"
                         ).fetchone()[0] == 0
        assert c.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (run["id"],)).fetchone()[0]
        # released once the job is done
        assert c.execute("SELECT count(*) FROM switchboard.enqueue('sync', queueing_lock => 'sync:user:42')"
                         ).fetchone()[0] == 1


def test_job_is_not_claimed_before_run_at(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    job = conn.execute(
        "SELECT id FROM switchboard.enqueue('later', '{}', now() + interval '2 seconds')").fetchone()[0]
    assert claim(conn, "w1") is None
    conn.execute("UPDATE switchboard.task_runs SET run_at = now() - interval '1 millisecond' WHERE id = %s",
                 (job,))
    assert claim(conn, "w1")["id"] == job


def test_claim_takes_oldest_due_first_across_jobs_and_ticks(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    j_new = conn.execute("SELECT id FROM switchboard.enqueue('a', '{}', now() - interval '1 minute')").fetchone()[0]
    j_old = conn.execute("SELECT id FROM switchboard.enqueue('b', '{}', now() - interval '3 minutes')").fetchone()[0]
    t = conn.execute("SELECT id FROM switchboard.create_task('t', '@every 1 hour', 'c')").fetchone()[0]
    conn.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '2 minutes' WHERE id = %s", (t,))
    order = [claim(conn, f"w{i}") for i in range(4)]
    assert [(r["id"] if r["task_id"] is None else r["task_id"]) for r in order[:3]] == [j_old, t, j_new]
    assert order[3] is None


def test_enqueue_validates_its_arguments(conn: psycopg.Connection) -> None:
    throws_ok(conn, "SELECT * FROM switchboard.enqueue('bad handler!')", "22023", match="bad handler!")
    throws_ok(conn, "SELECT * FROM switchboard.enqueue('ok', '[1]')", "22023", match="array")
    throws_ok(conn, "SELECT * FROM switchboard.enqueue('ok', max_attempts => 0)", "22023", match="0")
    throws_ok(conn, "SELECT * FROM switchboard.claim_due_task('')", "22023", match="worker")
    throws_ok(conn, "SELECT * FROM switchboard.claim_due_task('w', '0 seconds')", "22023", match="lease")


# --- 7. runs: retries, rescue, catch-up, skipped ticks, history -------------------------

def test_failed_run_is_retried_with_backoff_until_attempts_run_out(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    first = conn.execute("SELECT id FROM switchboard.enqueue('flaky', '{\"n\": 1}')").fetchone()[0]
    run_id, attempts, backoffs = first, [], []
    for attempt in (1, 2, 3):
        run = claim(conn, "w1")
        assert run["id"] == run_id and run["attempt"] == attempt
        attempts.append(attempt)
        assert conn.execute("SELECT switchboard.finish_run(%s, 'w1', false, NULL, 'boom')",
                            (run_id,)).fetchone()[0] is True
        failed = run_row(conn, run_id)
        assert failed["status"] == "failed" and failed["error"] == "boom"
        retry = conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM switchboard.task_runs WHERE retry_of = %s", (run_id,)).fetchone()
        if attempt == 3:
            assert retry is None, "retried past max_attempts"
            break
        assert (retry["status"], retry["attempt"], retry["args"]) == ("queued", attempt + 1, {"n": 1})
        backoffs.append(retry["run_at"] - failed["finished_at"])
        assert claim(conn, "w1") is None, "retry claimable before its backoff"
        conn.execute("UPDATE switchboard.task_runs SET run_at = now() - interval '1 ms' WHERE id = %s",
                     (retry["id"],))
        run_id = retry["id"]
    assert backoffs == [timedelta(seconds=2), timedelta(seconds=4)]
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'flaky'").fetchone()[0] == 3


def test_expired_lease_is_rescued_by_claim_itself(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    job = conn.execute("SELECT id FROM switchboard.enqueue('slow', max_attempts => 2)").fetchone()[0]
    assert claim(conn, "w1", "1 second")["id"] == job
    conn.execute("UPDATE switchboard.task_runs SET lease_expires_at = now() - interval '1 ms' WHERE id = %s",
                 (job,))
    rescued = claim(conn, "w2")  # no reaper ran
    assert rescued is not None and rescued["retry_of"] == job
    assert (rescued["attempt"], rescued["worker"], rescued["status"]) == (2, "w2", "running")
    assert run_row(conn, job)["status"] == "abandoned"
    assert conn.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (job,)).fetchone()[0] is False
    # the last attempt expires too: abandoned, no further retry
    conn.execute("UPDATE switchboard.task_runs SET lease_expires_at = now() - interval '1 ms' WHERE id = %s",
                 (rescued["id"],))
    assert conn.execute("SELECT switchboard.reap_expired_runs()").fetchone()[0] == 1
    assert claim(conn, "w3") is None
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'slow'").fetchone()[0] == 2


def test_after_a_long_pause_a_task_fires_once_on_its_grid(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        t = c.execute("SELECT id FROM switchboard.create_task('tick', '@every 10 seconds', 'tick')").fetchone()[0]
        # an hour of missed ticks (360); the grid is offset 5 seconds from now()
        old = c.execute(
            """UPDATE switchboard.tasks SET next_run_at = now() - interval '1 hour 5 seconds'
                WHERE id = %s RETURNING next_run_at""", (t,)).fetchone()[0]
        with c.transaction():
            run = claim(c, "w1")
            now, nxt = c.execute("SELECT now(), next_run_at FROM switchboard.tasks WHERE id = %s",
                                 (t,)).fetchone()
        assert run["task_id"] == t and run["scheduled_for"] == old
        assert nxt > now and nxt - now <= timedelta(seconds=10)
        assert (nxt - old) % timedelta(seconds=10) == timedelta(0), "left the fixed-rate grid"
        assert c.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (run["id"],)).fetchone()[0]
        assert claim(c, "w2") is None, "fired again for a missed tick"
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s", (t,)).fetchone()[0] == 1
        assert c.execute("SELECT skipped_ticks FROM switchboard.tasks WHERE id = %s", (t,)).fetchone()[0] == 0


def test_due_tick_with_an_active_run_is_skipped_and_counted(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    t = conn.execute("SELECT id FROM switchboard.create_task('long', '@every 1 minute', 'long')").fetchone()[0]
    conn.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '5 seconds' WHERE id = %s", (t,))
    first = claim(conn, "w1")
    assert first["task_id"] == t
    conn.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '1 second' WHERE id = %s", (t,))
    assert claim(conn, "w2") is None  # the tick is due, but the first run still runs
    skipped, nxt, now = conn.execute(
        "SELECT skipped_ticks, next_run_at, now() FROM switchboard.tasks WHERE id = %s", (t,)).fetchone()
    assert skipped == 1 and nxt > now
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s", (t,)).fetchone()[0] == 1
    # a queued manual run is skipped over the same way: the tick is counted, the run is claimed
    assert conn.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (first["id"],)).fetchone()[0]
    manual = conn.execute("SELECT id FROM switchboard.create_run_exclusive(%s)", (t,)).fetchone()[0]
    conn.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '1 minute' WHERE id = %s", (t,))
    assert claim(conn, "w3")["id"] == manual
    assert conn.execute("SELECT skipped_ticks FROM switchboard.tasks WHERE id = %s", (t,)).fetchone()[0] == 2


def test_reap_runs_keeps_recent_history_only(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    ids = [conn.execute("SELECT id FROM switchboard.enqueue('h')").fetchone()[0] for _ in range(5)]
    for rid in ids[:4]:
        assert claim(conn, "w")["id"] == rid
    for rid, ok in zip(ids[:3], (True, False, True)):
        conn.execute("SELECT switchboard.finish_run(%s, 'w', %s)", (rid, ok))
    conn.execute("UPDATE switchboard.task_runs SET created_at = now() - interval '30 days'")
    # two old finished runs, one recent; one running and one queued (old or not) are never reaped
    conn.execute("UPDATE switchboard.task_runs SET finished_at = now() - interval '8 days' WHERE id IN (%s, %s)",
                 (ids[0], ids[1]))
    conn.execute("UPDATE switchboard.task_runs SET run_at = now() - interval '9 days' WHERE id = %s", (ids[4],))
    retry_of_1 = conn.execute("SELECT id FROM switchboard.task_runs WHERE retry_of = %s", (ids[1],)).fetchone()[0]
    # V0036: retention drops whole day partitions. Runs finished 8 days ago (moved there
    # by the UPDATE) are in task_runs_history_before, whose range ends today: a
    # partition goes when all of it is older than keep, so they stay ...
    assert conn.execute("SELECT switchboard.reap_runs('7 days')").fetchone()[0] == 0
    every = {ids[0], ids[1], ids[2], ids[3], ids[4], retry_of_1}
    assert {r[0] for r in conn.execute("SELECT id FROM switchboard.task_runs WHERE handler = 'h'")} == every
    # ... until it is: with keep 0 that partition is dropped whole (no row is deleted one
    # by one: 0 back), today's partition and the active runs stay.
    assert conn.execute("SELECT switchboard.reap_runs('0 seconds')").fetchone()[0] == 0
    assert conn.execute("SELECT to_regclass('switchboard.task_runs_history_before')").fetchone()[0] is None
    left = {r[0] for r in conn.execute("SELECT id FROM switchboard.task_runs WHERE handler = 'h'")}
    assert left == {ids[2], ids[3], ids[4], retry_of_1}
    throws_ok(conn, "SELECT switchboard.reap_runs('-1 day')", "22023")


def test_cancel_run_cancels_queued_and_running_runs(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    a = conn.execute("SELECT id FROM switchboard.enqueue('c')").fetchone()[0]
    b = conn.execute("SELECT id FROM switchboard.enqueue('c')").fetchone()[0]
    assert conn.execute("SELECT switchboard.cancel_run(%s)", (a,)).fetchone()[0] is True
    row = run_row(conn, a)
    assert row["status"] == "cancelled" and row["error"].endswith("before it started")
    assert conn.execute("SELECT switchboard.cancel_run(%s)", (a,)).fetchone()[0] is False
    assert claim(conn, "w")["id"] == b
    assert conn.execute("SELECT switchboard.cancel_run(%s)", (b,)).fetchone()[0] is True
    row = run_row(conn, b)
    assert row["status"] == "cancelled" and row["error"].endswith("while running on w")
    assert conn.execute("SELECT switchboard.finish_run(%s, 'w', true)", (b,)).fetchone()[0] is False
    assert run_row(conn, b)["status"] == "cancelled"
    with pytest.raises(psycopg.errors.NoDataFound):
        conn.execute("SELECT switchboard.cancel_run(-1)")


def test_release_run_hands_a_running_run_back(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    job = conn.execute("SELECT id FROM switchboard.enqueue('r')").fetchone()[0]
    assert claim(conn, "w1")["id"] == job
    assert conn.execute("SELECT switchboard.release_run(%s, 'w2')", (job,)).fetchone()[0] is False
    assert conn.execute("SELECT switchboard.release_run(%s, 'w1')", (job,)).fetchone()[0] is True
    row = run_row(conn, job)
    assert (row["status"], row["worker"], row["lease_expires_at"], row["attempt"]) == ("queued", None, None, 1)
    again = claim(conn, "w2")
    assert (again["id"], again["attempt"], again["worker"]) == (job, 1, "w2")
    assert conn.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (job,)).fetchone()[0] is False


def test_heartbeat_extends_only_the_owners_lease(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    job = conn.execute("SELECT id FROM switchboard.enqueue('hb')").fetchone()[0]
    claim(conn, "w1", "10 seconds")
    assert conn.execute("SELECT switchboard.heartbeat_run(%s, 'w1', '5 minutes')", (job,)).fetchone()[0] is True
    assert conn.execute("SELECT lease_expires_at - now() FROM switchboard.task_runs WHERE id = %s",
                        (job,)).fetchone()[0] == timedelta(minutes=5)
    assert conn.execute("SELECT switchboard.heartbeat_run(%s, 'w2')", (job,)).fetchone()[0] is False


def test_update_and_delete_task(conn: psycopg.Connection) -> None:
    t = conn.execute("SELECT id FROM switchboard.create_task('nightly', '@every 1 hour', 'n', '{\"a\": 1}')"
                     ).fetchone()[0]
    row = conn.cursor(row_factory=dict_row).execute(
        """SELECT * FROM switchboard.update_task(%s, '{"is_active": false, "args": {"a": 2}, "max_attempts": 5}')""",
        (t,)).fetchone()
    assert (row["is_active"], row["args"], row["max_attempts"], row["name"]) == (False, {"a": 2}, 5, "nightly")
    assert conn.execute("SELECT is_active FROM switchboard.tasks WHERE id = %s", (t,)).fetchone()[0] is False
    row = conn.cursor(row_factory=dict_row).execute(
        """SELECT * FROM switchboard.update_task(%s, '{"schedule": "@every 10 minutes", "is_active": true}')""",
        (t,)).fetchone()
    assert row["schedule"] == "@every 10 minutes"
    assert conn.execute("SELECT next_run_at - now() FROM switchboard.tasks WHERE id = %s",
                        (t,)).fetchone()[0] == timedelta(minutes=10)
    throws_ok(conn, "SELECT switchboard.update_task(%s, '{\"colour\": 1}')", "22023", (t,), match="colour")
    throws_ok(conn, "SELECT switchboard.update_task(%s, '{\"timezone\": \"Mars/Olympus\"}')", "22023", (t,),
              match="Mars/Olympus")
    throws_ok(conn, "SELECT switchboard.update_task(gen_random_uuid(), '{}')", "P0002")
    # bad values are 22023 naming the value, never a constraint or cast error
    throws_ok(conn, "SELECT switchboard.update_task(%s, jsonb_build_object('name', repeat('n', 201)))",
              "22023", (t,), match="nnnnnnnn")
    throws_ok(conn, "SELECT switchboard.update_task(%s, '{\"max_attempts\": 2.5}')", "22023", (t,), match="2.5")
    throws_ok(conn, "SELECT switchboard.update_task(%s, '{\"max_attempts\": 0}')", "22023", (t,))
    throws_ok(conn, "SELECT switchboard.update_task(%s, '{\"is_active\": \"yes\"}')", "22023", (t,))
    conn.execute("SELECT switchboard.create_task('other', NULL, 'x')")
    throws_ok(conn, "SELECT switchboard.update_task(%s, '{\"name\": \"other\"}')", "23505", (t,))
    conn.execute("SELECT * FROM switchboard.create_run_exclusive(%s)", (t,))
    assert conn.execute("SELECT switchboard.delete_task(%s)", (t,)).fetchone()[0] is True
    assert conn.execute("SELECT switchboard.delete_task(%s)", (t,)).fetchone()[0] is False
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s", (t,)).fetchone()[0] == 0


def test_create_task_errors(conn: psycopg.Connection) -> None:
    throws_ok(conn, "SELECT switchboard.create_task('a', '@every 1 hour', 'no such handler')", "22023",
              match="no such handler")
    throws_ok(conn, "SELECT switchboard.create_task('a', '@every 1 hour', 'h', '{}', 'Mars/Olympus')", "22023",
              match="Mars/Olympus")
    throws_ok(conn, "SELECT switchboard.create_task('a', 'whenever you like', 'h')", "22023",
              match="whenever you like")
    throws_ok(conn, "SELECT switchboard.create_task('a', NULL, 'h', '[]')", "22023")
    throws_ok(conn, "SELECT switchboard.create_task('', NULL, 'h')", "22023")
    conn.execute("SELECT switchboard.create_task('dup', NULL, 'h')")
    throws_ok(conn, "SELECT switchboard.create_task('dup', NULL, 'h')", "23505", match="dup")
    # trigger-only tasks are never due
    assert conn.execute("SELECT next_run_at FROM switchboard.tasks WHERE name = 'dup'").fetchone()[0] is None


# --- plans: the hot UPDATEs probe the primary key ---------------------------------------

def _nested_plans(c: psycopg.Connection) -> list[str]:
    """Turn on auto_explain for nested statements, reported as NOTICEs on c."""
    plans: list[str] = []
    c.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    try:
        c.execute("LOAD 'auto_explain'")
    except psycopg.errors.UndefinedFile:
        pytest.skip("auto_explain is not installed")
    c.execute("SET auto_explain.log_min_duration = 0")
    c.execute("SET auto_explain.log_nested_statements = on")
    c.execute("SET auto_explain.log_level = 'notice'")
    return plans


def test_fenced_updates_probe_the_primary_key(db: str) -> None:
    """finish_run / heartbeat_run / release_run touch one row by id.

    Their generic plans must probe task_runs_pkey. With task_runs_running
    defined on "status = 'running'" alone, the planner walked that whole index
    (every running row and every dead entry since the last vacuum) for each
    call, so finishing a job got slower the more jobs ran.
    """
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        c.execute("SELECT count(*) FROM generate_series(1, 200) g, "
                  "LATERAL switchboard.enqueue('p', jsonb_build_object('i', g))")
        # statistics taken while nothing ran (the usual case: a small running set)...
        c.execute("VACUUM ANALYZE switchboard.task_runs_hot")
        # ...then 50 workers hold runs
        runs = [claim(c, f"w{i}")["id"] for i in range(50)]
        c.execute("SET plan_cache_mode = force_generic_plan")  # what PL/pgSQL settles on
        c.execute("SET enable_seqscan = off")  # a real task_runs is big; ask which index wins
        plans = _nested_plans(c)
        assert c.execute("SELECT switchboard.heartbeat_run(%s, 'w0')", (runs[0],)).fetchone()[0]
        assert c.execute("SELECT switchboard.finish_run(%s, 'w1', true)", (runs[1],)).fetchone()[0]
        assert c.execute("SELECT switchboard.release_run(%s, 'w2')", (runs[2],)).fetchone()[0]
    # finish_run moves the run (V0036: DELETE from task_runs_hot ... INSERT into history)
    updates = [p for p in plans if ("UPDATE switchboard.task_runs_hot" in p or "DELETE FROM switchboard.task_runs_hot" in p)
               and "worker =" in p]
    assert len(updates) == 3, plans
    for plan in updates:
        assert "Index Scan using task_runs_pkey" in plan, plan
        assert "task_runs_running" not in plan, plan


def test_a_tasks_history_is_read_through_its_index(conn: psycopg.Connection) -> None:
    # the server's listing query; task_runs_by_task leaves one-off jobs out, and
    # "task_id = $1" must still prove its predicate
    conn.execute("SET LOCAL enable_seqscan = off")
    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    conn.execute("PREPARE history(uuid) AS SELECT id FROM switchboard.task_runs "
                  "WHERE task_id = $1 ORDER BY id DESC LIMIT 20")
    try:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE history(gen_random_uuid())"))
    finally:
        conn.execute("DEALLOCATE history")
    assert "task_runs_by_task" in plan, plan


@pytest.mark.parametrize("call", [
    "switchboard._random_128()",
    "switchboard._wake_workers()",
    "switchboard._announce('{}'::jsonb)",
])
def test_hot_sql_helpers_are_inlined(conn: psycopg.Connection, call: str) -> None:
    """A SQL-language helper that the planner cannot inline (a SET clause or a
    FROM in its body) is parsed and planned again in every transaction that
    calls it; for _random_128 that doubled the cost of issuing a ticket."""
    plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN (VERBOSE) SELECT {call}"))
    name = call.split("(")[0].split(".")[1]
    assert name not in plan, plan
    assert "gen_random_uuid" in plan or "pg_notify" in plan, plan


def test_a_due_job_is_claimed_and_finished_in_one_statement_each(db: str) -> None:
    """V0017's hot path: with a queued run due, no due tick and no expired lease,
    claim_due_task runs one statement (the gated UPDATE of the queue head) and a
    successful finish_run one (its fenced UPDATE). The gate still sends a due tick
    and an expired lease through the ordered rounds, and a paused handler's
    queued run is still passed over on the hot path."""
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        paused = c.execute("SELECT id FROM switchboard.enqueue('held', '{}', now() - interval '5 minutes')"
                           ).fetchone()[0]
        c.execute("SELECT switchboard.pause_handler('held')")
        job = c.execute("SELECT id FROM switchboard.enqueue('a', '{}', now() - interval '4 minutes')").fetchone()[0]
        later = c.execute("SELECT id FROM switchboard.enqueue('b', '{}', now() - interval '1 minute')").fetchone()[0]
        plans = _nested_plans(c)

        def nested(call: str) -> tuple[object, list[str]]:
            plans.clear()
            value = c.execute(call).fetchone()
            inner = [p for p in plans if "claim_due_task(" not in p and "finish_run(" not in p]
            return value, inner

        run, inner = nested("SELECT id FROM switchboard.claim_due_task('w1')")
        assert run == (job,), "the paused handler's older run was claimed"
        assert len(inner) == 1 and "NOT EXISTS" in inner[0], inner
        done, inner = nested(f"SELECT switchboard.finish_run({job}, 'w1', true)")
        assert done == (True,) and len(inner) == 1, inner
        # a fenced finish of somebody else's run changes nothing, still one statement
        done, inner = nested(f"SELECT switchboard.finish_run({job}, 'w1', true)")
        assert done == (False,) and len(inner) == 1, inner

        # a due tick older than the queue head closes the gate: the ordered rounds take the tick
        t = c.execute("SELECT id FROM switchboard.create_task('t', '@every 1 hour', 'c')").fetchone()[0]
        c.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '2 minutes' WHERE id = %s", (t,))
        run, inner = nested("SELECT task_id FROM switchboard.claim_due_task('w2')")
        assert run == (t,) and len(inner) > 1, inner
        assert c.execute("SELECT status FROM switchboard.task_runs WHERE id = %s", (later,)).fetchone() == ("queued",)
        run, _ = nested("SELECT id FROM switchboard.claim_due_task('w3')")
        assert run == (later,)
        assert c.execute("SELECT status FROM switchboard.task_runs WHERE id = %s", (paused,)).fetchone() == ("queued",)
