"""POST /tools/call: ask a user's browser to run a tool and wait for its answer (admin)."""

from __future__ import annotations

import json

import falcon

from ..auth import AuthState
from ..tools import ToolBridge
from .common import check_fields, field_str, parse_uuid, read_json, require_admin, unprocessable


class ToolCall:
    def __init__(self, tools: ToolBridge, auth: AuthState, max_body: int) -> None:
        self.tools = tools
        self.auth = auth
        self.max_body = max_body

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        require_admin(self.auth, req)
        body = await read_json(req, self.max_body)
        check_fields(body, {"user_id", "name", "args", "timeout_ms"})
        user_id = parse_uuid(body.get("user_id"), "user_id")
        name = field_str(body, "name", max_len=100)
        args = body.get("args", {})
        timeout_ms = body.get("timeout_ms", 10000)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not 1 <= timeout_ms <= 600000:
            raise unprocessable("'timeout_ms' must be an integer between 1 and 600000")
        if len(json.dumps(args)) > 6000:
            raise unprocessable("'args' must serialise to at most 6000 bytes")
        result = await self.tools.call(user_id, name, args, timeout_ms)
        resp.media = {"result": result}
