"""The replica heartbeat: this replica is alive, and these users have sockets here.

Every ``heartbeat_interval`` seconds: replica_heartbeat() (the replicas row
other replicas and status() read: with the handler names this replica's
scheduler runs, the interval its liveness window is derived from, and the
server version), presence_sync() (repairs any presence row a
failed presence_set left wrong), the ``also`` callbacks (presence.py's sync of
the tracked presence metadata), and a prune of the auth cache.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence

from .auth import AuthState
from .db import Database
from .sockets import Registry
from .replica import ReplicaState

LOG = logging.getLogger("switchboard.heartbeat")


class ReplicaHeartbeat:
    def __init__(self, db: Database, registry: Registry, auth: AuthState, replica: ReplicaState,
                 interval: float, handlers: list[str], version: str,
                 also: Sequence[Callable[[], Awaitable[None]]] = ()) -> None:
        self.db = db
        self.also = list(also)
        self.handlers = handlers
        self.version = version
        self.registry = registry
        self.auth = auth
        self.replica = replica
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register before serving: the first beat runs before start() returns
        (bounded), so a replica that answers ready is already in the registry,
        and status()/metrics never count a ready replica as absent."""
        try:
            await asyncio.wait_for(self.beat(), 5)
        except Exception as exc:  # Postgres down at start: the loop keeps trying
            LOG.debug("first heartbeat failed: %s", exc)
        self._task = asyncio.create_task(self._loop(), name="heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await asyncio.wait_for(self.db.replica_stop(self.replica.replica_id), 3)
        except Exception:
            pass

    async def beat(self) -> None:
        rid = self.replica.replica_id
        users = list(self.registry.by_user.keys())
        counts = [len(self.registry.by_user[u]) for u in users]
        # draining: GET /status shows another replica's readiness from its last heartbeat.
        info = {"host": socket.gethostname(), "pid": os.getpid(), "sockets": self.registry.count,
                "draining": self.replica.draining}
        await self.db.replica_heartbeat(rid, info, self.handlers, self.interval, self.version)
        await self.db.presence_sync(rid, users, counts)
        for fn in self.also:
            await fn()
        self.auth.prune()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
            except Exception as exc:
                LOG.debug("heartbeat failed: %s", exc)
