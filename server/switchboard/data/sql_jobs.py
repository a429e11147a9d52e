"""The sql task's executor: an admin-created statement, run as the restricted job
role on a connection of its own, bounded by its timeout whatever it does.

On its own, beside the request pool: it opens its own connection (to ``job_url``)
for each statement and uses the pool only to terminate a backend that outlived
its timeout. Database.run_job_sql is its entry point.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any, cast

import psycopg
from psycopg.rows import dict_row

from .pool import LOG, PoolBase, Row, conninfo_with_keepalives


class SqlJobTimeout(Exception):
    """A sql task's statement ran into its timeout (cancelled, rolled back or terminated)."""

    def __init__(self, message: str, terminated: bool = False) -> None:
        super().__init__(message)
        self.terminated = terminated


class SqlJobExecutor:
    """Runs sql tasks' statements on connections to ``job_url``; ``db`` is the request
    pool, through which a statement that ignored its timeout is terminated."""

    def __init__(self, job_url: str, db: PoolBase) -> None:
        self.job_url = job_url
        self.db = db
        self._killers: set[asyncio.Future[None]] = set()   # terminate_sql_job calls still to make

    async def run(self, statement: str, timeout_s: float, run_id: int | None = None,
                  grace_s: float = 5.0) -> Row:
        """Run an admin-created task's statement as the restricted job role.

        Through switchboard.run_job_sql(), a SECURITY DEFINER function owned by
        switchboard_job: inside it the statement cannot SET/RESET ROLE back to
        the application role (a plain SET LOCAL ROLE could be undone).

        On a connection of its own, closed afterwards, never a pooled one:
        whatever the statement leaves in its session (SET or set_config(...,
        false), a session advisory lock, LISTEN, PREPARE, a temp table) dies
        with it. DISCARD ALL on a pooled connection was the alternative; it
        cannot run inside a transaction block, does not cover everything an
        extension may keep per session, and would also reset the pool's own
        settings. A connection costs a few ms; sql tasks are admin chores.
        timeout_s == 0 means no statement_timeout (the handler allows it only
        when the operator did).

        The timeout holds whatever the statement does. statement_timeout
        cancels it at timeout_s; a statement that catches query_canceled
        (PL/pgSQL) and goes on is stopped by the replica: the backend registered
        itself (sql_job_register) and, timeout_s + grace_s after the start, is
        terminated through terminate_sql_job() on a pooled connection, which
        returns once it has exited (its locks free, nothing in
        pg_stat_activity). client_connection_check_interval makes the backend
        notice a closed client (a cancelled handler) within a second as well.
        A statement that swallowed the cancel but ended within the grace is
        rolled back. Both raise SqlJobTimeout."""
        conn = await psycopg.AsyncConnection.connect(
            self.job_url, row_factory=dict_row, application_name="switchboard-sql-job", autocommit=True,
            **conninfo_with_keepalives())
        pid: int | None = None
        task: asyncio.Future[Row] | None = None
        t0 = time.monotonic()
        try:
            await conn.execute("SELECT set_config('client_connection_check_interval', '1000', false)")
            if timeout_s > 0 and run_id is not None:
                try:
                    cur = await conn.execute("SELECT switchboard.sql_job_register(%s, %s) AS pid",
                                             (run_id, timedelta(seconds=timeout_s + grace_s)))
                    pid = (await cur.fetchone())["pid"]  # type: ignore[index]  # SELECT f() AS pid: always one row
                except psycopg.Error as exc:
                    LOG.warning("sql run %s: its backend could not be registered for termination (%s); "
                                "only statement_timeout bounds it", run_id, str(exc).strip())
            t0 = time.monotonic()   # the timeout counts from the statement's start
            task = asyncio.ensure_future(self._job_statement(conn, statement, timeout_s, t0))
            if timeout_s <= 0:
                return await task
            done, _ = await asyncio.wait({task}, timeout=timeout_s + grace_s)
            if task in done:
                return task.result()
            terminated = False
            if pid is not None:
                terminated = await self.db.scalar("SELECT switchboard.terminate_sql_job(%s)", (pid,))
            await asyncio.wait({task}, timeout=5.0)
            raise SqlJobTimeout(
                f"the statement ignored its timeout of {timeout_s:g} s; "
                + (f"its backend was terminated after {timeout_s:g} s + {grace_s:g} s grace" if terminated
                   else "its connection was closed"), terminated=terminated)
        finally:
            await conn.close()
            if task is not None and not task.done():
                task.cancel()
                if pid is not None:
                    # We are being cancelled (lease lost, shutdown) with the statement still
                    # running: closing the connection stops it within a second, unless it
                    # turned client_connection_check_interval off -- so terminate it at its
                    # kill_after all the same (terminate_sql_job is a no-op once it is gone).
                    killer = asyncio.ensure_future(self._terminate_sql_job_at(
                        pid, t0 + timeout_s + grace_s, run_id))
                    self._killers.add(killer)
                    killer.add_done_callback(self._killers.discard)
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)

    async def _terminate_sql_job_at(self, pid: int, at: float, run_id: int | None) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()) + 0.1)
        try:
            if await self.db.scalar("SELECT switchboard.terminate_sql_job(%s)", (pid,)):
                LOG.warning("sql run %s: its statement outlived its cancelled handler; backend %s terminated",
                            run_id, pid)
        except Exception as exc:
            LOG.warning("sql run %s: terminating backend %s failed: %s", run_id, pid, str(exc).strip())

    @staticmethod
    async def _job_statement(conn: psycopg.AsyncConnection[Any], statement: str, timeout_s: float,
                             t0: float) -> Row:
        try:
            async with conn.transaction():
                await conn.execute("SELECT set_config('statement_timeout', %s, true)",
                                   (str(int(timeout_s * 1000)),))
                cur = await conn.execute("SELECT switchboard.run_job_sql(%s) AS r", (statement,))
                row: Row | None = await cur.fetchone()
                if timeout_s > 0 and time.monotonic() - t0 > timeout_s:
                    # It caught the cancel and ended within the grace: its work does not count.
                    raise SqlJobTimeout(f"the statement ignored its timeout of {timeout_s:g} s and "
                                        "was rolled back")
                assert row is not None  # SELECT f() AS r: always one row
                return cast(Row, row["r"])
        except psycopg.errors.QueryCanceled:
            raise SqlJobTimeout(f"the statement was cancelled at its timeout of {timeout_s:g} s") from None
