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
from collections.abc import Callable
from typing import Any

import psycopg

from .auth import AuthState
from .config import Config
from .db import Database, conninfo_with_keepalives
from .metrics import Metrics

LOG = logging.getLogger("switchboard.relay")
CHANNELS = ("switchboard_events", "switchboard_control", "switchboard_runs")
_ids = itertools.count(1)


CATCH_UP_PAGE = 500


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
        self.refetch = False          # live events were dropped from the buffer: fetch again
        self.buffer: list[dict] = []
        self.closing: int | None = None
        self.close_task: asyncio.Task | None = None
        self._on_overflow = on_overflow

    def __hash__(self) -> int:
        return self.cid

    def offer(self, f: dict, text: str | None = None, replay: bool = False) -> None:
        """Queue a frame unless it is a duplicate; overflow closes the socket (1013).

        ``text`` is ``f`` already serialised: a room event goes to many sockets and is
        encoded once, not once per socket."""
        if self.closing is not None:
            return
        eid = f.get("id")
        if self.resuming and not replay:
            if len(self.buffer) >= self.queue_size:
                # Every stored event in the buffer was committed before its NOTIFY reached
                # us, so the replay's next page will return it: drop them (and ephemeral
                # frames, which are best-effort) and let the replay fetch one more page.
                self.buffer = [b for b in self.buffer if b.get("id") is None][: self.queue_size // 2]
                self.refetch = True
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

    async def offer_wait(self, f: dict, timeout: float, replay: bool = False) -> bool:
        """Like offer(), for replays: waits (up to ``timeout`` s) for room in the send queue
        instead of closing the socket, so a long replay streams at the client's pace. A
        client that does not read for ``timeout`` s is closed 1013. False if not sent."""
        if self.closing is not None:
            return False
        if self.queue.full():
            deadline = time.monotonic() + timeout
            while self.queue.full():
                if self.closing is not None:
                    return False
                if time.monotonic() >= deadline:
                    self._on_overflow(self)
                    return False
                await asyncio.sleep(0.005)
        self.offer(f, replay=replay)
        return self.closing is None


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
    waits for. Both are plain callbacks, so the relay knows neither component.
    """

    def __init__(self, db: Database, auth: AuthState, registry: Registry, metrics: Metrics,
                 config: Config, replica_id: str, *, on_run_wake: Callable[[], None],
                 on_tool_result: Callable[[uuid.UUID], None]) -> None:
        self.db = db
        self.auth = auth
        self.metrics = metrics
        self.cfg = config
        self.replica_id = replica_id
        self.url = self.cfg.listen_database_url or self.cfg.database_url
        self.registry = registry
        self.on_run_wake = on_run_wake
        self.on_tool_result = on_tool_result
        self.connected = False
        self.last_error: str | None = "not connected yet"
        self.down_since: float | None = time.monotonic()
        self._closed_deaf = False
        self.last_seen_id = 0
        self._stop = asyncio.Event()
        self._conn: psycopg.AsyncConnection | None = None
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._listen_loop(), name="relay-listen"))
        self._tasks.append(asyncio.create_task(self._deaf_watch(), name="relay-deaf-watch"))

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
                    LOG.warning("LISTEN connection lost: %s", str(exc).strip() or type(exc).__name__)
                self.last_error = f"LISTEN connection down: {str(exc).strip() or type(exc).__name__}"
            finally:
                if self.connected or self.down_since is None:
                    self.down_since = time.monotonic()
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
            delay = min(delay * 2, 5.0)

    async def _session(self) -> None:
        conn = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                            application_name="switchboard-listen",
                                            **conninfo_with_keepalives()),
            timeout=10)
        self._conn = conn
        interval = self.cfg.listen_check_interval
        for ch in CHANNELS:
            await _bounded(conn.execute(f"LISTEN {ch}"), max(interval, 1.0), "LISTEN")
        self.metrics.inc("switchboard_listen_reconnects_total")
        # Anything announced or published while we were not listening:
        await self._after_connect()
        self.connected = True
        self.down_since = None
        self._closed_deaf = False
        self.last_error = None
        LOG.info("LISTEN connection up (%s)", ", ".join(CHANNELS))
        self.on_run_wake()
        while not self._stop.is_set():
            got = False
            async for n in conn.notifies(timeout=interval):
                got = True
                await self._dispatch(n.channel, n.payload)
            if not got:
                # Nothing heard for a while: prove the connection is alive. Bounded without
                # cancelling the query (see _bounded): a dead connection is noticed within
                # listen_check_interval + max(listen_check_interval, 1 s).
                await _bounded(conn.execute("SELECT 1"), max(interval, 1.0), "liveness check")

    async def _after_connect(self) -> None:
        db = self.db
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
        await self.catch_up([c for c in self.registry.clients() if not c.resuming and c.closing is None])

    async def catch_up(self, clients: list[Client]) -> None:
        """Deliver to every socket what was committed after its cursor, in id order.

        One paged query for all sockets (switchboard._relay_catch_up over their users and
        joined rooms, from the lowest cursor), not one round trip per socket; each page is
        dispatched like live events, and streamed with back-pressure (offer_wait), so a
        long outage does not overflow the send queues. A socket whose cursor is below the
        event horizon (events it missed were reaped) gets resume_gap first."""
        if not clients:
            return
        start = {c: c.cursor for c in clients}
        horizon = await self.db.event_horizon()
        for c in clients:
            if start[c] < horizon:
                c.offer(frame("resume_gap", {"after": start[c], "horizon": horizon}))
        users = sorted({c.user_id for c in clients}, key=str)
        rooms = sorted({r for c in clients for r in c.rooms})
        by_user: dict[uuid.UUID, list[Client]] = defaultdict(list)
        by_room: dict[str, list[Client]] = defaultdict(list)
        for c in clients:
            by_user[c.user_id].append(c)
            for r in c.rooms:
                by_room[r].append(c)
        after = min(start.values())
        page = CATCH_UP_PAGE
        while True:
            rows = await self.db.relay_catch_up(users, rooms, after, page)
            for r in rows:
                if r["user_id"] is not None:
                    targets = by_user.get(r["user_id"], [])
                else:
                    members = set(r["members"] or ())
                    targets = [c for c in by_room.get(r["room"], []) if c.user_id in members]
                f = frame_from_row(r)
                for c in targets:
                    if r["id"] > start[c]:
                        await c.offer_wait(f, self.cfg.ws_replay_stall_seconds)
            if len(rows) < page:
                return
            after = rows[-1]["id"]


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
