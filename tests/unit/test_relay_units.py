"""Unit tier: NOTIFY hint parsing, the resume cursor and a socket's de-duplication
(no database, no processes)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard import cursor, hints
from switchboard.bounded import BadInput
from switchboard.sockets import Client, frame

U = str(uuid.uuid4())


@pytest.mark.parametrize("channel, payload, kind", [
    ("switchboard_runs", "", "run"),
    ("switchboard_runs", "anything at all", "run"),
    ("switchboard_events", '{"id": 5}', "event"),
    ("switchboard_events", '{"eph": 5}', "eph"),
    ("switchboard_events", '{"tick": 5}', "tick"),
    ("switchboard_control", json.dumps({"kind": "user", "user_id": U}), "user"),
    ("switchboard_control", json.dumps({"kind": "revoke", "jti": "abc"}), "revoke"),
    ("switchboard_control", json.dumps({"kind": "member", "room": "r", "user_id": U}), "member"),
    ("switchboard_control", json.dumps({"kind": "tool_result", "call_id": U, "replica_id": "x"}), "tool_result"),
])
def test_every_payload_we_send_parses(channel: str, payload: str, kind: str) -> None:
    assert hints.parse(channel, payload).kind == kind


@pytest.mark.parametrize("channel, payload, reason", [
    ("switchboard_events", "[" * 3000 + "]" * 3000, "too_deep"),
    ("switchboard_events", '{"id": {"id": {"id": {"id": {"id": 1}}}}}', "too_deep"),
    ("switchboard_events", json.dumps({"id": 2**63}), "out_of_range"),
    ("switchboard_events", json.dumps({"id": 0}), "out_of_range"),
    ("switchboard_events", json.dumps({"id": "7"}), "bad_number"),
    ("switchboard_events", json.dumps({"id": True}), "bad_number"),
    ("switchboard_events", json.dumps({"id": 1, "user_id": U}), "bad_field"),
    ("switchboard_events", '{"id": NaN}', "malformed"),
    ("switchboard_events", "x" * 8001, "too_large"),
    ("switchboard_events", "[1]", "bad_type"),
    ("switchboard_control", json.dumps({"kind": "user", "user_id": 12}), "bad_type"),
    ("switchboard_control", json.dumps({"kind": "member", "room": "r" * 129, "user_id": U}), "bad_type"),
    ("switchboard_control", json.dumps({"kind": "nope"}), "unknown_kind"),
    ("somewhere_else", "{}", "unknown_channel"),
])
def test_hostile_payloads_are_bad_input_with_a_known_reason(channel: str, payload: str, reason: str) -> None:
    with pytest.raises(BadInput) as e:
        hints.parse(channel, payload)
    assert e.value.reason == reason and reason in hints.REJECT_REASONS


@given(st.text(max_size=300), st.sampled_from(hints.CHANNELS))
def test_parse_never_raises_anything_but_bad_input(payload: str, channel: str) -> None:
    try:
        hints.parse(channel, payload)
    except BadInput as exc:
        assert exc.reason in hints.REJECT_REASONS


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_cursor_round_trips_and_is_url_safe(tick: int, eid: int) -> None:
    text = cursor.encode((tick, eid))
    assert len(text) <= 256 and all(ch.isalnum() or ch in "._~-" for ch in text)
    assert cursor.decode(text) == (tick, eid)


@pytest.mark.parametrize("text", ["", "v1", "v1.", "v2.1.2", "v1.1.2.3", "v1.-1", "v1.²", "1.2",
                                  "v1.99999999999999999999", "v1.1." + "9" * 19, None, 7, "v1.1 "])
def test_a_cursor_we_never_issued_is_refused(text: object) -> None:
    with pytest.raises(BadInput) as e:
        cursor.decode(text)
    assert e.value.reason == "bad_cursor"


def test_gap_rule() -> None:
    end = cursor.END
    assert not cursor.is_gap((0, 0), 0)                 # nothing reaped: never a gap
    assert cursor.is_gap((0, 0), 5)
    assert cursor.is_gap((5, 17), 5)                    # mid-batch of the reaped boundary
    assert not cursor.is_gap((5, end), 5)               # all of it was seen
    assert not cursor.is_gap((6, 1), 5)


def test_a_socket_queues_each_position_once_and_in_order() -> None:
    async def run() -> list[str]:
        closed: list[int] = []
        c = Client(uuid.uuid4(), "u", "member", 10, (3, cursor.END), lambda cl: closed.append(1))
        for pos in [(3, 9), (4, 2), (4, 1), (4, 2), (5, 1)]:   # (3, 9) is before the start; (4, 1) late
            c.offer(frame("e", id=pos[1], cursor=cursor.encode(pos)), pos=pos)
        c.offer(frame("typing"))                               # no position: always queued
        assert not closed
        return [json.loads(c.queue.get_nowait())["cursor"] for _ in range(c.queue.qsize() - 1)]

    assert asyncio.run(run()) == ["v1.4.2", "v1.5.1"]


class _Window:
    """A stand-in for Database's two reads start_position() makes."""

    def __init__(self, first_tick: int, reaped_through: int, batches: dict[int, int]) -> None:
        self.win = {"first_tick": first_tick, "last_tick": first_tick + 5,
                    "reaped_through": reaped_through, "publishers_notify": True}
        self.batches = batches

    async def event_window(self) -> dict[str, object]:
        return self.win

    async def event_batch(self, event_id: int) -> int | None:
        return self.batches.get(event_id)


def test_a_bare_zero_after_empty_reaped_ticks_is_no_gap() -> None:
    """after=0 ("seen nothing") must not get resume_gap because the reaper dropped
    ticks that held no event (the faults suite's tabs reconnected forever on it)."""
    import asyncio

    from switchboard.cursor import END
    from switchboard.resume import start_position

    pos, gap = asyncio.run(start_position(_Window(7, 0, {}), 0))  # type: ignore[arg-type]
    assert (pos, gap) == ((7, END), False)
    pos, gap = asyncio.run(start_position(_Window(7, 42, {}), 0))  # type: ignore[arg-type]
    assert (pos, gap) == ((7, END), True)       # events were reaped: reload first
    pos, gap = asyncio.run(start_position(_Window(7, 0, {50: 9}), 50))  # type: ignore[arg-type]
    assert (pos, gap) == ((9, 50), False)
    pos, gap = asyncio.run(start_position(_Window(7, 0, {}), 50))  # type: ignore[arg-type]
    assert gap is True                          # an id not retained: reload


# -- the verified live path (V0020) ------------------------------------------------------
@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
       st.lists(st.integers(1, 2**63 - 1), min_size=1, max_size=12))
def test_a_v2_cursor_round_trips_with_the_ids_sent_ahead(tick: int, eid: int, ahead: list[int]) -> None:
    text = cursor.encode((tick, eid), ahead)
    assert text.startswith("v2.") and all(ch.isalnum() or ch in "._~-" for ch in text)
    if len(text) <= cursor.MAX_LEN:
        assert cursor.decode_ahead(text) == ((tick, eid), tuple(ahead))
        assert cursor.decode(text) == (tick, eid)


@pytest.mark.parametrize("text", ["v2.1.e", "v2.1.e.", "v2.1.2.0", "v2.1.2.-1", "v2.1.2.A", "v2..2.3",
                                  "v2.1.2.1y2p0ij32e8e8", "v2.1.2." + ".".join(["1"] * 65), "v2.1.2.3 "])
def test_a_v2_cursor_we_never_issued_is_refused(text: str) -> None:
    with pytest.raises(BadInput) as e:
        cursor.decode_ahead(text)
    assert e.value.reason == "bad_cursor"


def _signed(key: bytes, msg: str) -> str:
    import hashlib
    import hmac
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest() + msg


KEY = bytes(range(32))
USER = str(uuid.UUID(int=7))


def test_a_live_message_verifies_only_under_its_key() -> None:
    msg = json.dumps({"id": 5, "u": USER, "r": None, "e": "x", "t": 1, "p": {"a": [1]}}, separators=(",", ":"))
    ev = hints.parse_live(_signed(KEY, msg), KEY)
    assert ev is not None and (ev.id, ev.user_id, ev.room, ev.event, ev.ts, ev.payload) == \
        (5, uuid.UUID(USER), None, "x", 1, {"a": [1]})
    assert hints.parse_live('{"b":5}', KEY) is None              # a barrier
    for bad_key in (bytes(32), KEY[:-1] + b"\x00"):
        with pytest.raises(BadInput) as e:
            hints.parse_live(_signed(bad_key, msg), KEY)
        assert e.value.reason == "bad_mac"
    with pytest.raises(BadInput) as e:
        hints.parse_live(_signed(KEY, msg)[:-1] + "]", KEY)    # a byte changed after signing
    assert e.value.reason == "bad_mac"


@pytest.mark.parametrize("fields", [{"id": 5, "u": USER, "r": "room", "e": "x", "t": 1, "p": {}},   # both targets
                                    {"id": 5, "u": None, "r": None, "e": "x", "t": 1, "p": {}},     # neither
                                    {"id": "5", "u": USER, "r": None, "e": "x", "t": 1, "p": {}},
                                    {"id": 0, "u": USER, "r": None, "e": "x", "t": 1, "p": {}},
                                    {"id": 5, "u": "not-a-uuid", "r": None, "e": "x", "t": 1, "p": {}},
                                    {"id": 5, "u": 7, "r": None, "e": "x", "t": 1, "p": {}},
                                    {"id": 5, "u": USER, "r": None, "e": "x", "t": 1}])
def test_a_signed_message_with_unexpected_fields_is_refused(fields: dict) -> None:
    with pytest.raises(BadInput) as e:
        hints.parse_live(_signed(KEY, json.dumps(fields)), KEY)
    assert e.value.reason == "malformed"


@given(st.text(max_size=9000))
def test_any_live_payload_parses_or_is_refused_with_a_known_reason(payload: str) -> None:
    try:
        hints.parse_live(payload, KEY)
    except BadInput as exc:
        assert exc.reason in hints.REJECT_REASONS


def test_a_socket_carries_live_ids_in_its_cursor_until_the_read_places_them() -> None:
    async def run() -> list[str]:
        c = Client(uuid.uuid4(), "u", "member", 10, (3, cursor.END), lambda cl: None)
        text = json.dumps(frame("e", id=40), separators=(",", ":"))
        assert c.offer_live(40, text) == 1
        assert c.offer_live(40, text) == 0                       # once
        assert c.offer_live(41, json.dumps(frame("e", id=41), separators=(",", ":"))) == 1
        assert c.cursor() == cursor.encode((3, cursor.END), [40, 41])
        c.offer(frame("e", id=40, cursor="x"), pos=(4, 40))      # the read reaches 40: no frame
        assert c.cursor() == cursor.encode((4, 40), [41]) and c.queue.qsize() == 2
        c.offer(frame("e", id=39, cursor="x"), pos=(4, 45))      # an event not sent live
        c.confirm(41, (5, 41))
        assert c.cursor() == "v1.5.41"
        # The ids ahead may not grow the cursor past its bound: refused, nothing queued.
        big = 2**62
        n = 0
        while c.offer_live(big + n, text) == 1:
            n += 1
        assert 0 < n and len(c.cursor()) <= cursor.MAX_LEN
        return [json.loads(c.queue.get_nowait())["cursor"] for _ in range(3)]

    got = asyncio.run(run())
    assert got == ["v2.3.e.14", "v2.3.e.14.15", "v2.4.45.15"]
