"""NOTIFY payloads as the relay reads them: untrusted hints, parsed and bounded.

Any role that can connect may NOTIFY anything on any channel, so a payload is a
hint of *when* to read, never a fact (docs/security.md). ``parse`` turns one
notification into a typed ``Notice`` (or None: not for us / malformed); the
relay collects notices into ``Hints`` between two reads.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

CHANNELS = ("switchboard_events", "switchboard_control", "switchboard_runs")


@dataclass(frozen=True)
class Notice:
    """One parsed notification. ``kind`` is one of: run, event, eph, user, revoke,
    member, tool_result; the other fields are set as the kind needs."""

    kind: str
    id: int | None = None
    user_id: uuid.UUID | None = None
    room: str | None = None
    jti: str | None = None
    call_id: uuid.UUID | None = None
    replica_id: Any = None


def parse(channel: str, payload: str) -> Notice | None:
    """The notice a payload on ``channel`` names, or None (malformed or not ours)."""
    if channel == "switchboard_runs":
        return Notice("run")
    try:
        msg = json.loads(payload) if len(payload) <= 8000 else None
    except ValueError:
        msg = None
    if not isinstance(msg, dict):
        msg = {}
    try:
        if channel == "switchboard_events":
            eph = msg.get("eph")
            if isinstance(eph, int) and not isinstance(eph, bool):
                return Notice("eph", id=eph)
            eid = msg.get("id")
            return Notice("event", id=eid if isinstance(eid, int) and not isinstance(eid, bool) else None)
        if channel == "switchboard_control":
            kind = msg.get("kind")
            if kind == "user":
                return Notice("user", user_id=uuid.UUID(str(msg["user_id"])))
            if kind == "revoke":
                jti = msg.get("jti")
                if isinstance(jti, str) and 0 < len(jti) <= 200:
                    return Notice("revoke", jti=jti)
                return None
            if kind == "member":
                room = msg.get("room")
                if isinstance(room, str) and 0 < len(room) <= 128:
                    return Notice("member", room=room, user_id=uuid.UUID(str(msg["user_id"])))
                return None
            if kind == "tool_result":
                return Notice("tool_result", replica_id=msg.get("replica_id"),
                              call_id=uuid.UUID(str(msg["call_id"])))
        return None
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


class Hints:
    """What the NOTIFYs since the last read named: bounded, deduplicated, untrusted."""

    MAX = 10000

    def __init__(self) -> None:
        self.events = False
        self.ephemeral: set[int] = set()
        self.users: set[uuid.UUID] = set()
        self.revoked: set[str] = set()
        self.members: set[tuple[str, uuid.UUID]] = set()
        self.tools: set[uuid.UUID] = set()

    def __bool__(self) -> bool:
        return bool(self.events or self.ephemeral or self.users or self.revoked or self.members or self.tools)

    @classmethod
    def add(cls, bucket: set, item: Any) -> None:
        if len(bucket) < cls.MAX:
            bucket.add(item)
