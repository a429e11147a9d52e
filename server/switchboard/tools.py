"""Tool bridge: POST /tools/call on any replica, answered by the user's browser
on whichever replica holds its socket.

The call is registered in switchboard.tool_calls (user, waiting replica) by
tool_call_send(), which also sends tool.call.<id> to the user's sockets. The
answer is accepted by tool_call_answer() only from that user and only once;
it wakes this replica via switchboard_control, and the waiter collects the
result with tool_call_collect() (nothing until it is really answered:
the wake-up is a NOTIFY, and anybody may forge one). A waiter only ever sees its own call id.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from typing import Any

from .db import Database
from .domain_errors import NotFound, ToolCallLost, ToolCallTimeout


class ToolBridge:
    """Waiters for tool calls started on this replica.

    A wake-up (``resolve``) comes from a NOTIFY, which anybody who can connect
    may forge: it only makes the waiter look. The answer is whatever
    tool_call_collect() returns, and that function returns nothing for an
    unanswered call, so a forged wake-up leaves the call waiting.
    """

    EARLY_MAX = 1024

    def __init__(self, db: Database, replica_id: str) -> None:
        self.db = db
        self.replica_id = replica_id
        self._waiters: dict[uuid.UUID, asyncio.Event] = {}
        # Wake-ups that overtook their waiter's registration. Bounded: forged call
        # ids must not grow it without limit.
        self._early: OrderedDict[uuid.UUID, None] = OrderedDict()
        self._lost: set[uuid.UUID] = set()      # waiting calls the database lost

    def resolve(self, call_id: uuid.UUID) -> None:
        ev = self._waiters.get(call_id)
        if ev is None:
            self._early[call_id] = None
            while len(self._early) > self.EARLY_MAX:
                self._early.popitem(last=False)
            return
        ev.set()

    def database_reset(self) -> None:
        """PostgreSQL lost its UNLOGGED state (crash recovery or a promotion): every waiting
        call's row is gone and no answer can arrive. Fail them now (503) instead of letting
        them wait out their timeout (504). Called by the failover watch, never by a NOTIFY."""
        for call_id, ev in self._waiters.items():
            self._lost.add(call_id)
            ev.set()

    async def call(self, user_id: uuid.UUID, name: str, args: Any, timeout_ms: int) -> Any:
        db = self.db
        timeout = timeout_ms / 1000.0
        deadline = time.monotonic() + timeout
        call_id = await db.tool_call_send(user_id, self.replica_id, name, args, timeout)
        if call_id is None:
            raise NotFound(f"user {user_id} has no open socket on any replica")
        ev = asyncio.Event()
        self._waiters[call_id] = ev
        if self._early.pop(call_id, False) is None:
            ev.set()
        row = None
        try:
            while row is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(ev.wait(), left)
                except asyncio.TimeoutError:
                    break
                ev.clear()
                if call_id in self._lost:
                    raise ToolCallLost(
                        f"tool call {call_id} was lost: the database failed over or restarted "
                        "and lost in-flight tool calls; nothing was answered, call again", retry_after=1)
                row = await db.tool_call_collect(call_id)  # None unless really answered
            if row is None:
                row = await db.tool_call_collect(call_id, give_up=True)
        finally:
            self._waiters.pop(call_id, None)
            self._early.pop(call_id, None)
            self._lost.discard(call_id)
        if row is None or not row["answered"]:
            raise ToolCallTimeout(f"no answer from the user within {timeout_ms} ms")
        return row["result"]
