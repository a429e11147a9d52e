"""Tool bridge: POST /tools/call on any replica, answered by the user's browser
on whichever replica holds its socket.

The call is registered in switchboard.tool_calls (user, waiting replica) by
tool_call_start(), which also sends tool.call.<id> to the user's sockets. The
answer is accepted by tool_call_answer() only from that user and only once;
it wakes this replica via switchboard_control, and the waiter collects the
result with tool_call_take(). A waiter only ever sees its own call id.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import falcon

from .db import Database


class ToolCallLost(Exception):
    """The call's row vanished with PostgreSQL's UNLOGGED state (crash recovery or promotion)."""


class ToolBridge:
    def __init__(self, db: Database, replica_id: str) -> None:
        self.db = db
        self.replica_id = replica_id
        self._waiters: dict[uuid.UUID, asyncio.Future[None]] = {}
        self._early: set[uuid.UUID] = set()

    def resolve(self, call_id: uuid.UUID) -> None:
        fut = self._waiters.get(call_id)
        if fut is None:
            self._early.add(call_id)
            return
        if not fut.done():
            fut.set_result(None)

    def fail_all(self, reason: str) -> int:
        """Fail every waiting call now (their rows are gone; they could only time out)."""
        n = 0
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(ToolCallLost(reason))
                n += 1
        return n

    def database_reset(self) -> None:
        self.fail_all("the database failed over or restarted and lost in-flight tool calls")

    async def call(self, user_id: uuid.UUID, name: str, args: Any, timeout_ms: int) -> Any:
        db = self.db
        timeout = timeout_ms / 1000.0
        call_id = await db.tool_call_start(user_id, self.replica_id, name, args, timeout)
        if call_id is None:
            raise falcon.HTTPNotFound(title="Not Found",
                                      description=f"user {user_id} has no open socket on any replica")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = fut
        if call_id in self._early:
            self._early.discard(call_id)
            fut.set_result(None)
        try:
            try:
                await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                pass
            except ToolCallLost as exc:
                raise falcon.HTTPServiceUnavailable(
                    title="Service Unavailable", retry_after=1,
                    description=f"tool call {call_id} was lost: {exc}; nothing was answered, call again") from None
            row = await db.tool_call_take(call_id)
        finally:
            self._waiters.pop(call_id, None)
            self._early.discard(call_id)
        if row is None or not row["answered"]:
            raise falcon.HTTPGatewayTimeout(title="Gateway Timeout",
                                            description=f"no answer from the user within {timeout_ms} ms")
        return row["result"]
