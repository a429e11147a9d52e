"""switchboard.api: publish, enqueue and stream inside the caller's own transaction.

Real PostgreSQL, real psycopg connections (sync and async), and one real replica
delivering to a real WebSocket: what an application does from a web view.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import psycopg
import pytest

from harness import make_user
from switchboard import api

PW = "pw-" + "s" * 12


def counts(url: str, user_id: str) -> tuple[int, int, int]:
    with psycopg.connect(url) as c:
        row = c.execute(
            "SELECT (SELECT count(*) FROM switchboard.events WHERE user_id = %s),"
            "       (SELECT count(*) FROM switchboard.task_runs WHERE handler = 'invoice.send'),"
            "       (SELECT count(*) FROM switchboard.streams WHERE user_id = %s)", (user_id, user_id)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])


def test_everything_happens_iff_the_callers_transaction_commits(db: str) -> None:
    uid = make_user(db, "ann")
    with psycopg.connect(db) as conn:
        # Rolled back: nothing of it exists, nothing was committed on our behalf midway.
        with pytest.raises(RuntimeError), conn.transaction():
            api.notify_user(conn, uid, "order.saved", {"order": 1})
            assert api.enqueue(conn, "invoice.send", {"order": 1}) is not None
            api.stream_open(conn, uid, "completion")
            assert counts(db, uid) == (0, 0, 0)   # another session sees nothing yet
            raise RuntimeError("the view failed after publishing")
        assert counts(db, uid) == (0, 0, 0)
        # Committed: all of it. Every kind of target: the connection, a cursor, the Transaction.
        with conn.transaction() as tx:
            eid = api.notify_user(tx, uuid.UUID(uid), "order.saved", {"order": 2})
            with conn.cursor() as cur:
                rid = api.enqueue(cur, "invoice.send", {"order": 2}, queueing_lock="order-2")
            assert api.enqueue(conn, "invoice.send", {"order": 2}, queueing_lock="order-2") is None  # held
            sid = api.stream_open(conn, uid, "completion", meta={"model": "m"})
            assert api.stream_append(conn, sid, ["Hel", "lo"]) == 2
            end = api.stream_close(conn, sid, final={"text": "Hello"})
        assert isinstance(eid, int) and isinstance(rid, int) and end > eid
        assert counts(db, uid) == (2, 1, 1)      # order.saved + stream.end, one job, one stream


def test_refusals_name_the_problem_and_leave_nothing(db: str) -> None:
    uid = make_user(db, "ben")
    with psycopg.connect(db) as conn:
        # Checked in Python, before anything is sent: the transaction stays usable.
        with conn.transaction():
            with pytest.raises(ValueError, match="user_id 'nope' is not a UUID"):
                api.notify_user(conn, "nope", "e")
            with pytest.raises(TypeError, match="payload must be JSON-serialisable"):
                api.notify_user(conn, uid, "e", {"when": object()})
            with pytest.raises(TypeError, match="args must be a dict"):
                api.enqueue(conn, "invoice.send", ["not", "an", "object"])  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="chunks must be a sequence of str"):
                api.stream_append(conn, uuid.uuid4(), "one string")
            with pytest.raises(TypeError, match="expected a psycopg Connection"):
                api.notify_user("postgresql://", uid, "e")  # type: ignore[arg-type]
            api.notify_user(conn, uid, "still.fine")
        # Checked by the SQL function: its SQLSTATE and HINT, and the caller's transaction
        # is aborted as with any failed statement (so nothing of it is committed).
        with pytest.raises(psycopg.errors.NoDataFound) as ei, conn.transaction():
            api.notify_user(conn, uuid.uuid4(), "e")
        assert ei.value.sqlstate == "P0002"
        with pytest.raises(psycopg.Error) as ei2, conn.transaction():
            api.notify_user(conn, uid, "lost.with.the.rollback")
            api.enqueue(conn, "bad handler name!", {})
        assert ei2.value.sqlstate == "22023" and ei2.value.diag.message_hint
    assert counts(db, uid)[0] == 1     # only still.fine


def test_async_twins(db: str) -> None:
    uid = make_user(db, "cat")

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db) as aconn:
            async with aconn.transaction() as tx:
                await api.notify_user_async(tx, uid, "order.saved", {"order": 3})
                await api.notify_room_async(aconn, "lobby", "news", {"n": 1})
                async with aconn.cursor() as cur:
                    assert await api.enqueue_async(cur, "invoice.send", {"order": 3}) is not None
                sid = await api.stream_open_async(aconn, uid, "completion", lease=10, lifetime=60)
                assert await api.stream_append_async(aconn, sid, ["a"]) == 1
                await api.stream_close_async(aconn, sid)
            with pytest.raises(TypeError, match="AsyncConnection"):
                with psycopg.connect(db) as sync_conn:
                    await api.notify_user_async(sync_conn, uid, "e")  # type: ignore[arg-type]

    asyncio.run(main())
    assert counts(db, uid) == (2, 1, 1)


def test_an_event_published_in_your_transaction_reaches_the_user_on_a_replica(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "dee")
    s = server_factory()
    token = httpx.post(s.base + "/auth/login", json={"username": "dee", "password": PW}).json()["access_token"]
    ws = s.ws(token)
    try:
        with psycopg.connect(db) as conn:
            with conn.transaction():
                api.notify_user(conn, uid, "order.saved", {"order": 4})
                # Not before COMMIT: the relay reads only committed events.
                with pytest.raises(TimeoutError):
                    ws.recv(timeout=1)
        f = ws.recv_until(lambda f: f.get("event") == "order.saved")
        assert f["payload"] == {"order": 4}
    finally:
        ws.conn.close()
