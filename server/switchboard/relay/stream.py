"""Where this replica stands in the event stream, and delivering what it reads.

``EventStream`` owns the relay's position -- (tick, id) of the last stored event
read (cursor.py); only ever moved by rows read, never by a payload -- and turns
pages of rows into frames on local sockets:

- **Never waits on a socket.** Every frame is offered to an in-memory queue. A
  socket whose queue is full is dealt with on its own: in normal delivery it is
  closed (1013) and unregistered; during a catch-up (after a LISTEN reconnect,
  when a burst is expected) it is handed to ``on_behind``, which lets it catch
  up by itself, at its own pace, from its own position (resume.py). The
  position, other sockets and the announcements move on meanwhile.
- **Falling behind is explicit.** Each page carries the retained window seen in
  its own snapshot (reads.py). When the position is below it, events after the
  position were reaped unread: every local socket gets ``resume_gap`` with the
  cursor to continue from, ``switchboard_relay_gaps_total`` counts it, and the
  stream continues from the oldest retained tick. Nothing is skipped silently.
- Ephemeral rows (no position) are de-duplicated by id (bounded).
- A row no local socket needs moves the position and is never framed: every
  replica reads every event, most have no socket here (and with the live path
  the ones here often have it already).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from .. import bounded, cursor, latency_trace
from ..bounded import BadInput
from ..cursor import END, Position
from ..metrics import Metrics
from ..rows import UNREADABLE
from ..sockets import Client, Registry, encode, event_frame, frame
from .live import LiveMerge
from .reads import Page, Reads, Row

Between = Callable[[], Awaitable[None]]


def nothing_to_send(targets: set[Client] | None, pos: Position) -> bool:
    """Whether a stored event read at ``pos`` needs no frame here: no local socket it
    goes to, or every one has it already (sent live before the read). Those are
    confirmed here, as Client.offer() would have (the id leaves the cursor). A socket
    that is resuming needs the offer all the same: its replay's flush places the id."""
    if not targets:
        return True
    eid = pos[1]
    for c in targets:
        if c.resuming or not c.has(eid):
            return False
    for c in targets:
        c.confirm(eid, pos)
    return True


class ReadResult:
    __slots__ = ("busy", "covers")

    def __init__(self) -> None:
        self.busy = False       # another replica was ticking: ask again shortly
        self.covers = -1        # the live hearing count this read covers (-1: none)


class EventStream:
    READ_ROWS = 1000
    EPHEMERAL_SEEN_MAX = 20000

    def __init__(self, reads: Reads, registry: Registry, live: LiveMerge, metrics: Metrics,
                 rejections: bounded.Rejections, *, on_behind: Callable[[Client], None]) -> None:
        self.reads = reads
        self.registry = registry
        self.live = live
        self.metrics = metrics
        self.rejections = rejections
        self.on_behind = on_behind
        self.position: Position = (0, END)
        self.last_seen_id = 0           # the highest event id read (hello's last_id)
        self.catching_up = False        # reading what was committed while deaf
        self.started = False            # a first position was taken
        self._eph_seen: OrderedDict[int, None] = OrderedDict()
        self.read_no = -1               # latency_trace only

    # -- position ------------------------------------------------------------------------------
    def start_at(self, pos: Position) -> None:
        self.position = pos
        self.started = True

    def seen_ephemeral(self, eid: int) -> bool:
        return eid in self._eph_seen

    def cache_entries(self) -> int:
        return len(self._eph_seen)

    def _moved(self, pos: Position) -> None:
        self.position = pos
        if pos[1] > self.last_seen_id:
            self.last_seen_id = pos[1]

    # -- reading ---------------------------------------------------------------------------------
    async def read(self, conn: Any, tick: bool, eph: list[int], more: bool, between: Between,
                   woke: float = 0.0) -> ReadResult:
        """One read: a tick + the first page if ``tick`` (covering what committed before
        now), then further pages while they come full. ``more``: read even without a
        tick (an events hint). ``between`` runs between pages (announcements that arrived
        meanwhile must not wait for a long catch-up)."""
        res = ReadResult()
        page: Page | None = None
        if tick:
            heard = self.live.heard
            t0 = time.time() if latency_trace.ON else 0.0
            page = await self.reads.tick_read(conn, self.position, eph, self.READ_ROWS)
            eph = []
            res.busy = page.tick < 0
            res.covers = -1 if res.busy else heard
            if latency_trace.ON:
                self.read_no = latency_trace.read(woke, t0, time.time(), page.tick, None, len(page.rows))
        if not (more or eph or page is not None):
            return res
        while True:
            if page is None:
                page = await self.reads.read(conn, self.position, eph, self.READ_ROWS)
                eph = []
            self._check_window(page)
            stored = await self._deliver_page(page.rows)
            page = None
            if stored < self.READ_ROWS:
                self.catching_up = False
                return res
            await between()

    def _check_window(self, page: Page) -> None:
        if not cursor.is_gap(self.position, page.first_tick):
            return
        self.position = (page.first_tick, END)
        self.gap(page.reaped_through)

    def gap(self, reaped_through: int) -> None:
        """Events after the position were reaped before this replica read them: every
        local socket may have missed some. Each gets resume_gap (reload, then continue
        from its cursor) and moves to the stream's new position."""
        here = cursor.encode(self.position)
        self.metrics.inc("switchboard_relay_gaps_total")
        f = frame("resume_gap", {"after": None, "horizon": int(reaped_through), "cursor": here}, cursor=here)
        for c in self.registry.clients():
            c.offer(f)
            if c.position < self.position:
                c.position = self.position

    async def _deliver_page(self, rows: list[Row]) -> int:
        stored = 0
        live_on = self.live.key is not None
        for i, r in enumerate(rows):
            if i & 31 == 31 and live_on:
                # A long read must not hold live frames back: let the LISTEN loop in.
                await asyncio.sleep(0)
            if r["ephemeral"]:
                self._ephemeral(r)
                continue
            stored += 1
            pos = (int(r["tick"]), int(r["id"]))
            if pos > self.position:
                self._stored(r, pos)
        return stored

    def _ephemeral(self, r: Row) -> None:
        eid = r["id"]
        if eid in self._eph_seen:
            return
        self._eph_seen[eid] = None
        if len(self._eph_seen) > self.EPHEMERAL_SEEN_MAX:
            self._eph_seen.popitem(last=False)
        value = self._payload(r)
        if value is UNREADABLE:
            return
        f = frame(r["event"], value, room=r["room"], ts=r["ts"])
        if r["sender"] is not None:
            f["from"] = str(r["sender"])
        self._deliver(r["user_id"], r["room"], f, None)

    def _stored(self, r: Row, pos: Position) -> None:
        self.live.read_row(pos[1], r["ts"], pos)
        if not self.catching_up and nothing_to_send(self.registry.targets(r["user_id"], r["room"]), pos):
            self._moved(pos)
            return
        value = self._payload(r)
        if value is not UNREADABLE:
            pos, f = event_frame(r, r["ts"], value)
            self._deliver(r["user_id"], r["room"], f, pos)
            if latency_trace.ON:
                latency_trace.event(self.read_no, pos[1], f["payload"])
        # Moved after delivery, with no await between: a socket registered before this
        # point starts at the previous position (hello's cursor) and was offered this event.
        self._moved(pos)

    def _deliver(self, user_id: uuid.UUID | None, room: str | None, f: dict[str, Any],
                 pos: Position | None) -> None:
        targets = self.registry.targets(user_id, room)
        if not targets:
            return
        text = encode(f)
        behind = self.on_behind if self.catching_up else None
        n = 0
        for c in list(targets):
            n += c.offer(f, text, pos=pos, behind=behind)
        if n:   # not when every socket had it already (sent live, then read)
            self.metrics.inc("switchboard_events_relayed_total", n)
            # Commit (the event's database timestamp) to frame offered, once per event.
            self.metrics.observe("switchboard_delivery_latency_seconds", time.time() - f["ts"] / 1000)

    def _payload(self, r: Row) -> Any:
        """A read row's payload, parsed; UNREADABLE (counted, logged at most once a
        minute) for one no Python reader can parse. Skipping it is the only way on: the
        read would otherwise fail on it, the relay reconnect and read it again, forever,
        and every later event for that user or room would wait behind it."""
        try:
            return bounded.stored_json(r["payload"])
        except BadInput as exc:
            self.rejections.record("event_row", exc.reason, f"event {r['id']} skipped: {exc}")
            return UNREADABLE
