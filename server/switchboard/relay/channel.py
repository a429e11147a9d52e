"""The live path's key and the channel this relay LISTENs on (V0025).

The channel is named after the key, so it moves with every rotation. ``LiveChannel``
owns the I/O of that: it reads the key (after a LISTEN reconnect, on the {"live"}
hint, at the idle checks; never because a message does not verify), LISTENs on the
new key's channel BEFORE the merge learns of it (what was sent on it before the
LISTEN took effect is read, never lost), UNLISTENs the channel the merge lets go,
and, while the merge settles, asks the database whether every transaction open at
the key read has ended (``LiveMerge.settle``: a publisher may still send on a channel
this relay does not hear -- the previous one, or one of a key it never knew when two
rotations came between two of its key reads). The rules are the merge's (live.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from ..db import Database
from ..metrics import Metrics
from .listener import NotifyListener
from .live import LiveMerge

LOG = logging.getLogger("switchboard.relay")


class LiveChannel:
    SETTLE_WARN = 60.0      # s of settling after which the transaction it waits for is logged

    def __init__(self, db: Database, listener: NotifyListener, live: LiveMerge, metrics: Metrics) -> None:
        self.db = db
        self.listener = listener
        self.live = live
        self.metrics = metrics
        self._settling_since = 0.0    # monotonic time the merge started settling
        self._warned = False

    async def connected(self, rconn: psycopg.AsyncConnection[Any]) -> None:
        """First thing on a new session (nothing is dispatched meanwhile): read the key,
        LISTEN on its channel on the new LISTEN connection, tell the merge."""
        key, channel, since, xmax = await self._read_key(rconn)
        if channel is not None:
            await self._listen(channel, True)
        self.live.reconnected(key, channel, since, xmax)
        self._started_settling()

    async def rekey(self, rconn: psycopg.AsyncConnection[Any]) -> bool:
        """Re-read the key; if it changed (a rotation, the path switched), LISTEN on the new
        key's channel FIRST, then tell the merge (LiveMerge.rotated: a barrier, and it
        settles), then UNLISTEN the old channel. True if the key changed."""
        key, channel, _, xmax = await self._read_key(rconn)
        if channel == self.live.channel:
            return False
        if channel is not None:
            await self._listen(channel, True)
        old = self.live.rotated(key, channel, xmax)
        if old is not None:
            await self._listen(old, False)
        self._started_settling()
        return True

    async def settle(self, rconn: psycopg.AsyncConnection[Any]) -> bool:
        """Before a read, while the merge settles: has every transaction open at the key
        read ended? Then the merge raises its last barrier (True), which the next read
        with a tick covers."""
        if self.live.settling is None:
            return False
        xmin = await self.db.relay_oldest_xid(rconn)
        if self.live.settle(xmin):
            return True
        if not self._warned and time.monotonic() - self._settling_since > self.SETTLE_WARN:
            self._warned = True
            LOG.warning("live path: transaction %d, open since before the key was read, has not ended "
                        "after %.0f s; events are delivered by reads, not live, until it does "
                        "(pg_stat_activity.backend_xid)", xmin, self.SETTLE_WARN)
        return False

    async def _read_key(self, rconn: psycopg.AsyncConnection[Any]) -> tuple[bytes | None, str | None, int, int]:
        self.metrics.inc("switchboard_live_key_reads_total")
        return await self.db.relay_live_key(rconn)

    async def _listen(self, channel: str, listening: bool) -> None:
        await self.listener.on_listen_connection(
            lambda conn: self.db.relay_live_listen(conn, channel, listening))

    def _started_settling(self) -> None:
        self._settling_since = time.monotonic()
        self._warned = False
