"""V0037: events partitioned by id; retention drops whole partitions.

- Publishers race the reaper, some holding their transactions open across a
  sweep: every committed event is delivered by a relay read (relay_read_v3), or the
  read said resume_gap and the event is really gone. Never silently lost.
- At a steady rate every event lands in a range partition (created ahead), none in
  events_default, and old partitions are dropped.
- A burst that outruns the partitions ahead lands in events_default: the publish
  succeeds, status() reports the rows, the next partition starts above them, and the
  rows are deleted once reapable.
- A populated 0.2.0 database is migrated to head while publishers publish.
"""

from __future__ import annotations

import io
import random
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from conftest import drop_db
from harness import ROOT, make_user, tick_covering_everything
from switchboard.migrate import migrate

END = 9223372036854775807
PREVIOUS = "8302152"   # "Release 0.2.0", as tests/test_event_rollout.py


def small_partitions(c: psycopg.Connection, span: int = 100) -> None:
    """Partitions of ``span`` ids (so a test fills them with a few hundred events).
    The fresh database's empty partitions go; the first new one starts at the next id
    and is wider than max_connections, so the normal path (continue at the top) is the
    one events_partitions_ensure takes afterwards."""
    last = c.execute("SELECT switchboard._event_id_allocated()").fetchone()[0]
    for (name,) in c.execute("SELECT partition_name FROM switchboard.event_partitions() "
                             "WHERE NOT is_default AND from_id > %s", (last,)).fetchall():
        c.execute(f"ALTER TABLE switchboard.events DETACH PARTITION switchboard.{name}")
        c.execute(f"DROP TABLE switchboard.{name}")
    top = c.execute("SELECT coalesce(max(to_id), %s) FROM switchboard.event_partitions() WHERE NOT is_default",
                    (last + 1,)).fetchone()[0]
    first = max(span, int(c.execute("SHOW max_connections").fetchone()[0]) + 1)
    c.execute(f"CREATE TABLE switchboard.events_p{top} (LIKE switchboard.events INCLUDING DEFAULTS "
              "INCLUDING CONSTRAINTS INCLUDING COMMENTS)")
    c.execute(f"ALTER TABLE switchboard.events ATTACH PARTITION switchboard.events_p{top} "
              f"FOR VALUES FROM ({top}) TO ({top + first})")
    c.execute("UPDATE switchboard.event_partitioning SET min_span = %s", (span,))
    c.execute("SELECT switchboard.events_partitions_ensure('0 seconds')")


def layout(c: psycopg.Connection) -> list[tuple]:
    return c.execute("SELECT partition_name, from_id, to_id, is_default FROM switchboard.event_partitions()"
                     ).fetchall()


def default_rows(c: psycopg.Connection) -> int:
    return c.execute("SELECT count(*) FROM switchboard.events_default").fetchone()[0]


def counters(c: psycopg.Connection) -> dict:
    row = c.execute("SELECT dropped, drops_skipped, created, creates_skipped FROM switchboard.event_partitioning"
                    ).fetchone()
    return dict(zip(("dropped", "drops_skipped", "created", "creates_skipped"), row))


class Relay:
    """Reads like a relay (relay_read_v3 from a position; a position below the window
    is a gap: resume_gap, then on from the window's start, as relay/stream.py does)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.pos = (0, 0)
        self.delivered: list[int] = []
        self.gaps: list[tuple[tuple[int, int], int]] = []

    def read(self) -> int:
        rows = self.conn.execute("SELECT kind, tick, id FROM switchboard.relay_read_v3(%s, %s, '{}', 1000)",
                                 self.pos).fetchall()
        first_tick = rows[0][1]
        tick, eid = self.pos
        if first_tick > 0 and (tick < first_tick or (tick == first_tick and eid != END)):
            self.gaps.append((self.pos, first_tick))
            self.pos = (first_tick, END)
            return -1
        events = [(r[1], r[2]) for r in rows[1:] if r[0] == "event"]
        for t, i in events:
            assert (t, i) > self.pos, ("out of order", (t, i), self.pos)
            self.delivered.append(i)
            self.pos = (t, i)
        return len(events)


def test_publishers_racing_partition_drops_lose_nothing_silently(db: str) -> None:
    uid = make_user(db, "part-race")
    with psycopg.connect(db, autocommit=True) as c:
        small_partitions(c, 100)
    stop, publishing = threading.Event(), threading.Event()
    committed: list[int] = []
    held = [0]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def guard(fn):  # type: ignore[no-untyped-def]
        def run(*args: int) -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        return run

    @guard
    def publisher(k: int = 0) -> None:
        rnd = random.Random(k)
        with psycopg.connect(db) as p:
            while publishing.is_set():
                ids = [p.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0]
                       for _ in range(rnd.randint(1, 3))]
                if rnd.random() < 0.1:           # held open across reaper sweeps
                    time.sleep(rnd.uniform(0.2, 0.5))
                    with lock:
                        held[0] += 1
                if rnd.random() < 0.1:
                    p.rollback()
                    continue
                p.commit()
                with lock:
                    committed.extend(ids)

    @guard
    def ticker() -> None:
        with psycopg.connect(db, autocommit=True) as t:
            while not stop.is_set():
                t.execute("SELECT switchboard.event_tick()")
                time.sleep(0.005)

    @guard
    def reaper() -> None:
        with psycopg.connect(db, autocommit=True) as r:
            while not stop.is_set():
                r.execute("SELECT switchboard.maintenance(max_rows => 1000, keep_events => '1 second')")
                time.sleep(0.05)

    relay = Relay(db)

    @guard
    def reader() -> None:
        while not stop.is_set():
            if relay.read() == 0:
                time.sleep(0.005)

    publishing.set()
    pubs = [threading.Thread(target=publisher, args=(k,)) for k in range(4)]
    others = [threading.Thread(target=f) for f in (ticker, reaper, reader)]
    for t in pubs + others:
        t.start()
    deadline = time.monotonic() + 60
    with psycopg.connect(db, autocommit=True) as c:
        # Run until partitions were dropped while publishers held transactions open.
        while time.monotonic() < deadline and not errors:
            if counters(c)["dropped"] >= 3 and held[0] >= 5 and time.monotonic() > deadline - 52:
                break
            time.sleep(0.2)
    publishing.clear()
    for t in pubs:
        t.join(30)
    stop.set()
    for t in others:
        t.join(30)
    assert not errors, errors
    tick_covering_everything(db)
    while relay.read() != 0:
        pass
    with psycopg.connect(db, autocommit=True) as c:
        stored = {r[0] for r in c.execute("SELECT id FROM switchboard.events")}
        got = counters(c)
        in_default = default_rows(c)
    relay.conn.close()
    assert got["dropped"] >= 3, got
    assert len(relay.delivered) == len(set(relay.delivered)), "an event was delivered twice"
    assert set(relay.delivered) <= set(committed), "a rolled-back event was delivered"
    missed = set(committed) - set(relay.delivered)
    # Anything not delivered was really reaped, and the reader was told (resume_gap).
    assert not missed or relay.gaps, f"{len(missed)} committed events lost silently: {sorted(missed)[:10]}"
    assert not missed & stored, "an event still stored was skipped"
    assert in_default == 0, "at this rate every event had a partition"
    print(f"committed={len(committed)} delivered={len(relay.delivered)} gaps={len(relay.gaps)} "
          f"held={held[0]} {got}")


def test_relay_reads_visit_only_the_partitions_their_ids_can_be_in_and_miss_no_long_publisher(db: str) -> None:
    """V0038: a read bounds the ids it can meet (each tick records the sequence before its
    own xid and after its snapshot), so its plan prunes the partitions outside. The lower
    bound comes from a tick taken before the oldest xid the read can return was
    assigned: a publisher that took its event id many partitions ago and commits now is
    still read. Using the newest tick's floor instead would miss it; without bounds, the
    plan names every partition."""
    uid = make_user(db, "prune")
    with psycopg.connect(db, autocommit=True) as c:
        small_partitions(c, 100)
        long = psycopg.connect(db)                  # holds its event open across partitions
        long_id = long.execute("SELECT switchboard.notify_user(%s, 'long', '{}')", (uid,)).fetchone()[0]
        for i in range(600):
            c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
            if i % 50 == 0:
                c.execute("SELECT switchboard.events_partitions_ensure('0 seconds')")
                tick_covering_everything(db)
        tick_covering_everything(db)
        assert default_rows(c) == 0
        pos = (c.execute("SELECT last_tick FROM switchboard.event_window()").fetchone()[0], END)
        assert c.execute("SELECT count(*) FROM switchboard.relay_read_v3(%s, %s) WHERE kind = 'event'",
                         pos).fetchone()[0] == 0
        long.commit()
        long.close()
        tick_covering_everything(db)
        got = [r[0] for r in c.execute("SELECT id FROM switchboard.relay_read_v3(%s, %s) WHERE kind = 'event'",
                                        pos).fetchall()]
        assert got == [long_id], "the event of the transaction open across partitions was not read"
        # Every transaction is done now: a live read prunes to the newest partitions.
        pos = (c.execute("SELECT last_tick FROM switchboard.event_window()").fetchone()[0], END)
        for _ in range(3):
            c.execute("SELECT switchboard.notify_user(%s, 'y', '{}')", (uid,))
        tick_covering_everything(db)
        parts = [r[0] for r in c.execute("SELECT partition_name FROM switchboard.event_partitions()").fetchall()]
        assert len(parts) >= 6
        notes: list[str] = []
        c.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        for st in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                   "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice"):
            c.execute(st)
        got = c.execute("SELECT count(*) FROM switchboard.relay_read_v3(%s, %s) WHERE kind = 'event'",
                        pos).fetchone()[0]
        assert got == 3
        (plan,) = [n for n in notes if "FROM switchboard.events e" in n]
        scanned = [p for p in parts if f" {p} " in plan]
        assert 1 <= len(scanned) <= 2, (scanned, plan)


def test_a_steady_rate_never_lands_in_default_and_old_partitions_go(db: str) -> None:
    uid = make_user(db, "part-steady")
    with psycopg.connect(db, autocommit=True) as c:
        small_partitions(c, 100)
        first = layout(c)
        for _ in range(30):                      # 30 sweeps, 40 events between two
            c.execute("SELECT count(switchboard.notify_user(%s, 'x', '{}')) FROM generate_series(1, 40)", (uid,))
            tick_covering_everything(db)
            # keep 0: partitions stay min_span wide (a keep window's ids are none)
            c.execute("SELECT switchboard.reap_events('0 seconds', 1000)")
            ahead = c.execute("SELECT count(*) FROM switchboard.event_partitions() "
                              "WHERE NOT is_default AND from_id > switchboard._event_id_allocated()").fetchone()[0]
            assert ahead >= 2, layout(c)
            assert default_rows(c) == 0
        got = counters(c)
        assert got["dropped"] >= 8 and got["created"] >= 8, got
        names = {r[0] for r in layout(c)}
        assert not {r[0] for r in first if not r[3]} & names, "the first partitions were not dropped"
        assert len(names) <= 6, layout(c)        # a bounded number retained: old ones dropped
        # What follows the window replays exactly, in order.
        window = c.execute("SELECT first_tick, reaped_through FROM switchboard.event_window()").fetchone()
        more = [r[0] for r in c.execute("SELECT switchboard.notify_user(%s, 'x', '{}') FROM generate_series(1, 5)",
                                        (uid,))]
        tick_covering_everything(db)
        ids = [r[0] for r in c.execute("SELECT id FROM switchboard.events_since_v2(%s, %s, %s)",
                                       (uid, window[0], END))]
        assert ids == more and min(ids) > window[1]


def test_a_burst_that_outruns_the_partitions_lands_in_default(db: str) -> None:
    uid = make_user(db, "part-burst")
    with psycopg.connect(db, autocommit=True) as c:
        small_partitions(c, 100)
        top = c.execute("SELECT max(to_id) FROM switchboard.event_partitions() WHERE NOT is_default").fetchone()[0]
        n = top + 50 - c.execute("SELECT switchboard._event_id_allocated()").fetchone()[0]
        # More than every partition ahead holds, between two sweeps: the publish succeeds.
        ids = [r[0] for r in c.execute("SELECT switchboard.notify_user(%s, 'x', '{}') FROM generate_series(1, %s)",
                                       (uid, n))]
        assert len(ids) == n and max(ids) >= top
        assert default_rows(c) == sum(1 for i in ids if i >= top) > 0
        status = dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())
        assert status["events_default_rows"] == default_rows(c)
        # The next sweep creates partitions above the rows in events_default.
        c.execute("SELECT switchboard.reap_events('5 minutes', 1000)")
        new = [r for r in layout(c) if not r[3] and r[1] is not None and r[1] >= top]
        assert new and min(r[1] for r in new) > max(ids), layout(c)
        after = c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0]
        assert after > max(ids)
        # Once reapable, events_default's rows are deleted row by row (max_rows each call).
        tick_covering_everything(db)
        c.execute("UPDATE switchboard.event_ticks SET created_at = created_at - interval '10 minutes'")
        while c.execute("SELECT switchboard.reap_events('5 minutes', 20)").fetchone()[0] > 0:
            pass
        assert default_rows(c) == 0
        assert c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0] >= max(ids)


@pytest.fixture
def previous_db_dir(tmp_path: Path) -> Path:
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS, "db"],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history ({PREVIOUS})")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "db"


def test_a_populated_020_database_migrates_to_head_while_publishing(pg, previous_db_dir: Path) -> None:  # type: ignore[no-untyped-def]
    name = f"sb_020_{time.monotonic_ns()}"
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = pg.url(name)
    try:
        migrate(url, base=previous_db_dir)
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT relkind FROM pg_class WHERE oid = 'switchboard.events'::regclass"
                             ).fetchone()[0] == "r"
            uid = c.execute("SELECT switchboard.create_user('old', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$"
                            "aGFzaGhhc2hoYXNoaGFzaA')").fetchone()[0]
            before = [r[0] for r in c.execute("SELECT switchboard.notify_user(%s, 'old', '{}') "
                                              "FROM generate_series(1, 3000)", (uid,))]
            c.execute("SELECT switchboard.event_tick()")
        publishing = threading.Event()
        publishing.set()
        during: list[int] = []
        errors: list[BaseException] = []

        def publisher() -> None:
            try:
                with psycopg.connect(url, autocommit=True) as p:
                    while publishing.is_set():
                        during.append(p.execute("SELECT switchboard.notify_user(%s, 'during', '{}')",
                                                (uid,)).fetchone()[0])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=publisher) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        migrate(url)                                  # head: V0037 converts events
        time.sleep(0.3)
        publishing.clear()
        for t in threads:
            t.join(30)
        assert not errors, errors
        tick_covering_everything(url)
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT relkind FROM pg_class WHERE oid = 'switchboard.events'::regclass"
                             ).fetchone()[0] == "p"
            parts = {r[0]: r for r in layout(c)}
            assert "events_p0" in parts and "events_default" in parts
            # the 0.2.0 rows are events_p0's; the publishes that waited for the migration
            # went on in the new partitions; none is lost, none twice
            p0_ids = {r[0] for r in c.execute("SELECT id FROM switchboard.events_p0")}
            assert set(before) <= p0_ids
            assert default_rows(c) == 0
            got = [r[0] for r in c.execute("SELECT id FROM switchboard.events_since_v2(%s, 0, 0, '{}', NULL, 100000)",
                                           (uid,))]
            assert sorted(got) == sorted(before + during) and len(got) == len(set(got))
            assert any(i not in p0_ids for i in during), "no publish happened after the conversion"
            # and events_p0 goes whole once its rows are reapable
            c.execute("UPDATE switchboard.event_ticks SET created_at = created_at - interval '10 minutes'")
            c.execute("SELECT switchboard.reap_events('5 minutes', 1000)")
            assert "events_p0" not in {r[0] for r in layout(c)}
            assert c.execute("SELECT reaped_through FROM switchboard.event_window()").fetchone()[0] >= max(before)
    finally:
        drop_db(pg, name)
