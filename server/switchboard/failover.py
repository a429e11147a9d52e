"""Noticing that PostgreSQL failed over, restarted, or lost its UNLOGGED state.

Every time the relay's LISTEN connection (re)connects -- which it must after any
failover, since the old primary's sessions die -- ``observe()`` asks the server
``switchboard.db_instance()``: its WAL timeline, start time and the UNLOGGED
epoch (a marker row in an UNLOGGED table, so it vanishes exactly when crash
recovery or a promotion empties tickets, rate buckets, the replica registry,
presence and tool calls). Compared with what this replica saw last:

- a new timeline: a promotion happened (failover, switchover, or Patroni's
  restart-and-promote of a crashed primary) -> ``switchboard_db_failovers_total``;
- a new start time: the server restarted, or is another server -> ``..._restarts_total``;
- a new UNLOGGED epoch: that state is gone -> ``..._unlogged_resets_total`` and the
  ``on_unlogged_reset`` callbacks run at once: waiting tool calls fail fast (their
  rows are gone; they would only time out) and the heartbeat re-registers this
  replica and its presence (socket counts, and the metadata its sockets track:
  presence.py) now instead of at its next beat.

The first observation of a process only sets the baseline.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg

from .db import Database
from .metrics import Metrics

LOG = logging.getLogger("switchboard.failover")
Callback = Callable[[], Awaitable[None] | None]


class FailoverWatch:
    def __init__(self, db: Database, metrics: Metrics, on_unlogged_reset: list[Callback]) -> None:
        self.db = db
        self.metrics = metrics
        self.on_unlogged_reset = on_unlogged_reset
        self.timeline: int | None = None
        self.started_at: datetime | None = None
        self.unlogged_since: datetime | None = None
        self.last_change: float = 0.0            # epoch seconds of the last change observed
        self._check: asyncio.Task[Any] | None = None
        metrics.set("switchboard_db_timeline", float("nan"))

    async def observe(self, conn: psycopg.AsyncConnection[Any] | None = None) -> None:
        """Never raises: the watch observes; a replica whose schema predates db_instance()
        (started with --no-migrate during a rolling update) must still become ready.

        ``conn``: the relay's reader connection (beside its LISTEN one), just opened. Asking on it (not through the
        pool) describes exactly the server the relay now listens on, and it is fresh: a
        pooled connection may still be one the restart killed (the first query on it fails)."""
        try:
            row = await self._instance(conn)
        except Exception as exc:
            LOG.warning("cannot tell whether PostgreSQL failed over (switchboard.db_instance(): %s)",
                        str(exc).strip() or type(exc).__name__)
            return
        if row is None or row["in_recovery"]:
            # reached a standby (a Service that has not moved yet): nothing to compare,
            # and its empty UNLOGGED tables say nothing about the primary's
            return
        tl, started, since = row["timeline"], row["started_at"], row["unlogged_since"]
        first = self.started_at is None
        prev = (self.timeline, self.started_at, self.unlogged_since)
        self.timeline, self.started_at, self.unlogged_since = tl, started, since
        if tl is not None:
            self.metrics.set("switchboard_db_timeline", float(tl))
        if first:
            return
        changed = False
        if tl is not None and prev[0] is not None and tl != prev[0]:
            changed = True
            self.metrics.inc("switchboard_db_failovers_total")
            LOG.warning("PostgreSQL failed over: timeline %s -> %s", prev[0], tl)
        if started != prev[1]:
            changed = True
            self.metrics.inc("switchboard_db_restarts_total")
            LOG.warning("PostgreSQL restarted (or is another server): started %s, before %s", started, prev[1])
        if since != prev[2]:
            changed = True
            await self._unlogged_reset()
        if changed:
            self.last_change = time.time()
            self.metrics.set("switchboard_db_last_change_timestamp_seconds", self.last_change)
            # connections opened to the old server are dead: weed them out now rather
            # than one failed request at a time
            self._check = asyncio.get_running_loop().create_task(self._weed_pool())

    async def _instance(self, conn: psycopg.AsyncConnection[Any] | None) -> dict[str, Any] | None:
        """switchboard.db_instance(), asked on ``conn`` if given, else through the pool."""
        if conn is None:
            return await self.db.db_instance()
        cur = await conn.execute(
            "SELECT timeline, in_recovery, started_at, unlogged_since FROM switchboard.db_instance()")
        rec = await cur.fetchone()
        if rec is None or isinstance(rec, dict):
            return rec
        return dict(zip(("timeline", "in_recovery", "started_at", "unlogged_since"), rec))

    async def _unlogged_reset(self) -> None:
        """Count and log the loss of the UNLOGGED state and run every on_unlogged_reset callback."""
        self.metrics.inc("switchboard_db_unlogged_resets_total")
        LOG.warning("PostgreSQL lost its UNLOGGED state (crash recovery or promotion): tickets, rate "
                    "buckets, replica registry, presence and tool calls start empty")
        for cb in self.on_unlogged_reset:
            try:
                res = cb()
                if inspect.isawaitable(res):
                    await res
            except Exception as exc:  # one callback must not stop the others or the relay
                LOG.warning("after the UNLOGGED reset, %s failed: %s", getattr(cb, "__qualname__", cb), exc)

    async def _weed_pool(self) -> None:
        try:
            await self.db.pool.check()
        except Exception as exc:  # the pool refills by itself; this only speeds it up
            LOG.debug("pool check after a failover: %s", exc)
