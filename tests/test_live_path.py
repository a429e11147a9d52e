"""The verified live path (V0020): signed whole-event NOTIFYs, off by default.

SQL level here: what a publisher sends, that the MAC is standard HMAC-SHA256 (checked
with Python's hmac module, not with our own code), that the channel is named after the
key as documented (V0025), who may read the key and switch the path. The relay's side
(deliver what verifies, read everything all the same, exactly once under any commit
order) is in tests/test_live_relay.py; eavesdroppers and floods in
tests/test_live_private.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import psycopg
import pytest
from pgtap import listener, notifications

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
LIVE = "switchboard_live"


def _user(c: psycopg.Connection, name: str) -> str:
    return str(c.execute("SELECT switchboard.create_user(%s, %s)", (name, ARGON)).fetchone()[0])


def _key(c: psycopg.Connection) -> tuple[bytes | None, str | None]:
    key, channel = c.execute("SELECT key, channel FROM switchboard.relay_live_key()").fetchone()
    return (None if key is None else bytes(key)), channel


def _channel_of(key: bytes) -> str:
    """The documented derivation (README "NOTIFY channels"), computed independently."""
    return "switchboard_live_" + hashlib.sha256(b"switchboard-live-channel:" + key).hexdigest()[:32]


def _verify(key: bytes, payload: str) -> dict:
    mac, msg = payload[:64], payload[64:]
    assert hmac.compare_digest(mac, hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()), payload[:200]
    return json.loads(msg)


def test_off_by_default_then_signed_messages_in_commit_order(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = _user(admin, "ann")
        assert _key(admin) == (None, None)
        channel = admin.execute("SELECT channel FROM switchboard.event_live").fetchone()[0]
        lst = listener(db, LIVE, channel)
        try:
            admin.execute("SELECT switchboard.notify_user(%s, 'off', '{}')", (uid,))
            assert notifications(lst, 0.3) == [], "the live path sends nothing while off"
            row = admin.execute("SELECT * FROM switchboard.event_live_path(true, 600)").fetchone()
            assert row[0] is True and row[1] == 600
            key, named = _key(admin)
            assert key is not None and len(key) == 32
            assert named == channel == _channel_of(key)
            with psycopg.connect(db) as pub:
                a = pub.execute("SELECT switchboard.notify_user(%s, 'chat.msg', %s)",
                                (uid, json.dumps({"text": "héllo \"quoted\"", "n": [1, {"x": None}]}))).fetchone()[0]
                b = pub.execute("SELECT switchboard.notify_room('lobby', 'room.msg', '{}')").fetchone()[0]
                big = pub.execute("SELECT switchboard.notify_user(%s, 'big', %s)",
                                  (uid, json.dumps({"blob": "x" * 700}))).fetchone()[0]
                pub.execute("SAVEPOINT s")
                pub.execute("SELECT switchboard.notify_user(%s, 'undone', '{}')", (uid,))
                pub.execute("ROLLBACK TO SAVEPOINT s")
                assert notifications(lst, 0.2) == [], "sent before COMMIT"
                ts = pub.execute("SELECT (extract(epoch FROM created_at) * 1000)::bigint FROM switchboard.events "
                                 "WHERE id = %s", (a,)).fetchone()[0]
            got = notifications(lst, 3.0, stop_after=3)
            assert [n.channel for n in got] == [channel] * 3, "sent on the old public channel"
            first, second = (_verify(key, n.payload) for n in got[:2])
            assert first == {"id": a, "u": uid, "r": None, "e": "chat.msg", "t": ts,
                             "p": {"text": "héllo \"quoted\"", "n": [1, {"x": None}]}}
            assert second["id"] == b and second["u"] is None and second["r"] == "lobby"
            # Over max_bytes: a bare barrier, never a truncated or unsigned event.
            assert json.loads(got[2].payload) == {"b": big}
            assert notifications(lst, 0.3) == [], "a rolled-back subtransaction's event went out"
        finally:
            lst.close()


def test_id_hints_stop_only_while_the_live_path_carries_the_event(db: str) -> None:
    """send_id_hints => false drops the {"id"} hint on switchboard_events while the path
    is on (the live message wakes this release's relays); with the path off the hint is
    the only wake-up and is sent whatever the setting."""
    with psycopg.connect(db, autocommit=True) as admin:
        uid = _user(admin, "hal")
        channel = admin.execute("SELECT channel FROM switchboard.event_live").fetchone()[0]
        lst = listener(db, "switchboard_events", channel)
        live_hint = ("switchboard_events", {"live": 1})   # every event_live_path() call: relays re-read the key
        try:
            admin.execute("SELECT switchboard.event_live_path(true)")
            a = admin.execute("SELECT switchboard.notify_user(%s, 'a', '{}')", (uid,)).fetchone()[0]
            got = notifications(lst, 3.0, stop_after=3)
            assert (got[0].channel, json.loads(got[0].payload)) == live_hint
            assert sorted(n.channel for n in got[1:]) == sorted(["switchboard_events", channel])
            assert [json.loads(n.payload) for n in got[1:] if n.channel == "switchboard_events"] == [{"id": a}]
            row = admin.execute("SELECT id_hints FROM switchboard.event_live_path(true, send_id_hints => false)"
                                ).fetchone()
            assert row == (False,)
            admin.execute("SELECT switchboard.notify_user(%s, 'b', '{}')", (uid,))
            got = notifications(lst, 1.0)
            assert [(n.channel, n.channel == channel or json.loads(n.payload)) for n in got] == [
                live_hint, (channel, True)], got
            admin.execute("SELECT switchboard.event_live_path(false)")
            c = admin.execute("SELECT switchboard.notify_user(%s, 'c', '{}')", (uid,)).fetchone()[0]
            got = notifications(lst, 3.0, stop_after=2)
            assert [(n.channel, json.loads(n.payload)) for n in got] == [live_hint, ("switchboard_events", {"id": c})]
        finally:
            lst.close()


def test_a_rotated_key_signs_from_the_next_publish_and_off_stops_everything(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        uid = _user(admin, "bob")
        admin.execute("SELECT switchboard.event_live_path(true)")
        old, old_channel = _key(admin)
        created = admin.execute("SELECT key_created_at FROM switchboard.event_live_path(true, rotate_key => true)"
                                ).fetchone()[0]
        new, new_channel = _key(admin)
        assert old is not None and new is not None and new != old and created is not None
        # The channel moves with the key: a leaked name goes stale at the next rotation.
        assert new_channel == _channel_of(new) != old_channel == _channel_of(old)
        lst = listener(db, LIVE, old_channel, new_channel)
        try:
            admin.execute("SELECT switchboard.notify_user(%s, 'e', '{}')", (uid,))
            (n,) = notifications(lst, 3.0, stop_after=1)
            assert n.channel == new_channel
            _verify(new, n.payload)
            with pytest.raises(AssertionError):
                _verify(old, n.payload)
            admin.execute("SELECT switchboard.event_live_path(false)")
            assert _key(admin) == (None, None)
            admin.execute("SELECT switchboard.notify_user(%s, 'e', '{}')", (uid,))
            assert notifications(lst, 0.3) == []
        finally:
            lst.close()


def test_bad_arguments_and_privileges(db: str, app_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as admin:
        for args, state, word in ((("NULL",), "22004", "enable"), (("true", "8000"), "22023", "8000"),
                                  (("true", "-1"), "22023", "-1"), (("true", "NULL", "NULL"), "22004", "rotate_key")):
            with pytest.raises(psycopg.Error) as exc:
                admin.execute(f"SELECT switchboard.event_live_path({', '.join(args)})")
            assert exc.value.sqlstate == state and word in str(exc.value)
            assert state != "22023" or exc.value.diag.message_hint
        # Enabling by hand without the pads is refused by the table itself.
        with pytest.raises(psycopg.errors.CheckViolation):
            admin.execute("UPDATE switchboard.event_live SET enabled = true, ipad = '', opad = ''")
        admin.execute("SELECT switchboard.event_live_path(true)")
        admin.execute("CREATE ROLE stranger LOGIN PASSWORD 'x'")
    # The application role reads the key (its relays verify with it) but cannot switch the
    # path or read the table; any other role can do neither.
    with psycopg.connect(app_url, autocommit=True) as app:
        key, channel = _key(app)
        assert key is not None and len(key) == 32 and channel == _channel_of(key)
        for q in ("SELECT switchboard.event_live_path(false)", "SELECT key FROM switchboard.event_live",
                  "SELECT channel FROM switchboard.event_live"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(q)
        # The relay LISTENs through relay_live_listen (the name stays out of the query text);
        # it takes live channel names only.
        app.execute("SELECT switchboard.relay_live_listen(%s)", (channel,))
        assert app.execute("SELECT pg_listening_channels()").fetchall() == [(channel,)]
        app.execute("SELECT switchboard.relay_live_listen(%s, false)", (channel,))
        assert app.execute("SELECT pg_listening_channels()").fetchall() == []
        for bad, state in (("switchboard_events", "22023"), ("switchboard_live", "22023"),
                           (channel.upper(), "22023"), (channel + "0", "22023"), (None, "22023")):
            with pytest.raises(psycopg.Error) as exc:
                app.execute("SELECT switchboard.relay_live_listen(%s)", (bad,))
            assert exc.value.sqlstate == state and exc.value.diag.message_hint, bad
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            app.execute("SELECT switchboard.relay_live_listen(%s, NULL)", (channel,))
    stranger = psycopg.conninfo.make_conninfo(db, user="stranger", password="x")
    with psycopg.connect(stranger, autocommit=True) as s:
        for q in ("SELECT switchboard.relay_live_key()", "SELECT key FROM switchboard.event_live",
                  "SELECT channel FROM switchboard.event_live", "SELECT switchboard.relay_live_listen('x')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                s.execute(q)
