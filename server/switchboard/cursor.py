"""The resume cursor: a position in the event stream, as an opaque string.

The delivery order is (tick, id): batch after batch (a batch is what one tick
made visible, db/functions/50_events.sql), by event id inside a batch. A
position (tick, id) means "everything up to and including event ``id`` of
batch ``tick``"; (tick, END) means "all of batch ``tick``". Clients treat the
string as opaque (at most 256 characters of [A-Za-z0-9._~-]); the ``v1.``
prefix leaves room for another encoding later.
"""

from __future__ import annotations

import re

from .bounded import BIGINT_MAX, BadInput

END = BIGINT_MAX                 # "the whole batch"
START: tuple[int, int] = (0, 0)  # nothing seen: everything retained
Position = tuple[int, int]

_CURSOR_RE = re.compile(r"v1\.([0-9]{1,19})(?:\.([0-9]{1,19}))?")


def encode(pos: Position) -> str:
    tick, eid = pos
    return f"v1.{tick}" if eid == END else f"v1.{tick}.{eid}"


def decode(text: object) -> Position:
    """The position a client sent back; BadInput("bad_cursor") for anything we never issued."""
    if not isinstance(text, str) or len(text) > 256:
        raise BadInput("bad_cursor", "cursor must be a string from an event frame")
    m = _CURSOR_RE.fullmatch(text)
    if m is None:
        raise BadInput("bad_cursor", "cursor must be a string from an event frame")
    tick = int(m.group(1))
    eid = END if m.group(2) is None else int(m.group(2))
    if tick > BIGINT_MAX or eid > BIGINT_MAX:
        raise BadInput("bad_cursor", "cursor out of range")
    return tick, eid


def is_gap(pos: Position, first_tick: int) -> bool:
    """True when events after ``pos`` may have been reaped: ``first_tick`` (event_window())
    is the oldest retained tick, whose own batch is gone. Nothing reaped yet: never."""
    if first_tick <= 0:
        return False
    tick, eid = pos
    return tick < first_tick or (tick == first_tick and eid != END)
