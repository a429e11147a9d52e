"""Replicas: their heartbeat and handler catalog, presence, and tool calls routed
to a user's socket on some replica."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast
from uuid import UUID

from psycopg.types.json import Jsonb

from .pool import PoolBase, Row


class ReplicaQueries(PoolBase):
    """Heartbeat, stop, known handlers, presence, tool calls."""

    async def replica_heartbeat(self, replica_id: str, info: dict[str, Any], handlers: list[str],
                                interval: float, version: str) -> None:
        await self.fetchone("SELECT switchboard.replica_heartbeat(%s, %s, %s::text[], %s, %s)",
                            (replica_id, Jsonb(info), handlers, timedelta(seconds=interval), version))

    async def known_handlers(self, version: str | None) -> list[str]:
        """Handlers some live replica registers (of ``version``; None: any version)."""
        rows = await self.fetchall("SELECT h FROM switchboard.known_handlers(%s) AS h", (version,))
        return [r["h"] for r in rows]

    async def replica_stop(self, replica_id: str) -> None:
        await self.fetchone("SELECT switchboard.replica_stop(%s)", (replica_id,))

    async def presence_set(self, replica_id: str, user_id: UUID, sockets: int) -> None:
        await self.fetchone("SELECT switchboard.presence_set(%s, %s, %s)", (replica_id, user_id, sockets))

    async def presence_sync(self, replica_id: str, users: list[UUID], counts: list[int]) -> None:
        await self.fetchone("SELECT switchboard.presence_sync(%s, %s, %s)", (replica_id, users, counts))

    async def presence_track(self, replica_id: str, conn: int, user_id: UUID, room: str | None,
                             meta: dict[str, Any] | None) -> None:
        """Connection ``conn`` tracks itself in ``room`` with ``meta`` (None: untracks; room None too:
        everywhere)."""
        await self.fetchone("SELECT switchboard.presence_track(%s, %s, %s, %s, %s)",
                            (replica_id, conn, user_id, room, None if meta is None else Jsonb(meta)))

    async def presence_meta_sync(self, replica_id: str, tracked: list[dict[str, Any]]) -> None:
        await self.fetchone("SELECT switchboard.presence_meta_sync(%s, %s)", (replica_id, Jsonb(tracked)))

    async def presence_of_rooms(self, rooms: list[str], max_members: int) -> list[Row]:
        """(room, user_id, username, metas) of the online members of each room."""
        return await self.fetchall("SELECT * FROM switchboard.presence_of_rooms(%s::text[], %s)",
                                   (rooms, max_members))

    async def tool_call_send(self, user_id: UUID, replica_id: str, name: str, args: Any,
                             timeout: float) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT switchboard.tool_call_send(%s, %s, %s, %s, %s)",
                                 (user_id, replica_id, name, Jsonb(args), timedelta(seconds=timeout))))

    async def tool_call_answer(self, call_id: UUID, sender: UUID, result: Any) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.tool_call_answer(%s, %s, %s)",
                                 (call_id, sender, Jsonb(result))))

    async def tool_call_collect(self, call_id: UUID, give_up: bool = False) -> Row | None:
        return await self.fetchone("SELECT * FROM switchboard.tool_call_collect(%s, %s)", (call_id, give_up))
