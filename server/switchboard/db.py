"""The data layer: the request pool and every SQL statement the server sends.

Python never builds SQL from input: each method calls one switchboard.*
function with bound parameters. Keeping them here keeps the SQL reviewable in
one place.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

LOG = logging.getLogger("switchboard.db")

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
TASK_COLUMNS = (
    f"id, name, schedule, timezone, handler, args, is_active, max_attempts, {_ts('next_run_at')}, "
    "skipped_ticks, last_error, last_error_at, created_by, created_at, updated_at"
)


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

    async def __call__(self, conn: psycopg.AsyncConnection) -> None:
        now = time.monotonic()
        last = self._handed_out.get(conn)
        if last is None or now - last >= self.fresh:
            await AsyncConnectionPool.check_connection(conn)
        self._handed_out[conn] = now


# "prepared statement ... does not exist" / "... already exists": a transaction-mode
# pooler handed this session's statement to a server connection that never saw (or
# already has) the PREPARE. Raised at Parse/Bind, before the statement ran.
PREPARED_STATEMENT_SQLSTATES = ("26000", "42P05")


class Database:
    """The request pool. ``prepare_threshold`` is psycopg's (None: never prepare), see
    config.prepare_threshold(); it is applied at every checkout, so turning it off
    at run time reaches every pooled connection."""

    def __init__(self, url: str, min_size: int = 2, max_size: int = 10, timeout: float = 10.0,
                 name: str = "switchboard", prepare_threshold: int | None = 5,
                 job_url: str | None = None) -> None:
        self.url = url
        self.job_url = job_url or url
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
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self.pool.connection(timeout=timeout or self.timeout) as conn:
            conn.prepare_threshold = self.prepare_threshold
            yield conn

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

    async def fetchall(self, sql: str, params: Any = None, timeout: float | None = None) -> list[dict]:
        for attempt in (1, 2):
            try:
                async with self.connection(timeout) as conn:
                    cur = await conn.execute(sql, params)
                    return await cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                if attempt == 2 or not self._prepared_statements_broken(exc):
                    raise
        raise AssertionError("unreachable")

    async def fetchone(self, sql: str, params: Any = None, timeout: float | None = None) -> dict | None:
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

    async def db_instance(self) -> dict | None:
        """Timeline, recovery state, start time and UNLOGGED-state epoch of the server."""
        return await self.fetchone("SELECT * FROM switchboard.db_instance()")

    async def metrics_snapshot(self, timeout: float = 2.0) -> dict[str, float]:
        rows = await self.fetchall("SELECT item, value FROM switchboard.metrics_snapshot()",
                                   timeout=timeout)
        return {r["item"]: r["value"] for r in rows}

    # -- users & auth -------------------------------------------------------
    async def login_lookup(self, username: str) -> dict | None:
        return await self.fetchone("SELECT * FROM switchboard.login_lookup_v2(%s)", (username,))


    async def get_user(self, user_id: UUID) -> dict | None:
        return await self.fetchone(
            "SELECT id, username, role, disabled FROM switchboard.users WHERE id = %s", (user_id,))

    async def get_user_session(self, user_id: UUID) -> dict | None:
        """get_user plus token_epoch (read through user_states(): the app role may not
        SELECT the column): what a WebSocket remembers when it is accepted."""
        return await self.fetchone(
            "SELECT u.id, u.username, s.role, s.disabled, s.token_epoch FROM switchboard.users u"
            " JOIN switchboard.user_states(ARRAY[%s]::uuid[]) s ON s.user_id = u.id", (user_id,))

    async def revoke_token(self, jti: str, user_id: UUID, expires_at: Any) -> None:
        await self.fetchone("SELECT switchboard.revoke_token(%s, %s, %s)", (jti, user_id, expires_at))

    async def issue_ticket(self, user_id: UUID, ttl: int) -> str:
        return await self.scalar("SELECT switchboard.issue_ticket(%s, %s)", (user_id, timedelta(seconds=ttl)))

    async def consume_ticket(self, ticket: str) -> UUID | None:
        return await self.scalar("SELECT switchboard.consume_ticket(%s)", (ticket,))

    async def rate_check(self, key: str, rate: float, burst: int, cost: int = 1,
                         timeout: float | None = None) -> dict:
        return await self.fetchone("SELECT * FROM switchboard.rate_check(%s, %s, %s, %s)",
                                   (key, rate, burst, cost), timeout=timeout)  # type: ignore[return-value]

    # -- tasks ----------------------------------------------------------------
    async def list_tasks(self) -> list[dict]:
        return await self.fetchall(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks ORDER BY name")

    async def get_task(self, task_id: UUID) -> dict | None:
        return await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks WHERE id = %s", (task_id,))


    async def create_task(self, name: str, schedule: str | None, handler: str, args: dict,
                          timezone: str, max_attempts: int) -> dict:
        return await self.fetchone(
            f"SELECT {TASK_COLUMNS} FROM switchboard.create_task(%s, %s, %s, %s, %s, %s)",
            (name, schedule, handler, Jsonb(args), timezone, max_attempts))  # type: ignore[return-value]

    async def update_task(self, task_id: UUID, changes: dict) -> dict:
        return await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.update_task(%s, %s)",
                                   (task_id, Jsonb(changes)))  # type: ignore[return-value]

    async def delete_task(self, task_id: UUID) -> bool:
        return await self.scalar("SELECT switchboard.delete_task(%s)", (task_id,))

    async def create_run_exclusive(self, task_id: UUID, trigger: str = "manual") -> dict | None:
        return await self.fetchone(
            f"SELECT {RUN_COLUMNS} FROM switchboard.create_run_exclusive(%s, %s)", (task_id, trigger))

    async def active_run(self, task_id: UUID) -> dict | None:
        return await self.fetchone(
            f"SELECT {RUN_COLUMNS} FROM switchboard.task_runs WHERE task_id = %s "
            "AND status IN ('queued', 'running') LIMIT 1", (task_id,))

    async def task_runs(self, task_id: UUID, limit: int) -> list[dict]:
        return await self.fetchall(
            f"SELECT {RUN_COLUMNS} FROM switchboard.task_runs WHERE task_id = %s ORDER BY id DESC LIMIT %s",
            (task_id, limit))

    # -- scheduler --------------------------------------------------------------

    async def claim_many(self, worker: str, lease: float, max_runs: int) -> list[dict]:
        return await self.fetchall(f"SELECT {RUN_COLUMNS} FROM switchboard.claim_due_tasks(%s, %s, %s)",
                                   (worker, timedelta(seconds=lease), max_runs))

    async def finish_runs(self, worker: str, run_ids: list[int], results: list[Any]) -> set[int]:
        rows = await self.fetchall(
            "SELECT r AS id FROM switchboard.finish_runs(%s, %s::bigint[], %s::jsonb[]) AS r",
            (worker, run_ids, [None if r is None else Jsonb(r) for r in results]))
        return {row["id"] for row in rows}

    async def heartbeat_run(self, run_id: int, worker: str, lease: float) -> bool:
        return await self.scalar("SELECT switchboard.heartbeat_run(%s, %s, %s)",
                                 (run_id, worker, timedelta(seconds=lease)))

    async def finish_run(self, run_id: int, worker: str, ok: bool, result: Any, error: str | None) -> bool:
        return await self.scalar("SELECT switchboard.finish_run(%s, %s, %s, %s, %s)",
                                 (run_id, worker, ok, None if result is None else Jsonb(result), error))

    async def release_run(self, run_id: int, worker: str) -> bool:
        return await self.scalar("SELECT switchboard.release_run(%s, %s)", (run_id, worker))

    async def enqueue(self, handler: str, args: dict, run_at: Any = None, queueing_lock: str | None = None,
                      max_attempts: int = 3) -> dict | None:
        return await self.fetchone(f"SELECT {RUN_COLUMNS} FROM switchboard.enqueue(%s, %s, %s, %s, %s)",
                                   (handler, Jsonb(args), run_at, queueing_lock, max_attempts))

    async def maintenance(self, keep_events: int, replica_stale: float) -> dict:
        return await self.scalar(
            "SELECT switchboard.maintenance(keep_events => %s, replica_stale => %s)",
            (timedelta(seconds=keep_events), timedelta(seconds=replica_stale)))

    # -- events -------------------------------------------------------------------
    async def notify_user(self, user_id: UUID, event: str, payload: Any) -> int:
        return await self.scalar("SELECT switchboard.notify_user(%s, %s, %s)", (user_id, event, Jsonb(payload)))

    async def notify_room(self, room: str, event: str, payload: Any) -> int:
        return await self.scalar("SELECT switchboard.notify_room(%s, %s, %s)", (room, event, Jsonb(payload)))

    async def events_since(self, user_id: UUID, after_id: int, rooms: list[str], limit: int) -> list[dict]:
        return await self.fetchall(
            "SELECT id, user_id, room, event, payload, created_at FROM switchboard.events_since(%s, %s, %s, %s)",
            (user_id, after_id, rooms, limit))

    async def event_horizon(self) -> int:
        return int(await self.scalar("SELECT switchboard.event_horizon()"))

    async def events_since_v2(self, user_id: UUID, after: tuple[int, int], rooms: list[str],
                              through_tick: int | None, limit: int) -> list[dict]:
        return await self.fetchall(
            "SELECT tick, id, room, event, payload, created_at "
            "FROM switchboard.events_since_v2(%s, %s, %s, %s, %s, %s)",
            (user_id, after[0], after[1], rooms, through_tick, limit))

    async def event_window(self) -> dict:
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
    async def relay_read(conn: psycopg.AsyncConnection, after_id: int, ephemeral_ids: list[int],
                         max_rows: int) -> list[dict]:
        cur = await conn.execute(
            "SELECT id, ephemeral, user_id, room, event, sender, payload, ts "
            "FROM switchboard.relay_read(%s, %s, %s)", (after_id, ephemeral_ids, max_rows))
        return await cur.fetchall()

    @staticmethod
    async def relay_read_v2(conn: psycopg.AsyncConnection, after: tuple[int, int], ephemeral_ids: list[int],
                            max_rows: int) -> list[dict]:
        cur = await conn.execute(
            "SELECT tick, id, ephemeral, user_id, room, event, sender, payload, ts "
            "FROM switchboard.relay_read_v2(%s, %s, %s, %s)", (after[0], after[1], ephemeral_ids, max_rows))
        return await cur.fetchall()

    @staticmethod
    async def relay_tick_read(conn: psycopg.AsyncConnection, after: tuple[int, int], ephemeral_ids: list[int],
                              max_rows: int) -> tuple[int, list[dict]]:
        """event_tick() in a transaction of its own, then relay_read_v2() after it, in ONE
        round trip (one simple-query string: BEGIN; tick; COMMIT; read). The tick commits
        before the read starts, so the read sees it, and the ticker row is not held while
        reading. The values are the relay's own integers (its position, bounded hint ids),
        passed as psycopg.sql.Literal: the simple-query protocol takes no parameters."""
        q = sql.SQL(
            "BEGIN; SELECT switchboard.event_tick() AS tick; COMMIT; "
            "SELECT tick, id, ephemeral, user_id, room, event, sender, payload, ts "
            "FROM switchboard.relay_read_v2({}::bigint, {}::bigint, {}::bigint[], {}::integer)").format(
                sql.Literal(int(after[0])), sql.Literal(int(after[1])),
                sql.Literal([int(i) for i in ephemeral_ids]), sql.Literal(int(max_rows)))
        cur = await conn.execute(q)
        sets: list[list[dict]] = []
        while True:
            if cur.description is not None:
                sets.append(await cur.fetchall())
            if not cur.nextset():
                break
        return int(sets[0][0]["tick"]), sets[1]

    @staticmethod
    async def event_tick(conn: psycopg.AsyncConnection) -> int:
        cur = await conn.execute("SELECT switchboard.event_tick() AS tick")
        return int((await cur.fetchone())["tick"])

    @staticmethod
    async def event_window_on(conn: psycopg.AsyncConnection) -> dict:
        cur = await conn.execute("SELECT first_tick, last_tick, reaped_through, publishers_notify FROM switchboard.event_window()")
        row = await cur.fetchone()
        assert row is not None
        return row

    @staticmethod
    async def auth_snapshot(conn: psycopg.AsyncConnection, since_seconds: int) -> list[dict]:
        cur = await conn.execute("SELECT * FROM switchboard.auth_snapshot_v2(%s)", (timedelta(seconds=since_seconds),))
        return await cur.fetchall()

    @staticmethod
    async def event_head(conn: psycopg.AsyncConnection) -> int:
        cur = await conn.execute("SELECT switchboard.event_head() AS head")
        return int((await cur.fetchone())["head"])

    @staticmethod
    async def user_states(conn: psycopg.AsyncConnection, user_ids: list[UUID]) -> list[dict]:
        cur = await conn.execute("SELECT user_id, role, disabled, token_epoch FROM switchboard.user_states(%s)",
                                 (user_ids,))
        return await cur.fetchall()

    @staticmethod
    async def revoked_among(conn: psycopg.AsyncConnection, jtis: list[str]) -> list[dict]:
        cur = await conn.execute("SELECT jti, expires_at FROM switchboard.revoked_among(%s)", (jtis,))
        return await cur.fetchall()

    @staticmethod
    async def still_members(conn: psycopg.AsyncConnection, pairs: list[tuple[str, UUID]]) -> set[tuple[str, UUID]]:
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
        return await self.scalar("SELECT switchboard.is_room_member(%s, %s)", (room, user_id))

    async def add_room_member(self, room: str, user_id: UUID) -> bool:
        return await self.scalar("SELECT switchboard.add_room_member(%s, %s)", (room, user_id))

    async def remove_room_member(self, room: str, user_id: UUID) -> bool:
        return await self.scalar("SELECT switchboard.remove_room_member(%s, %s)", (room, user_id))

    async def room_members(self, room: str) -> list[dict]:
        return await self.fetchall("SELECT * FROM switchboard.room_members_online(%s)", (room,))

    async def room_exists(self, room: str) -> bool:
        return bool(await self.scalar("SELECT EXISTS (SELECT 1 FROM switchboard.rooms WHERE name = %s)", (room,)))

    # -- replicas, presence, tools ------------------------------------------------------
    async def replica_heartbeat(self, replica_id: str, info: dict, handlers: list[str],
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
        return await self.scalar("SELECT switchboard.tool_call_send(%s, %s, %s, %s, %s)",
                                 (user_id, replica_id, name, Jsonb(args), timedelta(seconds=timeout)))

    async def tool_call_answer(self, call_id: UUID, sender: UUID, result: Any) -> bool:
        return await self.scalar("SELECT switchboard.tool_call_answer(%s, %s, %s)",
                                 (call_id, sender, Jsonb(result)))

    async def tool_call_collect(self, call_id: UUID, give_up: bool = False) -> dict | None:
        return await self.fetchone("SELECT * FROM switchboard.tool_call_collect(%s, %s)", (call_id, give_up))

    # -- sql handler ----------------------------------------------------------------------
    async def run_job_sql(self, statement: str, timeout_s: float) -> dict:
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
        when the operator did)."""
        conn = await psycopg.AsyncConnection.connect(
            self.job_url, row_factory=dict_row, application_name="switchboard-sql-job",
            **conninfo_with_keepalives())
        try:
            async with conn.transaction():
                await conn.execute("SELECT set_config('statement_timeout', %s, true)",
                                   (str(int(timeout_s * 1000)),))
                cur = await conn.execute("SELECT switchboard.run_job_sql(%s) AS r", (statement,))
                row = await cur.fetchone()
                return row["r"]  # type: ignore[index]
        finally:
            await conn.close()
