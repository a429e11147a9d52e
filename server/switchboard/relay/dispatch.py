"""Hearing: every notification parsed, bounded and folded into the next read's hints.

Runs inside the LISTEN loop's readable callback, so it never awaits and never
acts on a payload: it collects ``Hints`` (hints.py) and wakes the reader. A
live-channel message goes to the live merge, which may put a verified event on
a socket at once. A refused payload is counted in
switchboard_notify_rejected_total{reason} and logged at most once a minute.

Bounded work per message: a live message that does not verify costs one HMAC
over at most 8000 bytes and raises a barrier; it never makes the relay re-read
the key (anybody who knows the channel can send one). The key is re-read after
a LISTEN reconnect, on the {"live"} hint that event_live_path() sends (coalesced:
at most once per read) and at the idle checks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .. import latency_trace
from ..bounded import BadInput
from ..hints import LIVE_CHANNEL, LIVE_PREFIX, REJECT_REASONS, Hints, Notice, RejectLog, parse
from ..metrics import Metrics
from ..sockets import Registry
from .live import LiveMerge
from .stream import EventStream

LOG = logging.getLogger("switchboard.relay")


class Dispatcher:
    def __init__(self, live: LiveMerge, stream: EventStream, registry: Registry, metrics: Metrics,
                 replica_id: str, *, on_run_wake: Callable[[], None]) -> None:
        self.live = live
        self.stream = stream
        self.registry = registry
        self.metrics = metrics
        self.replica_id = replica_id
        self.on_run_wake = on_run_wake
        self.hints = Hints()
        self.wake = asyncio.Event()
        self.hurry = asyncio.Event()     # a live message raised the barrier (Relay._pause)
        self.last_tick_heard = 0.0
        self._reject_log = RejectLog(LOG)

    def take(self) -> Hints:
        """The hints collected since the last call; collecting starts anew."""
        self.wake.clear()
        h, self.hints = self.hints, Hints()
        return h

    def want_read(self, window: bool = False) -> None:
        """Make sure a tick covers what committed before now, and read."""
        h = self.hints
        h.tick = h.events = True
        h.window = h.window or window
        self.wake.set()

    def __call__(self, channel: str, payload: str) -> None:
        if channel.startswith(LIVE_PREFIX):
            # Counted under the path's public name: the channel's own is as secret as the key.
            self.metrics.inc("switchboard_notifications_total", channel=LIVE_CHANNEL)
            self._live(channel, payload)
            return
        self.metrics.inc("switchboard_notifications_total", channel=channel)
        try:
            n = parse(channel, payload)
        except BadInput as exc:
            self._refused(channel, exc, payload)
            return
        except Exception as exc:  # a parser bug must not cost the LISTEN connection either
            self._refused(channel, BadInput("malformed", type(exc).__name__), payload)
            return
        if n.kind == "run":
            self.on_run_wake()  # harmless: the scheduler claims through the database
            return
        if self._collect(n):
            self.wake.set()

    def _refused(self, channel: str, exc: BadInput, payload: str) -> None:
        reason = exc.reason if exc.reason in REJECT_REASONS else "malformed"
        self.metrics.inc("switchboard_notify_rejected_total", reason=reason)
        self._reject_log(channel, exc, payload)

    def _collect(self, n: Notice) -> bool:
        """Fold a notice into the hints; False if it asks for nothing."""
        h = self.hints
        kind = n.kind
        if kind == "event":
            # A publisher committed. (Ids do not follow commit order, so an id below the
            # last one read is no reason to skip.)
            h.events = h.tick = True
            if latency_trace.ON and n.id is not None:
                latency_trace.heard(n.id)
        elif kind == "eph":
            assert n.id is not None
            if self.stream.seen_ephemeral(n.id):
                return False
            Hints.add(h.ephemeral, n.id)
        elif kind == "tick":
            self.last_tick_heard = time.monotonic()
            if n.id is not None and n.id <= self.stream.position[0]:
                return False  # already read through that tick
            h.events = True
        elif kind == "live":
            # The live path switched or its key rotated: re-read the key (and LISTEN on its
            # channel), then read what was sent on a channel this relay did not hear yet.
            # A flag, so a flood of forged hints costs one key read per read, not per hint.
            h.window = h.events = h.tick = True
        elif kind == "tool_result":
            if n.replica_id != self.replica_id:
                return False  # another replica's waiter (or noise)
            Hints.add(h.tools, n.call_id)
        else:
            return self._announcement(n)
        return True

    def _announcement(self, n: Notice) -> bool:
        h = self.hints
        if n.kind == "user":
            Hints.add(h.users, n.user_id)
        elif n.kind == "revoke":
            Hints.add(h.revoked, n.jti)
        elif n.kind == "member":
            Hints.add(h.members, (n.room, n.user_id))
        elif n.kind == "session":
            Hints.add(h.sessions, n.session_id)
        else:
            return False
        return True

    def _live(self, channel: str, payload: str) -> None:
        """A message on a live channel: the read that confirms it (and delivers it if it
        cannot go live) is asked for in any case; the merge decides the rest. A refused
        message raises the barrier and is counted; it never makes the relay re-read the
        key (key changes are announced: the {"live"} hint)."""
        h = self.hints
        h.events = h.tick = True
        self.wake.set()
        v = self.live.verify(channel, payload)
        if self.live.barrier == self.live.heard:
            self.hurry.set()              # this message raised the barrier: read soon
        if v.refused is not None:
            if v.refused != "off":
                self.metrics.inc("switchboard_notify_rejected_total", reason=v.refused)
                self._reject_log(LIVE_CHANNEL, BadInput(v.refused, "live message refused"), payload)
            return
        ev = v.event
        if ev is None:
            return
        targets = self.registry.targets(ev.user_id, ev.room)
        if targets and self.live.deliver(ev, targets):
            self.metrics.observe("switchboard_delivery_latency_seconds", time.time() - ev.ts / 1000)
