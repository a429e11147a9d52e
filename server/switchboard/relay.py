"""The relay: one LISTEN connection per process, and the local socket index.

Postgres NOTIFYs at COMMIT; every replica's relay hears it on its own
dedicated autocommit connection and writes frames to its local sockets. The
connection is reconnected with backoff; a liveness query runs whenever no
notification arrived for ``listen_check_interval`` seconds, so a half-open
TCP connection is noticed (plus TCP keepalives). After every (re)connect the
relay reloads the auth view and catches every local socket up from its last
delivered event id with events_since(), so a LISTEN outage loses nothing.

Channels (documented for programs in other languages):
  switchboard_events  {"id", "user_id", "room", "event", "payload", "ts"}
                      (+ "truncated": true when the payload did not fit;
                       + "ephemeral": true, "from" for client events)
  switchboard_control {"kind": "user"|"revoke"|"member"|"tool_result", ...}
  switchboard_runs    "" (a run was queued: claim now)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from .auth import AuthState
from .config import Config
from .db import Database, conninfo_with_keepalives
from .metrics import Metrics

LOG = logging.getLogger("switchboard.relay")
CHANNELS = ("switchboard_events", "switchboard_control", "switchboard_runs")
_ids = itertools.count(1)


def encode(f: dict) -> str:
    return json.dumps(f, separators=(",", ":"), default=str)


def frame(event: str, payload: Any = None, *, id: int | None = None, room: str | None = None,
          ts: int | None = None, **extra: Any) -> dict:
    f = {"id": id, "event": event, "room": room, "payload": {} if payload is None else payload,
         "ts": ts if ts is not None else int(time.time() * 1000)}
    f.update(extra)
    return f


def frame_from_row(r: dict) -> dict:
    return frame(r["event"], r["payload"], id=r["id"], room=r["room"],
                 ts=int(r["created_at"].timestamp() * 1000))


class Client:
    """One accepted WebSocket: its user, joined rooms and bounded send queue."""

    SENT_IDS_MAX = 20000

    def __init__(self, user_id: uuid.UUID, username: str, role: str, queue_size: int,
                 cursor: int, on_overflow: Callable[["Client"], None]) -> None:
        self.cid = next(_ids)
        self.user_id = user_id
        self.username = username
        self.role = role
        self.rooms: set[str] = set()
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self.sent_ids: set[int] = set()
        self.cursor = cursor          # highest stored event id this socket is up to date with
        self.resuming = False
        self.buffer: list[dict] = []
        self.closing: int | None = None
        self.close_task: asyncio.Task | None = None
        self._on_overflow = on_overflow

    def __hash__(self) -> int:
        return self.cid

    def offer(self, f: dict, text: str | None = None) -> None:
        """Queue a frame unless it is a duplicate; overflow closes the socket (1013).

        ``text`` is ``f`` already serialised: a room event goes to many sockets and is
        encoded once, not once per socket."""
        if self.closing is not None:
            return
        eid = f.get("id")
        if self.resuming:
            if len(self.buffer) >= self.queue_size:
                self._on_overflow(self)
                return
            self.buffer.append(f)
            return
        if eid is not None:
            if eid in self.sent_ids:
                return
            self.sent_ids.add(eid)
            if eid > self.cursor:
                self.cursor = eid
            if len(self.sent_ids) > self.SENT_IDS_MAX:
                floor = self.cursor - self.SENT_IDS_MAX // 2
                self.sent_ids = {i for i in self.sent_ids if i > floor}
        try:
            self.queue.put_nowait(text if text is not None else encode(f))
        except asyncio.QueueFull:
            self._on_overflow(self)


class Registry:
    """Local sockets indexed by user and by room."""

    def __init__(self) -> None:
        self.by_user: dict[uuid.UUID, set[Client]] = defaultdict(set)
        self.by_room: dict[str, set[Client]] = defaultdict(set)
        self.count = 0

    def add(self, c: Client) -> int:
        self.by_user[c.user_id].add(c)
        self.count += 1
        return len(self.by_user[c.user_id])

    def remove(self, c: Client) -> int:
        for room in list(c.rooms):
            self.leave(c, room)
        peers = self.by_user.get(c.user_id)
        if peers is not None and c in peers:
            peers.discard(c)
            self.count -= 1
            if not peers:
                del self.by_user[c.user_id]
        return len(self.by_user.get(c.user_id, ()))

    def join(self, c: Client, room: str) -> None:
        c.rooms.add(room)
        self.by_room[room].add(c)

    def leave(self, c: Client, room: str) -> None:
        c.rooms.discard(room)
        members = self.by_room.get(room)
        if members is not None:
            members.discard(c)
            if not members:
                del self.by_room[room]

    def clients(self) -> list[Client]:
        return [c for peers in self.by_user.values() for c in peers]

    def sockets_of(self, user_id: uuid.UUID) -> int:
        return len(self.by_user.get(user_id, ()))


class Relay:
    """Hears the three channels and acts on this replica's sockets.

    ``on_run_wake`` is called when a run was queued (the scheduler claims at once);
    ``on_tool_result(call_id)`` when a browser answered a tool call this replica
    waits for; ``on_connect(conn)`` (async) first thing after every (re)connect, with
    the new LISTEN connection -- the failover watch uses it to notice a new primary. All plain callbacks, so the
    relay knows none of those components.
    """

    def __init__(self, db: Database, auth: AuthState, registry: Registry, metrics: Metrics,
                 config: Config, replica_id: str, *, on_run_wake: Callable[[], None],
                 on_tool_result: Callable[[uuid.UUID], None],
                 on_connect: Callable[[psycopg.AsyncConnection], Awaitable[None]] | None = None) -> None:
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
        self.connected = False
        self.last_error: str | None = "not connected yet"
        self.last_seen_id = 0
        self._stop = asyncio.Event()
        self._conn: psycopg.AsyncConnection | None = None
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._listen_loop(), name="relay-listen"))

    async def stop(self) -> None:
        self._stop.set()
        conn = self._conn
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
                    LOG.warning("LISTEN connection lost: %s", exc)
                self.last_error = f"LISTEN connection down: {str(exc).strip() or type(exc).__name__}"
            finally:
                self.connected = False
                conn, self._conn = self._conn, None
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

    async def _session(self) -> None:
        conn = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                            application_name="switchboard-listen",
                                            **conninfo_with_keepalives()),
            timeout=10)
        self._conn = conn
        for ch in CHANNELS:
            await conn.execute(f"LISTEN {ch}")
        self.metrics.inc("switchboard_listen_reconnects_total")
        # Anything announced or published while we were not listening:
        await self._after_connect()
        self.connected = True
        self.last_error = None
        LOG.info("LISTEN connection up (%s)", ", ".join(CHANNELS))
        self.on_run_wake()
        interval = self.cfg.listen_check_interval
        while not self._stop.is_set():
            got = False
            async for n in conn.notifies(timeout=interval):
                got = True
                await self._dispatch(n.channel, n.payload)
            if not got:
                # Nothing heard for a while: prove the connection is alive.
                await asyncio.wait_for(conn.execute("SELECT 1"), timeout=max(interval, 1.0))

    async def _after_connect(self) -> None:
        db = self.db
        if self.on_connect is not None and self._conn is not None:
            await self.on_connect(self._conn)
        try:
            rows = await db.auth_snapshot(self.cfg.jwt_ttl + 60)
            self.auth.load_snapshot(rows)
            for c in self.registry.clients():
                known = self.auth.users.get(c.user_id)
                if known is not None and known[1]:
                    self.close_client(c, 1008, "user disabled")
        except Exception as exc:
            raise RuntimeError(f"auth reload failed: {exc}") from exc
        # Catch every socket up from where it is (events committed while we were deaf).
        for c in self.registry.clients():
            if c.resuming or c.closing is not None:
                continue
            await self._catch_up(c)

    async def _catch_up(self, c: Client) -> None:
        rows = await self.db.events_since(c.user_id, c.cursor, sorted(c.rooms), 10000)
        for r in rows:
            c.offer(frame_from_row(r))


    # -- dispatch -------------------------------------------------------------------
    async def _dispatch(self, channel: str, payload: str) -> None:
        m = self.metrics
        m.inc("switchboard_notifications_total", channel=channel)
        try:
            if channel == "switchboard_runs":
                self.on_run_wake()
            elif channel == "switchboard_events":
                await self._on_event(json.loads(payload))
            elif channel == "switchboard_control":
                self._on_control(json.loads(payload))
        except Exception:
            LOG.exception("bad notification on %s: %.200s", channel, payload)

    async def _on_event(self, msg: dict) -> None:
        eid = msg.get("id")
        if eid is not None and eid > self.last_seen_id:
            self.last_seen_id = eid
        if msg.get("truncated"):
            row = await self.db.fetch_event(eid)
            if row is None:
                return
            msg["payload"] = row["payload"]
        f = frame(msg["event"], msg.get("payload"), id=eid, room=msg.get("room"), ts=msg.get("ts"))
        if msg.get("from"):
            f["from"] = msg["from"]
        targets: set[Client] | list[Client]
        if msg.get("user_id"):
            targets = self.registry.by_user.get(uuid.UUID(msg["user_id"]), set())
        elif msg.get("room"):
            targets = self.registry.by_room.get(msg["room"], set())
        else:
            return
        n = 0
        text = encode(f) if targets else None
        for c in list(targets):
            c.offer(f, text)
            n += 1
        if n:
            self.metrics.inc("switchboard_events_relayed_total", n)
            # Commit (the event's database timestamp) to frame offered, once per event.
            self.metrics.observe("switchboard_delivery_latency_seconds", time.time() - f["ts"] / 1000)

    def _on_control(self, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == "user":
            uid = uuid.UUID(msg["user_id"])
            self.auth.apply_user(uid, msg["role"], bool(msg["disabled"]))
            for c in list(self.registry.by_user.get(uid, ())):
                if msg["disabled"]:
                    self.close_client(c, 1008, "user disabled")
                else:
                    c.role = msg["role"]
                    c.offer(frame("session.updated", {"role": msg["role"]}))
        elif kind == "revoke":
            self.auth.apply_revoke(msg["jti"])
        elif kind == "member":
            if not msg.get("member"):
                uid = uuid.UUID(msg["user_id"])
                for c in list(self.registry.by_user.get(uid, ())):
                    if msg["room"] in c.rooms:
                        self.registry.leave(c, msg["room"])
                        c.offer(frame("left", {"reason": "removed"}, room=msg["room"]))
        elif kind == "tool_result":
            if msg.get("replica_id") == self.replica_id:
                self.on_tool_result(uuid.UUID(msg["call_id"]))

    # -- closing ----------------------------------------------------------------------
    def close_client(self, c: Client, code: int, reason: str) -> None:
        if c.closing is not None:
            return
        c.closing = code
        self.metrics.inc("switchboard_ws_closed_total", code=str(code))
        closer = getattr(c, "closer", None)
        if closer is not None:
            # Kept on the client: the socket's handler awaits it before returning, or the
            # ASGI server's implicit close (1000) could overtake this one.
            c.close_task = asyncio.get_running_loop().create_task(closer(code, reason))

    def overflow(self, c: Client) -> None:
        LOG.info("closing socket of user %s: send queue full (client too slow)", c.user_id)
        self.close_client(c, 1013, "client too slow")
