"""Streams in SQL: seq without gaps under racing appenders, the group append, stop, close,
the bounds, the reaper, who may read. Every function as a DBA would call it from psql."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from pgtap import listener, notifications, race, throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"


def new_user(c: psycopg.Connection, name: str, role: str = "member") -> str:
    uid = c.execute("SELECT switchboard.create_user(%s, %s)", (name, ARGON)).fetchone()[0]
    if role != "member":
        c.execute("UPDATE switchboard.users SET role = %s WHERE id = %s", (role, uid))
    return str(uid)


def open_stream(c: psycopg.Connection, user: str, **kw: object) -> str:
    cols = "".join(f", {k} => %({k})s" for k in kw)
    return str(c.execute(f"SELECT switchboard.stream_open(%(u)s, 'completion'{cols})", {"u": user, **kw}).fetchone()[0])


def chunks(c: psycopg.Connection, sid: str, after: int = 0) -> list[tuple[int, str]]:
    return [(r[0], r[1]) for r in c.execute("SELECT seq, data FROM switchboard.stream_read(%s, %s, 100000)", (sid, after))]


def test_append_read_close_and_the_one_durable_event(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "ann")
        sid = open_stream(c, uid, meta='{"chat": 7}')
        assert c.execute("SELECT switchboard.stream_append(%s, ARRAY['Hel','lo'])", (sid,)).fetchone()[0] == 2
        assert c.execute("SELECT switchboard.stream_append(%s, ARRAY[', ','world'])", (sid,)).fetchone()[0] == 4
        assert c.execute("SELECT switchboard.stream_append(%s, '{}')", (sid,)).fetchone()[0] == 4   # renews only
        assert chunks(c, sid) == [(1, "Hel"), (2, "lo"), (3, ", "), (4, "world")]
        assert chunks(c, sid, 2) == [(3, ", "), (4, "world")]
        before = c.execute("SELECT count(*) FROM switchboard.events").fetchone()[0]
        eid = c.execute("SELECT switchboard.stream_close(%s, 'done', '{\"text\": \"Hello, world\"}')", (sid,)).fetchone()[0]
        ev = c.execute("SELECT user_id::text, event, payload FROM switchboard.events WHERE id = %s", (eid,)).fetchone()
        assert ev[0] == uid and ev[1] == "stream.end"
        assert ev[2] == {"stream": sid, "kind": "completion", "status": "done", "last_seq": 4,
                         "final": {"text": "Hello, world"}}
        assert c.execute("SELECT count(*) FROM switchboard.events").fetchone()[0] == before + 1
        info = c.execute("SELECT status, last_seq, meta FROM switchboard.stream_info(%s)", (sid,)).fetchone()
        assert info == ("done", 4, {"chat": 7})
        throws_ok(c, "SELECT switchboard.stream_append(%s, ARRAY['late'])", "55000", (sid,))
        throws_ok(c, "SELECT switchboard.stream_close(%s)", "55000", (sid,))
        assert chunks(c, sid) == [(1, "Hel"), (2, "lo"), (3, ", "), (4, "world")]   # nothing half-written


def test_racing_appenders_number_every_chunk_once_without_gaps(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        sid = open_stream(c, new_user(c, "bob"))

    def append(i: int, barrier: threading.Barrier) -> list[int]:
        tops = []
        with psycopg.connect(db, autocommit=True) as conn:
            barrier.wait()
            for k in range(25):
                if k % 2:
                    tops.append(conn.execute("SELECT switchboard.stream_append(%s, %s)",
                                             (sid, [f"{i}.{k}.a", f"{i}.{k}.b"])).fetchone()[0])
                else:
                    conn.execute("SELECT * FROM switchboard.stream_append_many(%s, %s)",
                                 ([sid, sid], [f"{i}.{k}.a", f"{i}.{k}.b"]))
        return tops

    race(12, append)
    with psycopg.connect(db) as c:
        rows = chunks(c, sid)
        assert [s for s, _ in rows] == list(range(1, 12 * 25 * 2 + 1))
        assert sorted(d for _, d in rows) == sorted(f"{i}.{k}.{x}" for i in range(12) for k in range(25) for x in "ab")
        # each call's chunks stay adjacent and in order
        pos = {d: s for s, d in rows}
        assert all(pos[f"{i}.{k}.b"] == pos[f"{i}.{k}.a"] + 1 for i in range(12) for k in range(25))
        assert c.execute("SELECT last_seq FROM switchboard.streams WHERE id = %s", (sid,)).fetchone()[0] == 600


def test_group_append_reports_each_stream_and_one_stopped_does_not_fail_the_others(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "cy")
        a, b, stopped = (open_stream(c, uid) for _ in range(3))
        c.execute("SELECT switchboard.stream_stop(%s)", (stopped,))
        ghost = str(uuid.uuid4())
        lst = listener(db, "switchboard_stream")
        try:
            rows = c.execute("SELECT stream_id::text, last_seq, status, accepted FROM switchboard.stream_append_many(%s, %s)",
                             ([a, b, a, stopped, ghost, a], ["a1", "b1", "a2", "s1", "g1", "a3"])).fetchall()
            got = {r[0]: r[1:] for r in rows}
            assert got == {a: (3, "open", 3), b: (1, "open", 1), stopped: (0, "stopped", 0), ghost: (0, "unknown", 0)}
            assert chunks(c, a) == [(1, "a1"), (2, "a2"), (3, "a3")]
            assert chunks(c, stopped) == []
            (note,) = notifications(lst, 1.0)
            assert set(note.payload.split(",")) == {a, b}      # one wake-up naming what was appended
        finally:
            lst.close()
        throws_ok(c, "SELECT * FROM switchboard.stream_append_many(%s, %s)", "22023", ([a], ["x", "y"]))
        throws_ok(c, "SELECT * FROM switchboard.stream_append_many(%s, %s)", "22004", ([a, a], ["x", None]))


def test_bounds_give_a_sqlstate_and_write_nothing(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "dee")
        sid = open_stream(c, uid)
        throws_ok(c, "SELECT switchboard.stream_append(%s, %s)", "54000", (sid, ["ok", "x" * 65537]))
        throws_ok(c, "SELECT switchboard.stream_append(%s, %s)", "54000", (sid, ["t"] * 10001))
        throws_ok(c, "SELECT switchboard.stream_append(%s, %s)", "22004", (sid, ["ok", None]))
        throws_ok(c, "SELECT switchboard.stream_append(%s, NULL)", "22004", (sid,))
        throws_ok(c, "SELECT switchboard.stream_append(%s, ARRAY['x'])", "P0002", (str(uuid.uuid4()),))
        assert chunks(c, sid) == []
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'bad kind!')", "22023", (uid,))
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'k', '[1]')", "22023", (uid,))
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'k', %s::jsonb)", "22023", (uid, '{"x": "%s"}' % ("y" * 9000)))
        deep = '{"a": ' * 200 + '1' + '}' * 200              # 1.4 KiB, 200 levels: readers recurse
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'k', %s::jsonb)", "22023", (uid, deep))
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'k', lease => '0 seconds')", "22023", (uid,))
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'k', lifetime => '2 days')", "22023", (uid,))
        throws_ok(c, "SELECT switchboard.stream_open(%s, 'k')", "P0002", (str(uuid.uuid4()),))
        throws_ok(c, "SELECT switchboard.stream_close(%s, 'finished')", "22023", (sid,))
        throws_ok(c, "SELECT * FROM switchboard.stream_read(%s, -1)", "22023", (sid,))
        throws_ok(c, "SELECT * FROM switchboard.stream_read(%s, 0, 0)", "22023", (sid,))
        c.execute("UPDATE switchboard.streams SET expires_at = now() - interval '1 second' WHERE id = %s", (sid,))
        throws_ok(c, "SELECT switchboard.stream_append(%s, ARRAY['x'])", "55000", (sid,))
        try:
            c.execute("SELECT switchboard.stream_append(%s, ARRAY['x'])", (sid,))
        except psycopg.Error as exc:
            assert sid in exc.diag.message_primary and exc.diag.message_hint


def test_open_streams_per_user_are_bounded_exactly_under_a_race(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "eve")

    def opener(i: int, barrier: threading.Barrier) -> tuple[int, int]:
        ok = refused = 0
        with psycopg.connect(db, autocommit=True) as conn:
            barrier.wait()
            for _ in range(25):
                try:
                    conn.execute("SELECT switchboard.stream_open(%s, 'k')", (uid,))
                    ok += 1
                except psycopg.errors.ProgramLimitExceeded:
                    refused += 1
        return ok, refused

    results = race(40, opener)        # 1,000 opens for one user
    assert sum(r[0] for r in results) == 100
    assert sum(r[1] for r in results) == 900
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.streams_of(%s)", (uid,)).fetchone()[0] == 100
        one = c.execute("SELECT id FROM switchboard.streams_of(%s) LIMIT 1", (uid,)).fetchone()[0]
        c.execute("SELECT switchboard.stream_close(%s)", (one,))
        open_stream(c, uid)             # closing one frees its place


def test_stop_from_anywhere_blocks_appends_and_the_producer_closes_with_its_final(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        owner, other, admin = new_user(c, "fay"), new_user(c, "gus"), new_user(c, "root", "admin")
        sid = open_stream(c, owner)
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['a','b'])", (sid,))
        throws_ok(c, "SELECT switchboard.stream_stop(%s, %s)", "P0002", (sid, other))   # not yours: not found
        lst = listener(db, "switchboard_stream_stop")
        try:
            assert c.execute("SELECT switchboard.stream_stop(%s, %s)", (sid, owner)).fetchone()[0] == "stopped"
            assert [n.payload for n in notifications(lst, 1.0)] == [sid]
        finally:
            lst.close()
        assert c.execute("SELECT switchboard.stream_stop(%s, %s)", (sid, admin)).fetchone()[0] == "stopped"
        throws_ok(c, "SELECT switchboard.stream_append(%s, ARRAY['c'])", "55000", (sid,))
        assert chunks(c, sid) == [(1, "a"), (2, "b")]
        eid = c.execute("SELECT switchboard.stream_close(%s, 'stopped', '{\"text\": \"ab\"}')", (sid,)).fetchone()[0]
        payload = c.execute("SELECT payload FROM switchboard.events WHERE id = %s", (eid,)).fetchone()[0]
        assert payload["status"] == "stopped" and payload["final"] == {"text": "ab"} and payload["last_seq"] == 2
        throws_ok(c, "SELECT switchboard.stream_close(%s, 'stopped')", "55000", (sid,))


def test_only_owner_admins_and_room_members_read(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        owner, other, admin, member = (new_user(c, n) for n in ("hal", "ivy", "boss", "jo"))
        c.execute("UPDATE switchboard.users SET role = 'admin' WHERE id = %s", (admin,))
        c.execute("SELECT switchboard.add_room_member('lab', %s)", (member,))
        sid = open_stream(c, owner)
        room_sid = open_stream(c, owner, room="lab")
        for s in (sid, room_sid):
            c.execute("SELECT switchboard.stream_append(%s, ARRAY['x'])", (s,))
        assert c.execute("SELECT count(*) FROM switchboard.stream_read(%s, 0, 10, %s)", (sid, owner)).fetchone()[0] == 1
        assert c.execute("SELECT count(*) FROM switchboard.stream_read(%s, 0, 10, %s)", (sid, admin)).fetchone()[0] == 1
        throws_ok(c, "SELECT * FROM switchboard.stream_read(%s, 0, 10, %s)", "P0002", (sid, other))
        throws_ok(c, "SELECT * FROM switchboard.stream_info(%s, %s)", "P0002", (sid, member))
        assert c.execute("SELECT count(*) FROM switchboard.stream_read(%s, 0, 10, %s)", (room_sid, member)).fetchone()[0] == 1
        throws_ok(c, "SELECT switchboard.stream_stop(%s, %s)", "P0002", (room_sid, member))   # members read, owners stop
        assert {r[0] for r in c.execute("SELECT id::text FROM switchboard.streams_of(%s)", (member,))} == {room_sid}
        eid = c.execute("SELECT switchboard.stream_close(%s)", (room_sid,)).fetchone()[0]
        assert c.execute("SELECT room, user_id FROM switchboard.events WHERE id = %s", (eid,)).fetchone() == ("lab", None)


def test_read_many_state_and_chunks_in_one_snapshot(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "kim")
        a, b = open_stream(c, uid), open_stream(c, uid)
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['1','2','3'])", (a,))
        c.execute("SELECT switchboard.stream_close(%s, 'done', '{\"n\": 3}')", (a,))
        rows = c.execute("SELECT stream_id::text, status, last_seq, final, end_event IS NOT NULL, first_seq, chunks "
                         "FROM switchboard.stream_read_many(%s, %s, 2)", ([a, b, str(uuid.uuid4())], [1, 0, 0])).fetchall()
        assert sorted(rows) == sorted([(a, "done", 3, {"n": 3}, True, 2, ["2", "3"]), (b, "open", 0, None, False, 1, [])])
        one = c.execute("SELECT first_seq, chunks FROM switchboard.stream_read_many(%s, %s, 1)", ([a], [0])).fetchone()
        assert one == (1, ["1"])                  # max_rows per stream
        throws_ok(c, "SELECT * FROM switchboard.stream_read_many(%s, %s)", "22023", ([a], [0, 1]))


def test_a_dead_producer_ends_as_error_and_closed_streams_are_reaped_in_bounded_batches(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "lee")
        dead = open_stream(c, uid, lease="1 second")
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['partial'])", (dead,))
        done = open_stream(c, uid)
        c.execute("SELECT switchboard.stream_append(%s, %s)", (done, [str(i) for i in range(2500)]))
        c.execute("SELECT switchboard.stream_close(%s)", (done,))
        stopped = open_stream(c, uid, lease="1 second")
        c.execute("SELECT switchboard.stream_stop(%s)", (stopped,))
        c.execute("UPDATE switchboard.streams SET lease_until = now() - interval '1 second' WHERE id = %s", (dead,))
        c.execute("UPDATE switchboard.streams SET closed_at = now() - interval '2 seconds' WHERE id = %s", (stopped,))
        c.execute("SELECT switchboard.reap_streams(1000)")
        st = dict(c.execute("SELECT id::text, status FROM switchboard.streams").fetchall())
        assert st[dead] == "error" and st[done] == "done" and st[stopped] == "stopped"
        ends = c.execute("SELECT payload->>'stream', payload->>'status', payload->'final' FROM switchboard.events "
                         "WHERE event = 'stream.end' ORDER BY id").fetchall()
        assert (dead, "error", {"error": "the producer stopped renewing its lease"}) in ends
        assert (stopped, "stopped", None) in ends
        c.execute("SELECT switchboard.reap_streams(1000)")      # the end is sent once
        assert c.execute("SELECT count(*) FROM switchboard.events WHERE event = 'stream.end'").fetchone()[0] == 3
        # retention: chunks go in batches of max_rows, then the row
        c.execute("UPDATE switchboard.streams SET closed_at = now() - interval '1 hour' WHERE id = %s", (done,))
        assert c.execute("SELECT switchboard.reap_streams(1000)").fetchone()[0] == 1000
        assert c.execute("SELECT switchboard.reap_streams(1000)").fetchone()[0] == 1000
        assert c.execute("SELECT switchboard.reap_streams(1000)").fetchone()[0] == 501    # the last chunks, then the row
        assert c.execute("SELECT switchboard.reap_streams(1000)").fetchone()[0] == 0
        throws_ok(c, "SELECT * FROM switchboard.stream_info(%s)", "P0002", (done,))
        assert c.execute("SELECT count(*) FROM switchboard.stream_chunks WHERE stream_id = %s", (done,)).fetchone()[0] == 0
        # maintenance() runs the stream reaper too
        assert "streams" in c.execute("SELECT switchboard.maintenance(100)").fetchone()[0]


def test_deleting_a_user_deletes_their_streams_and_chunks(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "max")
        sid = open_stream(c, uid)
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['x','y'])", (sid,))
        c.execute("DELETE FROM switchboard.users WHERE id = %s", (uid,))
        assert c.execute("SELECT count(*) FROM switchboard.stream_chunks WHERE stream_id = %s", (sid,)).fetchone()[0] == 0


@pytest.mark.parametrize("payload", ["*", "not-a-uuid", "", "x" * 7000])
def test_a_forged_wakeup_names_no_chunk_into_existence(db: str, payload: str) -> None:
    """Any role may NOTIFY switchboard_stream; stream_read_many answers with rows only."""
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "ned")
        sid = open_stream(c, uid)
        c.execute("SELECT pg_notify('switchboard_stream', %s)", (payload or sid,))
        rows = c.execute("SELECT status, last_seq, chunks FROM switchboard.stream_read_many(%s, %s)",
                         ([sid], [0])).fetchall()
        assert rows == [("open", 0, [])]


def test_appends_update_the_stream_row_in_place(db: str) -> None:
    """V0024: no index covers a column an append changes, so its row update is HOT (no
    new index entries, no bloat of the indexes) -- counted within one transaction."""
    with psycopg.connect(db, autocommit=True) as c:
        sid = open_stream(c, new_user(c, "hot"))
    with psycopg.connect(db) as c:
        for i in range(50):
            c.execute("SELECT * FROM switchboard.stream_append_many(%s, %s)", ([sid], [str(i)]))
        upd, hot = c.execute("SELECT pg_stat_get_xact_tuples_updated('switchboard.streams'::regclass), "
                             "pg_stat_get_xact_tuples_hot_updated('switchboard.streams'::regclass)").fetchone()
        c.rollback()
    assert upd == 50 and hot >= 45, (upd, hot)
