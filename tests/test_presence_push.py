"""Pushed presence (issue 34): presence.state and presence.diff frames, across real replicas.

Two `switchboard serve` processes on one database. A member watching a room on
replica A sees a member who connects on replica B join (with the metadata that
connection tracks) and leave when their last socket closes; a non-member gets
no presence frame; bad metadata is an error frame and the socket goes on. A
storm of 200 sockets connecting (and then closing) at once across both
replicas reaches an observer as a handful of diffs -- at most one per interval,
which the frames' own server timestamps bound -- and the list the observer
builds from them ends exactly right.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import httpx
import psycopg
import pytest
from websockets.sync.client import connect as ws_connect

from harness import WS, auth, hash_pw, make_user

INTERVAL = 0.3
ENV = {"SWITCHBOARD_PRESENCE_INTERVAL": str(INTERVAL)}


def member_of(srv: Any, admin: str, room: str, *users: str) -> None:
    for u in users:
        r = httpx.put(f"{srv.base}/rooms/{room}/members/{u}", headers=auth(admin), timeout=30)
        assert r.status_code == 204, r.text


def connect(srv: Any, db: str, uid: str, rooms: str = "") -> WS:
    """A socket of user ``uid`` with a ticket minted in SQL (no login, no rate limit)."""
    with psycopg.connect(db, autocommit=True) as c:
        ticket = c.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
    q = f"&rooms={rooms}" if rooms else ""
    return WS(ws_connect(f"{srv.ws_base}/ws?ticket={ticket}{q}", open_timeout=30))


def apply(members: dict[str, dict], f: dict) -> None:
    """What a client does with a presence frame (clients/js/src/presence.ts does the same)."""
    if f["event"] == "presence.state":
        members.clear()
        members.update({e["user_id"]: e for e in f["payload"]["members"]})
        return
    for e in f["payload"]["leaves"]:
        members.pop(e["user_id"], None)
    for e in f["payload"]["joins"]:
        members[e["user_id"]] = e


def presence_frames(frames: list[dict]) -> list[dict]:
    return [f for f in frames if f["event"].startswith("presence.")]


def test_presence_across_replicas_with_metadata(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    alice, bob, carol = (make_user(db, n) for n in ("alice", "bob", "carol"))
    a_srv = server_factory(name="presence-a", env=ENV)
    b_srv = server_factory(name="presence-b", env=ENV)
    admin = a_srv.login("admin")
    member_of(a_srv, admin, "lobby", alice, bob)

    # alice on A: tracks herself, and the state lists her with her metadata
    a = connect(a_srv, db, alice)
    assert a.join("lobby")["event"] == "joined"
    a.send({"action": "presence.track", "room": "lobby", "meta": {"status": "here", "n": 1}})
    st = a.recv_until(lambda f: f["event"] == "presence.state")
    assert st["room"] == "lobby" and st["id"] is None and st["payload"]["truncated"] is False
    assert st["payload"]["members"] == [{"user_id": alice, "username": "alice",
                                         "metas": [{"status": "here", "n": 1}]}]
    seen: dict[str, dict] = {}
    apply(seen, st)

    # carol is no member: her join and her presence actions are refused; no presence frame reaches her
    c = connect(a_srv, db, carol)
    assert c.join("lobby")["payload"]["code"] == "forbidden"
    c.send({"action": "presence.subscribe", "room": "lobby"})
    err = c.recv_until(lambda f: f["event"] == "error")
    assert (err["payload"]["code"], err["payload"]["action"]) == ("forbidden", "presence.subscribe")
    c.send({"action": "presence.track", "room": "lobby", "meta": {}})
    assert c.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "forbidden"

    # bob on B, two sockets; the first tracks "busy": alice (on A) sees him join with it
    b1 = connect(b_srv, db, bob, rooms="lobby")
    b2 = connect(b_srv, db, bob, rooms="lobby")
    b1.send({"action": "presence.track", "room": "lobby", "meta": {"status": "busy"}})
    f = a.recv_until(lambda f: f["event"] == "presence.diff" and any(
        e["user_id"] == bob and e["metas"] == [{"status": "busy"}] for e in f["payload"]["joins"]))
    assert f["room"] == "lobby" and f["payload"]["leaves"] == []
    apply(seen, f)
    assert seen[bob]["username"] == "bob"
    # b2 watches without tracking: its state lists both, with their metadata
    b2.send({"action": "presence.subscribe", "room": "lobby"})
    st_b = b2.recv_until(lambda f: f["event"] == "presence.state" and len(f["payload"]["members"]) == 2)
    assert {e["user_id"]: e["metas"] for e in st_b["payload"]["members"]} == \
        {alice: [{"status": "here", "n": 1}], bob: [{"status": "busy"}]}

    # bob's tracking socket closes: he stays online (b2), his metadata goes (a join with the new entry)
    b1.close()
    f = a.recv_until(lambda f: f["event"] == "presence.diff")
    assert f["payload"]["leaves"] == [] and f["payload"]["joins"] == [
        {"user_id": bob, "username": "bob", "metas": []}]
    apply(seen, f)
    # his last socket closes: he leaves
    b2.close()
    f = a.recv_until(lambda f: f["event"] == "presence.diff")
    assert f["payload"]["joins"] == [] and [e["user_id"] for e in f["payload"]["leaves"]] == [bob]
    apply(seen, f)
    assert set(seen) == {alice}

    # bad metadata: an error frame each, and the socket goes on
    for meta, why in (({"a": {"b": 1}}, "values"), ({f"k{i}": i for i in range(9)}, "keys"),
                      ({"s": "x" * 300}, "bytes"), ("away", "object"), ([1], "object"),
                      ({"": 1}, "characters")):
        a.send({"action": "presence.track", "room": "lobby", "meta": meta})
        err = a.recv_until(lambda f: f["event"] == "error")
        assert err["payload"]["code"] == "bad_meta" and why in err["payload"]["message"], err
    a.send({"action": "presence.track", "room": "nowhere", "meta": {}})
    assert a.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "forbidden"
    a.send({"action": "presence.track", "room": 5, "meta": {}})
    assert a.recv_until(lambda f: f["event"] == "error")["payload"]["code"] == "bad_room"
    a.send({"action": "ping"})
    a.recv_until(lambda f: f["event"] == "pong")
    # a new value is a diff with alice's new entry
    a.send({"action": "presence.track", "room": "lobby", "meta": {"status": "away"}})
    f = a.recv_until(lambda f: f["event"] == "presence.diff")
    assert f["payload"]["joins"] == [{"user_id": alice, "username": "alice", "metas": [{"status": "away"}]}]

    # leaving the room drops alice's metadata from the database at once
    a.send({"action": "leave", "room": "lobby"})
    a.recv_until(lambda f: f["event"] == "left")
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM switchboard.presence_meta").fetchone()[0] == 0
    assert presence_frames(c.drain(quiet=3 * INTERVAL)) == []
    a.close()
    c.close()


def test_a_storm_is_a_few_diffs_and_ends_right(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """200 sockets connect at once (100 on each replica), each tracking its number, then all
    close at once: the observer gets at most one diff per interval, and the list it keeps
    from the frames is exactly who is there."""
    n = 200
    observer = make_user(db, "observer")
    pw = hash_pw("pw-" + "s" * 12)
    with psycopg.connect(db, autocommit=True) as c:
        users = [str(r[0]) for r in c.execute(
            "SELECT switchboard.create_user('storm' || lpad(i::text, 3, '0'), %s, 'member') "
            "FROM generate_series(1, %s) AS i", (pw, n))]
        for u in [observer, *users]:
            c.execute("SELECT switchboard.add_room_member('storm', %s)", (u,))
    a_srv = server_factory(name="storm-a", env=ENV)
    b_srv = server_factory(name="storm-b", env=ENV)

    obs = connect(a_srv, db, observer, rooms="storm")
    obs.send({"action": "presence.subscribe", "room": "storm"})
    seen: dict[str, dict] = {}
    apply(seen, obs.recv_until(lambda f: f["event"] == "presence.state"))
    assert set(seen) == {observer}

    def one(i: int) -> WS:
        ws = connect(a_srv if i % 2 else b_srv, db, users[i], rooms="storm")
        ws.send({"action": "presence.track", "room": "storm", "meta": {"n": i}})
        return ws

    def settle(want: dict[str, list], phase: str) -> list[dict]:
        """Diffs until the list is ``want``; they are at most one per interval."""
        diffs = []
        deadline = time.time() + 120
        while {u: e["metas"] for u, e in seen.items()} != want:
            assert time.time() < deadline, f"{phase}: {len(seen)} members after {len(diffs)} diffs"
            f = obs.recv(timeout=deadline - time.time())
            if f["event"] == "presence.state":
                pytest.fail(f"a second state: {json.dumps(f)[:200]}")
            if f["event"] == "presence.diff":
                diffs.append(f)
                apply(seen, f)
        spread_ms = diffs[-1]["ts"] - diffs[0]["ts"]
        # The loop sleeps an interval between two queries: k diffs span at least (k - 1) intervals.
        assert len(diffs) <= spread_ms / (INTERVAL * 1000) + 1, (phase, len(diffs), spread_ms)
        assert len(diffs) < n // 4, (phase, len(diffs))
        return diffs

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        sockets = list(pool.map(one, range(n)))
    joined = settle({observer: [], **{u: [{"n": i}] for i, u in enumerate(users)}}, "storm")
    assert sum(len(f["payload"]["joins"]) for f in joined) >= n
    print(f"storm of {n} sockets: {len(joined)} diffs over "
          f"{joined[-1]['ts'] - joined[0]['ts']} ms")

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda ws: ws.close(), sockets))
    left = settle({observer: []}, "closing")
    assert sum(len(f["payload"]["leaves"]) for f in left) == n
    print(f"{n} sockets closing: {len(left)} diffs")
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.presence_meta").fetchone()[0] == 0
    obs.close()


def test_the_heartbeat_repairs_the_metadata_rows(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """presence_meta is UNLOGGED (a crash or a promotion empties it) and an untrack can fail: every
    heartbeat re-asserts the replica's rows from its memory -- lost rows come back, stray rows go."""
    make_user(db, "admin", role="admin")
    alice = make_user(db, "alice")
    srv = server_factory(name="presence-repair", env=ENV)
    member_of(srv, srv.login("admin"), "lobby", alice)
    a = connect(srv, db, alice, rooms="lobby")
    a.send({"action": "presence.track", "room": "lobby", "meta": {"status": "here"}})
    a.recv_until(lambda f: f["event"] == "presence.state")
    rid = a.hello["payload"]["replica"]

    def rows(c: psycopg.Connection) -> list[tuple]:
        return c.execute("SELECT room, user_id::text, meta FROM switchboard.presence_meta ORDER BY conn").fetchall()

    with psycopg.connect(db, autocommit=True) as c:
        assert rows(c) == [("lobby", alice, {"status": "here"})]
        c.execute("DELETE FROM switchboard.presence_meta")               # what an UNLOGGED reset does
        c.execute("INSERT INTO switchboard.presence_meta (replica_id, conn, room, user_id, meta) "
                  "VALUES (%s, 999999, 'lobby', %s, '{\"stale\": true}')", (rid, alice))   # a failed untrack
        deadline = time.time() + 30
        while rows(c) != [("lobby", alice, {"status": "here"})]:
            assert time.time() < deadline, rows(c)
            time.sleep(0.1)
    a.close()


def test_a_killed_replicas_members_leave_within_its_liveness_window(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL: no untrack, no presence_set(0), no replica_stop -- the replica's heartbeat stops, and
    once it is older than the replica's liveness window (30 s at least) its members are offline."""
    make_user(db, "admin", role="admin")
    alice, bob = make_user(db, "alice"), make_user(db, "bob")
    a_srv = server_factory(name="presence-live", env=ENV)
    b_srv = server_factory(name="presence-doomed", env=ENV)
    member_of(a_srv, a_srv.login("admin"), "lobby", alice, bob)
    a = connect(a_srv, db, alice, rooms="lobby")
    a.send({"action": "presence.subscribe", "room": "lobby"})
    b = connect(b_srv, db, bob, rooms="lobby")
    b.send({"action": "presence.track", "room": "lobby", "meta": {"on": "b"}})
    a.recv_until(lambda f: f["event"] in ("presence.state", "presence.diff") and any(
        e["user_id"] == bob and e["metas"] == [{"on": "b"}]
        for e in f["payload"].get("members", []) + f["payload"].get("joins", [])), timeout=30)
    b_srv.kill()
    killed = time.monotonic()
    f = a.recv_until(lambda f: f["event"] == "presence.diff" and f["payload"]["leaves"], timeout=120)
    assert [e["user_id"] for e in f["payload"]["leaves"]] == [bob] and f["payload"]["joins"] == []
    # not before the window: the replica was live until its last heartbeat, 30 s at least
    assert time.monotonic() - killed >= 25, "left before the replica's liveness window ran out"
