"""Logins, WebSocket tickets, sessions (db/functions/62_sessions.sql), token
revocation and the rate limiter's buckets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast
from uuid import UUID

import psycopg

from .pool import PoolBase, Row


class AuthQueries(PoolBase):
    """What auth, the session endpoints, the WebSocket handshake and ratelimit ask."""

    async def login_lookup(self, username: str) -> Row | None:
        return await self.fetchone("SELECT * FROM switchboard.login_lookup_v2(%s)", (username,))

    async def get_user_session(self, user_id: UUID) -> Row | None:
        """The user (id, username, role, disabled) plus token_epoch (read through user_states():
        the app role may not SELECT the column): what a WebSocket remembers when it is accepted."""
        return await self.fetchone(
            "SELECT u.id, u.username, s.role, s.disabled, s.token_epoch FROM switchboard.users u"
            " JOIN switchboard.user_states(ARRAY[%s]::uuid[]) s ON s.user_id = u.id", (user_id,))

    async def revoke_token(self, jti: str, user_id: UUID, expires_at: Any) -> None:
        await self.fetchone("SELECT switchboard.revoke_token(%s, %s, %s)", (jti, user_id, expires_at))

    async def issue_ticket_v2(self, user_id: UUID, session_id: UUID | None, ttl: int) -> str:
        return cast("str", await self.scalar("SELECT switchboard.issue_ticket_v2(%s, %s, %s)",
                                 (user_id, session_id, timedelta(seconds=ttl))))

    async def consume_ticket_v2(self, ticket: str) -> Row | None:
        """{user_id, session_id, session_expires_at}, or None if the ticket is refused."""
        return await self.fetchone("SELECT user_id, session_id, session_expires_at"
                                   " FROM switchboard.consume_ticket_v2(%s)", (ticket,))

    async def start_session_v2(self, user_id: UUID, lifetime: int, max_lifetime: int) -> Row:
        """{session_id, refresh_token, expires_at, max_expires_at} of a new login session."""
        row = await self.fetchone(
            "SELECT session_id, refresh_token, expires_at, max_expires_at FROM switchboard.start_session_v2(%s, %s, %s)",
            (user_id, timedelta(seconds=lifetime), timedelta(seconds=max_lifetime)))
        assert row is not None  # the function returns exactly one row or raises
        return row

    async def refresh_session_v2(self, refresh_token: str, lifetime: int, grace: float, client_fingerprint: bytes,
                                 session_rate: float, session_burst: int) -> Row:
        """The outcome of one refresh (rotated, resent, limited, concurrent, unknown, ended, reused)
        and, for rotated/resent, the user and the session's next refresh token."""
        row = await self.fetchone(
            "SELECT outcome, session_id, user_id, username, role, token_epoch, new_refresh_token, expires_at,"
            " retry_after_ms FROM switchboard.refresh_session_v2(%s, %s, %s, %s, %s, %s)",
            (refresh_token, timedelta(seconds=lifetime), timedelta(seconds=grace), client_fingerprint,
             session_rate, session_burst))
        assert row is not None  # the function returns exactly one row (its outcome) or raises
        return row

    async def end_session(self, session_id: UUID, reason: str = "logout") -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.end_session(%s, %s)", (session_id, reason)))

    async def end_session_by_refresh(self, refresh_token: str) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT switchboard.end_session_by_refresh(%s)", (refresh_token,)))

    @staticmethod
    async def session_states(conn: psycopg.AsyncConnection[Any], session_ids: list[UUID]) -> list[Row]:
        cur = await conn.execute("SELECT session_id, user_id, expires_at, end_reason, live"
                                 " FROM switchboard.session_states(%s)", (session_ids,))
        return await cur.fetchall()

    async def rate_check(self, key: str, rate: float, burst: int, cost: int = 1,
                         timeout: float | None = None) -> Row:
        return await self.fetchone("SELECT * FROM switchboard.rate_check(%s, %s, %s, %s)",
                                   (key, rate, burst, cost), timeout=timeout)  # type: ignore[return-value]  # one row, always
