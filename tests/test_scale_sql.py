"""V0013: presence_sync set-based (same rows as before, unchanged rows not
written), bounded reapers, the queue's storage settings."""

from __future__ import annotations

import random
import uuid

import psycopg
import pytest
from pgtap import throws_ok

# The body of presence_sync before V0013, as the reference for "same rows".
OLD_PRESENCE_SYNC = """
CREATE FUNCTION pg_temp.presence_sync_old(rid text, user_ids uuid[], sockets integer[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO switchboard.replica_registry (id) VALUES (rid)
    ON CONFLICT ON CONSTRAINT replica_registry_pkey DO UPDATE SET heartbeat_at = now();
    DELETE FROM switchboard.presence_sockets p
     WHERE p.replica_id = rid AND p.user_id <> ALL (coalesce(user_ids, '{}'));
    INSERT INTO switchboard.presence_sockets AS p (replica_id, user_id, sockets)
    SELECT rid, u, s FROM unnest(user_ids, sockets) AS x(u, s) WHERE s > 0
    ON CONFLICT ON CONSTRAINT presence_sockets_pkey DO UPDATE SET sockets = EXCLUDED.sockets;
END
$$;
"""


def _rows(conn: psycopg.Connection, rid: str) -> list[tuple]:
    return conn.execute("SELECT user_id, sockets FROM switchboard.presence_sockets WHERE replica_id = %s "
                        "ORDER BY user_id", (rid,)).fetchall()


def test_presence_sync_gives_the_same_rows_as_the_old_body(conn: psycopg.Connection) -> None:
    conn.execute(OLD_PRESENCE_SYNC)
    rng = random.Random(23)
    pool = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(400)]
    # another replica's rows must never be touched
    conn.execute("SELECT switchboard.presence_sync('other', %s, %s)", (pool[:50], [7] * 50))
    other = _rows(conn, "other")
    for step in range(40):
        users = rng.sample(pool, rng.randint(0, 300))
        counts = [rng.randint(1, 4) for _ in users]  # positive counts: the old body's domain
        conn.execute("SELECT switchboard.presence_sync('new', %s, %s)", (users, counts))
        conn.execute("SELECT pg_temp.presence_sync_old('old', %s, %s)", (users, counts))
        assert _rows(conn, "new") == _rows(conn, "old"), f"step {step}"
        assert sorted(_rows(conn, "new")) == sorted(zip(users, counts))
    assert _rows(conn, "other") == other
    conn.execute("SELECT switchboard.presence_sync('new', NULL, NULL)")
    assert _rows(conn, "new") == []


def test_presence_sync_leaves_unchanged_rows_alone(conn: psycopg.Connection) -> None:
    users = [uuid.uuid4() for _ in range(100)]
    conn.execute("SELECT switchboard.presence_sync('r', %s, %s)", (users, [1] * 100))
    conn.commit()
    try:
        before = dict(conn.execute("SELECT user_id, xmin::text FROM switchboard.presence_sockets "
                                   "WHERE replica_id = 'r'").fetchall())
        counts = [1] * 100
        counts[0] = 3  # one count changes, one user leaves, one arrives
        new_user = uuid.uuid4()
        conn.execute("SELECT switchboard.presence_sync('r', %s, %s)", (users[:-1] + [new_user], counts[:-1] + [2]))
        conn.commit()
        after = dict(conn.execute("SELECT user_id, xmin::text FROM switchboard.presence_sockets "
                                  "WHERE replica_id = 'r'").fetchall())
        rewritten = {u for u in after if u in before and after[u] != before[u]}
        assert rewritten == {users[0]}, "only the changed row is written"
        assert users[-1] not in after and new_user in after
        assert dict(_rows(conn, "r"))[users[0]] == 3
    finally:
        conn.execute("DELETE FROM switchboard.replica_registry WHERE id = 'r'")
        conn.commit()


def test_presence_sync_zero_sockets_and_bad_input(conn: psycopg.Connection) -> None:
    u1, u2 = uuid.uuid4(), uuid.uuid4()
    conn.execute("SELECT switchboard.presence_sync('z', %s, %s)", ([u1, u2], [2, 1]))
    conn.execute("SELECT switchboard.presence_sync('z', %s, %s)", ([u1, u2], [0, 1]))
    assert _rows(conn, "z") == [(u2, 1)], "a user listed with 0 sockets has no row"
    throws_ok(conn, "SELECT switchboard.presence_sync('z', %s, %s)", "22023", ([u1], [1, 2]),
              match="differ in length")
    throws_ok(conn, "SELECT switchboard.presence_sync('z', %s, %s)", "21000", ([u1, u1], [1, 2]))


def _old_runs(conn: psycopg.Connection, n: int, age: str = "8 days") -> None:
    # V0036: finished runs older than the day partitions land in the default partition
    # once task_runs_history_before (the previous release's runs) is gone (dropped here,
    # in the test's transaction): the rows reap_runs deletes one by one, in batches.
    conn.execute("DROP TABLE IF EXISTS switchboard.task_runs_history_before")
    conn.execute(f"""INSERT INTO switchboard.task_runs (handler, status, trigger, run_at, finished_at)
                     SELECT 'reap', 'succeeded', 'enqueue', now() - interval '9 days', now() - interval '{age}'
                       FROM generate_series(1, %s)""", (n,))


def test_reap_runs_deletes_one_bounded_batch_per_call(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM switchboard.task_runs")
    _old_runs(conn, 25)
    _old_runs(conn, 3, "1 day")
    conn.execute("""INSERT INTO switchboard.task_runs (handler, status, trigger, run_at)
                    VALUES ('reap', 'queued', 'enqueue', now() - interval '30 days')""")
    got = [conn.execute("SELECT switchboard.reap_runs('7 days', 10)").fetchone()[0] for _ in range(4)]
    assert got == [10, 10, 5, 0]
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs").fetchone()[0] == 4
    throws_ok(conn, "SELECT switchboard.reap_runs('7 days', 0)", "22023", match="max_rows")
    throws_ok(conn, "SELECT switchboard.reap_runs('7 days', NULL)", "22023", match="max_rows")
    throws_ok(conn, "SELECT switchboard.reap_runs('-1 day', 10)", "22023")


def test_reap_runs_previous_signature_is_one_batch_of_ten_thousand(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM switchboard.task_runs")
    _old_runs(conn, 10_005)
    assert conn.execute("SELECT switchboard.reap_runs('7 days')").fetchone()[0] == 10_000
    assert conn.execute("SELECT switchboard.reap_runs()").fetchone()[0] == 5


def test_reap_rate_limits_bounded_and_keeps_debt(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM switchboard.rate_limits")
    conn.execute("""INSERT INTO switchboard.rate_limits (key, tat_us, updated_at)
                    SELECT 'idle' || i, 0, now() - interval '2 hours' FROM generate_series(1, 12) i""")
    # idle for two hours but still in debt: kept
    conn.execute("""INSERT INTO switchboard.rate_limits (key, tat_us, updated_at)
                    VALUES ('debt', (extract(epoch FROM now()) * 1000000)::bigint + 60000000, now() - interval '2 hours'),
                           ('fresh', 0, now())""")
    got = [conn.execute("SELECT switchboard.reap_rate_limits('1 hour', 5)").fetchone()[0] for _ in range(4)]
    assert got == [5, 5, 2, 0]
    assert sorted(r[0] for r in conn.execute("SELECT key FROM switchboard.rate_limits")) == ["debt", "fresh"]
    assert conn.execute("SELECT switchboard.reap_rate_limits('1 hour')").fetchone()[0] == 0
    throws_ok(conn, "SELECT switchboard.reap_rate_limits('1 hour', 0)", "22023", match="max_rows")
    throws_ok(conn, "SELECT switchboard.reap_rate_limits('-1 hour', 5)", "22023")


def test_maintenance_reaps_in_batches(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM switchboard.task_runs")
    _old_runs(conn, 10_003)
    first = conn.execute("SELECT switchboard.maintenance()").fetchone()[0]
    assert first["runs"] == 10_000
    assert conn.execute("SELECT switchboard.maintenance()").fetchone()[0]["runs"] == 3


def test_queue_storage_settings(conn: psycopg.Connection) -> None:
    opts = dict(o.split("=") for o in conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'switchboard.task_runs_hot'::regclass").fetchone()[0])
    assert float(opts["autovacuum_vacuum_scale_factor"]) == 0.01
    assert "fillfactor" not in opts, "no update of a run can be HOT: a lower fillfactor buys nothing"
    rl = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'switchboard.rate_limits'::regclass").fetchone()[0]
    assert "fillfactor=80" in rl


@pytest.mark.parametrize(("args", "match"), [
    (("", 1, 3, 1), "invalid rate-limit key"), ((None, 1, 3, 1), "invalid rate-limit key"),
    (("x" * 513, 1, 3, 1), "invalid rate-limit key"), (("k", 0, 3, 1), "invalid rate"),
    (("k", float("nan"), 3, 1), "invalid rate"), (("k", float("inf"), 3, 1), "invalid rate"),
    (("k", 1_000_001, 3, 1), "invalid rate"), (("k", None, 3, 1), "invalid rate"),
    (("k", 1, 0, 1), "invalid burst"), (("k", 1, None, 1), "invalid burst"),
    (("k", 1, 3, 4), "invalid cost"), (("k", 1, 3, 0), "invalid cost"), (("k", 1, 3, None), "invalid cost"),
])
def test_rate_check_refuses_bad_arguments_as_before(conn: psycopg.Connection, args: tuple, match: str) -> None:
    """V0013 folded rate_check's four checks into one test on the hot path; the errors are unchanged."""
    err = throws_ok(conn, "SELECT * FROM switchboard.rate_check(%s, %s::float8, %s::int, %s::int)", "22023", args,
                    match=match)
    assert err.diag.message_hint


def test_rate_check_answers_unchanged_at_the_edges(conn: psycopg.Connection) -> None:
    # now() is fixed in the transaction: burst 3 passes exactly 3, then retry_after is exact
    got = [conn.execute("SELECT * FROM switchboard.rate_check('edge', 2, 3)").fetchone() for _ in range(4)]
    assert got == [(True, 2, 0, 500), (True, 1, 0, 1000), (True, 0, 0, 1500), (False, 0, 500, 1500)]
    assert conn.execute("SELECT * FROM switchboard.rate_check('edge2', 1000000, 1, 1)").fetchone() == (True, 0, 0, 1)
