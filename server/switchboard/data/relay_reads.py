"""The relay's own reads.

On the relay's dedicated reader connection (not the request pool: a busy pool
must not delay delivery). NOTIFY payloads are hints; these reads are what a
replica acts on (docs/explanation/security.md). Static methods: the caller passes its
connection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg

from .pool import Row


class RelayReads:
    """(The event pages themselves: relay/reads.py.) The live key, the auth snapshot and the checks of
    what a replica holds (user states, revocations, room memberships)."""

    @staticmethod
    async def relay_live_key(conn: psycopg.AsyncConnection[Any]) -> tuple[bytes | None, str | None, int, int]:
        """The live path's HMAC key and its channel (V0025; both None while the path is
        off), the database clock in epoch milliseconds (the clock live messages are
        stamped with), and xmax of the snapshot the key was read in (every transaction
        that read an older key has an xid below it: relay/live.py, settling)."""
        cur = await conn.execute("SELECT k.key, k.channel, "
                                 "(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms, "
                                 "pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax "
                                 "FROM switchboard.relay_live_key() k")
        row = await cur.fetchone()
        assert row is not None
        key, channel = row["key"], row["channel"]
        return ((None if key is None else bytes(key)), (None if key is None else str(channel)),
                int(row["now_ms"]), int(row["xmax"]))

    @staticmethod
    async def relay_oldest_xid(conn: psycopg.AsyncConnection[Any]) -> int:
        """The oldest transaction still open in the cluster (pg_snapshot_xmin() of a
        snapshot taken now): every xid below it has committed or aborted."""
        cur = await conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin")
        row = await cur.fetchone()
        assert row is not None
        return int(row["xmin"])

    @staticmethod
    async def relay_live_listen(conn: psycopg.AsyncConnection[Any], channel: str, listening: bool) -> None:
        """LISTEN (or UNLISTEN) on a live channel, on the LISTEN connection ``conn``. The
        name is a bound parameter: it never appears in pg_stat_activity's query text."""
        await conn.execute("SELECT switchboard.relay_live_listen(%s, %s)", (channel, listening))

    @staticmethod
    async def relay_ephemeral_missed(conn: psycopg.AsyncConnection[Any], lookback: float,
                                     max_rows: int) -> list[int]:
        cur = await conn.execute("SELECT id FROM switchboard.relay_ephemeral_missed(%s, %s)",
                                 (timedelta(seconds=lookback), max_rows))
        return [int(r["id"]) for r in await cur.fetchall()]

    @staticmethod
    async def event_window_on(conn: psycopg.AsyncConnection[Any]) -> Row:
        cur = await conn.execute("SELECT first_tick, last_tick, reaped_through, publishers_notify FROM switchboard.event_window()")
        row: Row | None = await cur.fetchone()
        assert row is not None
        return row

    @staticmethod
    async def auth_snapshot(conn: psycopg.AsyncConnection[Any], since_seconds: int) -> list[Row]:
        cur = await conn.execute("SELECT * FROM switchboard.auth_snapshot_v3(%s)", (timedelta(seconds=since_seconds),))
        return await cur.fetchall()

    @staticmethod
    async def user_states(conn: psycopg.AsyncConnection[Any], user_ids: list[UUID]) -> list[Row]:
        cur = await conn.execute("SELECT user_id, role, disabled, token_epoch FROM switchboard.user_states(%s)",
                                 (user_ids,))
        return await cur.fetchall()

    @staticmethod
    async def revoked_among(conn: psycopg.AsyncConnection[Any], jtis: list[str]) -> list[Row]:
        cur = await conn.execute("SELECT jti, expires_at FROM switchboard.revoked_among(%s)", (jtis,))
        return await cur.fetchall()

    @staticmethod
    async def still_members(conn: psycopg.AsyncConnection[Any], pairs: list[tuple[str, UUID]]) -> set[tuple[str, UUID]]:
        cur = await conn.execute(
            "SELECT t.room, t.user_id FROM unnest(%s::text[], %s::uuid[]) AS t(room, user_id) "
            "WHERE switchboard.is_room_member(t.room, t.user_id)",
            ([p[0] for p in pairs], [p[1] for p in pairs]))
        return {(r["room"], r["user_id"]) for r in await cur.fetchall()}
