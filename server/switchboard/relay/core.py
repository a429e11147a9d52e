"""The relay, wired from its parts.

Postgres NOTIFYs at COMMIT; every replica hears it on its own LISTEN connection
(listener.py) and acts on its local sockets. The parts, each with one job:

- ``NotifyListener`` (listener.py): the LISTEN and reader connections,
  hearing, liveness, reconnects with backoff;
- ``Dispatcher`` (dispatch.py): parses every notification into hints for the
  next read (never acts on a payload), hands live messages to the merge;
- ``LiveMerge`` (live.py): the live path's ordering rules, no I/O;
- ``LiveChannel`` (channel.py): the live path's key, the channel LISTENed on,
  and the database's word on when the merge has settled after a new key;
- ``EventStream`` (stream.py): the position, paged reads, delivery that never
  waits on a socket, the retention check (resume_gap);
- ``Announcements`` (announce.py): auth and membership changes, read back and
  enforced before any delivery;
- this module: the read loop, the reconnect recovery, the ticker and the deaf
  watch, closing sockets.

Order: the relay's position is (tick, id) in the delivery order (cursor.py,
db/functions/50_events.sql). A publisher's wake-up makes the relay call
event_tick() and read after its position in one round trip (reads.py). When
publishers do not NOTIFY (event_ticker.publishers_notify off), the ticker loop
polls event_tick() instead; every idle liveness check ticks too.

Trust: any role that can connect may NOTIFY on these channels, so a payload is
a hint, never a fact (docs/explanation/security.md); the position only moves to rows read.

Channels (documented for programs in other languages):
  switchboard_events  {"id": N} (a transaction that published committed; N its first event)
                      | {"tick": k} (tick k recorded) | {"eph": N} (ephemeral event N)
                      | {"live": 1} (the live path switched or its key rotated)
  switchboard_control {"kind": "user", "user_id"} | {"kind": "revoke", "jti"}
                      | {"kind": "member", "room", "user_id"}
                      | {"kind": "tool_result", "call_id", "replica_id"}
                      | {"kind": "session", "session_id"}
  switchboard_runs    "" (a run was queued: claim now)
  switchboard_live_<32 hex digits>
                      <mac>{event} | {"b": N} (the verified live path, V0020; the channel is
                      named after the key, V0025, and LISTENed on through
                      relay_live_listen() so its name stays out of pg_stat_activity)
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from .. import bounded, latency_trace, memory
from ..auth import AuthState
from ..config import Config
from ..cursor import END, Position
from ..db import Database
from ..hints import CHANNELS, Hints
from ..metrics import Metrics
from ..resume import resume
from ..sockets import Client, Registry
from .announce import Announcements, OnSessions
from .channel import LiveChannel
from .dispatch import Dispatcher
from .listener import NotifyListener
from .live import LiveMerge
from .reads import Reads, SqlReads
from .stream import EventStream

LOG = logging.getLogger("switchboard.relay")


class Relay:
    """Hears the channels and acts on this replica's sockets.

    ``on_run_wake`` is called when a run was queued (the scheduler claims at once);
    ``on_tool_result(call_id)`` when a tool call this replica waits for may have been
    answered; ``on_connect(conn)`` (async) first thing after every (re)connect, with
    the reader connection (the failover watch, the session watch); ``on_sessions``
    with the session ids announced. All plain callbacks: the relay knows none of
    those components."""

    EPHEMERAL_LOOKBACK_MARGIN = 5.0   # s before the LISTEN loss that a reconnect looks back
    EPHEMERAL_LOOKBACK_MAX = 30.0     # relay_read_v2 reads ephemeral rows younger than 30 s
    LIVE_READ_GAP = 0.1               # s between event reads while the live path delivers

    def __init__(self, db: Database, auth: AuthState, registry: Registry, metrics: Metrics,
                 config: Config, replica_id: str, *, on_run_wake: Callable[[], None],
                 on_tool_result: Callable[[uuid.UUID], None],
                 on_connect: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
                 on_sessions: OnSessions | None = None, reads: Reads | None = None) -> None:
        self.db = db
        self.auth = auth
        self.registry = registry
        self.metrics = metrics
        self.cfg = config
        self.replica_id = replica_id
        self.on_connect = on_connect
        self.live = LiveMerge(ttl=config.live_unconfirmed_ttl, on_sent=self._live_sent,
                              on_dropped=lambda: metrics.inc("switchboard_live_unconfirmed_dropped_total"))
        registry.place, registry.forget = self.live.place, self.live.forget
        rejections = bounded.Rejections(
            lambda source, reason: metrics.inc("switchboard_bad_input_total", source=source, reason=reason), LOG)
        self.stream = EventStream(reads or SqlReads(), registry, self.live, metrics, rejections,
                                  on_behind=self._behind)
        self.dispatch = Dispatcher(self.live, self.stream, registry, metrics, replica_id, on_run_wake=on_run_wake)
        self.announce = Announcements(db, auth, registry, self.close_client,
                                      on_tool_result=on_tool_result, on_sessions=on_sessions)
        self.listener = NotifyListener(config.listen_database_url or config.database_url,
                                       CHANNELS, config.listen_check_interval, metrics,
                                       dispatch=self.dispatch, on_session=self._on_session,
                                       on_idle=lambda: self.dispatch.want_read(window=True))
        self.live_channel = LiveChannel(db, self.listener, self.live, metrics)
        self.on_run_wake = on_run_wake
        self.publishers_notify = True     # event_window().publishers_notify
        self._closed_deaf = False
        self._busy = 0                    # consecutive "another replica is ticking" answers
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- what the rest of the replica reads ------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.listener.connected

    @property
    def last_error(self) -> str | None:
        return self.listener.last_error

    @property
    def down_since(self) -> float | None:
        return self.listener.down_since

    @property
    def position(self) -> Position:
        return self.stream.position

    @property
    def last_seen_id(self) -> int:
        return self.stream.last_seen_id

    def cache_entries(self) -> int:
        """What this relay keeps per hint: the auth cache's users and the ephemeral ids
        seen. Both bounded, so forged hints naming random ids cannot grow memory."""
        return len(self.auth.users) + self.stream.cache_entries()

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        for coro, name in ((self.listener.run(), "relay-listen"), (self._deaf_watch(), "relay-deaf-watch"),
                           (self._ticker_loop(), "relay-ticker")):
            self._spawn(coro, name)
        latency_trace.start()

    async def stop(self) -> None:
        await self.listener.stop()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- a (re)connect --------------------------------------------------------------------------------
    async def _on_session(self, rconn: psycopg.AsyncConnection[Any]) -> asyncio.Task[None]:
        """First thing on a new session: recover what was missed while deaf, then start the
        read loop on the reader connection (the listener watches it)."""
        first = not self.stream.started
        if self.on_connect is not None:
            await self.on_connect(rconn)
        try:
            await self.announce.reload(rconn, self.cfg.jwt_ttl + 60)
        except Exception as exc:
            raise RuntimeError(f"auth reload failed: {exc}") from exc
        win = await self.db.event_window_on(rconn)
        self.publishers_notify = bool(win["publishers_notify"])
        # Nothing live until a read covers what committed while deaf (and the merge has
        # settled); live messages stamped before this (re)connect are history (a genuine
        # one replayed later verifies too). (Nothing is dispatched during this method:
        # the listener hears only afterwards.)
        await self.live_channel.connected(rconn)
        if first:
            # Deliver from the newest tick on (sockets resume with events_since_v2).
            self.stream.start_at((int(win["last_tick"]), END))
        else:
            await self._recover(rconn)
        self._closed_deaf = False
        self.dispatch.want_read()
        self.on_run_wake()
        return asyncio.create_task(self._read_loop(), name="relay-read")

    async def _recover(self, rconn: psycopg.AsyncConnection[Any]) -> None:
        """After a reconnect. Ephemeral events (tool.call.<id>, typing) have no position:
        their hints died with the connection, so read the ids created while we were down
        (plus a margin, at most the 30 s relay_read_v2 still reads). Room removals were
        missed too. Stored events are read from the position by the next read, as a
        catch-up (a socket that cannot take it all catches up on its own); if events after
        the position were reaped meanwhile, that read says so (resume_gap)."""
        since = self.listener.down_since
        down = time.monotonic() - since if since is not None else 0.0
        lookback = min(self.EPHEMERAL_LOOKBACK_MAX, down + self.EPHEMERAL_LOOKBACK_MARGIN)
        try:
            missed = await self.db.relay_ephemeral_missed(rconn, lookback, Hints.MAX)
        except psycopg.Error as exc:  # best effort: it must not keep the relay deaf
            LOG.warning("reading the ephemeral events missed while down failed: %s", exc)
            missed = []
        for eid in missed:
            if not self.stream.seen_ephemeral(eid):
                Hints.add(self.dispatch.hints.ephemeral, eid)
        await self.announce.recheck_all_rooms(rconn)
        self.stream.catching_up = True

    # -- the reader: one batched read per wake-up --------------------------------------------------
    async def _read_loop(self) -> None:
        """One read per wake-up, and event reads at most one per ``relay_read_gap``.

        Notices that arrive during a read fold into the next one; an event read starts no
        sooner than the gap after the previous one started, and what arrives meanwhile
        lands in the same read (statements per replica stay bounded whatever the event
        rate: docs/explanation/benchmark-journal.md, "l18"). Announcements never wait for the gap."""
        loop = asyncio.get_running_loop()
        wake = self.dispatch.wake
        last = float("-inf")
        while True:
            await wake.wait()
            woke = time.time() if latency_trace.ON else 0.0
            h = self.dispatch.hints
            if not (h.ephemeral or Announcements.pending(h)):
                wait = last + self._read_gap() - loop.time()
                if wait > 0:
                    await self._pause(wait, last)     # notices meanwhile land in the same Hints
            hints = self.dispatch.take()
            if hints.events or hints.tick:
                last = loop.time()
                self.metrics.inc("switchboard_relay_reads_total")
            if hints:
                await self._read(hints, woke)
                # Let the socket senders write what this read offered BEFORE the next read
                # is sent: under a steady rate the wake is already set again, and the next
                # query's backend would take this process's CPU first (docs/explanation/benchmark-journal.md "l18").
                await asyncio.sleep(0)

    async def _pause(self, wait: float, last: float) -> None:
        """Sleep ``wait`` s before the next read. A live message that raises the barrier
        meanwhile (a large event, a forged or replayed message) cuts the live path's long
        gap down to relay_read_gap: every live frame after it waits for that read."""
        gap = self.cfg.relay_read_gap
        hurry = self.dispatch.hurry
        hurry.clear()
        if wait <= gap:
            await asyncio.sleep(wait)
            return
        try:
            await asyncio.wait_for(hurry.wait(), wait)
        except TimeoutError:
            return
        rest = last + gap - asyncio.get_running_loop().time()
        if rest > 0:
            await asyncio.sleep(rest)

    def _read_gap(self) -> float:
        """relay_read_gap; LIVE_READ_GAP while the live path carries every event (nothing
        waits for a read then but the confirmation of cursors)."""
        gap = self.cfg.relay_read_gap
        return max(gap, self.LIVE_READ_GAP) if self.live.calm() else gap

    async def _read(self, h: Hints, woke: float = 0.0) -> None:
        rconn = self.listener.reader
        assert rconn is not None
        if h.window:
            self.publishers_notify = bool((await self.db.event_window_on(rconn))["publishers_notify"])
            if await self.live_channel.rekey(rconn):
                self.dispatch.want_read()
        if await self.live_channel.settle(rconn):
            self.dispatch.want_read()     # a read with a tick covers the merge's last barrier
        # Auth first: a disable, a revocation or a session end never waits behind delivery.
        await self.announce.apply(rconn, h)
        res = await self.stream.read(rconn, h.tick, sorted(h.ephemeral), h.events or bool(h.ephemeral),
                                     lambda: self._between_pages(rconn), woke)
        if res.busy:
            # Another replica is ticking: its snapshot may predate what woke us, so ask
            # again shortly (backing off while it stays busy).
            self._busy = min(self._busy + 1, 7)
            self.dispatch.hints.tick = self.dispatch.hints.events = True
            asyncio.get_running_loop().call_later(0.0005 * (2 ** self._busy) * (0.5 + random.random()),
                                                  self.dispatch.wake.set)
        elif h.tick:
            self._busy = 0
        if res.covers >= 0:
            self.live.read_covers(res.covers)

    async def _between_pages(self, rconn: psycopg.AsyncConnection[Any]) -> None:
        if Announcements.pending(self.dispatch.hints):
            await self.announce.apply(rconn, self.dispatch.hints.take_announcements())

    # -- background loops ----------------------------------------------------------------------------
    async def _ticker_loop(self) -> None:
        """PgQ's ticker, for a database whose publishers do not NOTIFY: every
        ``event_tick_interval`` (jittered) ask for a tick -- unless a tick was heard
        meanwhile (another replica is ticking: the cluster needs one at a time)."""
        interval = self.cfg.event_tick_interval
        while not self.listener.stopping:
            await asyncio.sleep(interval * (0.8 + 0.4 * random.random()))
            if self.publishers_notify or not self.connected:
                continue
            if time.monotonic() - self.dispatch.last_tick_heard < interval:
                continue
            self.dispatch.hints.tick = True
            self.dispatch.wake.set()

    async def _deaf_watch(self) -> None:
        """While the LISTEN connection is down this replica hears no events: after
        ``ws_deaf_close_seconds`` its sockets are closed with 1012 so the clients reconnect
        to a replica that hears (and resume from their cursor there: nothing is lost)."""
        limit = self.cfg.ws_deaf_close_seconds
        while not self.listener.stopping:
            await asyncio.sleep(min(0.5, limit / 4))
            since = self.down_since
            if self.connected or since is None or self._closed_deaf:
                continue
            if time.monotonic() - since >= limit:
                clients = [c for c in self.registry.clients() if c.closing is None]
                if clients:
                    LOG.warning("LISTEN down for %.1f s: closing %d socket(s) with 1012 so they "
                                "reconnect elsewhere", time.monotonic() - since, len(clients))
                for c in clients:
                    self.close_client(c, 1012, "replica lost its database connection; reconnect")
                self._closed_deaf = True

    # -- sockets ---------------------------------------------------------------------------------------
    def close_client(self, c: Client, code: int, reason: str) -> None:
        """Close ``c`` with ``code`` and unregister it at once: it gets nothing more, its
        queue is released, and it no longer counts against its user's socket cap."""
        held = c.queue.bytes
        if c.request_close(code, reason):
            self.metrics.inc("switchboard_ws_closed_total", code=str(code))
            if held >= memory.LARGE:
                memory.release_soon()
        self.registry.remove(c)

    def overflow(self, c: Client) -> None:
        LOG.info("closing socket of user %s: send queue full (client too slow)", c.user_id)
        self.close_client(c, 1013, "client too slow")

    def _behind(self, c: Client) -> None:
        """A catch-up found ``c``'s queue full: it catches up on its own, from its own
        position, at its pace (a client that stops reading is closed 1013 after
        ws_replay_stall_seconds); nothing else waits for it."""
        if c.resuming or c.closing is not None:
            return
        c.resuming = True                 # live frames buffer from now on
        c.buffer = []
        self.metrics.inc("switchboard_ws_behind_total")
        c.resume_task = self._spawn(self._catch_up(c), f"catch-up-{c.cid}")

    async def _catch_up(self, c: Client) -> None:
        try:
            await resume(self.db, c, c.position, self.cfg.ws_replay_stall_seconds, tuple(c.ahead), quiet=True)
        except Exception as exc:   # the database went away: the socket reconnects and resumes
            LOG.info("catch-up of a socket of user %s failed: %s", c.user_id, exc)
            self.close_client(c, 1011, "catch-up failed; reconnect")

    def _live_sent(self) -> None:
        self.metrics.inc("switchboard_events_relayed_total")
        self.metrics.inc("switchboard_live_frames_total")
