"""Announcements: auth and membership changes, applied from what was read.

A hint names a user, a token, a room membership or a session; what is applied
is always what the reader connection reads back (user_states, revoked_among,
still_members, session_states), never the payload. Closing rules come from one
place, ``AuthState.verdict`` (auth.py), which the WebSocket handshake and HTTP
authentication use as well. The relay applies announcements before it delivers
anything, and between the pages of a long read, so an auth change is never
queued behind delivery.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..auth import AuthState
from ..db import Database
from ..hints import Hints
from ..sockets import Client, Registry, frame

Close = Callable[[Client, int, str], None]
OnSessions = Callable[[psycopg.AsyncConnection[Any], list[uuid.UUID]], Awaitable[None]]
CHUNK = 10000
GONE = ("member", True, 1 << 30)     # a user that no longer exists: nothing it holds is valid


class Announcements:
    def __init__(self, db: Database, auth: AuthState, registry: Registry, close: Close, *,
                 on_tool_result: Callable[[uuid.UUID], None], on_sessions: OnSessions | None) -> None:
        self.db = db
        self.auth = auth
        self.registry = registry
        self.close = close
        self.on_tool_result = on_tool_result
        self.on_sessions = on_sessions

    @staticmethod
    def pending(h: Hints) -> bool:
        return bool(h.users or h.revoked or h.members or h.tools or h.sessions)

    async def apply(self, conn: psycopg.AsyncConnection[Any], h: Hints) -> None:
        if h.users:
            await self.recheck_users(conn, list(h.users))
        if h.revoked:
            for r in await self.db.revoked_among(conn, list(h.revoked)):
                self.auth.apply_revoke(r["jti"], r["expires_at"].timestamp())
        if h.members:
            # Only pairs with a local socket joined to that room are worth a read.
            await self.recheck_rooms(conn, [(room, uid) for room, uid in h.members
                                            if any(room in c.rooms for c in self.registry.by_user.get(uid, ()))])
        for call_id in h.tools:
            self.on_tool_result(call_id)
        if h.sessions and self.on_sessions is not None:
            await self.on_sessions(conn, list(h.sessions))

    # -- after a reconnect: everything may have been missed --------------------------------
    async def reload(self, conn: psycopg.AsyncConnection[Any], horizon: int) -> None:
        """Reload the whole auth view, close what it refuses, re-check every local user
        and every joined room (announcements missed while deaf)."""
        self.auth.load_snapshot(await self.db.auth_snapshot(conn, horizon))
        for c in self.registry.clients():
            if self.auth.is_disabled(c.user_id):
                self.close(c, 1008, "user disabled")
        await self.recheck_users(conn, list(self.registry.by_user))

    async def recheck_all_rooms(self, conn: psycopg.AsyncConnection[Any]) -> None:
        pairs = sorted({(room, c.user_id) for c in self.registry.clients() for room in c.rooms},
                       key=lambda p: (p[0], str(p[1])))
        await self.recheck_rooms(conn, pairs)

    # -- the rules ----------------------------------------------------------------------------
    async def recheck_users(self, conn: psycopg.AsyncConnection[Any], ids: list[uuid.UUID]) -> None:
        """Re-read these users' state with user_states() (never from a payload), apply it
        to the auth cache, and close their local sockets that the new state refuses."""
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            found = {r["user_id"]: r for r in await self.db.user_states(conn, chunk)}
            for uid in chunk:
                r = found.get(uid)
                if r is not None:
                    self.auth.apply_user(uid, r["role"], r["disabled"], r["token_epoch"])
                elif uid in self.auth.users:
                    # Cached only if it was cached already: a forged hint naming a random id
                    # must not grow the cache (it holds no token and has no socket anyway).
                    self.auth.apply_user(uid, *GONE)
                self.enforce(uid, gone=r is None)

    def enforce(self, uid: uuid.UUID, gone: bool = False) -> None:
        """Close every local socket of ``uid`` that the auth view refuses now."""
        for c in list(self.registry.by_user.get(uid, ())):
            reason = "user disabled" if gone else self.auth.verdict(uid, c.role, c.epoch, c.session_id)
            if reason is not None:
                self.close(c, 1008, reason)

    async def recheck_rooms(self, conn: psycopg.AsyncConnection[Any], pairs: list[tuple[str, uuid.UUID]]) -> None:
        if not pairs:
            return
        still = await self.db.still_members(conn, pairs)
        for room, uid in pairs:
            if (room, uid) in still:
                continue
            for c in list(self.registry.by_user.get(uid, ())):
                if room in c.rooms:
                    self.registry.leave(c, room)
                    c.offer(frame("left", {"reason": "removed"}, room=room))
