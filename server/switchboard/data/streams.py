"""Streams (db/functions/55_streams.sql): open, the group append, renew, close, stop,
the reads the hub and the SSE endpoint make, and whether a reader may see one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from .pool import PoolBase, Row


class StreamQueries(PoolBase):
    """Every statement of the streams feature; each one calls a switchboard.stream_* function."""

    async def stream_open(self, user_id: UUID, kind: str, meta: dict[str, Any] | None, room: str | None,
                          lease_s: float, lifetime_s: float) -> UUID:
        sid = await self.scalar(
            "SELECT switchboard.stream_open(%s, %s, %s, %s, make_interval(secs => %s), make_interval(secs => %s))",
            (user_id, kind, Jsonb(meta or {}), room, lease_s, lifetime_s))
        return UUID(str(sid))

    async def stream_append_many(self, ids: Sequence[UUID], chunks: Sequence[str]) -> list[tuple[Any, ...]]:
        """(stream_id, last_seq, status, accepted) per stream, in one statement."""
        return await self._tuples("SELECT * FROM switchboard.stream_append_many(%s, %s)", (list(ids), list(chunks)))

    async def stream_renew(self, ids: Sequence[UUID]) -> int:
        return int(await self.scalar("SELECT switchboard.stream_renew(%s)", (list(ids),)) or 0)

    async def stream_close(self, sid: UUID, status: str, final: Any) -> int:
        return int(await self.scalar("SELECT switchboard.stream_close(%s, %s, %s)",
                                     (sid, status, None if final is None else Jsonb(final))))

    async def stream_stop(self, sid: UUID, by_user: UUID | None) -> str:
        return str(await self.scalar("SELECT switchboard.stream_stop(%s, %s)", (sid, by_user)))

    async def stream_info(self, sid: UUID, reader: UUID | None) -> Row:
        """The stream's row; psycopg.errors.NoDataFound (P0002) if it is unknown or not the reader's."""
        row = await self.fetchone("SELECT * FROM switchboard.stream_info(%s, %s)", (sid, reader))
        assert row is not None  # stream_info raises P0002 rather than return nothing
        return row

    async def stream_statuses(self, ids: Sequence[UUID]) -> dict[UUID, str]:
        """The status of each stream that still exists (the producer's stop check)."""
        rows = await self._tuples("SELECT id, status FROM switchboard.streams WHERE id = ANY(%s)", (list(ids),))
        return {r[0]: r[1] for r in rows}

    async def stream_read_many(self, ids: Sequence[UUID], afters: Sequence[int],
                               max_rows: int) -> list[tuple[Any, ...]]:
        """(stream_id, status, last_seq, final, end_event, first_seq, chunks) per stream that exists: its
        state and its chunks after afters[i] from seq first_seq, in one snapshot."""
        return await self._tuples("SELECT * FROM switchboard.stream_read_many(%s, %s, %s)",
                                  (list(ids), list(afters), max_rows))

    async def streams_of(self, user_id: UUID) -> list[Row]:
        return await self.fetchall("SELECT * FROM switchboard.streams_of(%s)", (user_id,))
