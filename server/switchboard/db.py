"""The data layer: the request pool and every SQL statement the server sends.

Python never builds SQL from input: every statement is a constant with bound
parameters. Most methods call one switchboard.* function; a few read the tables
and views the application role may SELECT (tasks, task_runs, users), with the
column lists below. Keeping them here keeps the SQL reviewable in one place.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, TypeVar, cast
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from .bounded import BadInput, stored_json
from .rows import RUN_FIELDS, UNREADABLE, Event, Run, Task

LOG = logging.getLogger("switchboard.db")

# A row as the pool's connections return it (row_factory=dict_row).
Row = dict[str, Any]
T = TypeVar("T")

def _ts(col: str) -> str:
    """A timestamptz column as Python can hold it: psycopg cannot load 'infinity',
    '-infinity' or dates outside years 1..9999, which a DBA can write by hand
    (next_run_at = 'infinity' to park a task, run_at = '-infinity' for "now"). Such a
    value reads as NULL instead of failing the whole request -- or, for a claim that
    Postgres already committed, stranding the claimed runs."""
    return (f"CASE WHEN {col} > '0001-01-02 00:00:00+00' AND {col} < '9999-12-30 00:00:00+00' "
            f"THEN {col} END AS {col}")


RUN_COLUMNS = (
    "id, task_id, handler, args, status, trigger, attempt, max_attempts, queueing_lock, "
    f"{_ts('run_at')}, {_ts('scheduled_for')}, worker, lease_expires_at, started_at, finished_at, result, "
    "error, retry_of, created_at"
)
# switchboard.runs (the view), as a listing shows it and as one run is shown.
RUN_VIEW_COLUMNS = (
    "id, task_id, task_name, handler, status, trigger, attempt, max_attempts, worker, created_at, "
    f"{_ts('run_at')}, started_at, finished_at, duration_ms, error, retry_of"
)
RUN_DETAIL_COLUMNS = (
    f"{RUN_VIEW_COLUMNS}, lease_expires_at, {_ts('scheduled_for')}, queueing_lock, args, result"
)
HANDLER_COLUMNS = "handler AS name, paused, paused_at, served, live_replicas AS replicas, versions, " \
                  "active_tasks, pending_runs"
TASK_COLUMNS = (
    f"id, name, schedule, timezone, handler, args, is_active, max_attempts, {_ts('next_run_at')}, "
    "skipped_ticks, last_error, last_error_at, created_by, created_at, updated_at"
)
_CLAIM_DUE_TASKS = f"SELECT {RUN_COLUMNS} FROM switchboard.claim_due_tasks(%s, %s, %s)"
_FINISH_AND_CLAIM = (f"SELECT {RUN_COLUMNS} FROM switchboard.finish_and_claim(%s, %s::bigint[], %s::jsonb[], %s, %s)")
_STATUS = RUN_FIELDS.index("status")   # RUN_COLUMNS is RUN_FIELDS in order (tests/unit/test_rows.py)
# events_since_v2's columns, as rows.Event holds them
EVENT_COLUMNS = "tick, id, room, event, payload, created_at"


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


class SqlJobTimeout(Exception):
    """A sql task's statement ran into its timeout (cancelled, rolled back or terminated)."""

    def __init__(self, message: str, terminated: bool = False) -> None:
        super().__init__(message)
        self.terminated = terminated


class Database:
    """The request pool. ``prepare_threshold`` is psycopg's (None: never prepare), see
    config.prepare_threshold(); it is applied at every checkout, so turning it off
    at run time reaches every pooled connection."""

    def __init__(self, url: str, min_size: int = 2, max_size: int = 10, timeout: float = 10.0,
                 name: str = "switchboard", prepare_threshold: int | None = 5,
                 job_url: str | None = None) -> None:
        self.url = url
        self.job_url = job_url or url
        self._killers: set[asyncio.Future[None]] = set()   # terminate_sql_job calls still to make
        self.timeout = timeout
        self._ping_task: asyncio.Future[None] | None = None
        self.prepare_threshold = prepare_threshold
        kwargs = {"autocommit": True, "row_factory": dict_row, **conninfo_with_keepalives(),
                  "application_name": name}
        self.pool = AsyncConnectionPool(
            url, min_size=min(min_size, max_size), max_size=max_size, kwargs=kwargs, open=False,
            timeout=timeout, name="switchboard", reconnect_timeout=0,
            check=CheckIfIdle(),
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

    async def db_instance(self) -> Row | None:
        """Timeline, recovery state, start time and UNLOGGED-state epoch of the server."""
        return await self.fetchone("SELECT * FROM switchboard.db_instance()")

    async def metrics_snapshot(self, timeout: float = 2.0) -> dict[str, float]:
        # pg_notification_queue_usage() beside the snapshot, in the same round trip: a
        # session that LISTENs and never reads (idle in transaction) pins the queue, and
        # when it is full every NOTIFY -- every event, announcement and wake-up -- fails
        # at COMMIT (docs/operations.md#switchboardnotifyqueuefilling).
        rows = await self.fetchall("SELECT item, value FROM switchboard.metrics_snapshot() "
                                   "UNION ALL SELECT 'notification_queue_usage', "
                                   "pg_catalog.pg_notification_queue_usage()", timeout=timeout)
        return {r["item"]: r["value"] for r in rows}

    # -- users & auth -------------------------------------------------------
    async def login_lookup(self, username: str) -> Row | None:
        return await self.fetchone("SELECT * FROM switchboard.login_lookup_v2(%s)", (username,))


    async def get_user(self, user_id: UUID) -> Row | None:
        return await self.fetchone(
            "SELECT id, username, role, disabled FROM switchboard.users WHERE id = %s", (user_id,))

    async def get_user_session(self, user_id: UUID) -> Row | None:
        """get_user plus token_epoch (read through user_states(): the app role may not
        SELECT the column): what a WebSocket remembers when it is accepted."""
        return await self.fetchone(
            "SELECT u.id, u.username, s.role, s.disabled, s.token_epoch FROM switchboard.users u"
            " JOIN switchboard.user_states(ARRAY[%s]::uuid[]) s ON s.user_id = u.id", (user_id,))

    async def revoke_token(self, jti: str, user_id: UUID, expires_at: Any) -> None:
        await self.fetchone("SELECT switchboard.revoke_token(%s, %s, %s)", (jti, user_id, expires_at))

    async def issue_ticket(self, user_id: UUID, ttl: int) -> str:
        return cast("str", await self.scalar("SELECT switchboard.issue_ticket(%s, %s)", (user_id, timedelta(seconds=ttl))))

    async def consume_ticket(self, ticket: str) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT switchboard.consume_ticket(%s)", (ticket,)))

    # -- sessions (db/functions/62_sessions.sql) -----------------------------------------
    async def issue_ticket_v2(self, user_id: UUID, session_id: UUID | None, ttl: int) -> str:
        return cast("str", await self.scalar("SELECT switchboard.issue_ticket_v2(%s, %s, %s)",
                                 (user_id, session_id, timedelta(seconds=ttl))))

    async def consume_ticket_v2(self, ticket: str) -> Row | None:
        """{user_id, session_id, session_expires_at}, or None if the ticket is refused."""
        return await self.fetchone("SELECT user_id, session_id, session_expires_at"
                                   " FROM switchboard.consume_ticket_v2(%s)", (ticket,))

    async def start_session(self, user_id: UUID, lifetime: int) -> Row:
        row = await self.fetchone("SELECT session_id, refresh_token, expires_at FROM switchboard.start_session(%s, %s)",
                                  (user_id, timedelta(seconds=lifetime)))
        assert row is not None  # the function returns exactly one row or raises
        return row

    async def refresh_session(self, refresh_token: str, lifetime: int, race_window: float) -> Row:
        row = await self.fetchone(
            "SELECT outcome, session_id, user_id, username, role, token_epoch, new_refresh_token, expires_at"
            " FROM switchboard.refresh_session(%s, %s, %s)",
            (refresh_token, timedelta(seconds=lifetime), timedelta(seconds=race_window)))
        assert row is not None  # the function returns exactly one row (its outcome) or raises
        return row

    async def end_session(self, session_id: UUID, reason: str = "logout") -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.end_session(%s, %s)", (session_id, reason)))

    async def end_session_by_refresh(self, refresh_token: str) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT switchboard.end_session_by_refresh(%s)", (refresh_token,)))

    @staticmethod
    async def session_states(conn: psycopg.AsyncConnection[Any], session_ids: list[UUID]) -> list[Row]:
        cur = await conn.execute("SELECT session_id, user_id, expires_at, end_reason, live"
                                 " FROM switchboard.session_states(%s)", (session_ids,))
        return await cur.fetchall()

    async def rate_check(self, key: str, rate: float, burst: int, cost: int = 1,
                         timeout: float | None = None) -> Row:
        return await self.fetchone("SELECT * FROM switchboard.rate_check(%s, %s, %s, %s)",
                                   (key, rate, burst, cost), timeout=timeout)  # type: ignore[return-value]  # one row, always

    # -- tasks ----------------------------------------------------------------
    async def list_tasks(self) -> list[Task]:
        rows = await self.fetchall(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks ORDER BY name")
        return [Task.from_row(r) for r in rows]

    async def get_task(self, task_id: UUID) -> Task | None:
        row = await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks WHERE id = %s", (task_id,))
        return None if row is None else Task.from_row(row)

    async def create_task(self, name: str, schedule: str | None, handler: str, args: dict[str, Any],
                          timezone: str, max_attempts: int) -> Task:
        row = await self.fetchone(
            f"SELECT {TASK_COLUMNS} FROM switchboard.create_task(%s, %s, %s, %s, %s, %s)",
            (name, schedule, handler, Jsonb(args), timezone, max_attempts))
        assert row is not None  # the function returns its task or raises
        return Task.from_row(row)

    async def update_task(self, task_id: UUID, changes: dict[str, Any]) -> Task:
        row = await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.update_task(%s, %s)",
                                  (task_id, Jsonb(changes)))
        assert row is not None  # the function returns the task or raises (P0002: no such task)
        return Task.from_row(row)

    async def delete_task(self, task_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.delete_task(%s)", (task_id,)))

    async def create_run_exclusive(self, task_id: UUID, trigger: str = "manual") -> Row | None:
        return await self.fetchone(
            f"SELECT {RUN_COLUMNS} FROM switchboard.create_run_exclusive(%s, %s)", (task_id, trigger))

    async def active_run(self, task_id: UUID) -> Row | None:
        return await self.fetchone(
            f"SELECT {RUN_COLUMNS} FROM switchboard.task_runs WHERE task_id = %s "
            "AND status IN ('queued', 'running') LIMIT 1", (task_id,))

    async def task_runs(self, task_id: UUID, limit: int) -> list[Row]:
        return await self.fetchall(
            f"SELECT {RUN_COLUMNS} FROM switchboard.task_runs WHERE task_id = %s ORDER BY id DESC LIMIT %s",
            (task_id, limit))

    # -- scheduler --------------------------------------------------------------

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

    async def claim_due_tasks(self, worker: str, lease: float, max_runs: int) -> list[Run]:
        # RUN_COLUMNS is Run's fields in order (tests/unit/test_rows.py), so a tuple row is Run(*row)
        rows = await self._tuples(_CLAIM_DUE_TASKS, (worker, timedelta(seconds=lease), max_runs))
        return [Run(*r) for r in rows]

    async def finish_runs(self, worker: str, run_ids: list[int], results: list[Any]) -> set[int]:
        # All results None (a handler that returns nothing, the common case): pass NULL,
        # which finish_runs() reads as "no result" for every run, instead of an array of NULLs.
        res = None if all(r is None for r in results) else [None if r is None else Jsonb(r) for r in results]
        rows = await self._tuples(
            "SELECT r FROM switchboard.finish_runs(%s, %s::bigint[], %s::jsonb[]) AS r", (worker, run_ids, res))
        return {row[0] for row in rows}

    async def finish_and_claim(self, worker: str, run_ids: list[int], results: list[Any], lease: float,
                               max_runs: int) -> tuple[set[int], list[Run]]:
        """finish_runs() and claim_due_tasks() in one round trip (switchboard.finish_and_claim):
        the ids actually finished (fenced), and the runs claimed."""
        res = None if all(r is None for r in results) else [None if r is None else Jsonb(r) for r in results]
        rows = await self._tuples(_FINISH_AND_CLAIM, (worker, run_ids, res, timedelta(seconds=lease), max_runs))
        finished: set[int] = set()
        runs: list[Run] = []
        for r in rows:
            if r[_STATUS] == "succeeded":    # a finished run's thin row (id and status only)
                finished.add(r[0])
            else:
                runs.append(Run(*r))
        return finished, runs

    async def heartbeat_run(self, run_id: int, worker: str, lease: float) -> bool:
        """One round trip, never two: the idle check is skipped (see UNCHECKED). A stale
        connection fails the call at once, the pool discards it, and the scheduler sends
        the heartbeat again right away on another connection."""
        token = UNCHECKED.set(True)
        try:
            return bool(await self.scalar("SELECT switchboard.heartbeat_run(%s, %s, %s)",
                                          (run_id, worker, timedelta(seconds=lease))))
        finally:
            UNCHECKED.reset(token)

    async def finish_run(self, run_id: int, worker: str, ok: bool, result: Any, error: str | None) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.finish_run(%s, %s, %s, %s, %s)",
                                 (run_id, worker, ok, None if result is None else Jsonb(result), error)))

    async def release_run(self, run_id: int, worker: str) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.release_run(%s, %s)", (run_id, worker)))

    async def enqueue(self, handler: str, args: dict[str, Any], run_at: Any = None, queueing_lock: str | None = None,
                      max_attempts: int = 3) -> Row | None:
        return await self.fetchone(f"SELECT {RUN_COLUMNS} FROM switchboard.enqueue(%s, %s, %s, %s, %s)",
                                   (handler, Jsonb(args), run_at, queueing_lock, max_attempts))

    async def maintenance(self, keep_events: int, replica_stale: float, max_rows: int) -> Row:
        return cast("Row", await self.scalar(
            "SELECT switchboard.maintenance(max_rows => %s, keep_events => %s, replica_stale => %s)",
            (max_rows, timedelta(seconds=keep_events), timedelta(seconds=replica_stale))))

    async def lost_runs(self, worker: str, run_ids: list[int]) -> list[Row]:
        return await self.fetchall("SELECT run_id, status FROM switchboard.lost_runs(%s, %s::bigint[])",
                                   (worker, run_ids))

    # -- operate: runs, handlers, status (HTTP admin API and the CLI) ----------------------
    async def list_runs(self, status: str | None = None, handler: str | None = None, task: str | None = None,
                        since: Any = None, limit: int = 50, before_id: int | None = None) -> list[Row]:
        """``since``: a datetime, or a timedelta meaning "that long before now()" (the
        database's clock, not this process's)."""
        ago = since if isinstance(since, timedelta) else None
        at = None if ago is not None else since
        return await self.fetchall(
            f"SELECT {RUN_VIEW_COLUMNS} FROM switchboard.list_runs(%s, %s, %s, "
            "coalesce(%s::timestamptz, now() - %s::interval), %s, %s)",
            (status, handler, task, at, ago, limit, before_id))

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

    async def find_task(self, name: str) -> Task | None:
        row = await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks WHERE name = %s", (name,))
        return None if row is None else Task.from_row(row)

    # -- users (the CLI's chores) ---------------------------------------------------------
    async def find_user_id(self, username: str) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT id FROM switchboard.find_user(%s)", (username,)))

    async def create_user(self, username: str, password_hash: str, role: str) -> UUID:
        return cast("UUID", await self.scalar("SELECT switchboard.create_user(%s, %s, %s)", (username, password_hash, role)))

    async def set_user_password_hash(self, user_id: UUID, password_hash: str) -> None:
        await self.fetchone("SELECT switchboard.set_user_password_hash(%s, %s)", (user_id, password_hash))

    async def set_user_role(self, user_id: UUID, role: str) -> None:
        await self.fetchone("SELECT switchboard.set_user_role(%s, %s)", (user_id, role))

    async def disable_user(self, user_id: UUID) -> None:
        await self.fetchone("SELECT switchboard.disable_user(%s)", (user_id,))

    async def enable_user(self, user_id: UUID) -> None:
        await self.fetchone("SELECT switchboard.enable_user(%s)", (user_id,))

    # -- events -------------------------------------------------------------------
    async def notify_user(self, user_id: UUID, event: str, payload: Any) -> int:
        return cast("int", await self.scalar("SELECT switchboard.notify_user(%s, %s, %s)", (user_id, event, Jsonb(payload))))

    async def notify_room(self, room: str, event: str, payload: Any) -> int:
        return cast("int", await self.scalar("SELECT switchboard.notify_room(%s, %s, %s)", (room, event, Jsonb(payload))))

    async def events_since_v2(self, user_id: UUID, after: tuple[int, int], rooms: list[str],
                              through_tick: int | None, limit: int) -> list[Event]:
        """A page of the events a resume replays. Payloads are read as text and parsed
        here: one no Python reader can parse (nested too deep: a row stored before V0020
        or written by hand) comes back as rows.UNREADABLE, which the resume skips, instead
        of failing the page, and with it every resume of that user, for good."""
        rows = await self.fetchall(
            f"SELECT {EVENT_COLUMNS.replace('payload', 'payload::text AS payload')} "
            "FROM switchboard.events_since_v2(%s, %s, %s, %s, %s, %s)",
            (user_id, after[0], after[1], rooms, through_tick, limit))
        for r in rows:
            try:
                r["payload"] = stored_json(r["payload"])
            except BadInput:
                r["payload"] = UNREADABLE
        return [Event.from_row(r) for r in rows]

    async def event_window(self) -> Row:
        row = await self.fetchone("SELECT first_tick, last_tick, reaped_through, publishers_notify FROM switchboard.event_window()")
        assert row is not None
        return row

    async def event_batch(self, event_id: int) -> int | None:
        tick = await self.scalar("SELECT switchboard.event_batch(%s)", (event_id,))
        return None if tick is None else int(tick)

    # -- the relay's own reads ------------------------------------------------------------
    # On the relay's dedicated reader connection (not the request pool: a busy pool
    # must not delay delivery). NOTIFY payloads are hints; these reads are what a
    # replica acts on (docs/security.md).
    @staticmethod
    async def relay_read_v2(conn: psycopg.AsyncConnection[Any], after: tuple[int, int], ephemeral_ids: list[int],
                            max_rows: int) -> list[Row]:
        cur = await conn.execute(
            "SELECT tick, id, ephemeral, user_id, room, event, sender, payload::text AS payload, ts "
            "FROM switchboard.relay_read_v2(%s, %s, %s, %s)", (after[0], after[1], ephemeral_ids, max_rows))
        return await cur.fetchall()

    @staticmethod
    async def relay_live_key(conn: psycopg.AsyncConnection[Any]) -> tuple[bytes | None, int]:
        """The live path's HMAC key (V0020; None while the path is off) and the database
        clock in epoch milliseconds (the clock live messages are stamped with)."""
        cur = await conn.execute("SELECT switchboard.relay_live_key() AS key, "
                                 "(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms")
        row = await cur.fetchone()
        assert row is not None
        return (None if row["key"] is None else bytes(row["key"])), int(row["now_ms"])

    @staticmethod
    async def relay_ephemeral_missed(conn: psycopg.AsyncConnection[Any], lookback: float,
                                     max_rows: int) -> list[int]:
        cur = await conn.execute("SELECT id FROM switchboard.relay_ephemeral_missed(%s, %s)",
                                 (timedelta(seconds=lookback), max_rows))
        return [int(r["id"]) for r in await cur.fetchall()]

    @staticmethod
    async def relay_tick_read(conn: psycopg.AsyncConnection[Any], after: tuple[int, int], ephemeral_ids: list[int],
                              max_rows: int) -> tuple[int, list[Row]]:
        """event_tick() in a transaction of its own, then relay_read_v2() after it, in ONE
        round trip (one simple-query string: BEGIN; tick; COMMIT; read). The tick commits
        before the read starts, so the read sees it, and the ticker row is not held while
        reading. The values are the relay's own integers (its position, bounded hint ids),
        passed as psycopg.sql.Literal: the simple-query protocol takes no parameters."""
        q = sql.SQL(
            "BEGIN; SELECT switchboard.event_tick() AS tick; COMMIT; "
            "SELECT tick, id, ephemeral, user_id, room, event, sender, payload::text AS payload, ts "
            "FROM switchboard.relay_read_v2({}::bigint, {}::bigint, {}::bigint[], {}::integer)").format(
                sql.Literal(int(after[0])), sql.Literal(int(after[1])),
                sql.Literal([int(i) for i in ephemeral_ids]), sql.Literal(int(max_rows)))
        cur = await conn.execute(q)
        sets: list[list[Row]] = []
        while True:
            if cur.description is not None:
                sets.append(await cur.fetchall())
            if not cur.nextset():
                break
        return int(sets[0][0]["tick"]), sets[1]

    @staticmethod
    async def event_tick(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT switchboard.event_tick() AS tick")
        return int((await cur.fetchone())["tick"])  # type: ignore[index]  # SELECT f(): always one row

    @staticmethod
    async def event_window_on(conn: psycopg.AsyncConnection[Any]) -> Row:
        cur = await conn.execute("SELECT first_tick, last_tick, reaped_through, publishers_notify FROM switchboard.event_window()")
        row: Row | None = await cur.fetchone()
        assert row is not None
        return row

    @staticmethod
    async def auth_snapshot(conn: psycopg.AsyncConnection[Any], since_seconds: int) -> list[Row]:
        cur = await conn.execute("SELECT * FROM switchboard.auth_snapshot_v3(%s)", (timedelta(seconds=since_seconds),))
        return await cur.fetchall()

    @staticmethod
    async def user_states(conn: psycopg.AsyncConnection[Any], user_ids: list[UUID]) -> list[Row]:
        cur = await conn.execute("SELECT user_id, role, disabled, token_epoch FROM switchboard.user_states(%s)",
                                 (user_ids,))
        return await cur.fetchall()

    @staticmethod
    async def revoked_among(conn: psycopg.AsyncConnection[Any], jtis: list[str]) -> list[Row]:
        cur = await conn.execute("SELECT jti, expires_at FROM switchboard.revoked_among(%s)", (jtis,))
        return await cur.fetchall()

    @staticmethod
    async def still_members(conn: psycopg.AsyncConnection[Any], pairs: list[tuple[str, UUID]]) -> set[tuple[str, UUID]]:
        cur = await conn.execute(
            "SELECT t.room, t.user_id FROM unnest(%s::text[], %s::uuid[]) AS t(room, user_id) "
            "WHERE switchboard.is_room_member(t.room, t.user_id)",
            ([p[0] for p in pairs], [p[1] for p in pairs]))
        return {(r["room"], r["user_id"]) for r in await cur.fetchall()}

    async def publish_client_event(self, sender: UUID, room: str, event: str, payload: Any) -> None:
        await self.fetchone("SELECT switchboard.publish_client_event(%s, %s, %s, %s)",
                            (sender, room, event, Jsonb(payload)))

    # -- rooms ----------------------------------------------------------------------
    async def is_room_member(self, room: str, user_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.is_room_member(%s, %s)", (room, user_id)))

    async def add_room_member(self, room: str, user_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.add_room_member(%s, %s)", (room, user_id)))

    async def remove_room_member(self, room: str, user_id: UUID) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.remove_room_member(%s, %s)", (room, user_id)))

    async def room_members(self, room: str) -> list[Row]:
        return await self.fetchall("SELECT * FROM switchboard.room_members_online(%s)", (room,))

    async def room_exists(self, room: str) -> bool:
        return bool(await self.scalar("SELECT EXISTS (SELECT 1 FROM switchboard.rooms WHERE name = %s)", (room,)))

    # -- replicas, presence, tools ------------------------------------------------------
    async def replica_heartbeat(self, replica_id: str, info: dict[str, Any], handlers: list[str],
                                interval: float, version: str) -> None:
        await self.fetchone("SELECT switchboard.replica_heartbeat(%s, %s, %s::text[], %s, %s)",
                            (replica_id, Jsonb(info), handlers, timedelta(seconds=interval), version))

    async def known_handlers(self, version: str) -> list[str]:
        rows = await self.fetchall("SELECT h FROM switchboard.known_handlers(%s) AS h", (version,))
        return [r["h"] for r in rows]

    async def replica_stop(self, replica_id: str) -> None:
        await self.fetchone("SELECT switchboard.replica_stop(%s)", (replica_id,))

    async def presence_set(self, replica_id: str, user_id: UUID, sockets: int) -> None:
        await self.fetchone("SELECT switchboard.presence_set(%s, %s, %s)", (replica_id, user_id, sockets))

    async def presence_sync(self, replica_id: str, users: list[UUID], counts: list[int]) -> None:
        await self.fetchone("SELECT switchboard.presence_sync(%s, %s, %s)", (replica_id, users, counts))

    async def tool_call_send(self, user_id: UUID, replica_id: str, name: str, args: Any,
                             timeout: float) -> UUID | None:
        return cast("UUID | None", await self.scalar("SELECT switchboard.tool_call_send(%s, %s, %s, %s, %s)",
                                 (user_id, replica_id, name, Jsonb(args), timedelta(seconds=timeout))))

    async def tool_call_answer(self, call_id: UUID, sender: UUID, result: Any) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.tool_call_answer(%s, %s, %s)",
                                 (call_id, sender, Jsonb(result))))

    async def tool_call_collect(self, call_id: UUID, give_up: bool = False) -> Row | None:
        return await self.fetchone("SELECT * FROM switchboard.tool_call_collect(%s, %s)", (call_id, give_up))

    # -- sql handler ----------------------------------------------------------------------
    async def run_job_sql(self, statement: str, timeout_s: float, run_id: int | None = None,
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
                terminated = await self.scalar("SELECT switchboard.terminate_sql_job(%s)", (pid,))
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
            if await self.scalar("SELECT switchboard.terminate_sql_job(%s)", (pid,)):
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
