"""NOTIFY payloads as the relay reads them: untrusted hints, parsed and bounded.

Any role that can connect may NOTIFY anything on any channel, so a payload is a
hint of *when* to read, never a fact (docs/explanation/security.md). ``parse`` turns one
notification into a typed ``Notice`` or raises ``BadInput`` with a reason from
a closed set (the relay counts it in switchboard_notify_rejected_total{reason}
and logs at most once a minute); the relay collects notices into ``Hints``
between two reads. Every bound is here: size, depth, types, bigint range.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from . import bounded
from .bounded import BadInput

CHANNELS = ("switchboard_events", "switchboard_control", "switchboard_runs")
# The verified live path (V0020): parse_live, not parse. Its channel is named after the
# key (V0025: LIVE_PREFIX and 32 hex digits, relay_live_key()) and is as secret as the
# key; LIVE_CHANNEL is the name it goes by in metrics and logs.
LIVE_CHANNEL = "switchboard_live"
LIVE_PREFIX = "switchboard_live_"


class Notice(NamedTuple):
    """One parsed notification. ``kind`` is one of: run, event, eph, tick, live, user,
    revoke, member, tool_result, session; the other fields are set as the kind needs.
    A NamedTuple, not a frozen dataclass: every replica builds one per notification,
    and a frozen dataclass's __init__ (object.__setattr__ per field) cost 3 us of
    the 13 us a {"id"} hint took to dispatch."""

    kind: str
    id: int | None = None
    user_id: uuid.UUID | None = None
    room: str | None = None
    jti: str | None = None
    call_id: uuid.UUID | None = None
    replica_id: str | None = None
    session_id: uuid.UUID | None = None


# Why a payload was refused: a closed set, safe as a metric label.
REJECT_REASONS = ("too_large", "too_deep", "malformed", "bad_number", "out_of_range", "bad_type",
                  "bad_field", "unknown_kind", "unknown_channel", "bad_mac")
MAX_PAYLOAD = 8000      # NOTIFY's own limit is 8000 bytes
MAX_DEPTH = 4           # every hint we send is a flat object


def _int(msg: dict[str, Any], key: str) -> int:
    value = msg[key]
    if not isinstance(value, int) or isinstance(value, bool):   # we send JSON numbers, never strings
        raise BadInput("bad_number", f"{key} must be a JSON integer")
    return bounded.bigint(value, name=key, minimum=1)


def _uuid(value: object, name: str) -> uuid.UUID:
    if not isinstance(value, str) or len(value) > 64:
        raise BadInput("bad_type", f"{name} must be a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadInput("bad_type", f"{name} must be a UUID string") from None


def _text(value: object, name: str, limit: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limit or "\x00" in value:
        raise BadInput("bad_type", f"{name} must be a string of 1 to {limit} characters")
    return value


_EVENTS_HINT = re.compile(r'\{"(id|eph|tick|live)":([1-9][0-9]{0,19})\}\Z')
# {"live": 1}: event_live_path() was called (the live path switched, or its key and
# channel rotated): re-read the key.
_EVENTS_KIND = {"id": "event", "eph": "eph", "tick": "tick", "live": "live"}


def parse(channel: str, payload: str) -> Notice:
    """The notice a payload on ``channel`` names. Raises ``BadInput`` (``.reason`` in
    REJECT_REASONS) for anything we never send: oversized, nested, wrong types, ids
    outside bigint, unknown kinds or channels. Never anything else: a hostile payload
    is that payload's problem, never the LISTEN connection's."""
    if channel == "switchboard_runs":
        return Notice("run")   # no payload: "a run was queued"
    if channel not in CHANNELS:
        raise BadInput("unknown_channel", "not a channel the relay listens to")
    if channel == "switchboard_events":
        # The payload every publish sends, byte for byte as 50_events.sql writes it: one
        # regex match instead of bounded.loads (a JSONDecoder built per call: several
        # times the cost, on every replica for every event; docs/explanation/benchmark-journal.md "l18"). Only
        # this exact shape; anything else (spaces, leading zeros, other keys) takes the
        # general path below, so every input gets the same Notice or the same BadInput
        # as before.
        m = _EVENTS_HINT.match(payload)
        if m is not None:
            return Notice(_EVENTS_KIND[m[1]], id=bounded.bigint(int(m[2]), name=m[1], minimum=1))
    msg = bounded.loads(payload, max_bytes=MAX_PAYLOAD, max_depth=MAX_DEPTH)
    if not isinstance(msg, dict):
        raise BadInput("bad_type", "a hint is a JSON object")
    if channel == "switchboard_events":
        return _events_notice(msg)
    return _control_notice(msg)


def _events_notice(msg: dict[str, Any]) -> Notice:
    """An events hint off the general path: exactly one key, id, eph or tick."""
    if len(msg) == 1:
        (key,) = msg
        kind = _EVENTS_KIND.get(key)
        if kind is not None:
            return Notice(kind, id=_int(msg, key))
    raise BadInput("bad_field", "an events hint is {\"id\": N}, {\"eph\": N}, {\"tick\": N} or {\"live\": N}")


# switchboard_control: each kind's notice, from the fields that kind carries.
_CONTROL: dict[str, Callable[[dict[str, Any]], Notice]] = {
    "user": lambda m: Notice("user", user_id=_uuid(m.get("user_id"), "user_id")),
    "revoke": lambda m: Notice("revoke", jti=_text(m.get("jti"), "jti", 200)),
    "member": lambda m: Notice("member", room=_text(m.get("room"), "room", 128),
                               user_id=_uuid(m.get("user_id"), "user_id")),
    "tool_result": lambda m: Notice("tool_result", call_id=_uuid(m.get("call_id"), "call_id"),
                                    replica_id=_text(m.get("replica_id"), "replica_id", 200)),
    "session": lambda m: Notice("session", session_id=_uuid(m.get("session_id"), "session_id")),
}


def _control_notice(msg: dict[str, Any]) -> Notice:
    kind = msg.get("kind")
    build = _CONTROL.get(kind) if isinstance(kind, str) else None   # a list or object is no kind
    if build is None:
        raise BadInput("unknown_kind", "unknown control kind")
    return build(msg)


class LiveEvent(NamedTuple):
    """A stored event as its publisher signed it on the live channel (50_events.sql).
    (A NamedTuple for the same reason as Notice: one per live message per replica.)"""

    id: int
    user_id: uuid.UUID | None
    room: str | None
    event: str
    ts: int
    payload: Any


_BARRIER = re.compile(r'\{"b":[1-9][0-9]{0,18}\}\Z')
_HEX64 = re.compile(r"[0-9a-f]{64}")


def parse_live(payload: str, key: bytes) -> LiveEvent | None:
    """A live message whose HMAC-SHA256 under ``key`` verifies, as the event it carries;
    None for a barrier ({"b": N}: an event too large to send, read it first). Raises
    BadInput for anything else: "bad_mac" when the signature does not verify (forged,
    or signed with a key this relay does not hold yet), "too_large", "malformed". Only
    a verified message is parsed as JSON, and every field is checked all the same."""
    if len(payload) > MAX_PAYLOAD:
        raise BadInput("too_large", "a live message is below 8000 bytes")
    if payload.startswith("{"):
        if _BARRIER.match(payload):
            return None
        raise BadInput("malformed", "a live message is <mac>{...} or {\"b\": N}")
    mac, msg = payload[:64], payload[64:]
    if not _HEX64.fullmatch(mac):
        raise BadInput("malformed", "a live message starts with its 64-digit MAC")
    if not hmac.compare_digest(hmac.new(key, msg.encode(), hashlib.sha256).hexdigest(), mac):
        raise BadInput("bad_mac", "the MAC does not verify")
    try:
        m = json.loads(msg)
        eid, user, room, event, ts = m["id"], m["u"], m["r"], m["e"], m["t"]
        payload_value = m["p"]
        if not (isinstance(eid, int) and isinstance(ts, int) and isinstance(event, str)
                and (user is None) != (room is None) and (room is None or isinstance(room, str))):
            raise ValueError("field types")
        return LiveEvent(bounded.bigint(eid, name="id", minimum=1), None if user is None else uuid.UUID(user),
                         room, event, ts, payload_value)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, BadInput):
        # Signed by a key we hold, yet not what 50_events.sql writes: never acted on.
        raise BadInput("malformed", "a signed live message with unexpected fields") from None


# A refused payload is logged at most once a minute, with how many were refused since,
# by the one refused-input logger (bounded.py); this name is the relay's.
RejectLog = bounded.NotifyRejections


class Hints:
    """What the NOTIFYs since the last read named: bounded, deduplicated, untrusted."""

    MAX = 10000

    def __init__(self) -> None:
        self.events = False
        self.tick = False               # a publisher committed: make sure a tick covers it
        self.window = False             # re-read event_window() (publishers_notify) and the live key
        self.ephemeral: set[int] = set()
        self.users: set[uuid.UUID] = set()
        self.revoked: set[str] = set()
        self.members: set[tuple[str, uuid.UUID]] = set()
        self.tools: set[uuid.UUID] = set()
        self.sessions: set[uuid.UUID] = set()

    def __bool__(self) -> bool:
        return bool(self.events or self.tick or self.window or self.ephemeral or self.users or self.revoked
                    or self.members or self.tools or self.sessions)

    def take_announcements(self) -> "Hints":
        """The announcements collected so far (users, revocations, members, tool answers,
        sessions), moved to a new Hints; the event hints stay here."""
        taken = Hints()
        taken.users, self.users = self.users, set()
        taken.revoked, self.revoked = self.revoked, set()
        taken.members, self.members = self.members, set()
        taken.tools, self.tools = self.tools, set()
        taken.sessions, self.sessions = self.sessions, set()
        return taken

    @classmethod
    def add(cls, bucket: set[Any], item: Any) -> None:
        if len(bucket) < cls.MAX:
            bucket.add(item)
