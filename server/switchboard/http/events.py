"""POST /events: publish to a user or a room (admin)."""

from __future__ import annotations

import json

import falcon

from ..auth import AuthState
from ..db import Database
from .common import check_fields, field_str, parse_uuid, read_json, require_admin, unprocessable


class Events:
    def __init__(self, db: Database, auth: AuthState, max_body: int) -> None:
        self.db = db
        self.auth = auth
        self.max_body = max_body

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        require_admin(self.auth, req)
        body = await read_json(req, self.max_body)
        check_fields(body, {"user_id", "room", "event", "payload"})
        event = field_str(body, "event", max_len=128)
        payload = body.get("payload", {})
        if len(json.dumps(payload)) > 1024 * 1024:
            raise falcon.HTTPContentTooLarge(title="Content Too Large",
                                             description="event payloads are limited to 1 MiB")
        if ("user_id" in body) == ("room" in body):
            raise unprocessable("give exactly one of 'user_id' or 'room'")
        if "user_id" in body:
            eid = await self.db.notify_user(parse_uuid(body["user_id"], "user_id"), event, payload)
        else:
            room = field_str(body, "room", max_len=128)
            eid = await self.db.notify_room(room, event, payload)
        resp.status = falcon.HTTP_202
        resp.media = {"id": eid}
