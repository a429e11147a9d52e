"""/rooms/{room}/members and /rooms/{room}/members/{user_id}."""

from __future__ import annotations

import uuid

import falcon

from ..auth import AuthState
from ..db import Database
from .common import authenticate, require_admin


class RoomMember:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_put(self, req: falcon.Request, resp: falcon.Response, room: str, user_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        await self.db.add_room_member(room, user_id)
        resp.status = falcon.HTTP_204

    async def on_delete(self, req: falcon.Request, resp: falcon.Response, room: str,
                        user_id: uuid.UUID) -> None:
        require_admin(self.auth, req)
        if not await self.db.remove_room_member(room, user_id):
            raise falcon.HTTPNotFound(title="Not Found", description=f"{user_id} is not a member of {room}")
        resp.status = falcon.HTTP_204


class RoomMembers:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response, room: str) -> None:
        p = authenticate(self.auth, req)
        if not p.is_admin and not await self.db.is_room_member(room, p.user_id):
            raise falcon.HTTPForbidden(title="Forbidden", description=f"not a member of room {room}")
        members = await self.db.room_members(room)
        if not members and not await self.db.room_exists(room):
            raise falcon.HTTPNotFound(title="Not Found", description=f"room {room} does not exist")
        resp.media = {"room": room, "members": [
            {"user_id": str(m["user_id"]), "username": m["username"], "online": m["online"]} for m in members]}
