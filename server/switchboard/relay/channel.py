"""The live path's key and the channels this relay LISTENs on (V0025).

The channel is named after the key, so it moves with every rotation. ``LiveChannel``
owns the I/O of that: it reads the key (after a LISTEN reconnect, on the {"live"}
hint, at the idle checks; never because a message does not verify), LISTENs on the
new key's channel BEFORE the merge learns of it (what was sent on it before the
LISTEN took effect is read, never lost), and UNLISTENs the channels the merge lets
go. The rules are the merge's (live.py).
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..db import Database
from ..metrics import Metrics
from .listener import NotifyListener
from .live import LiveMerge


class LiveChannel:
    def __init__(self, db: Database, listener: NotifyListener, live: LiveMerge, metrics: Metrics) -> None:
        self.db = db
        self.listener = listener
        self.live = live
        self.metrics = metrics

    async def connected(self, rconn: psycopg.AsyncConnection[Any]) -> None:
        """First thing on a new session (nothing is dispatched meanwhile): read the key,
        LISTEN on its channel on the new LISTEN connection, tell the merge."""
        key, channel, since = await self._read_key(rconn)
        if channel is not None:
            await self._listen(channel, True)
        self.live.reconnected(key, channel, since)

    async def rekey(self, rconn: psycopg.AsyncConnection[Any]) -> bool:
        """Re-read the key; if it changed (a rotation, the path switched), LISTEN on the new
        key's channel FIRST, then raise the barrier (LiveMerge.rotated): events sent on it
        before the LISTEN took effect were never heard, and the read after the barrier
        covers them, so nothing heard later goes live ahead of them. The previous
        channel stays LISTENed for messages in flight; older ones are UNLISTENed. True if
        the key changed."""
        key, channel, _ = await self._read_key(rconn)
        if channel == self.live.channel:
            return False
        if channel is not None:
            await self._listen(channel, True)
        for old in self.live.rotated(key, channel):
            await self._listen(old, False)
        return True

    async def expire(self) -> None:
        """UNLISTEN the previous key's channel once the merge let it go."""
        for old in self.live.expired_channels():
            await self._listen(old, False)

    async def _read_key(self, rconn: psycopg.AsyncConnection[Any]) -> tuple[bytes | None, str | None, int]:
        self.metrics.inc("switchboard_live_key_reads_total")
        return await self.db.relay_live_key(rconn)

    async def _listen(self, channel: str, listening: bool) -> None:
        await self.listener.on_listen_connection(
            lambda conn: self.db.relay_live_listen(conn, channel, listening))
