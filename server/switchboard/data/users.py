"""Users as the CLI manages them (create, password, role, disable/enable)."""

from __future__ import annotations

from typing import cast
from uuid import UUID

from .pool import PoolBase


class UserQueries(PoolBase):
    """The CLI's user chores."""

    async def find_user_id(self, username: str) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT id FROM switchboard.find_user(%s)", (username,)))

    async def create_user(self, username: str, password_hash: str, role: str) -> UUID:
        return cast("UUID", await self.scalar("SELECT switchboard.create_user(%s, %s, %s)", (username, password_hash, role)))

    async def set_user_password_hash(self, user_id: UUID, password_hash: str) -> None:
        await self.fetchone("SELECT switchboard.set_user_password_hash(%s, %s)", (user_id, password_hash))

    async def set_user_role(self, user_id: UUID, role: str) -> None:
        await self.fetchone("SELECT switchboard.set_user_role(%s, %s)", (user_id, role))

    async def disable_user(self, user_id: UUID) -> None:
        await self.fetchone("SELECT switchboard.disable_user(%s)", (user_id,))

    async def enable_user(self, user_id: UUID) -> None:
        await self.fetchone("SELECT switchboard.enable_user(%s)", (user_id,))
