"""Unit tier: the live path's merge of live frames and reads, against a model.

Driven through the public methods of the relay's parts only: the Dispatcher hears
(as the LISTEN loop would call it), the EventStream reads, and the LiveMerge is told
what each read covered -- exactly the composition relay/core.py wires.

A scripted database plays PostgreSQL: transactions take ids when they insert and
become visible when they commit; a read ticks (a batch = what committed since the
previous tick) and returns the rows after the relay's position in (tick, id) order.
Every commit also sends its live message to the relay, in commit order, like
NOTIFY (heard at once or later). A random schedule interleaves inserts, commits,
reads, joins of a second socket, events too large to go live (barriers), bursts
without reads that fill a socket's cursor (refusals, held frames), late hearing,
commits heard while a read's rows are on the way (after its snapshot), and key
rotations (V0025: each key has its own channel; a message is heard only on a
channel the relay LISTENs on when the message is delivered; a publisher signs
with the key of its own snapshot, so messages under an older key arrive after
the rotation's hint -- on a channel the relay no longer LISTENs on, or never did
when two rotations came between two of its key reads: lost, as PostgreSQL loses a
message on a channel the session does not LISTEN on when it is delivered;
messages sent on the new channel before the relay LISTENs on it are either lost
or delivered late, as PostgreSQL may do). A transaction's xid is its start, so
the relay's settling (relay/channel.py) asks the model's snapshots.
Checked per socket, at the end:
every event it should get, exactly once; nothing that committed before another
event's transaction began arrives after it; and its final cursor covers every
event it has (a resume from it repeats nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import hmac
import json
import time
import uuid
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from switchboard import cursor
from switchboard import bounded
from switchboard.metrics import Metrics
from switchboard.relay.dispatch import Dispatcher
from switchboard.relay.live import LiveMerge
from switchboard.relay.reads import Page
from switchboard.relay.stream import EventStream
from switchboard.sockets import Client, Registry

KEY = bytes(range(32))
CHANNEL = "switchboard_live_" + "0" * 32
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
        self.pending: list[tuple[str, str]] = []   # (channel, message) sent, not yet heard (NOTIFY lag)
        self.keys: list[tuple[str, bytes]] = [(CHANNEL, KEY)]   # every key so far, the current last
        self.listening = {CHANNEL}            # the relay's live channels (LISTEN)
        self.drop_early = False               # a LISTEN loses what was sent on its channel before it
        self.during_read = 0                  # commits (heard at once) after the next read's tick
        self.parts: Parts | None = None
        self.reaped_tick = 0                  # ticks at or below were reaped (event_window().first_tick)
        self.reaped_through = 0
        self.committed: list[dict[str, Any]] = []

    def all_committed(self) -> list[dict[str, Any]]:
        return self.committed

    def insert(self, to_room: bool, big: bool) -> None:
        self.clock += 1
        self.open.append({"id": self.next_id, "room": ROOM if to_room else None,
                          "user_id": None if to_room else ALICE, "big": big, "start": self.clock,
                          "key": len(self.keys) - 1})     # the key of the publisher's snapshot
        self.next_id += 1

    def commit(self, k: int) -> None:
        if not self.open:
            return
        e = self.open.pop(k % len(self.open))
        self.clock += 1
        e["commit"] = self.clock
        self.unticked.append(e)
        self.committed.append(e)
        self.pending.append((self.keys[e["key"]][0], self.message(e)))

    def hear(self, n: int) -> None:
        """The LISTEN connection delivers the next n messages, in commit order: a read may
        have seen their events already (the relay must then skip them). A message on a
        channel the relay does not LISTEN on (any more) is not delivered."""
        assert self.parts is not None
        for ch, m in self.pending[:n]:
            if ch == "switchboard_events" or ch in self.listening:
                self.parts.dispatch(ch, m)
        del self.pending[:n]

    def rotate(self, drop_early: bool) -> None:
        """event_live_path(true, rotate_key => true): a new key and channel, and its hint."""
        n = len(self.keys)
        self.keys.append(("switchboard_live_%032x" % n, hashlib.sha256(bytes([n])).digest()))
        self.pending.append(("switchboard_events", '{"live":1}'))
        self.drop_early = drop_early

    def xmax(self) -> int:
        """pg_snapshot_xmax() of a snapshot taken now: a transaction that begins later
        has a higher xid (its start)."""
        return self.clock + 1

    def xmin(self) -> int:
        """pg_snapshot_xmin() of a snapshot taken now: the oldest transaction still open."""
        return min((e["start"] for e in self.open), default=self.clock + 1)

    def listen(self, channel: str) -> None:
        self.listening.add(channel)
        if self.drop_early:
            self.pending = [(c, m) for c, m in self.pending if c != channel]

    def unlisten(self, channel: str) -> None:
        self.listening.discard(channel)

    def reap(self) -> None:
        """reap_events(): every tick so far goes, with its events."""
        if self.tick > self.reaped_tick:
            gone = [e for e in self.ticked if e["tick"] <= self.tick]
            self.reaped_through = max([self.reaped_through] + [e["id"] for e in gone])
            self.ticked = [e for e in self.ticked if e["tick"] > self.tick]
            self.reaped_tick = self.tick

    def message(self, e: dict[str, Any]) -> str:
        e["signer"] = self.keys[e["key"]][1]
        if e["big"]:
            return '{"b":%d}' % e["id"]
        body = json.dumps({"id": e["id"], "u": None if e["user_id"] is None else str(e["user_id"]),
                           "r": e["room"], "e": "x", "t": int(time.time() * 1000) + 60_000,
                           "p": {"id": e["id"]}}, separators=(",", ":"))
        return hmac.new(e["signer"], body.encode(), hashlib.sha256).hexdigest() + body

    def _row(self, e: dict[str, Any]) -> dict[str, Any]:
        return {"tick": e["tick"], "id": e["id"], "ephemeral": False, "user_id": e["user_id"],
                "room": e["room"], "event": "x", "sender": None, "payload": json.dumps({"id": e["id"]}),
                "ts": int(time.time() * 1000) + 60_000}

    def tick_now(self) -> None:
        """event_tick(): what committed since the last tick becomes the next batch."""
        if self.unticked:
            self.tick += 1
            for e in sorted(self.unticked, key=lambda e: e["id"]):
                e["tick"] = self.tick
                self.ticked.append(e)
            self.unticked = []

    async def tick_read(self, conn: Any, after: tuple[int, int], eph: list[int], max_rows: int) -> Page:
        self.tick_now()
        page = await self.read(conn, after, eph, max_rows)
        # Transactions that commit after this read's snapshot, heard while its rows are
        # still on the way: the read confirms older ids and frees cursor room, but these
        # are not in it.
        for _ in range(self.during_read):
            self.insert(False, False)
            self.commit(len(self.open) - 1)
        self.during_read = 0
        self.hear(len(self.pending))
        return page._replace(tick=self.tick)

    async def read(self, conn: Any, after: tuple[int, int], eph: list[int], max_rows: int) -> Page:
        rows = [self._row(e) for e in self.ticked if (e["tick"], e["id"]) > after][:max_rows]
        return Page(0, self.reaped_tick, self.reaped_through, rows)


class Parts:
    """The relay's parts as relay/core.py wires them, minus the connections."""

    def __init__(self, world: World, registry: Registry) -> None:
        self.live = LiveMerge()
        registry.place, registry.forget = self.live.place, self.live.forget
        metrics = Metrics()
        self.stream = EventStream(world, registry, self.live, metrics,
                                  bounded.Rejections(None, logging.getLogger("test")),
                                  on_behind=lambda c: None)
        self.stream.start_at((0, 0))
        self.dispatch = Dispatcher(self.live, self.stream, registry, metrics, "r1", on_run_wake=lambda: None)
        self.live.reconnected(KEY, CHANNEL, 0, world.xmax())
        self.world = world
        world.parts = self

    def rekey(self) -> None:
        """relay/channel.py's LiveChannel.rekey: the key and xmax of one snapshot; LISTEN
        on the new key's channel first, then the barrier; UNLISTEN what the merge let go."""
        channel, key = self.world.keys[-1]
        xmax = self.world.xmax()
        if channel == self.live.channel:
            return
        self.world.listen(channel)
        old = self.live.rotated(key, channel, xmax)
        if old is not None:
            self.world.unlisten(old)

    async def read(self) -> None:
        """relay/core.py's _read: the key if hinted, the settling check, the read."""
        if self.dispatch.take().window:
            self.rekey()
        if self.live.settling is not None:
            self.live.settle(self.world.xmin())
        res = await self.stream.read(None, True, [], True, self._between)
        if res.covers >= 0:
            self.live.read_covers(res.covers)

    @staticmethod
    async def _between() -> None:
        return None


OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.booleans(), st.integers(0, 19)),   # (to the room?, 1 in 20 too big)
    st.tuples(st.just("commit"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("read"), st.just(False), st.just(0)),
    st.tuples(st.just("burst"), st.integers(20, 150), st.just(0)),      # many commits, no read
    st.tuples(st.just("hear"), st.integers(1, 200), st.just(0)),        # NOTIFY delivery lags
    st.tuples(st.just("racing"), st.integers(1, 80), st.just(0)),       # commits during the next read
    st.tuples(st.just("join"), st.just(False), st.just(0)),             # the second socket joins the room
    st.tuples(st.just("rotate"), st.booleans(), st.just(0)),            # a new key (early messages lost?)
), min_size=5, max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
# Two rotations between two key reads of the relay: a transaction signs with the key in
# between, which the relay never knew, and commits after the read that covered the
# rotation's barrier (regression: "1 committed before 2 began but arrived after it").
@example(ops=[('rotate', False, 0), ('insert', False, 0), ('burst', 20, 0), ('rotate', False, 0),
              ('read', False, 0), ('racing', 1, 0)])
@example(ops=[('rotate', False, 0), ('insert', False, 1), ('rotate', False, 0), ('hear', 5, 0),
              ('read', False, 0), ('commit', 0, 0), ('burst', 20, 0), ('read', False, 0)])
# A second rotation while a transaction still holds the first rotation's previous key.
@example(ops=[('insert', False, 1), ('rotate', False, 0), ('hear', 5, 0), ('read', False, 0),
              ('rotate', False, 0), ('hear', 5, 0), ('read', False, 0), ('commit', 0, 0),
              ('burst', 20, 0), ('read', False, 0)])
# Two rotations in a row with bursts around them (the example first reported).
@example(ops=[('burst', 20, 0), ('join', False, 0), ('rotate', False, 0), ('rotate', False, 0),
              ('insert', True, 8), ('insert', True, 8), ('burst', 20, 0), ('commit', 415, 0),
              ('burst', 49, 0), ('burst', 21, 0)])
def test_live_frames_and_reads_merge_exactly_once_in_commit_order(ops: list[tuple[str, Any, int]]) -> None:
    async def run() -> tuple[World, list[Client], dict[Client, int]]:
        world = World()
        registry = Registry()
        parts = Parts(world, registry)
        a = Client(ALICE, "alice", "member", 100000, (0, 0), lambda c: None)
        registry.add(a)
        registry.join(a, ROOM)
        b = Client(uuid.UUID(int=2), "bob", "member", 100000, (0, 0), lambda c: None)
        registry.add(b)
        joined_at: dict[Client, int] = {a: 0}

        read = parts.read

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
            elif op == "rotate":
                world.rotate(bool(x))
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


# -- a state machine with reaping, gaps, closing sockets and time ------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class MergeMachine(RuleBasedStateMachine):
    """Random schedules that also reap events before the relay reads them (the relay
    held behind retention), close a socket, and let time pass. Whatever happens, per
    socket: nothing twice, and every event it should get either arrives or is covered
    by a resume_gap frame (never skipped silently); the live path's bookkeeping returns
    to nothing once its causes are gone, and a closed socket is held by nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.registry = Registry()
        self.clock = Clock()
        self.parts = Parts(self.world, self.registry)
        self.parts.live = live = LiveMerge(clock=self.clock)
        self.registry.place, self.registry.forget = live.place, live.forget
        self.parts.stream.live = self.parts.dispatch.live = live
        live.reconnected(KEY, CHANNEL, 0, self.world.xmax())
        self.a = Client(ALICE, "alice", "member", 100000, (0, 0), lambda c: None)
        self.b = Client(uuid.UUID(int=2), "bob", "member", 100000, (0, 0), lambda c: None)
        self.registry.add(self.a)
        self.registry.join(self.a, ROOM)
        self.registry.add(self.b)
        self.registry.join(self.b, ROOM)
        self.closed: set[Client] = set()

    def _read(self) -> None:
        asyncio.run(self.parts.read())

    @rule(to_room=st.booleans(), big=st.integers(0, 19))
    def insert(self, to_room: bool, big: int) -> None:
        self.world.insert(to_room, big == 0)

    @rule(k=st.integers(0, 10**6))
    def commit(self, k: int) -> None:
        self.world.commit(k)

    @rule(n=st.integers(1, 100))
    def hear(self, n: int) -> None:
        self.world.hear(n)

    @rule(n=st.integers(1, 120))
    def burst(self, n: int) -> None:
        for _ in range(n):
            self.world.insert(False, False)
            self.world.commit(len(self.world.open) - 1)
        self.world.hear(len(self.world.pending))

    @rule()
    def read(self) -> None:
        self._read()

    @rule(drop_early=st.booleans())
    def rotate(self, drop_early: bool) -> None:
        self.world.rotate(drop_early)

    @rule()
    def tick_and_reap(self) -> None:
        """A tick lands (another replica ticked), then reap_events() takes it before this
        relay read it: the relay is behind retention."""
        self.world.tick_now()
        self.world.reap()

    @rule()
    def close_bob(self) -> None:
        if self.b not in self.closed:
            self.registry.remove(self.b)
            self.closed.add(self.b)

    @rule(s=st.floats(0, 40))
    def time_passes(self, s: float) -> None:
        self.clock.t += s

    @invariant()
    def one_live_channel(self) -> None:
        assert self.world.listening == {self.parts.live.channel}, self.world.listening

    @invariant()
    def bounded_and_nothing_held_for_the_closed(self) -> None:
        live = self.parts.live
        assert live.unconfirmed() <= live.UNCONFIRMED_MAX
        for c in self.closed:
            assert not c.live.hold
            assert all(c not in clients for _, clients in live._unconfirmed.values()), "closed socket kept"

    def teardown(self) -> None:
        w = self.world
        while w.open:
            w.commit(0)
        w.hear(len(w.pending))
        for _ in range(3):
            self._read()
        self.clock.t += LiveMerge.UNCONFIRMED_TTL + 1
        self._read()
        live = self.parts.live
        assert live.unconfirmed() == 0 and live.holding() == 0, "live bookkeeping outlived its cause"
        for c in (self.a, self.b):
            frames = []
            while not c.queue.empty():
                frames.append(json.loads(c.queue.get_nowait()))  # type: ignore[arg-type]
            got = [f["id"] for f in frames if f["event"] == "x"]
            assert len(got) == len(set(got)), f"duplicates: {got}"
            if c in self.closed:
                continue
            gaps = [cursor.decode(f["cursor"]) for f in frames if f["event"] == "resume_gap"]
            for e in w.all_committed():
                if e["id"] in got or not (e["user_id"] == c.user_id or e["room"] == ROOM):
                    continue
                pos = (e["tick"], e["id"])
                assert any(pos <= g for g in gaps), f"event {e['id']} at {pos} skipped silently; gaps {gaps}"
            # the cursor names nothing that can no longer be confirmed
            _, ahead = cursor.decode_ahead(c.cursor())
            assert not ahead, f"ids left in the cursor: {ahead}"


TestMergeMachine = MergeMachine.TestCase
TestMergeMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
