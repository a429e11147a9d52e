"""The live channel is private (issue 32): what a role that can merely connect learns
from the bus while the verified live path is on, what a flood of forged live messages
costs a relay, and a key rotation while events flow.

Attacks, each run against a real replica and a real WebSocket client:
- an eavesdropper (a LOGIN role with nothing but CONNECT) LISTENs on every channel
  name Switchboard's SQL sends on, plus the live path's old public channel: it must
  hear no event's payload, label, user or room (it heard all four on
  ``switchboard_live`` before V0025);
- a bad-MAC flood on the real channel (the name leaked: the test reads it as the
  owner) must not cost a key read per message or per read cycle (before V0025 each
  read cycle after a bad MAC re-read the key), and real events still arrive, in
  order, once.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from harness import ROOT, events_of, make_user

EAVESDROPPER = f"sb_eve_{os.getpid()}"
MALLORY = f"sb_mallory_{os.getpid()}"
STATS = f"sb_stats_{os.getpid()}"
SECRET = "IBAN-DE89-3704-0044-0532-0130-00"


def _role_url(db: str, role: str) -> str:
    return db.replace("postgres@", f"{role}@", 1)


@pytest.fixture
def roles(pg, db: str) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """Three LOGIN roles that hold nothing of Switchboard's: two with only CONNECT (PUBLIC's
    default), one that also holds pg_read_all_stats (sees every session's query text)."""
    names = (EAVESDROPPER, MALLORY, STATS)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        for n in names:
            c.execute(f"DROP ROLE IF EXISTS {n}")
            c.execute(f"CREATE ROLE {n} LOGIN")
        c.execute(f"GRANT pg_read_all_stats TO {STATS}")
    yield {"eve": _role_url(db, EAVESDROPPER), "mallory": _role_url(db, MALLORY), "stats": _role_url(db, STATS)}
    with psycopg.connect(pg.url(), autocommit=True) as c:
        for n in names:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (n,))
            c.execute(f"DROP ROLE IF EXISTS {n}")


def _sql_channels() -> set[str]:
    """Every channel name a pg_notify() in db/functions/*.sql names literally."""
    names: set[str] = set()
    for p in (ROOT / "db" / "functions").glob("*.sql"):
        names |= set(re.findall(r"pg_notify\(\s*'([a-z_]+)'", p.read_text()))
    assert {"switchboard_events", "switchboard_control", "switchboard_runs"} <= names, names
    return names


def _live(db: str, on: bool = True, *, id_hints: bool = True, rotate: bool = False) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.event_live_path(%s, rotate_key => %s, send_id_hints => %s)",
                  (on, rotate, id_hints))


def _channel(db: str) -> str:
    """The live path's channel, read as the owner (what a leaked name would give away)."""
    with psycopg.connect(db, autocommit=True) as c:
        try:
            return str(c.execute("SELECT channel FROM switchboard.event_live").fetchone()[0])
        except psycopg.errors.UndefinedColumn:
            return "switchboard_live"       # before V0025: one public channel


def _publish(c: psycopg.Connection, uid: str, event: str, payload: dict) -> int:
    return int(c.execute("SELECT switchboard.notify_user(%s, %s, %s)", (uid, event, json.dumps(payload))).fetchone()[0])


def _metric(s, name: str) -> float:  # type: ignore[no-untyped-def]
    text = httpx.get(s.base + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, flags=re.M))


def _key_calls(db: str) -> int:
    """relay_live_key() calls by every session of this database (track_functions), as the
    statistics system has them: flushed by each backend at most once a second."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                        "WHERE schemaname = 'switchboard' AND funcname = 'relay_live_key'").fetchone()
        return int(row[0])


def _settled_key_calls(db: str) -> int:
    time.sleep(2.5)          # every backend's pending statistics flushed (PGSTAT_MIN_INTERVAL 1 s)
    return _key_calls(db)


def test_an_eavesdropper_hears_no_event_content_user_or_room(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                            roles: dict[str, str]) -> None:
    """A CONNECT-only role LISTENs on every channel Switchboard's SQL names (and on the
    live path's old public channel) while events with a secret payload, a secret label
    and a secret room go to a user with the live path on -- also across a key rotation,
    and with a relay delivering them live. It hears none of the payload, label, user or
    room. A pg_read_all_stats role polling pg_stat_activity never sees the live
    channel's name, and neither does /metrics nor the replica's log."""
    uid = make_user(db, "ann")
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.add_room_member('vault-7731', %s::uuid)", (uid,))
    _live(db, True)
    s = server_factory(name="private")
    ws = s.ws(s.login("ann"))
    assert ws.join("vault-7731")["event"] == "joined"
    channels = sorted(_sql_channels() | {"switchboard_live"})
    eve = psycopg.connect(roles["eve"], autocommit=True)
    for ch in channels:
        eve.execute(f'LISTEN "{ch}"')
    stop = threading.Event()
    seen_queries: set[str] = set()

    def watch_stats() -> None:
        with psycopg.connect(roles["stats"], autocommit=True) as st:
            while not stop.is_set():
                for (q,) in st.execute("SELECT query FROM pg_stat_activity WHERE datname = current_database()"):
                    seen_queries.add(q or "")
                time.sleep(0.005)

    watcher = threading.Thread(target=watch_stats, daemon=True)
    watcher.start()
    ids: list[int] = []
    names = [_channel(db)]
    try:
        with psycopg.connect(db, autocommit=True) as pub:
            for k in range(30):
                if k == 15:
                    _live(db, True, rotate=True)
                ids.append(_publish(pub, uid, "secret.bank", {"iban": SECRET, "k": k}))
                ids.append(int(pub.execute("SELECT switchboard.notify_room('vault-7731', 'secret.room', %s)",
                                           (json.dumps({"iban": SECRET}),)).fetchone()[0]))
                time.sleep(0.02)
        names.append(_channel(db))
        got = [ws.recv_until(lambda f: f.get("id") is not None)["id"] for _ in ids]
        assert got == ids, "the client did not get every event once, in order"
        heard = [(n.channel, n.payload) for n in eve.notifies(timeout=1.5)]
    finally:
        stop.set()
        watcher.join(10)
        eve.close()
    assert heard, "the eavesdropper heard nothing at all: is it listening?"
    for ch, payload in heard:
        for secret in (SECRET, "secret.bank", "secret.room", "vault-7731", uid):
            assert secret not in payload, f"{secret!r} overheard on {ch}: {payload[:200]}"
    # The channel names themselves: not in any session's query text (the relay LISTENs
    # through a function, with the name as a bound parameter), nor in what the replica
    # exposes. (The old public channel is no secret: nothing is sent on it.)
    private = [n for n in names if n != "switchboard_live"]
    assert len(set(private)) == 2, names
    exposed = "\n".join(seen_queries) + httpx.get(s.base + "/metrics", timeout=10).text + s.log()
    for n in private:
        assert n not in exposed, f"the live channel {n} is visible"
    assert _metric(s, "switchboard_live_frames_total") > 0, "nothing went live: the test proves little"
    ws.close()


def test_a_bad_mac_flood_on_the_real_channel_costs_no_key_reads(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                                pg, roles: dict[str, str]) -> None:
    """The live channel's name leaked (the test reads it as the owner). A CONNECT-only role
    sends thousands of well-formed live messages with wrong MACs on it, one transaction
    each, while a publisher sends real events. The relay raises a barrier for each (the
    read delivers what follows) but reads the key no more than when idle: neither
    switchboard_live_key_reads_total nor relay_live_key()'s call count (track_functions)
    grows with the flood, while the flood makes the relay read hundreds of times. Real
    events still arrive at the WebSocket, once, in order. Then forged rotation hints
    ({"live":1} on switchboard_events): at most one key read per read cycle."""
    uid = make_user(db, "ann")
    _live(db, True)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{db.rsplit("/", 1)[1].split("?")[0]}" SET track_functions = \'pl\'')
    # Idle checks (each re-reads the key) only every 5 s: the bound below is about the flood.
    s = server_factory(name="flood", env={"SWITCHBOARD_LISTEN_CHECK_INTERVAL": "5"})
    ws = s.ws(s.login("ann"))
    channel = _channel(db)
    with psycopg.connect(db, autocommit=True) as pub:
        warm = _publish(pub, uid, "warm", {})
    ws.recv_until(lambda f: f.get("id") == warm)
    calls0 = _settled_key_calls(db)
    reads0, keys0 = _metric(s, "switchboard_relay_reads_total"), _metric(s, "switchboard_live_key_reads_total")
    rejected0 = _metric(s, "switchboard_notify_rejected_total")
    body = json.dumps({"id": 1, "u": uid, "r": None, "e": "forged", "t": int(time.time() * 1000), "p": {}},
                      separators=(",", ":"))
    stop = threading.Event()
    sent = {"n": 0}
    errors: list[BaseException] = []

    def flood() -> None:
        try:
            with psycopg.connect(roles["mallory"], autocommit=True) as m:
                while not stop.is_set() and sent["n"] < 20000:
                    m.execute("SELECT pg_notify(%s, %s)", (channel, f"{sent['n']:064x}" + body))
                    sent["n"] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    attacker = threading.Thread(target=flood, daemon=True)
    attacker.start()
    ids: list[int] = []
    try:
        with psycopg.connect(db, autocommit=True) as pub:
            end = time.monotonic() + 3.0
            while time.monotonic() < end and not errors:
                ids.append(_publish(pub, uid, "real", {"n": len(ids)}))
                time.sleep(0.02)
    finally:
        stop.set()
        attacker.join(30)
    assert not errors, errors
    got = [ws.recv_until(lambda f: f.get("event") == "real")["id"] for _ in ids]
    assert got == ids, "real events lost, repeated or reordered under the flood"
    assert events_of(ws.drain(quiet=0.5)) == []
    reads = _metric(s, "switchboard_relay_reads_total") - reads0
    keys = _metric(s, "switchboard_live_key_reads_total") - keys0
    calls = _settled_key_calls(db) - calls0
    print(f"flood: {sent['n']} bad-MAC messages, {len(ids)} events, {reads} reads, {keys} key reads, "
          f"{calls} relay_live_key calls")
    assert _metric(s, "switchboard_notify_rejected_total") - rejected0 >= 1000, "the flood was not heard"
    assert reads >= 30, f"the flood made the relay read only {reads} times: the bound proves little"
    assert keys <= 4 and calls <= 4, f"{keys} key reads ({calls} relay_live_key calls) for {sent['n']} " \
                                     f"bad-MAC messages and {reads} reads"

    # Forged rotation hints: coalesced, at most one key read per read cycle.
    reads0, keys0 = _metric(s, "switchboard_relay_reads_total"), _metric(s, "switchboard_live_key_reads_total")
    with psycopg.connect(roles["mallory"], autocommit=True) as m:
        for _ in range(2000):
            m.execute("SELECT pg_notify('switchboard_events', '{\"live\":1}')")
    with psycopg.connect(db, autocommit=True) as pub:
        last = _publish(pub, uid, "real", {"n": -1})
    assert ws.recv_until(lambda f: f.get("event") == "real")["id"] == last
    time.sleep(1.0)
    reads = _metric(s, "switchboard_relay_reads_total") - reads0
    keys = _metric(s, "switchboard_live_key_reads_total") - keys0
    print(f"rotation hints: {keys} key reads, {reads} reads")
    assert keys <= reads + 2, f"{keys} key reads for 2000 forged rotation hints and {reads} reads"
    assert httpx.get(s.base + "/healthz/ready", timeout=10).status_code == 200
    ws.close()


@pytest.mark.parametrize("id_hints", [True, False], ids=["id-hints", "live-messages-only"])
def test_a_key_rotation_while_events_flow_loses_nothing_and_goes_live_again(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                                           id_hints: bool) -> None:
    """Three rotations while one publisher sends 300 events, and the relay's LISTEN
    connection killed between two of them (it LISTENs on the live channel again when it
    reconnects): the client gets each event once, in commit order; afterwards an event
    reaches it while no relay can read it (the ticker row held), so it went live under
    the newest key, on the newest channel."""
    uid = make_user(db, "ann")
    _live(db, True, id_hints=id_hints)
    s = server_factory(name="rotate")
    ws = s.ws(s.login("ann"))
    ids: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as pub:
                for k in range(300):
                    ids.append(_publish(pub, uid, "flow", {"k": k}))
                    time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    channels = [_channel(db)]
    for r in range(3):
        time.sleep(0.7)
        _live(db, True, id_hints=id_hints, rotate=True)
        channels.append(_channel(db))
        if r == 1:
            with psycopg.connect(db, autocommit=True) as c:
                assert c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                 "WHERE application_name = 'switchboard-listen'").fetchone()[0] == 1
    done.wait(60)
    publisher.join(10)
    assert not errors, errors
    assert len(set(channels)) == 4, channels
    got = [ws.recv_until(lambda f: f.get("event") == "flow")["id"] for _ in ids]
    assert got == ids, "lost, repeated or reordered across the rotations"
    assert events_of(ws.drain(quiet=0.5)) == []
    # Live again: with the ticker row held no read returns anything new, so the frame can
    # only come from a live message verified under the newest key.
    live0 = _metric(s, "switchboard_live_frames_total")
    held = psycopg.connect(db)
    try:
        deadline = time.monotonic() + 20
        while True:
            with psycopg.connect(db, autocommit=True) as pub:
                warm = _publish(pub, uid, "warm", {})
            ws.recv_until(lambda f: f.get("id") == warm)
            if _metric(s, "switchboard_live_frames_total") > live0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        held.execute("SELECT 1 FROM switchboard.event_ticker WHERE singleton FOR UPDATE")
        with psycopg.connect(db, autocommit=True) as pub:
            after = _publish(pub, uid, "after", {"ok": True})
        f = ws.recv_until(lambda f: f.get("id") is not None, timeout=15)
        assert f["id"] == after and f["payload"] == {"ok": True}
    finally:
        held.rollback()
        held.close()
    assert _metric(s, "switchboard_live_frames_total") > live0
    assert _metric(s, "switchboard_listen_reconnects_total") == 2
    ws.close()
