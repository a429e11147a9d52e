"""Unit tier: the relay's read loop against a scripted reader (no database, no processes).

Two properties of the live path (issue 18, delivery latency):
- the frames a read offered are written by the sockets' senders BEFORE the next read
  is sent (under a steady rate the wake is already set when a read ends; sending the
  next query first made every frame wait a whole round trip);
- a row with no local socket moves the relay's position like any other row, and is
  never turned into a frame (its payload, read as text, is not even parsed).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from switchboard.auth import AuthState
from switchboard.config import Config
from switchboard.metrics import Metrics
from switchboard.relay import Relay
from switchboard.relay.reads import Page
from switchboard.sockets import Client, Registry

HERE = uuid.uuid4()     # a user with a socket on this replica
ELSEWHERE = uuid.uuid4()  # a user whose sockets are on other replicas


def _row(tick: int, eid: int, user: uuid.UUID, payload: str) -> dict[str, Any]:
    return {"tick": tick, "id": eid, "ephemeral": False, "user_id": user, "room": None, "event": "e",
            "sender": None, "payload": payload, "ts": int(time.time() * 1000)}


class ScriptedDB:
    """tick_read returns one scripted batch per call; at each call it records how
    many frames were still waiting in the local socket's send queue."""

    def __init__(self, batches: list[list[dict[str, Any]]], client: Client) -> None:
        self.batches = batches
        self.client = client
        self.waiting_at_read: list[int] = []
        self.positions: list[tuple[int, int]] = []
        self.done = asyncio.Event()
        self.relay: Relay | None = None

    async def tick_read(self, conn: Any, after: tuple[int, int], eph: list[int], max_rows: int) -> Page:
        self.waiting_at_read.append(self.client.queue.qsize())
        self.positions.append(after)
        if not self.batches:
            self.done.set()
            return Page(0, 0, 0, [])
        # A steady rate: another NOTIFY arrived during this round trip.
        assert self.relay is not None
        self.relay.dispatch.want_read()
        return Page(1, 0, 0, self.batches.pop(0))

    async def read(self, conn: Any, after: tuple[int, int], eph: list[int], max_rows: int) -> Page:
        return Page(0, 0, 0, [])


def _relay(db: ScriptedDB, registry: Registry) -> Relay:
    cfg = Config(database_url="postgresql://unused", jwt_secret="x" * 32, relay_read_gap=0.0)
    r = Relay(db, AuthState("x" * 32, 60), registry, Metrics(), cfg, "r1",  # type: ignore[arg-type]
              on_run_wake=lambda: None, on_tool_result=lambda _c: None, reads=db)
    r.listener.reader = object()  # type: ignore[assignment]  # only handed to the scripted db
    r.stream.start_at((0, 0))
    return r


def test_frames_are_written_before_the_next_read_and_foreign_rows_only_move_the_position() -> None:
    async def run() -> tuple[ScriptedDB, Relay, list[str]]:
        registry = Registry()
        client = Client(HERE, "here", "member", 100, (0, 0), on_overflow=lambda c: None)
        registry.add(client)
        written: list[str] = []

        async def sender() -> None:
            while True:
                written.append(await client.queue.get())  # type: ignore[arg-type]

        # Five reads, each with two rows for this replica's socket and, around them,
        # rows for a user with no socket here whose payload is not even JSON: parsing
        # it would raise, so the test also fails if a foreign row is framed.
        batches = [[_row(t, 10 * t + 1, ELSEWHERE, "not json"), _row(t, 10 * t + 2, HERE, json.dumps({"n": 2 * t})),
                    _row(t, 10 * t + 3, HERE, json.dumps({"n": 2 * t + 1})),
                    _row(t, 10 * t + 4, ELSEWHERE, "not json")] for t in range(1, 6)]
        db = ScriptedDB(batches, client)
        relay = _relay(db, registry)
        s = asyncio.create_task(sender())

        db.relay = relay
        relay.dispatch.want_read()
        reader = asyncio.create_task(relay._read_loop())
        await asyncio.wait_for(db.done.wait(), 5)
        reader.cancel()
        s.cancel()
        await asyncio.gather(reader, s, return_exceptions=True)
        return db, relay, written

    db, relay, written = asyncio.run(run())
    # every read after the first found the previous read's frames already taken by the sender
    assert db.waiting_at_read[1:] and all(n == 0 for n in db.waiting_at_read[1:]), db.waiting_at_read
    # this replica's socket got exactly its ten events, in order, with their cursors
    frames = [json.loads(t) for t in written]
    assert [f["payload"]["n"] for f in frames] == list(range(2, 12))
    assert [f["id"] for f in frames] == [10 * t + i for t in range(1, 6) for i in (2, 3)]
    # the position followed every row, the foreign ones included
    assert db.positions[1:6] == [(t, 10 * t + 4) for t in range(1, 6)]
    assert relay.position == (5, 54) and relay.last_seen_id == 54


def _outcome(channel: str, payload: str) -> object:
    from switchboard import hints
    from switchboard.bounded import BadInput

    try:
        return hints.parse(channel, payload)
    except BadInput as exc:
        return ("refused", exc.reason)


@given(st.sampled_from(["id", "eph", "tick", "ids", "Id"]),
       st.one_of(st.integers(-5, 2**64 + 5), st.sampled_from([0, 1, 2**63 - 1, 2**63, 10**19, 10**20])))
def test_the_events_hint_fast_path_answers_exactly_as_the_json_path(key: str, n: int) -> None:
    """hints.parse matches the exact payload publishers send ({"id":N}, no spaces) with a
    regex instead of bounded JSON; with a space the same value takes the JSON path. Both
    must give the same Notice or the same refusal, for every key and value."""
    fast = _outcome("switchboard_events", f'{{"{key}":{n}}}')
    slow = _outcome("switchboard_events", f'{{"{key}": {n}}}')
    assert fast == slow
    for odd in (f'{{"{key}":0{n}}}', f'{{"{key}":{n}}} ', f'{{"{key}":{n}.0}}', f'{{"{key}":"{n}"}}'):
        _outcome("switchboard_events", odd)  # never anything but a Notice or BadInput
