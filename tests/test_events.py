"""Events: NOTIFY at commit, 1 MiB payloads, lock-free publishers, tick-ordered resume, privacy."""

from __future__ import annotations

import json
import random
import re
import threading
import time

import httpx
import psycopg
import pytest
from harness import seal_event_partition
from pgtap import listener, notifications, race, throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
CHANNEL = "switchboard_events"
LIMIT = 1_048_576


def new_user(c: psycopg.Connection, name: str) -> str:
    return c.execute("SELECT switchboard.create_user(%s, %s)", (name, ARGON)).fetchone()[0]


def stored_after(c: psycopg.Connection, after_id: int) -> list[tuple]:
    """What a relay reads: a tick (as a relay takes after a wake-up), then every stored
    event after the start of what is retained, as relay_read_v3 returns it."""
    assert c.execute("SELECT switchboard.event_tick()").fetchone()[0] >= 0
    c.commit()
    return c.execute("SELECT id, kind = 'ephemeral', user_id, room, event, payload, ts "
                     "FROM switchboard.relay_read_v3(0, 0) WHERE kind = 'event' AND id > %s ORDER BY tick, id",
                     (after_id,)).fetchall()


def test_notify_arrives_at_commit_never_on_rollback(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "ann")
    lst = listener(db, CHANNEL)
    try:
        with psycopg.connect(db) as pub:
            pub.execute("SELECT switchboard.notify_user(%s, 'x.rolled', '{\"n\": 0}')", (uid,))
            pub.rollback()
            assert notifications(lst, 0.3) == []

            eid = pub.execute(
                "SELECT switchboard.notify_user(%s, 'chat.message', '{\"text\": \"hi\", \"n\": [1, 2]}')",
                (uid,)).fetchone()[0]
            ts = pub.execute("SELECT (extract(epoch FROM created_at) * 1000)::bigint FROM switchboard.events "
                             "WHERE id = %s", (eid,)).fetchone()[0]
            assert notifications(lst, 0.3) == [], "delivered before COMMIT"
            pub.commit()
            (note,) = notifications(lst, 2.0, stop_after=1)
        assert note.channel == CHANNEL
        # A hint only: the id. The body is read with relay_read_v3(), never taken from the bus.
        assert json.loads(note.payload) == {"id": eid}
        with psycopg.connect(db) as c:
            rows = stored_after(c, eid - 1)
            assert rows == [(eid, False, uid, None, "chat.message", {"text": "hi", "n": [1, 2]}, ts)]
            assert c.execute("SELECT count(*) FROM switchboard.events WHERE event = 'x.rolled'").fetchone()[0] == 0
    finally:
        lst.close()


def test_room_notify_payload(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "rita")
        admin.execute("SELECT switchboard.add_room_member('lobby', %s)", (uid,))
        lst = listener(db, CHANNEL)
        try:
            eid = admin.execute("SELECT switchboard.notify_room('lobby', 'room.topic', '{\"t\": 1}')").fetchone()[0]
            (note,) = notifications(lst, 2.0, stop_after=1)
        finally:
            lst.close()
        assert json.loads(note.payload) == {"id": eid}
        assert [(r[3], r[5]) for r in stored_after(admin, eid - 1)] == [("lobby", {"t": 1})]
        # An empty or unknown room is not an error: stored, delivered to nobody live.
        nowhere = admin.execute("SELECT switchboard.notify_room('nowhere', 'x', '{}')").fetchone()[0]
        assert nowhere > eid
        assert admin.execute("SELECT room FROM switchboard.events WHERE id = %s", (nowhere,)).fetchone() == ("nowhere",)
        throws_ok(admin, "SELECT switchboard.notify_room('bad room!', 'x', '{}')", "22023", match="bad room!")
        throws_ok(admin, "SELECT switchboard.notify_room(NULL, 'x', '{}')", "22023")
        throws_ok(admin, "SELECT switchboard.notify_user(gen_random_uuid(), 'x', '{}')", "P0002")
        throws_ok(admin, "SELECT switchboard.notify_user(%s, 'bad label!', '{}')", "22023", (uid,),
                  match="bad label!")


def _payload_of_size(c: psycopg.Connection, size: int) -> str:
    """A JSON object whose jsonb text form is exactly size bytes."""
    overhead = c.execute("SELECT octet_length(jsonb_build_object('blob', '')::text)").fetchone()[0]
    text = json.dumps({"blob": "x" * (size - overhead)})
    assert c.execute("SELECT octet_length(%s::jsonb::text)", (text,)).fetchone()[0] == size
    return text


def test_one_mebibyte_payload_round_trips_and_its_notify_carries_only_the_id(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "big")
        just_under = _payload_of_size(c, LIMIT - 1)
        lst = listener(db, CHANNEL)
        try:
            eid = c.execute("SELECT switchboard.notify_user(%s, 'file.blob', %s::jsonb)",
                            (uid, just_under)).fetchone()[0]
            (note,) = notifications(lst, 2.0, stop_after=1)
        finally:
            lst.close()
        assert json.loads(note.payload) == {"id": eid}
        ((read_payload,),) = [r[5:6] for r in stored_after(c, eid - 1)]
        assert read_payload == json.loads(just_under)
        ((got_id, got_payload),) = c.execute(
            "SELECT id, payload FROM switchboard.events_since_v2(%s, 0, 0)", (uid,)).fetchall()
        assert got_id == eid and got_payload == json.loads(just_under)

        exact = _payload_of_size(c, LIMIT)
        c.execute("SELECT switchboard.notify_user(%s, 'file.blob', %s::jsonb)", (uid, exact))
        over = _payload_of_size(c, LIMIT + 1)
        throws_ok(c, "SELECT switchboard.notify_user(%s, 'file.blob', %s::jsonb)", "22023", (uid, over),
                  match=str(LIMIT + 1))


END = 2**63 - 1


def tick(c: psycopg.Connection) -> int:
    return c.execute("SELECT switchboard.event_tick()").fetchone()[0]


def since_v2(c: psycopg.Connection, user: str, pos: tuple[int, int] = (0, 0),
             rooms: list[str] | None = None) -> list[tuple[int, int]]:
    """(tick, id) of what user missed after pos, in delivery order."""
    return [(r[0], r[1]) for r in c.execute(
        "SELECT tick, id FROM switchboard.events_since_v2(%s, %s, %s, %s)", (user, pos[0], pos[1], rooms or []))]


def test_publishers_never_wait_and_resume_is_exact_under_out_of_order_commits(db: str) -> None:
    """T1 publishes first and commits last: T2 neither waits for it nor hides it from a
    reader who resumes from T2's event (the old lock made T2 wait; an id cursor skipped T1)."""
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "order")
    t1 = psycopg.connect(db)
    t2 = psycopg.connect(db)
    reader = psycopg.connect(db, autocommit=True)
    try:
        id1 = t1.execute("SELECT switchboard.notify_user(%s, 'first', '{}')", (uid,)).fetchone()[0]
        t2.execute("SET lock_timeout = '200ms'")
        id2 = t2.execute("SELECT switchboard.notify_user(%s, 'second', '{}')", (uid,)).fetchone()[0]
        t2.commit()                                   # no wait, no 55P03
        assert id2 > id1
        k2 = tick(reader)
        assert k2 > 0
        assert tick(reader) == 0                      # nothing new since
        seen = since_v2(reader, uid)
        assert seen == [(k2, id2)]                    # T1 is open: not visible, not skipped
        t1.commit()
        k1 = tick(reader)
        assert k1 > k2
        assert since_v2(reader, uid, seen[-1]) == [(k1, id1)]   # the late committer, once
        assert since_v2(reader, uid) == [(k2, id2), (k1, id1)]  # the delivery order
        assert since_v2(reader, uid, (k1, END)) == []
        # A bare id maps to its batch: (batch(N), N) is the position after event N.
        assert reader.execute("SELECT switchboard.event_batch(%s), switchboard.event_batch(%s)",
                              (id1, id2)).fetchone() == (k1, k2)
        assert reader.execute("SELECT switchboard.event_batch(-5)").fetchone()[0] is None
    finally:
        for c in (t1, t2, reader):
            c.close()


def test_event_tick_refuses_a_transaction_that_wrote_and_skips_when_busy(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "ticker")
    with psycopg.connect(db) as c:
        c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
        throws_ok(c, "SELECT switchboard.event_tick()", "25001")
    holder = psycopg.connect(db)
    other = psycopg.connect(db, autocommit=True)
    try:
        tick(other)
        assert tick(other) == 0                                       # nothing new: read-only, no lock
        other.execute("SELECT switchboard.notify_user(%s, 'y', '{}')", (uid,))
        held = holder.execute("SELECT switchboard.event_tick()").fetchone()[0]  # holds the row until COMMIT
        assert held > 0
        other.execute("SELECT switchboard.notify_user(%s, 'z', '{}')", (uid,))
        assert tick(other) == -1                                      # busy: no wait, try again
        holder.commit()
        assert tick(other) > held
    finally:
        holder.close()
        other.close()


def _seq_scans_of_events(c: psycopg.Connection) -> int:
    c.execute("SELECT pg_stat_clear_snapshot()")
    return int(c.execute("SELECT seq_scan FROM pg_stat_user_tables "
                         "WHERE relid = 'switchboard.events'::regclass").fetchone()[0])


def test_event_tick_never_scans_the_whole_events_table(db: str) -> None:
    """Every replica calls event_tick() on every wake-up, so its cost must not grow with
    the retained events. 0.2.0 asked NOT EXISTS (... xid >= pg_snapshot_xmax(prev)); from
    the sixth call on, PL/pgSQL's cached generic plan was a sequential scan of events
    (17 ms at 80,000 rows: most of the COMMIT -> frame latency). V0014 asks for the
    highest xid through events_xid. Counted by the statistics collector: 20 calls on a
    connection (past the five custom plans), answering both "nothing new" and "new
    events" (the tick's INSERT asks the same question), scan the table zero times."""
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "scan")
        admin.execute("INSERT INTO switchboard.events (id, user_id, event, payload) "
                      "SELECT nextval('switchboard.event_id_seq'), %s, 'old', '{}' "
                      "FROM generate_series(1, 20000)", (uid,))
        admin.execute("ANALYZE switchboard.events")
        assert tick(admin) > 0
        before = _seq_scans_of_events(admin)
        with psycopg.connect(db, autocommit=True) as relay:
            pid = relay.info.backend_pid
            ticked = 0
            for i in range(20):
                if i % 2:
                    admin.execute("SELECT switchboard.notify_user(%s, 'new', '{}')", (uid,))
                got = tick(relay)
                assert got >= 0
                ticked += got > 0
            assert ticked == 10                       # each new event got its tick, the rest "nothing new"
        # A backend flushes its statistics when it exits: wait for it to be gone.
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        after = _seq_scans_of_events(admin)
        assert after == before, f"event_tick scanned switchboard.events {after - before} time(s)"


def test_a_read_of_the_event_stream_is_never_jit_compiled(db: str) -> None:
    """_events_after's generic plan is estimated on the retained events, not on the few a
    wake-up reads: past ~200,000 retained events it crossed jit_above_cost, and every relay
    wake-up paid 1.2-1.7 s of JIT for a read that runs in 2 ms (bench/events_partition_ops.py).
    The function runs with jit = off. Here a session that JIT-compiles every statement (all
    three thresholds 0) reads through relay_read_v3 and events_since_v2: auto_explain shows
    the read's statements without JIT, and a plain query in the same session with it."""
    with psycopg.connect(db, autocommit=True) as c:
        if not c.execute("SELECT pg_jit_available()").fetchone()[0]:
            pytest.skip("this PostgreSQL has no JIT provider (llvmjit): nothing to compile")
        uid = new_user(c, "jit")
        for _ in range(3):
            c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
        assert tick(c) > 0
        notes: list[str] = []
        c.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        for st in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                   "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice",
                   "SET jit = on", "SET jit_above_cost = 0", "SET jit_optimize_above_cost = 0",
                   "SET jit_inline_above_cost = 0"):
            c.execute(st)
        c.execute("SELECT count(*) FROM switchboard.events WHERE user_id = %s", (uid,))
        assert any("JIT:" in n for n in notes), "the control query was not JIT-compiled: the test proves nothing"
        for read in ("SELECT count(*) FROM switchboard.relay_read_v3(0, 0)",
                     "SELECT count(*) FROM switchboard.events_since_v2(%s, 0, 0, '{}', NULL, 100)"):
            notes.clear()
            got = c.execute(read, (uid,) if "%s" in read else None).fetchone()[0]
            assert got >= 3
            inner = [n for n in notes if "FROM switchboard.events e" in n]
            assert inner, "auto_explain did not show _events_after's query"
            assert not any("JIT:" in n for n in inner), inner


def test_cursor_is_complete_under_concurrent_publishers(db: str) -> None:
    """8 publishers commit in random order while a reader ticks and follows its
    position: every committed event exactly once, in increasing position order."""
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "cursor")
    done = threading.Event()
    collected: list[tuple[int, int]] = []

    def read() -> None:
        with psycopg.connect(db, autocommit=True) as r:
            pos = (0, 0)
            while True:
                finished = done.is_set()
                tick(r)
                new = since_v2(r, uid, pos)
                collected.extend(new)
                pos = new[-1] if new else pos
                if finished:
                    tick(r)
                    rest = since_v2(r, uid, pos)
                    collected.extend(rest)
                    return
                time.sleep(0.001)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def publisher(i: int, barrier: threading.Barrier) -> list[int]:
        rng = random.Random(i)
        mine: list[int] = []
        with psycopg.connect(db) as p:
            barrier.wait()
            for n in range(15):
                eid = p.execute("SELECT switchboard.notify_user(%s, 'tick', jsonb_build_object('p', %s, 'n', %s))",
                                (uid, i, n)).fetchone()[0]
                time.sleep(rng.random() * 0.006)  # commit a little later than the id was taken
                if rng.random() < 0.2:
                    p.rollback()
                else:
                    p.commit()
                    mine.append(eid)
        return mine

    committed = sorted(e for ids in race(8, publisher) for e in ids)
    done.set()
    reader.join(10)
    assert not reader.is_alive()
    assert sorted(e for _, e in collected) == committed, "the reader missed or repeated an event"
    assert collected == sorted(collected), "positions must only increase"
    assert len(committed) > 60


def test_publish_then_lock_against_lock_then_publish_is_no_deadlock(db: str) -> None:
    """Publishing takes no lock, so the pattern that deadlocked with the event-order lock
    (publish, then wait for a row another publisher holds) just waits for that row."""
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "dl")
    t1 = psycopg.connect(db)
    t2 = psycopg.connect(db)
    outcome: dict[str, str] = {}
    try:
        for c in (t1, t2):
            c.execute("SET deadlock_timeout = '100ms'")
        t2.execute("SELECT 1 FROM switchboard.users WHERE id = %s FOR UPDATE", (uid,))
        t1.execute("SELECT switchboard.notify_user(%s, 'dl', '{}')", (uid,))

        def step(name: str, c: psycopg.Connection, sql: str) -> None:
            try:
                c.execute(sql, (uid,))
                c.commit()
                outcome[name] = "committed"
            except psycopg.Error as exc:
                outcome[name] = exc.sqlstate or "?"
                c.rollback()

        b = threading.Thread(target=step, args=("t1", t1, "SELECT 1 FROM switchboard.users WHERE id = %s FOR UPDATE"))
        b.start()
        time.sleep(0.2)
        a = threading.Thread(target=step, args=("t2", t2, "SELECT switchboard.notify_user(%s, 'dl2', '{}')"))
        a.start()
        a.join(10)
        b.join(10)
        assert not a.is_alive() and not b.is_alive(), "hung"
        assert outcome == {"t1": "committed", "t2": "committed"}, outcome
    finally:
        t1.close()
        t2.close()


def test_a_user_never_reads_another_users_events(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        a, b = new_user(c, "alice"), new_user(c, "bob")
        c.execute("SELECT switchboard.add_room_member('room-a', %s)", (a,))
        c.execute("SELECT switchboard.add_room_member('room-b', %s)", (b,))
        c.execute("SELECT switchboard.add_room_member('shared', %s)", (a,))
        c.execute("SELECT switchboard.add_room_member('shared', %s)", (b,))
        ev = {name: c.execute(sql, args).fetchone()[0] for name, sql, args in [
            ("to_a", "SELECT switchboard.notify_user(%s, 'x', '{}')", (a,)),
            ("to_b", "SELECT switchboard.notify_user(%s, 'x', '{}')", (b,)),
            ("room_a", "SELECT switchboard.notify_room('room-a', 'x', '{}')", ()),
            ("room_b", "SELECT switchboard.notify_room('room-b', 'x', '{}')", ()),
            ("shared", "SELECT switchboard.notify_room('shared', 'x', '{}')", ()),
        ]}
        every_room = ["room-a", "room-b", "shared", "nowhere"]
        k = tick(c)
        assert [e for _, e in since_v2(c, a, (0, 0), every_room)] == [ev["to_a"], ev["room_a"], ev["shared"]]
        assert [e for _, e in since_v2(c, b, (0, 0), every_room)] == [ev["to_b"], ev["room_b"], ev["shared"]]
        assert [e for _, e in since_v2(c, a, (0, 0))] == [ev["to_a"]]
        assert [e for _, e in since_v2(c, a, (0, 0), ["room-b"])] == [ev["to_a"]]  # B's room adds nothing
        assert [e for _, e in since_v2(c, a, (k, ev["to_a"]), ["room-a"])] == [ev["room_a"]]
        # membership is checked at read time
        c.execute("SELECT switchboard.remove_room_member('shared', %s)", (a,))
        assert [e for _, e in since_v2(c, a, (0, 0), every_room)] == [ev["to_a"], ev["room_a"]]
        # no public function returns rows of switchboard.events (the whole row, any user's):
        # a user's events are read with events_since_v2, which filters by user and room
        readers = [r[0] for r in c.execute(
            """SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'switchboard' AND p.proname !~ '^_'
                  AND p.prorettype = 'switchboard.events'::regtype""")]
        assert readers == []
        throws_ok(c, "SELECT * FROM switchboard.events_since_v2(%s, -1, 0)", "22023", (a,))
        throws_ok(c, "SELECT * FROM switchboard.events_since_v2(%s, 0, 0, '{}', NULL, 0)", "22023", (a,))
        throws_ok(c, "SELECT * FROM switchboard.relay_read_v2(0, -1)", "22023")
        throws_ok(c, "SELECT switchboard.publish_client_event(%s, 'room-b', 'typing', '{}')", "42501", (a,),
                  match="room-b")


def test_a_client_event_is_never_stored_and_has_no_id(db: str) -> None:
    """publish_client_event: an ephemeral row (read by the relays within 30 s) and a
    hint naming it; nothing in switchboard.events, no event id, no tick to deliver."""
    with psycopg.connect(db, autocommit=True) as c:
        a = new_user(c, "typist")
        c.execute("SELECT switchboard.add_room_member('desk', %s)", (a,))
        before = c.execute("SELECT count(*), coalesce(max(id), 0) FROM switchboard.events").fetchone()
        lst = listener(db, CHANNEL)
        try:
            c.execute("SELECT switchboard.publish_client_event(%s, 'desk', 'typing', '{\"on\": true}')", (a,))
            (note,) = notifications(lst, 2.0, stop_after=1)
        finally:
            lst.close()
        eph = json.loads(note.payload)
        assert set(eph) == {"eph"}
        assert c.execute("SELECT room, event, sender, payload FROM switchboard.ephemeral_events WHERE id = %s",
                         (eph["eph"],)).fetchone() == ("desk", "typing", a, {"on": True})
        assert c.execute("SELECT count(*), coalesce(max(id), 0) FROM switchboard.events").fetchone() == before
        assert tick(c) == 0                                  # nothing for the stream to deliver
        assert since_v2(c, a, (0, 0), ["desk"]) == []


def test_reap_events_counts_retention_from_the_tick_and_advances_the_window(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "reap")
        old = [c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0] for _ in range(3)]
        seal_event_partition(db)        # their partition is full (V0037): reap_events may drop it
        k_old = tick(c)
        # inserted long ago but visible only now: kept (retention counts from the tick)
        c.execute("UPDATE switchboard.events SET created_at = now() - interval '1 hour' WHERE id = ANY(%s)", (old,))
        c.execute("UPDATE switchboard.event_ticks SET created_at = now() - interval '1 minute' WHERE tick = %s",
                  (k_old,))
        assert c.execute("SELECT switchboard.reap_events('5 minutes')").fetchone()[0] == 0
        assert [e for _, e in since_v2(c, uid)] == old
        new = c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0]
        k_new = tick(c)
        c.execute("UPDATE switchboard.event_ticks SET created_at = now() - interval '10 minutes' WHERE tick <= %s",
                  (k_old,))
        assert c.execute("SELECT switchboard.reap_events('5 minutes')").fetchone()[0] >= 3
        assert c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0] >= old[-1]
        assert c.execute("SELECT first_tick, last_tick FROM switchboard.event_window()").fetchone() == (k_old, k_new)
        assert since_v2(c, uid, (k_old, END)) == [(k_new, new)]
        assert c.execute("SELECT count(*) FROM switchboard.event_ticks WHERE tick < %s", (k_old,)).fetchone()[0] == 0


@pytest.mark.parametrize("label", ["", "a b", "x" * 129, ".dot-first"])
def test_bad_event_labels(conn: psycopg.Connection, label: str) -> None:
    uid = new_user(conn, "labels")
    throws_ok(conn, "SELECT switchboard.notify_user(%s, %s, '{}')", "22023", (uid, label))


def test_one_notify_per_transaction_and_none_when_publishers_are_silent(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = new_user(admin, "quiet")
    lst = listener(db, CHANNEL)
    try:
        with psycopg.connect(db) as pub:
            ids = [pub.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0]
                   for _ in range(5)]
            pub.commit()
            notes = notifications(lst, 1.0)
            assert [json.loads(n.payload) for n in notes] == [{"id": ids[0]}]   # one wake-up for five
            # A rolled-back subtransaction takes its NOTIFY and its marker with it.
            pub.execute("SAVEPOINT s")
            pub.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
            pub.execute("ROLLBACK TO SAVEPOINT s")
            kept = pub.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0]
            pub.commit()
            assert [json.loads(n.payload) for n in notifications(lst, 1.0)] == [{"id": kept}]
            with psycopg.connect(db, autocommit=True) as su:
                su.execute("UPDATE switchboard.event_ticker SET publishers_notify = false")
                assert su.execute("SELECT publishers_notify FROM switchboard.event_window()").fetchone()[0] is False
            quiet = pub.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0]
            pub.commit()
            assert notifications(lst, 0.5) == []                        # publishers only INSERT
            with psycopg.connect(db, autocommit=True) as r:
                k = tick(r)                                              # the ticker wakes the relays
                assert [json.loads(n.payload) for n in notifications(lst, 1.0)] == [{"tick": k}]
                assert since_v2(r, uid, (k - 1, END))[-1] == (k, quiet)
    finally:
        lst.close()


def test_a_payload_nested_too_deep_is_refused_at_publish(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """A payload nested thousands of levels deep is valid jsonb, but readers parse
    recursively: one such event made every relay with a socket of its user fail its read
    and reconnect, forever. Refused at publish (22023, the limit named, a HINT); 64 levels,
    the HTTP API's bound, still go through and are delivered, and so is what follows."""
    from harness import make_user as mk

    uid = mk(db, "deep")
    s = server_factory(name="deep")
    ws = s.ws(s.login("deep"))
    with psycopg.connect(db, autocommit=True) as c:
        for n in (65, 5000):   # n nested arrays around a value
            with pytest.raises(psycopg.Error) as exc:
                c.execute("SELECT switchboard.notify_user(%s, 'deep', %s::jsonb)", (uid, "[" * n + "1" + "]" * n))
            assert exc.value.sqlstate == "22023" and "64" in str(exc.value) and exc.value.diag.message_hint
        ok = c.execute("SELECT switchboard.notify_user(%s, 'deep', %s::jsonb)",
                       (uid, "[" * 64 + "1" + "]" * 64)).fetchone()[0]
        after = c.execute("SELECT switchboard.notify_user(%s, 'after', '{}')", (uid,)).fetchone()[0]
    got = [ws.recv_until(lambda f: f.get("id") is not None)["id"] for _ in range(2)]
    assert got == [ok, after]
    ws.close()


def _resume(ws, cur: str) -> list[dict]:  # type: ignore[no-untyped-def]
    """Send a resume action; every frame up to and including its "resumed"."""
    ws.send({"action": "resume", "cursor": cur})
    frames = [ws.recv(timeout=15)]
    while frames[-1]["event"] != "resumed":
        frames.append(ws.recv(timeout=15))
    return frames


def test_a_stored_payload_too_deep_to_parse_is_skipped_and_counted(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """A row that no Python reader can parse (5,000 nested arrays: stored before V0020's
    publish check, or written by hand as the owner) must not stop delivery. Before, the
    relay's read raised on it, the relay reconnected and read it again, forever, and a
    resume across it failed every time. Now: skipped and counted
    (switchboard_bad_input_total{source="event_row"}); the events around it are
    delivered live, and a resume from before it replays exactly those two."""
    from harness import make_user as mk

    uid = mk(db, "poison")
    s = server_factory(name="poison")
    ws = s.ws(s.login("poison"))
    deep = "[" * 5000 + "1" + "]" * 5000
    with psycopg.connect(db, autocommit=True) as c:
        before = c.execute("SELECT switchboard.notify_user(%s, 'before', '{}')", (uid,)).fetchone()[0]
        first = ws.recv_until(lambda f: f.get("id") == before)
        with c.transaction():
            poison = c.execute(
                "INSERT INTO switchboard.events (id, user_id, event, payload, created_at) "
                "VALUES (nextval('switchboard.event_id_seq'), %s, 'poison', %s::jsonb, now()) RETURNING id",
                (uid, deep)).fetchone()[0]
            c.execute("SELECT pg_notify('switchboard_events', json_build_object('id', %s::bigint)::text)", (poison,))
        after = c.execute("SELECT switchboard.notify_user(%s, 'after', '{}')", (uid,)).fetchone()[0]
    got = ws.recv_until(lambda f: f.get("id") is not None)
    assert got["id"] == after, got
    text = httpx.get(s.base + "/metrics", timeout=10).text
    assert re.search(r'^switchboard_bad_input_total\{[^}]*source="event_row"[^}]*\} 1\.0$', text, re.M), text
    # A resume from the frame before the poison row, on the socket that has the one after
    # it: nothing again, and no error.
    frames = _resume(ws, first["cursor"])
    assert [f for f in frames if f.get("id") is not None or f["event"] == "error"] == []
    assert frames[-1]["payload"]["replayed"] == 0
    # A fresh socket resuming from there gets it replayed.
    ws2 = s.ws(s.login("poison"))
    frames = _resume(ws2, first["cursor"])
    assert [f["id"] for f in frames if f.get("id") is not None] == [after], frames
    assert frames[-1]["payload"]["replayed"] == 1
    ws.close()
    ws2.close()
