"""A socket belongs to its login session: this closes it when the session ends.

Three ways a session ends, and how each reaches the sockets of every replica:

- logout, or reuse of a refresh token (the family is revoked): end_session()
  announces {"kind": "session", "session_id"} on switchboard_control. The
  relay collects it as a hint like any other and hands the ids to
  ``recheck`` on its reader connection, which re-reads them with
  session_states() (never trusting the payload) and closes the sockets.
- expiry (nobody refreshed it for SWITCHBOARD_SESSION_TTL): nothing is
  announced, so each replica watches the expiry its sockets were accepted
  with; once it passes, ``run`` re-reads those sessions (one of them may
  have been refreshed on another replica, which moved the expiry on) and
  closes the ones that really expired.
- a password change, a role change, disable_user: they end every session
  of the user and bump its token epoch; the relay's existing user recheck
  closes the sockets (1008 "session revoked" / "user disabled").

After the LISTEN connection reconnects (announcements may have been missed),
``on_connect`` re-reads the sessions of every local socket.

Close reasons (1008), per the client contract: "session ended" (logout,
expiry), "session revoked" (refresh-token reuse, an administrator's revoke,
a password or role change), "user disabled".
"""

from __future__ import annotations

from typing import Any

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import psycopg

from .auth import AuthState
from .db import Database
from .sockets import Client, Registry

LOG = logging.getLogger("switchboard.sessions")
CHUNK = 10000
REASONS = {"logout": "session ended", "expired": "session ended", "disabled": "user disabled"}


def close_reason(end_reason: str | None) -> str:
    return REASONS.get(end_reason or "expired", "session revoked")


def session_of(client: Client) -> uuid.UUID | None:
    return client.session_id


class SessionWatch:
    def __init__(self, db: Database, auth: AuthState, registry: Registry,
                 close: Callable[[Client, int, str], None], interval: float) -> None:
        self.db = db
        self.auth = auth
        self.registry = registry
        self.close = close
        self.interval = interval
        # No socket's known session expiry is earlier than this: until then a tick costs
        # one comparison, not a walk over every socket (a cost that grows with the sockets).
        self.earliest = float("inf")
        self._task: asyncio.Task[Any] | None = None

    def bind(self, client: Client, session_id: uuid.UUID | None, expires_at: datetime | None) -> None:
        """Remember on the socket which session it belongs to (None: a token from before
        sessions, bound to its user only) and until when that session is known to live."""
        client.session_id = session_id
        exp = expires_at.timestamp() if expires_at else None
        client.session_expires = exp
        if exp is not None and exp < self.earliest:
            self.earliest = exp

    # -- announcements (called by the relay with its reader connection) --------------
    async def recheck(self, conn: psycopg.AsyncConnection[Any], ids: list[uuid.UUID]) -> None:
        """Re-read these sessions and act on what was read: an ended or expired session's
        tokens are refused from now on and its local sockets are closed (1008)."""
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            rows = {r["session_id"]: r for r in await self.db.session_states(conn, chunk)}
            self._apply(chunk, rows)

    async def on_connect(self, conn: psycopg.AsyncConnection) -> None:
        ids = sorted({sid for c in self.registry.clients() if (sid := session_of(c)) is not None}, key=str)
        if ids:
            await self.recheck(conn, ids)

    def _apply(self, ids: list[uuid.UUID], rows: dict[uuid.UUID, dict[str, Any]]) -> None:
        ended: dict[uuid.UUID, str] = {}
        for sid in ids:
            r = rows.get(sid)
            if r is None:                       # unknown (reaped): nothing under it is valid
                ended[sid] = "expired"
            elif not r["live"]:
                ended[sid] = r["end_reason"] or "expired"
                if r["end_reason"] is not None:
                    self.auth.apply_session_end(sid)
        live = {sid: rows[sid]["expires_at"].timestamp() for sid in ids if sid not in ended}
        for c in self.registry.clients():
            cs = session_of(c)
            if cs is None:
                continue
            if cs in ended:
                self.close(c, 1008, close_reason(ended[cs]))
            elif cs in live:
                c.session_expires = live[cs]

    # -- expiry ----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="session-expiry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_expired()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # database down: try again next round
                LOG.warning("session expiry check failed: %s", str(exc).strip() or type(exc).__name__)

    async def check_expired(self) -> None:
        now = time.time()
        if now < self.earliest:
            return
        due: set[uuid.UUID] = set()
        earliest = float("inf")
        for c in self.registry.clients():
            sid = session_of(c)
            if sid is None or c.closing is not None:
                continue
            exp = c.session_expires or 0.0
            if exp <= now:
                due.add(sid)
            elif exp < earliest:
                earliest = exp
        self.earliest = earliest
        if not due:
            return
        try:
            async with self.db.connection() as conn:
                await self.recheck(conn, sorted(due, key=str))
        finally:
            # the re-read moved live sessions' expiries on: look again at the next tick
            self.earliest = now
