"""The resume cursor: a position in the event stream, as an opaque string.

The delivery order is (tick, id): batch after batch (a batch is what one tick
made visible, db/functions/50_events.sql), by event id inside a batch. A
position (tick, id) means "everything up to and including event ``id`` of
batch ``tick``"; (tick, END) means "all of batch ``tick``". Clients treat the
string as opaque (at most 256 characters of [A-Za-z0-9._~-]).

``v2.`` (the verified live path, V0020) adds the ids of events a socket was
sent ahead of its position: a relay delivers a signed event before it has read
it, so the event's own position is not known yet. ``v2.<tick>.<id|e>.<b36>...``
means "everything up to (tick, id), plus these events": a resume replays the
events after the position except those. The ids are base 36; at most 256
characters in all (the encoder refuses to grow past it, and the relay then
delivers by reading instead).
"""

from __future__ import annotations

import re

from .bounded import BIGINT_MAX, BadInput

END = BIGINT_MAX                 # "the whole batch"
START: tuple[int, int] = (0, 0)  # nothing seen: everything retained
Position = tuple[int, int]

MAX_LEN = 256
_CURSOR_RE = re.compile(r"v1\.([0-9]{1,19})(?:\.([0-9]{1,19}))?")
_CURSOR_V2_RE = re.compile(r"v2\.([0-9]{1,19})\.([0-9]{1,19}|e)((?:\.[0-9a-z]{1,13}){1,64})")
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _b36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _B36[r] + out
        if n == 0:
            return out


def encode(pos: Position, ahead: list[int] | tuple[int, ...] = ()) -> str:
    """``pos`` as a cursor; ``ahead``: ids sent live beyond it (v2), in the order sent."""
    tick, eid = pos
    if not ahead:
        return f"v1.{tick}" if eid == END else f"v1.{tick}.{eid}"
    return f"v2.{tick}.{'e' if eid == END else eid}." + ".".join(_b36(i) for i in ahead)


def decode_ahead(text: object) -> tuple[Position, tuple[int, ...]]:
    """The position a client sent back and the ids it holds beyond it (empty for v1);
    BadInput("bad_cursor") for anything we never issued."""
    if not isinstance(text, str) or len(text) > MAX_LEN:
        raise BadInput("bad_cursor", "cursor must be a string from an event frame")
    ahead: tuple[int, ...] = ()
    m = _CURSOR_RE.fullmatch(text)
    if m is not None:
        tick = int(m.group(1))
        eid = END if m.group(2) is None else int(m.group(2))
    else:
        m = _CURSOR_V2_RE.fullmatch(text)
        if m is None:
            raise BadInput("bad_cursor", "cursor must be a string from an event frame")
        tick = int(m.group(1))
        eid = END if m.group(2) == "e" else int(m.group(2))
        ahead = tuple(int(x, 36) for x in m.group(3)[1:].split("."))
        if any(not 0 < i <= BIGINT_MAX for i in ahead):
            raise BadInput("bad_cursor", "cursor out of range")
    if tick > BIGINT_MAX or eid > BIGINT_MAX:
        raise BadInput("bad_cursor", "cursor out of range")
    return (tick, eid), ahead


def decode(text: object) -> Position:
    """The position alone (decode_ahead without the ids sent ahead)."""
    return decode_ahead(text)[0]


def is_gap(pos: Position, first_tick: int) -> bool:
    """True when events after ``pos`` may have been reaped: ``first_tick`` (event_window())
    is the oldest retained tick, whose own batch is gone. Nothing reaped yet: never."""
    if first_tick <= 0:
        return False
    tick, eid = pos
    return tick < first_tick or (tick == first_tick and eid != END)
