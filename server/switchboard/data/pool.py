"""The request pool: connections, keepalives, the idle check, timeouts, and the
retry once a transaction-mode pooler has lost a prepared statement.

PoolBase is what every query module of the data layer builds on (fetchall,
fetchone, scalar; _tuples for the job hot path, _transaction for an operator's
multi-statement change); switchboard.data.database.Database composes them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool

# The data layer's one logger, under the name it had when it was the module switchboard.db.
LOG = logging.getLogger("switchboard.db")

# A row as the pool's connections return it (row_factory=dict_row).
Row = dict[str, Any]
T = TypeVar("T")


def conninfo_with_keepalives() -> dict[str, Any]:
    """Connection kwargs that make a dead peer noticeable (TCP keepalives)."""
    return {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "connect_timeout": 5,
    }


class CheckIfIdle:
    """Pool ``check``: a round trip only for a connection that has not been handed out lately.

    psycopg_pool's check_connection sends an empty query on *every* checkout, which
    doubled the round trips of every request and of every claim/finish (one job =
    4 round trips instead of 2). A connection handed out within the last ``fresh``
    seconds has just been used; one that sat idle longer (across a PostgreSQL
    restart, a network cut, an idle timeout) is still checked, so stale
    connections are still weeded out before they reach a request. A failed query
    marks its connection broken and the pool discards it on return either way.
    """

    def __init__(self, fresh: float = 1.0) -> None:
        self.fresh = fresh
        self._handed_out: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    async def __call__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        now = time.monotonic()
        last = self._handed_out.get(conn)
        if (last is None or now - last >= self.fresh) and not UNCHECKED.get():
            await AsyncConnectionPool.check_connection(conn)
        self._handed_out[conn] = now


# Set by a caller that would rather fail fast on a stale connection (and retry) than pay
# the check's extra round trip: a lease heartbeat, whose deadline is counted in round trips.
UNCHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("switchboard_unchecked", default=False)


# "prepared statement ... does not exist" / "... already exists": a transaction-mode
# pooler handed this session's statement to a server connection that never saw (or
# already has) the PREPARE. Raised at Parse/Bind, before the statement ran.
PREPARED_STATEMENT_SQLSTATES = ("26000", "42P05")


def _session_settings(settings: dict[str, str]) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        for name, value in settings.items():
            await conn.execute("SELECT pg_catalog.set_config(%s, %s, false)", (name, value))
    return configure


class PoolBase:
    """The request pool. ``prepare_threshold`` is psycopg's (None: never prepare), see
    config.prepare_threshold(); it is applied at every checkout, so turning it off
    at run time reaches every pooled connection."""

    def __init__(self, url: str, min_size: int = 2, max_size: int = 10, timeout: float = 10.0,
                 name: str = "switchboard", prepare_threshold: int | None = 5,
                 session: dict[str, str] | None = None) -> None:
        """``session``: settings SET on every new connection (set_config, session-wide)."""
        self.url = url
        self.timeout = timeout
        self._ping_task: asyncio.Future[None] | None = None
        self.prepare_threshold = prepare_threshold
        kwargs = {"autocommit": True, "row_factory": dict_row, **conninfo_with_keepalives(),
                  "application_name": name}
        self.pool = AsyncConnectionPool(
            url, min_size=min(min_size, max_size), max_size=max_size, kwargs=kwargs, open=False,
            timeout=timeout, name="switchboard", reconnect_timeout=0,
            check=CheckIfIdle(), configure=_session_settings(session) if session else None,
        )

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close(timeout=5)

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        async with self.pool.connection(timeout=timeout or self.timeout) as conn:
            conn.prepare_threshold = self.prepare_threshold
            # the pool's connections are opened with row_factory=dict_row (kwargs above);
            # psycopg_pool's type does not carry that
            yield cast("psycopg.AsyncConnection[Row]", conn)

    def _prepared_statements_broken(self, exc: psycopg.Error) -> bool:
        """A pooler lost our prepared statement: stop preparing (once, loudly); True = retry."""
        if exc.sqlstate not in PREPARED_STATEMENT_SQLSTATES or self.prepare_threshold is None:
            return False
        LOG.warning("the database connection lost a prepared statement (%s: %s): DATABASE_URL goes through "
                    "a transaction-mode pooler; server-side prepared statements are now off for this process "
                    "(set SWITCHBOARD_PREPARE_THRESHOLD=off to start that way)", exc.sqlstate,
                    str(exc).strip())
        self.prepare_threshold = None
        return True

    async def fetchall(self, sql: str, params: Any = None, timeout: float | None = None) -> list[Row]:
        for attempt in (1, 2):
            try:
                async with self.connection(timeout) as conn:
                    cur = await conn.execute(sql, params)
                    return await cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                if attempt == 2 or not self._prepared_statements_broken(exc):
                    raise
        raise AssertionError("unreachable")

    async def fetchone(self, sql: str, params: Any = None, timeout: float | None = None) -> Row | None:
        for attempt in (1, 2):
            try:
                async with self.connection(timeout) as conn:
                    cur = await conn.execute(sql, params)
                    return await cur.fetchone() if cur.description else None
            except psycopg.Error as exc:
                if attempt == 2 or not self._prepared_statements_broken(exc):
                    raise
        raise AssertionError("unreachable")

    async def scalar(self, sql: str, params: Any = None, timeout: float | None = None) -> Any:
        row = await self.fetchone(sql, params, timeout)
        return None if row is None else next(iter(row.values()))

    async def _tuples(self, query: str, params: Any) -> list[tuple[Any, ...]]:
        """fetchall() for the job hot path (one claim and one finish per batch of runs):
        tuple rows instead of a dict per row, and no ``cursor.description`` (psycopg builds
        one Column object per column each time it is read: 19 per claim). Only for
        statements that always return a result set (a SELECT)."""
        for attempt in (1, 2):
            try:
                async with self.connection() as conn:
                    cur = conn.cursor(row_factory=tuple_row)
                    await cur.execute(query, params)
                    return await cur.fetchall()
            except psycopg.Error as exc:
                if attempt == 2 or not self._prepared_statements_broken(exc):
                    raise
        raise AssertionError("unreachable")

    async def _transaction(self, op: Callable[[psycopg.AsyncConnection[Row]], Awaitable[T]]) -> T:
        """``await op(conn)`` in one transaction on a pooled connection (dict rows)."""
        for attempt in (1, 2):
            try:
                async with self.connection() as conn:
                    async with conn.transaction():
                        return await op(conn)
            except psycopg.Error as exc:
                if attempt == 2 or not self._prepared_statements_broken(exc):
                    raise
        raise AssertionError("unreachable")

    # -- health -------------------------------------------------------------
    async def ping(self, timeout: float = 2.0) -> None:
        """Raise unless Postgres answers SELECT 1 within ``timeout`` s (readiness).

        Bounded without cancelling the query: asyncio.wait_for() would cancel it, and
        psycopg answers a cancellation by waiting for a cancel request (5 s) and then for
        the query (5 s more), so over a dead link the probe itself hung ~10 s instead of
        answering 503. One ping is in flight at a time; concurrent probes share it, and
        one that is still pending after ``timeout`` fails the probe at once."""
        t = self._ping_task
        if t is None or t.done():
            t = self._ping_task = asyncio.ensure_future(self._ping_once(timeout))
            t.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _ = await asyncio.wait({t}, timeout=timeout)
        if not done:
            raise TimeoutError(f"the database did not answer within {timeout:g} s")
        t.result()

    async def _ping_once(self, timeout: float) -> None:
        async with self.connection(timeout) as conn:
            await conn.execute("SELECT 1")
