"""V0015: reap_events(keep, max_rows) deletes at most max_rows per call, oldest
first; the horizon moves to the cut before its events go, so nobody resumes
silently across a partly reaped batch; the previous release's reap_events(keep)
and maintenance(keep_events =>, replica_stale =>) keep working unchanged."""

from __future__ import annotations

import threading

import psycopg
import pytest
from pgtap import throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
END = 9223372036854775807


def _user(c: psycopg.Connection, name: str) -> str:
    _rows_in_default(c)
    return c.execute("SELECT switchboard.create_user(%s, %s)", (name, ARGON)).fetchone()[0]


def _rows_in_default(c: psycopg.Connection) -> None:
    """Since V0037 reap_events drops whole partitions; rows are deleted one by one only
    in events_default, where a burst that outran the partitions ahead lands. These tests
    pin that row path (bounded batches, the horizon first, leftovers, racing reapers):
    the range partitions of the fresh database go, so the test's events land in
    events_default. The first reap_events creates partitions ahead again, starting
    max_connections ids above the sequence: the few events published after it still
    land in events_default."""
    for (name,) in c.execute("SELECT partition_name FROM switchboard.event_partitions() "
                             "WHERE NOT is_default").fetchall():
        c.execute(f"ALTER TABLE switchboard.events DETACH PARTITION switchboard.{name}")
        c.execute(f"DROP TABLE switchboard.{name}")


def _publish(c: psycopg.Connection, uid: str, n: int) -> list[int]:
    """n events, each in its own transaction (c is autocommit)."""
    return [c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0] for _ in range(n)]


def _tick(c: psycopg.Connection) -> int:
    return c.execute("SELECT switchboard.event_tick()").fetchone()[0]


def _backlog(c: psycopg.Connection, uid: str, old: int, new: int) -> tuple[list[int], list[int], int, int]:
    """old events in a tick ten minutes ago, then new events in a fresh tick."""
    old_ids = _publish(c, uid, old)
    k_old = _tick(c)
    c.execute("UPDATE switchboard.event_ticks SET created_at = now() - interval '10 minutes' WHERE tick <= %s",
              (k_old,))
    new_ids = _publish(c, uid, new)
    k_new = _tick(c)
    return old_ids, new_ids, k_old, k_new


def _ids(c: psycopg.Connection) -> set[int]:
    return {r[0] for r in c.execute("SELECT id FROM switchboard.events")}


def test_bounded_reap_deletes_at_most_max_rows_and_moves_the_horizon_first(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = _user(c, "reap-batches")
        old, new, k_old, k_new = _backlog(c, uid, 25, 3)
        counts, horizons = [], []
        for _ in range(4):
            counts.append(c.execute("SELECT switchboard.reap_events('5 minutes', 10)").fetchone()[0])
            first_tick, through = c.execute("SELECT first_tick, reaped_through FROM switchboard.event_window()"
                                            ).fetchone()
            left = _ids(c)
            # The whole cut is already outside the window after the first batch: a
            # position inside it gets resume_gap, never a replay with holes.
            assert first_tick == k_old
            # reaped_through is the highest id gone; every old event above it is still there.
            assert through == max(set(old) - left)
            assert {i for i in old if i > through} <= left
            assert set(new) <= left
            horizons.append(through)
        assert counts == [10, 10, 5, 0]
        assert horizons == sorted(horizons) and horizons[-1] == max(old)
        assert _ids(c) == set(new)
        # What is retained still replays from the window's start.
        got = [r[0] for r in c.execute("SELECT id FROM switchboard.events_since_v2(%s, %s, %s, '{}')",
                                       (uid, k_old, END))]
        assert got == new
        assert c.execute("SELECT count(*) FROM switchboard.event_ticks WHERE tick < %s", (k_old,)).fetchone()[0] == 0
        assert c.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0] == k_new


def test_a_later_cut_takes_the_leftover_of_an_earlier_one(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = _user(c, "reap-leftover")
        first, _, _, _ = _backlog(c, uid, 12, 0)
        assert c.execute("SELECT switchboard.reap_events('5 minutes', 5)").fetchone()[0] == 5
        second, _, k2, _ = _backlog(c, uid, 4, 2)
        assert c.execute("SELECT first_tick FROM switchboard.event_window()").fetchone()[0] < k2
        counts = [c.execute("SELECT switchboard.reap_events('5 minutes', 5)").fetchone()[0] for _ in range(3)]
        assert counts == [5, 5, 1]
        assert c.execute("SELECT first_tick FROM switchboard.event_window()").fetchone()[0] == k2
        assert not (set(first) | set(second)) & _ids(c)
        assert len(_ids(c)) == 2


def test_previous_release_forms_are_unchanged(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = _user(c, "reap-old")
        old, new, k_old, _ = _backlog(c, uid, 30, 2)
        # 0.2.0's handler: maintenance by name, no max_rows -> the four-argument form,
        # whose reap_events is the unbounded one.
        res = c.execute("SELECT switchboard.maintenance(keep_events => '5 minutes', replica_stale => '30 seconds')"
                        ).fetchone()[0]
        assert res["events"] == 30
        assert _ids(c) == set(new)
        assert c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0] == max(old)
        assert c.execute("SELECT first_tick FROM switchboard.event_window()").fetchone()[0] == k_old
        old2, _, _, _ = _backlog(c, uid, 3, 0)
        assert c.execute("SELECT switchboard.reap_events('5 minutes')").fetchone()[0] == 3 + len(new)
        assert c.execute("SELECT switchboard.maintenance()").fetchone()[0]["events"] == 0


def test_this_release_maintenance_bounds_every_backlog_reaper(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = _user(c, "reap-maint")
        _backlog(c, uid, 12, 1)
        got = [c.execute("SELECT switchboard.maintenance(max_rows => 5, keep_events => '5 minutes', "
                         "replica_stale => '30 seconds')").fetchone()[0]["events"] for _ in range(4)]
        assert got == [5, 5, 2, 0]
        assert len(_ids(c)) == 1


def test_concurrent_bounded_reapers_delete_each_event_once(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = _user(c, "reap-race")
        old, new, _, _ = _backlog(c, uid, 60, 1)
    counts: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def reaper() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as rc:
                while (n := rc.execute("SELECT switchboard.reap_events('5 minutes', 7)").fetchone()[0]) > 0:
                    with lock:
                        counts.append(n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reaper) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sum(counts) == len(old)
    with psycopg.connect(db, autocommit=True) as c:
        assert _ids(c) == set(new)
        assert c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0] == max(old)


@pytest.mark.parametrize("max_rows", [0, -1, None, 1_000_001])
def test_bad_max_rows_is_refused(conn: psycopg.Connection, max_rows: int | None) -> None:
    throws_ok(conn, "SELECT switchboard.reap_events('5 minutes', %s)", "22023", (max_rows,), match="max_rows")
    throws_ok(conn, "SELECT switchboard.maintenance(max_rows => %s)", "22023", (max_rows,), match="max_rows")


def test_bad_keep_is_refused(conn: psycopg.Connection) -> None:
    throws_ok(conn, "SELECT switchboard.reap_events('-1 minute', 10)", "22023", match="keep")
    throws_ok(conn, "SELECT switchboard.reap_events(NULL, 10)", "22023", match="keep")
