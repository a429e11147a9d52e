"""Operating the system (HTTP admin API and the CLI): runs, handlers, status,
replicas, and the health reads (failover watch, metrics sampler)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from .columns import HANDLER_COLUMNS, RUN_DETAIL_COLUMNS, RUN_VIEW_COLUMNS
from .pool import LOG, PoolBase, Row


def _since(since: Any) -> tuple[Any, timedelta | None]:
    """A run filter's ``since``: a datetime, or a timedelta meaning "that long before
    now()" on the database's clock: (at, ago) for coalesce(at, now() - ago)."""
    return (None, since) if isinstance(since, timedelta) else (since, None)


class OperateQueries(PoolBase):
    """Runs (list, show, cancel, retry), handlers (pause, resume), status, replicas."""

    async def list_runs(self, status: str | None = None, handler: str | None = None, task: str | None = None,
                        since: Any = None, limit: int = 50, before_id: int | None = None) -> list[Row]:
        """``since``: a datetime, or a timedelta meaning "that long before now()" (the
        database's clock, not this process's)."""
        return await self.fetchall(
            f"SELECT {RUN_VIEW_COLUMNS} FROM switchboard.list_runs(%s, %s, %s, "
            "coalesce(%s::timestamptz, now() - %s::interval), %s, %s)",
            (status, handler, task, *_since(since), limit, before_id))

    async def get_run(self, run_id: int) -> Row | None:
        return await self.fetchone(f"SELECT {RUN_DETAIL_COLUMNS} FROM switchboard.runs WHERE id = %s", (run_id,))

    async def cancel_run(self, run_id: int, actor: str | None = None) -> tuple[bool, Row | None]:
        """cancel_run(), then the run as it is now. Admins hear run.updated iff it changed.
        ``actor`` (who asked: an admin's username) goes into the run's error text."""
        async def op(conn: psycopg.AsyncConnection[Row]) -> tuple[bool, Row | None]:
            if actor:
                await conn.execute("SELECT set_config('switchboard.actor', %s, true)", (actor,))
            cur = await conn.execute("SELECT switchboard.cancel_run(%s) AS ok", (run_id,))
            row = await cur.fetchone()
            ok = bool(row and row["ok"])
            if ok:
                await self._announce_run(conn, run_id)
            cur = await conn.execute(f"SELECT {RUN_DETAIL_COLUMNS} FROM switchboard.runs WHERE id = %s",
                                     (run_id,))
            return ok, await cur.fetchone()
        return await self._transaction(op)

    async def retry_run(self, run_id: int) -> Row:
        """retry_run(): the new queued run. Admins hear run.updated."""
        async def op(conn: psycopg.AsyncConnection[Row]) -> Row:
            cur = await conn.execute("SELECT id FROM switchboard.retry_run(%s)", (run_id,))
            row = await cur.fetchone()
            assert row is not None      # retry_run returns its run or raises
            await self._announce_run(conn, row["id"])
            cur = await conn.execute(f"SELECT {RUN_DETAIL_COLUMNS} FROM switchboard.runs WHERE id = %s",
                                     (row["id"],))
            run = await cur.fetchone()
            assert run is not None
            return run
        return await self._transaction(op)

    async def retry_runs(self, status: str, handler: str | None, task: str | None, since: Any,
                         max_rows: int) -> list[Row]:
        """retry_runs(): (run_id, retry_id) per retry made (``since`` as list_runs takes it). No run.updated per run (a bulk
        call may make thousands): the console's run feed reads the changes."""
        return await self.fetchall(
            "SELECT run_id, retry_id FROM switchboard.retry_runs(%s, %s, %s, "
            "coalesce(%s::timestamptz, now() - %s::interval), %s)", (status, handler, task, *_since(since), max_rows))

    async def cancel_runs(self, status: str, handler: str | None, task: str | None, since: Any, max_rows: int,
                          actor: str | None = None) -> list[int]:
        """cancel_runs(): the ids cancelled; ``actor`` goes into each run's error text."""
        async def op(conn: psycopg.AsyncConnection[Row]) -> list[int]:
            if actor:
                await conn.execute("SELECT set_config('switchboard.actor', %s, true)", (actor,))
            cur = await conn.execute("SELECT id FROM switchboard.cancel_runs(%s, %s, %s, "
                                     "coalesce(%s::timestamptz, now() - %s::interval), %s) AS id",
                                     (status, handler, task, *_since(since), max_rows))
            return [r["id"] for r in await cur.fetchall()]
        return await self._transaction(op)

    @staticmethod
    async def _announce_run(conn: psycopg.AsyncConnection[Row], run_id: int) -> None:
        """run.updated to every admin, last in the operator's transaction (notify_* hold the
        event-order lock until commit). In a savepoint: if publishing fails (55P03 while
        another publisher holds the lock) the operator's action still commits; a console
        that missed the event sees the change on its next read."""
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT switchboard.notify_admins('run.updated', "
                    "jsonb_build_object('run', to_jsonb(v) - 'args' - 'result' - 'duration')) "
                    "FROM switchboard.runs v WHERE v.id = %s", (run_id,))
        except psycopg.Error as exc:
            LOG.warning("run %s: run.updated not published (%s)", run_id, str(exc).strip())

    async def pause_handler(self, name: str) -> bool:
        return bool(await self.scalar("SELECT switchboard.pause_handler(%s)", (name,)))

    async def resume_handler(self, name: str) -> bool:
        return bool(await self.scalar("SELECT switchboard.resume_handler(%s)", (name,)))

    async def list_handlers(self) -> list[Row]:
        return await self.fetchall(f"SELECT {HANDLER_COLUMNS} FROM switchboard.handlers ORDER BY handler")

    async def get_handler(self, name: str) -> Row | None:
        return await self.fetchone(f"SELECT {HANDLER_COLUMNS} FROM switchboard.handlers WHERE handler = %s",
                                   (name,))

    async def status(self) -> list[Row]:
        return await self.fetchall("SELECT item, value FROM switchboard.status()")

    async def list_replicas(self) -> list[Row]:
        return await self.fetchall(
            "SELECT id, info, started_at, heartbeat_at, sockets, version, handlers FROM switchboard.replicas "
            "ORDER BY started_at, id")

    async def db_instance(self) -> Row | None:
        """Timeline, recovery state, start time and UNLOGGED-state epoch of the server."""
        return await self.fetchone("SELECT * FROM switchboard.db_instance()")

    async def metrics_snapshot(self, timeout: float = 2.0) -> dict[str, float]:
        # pg_notification_queue_usage() beside the snapshot, in the same round trip: a
        # session that LISTENs and never reads (idle in transaction) pins the queue, and
        # when it is full every NOTIFY -- every event, announcement and wake-up -- fails
        # at COMMIT (docs/how-to/operations/runbooks.md#switchboardnotifyqueuefilling).
        rows = await self.fetchall("SELECT item, value FROM switchboard.metrics_snapshot() "
                                   "UNION ALL SELECT 'notification_queue_usage', "
                                   "pg_catalog.pg_notification_queue_usage()", timeout=timeout)
        return {r["item"]: r["value"] for r in rows}
