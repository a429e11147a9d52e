"""Presence, pushed: presence.state and presence.diff frames for the rooms local sockets watch.

A socket that joined a room asks for its presence (WebSocket actions
presence.subscribe and presence.track; membership was checked by the join).
Every ``interval`` seconds (SWITCHBOARD_PRESENCE_INTERVAL) this replica makes
ONE query, presence_of_rooms(), for every room one of its sockets watches: the
room's members online on any live replica (presence_sockets) with the metadata
each of their connections tracks there (presence_meta). Each room is compared
with the snapshot of the previous interval:

- a socket new to the room gets ``presence.state`` (the whole list);
- the others get at most one ``presence.diff`` per room per interval (joins:
  members who came online or whose metadata changed, whole entries; leaves:
  members who went offline). A reconnect storm of thousands of sockets is one
  diff per interval, encoded once per room.

Bounds: at most ROOMS_PER_QUERY rooms per query (more rooms rotate through the
following intervals), MEMBERS_MAX members listed per room (by username; the
state says ``truncated``), 8 metadata objects per member (SQL). Metadata is
checked here (check_meta) and again in SQL; it lives on this replica in
``tracked`` and in presence_meta, which every heartbeat re-asserts (``sync``):
after an UNLOGGED reset or a failed untrack the rows are right again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from .db import Database
from .metrics import Metrics
from .sockets import Client, Registry, encode, frame

LOG = logging.getLogger("switchboard.presence")
ROOMS_PER_QUERY = 500      # presence_of_rooms() refuses more
MEMBERS_MAX = 1000         # members listed per room
META_KEYS_MAX = 8
META_KEY_LEN = 32
META_BYTES_MAX = 256       # compact JSON, UTF-8

Entry = dict[str, Any]


def check_meta(meta: Any) -> str | None:
    """Why ``meta`` is not presence metadata (None if it is): a JSON object of at most 8 keys
    (1 to 32 characters) with scalar values, at most 256 bytes as compact JSON."""
    if not isinstance(meta, dict):
        return "meta must be a JSON object"
    if len(meta) > META_KEYS_MAX:
        return f"meta has more than {META_KEYS_MAX} keys"
    for k, v in meta.items():
        if not 0 < len(k) <= META_KEY_LEN:
            return f"meta keys are 1 to {META_KEY_LEN} characters"
        if isinstance(v, (dict, list)):
            return "meta values are strings, numbers, booleans or null"
    if len(json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode()) > META_BYTES_MAX:
        return f"meta is larger than {META_BYTES_MAX} bytes"
    return None


class Presence:
    """The rooms whose presence local sockets watch, their last snapshots, and what each
    local socket tracks."""

    def __init__(self, db: Database, registry: Registry, replica_id: str, interval: float,
                 metrics: Metrics | None = None) -> None:
        self.db = db
        self.registry = registry
        self.replica_id = replica_id
        self.interval = interval
        self.metrics = metrics
        self.subs: dict[str, set[Client]] = {}      # room -> sockets that watch it
        self.synced: dict[str, set[Client]] = {}    # room -> sockets that have its state
        self.snaps: dict[str, dict[str, Entry]] = {}   # room -> user id -> entry, as last sent
        self.tracked: dict[Client, dict[str, dict[str, Any]]] = {}   # socket -> room -> meta
        self._offset = 0
        self._task: asyncio.Task[None] | None = None

    # -- what sockets ask for ------------------------------------------------------------------
    def subscribe(self, client: Client, room: str) -> None:
        """``client`` (joined to ``room``) watches it: the next interval sends it the state."""
        self.subs.setdefault(room, set()).add(client)
        self.synced.get(room, set()).discard(client)

    async def track(self, client: Client, room: str, meta: dict[str, Any]) -> None:
        """``client`` shows ``meta`` in ``room`` (checked by check_meta) and watches the room."""
        await self.db.presence_track(self.replica_id, client.cid, client.user_id, room, meta)
        self.tracked.setdefault(client, {})[room] = meta
        if client.closing is not None or room not in client.rooms:   # gone while we wrote
            await self.untrack(client, room)
            return
        if client not in self.subs.get(room, ()):
            self.subscribe(client, room)    # a socket that watches already keeps its diffs coming

    async def untrack(self, client: Client, room: str | None) -> None:
        """``client`` stops showing itself in ``room`` (None: everywhere: the socket closed).
        A failed write is repaired by the next heartbeat (sync)."""
        rooms = self.tracked.get(client)
        if rooms is None:
            return
        if room is None:
            del self.tracked[client]
        elif rooms.pop(room, None) is None:
            return
        elif not rooms:
            del self.tracked[client]
        try:
            await self.db.presence_track(self.replica_id, client.cid, client.user_id, room, None)
        except Exception as exc:
            LOG.info("presence untrack failed (the heartbeat repairs it): %s", exc)

    async def drop(self, client: Client) -> None:
        """The socket closed."""
        for room in list(self.subs):
            self.subs[room].discard(client)
        for room in list(self.synced):
            self.synced[room].discard(client)
        await self.untrack(client, None)

    def tracked_rows(self) -> list[dict[str, Any]]:
        return [{"conn": c.cid, "room": room, "user_id": str(c.user_id), "meta": meta}
                for c, rooms in self.tracked.items() for room, meta in rooms.items()]

    async def sync(self) -> None:
        """Re-assert this replica's presence_meta rows (the heartbeat calls it).

        The rows go from a snapshot of ``tracked``. A track or untrack whose own write
        lands while the sync is on its way (waiting for a pool connection, say) can be
        undone by it: an untracked row put back, a new row deleted. So when ``tracked``
        changed meanwhile, the rows are asserted once more, as they are now (one more
        statement; nothing when nothing changed). A close storm during a heartbeat left
        stray rows until the next heartbeat (tests/test_presence_push.py)."""
        self._prune()
        rows = self.tracked_rows()
        await self.db.presence_meta_sync(self.replica_id, rows)
        if (now := self.tracked_rows()) != rows:
            try:
                await self.db.presence_meta_sync(self.replica_id, now)
            except Exception as exc:
                LOG.info("presence sync after changes failed (the next heartbeat repairs it): %s", exc)

    # -- the interval ----------------------------------------------------------------------------
    def _prune(self) -> None:
        """Forget sockets that closed or left a room (an admin's removal leaves no action)."""
        for room in list(self.subs):
            live = {c for c in self.subs[room] if c.closing is None and room in c.rooms}
            if live:
                self.subs[room] = live
                if room in self.synced:
                    self.synced[room] &= live
            else:
                del self.subs[room]
                self.synced.pop(room, None)
                self.snaps.pop(room, None)
        for c in list(self.tracked):
            rooms = self.tracked[c]
            for room in [r for r in rooms if c.closing is not None or r not in c.rooms]:
                del rooms[room]
            if not rooms:
                del self.tracked[c]

    def _batch(self) -> list[str]:
        rooms = sorted(self.subs)
        if len(rooms) <= ROOMS_PER_QUERY:
            return rooms
        start = self._offset % len(rooms)
        self._offset = start + ROOMS_PER_QUERY
        return (rooms[start:] + rooms[:start])[:ROOMS_PER_QUERY]

    async def tick(self) -> int:
        """One interval: one query, then at most one frame per socket and room. Frames offered."""
        self._prune()
        batch = self._batch()
        if not batch:
            return 0
        rows = await self.db.presence_of_rooms(batch, MEMBERS_MAX + 1)
        fresh: dict[str, dict[str, Entry]] = {r: {} for r in batch}
        for row in rows:
            uid = str(row["user_id"]) if isinstance(row["user_id"], uuid.UUID) else str(row["user_id"])
            fresh.setdefault(row["room"], {})[uid] = {"user_id": uid, "username": row["username"],
                                                      "metas": row["metas"] or []}
        sent = 0
        for room in batch:
            sent += self._room(room, fresh.get(room, {}))
        if self.metrics is not None and sent:
            self.metrics.inc("switchboard_presence_frames_total", sent)
        return sent

    def _room(self, room: str, members: dict[str, Entry]) -> int:
        subs = {c for c in self.subs.get(room, ()) if c.closing is None and room in c.rooms}
        if not subs:
            return 0
        ordered = sorted(members.values(), key=lambda e: (e["username"] or "", e["user_id"]))
        truncated = len(ordered) > MEMBERS_MAX
        if truncated:
            ordered = ordered[:MEMBERS_MAX]
            members = {e["user_id"]: e for e in ordered}
        old = self.snaps.get(room)
        synced = self.synced.setdefault(room, set())
        synced &= subs
        sent = 0
        if old is not None and synced:
            joins = [e for e in ordered if old.get(e["user_id"]) != e]
            leaves = sorted((e for uid, e in old.items() if uid not in members),
                            key=lambda e: (e["username"] or "", e["user_id"]))
            if joins or leaves:
                f = frame("presence.diff", {"joins": joins, "leaves": leaves}, room=room)
                text = encode(f)
                sent += sum(1 for c in synced if c.offer(f, text))
        new = subs - synced
        if new:
            f = frame("presence.state", {"members": ordered, "truncated": truncated}, room=room)
            text = encode(f)
            sent += sum(1 for c in new if c.offer(f, text))
            synced |= new
        self.snaps[room] = members
        return sent

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="presence")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except Exception as exc:   # database down: the next interval tries again
                LOG.debug("presence interval failed: %s", exc)
