"""Which task handlers this deployment can run: the API's check before it
stores a task.

A replica may not run every handler itself (its scheduler may be off, or
workers may load handler modules that API replicas do not), so the answer is
this replica's own handlers (when its scheduler runs) plus every handler a
live replica of the same server version registered with its heartbeat
(switchboard.known_handlers). SQL's create_task stays permissive for DBAs.
"""

from __future__ import annotations

from .db import Database
from .handlers import HandlerRegistry


class HandlerCatalog:
    def __init__(self, db: Database, handlers: HandlerRegistry, version: str, serves_locally: bool) -> None:
        self.db = db
        self.version = version
        self.local = handlers.names() if serves_locally else []

    async def known(self) -> list[str]:
        return sorted(set(self.local) | set(await self.db.known_handlers(self.version)))
