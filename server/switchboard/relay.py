"""The relay: one LISTEN connection per process, and the reader that acts on it.

Postgres NOTIFYs at COMMIT; every replica's relay hears it on its own
dedicated autocommit connection and writes frames to its local sockets. The
connection is reconnected with backoff; a liveness query runs whenever no
notification arrived for ``listen_check_interval`` seconds, so a half-open
TCP connection is noticed (plus TCP keepalives). After every (re)connect the
relay reloads the auth view and reads every event after its position, so a
LISTEN outage loses nothing (within the retention window).

Order: the relay's position is (tick, id) in the delivery order (cursor.py,
db/functions/50_events.sql). A publisher's wake-up makes the relay call
event_tick() (so a tick covers what just committed; -1 = another replica is
ticking, asked again within milliseconds) and relay_read_v2 from its position,
both in one round trip (Database.relay_tick_read);
each frame carries its position as ``cursor``. When publishers do not NOTIFY
(event_ticker.publishers_notify off), _ticker_loop polls event_tick() instead.
Every idle liveness check ticks too, which bounds the slow path.

Trust: any role that can connect may NOTIFY on these channels, so a payload is
a hint, never a fact (docs/security.md). The LISTEN loop only collects hints
and wakes the reader; the reader does one batched read per wake-up on its own
connection (event_tick + relay_read_v2 for events, user_states /
revoked_among / is_room_member for announcements) and acts on what it read. A
forged hint costs a read and changes nothing; the position only moves to rows
read. Payloads are parsed with bounds (hints.py); a refused one is counted in
switchboard_notify_rejected_total{reason}, never fatal.

The socket index and frames live in sockets.py, payload parsing in hints.py,
a socket's resume in resume.py.

Channels (documented for programs in other languages):
  switchboard_events  {"id": N} (a transaction that published committed; N its first event)
                      | {"tick": k} (tick k recorded) | {"eph": N} (ephemeral event N)
  switchboard_control {"kind": "user", "user_id"} | {"kind": "revoke", "jti"}
                      | {"kind": "member", "room", "user_id"}
                      | {"kind": "tool_result", "call_id", "replica_id"}
                      | {"kind": "session", "session_id"}
  switchboard_runs    "" (a run was queued: claim now)
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .auth import AuthState
from .config import Config
from .db import Database, conninfo_with_keepalives
from . import cursor, latency_trace
from . import bounded
from .bounded import BadInput
from .cursor import END, Position
from .hints import CHANNELS, LIVE_CHANNEL, REJECT_REASONS, Hints, RejectLog, parse, parse_live
from .metrics import Metrics
from .rows import UNREADABLE
from .sockets import Client, Registry, encode, event_frame, frame

LOG = logging.getLogger("switchboard.relay")


async def _bounded(coro: Any, timeout: float, what: str) -> Any:
    """Await ``coro`` for at most ``timeout`` s WITHOUT cancelling it on timeout.

    asyncio.wait_for() would cancel the query, and psycopg answers a cancellation by
    sending a cancel request and waiting for it (5 s), then for the query to stop (5 s
    more): over a dead link a 1 s liveness check took 11 s. Here the caller gets a
    TimeoutError at once and closes the connection, which ends the query."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise TimeoutError(f"{what}: no answer within {timeout:.1f} s")
    return task.result()


async def _abandon(task: asyncio.Task[Any], conn: psycopg.AsyncConnection[Any] | None,
                   grace: float = 2.0) -> None:
    """Stop ``task``, which may be inside a query on ``conn``, without a network wait.

    Cancelling a task in the middle of a query makes psycopg send a cancel request
    and wait for the query to end (up to 5 s + 5 s over a dead link). Closing the
    connection first (libpq's finish: local and immediate) leaves psycopg nothing
    to cancel, so the task ends at once; ``grace`` bounds the wait regardless."""
    if conn is not None:
        await conn.close()
    task.cancel()
    await asyncio.wait({task}, timeout=grace)


def _nothing_to_send(targets: set[Client] | None, pos: Position) -> bool:
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


class Relay:
    """Hears the three channels and acts on this replica's sockets.

    ``on_run_wake`` is called when a run was queued (the scheduler claims at once);
    ``on_tool_result(call_id)`` when a tool call this replica waits for may have been
    answered (the bridge reads the answer itself); ``on_connect(conn)`` (async) first
    thing after every (re)connect, with the new reader connection -- the failover
    watch uses it to notice a new primary. All plain callbacks, so the relay knows
    none of those components.
    """

    READ_ROWS = 1000
    EPHEMERAL_SEEN_MAX = 20000
    EPHEMERAL_LOOKBACK_MARGIN = 5.0   # s before the LISTEN loss that a reconnect looks back
    EPHEMERAL_LOOKBACK_MAX = 30.0     # relay_read_v2 reads ephemeral rows younger than 30 s
    RECENT_MAX = 20000                # ids read lately (the live path skips what was read)
    UNCONFIRMED_MAX = 10000           # ids sent live and not read yet
    LIVE_READ_GAP = 0.1               # s between event reads while the live path delivers

    def __init__(self, db: Database, auth: AuthState, registry: Registry, metrics: Metrics,
                 config: Config, replica_id: str, *, on_run_wake: Callable[[], None],
                 on_tool_result: Callable[[uuid.UUID], None],
                 on_connect: Callable[[psycopg.AsyncConnection], Awaitable[None]] | None = None,
                 on_sessions: Callable[[psycopg.AsyncConnection, list[uuid.UUID]], Awaitable[None]] | None = None,
                 ) -> None:
        self.db = db
        self.auth = auth
        self.metrics = metrics
        self.cfg = config
        self.replica_id = replica_id
        self.url = self.cfg.listen_database_url or self.cfg.database_url
        self.registry = registry
        self.on_run_wake = on_run_wake
        self.on_tool_result = on_tool_result
        self.on_connect = on_connect
        self.on_sessions = on_sessions
        self.connected = False
        self.last_error: str | None = "not connected yet"
        self.down_since: float | None = time.monotonic()
        self._closed_deaf = False
        self._catching_up = False       # reading what was committed while deaf: stream with back-pressure
        # Where this relay stands in the event stream: (tick, id) of the last stored event
        # read (cursor.py); only ever moved by relay_read_v2 rows, never by a payload.
        self.position: Position = (0, END)
        self.last_seen_id = 0           # the highest event id read (hello's last_id)
        # Publishers NOTIFY (event_window().publishers_notify); when they do not, this
        # relay polls event_tick() every event_tick_interval (see _ticker_loop).
        self.publishers_notify = True
        self._last_tick_heard = 0.0
        self._busy = 0                  # consecutive "another replica is ticking" answers
        self._woke = 0.0                # latency_trace only: when the read loop last woke
        self._cursor_set = False
        self._hints = Hints()
        self._wake = asyncio.Event()
        self._eph_seen: OrderedDict[int, None] = OrderedDict()
        # The verified live path (see _on_live). Counts are registry.heard values.
        self._live_key: bytes | None = None
        self._covered = 0       # every event heard up to this count has been read
        self._barrier = 0       # an event heard at this count must be read before anything live
        # id -> ts of events read lately, oldest first. An OrderedDict: popping a plain
        # dict's first key leaves a run of dead slots that next(iter()) scans, so each
        # eviction cost grew with the number before it (figure 5's live runs slowed
        # from 12 to 57 ms p99 once 20,000 ids had been read).
        self._recent: OrderedDict[int, int] = OrderedDict()
        self._evicted_ts = 0    # the newest ts among ids dropped from _recent
        self._live_since = 0    # database clock (ms) at the last (re)connect
        self._unconfirmed: dict[int, list[Client]] = {}
        self._holding: set[Client] = set()
        self._reject_log = RejectLog(LOG)
        self._rejections = bounded.Rejections(
            lambda source, reason: metrics.inc("switchboard_bad_input_total", source=source, reason=reason), LOG)
        self._stop = asyncio.Event()
        self._conn: psycopg.AsyncConnection | None = None
        self._hearing: int | None = None    # the LISTEN socket's fd while the loop watches it
        self._reader: psycopg.AsyncConnection | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._listen_loop(), name="relay-listen"))
        self._tasks.append(asyncio.create_task(self._deaf_watch(), name="relay-deaf-watch"))
        self._tasks.append(asyncio.create_task(self._ticker_loop(), name="relay-ticker"))
        latency_trace.start()

    async def _ticker_loop(self) -> None:
        """PgQ's ticker, for a database whose publishers do not NOTIFY: every
        ``event_tick_interval`` (jittered) ask for a tick -- unless a tick was heard
        meanwhile (another replica is ticking: the cluster needs one at a time). Any
        replica may tick; the one that does wakes every relay with one NOTIFY per batch.
        Idle cost: one cheap event_tick() per replica per interval."""
        interval = self.cfg.event_tick_interval
        while not self._stop.is_set():
            await asyncio.sleep(interval * (0.8 + 0.4 * random.random()))
            if self.publishers_notify or not self.connected:
                continue
            if time.monotonic() - self._last_tick_heard < interval:
                continue
            self._hints.tick = True
            self._wake.set()

    async def _deaf_watch(self) -> None:
        """While the LISTEN connection is down this replica hears no events: after
        ``ws_deaf_close_seconds`` its sockets are closed with 1012 so the clients reconnect
        to a replica that hears (and resume from their cursor there: nothing is lost)."""
        limit = self.cfg.ws_deaf_close_seconds
        while not self._stop.is_set():
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

    async def stop(self) -> None:
        self._stop.set()
        if self._hearing is not None:
            # Unregister the LISTEN socket before its connection closes: once closed, its
            # fd number may be reused by a new socket while the loop still watches it.
            asyncio.get_running_loop().remove_reader(self._hearing)
            self._hearing = None
        for conn in (self._conn, self._reader):
            if conn is not None:
                try:
                    await conn.close()
                except Exception:
                    pass
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _listen_loop(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                await self._session()
                delay = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost, server down, liveness timeout
                if self.connected or self.last_error is None:
                    LOG.warning("LISTEN connection lost: %s", str(exc).strip() or type(exc).__name__)
                self.last_error = f"LISTEN connection down: {str(exc).strip() or type(exc).__name__}"
            finally:
                self._mark_down()
                for attr in ("_conn", "_reader"):
                    conn = getattr(self, attr)
                    setattr(self, attr, None)
                    if conn is not None:
                        try:
                            await asyncio.wait_for(conn.close(), 2)
                        except Exception:
                            pass
            if self._stop.is_set():
                break
            try:
                await asyncio.wait_for(self._stop.wait(), delay * (0.5 + random.random()))
            except asyncio.TimeoutError:
                pass
            # Capped at 2 s (x0.5-1.5 jitter): after a PostgreSQL failover the relay is what
            # keeps the replica unready, and a 5 s cap left replicas 503 for up to ~7 s after
            # the new primary took writes (tests/pgha). One connect attempt per replica every
            # 1-3 s during an outage costs the database nothing.
            delay = min(delay * 2, 2.0)

    def _mark_down(self) -> None:
        if self.connected or self.down_since is None:
            self.down_since = time.monotonic()
        self.connected = False

    async def _connect(self, name: str) -> psycopg.AsyncConnection:
        return await asyncio.wait_for(
            psycopg.AsyncConnection.connect(self.url, autocommit=True, application_name=name,
                                            row_factory=dict_row, **conninfo_with_keepalives()),
            timeout=10)

    async def _session(self) -> None:
        conn = self._conn = await self._connect("switchboard-listen")
        self._reader = await self._connect("switchboard-relay-read")
        interval = self.cfg.listen_check_interval
        for ch in CHANNELS + (LIVE_CHANNEL,):
            await _bounded(conn.execute(f"LISTEN {ch}"), max(interval, 1.0), "LISTEN")
        self.metrics.inc("switchboard_listen_reconnects_total")
        # Anything announced or published while we were not listening:
        await self._after_connect()
        reader = asyncio.create_task(self._read_loop(), name="relay-read")
        try:
            self.connected = True
            self.down_since = None
            self._closed_deaf = False
            self.last_error = None
            LOG.info("LISTEN connection up (%s)", ", ".join(CHANNELS))
            self.on_run_wake()
            await self._hear(conn, reader)
        finally:
            # Down from this moment (readiness 503, the deaf-close clock starts), not after
            # the clean-up below: it may wait on a dead network.
            self._mark_down()
            await _abandon(reader, self._reader)

    async def _hear(self, conn: psycopg.AsyncConnection[Any], reader: asyncio.Task[None]) -> None:
        """Dispatch every notification as it arrives; when none came for
        ``listen_check_interval``, prove the connection alive. Returns only by raising
        (the connection or the reader failed), or when the relay stops.

        The socket stays registered with the event loop for the whole session and each
        readable event drains libpq's queue (consume_input, notifies: C calls), as
        asyncpg's listener does. psycopg's ``notifies()`` generator instead registers and
        unregisters the socket and arms a timeout for every batch: with one or two
        notifications per batch that machinery was about a quarter of a replica's CPU
        under figure 5's load (py-spy). During a liveness check psycopg owns the socket
        and hands what arrives meanwhile to the notify handler."""
        loop = asyncio.get_running_loop()
        pgconn = conn.pgconn
        enc = conn.info.encoding
        fd = pgconn.socket
        interval = self.cfg.listen_check_interval
        failed: asyncio.Future[None] = loop.create_future()
        heard = 0

        def readable() -> None:
            nonlocal heard
            try:
                pgconn.consume_input()
                while (n := pgconn.notifies()) is not None:
                    heard += 1
                    self._dispatch(n.relname.decode(enc), n.extra.decode(enc))
            except Exception as exc:   # the connection broke (or a dispatch bug): reconnect
                loop.remove_reader(fd)
                self._hearing = None
                if not failed.done():
                    failed.set_exception(exc)

        def during_check(n: psycopg.Notify) -> None:
            nonlocal heard
            heard += 1
            self._dispatch(n.channel, n.payload)

        # Heard while LISTEN ran and the relay caught up, dispatched only now: after
        # _after_connect's barrier (nothing of it goes live before the catch-up read).
        async for n in conn.notifies(timeout=0):
            heard += 1
            self._dispatch(n.channel, n.payload)
        conn.add_notify_handler(during_check)
        loop.add_reader(fd, readable)
        self._hearing = fd
        readable()      # anything libpq holds already: epoll only reports new bytes
        try:
            while not self._stop.is_set():
                before = heard
                await asyncio.wait({reader, failed}, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                if failed.done():
                    failed.result()
                if reader.done():
                    reader.result()  # the reader's connection failed: reconnect both
                    raise RuntimeError("relay reader stopped")
                if heard == before:
                    # Nothing heard for a while: prove the connection is alive. Bounded without
                    # cancelling the query (see _bounded): a dead connection is noticed within
                    # listen_check_interval + max(listen_check_interval, 1 s).
                    loop.remove_reader(fd)
                    self._hearing = None
                    await _bounded(conn.execute("SELECT 1"), max(interval, 1.0), "liveness check")
                    loop.add_reader(fd, readable)
                    self._hearing = fd
                    readable()
                    # And tick: a publisher's wake-up is the fast path, this bounds the slow
                    # one (a tick attempt that found the ticker busy and gave up). And look
                    # whether a DBA switched publishers_notify.
                    self._hints.tick = self._hints.events = self._hints.window = True
                    self._wake.set()
        finally:
            if self._hearing == fd:
                loop.remove_reader(fd)
                self._hearing = None
            if not failed.done():
                failed.cancel()
            elif not failed.cancelled():
                failed.exception()     # retrieved: raised above, or superseded by another error

    async def _after_connect(self) -> None:
        rconn = self._reader
        assert rconn is not None
        # Live messages sent while we were deaf are gone: nothing live until a read has
        # covered everything committed before now.
        self.registry.heard += 1
        self._barrier = self.registry.heard
        if self.on_connect is not None:
            await self.on_connect(rconn)
        try:
            self.auth.load_snapshot(await self.db.auth_snapshot(rconn, self.cfg.jwt_ttl + 60))
            for c in self.registry.clients():
                if self.auth.is_disabled(c.user_id):
                    self.close_client(c, 1008, "user disabled")
            # Announcements missed while deaf (a password change): re-check local sockets.
            await self._recheck_users(rconn, list(self.registry.by_user))
        except Exception as exc:
            raise RuntimeError(f"auth reload failed: {exc}") from exc
        win = await self.db.event_window_on(rconn)
        self.publishers_notify = bool(win["publishers_notify"])
        # Live messages stamped before this (re)connect are history: a genuine one replayed
        # on the bus later (signed, so it verifies) must not be delivered again.
        self._live_key, self._live_since = await self.db.relay_live_key(rconn)
        if not self._cursor_set:
            # First connect: deliver from the newest tick on (sockets resume with events_since_v2).
            self.position = (int(win["last_tick"]), END)
            self._cursor_set = True
        else:
            # Ephemeral events (tool.call.<id>, typing) have no position: their hints died
            # with the connection. Read the ids created while we were down (plus a margin for
            # a transaction that started earlier; at most the 30 s relay_read_v2 still reads)
            # and let the next read deliver the ones not delivered yet, from their rows.
            down = time.monotonic() - self.down_since if self.down_since is not None else 0.0
            lookback = min(self.EPHEMERAL_LOOKBACK_MAX, down + self.EPHEMERAL_LOOKBACK_MARGIN)
            try:
                missed = await self.db.relay_ephemeral_missed(rconn, lookback, Hints.MAX)
            except psycopg.Error as exc:  # best effort: it must not keep the relay deaf
                LOG.warning("reading the ephemeral events missed while down failed: %s", exc)
                missed = []
            for eid in missed:
                if eid not in self._eph_seen:
                    Hints.add(self._hints.ephemeral, eid)
            # Events that became visible while we were deaf: one paged read after the
            # position, streamed with back-pressure (see _read). If batches after it were
            # reaped meanwhile, every socket may have missed some: resume_gap first, so
            # clients reload, and read on from the oldest retained tick.
            if cursor.is_gap(self.position, int(win["first_tick"])):
                self.position = (int(win["first_tick"]), END)
                here = cursor.encode(self.position)
                gap = frame("resume_gap", {"after": None, "horizon": int(win["reaped_through"]), "cursor": here},
                            cursor=here)
                for c in self.registry.clients():
                    c.offer(gap)
            # Room removals announced while we were deaf were missed too: re-check the rooms
            # local sockets joined before any room event is delivered.
            pairs = sorted({(room, c.user_id) for c in self.registry.clients() for room in c.rooms},
                           key=lambda p: (p[0], str(p[1])))
            if pairs:
                still = await self.db.still_members(rconn, pairs)
                for room, uid in pairs:
                    if (room, uid) not in still:
                        for c in list(self.registry.by_user.get(uid, ())):
                            if room in c.rooms:
                                self.registry.leave(c, room)
                                c.offer(frame("left", {"reason": "removed"}, room=room))
            self._catching_up = True
        self._hints.events = True
        self._hints.tick = True
        self._wake.set()

    # -- hints (LISTEN loop: parse, bound, never act) --------------------------------------
    def _dispatch(self, channel: str, payload: str) -> None:
        self.metrics.inc("switchboard_notifications_total", channel=channel)
        if channel == LIVE_CHANNEL:
            self._on_live(payload)
            return
        try:
            n = parse(channel, payload)
        except BadInput as exc:
            reason = exc.reason if exc.reason in REJECT_REASONS else "malformed"
            self.metrics.inc("switchboard_notify_rejected_total", reason=reason)
            self._reject_log(channel, exc, payload)
            return
        except Exception as exc:  # a parser bug must not cost the LISTEN connection either
            self.metrics.inc("switchboard_notify_rejected_total", reason="malformed")
            self._reject_log(channel, BadInput("malformed", type(exc).__name__), payload)
            return
        h = self._hints
        if n.kind == "run":
            self.on_run_wake()  # harmless: the scheduler claims through the database
            return
        if n.kind == "eph":
            assert n.id is not None
            if n.id not in self._eph_seen:
                Hints.add(h.ephemeral, n.id)
        elif n.kind == "event":
            # A publisher committed: make sure a tick covers it, then read. (Ids do not
            # follow commit order, so an id below the last one read is no reason to skip.)
            h.events = True
            h.tick = True
            if latency_trace.ON and n.id is not None:
                latency_trace.heard(n.id)
        elif n.kind == "tick":
            self._last_tick_heard = time.monotonic()
            if n.id is not None and n.id <= self.position[0]:
                return  # already read through that tick
            h.events = True
        elif n.kind == "user":
            Hints.add(h.users, n.user_id)
        elif n.kind == "revoke":
            Hints.add(h.revoked, n.jti)
        elif n.kind == "member":
            Hints.add(h.members, (n.room, n.user_id))
        elif n.kind == "tool_result":
            if n.replica_id != self.replica_id:
                return  # another replica's waiter (or noise)
            Hints.add(h.tools, n.call_id)
        elif n.kind == "session":
            Hints.add(h.sessions, n.session_id)
        else:
            return
        self._wake.set()

    # -- the verified live path (V0020) ---------------------------------------------------
    def _on_live(self, payload: str) -> None:
        """A message on switchboard_live: deliver the event it carries now if its MAC
        verifies and nothing may still come before it; otherwise it is a hint.

        Every event is read all the same (the read confirms what was sent live: each
        socket's cursor then drops the id for the event's position). Order, per socket:
        notifications arrive in commit order, so an event may go out live only when
        everything heard before it was either sent live too or has been read:
        - ``_covered``: the hearing count up to which a completed read covered everything;
        - ``_barrier``: the count of the last event that could not go live (too large, a
          MAC that does not verify, a LISTEN reconnect, an id that may have been read
          already, a message stamped before this connection: a replayed genuine one);
          nothing goes live until a read covers it;
        - a socket's ``gate`` (set when it is registered or joins a room: events from
          before reach it only by the read), and frames it holds meanwhile, flushed in
          order once a read covers them (_flush_holds), or delivered by that read.
        An event read already (``_recent``) is skipped: the read delivered it."""
        self.registry.heard += 1
        seq = self.registry.heard
        h = self._hints
        h.events = h.tick = True          # the read that confirms it (and delivers if not live)
        self._wake.set()
        key = self._live_key
        if key is None:
            self._barrier = seq
            h.window = True               # switched on meanwhile? re-read the key
            return
        try:
            ev = parse_live(payload, key)
        except BadInput as exc:
            self._barrier = seq
            self.metrics.inc("switchboard_notify_rejected_total", reason=exc.reason)
            self._reject_log(LIVE_CHANNEL, exc, payload)
            if exc.reason == "bad_mac":
                h.window = True           # a rotated key, or a forgery: re-read the key
            return
        if ev is None:                    # {"b": N}: an event too large to send live
            self._barrier = seq
            return
        if ev.id in self._recent:
            return                        # read (and delivered) before this arrived
        if ev.ts <= self._evicted_ts or ev.ts < self._live_since:
            # Maybe read long ago, or from before this connection (a genuine message
            # replayed on the bus verifies too): the read decides, never the message.
            self._barrier = seq
            return
        targets = self.registry.targets(ev.user_id, ev.room)
        if not targets:
            return
        text = encode(frame(ev.event, ev.payload, id=ev.id, room=ev.room, ts=ev.ts))
        sent = False
        for c in list(targets):
            need = max(self._barrier, c.gate, c.hold[-1][0] if c.hold else 0)
            if need > self._covered or c.resuming or c.hold:
                if len(c.hold) < c.HOLD_MAX:
                    c.hold.append((need, ev.id, ev.room, text))
                    self._holding.add(c)
                else:
                    c.gate = seq          # the read delivers it; live again once read
                continue
            sent |= self._send_live(c, ev.id, text) > 0
        if sent:
            self.metrics.observe("switchboard_delivery_latency_seconds", time.time() - ev.ts / 1000)

    def _send_live(self, c: Client, eid: int, text: str) -> int:
        """Send a live frame to ``c``: 1 sent, 0 it had it already, -1 refused (its cursor
        is full, or too many ids wait for their read): the read delivers it, and ``c``
        gets nothing live until a read has covered what was heard so far."""
        if len(self._unconfirmed) >= self.UNCONFIRMED_MAX and eid not in self._unconfirmed:
            c.gate = self.registry.heard
            return -1
        sent = c.offer_live(eid, text)
        if sent < 0:
            c.gate = self.registry.heard
        elif sent > 0:
            self._unconfirmed.setdefault(eid, []).append(c)
            self.metrics.inc("switchboard_events_relayed_total")
            self.metrics.inc("switchboard_live_frames_total")
        return sent

    def _flush_holds(self) -> None:
        """After a read that covered everything heard up to ``_covered``: send each held
        frame whose predecessors are now all delivered, in the order heard."""
        for c in list(self._holding):
            if c.closing is not None:
                c.hold.clear()
            elif not c.resuming:
                while c.hold and c.hold[0][0] <= self._covered:
                    _, eid, room, text = c.hold.pop(0)
                    if (room is None or room in c.rooms) and self._send_live(c, eid, text) < 0:
                        c.hold.clear()    # refused: the read delivers it and all held after it
                        break
            if not c.hold:
                self._holding.discard(c)

    def _read_row(self, eid: int, ts: int, pos: Position) -> None:
        """Every stored row read: remembered as read, and confirmed where it went live."""
        recent = self._recent
        recent[eid] = ts
        if len(recent) > self.RECENT_MAX:
            self._evicted_ts = max(self._evicted_ts, recent.popitem(last=False)[1])
        if self._unconfirmed:
            for c in self._unconfirmed.pop(eid, ()):
                c.confirm(eid, pos)

    # -- the reader: one batched read per wake-up ----------------------------------------
    async def _read_loop(self) -> None:
        """One read per wake-up, and event reads at most one per ``relay_read_gap``.

        Notices that arrive during a read fold into the next one. Under a steady event
        rate that alone still reads back to back (about one read per round trip), so
        statements per replica grew with the rate; an event read therefore starts no
        sooner than ``relay_read_gap`` after the previous one started, and what arrives
        meanwhile lands in the same read. The first event after a quiet spell is read at
        once; announcements (users, revocations, rooms, tool answers, sessions,
        ephemeral ids) never wait. Bound per replica: 4 statements per read (BEGIN,
        event_tick, COMMIT, relay_read_v2), so at most 4 / gap + rate / READ_ROWS
        statements/s (333/s at the default 12 ms), whatever the event rate. 12 ms rather
        than 5: at figure 5's load (3 replicas, 1,000 events/s), against 5 ms in the same
        rotation, PostgreSQL CPU per event 0.58-0.94x and COMMIT -> frame p99 0.41-0.88x
        in all five runs, p50 0.83-1.17x (BENCHMARKS.md, "l18")."""
        loop = asyncio.get_running_loop()
        last = float("-inf")
        while True:
            await self._wake.wait()
            if latency_trace.ON:
                self._woke = time.time()
            h = self._hints
            if not (h.ephemeral or h.users or h.revoked or h.members or h.tools or h.sessions):
                wait = last + self._read_gap() - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)     # notices meanwhile land in the same Hints
            self._wake.clear()
            hints, self._hints = self._hints, Hints()
            if hints.events or hints.tick:
                last = loop.time()
                self.metrics.inc("switchboard_relay_reads_total")
            if hints:
                await self._read(hints)
                # Let the socket senders write what this read offered BEFORE the next read
                # is sent. Under a steady rate the wake is already set again, and sending
                # the next query wakes its backend, which on a busy box takes this
                # process's CPU: the frames waited behind a whole database round trip
                # (offered -> written p50 10-12 ms against 0.5 ms with this yield,
                # bench/latency_ab.py --trace, BENCHMARKS.md "l18").
                await asyncio.sleep(0)

    def _read_gap(self) -> float:
        """relay_read_gap; LIVE_READ_GAP while the live path carries every event (nothing
        waits for a read then but the confirmation of cursors: fewer, larger reads leave
        the CPU to the live frames). Back to relay_read_gap as soon as anything waits: a
        barrier not yet covered, or frames held for a gated socket."""
        gap = self.cfg.relay_read_gap
        if self._live_key is not None and self._barrier <= self._covered and not self._holding:
            return max(gap, self.LIVE_READ_GAP)
        return gap

    async def _read(self, h: Hints) -> None:
        rconn = self._reader
        assert rconn is not None
        db = self.db
        if h.window:
            self.publishers_notify = bool((await db.event_window_on(rconn))["publishers_notify"])
            self._live_key = (await db.relay_live_key(rconn))[0]
        first: list[dict[str, Any]] | None = None
        eph = sorted(h.ephemeral)
        trace = latency_trace.ON
        read_no = -1
        covers = -1                       # the hearing count this read covers, if it completes
        if h.tick:
            # Make sure a tick covers what committed before now, and read, in one round trip.
            heard = self.registry.heard
            t0 = time.time() if trace else 0.0
            got, first = await db.relay_tick_read(rconn, self.position, eph, self.READ_ROWS)
            eph = []
            backoff: float | None = None
            if got < 0:
                # Another replica is ticking: its snapshot may predate what woke us, so ask
                # again shortly (backing off while it stays busy); read what is ticked now.
                self._busy = min(self._busy + 1, 7)
                self._hints.tick = self._hints.events = True
                backoff = 0.0005 * (2 ** self._busy) * (0.5 + random.random())
                asyncio.get_running_loop().call_later(backoff, self._wake.set)
            else:
                self._busy = 0
                covers = heard
            if trace:
                read_no = latency_trace.read(self._woke, t0, time.time(), got, backoff, len(first))
        if h.events or h.ephemeral or first is not None:
            while True:
                if first is None and trace:
                    t0 = time.time()
                rows = first if first is not None else await db.relay_read_v2(rconn, self.position, eph,
                                                                               self.READ_ROWS)
                if first is None and trace:
                    read_no = latency_trace.read(self._woke, t0, time.time(), None, None, len(rows))
                first = None
                eph = []
                stored = 0
                registry = self.registry
                for i, r in enumerate(rows):
                    if i & 31 == 31 and self._live_key is not None:
                        # A long read must not hold live frames back: let the LISTEN loop in.
                        await asyncio.sleep(0)
                    pos: Position | None = None
                    if r["ephemeral"]:
                        if r["id"] in self._eph_seen:
                            continue
                        self._eph_seen[r["id"]] = None
                        if len(self._eph_seen) > self.EPHEMERAL_SEEN_MAX:
                            self._eph_seen.popitem(last=False)
                        value = self._stored_payload(r)
                        if value is UNREADABLE:
                            continue
                        f = frame(r["event"], value, room=r["room"], ts=r["ts"])
                        if r["sender"] is not None:
                            f["from"] = str(r["sender"])
                    else:
                        stored += 1
                        pos = (int(r["tick"]), int(r["id"]))
                        if pos <= self.position:
                            continue
                        self._read_row(pos[1], r["ts"], pos)
                        if not self._catching_up and _nothing_to_send(
                                registry.targets(r["user_id"], r["room"]), pos):
                            # Every replica reads every event; most have no socket here, and
                            # with the live path the ones here have it already. The position
                            # moves all the same, but no frame is built and the payload (read
                            # as text) is never parsed.
                            self.position = pos
                            if pos[1] > self.last_seen_id:
                                self.last_seen_id = pos[1]
                            continue
                        value = self._stored_payload(r)
                        if value is UNREADABLE:
                            self.position = pos
                            self.last_seen_id = max(self.last_seen_id, pos[1])
                            continue
                        pos, f = event_frame(r, r["ts"], value)
                    if self._catching_up:
                        await self._deliver_wait(r["user_id"], r["room"], f, pos)
                    else:
                        self._deliver(r["user_id"], r["room"], f, pos)
                    if trace and pos is not None:
                        latency_trace.event(read_no, pos[1], f["payload"])
                    if pos is not None:
                        # Moved after delivery: a socket registered meanwhile starts here
                        # (hello's cursor) and was offered this event (see _deliver_wait).
                        self.position = pos
                        self.last_seen_id = max(self.last_seen_id, pos[1])
                if stored < self.READ_ROWS:
                    self._catching_up = False
                    break
            if covers > self._covered:
                self._covered = covers
                if self._holding:
                    self._flush_holds()
        if h.users:
            await self._recheck_users(rconn, list(h.users))
        if h.revoked:
            for r in await db.revoked_among(rconn, list(h.revoked)):
                self.auth.apply_revoke(r["jti"], r["expires_at"].timestamp())
        if h.members:
            # Only pairs with a local socket joined to that room are worth a read.
            local = [(room, uid) for room, uid in h.members
                     if any(room in c.rooms for c in self.registry.by_user.get(uid, ()))]
            if local:
                still = await db.still_members(rconn, local)
                for room, uid in local:
                    if (room, uid) in still:
                        continue
                    for c in list(self.registry.by_user.get(uid, ())):
                        if room in c.rooms:
                            self.registry.leave(c, room)
                            c.offer(frame("left", {"reason": "removed"}, room=room))
        for call_id in h.tools:
            self.on_tool_result(call_id)
        if h.sessions and self.on_sessions is not None:
            await self.on_sessions(rconn, list(h.sessions))

    async def _deliver_wait(self, user_id: uuid.UUID | None, room: str | None, f: dict[str, Any],
                            pos: Position | None) -> None:
        """_deliver for a catch-up: each socket's frame waits for room in its send queue
        (a client that reads nothing for ws_replay_stall_seconds is closed 1013). A socket
        registered while we wait is offered the frame too: its hello said it starts
        before this event."""
        done: set[Client] = set()
        text = encode(f)
        while True:
            pending = [c for c in (self.registry.targets(user_id, room) or ()) if c not in done]
            if not pending:
                break
            for c in pending:
                done.add(c)
                await c.offer_wait(f, self.cfg.ws_replay_stall_seconds, text=text, pos=pos)
        if done:
            self.metrics.inc("switchboard_events_relayed_total", len(done))

    def _deliver(self, user_id: uuid.UUID | None, room: str | None, f: dict[str, Any], pos: Position | None) -> None:
        targets = self.registry.targets(user_id, room)
        if not targets:
            return
        text = encode(f)
        n = 0
        for c in list(targets):
            n += c.offer(f, text, pos=pos)
        if n:   # not when every socket had it already (sent live, then read)
            self.metrics.inc("switchboard_events_relayed_total", n)
            # Commit (the event's database timestamp) to frame offered, once per event.
            self.metrics.observe("switchboard_delivery_latency_seconds", time.time() - f["ts"] / 1000)

    def _stored_payload(self, r: dict[str, Any]) -> Any:
        """A read row's payload, parsed; UNREADABLE (counted, logged at most once a
        minute) for one no Python reader can parse. Skipping it is the only way on: the
        read would otherwise fail on it, the relay reconnect and read it again, forever,
        and every later event for that user or room would wait behind it."""
        try:
            return bounded.stored_json(r["payload"])
        except BadInput as exc:
            self._rejections.record("event_row", exc.reason, f"event {r['id']} skipped: {exc}")
            return UNREADABLE

    # -- closing ----------------------------------------------------------------------
    async def _recheck_users(self, rconn: psycopg.AsyncConnection, ids: list[uuid.UUID]) -> None:
        """Re-read these users' state with user_states() (never from a payload) and apply it
        to the auth cache and to their local sockets.

        A socket remembers the user's token epoch when it was accepted. Disabled: closed
        (1008). Epoch moved on (a password change, a role change: both revoke the user's
        tokens and end its sessions): closed (1008, "session revoked"), so a password reset
        or a demotion cuts existing sessions."""
        for i in range(0, len(ids), 10000):
            chunk = ids[i:i + 10000]
            found = {r["user_id"]: r for r in await self.db.user_states(rconn, chunk)}
            for uid in chunk:
                r = found.get(uid)
                if r is None:  # no such user (any more): nothing it holds is valid
                    # Cached only if it was cached already: a forged hint naming a random id
                    # must not grow the cache (it holds no token and has no socket anyway).
                    if uid in self.auth.users:
                        self.auth.apply_user(uid, "member", True, 1 << 30)
                    disabled, role, epoch = True, "member", 1 << 30
                else:
                    self.auth.apply_user(uid, r["role"], r["disabled"], r["token_epoch"])
                    disabled, role, epoch = r["disabled"], r["role"], int(r["token_epoch"])
                for c in list(self.registry.by_user.get(uid, ())):
                    if disabled:
                        self.close_client(c, 1008, "user disabled")
                    elif epoch > c.epoch or c.role != role:
                        self.close_client(c, 1008, "session revoked")

    def close_client(self, c: Client, code: int, reason: str) -> None:
        if c.request_close(code, reason):
            self.metrics.inc("switchboard_ws_closed_total", code=str(code))

    def cache_entries(self) -> int:
        """What this relay keeps per hint: the auth cache's users and the ephemeral ids
        seen. Both bounded (users only for ids that exist; ids seen by EPHEMERAL_SEEN_MAX),
        so forged hints naming random ids cannot grow memory."""
        return len(self.auth.users) + len(self._eph_seen)

    def overflow(self, c: Client) -> None:
        LOG.info("closing socket of user %s: send queue full (client too slow)", c.user_id)
        self.close_client(c, 1013, "client too slow")
