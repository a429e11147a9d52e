"""Unit tier: the live path's merge of live frames and reads, against a model.

A scripted database plays PostgreSQL: transactions take ids when they insert and
become visible when they commit; a read ticks (a batch = what committed since the
previous tick) and returns the rows after the relay's position in (tick, id) order.
Every commit also sends its live message to the relay, in commit order, like
NOTIFY (heard at once or later). A random schedule interleaves inserts, commits,
reads, joins of a second socket, events too large to go live (barriers), bursts
without reads that fill a socket's cursor (refusals, held frames), late hearing,
and commits heard while a read's rows are on the way (after its snapshot).
Checked per socket, at the end:
every event it should get, exactly once; nothing that committed before another
event's transaction began arrives after it; and its final cursor covers every
event it has (a resume from it repeats nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard import cursor
from switchboard.auth import AuthState
from switchboard.config import Config
from switchboard.metrics import Metrics
from switchboard.relay import Relay
from switchboard.sockets import Client, Registry

KEY = bytes(range(32))
ALICE = uuid.UUID(int=1)
ROOM = "lobby"


class World:
    """Transactions, ticks and the relay's reads, as PostgreSQL would answer them."""

    def __init__(self) -> None:
        self.next_id = 1
        self.clock = 0                       # logical time: inserts and commits
        self.open: list[dict[str, Any]] = []  # inserted, not committed
        self.unticked: list[dict[str, Any]] = []
        self.ticked: list[dict[str, Any]] = []   # with "tick", in (tick, id) order
        self.tick = 0
        self.pending: list[str] = []          # live messages sent, not yet heard (NOTIFY lag)
        self.during_read = 0                  # commits (heard at once) after the next read's tick
        self.relay: Relay | None = None

    def insert(self, to_room: bool, big: bool) -> None:
        self.clock += 1
        self.open.append({"id": self.next_id, "room": ROOM if to_room else None,
                          "user_id": None if to_room else ALICE, "big": big, "start": self.clock})
        self.next_id += 1

    def commit(self, k: int) -> None:
        if not self.open:
            return
        e = self.open.pop(k % len(self.open))
        self.clock += 1
        e["commit"] = self.clock
        self.unticked.append(e)
        self.pending.append(self.message(e))

    def hear(self, n: int) -> None:
        """The LISTEN connection delivers the next n messages, in commit order: a read may
        have seen their events already (the relay must then skip them)."""
        assert self.relay is not None
        for m in self.pending[:n]:
            self.relay._dispatch("switchboard_live", m)
        del self.pending[:n]

    @staticmethod
    def message(e: dict[str, Any]) -> str:
        if e["big"]:
            return '{"b":%d}' % e["id"]
        body = json.dumps({"id": e["id"], "u": None if e["user_id"] is None else str(e["user_id"]),
                           "r": e["room"], "e": "x", "t": int(time.time() * 1000) + 60_000,
                           "p": {"id": e["id"]}}, separators=(",", ":"))
        return hmac.new(KEY, body.encode(), hashlib.sha256).hexdigest() + body

    def _row(self, e: dict[str, Any]) -> dict[str, Any]:
        return {"tick": e["tick"], "id": e["id"], "ephemeral": False, "user_id": e["user_id"],
                "room": e["room"], "event": "x", "sender": None, "payload": json.dumps({"id": e["id"]}),
                "ts": int(time.time() * 1000) + 60_000}

    async def relay_tick_read(self, conn: Any, after: tuple[int, int], eph: list[int],
                              max_rows: int) -> tuple[int, list[dict[str, Any]]]:
        if self.unticked:
            self.tick += 1
            for e in sorted(self.unticked, key=lambda e: e["id"]):
                e["tick"] = self.tick
                self.ticked.append(e)
            self.unticked = []
        rows = await self.relay_read_v2(conn, after, eph, max_rows)
        # Transactions that commit after this read's snapshot, heard while its rows are
        # still on the way: the read confirms older ids and frees cursor room, but these
        # are not in it.
        for _ in range(self.during_read):
            self.insert(False, False)
            self.commit(len(self.open) - 1)
        self.during_read = 0
        self.hear(len(self.pending))
        return self.tick, rows

    async def relay_read_v2(self, conn: Any, after: tuple[int, int], eph: list[int],
                            max_rows: int) -> list[dict[str, Any]]:
        return [self._row(e) for e in self.ticked if (e["tick"], e["id"]) > after][:max_rows]

    async def relay_live_key(self, conn: Any) -> tuple[bytes, int]:
        return KEY, 0

    async def event_window_on(self, conn: Any) -> dict[str, Any]:
        return {"first_tick": 0, "last_tick": self.tick, "reaped_through": 0, "publishers_notify": True}


def _relay(world: World, registry: Registry) -> Relay:
    cfg = Config(database_url="postgresql://unused", jwt_secret="x" * 32)
    r = Relay(world, AuthState("x" * 32, 60), registry, Metrics(), cfg, "r1",  # type: ignore[arg-type]
              on_run_wake=lambda: None, on_tool_result=lambda _c: None)
    r._reader = object()  # type: ignore[assignment]
    r._cursor_set = True
    r._live_key = KEY
    world.relay = r
    return r


OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.booleans(), st.integers(0, 19)),   # (to the room?, 1 in 20 too big)
    st.tuples(st.just("commit"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("read"), st.just(False), st.just(0)),
    st.tuples(st.just("burst"), st.integers(20, 150), st.just(0)),      # many commits, no read
    st.tuples(st.just("hear"), st.integers(1, 200), st.just(0)),        # NOTIFY delivery lags
    st.tuples(st.just("racing"), st.integers(1, 80), st.just(0)),       # commits during the next read
    st.tuples(st.just("join"), st.just(False), st.just(0)),             # the second socket joins the room
), min_size=5, max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_live_frames_and_reads_merge_exactly_once_in_commit_order(ops: list[tuple[str, Any, int]]) -> None:
    async def run() -> tuple[World, list[Client], dict[Client, int]]:
        world = World()
        registry = Registry()
        relay = _relay(world, registry)
        a = Client(ALICE, "alice", "member", 100000, (0, 0), lambda c: None)
        registry.add(a)
        registry.join(a, ROOM)
        b = Client(uuid.UUID(int=2), "bob", "member", 100000, (0, 0), lambda c: None)
        registry.add(b)
        joined_at: dict[Client, int] = {a: 0}

        async def read() -> None:
            h, relay._hints = relay._hints, type(relay._hints)()
            h.tick = h.events = True
            await relay._read(h)

        for op, x, y in ops:
            if op == "insert":
                world.insert(bool(x), y == 0)
            elif op == "commit":
                world.commit(x)
            elif op == "read":
                await read()
            elif op == "burst":
                for _ in range(x):
                    world.insert(False, False)
                    world.commit(len(world.open) - 1)
                world.hear(len(world.pending))
            elif op == "hear":
                world.hear(x)
            elif op == "racing":
                world.during_read = x
            elif op == "join" and b not in joined_at:
                registry.join(b, ROOM)
                joined_at[b] = world.clock
        while world.open:
            world.commit(0)
        world.hear(len(world.pending))
        for _ in range(3):
            await read()
        return world, [a, b], joined_at

    world, clients, joined_at = asyncio.run(run())
    events = {e["id"]: e for e in world.ticked}
    for c in clients:
        frames = []
        while not c.queue.empty():
            frames.append(json.loads(c.queue.get_nowait()))
        got = [f["id"] for f in frames]
        assert len(got) == len(set(got)), f"duplicates: {got}"
        if c in joined_at:
            # Everything addressed to it that committed after it was in place arrives.
            want = {i for i, e in events.items()
                    if (e["user_id"] == c.user_id or e["room"] == ROOM) and e["commit"] > joined_at[c]}
            assert want <= set(got), f"lost: {sorted(want - set(got))}"
        for i in got:
            e = events[i]
            assert e["user_id"] == c.user_id or e["room"] == ROOM, f"not addressed to it: {i}"
        at = {i: k for k, i in enumerate(got)}
        for i in got:
            for j in got:
                if events[i]["commit"] < events[j]["start"]:
                    assert at[i] < at[j], f"{i} committed before {j} began but arrived after it"
        # The socket's own cursor resumes without repeating anything: every event it has is
        # at or before the cursor's position, or among the ids the cursor names ahead.
        pos, ahead = cursor.decode_ahead(c.cursor())
        assert set(ahead) <= set(got), (ahead, got)
        for i in got:
            e = events[i]
            assert (e["tick"], e["id"]) <= pos or i in ahead, f"{i} would be replayed from {c.cursor()}"
