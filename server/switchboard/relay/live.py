"""The live path's merge of live frames and reads: pure state, no I/O.

A publisher that commits also sends a signed copy of its event on
the live channel (V0020; named after the key since V0025). The relay may put that copy on a socket at once --
before any read -- only when nothing the socket should get first can still
come from a read. ``LiveMerge`` owns every rule of that decision; the relay
feeds it what it heard and what it read, and it offers frames to sockets
(an in-memory queue: nothing here awaits).

Order, per socket: notifications arrive in commit order, so an event may go
out live only when everything heard before it was either sent live too or has
been read:
- ``covered``: the hearing count up to which a completed read covered
  everything;
- ``barrier``: the count of the last event that could not go live (too large,
  a MAC that does not verify, a LISTEN reconnect, a new key and channel, an id
  that may have been read already, a message stamped before this connection: a
  replayed genuine one); nothing goes live until a read covers it;
- ``settling`` (after a new key or a reconnect, below): every message is a barrier;
- a socket's ``LiveState.gate`` (set when it is registered or joins a room:
  events from before reach it only by the read), and the frames it holds
  meanwhile, flushed in order once a read covers them.
An event read already (``recent``) is skipped: the read delivered it.

Keys: the channel is named after the key (V0025), so each channel has one key, and
the relay LISTENs on the current one only. A publisher reads the key (and so the
channel) when it publishes and sends its message when it commits, possibly much
later; and two rotations may come between two key reads of the relay, so a key it
never knew may have signed messages on a channel it never heard. Such a message is
lost without a trace, and a barrier raised at the key read does not cover it when
its transaction commits after the read that covered the barrier. So a new key (a
rotation, the path switched) and a reconnect start a *settling*: nothing goes live
until every transaction open at the key read has ended (the database's oldest open
xid has passed ``xmax`` of the key read's snapshot: ``settle``); then one more
barrier, and the read after it covers whatever they committed.

Bounded and self-healing (no state outlives its cause):
- ``recent`` keeps the last RECENT_MAX ids read;
- ``unconfirmed`` (ids sent live, waiting for the read that gives them their
  position) keeps at most UNCONFIRMED_MAX ids, each for at most
  UNCONFIRMED_TTL seconds. An id that is not confirmed in time (its row was
  reaped before the relay read it, or the read jumped past it) is dropped: it
  leaves the cursors of the sockets it went to, which then fall back on the
  read path for it (a resume from such a cursor may repeat that one event,
  never lose it). A full set drops its oldest id instead of refusing live
  frames, so the path never degrades for good;
- ``forget`` drops a socket from every structure the moment it is unregistered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from ..bounded import BadInput
from ..cursor import Position
from ..hints import LiveEvent, parse_live
from ..sockets import Held, encode, frame

if TYPE_CHECKING:
    from ..sockets import Client


class Verdict(NamedTuple):
    """What a live message was: ``event`` (None for a barrier) or the reason it was refused."""

    event: LiveEvent | None
    refused: str | None


class LiveMerge:
    RECENT_MAX = 20000
    UNCONFIRMED_MAX = 10000
    UNCONFIRMED_TTL = 30.0      # s an id sent live may wait for the read that confirms it

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = UNCONFIRMED_TTL,
                 on_sent: Callable[[], None] = lambda: None,
                 on_dropped: Callable[[], None] = lambda: None) -> None:
        self.key: bytes | None = None       # the current key (None: the path is off)
        self.channel: str | None = None     # ... and the channel it signs on (LISTENed on)
        self.settling: int | None = None    # xmax of the key read's snapshot (None: settled)
        self.heard = 0          # messages heard on the live channel (plus reconnect barriers)
        self.covered = 0        # every message heard up to this count has been read
        self.barrier = 0        # a message heard at this count must be read before anything live
        self.live_since = 0     # database clock (ms) at the last (re)connect
        # id -> ts of events read lately, oldest first. An OrderedDict: popping a plain
        # dict's first key leaves a run of dead slots that next(iter()) scans.
        self._recent: OrderedDict[int, int] = OrderedDict()
        self._evicted_ts = 0    # the newest ts among ids dropped from _recent
        # id sent live -> (when, the sockets it went to), oldest first
        self._unconfirmed: OrderedDict[int, tuple[float, list[Client]]] = OrderedDict()
        self._holding: set[Client] = set()
        self._clock = clock
        self.ttl = ttl          # s an id sent live may wait for its read (SWITCHBOARD_LIVE_UNCONFIRMED_TTL)
        self._on_sent = on_sent  # each live frame queued (a metric)
        self._on_dropped = on_dropped   # each id dropped unconfirmed (a metric)

    # -- what the relay tells it ---------------------------------------------------------
    def place(self, c: Client) -> None:
        """A socket was registered or joined a room: events heard before reach it by the read."""
        c.live.gate = max(c.live.gate, self.heard)

    def reconnected(self, key: bytes | None, channel: str | None, live_since: int, xmax: int) -> None:
        """The LISTEN connection is (re)established, and LISTENs on ``channel``: live
        messages sent while deaf are gone, so nothing goes live until a read covers
        everything committed before now; and messages stamped before ``live_since`` are
        history (a replayed genuine one). The key may have changed (or the path been
        switched off and on) while deaf: the merge settles (see ``settle``); ``xmax``:
        pg_snapshot_xmax() of the key read's snapshot."""
        self._barrier_now()
        self.key, self.channel, self.live_since = key, channel, live_since
        self._settle_after(xmax)

    def rotated(self, key: bytes | None, channel: str | None, xmax: int) -> str | None:
        """The path has a new key (None: it was switched off) and the relay LISTENs on its
        ``channel`` now. Events sent on it before that LISTEN were never heard, so nothing
        goes live until a read covers everything committed before now (a barrier, as at a
        reconnect); and transactions still open at the key read may yet send on the
        previous channel or on a key this relay never knew: the merge settles (see
        ``settle``). Returns the channel no longer heard (the relay UNLISTENs it), if any."""
        self._barrier_now()
        old = self.channel if self.channel != channel else None
        self.key, self.channel = key, channel
        self._settle_after(xmax)
        return old

    def settle(self, xmin: int) -> bool:
        """The database's oldest open transaction is ``xmin`` (pg_snapshot_xmin() of a
        snapshot taken now). Once it has passed ``settling``, every transaction that could
        still send on a channel this relay did not hear has ended: what they committed is
        covered by one more barrier (the next read's tick is after it), and the path goes
        live again. True when that happened just now."""
        if self.settling is None or xmin < self.settling:
            return False
        self.settling = None
        self._barrier_now()
        return True

    def _settle_after(self, xmax: int) -> None:
        if self.key is None:
            self.settling = None          # off: nothing goes live anyway
        else:
            self.settling = max(xmax, self.settling or 0)

    def _barrier_now(self) -> None:
        self.heard += 1
        self.barrier = self.heard

    def bump(self) -> int:
        """Count a message heard on the live channel; its count."""
        self.heard += 1
        return self.heard

    def read_row(self, eid: int, ts: int, pos: Position) -> None:
        """Every stored row read: remembered as read, and confirmed where it went live."""
        recent = self._recent
        recent[eid] = ts
        if len(recent) > self.RECENT_MAX:
            self._evicted_ts = max(self._evicted_ts, recent.popitem(last=False)[1])
        if self._unconfirmed:
            entry = self._unconfirmed.pop(eid, None)
            if entry is not None:
                for c in entry[1]:
                    c.confirm(eid, pos)

    def read_covers(self, count: int) -> None:
        """A read completed that covers everything heard up to ``count``."""
        if count > self.covered:
            self.covered = count
            if self._holding:
                self._flush_holds()
        self.expire()

    def forget(self, c: Client) -> None:
        """``c`` is gone (closed, unregistered): keep nothing of it."""
        c.live.hold.clear()
        self._holding.discard(c)
        for eid in c.ahead:
            entry = self._unconfirmed.get(eid)
            if entry is not None and c in entry[1]:
                entry[1].remove(c)
                if not entry[1]:
                    del self._unconfirmed[eid]

    def expire(self) -> None:
        """Drop the ids sent live that waited longer than ``ttl`` for their read."""
        limit = self._clock() - self.ttl
        while self._unconfirmed:
            eid, (sent, _) = next(iter(self._unconfirmed.items()))
            if sent > limit:
                break
            self._drop_oldest()

    def calm(self) -> bool:
        """Nothing waits for a read but the confirmation of cursors (the relay may read
        less often then): the path is on and settled, no barrier is uncovered, no frame
        is held."""
        return (self.key is not None and self.settling is None and self.barrier <= self.covered
                and not self._holding)

    def unconfirmed(self) -> int:
        return len(self._unconfirmed)

    def holding(self) -> int:
        return len(self._holding)

    # -- a message on a live channel -------------------------------------------------------
    def verify(self, channel: str, payload: str) -> Verdict:
        """Count a message heard on live ``channel`` and decide what it is. Anything but a
        verified, fresh event not read yet raises the barrier (the read decides, never
        the message), and so does every message while the merge settles. "off": no key for
        that channel (the path is off, the channel was just dropped, or it is not LISTENed
        on as a live channel yet)."""
        seq = self.bump()
        key = self.key if channel == self.channel else None
        if key is None:
            self.barrier = seq
            return Verdict(None, "off")
        try:
            ev = parse_live(payload, key)
        except BadInput as exc:
            self.barrier = seq
            return Verdict(None, exc.reason)
        if ev is None:                    # {"b": N}: an event too large to send live
            self.barrier = seq
            return Verdict(None, None)
        if ev.id in self._recent:
            return Verdict(None, None)    # read (and delivered) before this arrived
        if ev.ts <= self._evicted_ts or ev.ts < self.live_since or self.settling is not None:
            self.barrier = seq
            return Verdict(None, None)
        return Verdict(ev, None)

    def deliver(self, ev: LiveEvent, targets: Iterable[Client]) -> int:
        """Send a verified event to ``targets`` now where order allows, hold it where a read
        must come first. How many sockets it was sent to."""
        text = encode(frame(ev.event, ev.payload, id=ev.id, room=ev.room, ts=ev.ts))
        seq = self.heard
        sent = 0
        for c in list(targets):
            st = c.live
            need = max(self.barrier, st.gate, st.hold[-1].need if st.hold else 0)
            if need > self.covered or c.resuming or st.hold:
                if len(st.hold) < st.HOLD_MAX:
                    st.hold.append(Held(need, ev.id, ev.room, text))
                    self._holding.add(c)
                else:
                    st.gate = seq         # the read delivers it; live again once read
                continue
            sent += self._send(c, ev.id, text) > 0
        return sent

    # -- internals --------------------------------------------------------------------------
    def _send(self, c: Client, eid: int, text: str) -> int:
        """1 sent, 0 it had it already, -1 refused (its cursor is full): the read delivers
        it, and ``c`` gets nothing live until a read has covered what was heard so far."""
        sent = c.offer_live(eid, text)
        if sent < 0:
            c.live.gate = self.heard
        elif sent > 0:
            self._on_sent()
            entry = self._unconfirmed.get(eid)
            if entry is None:
                if len(self._unconfirmed) >= self.UNCONFIRMED_MAX:
                    self._drop_oldest()
                self._unconfirmed[eid] = (self._clock(), [c])
            else:
                entry[1].append(c)
        return sent

    def _drop_oldest(self) -> None:
        eid, (_, clients) = self._unconfirmed.popitem(last=False)
        self._on_dropped()
        for c in clients:
            c.unconfirmable(eid)

    def _flush_holds(self) -> None:
        """Send each held frame whose predecessors are now all delivered, in the order heard."""
        for c in list(self._holding):
            hold = c.live.hold
            if c.closing is not None:
                hold.clear()
            elif not c.resuming:
                while hold and hold[0].need <= self.covered:
                    h = hold.popleft()
                    if (h.room is None or h.room in c.rooms) and self._send(c, h.eid, h.text) < 0:
                        hold.clear()      # refused: the read delivers it and all held after it
                        break
            if not hold:
                self._holding.discard(c)
