"""Room membership."""

from __future__ import annotations

from typing import cast
from uuid import UUID

from .pool import PoolBase, Row


class RoomQueries(PoolBase):
    """Is a member, add, remove, who is in a room."""

    async def is_room_member(self, room: str, user_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.is_room_member(%s, %s)", (room, user_id)))

    async def add_room_member(self, room: str, user_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.add_room_member(%s, %s)", (room, user_id)))

    async def remove_room_member(self, room: str, user_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.remove_room_member(%s, %s)", (room, user_id)))

    async def room_members(self, room: str) -> list[Row]:
        return await self.fetchall("SELECT * FROM switchboard.room_members_online(%s)", (room,))

    async def room_exists(self, room: str) -> bool:
        return bool(await self.scalar("SELECT EXISTS (SELECT 1 FROM switchboard.rooms WHERE name = %s)", (room,)))
