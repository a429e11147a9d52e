"""History reads off the primary: SWITCHBOARD_READ_DATABASE_URL, a streaming replica.

What may read there (docs/how-to/operations/read-replica.md): GET /runs, GET
/runs/{id}, GET /tasks/{id}/runs, the admin run feed's version scan, and the
replay part of a resume. Everything else -- claims, finishes, publishes, tickets,
logins, presence, LISTEN, status() (it reads UNLOGGED tables, which a standby
refuses) -- stays on the primary.

Lag, measured by WAL position (LagWatch): every ``interval`` the watch samples the
primary's ``pg_current_wal_insert_lsn()`` and keeps a short history of (time, position);
then it asks the replica for ``pg_last_wal_replay_lsn()``. The replica's lag is the
age of the oldest sample it has not replayed (0 when it has replayed the newest),
so an idle primary never looks like a lagging replica (``pg_last_xact_replay_timestamp()``
stops moving when nothing commits) and a replica that stopped replaying
(``pg_wal_replay_pause()``, a conflict, a broken stream) is seen as soon as the
primary writes anything. It is a lower bound, off by at most one interval.

A replica is skipped -- the read goes to the primary, never an error to the user --
while it is behind by more than ``max_lag``, not in recovery (promoted, or a
primary by mistake), unreachable, not sampled yet, or when the read itself failed
there; a run the replica does not have yet is read again on the primary (no stale
404 right after POST /jobs). Every decision is counted (``count``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from .events import EventQueries
from .operate import OperateQueries
from .pool import PoolBase, Row, conninfo_with_keepalives
from .tasks import TaskQueries

LOG = logging.getLogger("switchboard.history")
T = TypeVar("T")

# Closed label sets (metrics.py): what was read, and why a read did not go to the replica.
READS = ("runs", "run", "task_runs", "runfeed", "resume")
REASONS = ("unknown", "lagging", "not_in_recovery", "unreachable", "error", "not_found")

PRIMARY_LSN_SQL = "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), '0/0')::bigint AS lsn"
# Every read on the replica is bounded. A standby replays the primary's ACCESS EXCLUSIVE
# locks (DDL such as the partition upkeep's ATTACH/DETACH, a VACUUM truncating a table)
# and holds each until it replays the transaction's end: with replay paused or stuck
# in between, a read of that table would wait for as long as replay does. It fails
# after lock_timeout instead (55P03) and is read again on the primary; a resume
# continues there from the last event sent (tests/test_read_replica.py).
REPLICA_SESSION = {"lock_timeout": "1s", "statement_timeout": "30s"}
REPLICA_SQL = ("SELECT pg_catalog.pg_is_in_recovery() AS in_recovery, "
               "pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_last_wal_replay_lsn(), '0/0')::bigint AS replay")


class ReplicaPool(OperateQueries, TaskQueries, EventQueries):
    """The replica's own small pool, with the query methods the history reads use."""


class LagWatch:
    """The replica's state, sampled every ``interval`` seconds on a connection of its own."""

    def __init__(self, primary: PoolBase, url: str, max_lag: float, interval: float) -> None:
        self.primary = primary
        self.url = url
        self.max_lag = max_lag
        self.interval = interval
        self.lag = math.nan                 # seconds; NaN while unknown
        self.reason: str | None = "unknown"  # None: usable
        self.samples = 0                    # completed samples (tests wait on it)
        # (monotonic time, primary WAL position), newest last, reaching 2 x max_lag back
        self._wal: deque[tuple[float, int]] = deque(maxlen=max(8, int(2 * max_lag / interval) + 4))
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Future[None] | None = None

    def usable(self) -> bool:
        return self.reason is None

    def failed(self) -> None:
        """A read on the replica lost its connection: skip it until a sample says otherwise."""
        self.reason, self.lag = "unreachable", math.nan

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="read-replica-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._drop()

    async def _loop(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    async def sample(self) -> None:
        """One sample, bounded: a replica that does not answer within the bound is unreachable
        (the stuck attempt is left to finish on its own; none is started beside it)."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._sample_once())
            self._pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        bound = max(2.0, 4 * self.interval)
        done, _ = await asyncio.wait({self._pending}, timeout=bound)
        if not done:
            self.failed()
            LOG.warning("read replica: no answer within %.1f s; reads go to the primary", bound)
        self.samples += 1

    async def _sample_once(self) -> None:
        try:
            lsn = int(await self.primary.scalar(PRIMARY_LSN_SQL, timeout=2.0))
        except Exception as exc:     # the primary is down: nothing to compare with; reads fail there anyway
            LOG.debug("read replica watch: primary position unknown: %s", exc)
            return
        now = time.monotonic()
        self._wal.append((now, lsn))
        while len(self._wal) > 1 and self._wal[1][0] < now - 2 * self.max_lag - self.interval:
            self._wal.popleft()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, application_name="switchboard-read-watch",
                    **{**conninfo_with_keepalives(), "connect_timeout": max(1, min(5, int(self.max_lag)))})
            cur = await self._conn.execute(REPLICA_SQL)
            row = await cur.fetchone()
        except Exception as exc:
            if self.reason != "unreachable":
                LOG.warning("read replica unreachable (%s); reads go to the primary", str(exc).strip())
            self.failed()
            await self._drop()
            return
        assert row is not None
        if not row[0]:
            if self.reason != "not_in_recovery":
                LOG.warning("read replica is not in recovery (a primary): reads go to the primary")
            self.reason, self.lag = "not_in_recovery", math.nan
            return
        self.lag = self.lag_of(None if row[1] is None else int(row[1]))
        reason = "lagging" if self.lag > self.max_lag else None
        if reason != self.reason:
            LOG.info("read replica %s (lag %.2f s, bound %.2f s)", "skipped: lagging" if reason else "in use",
                     self.lag, self.max_lag)
        self.reason = reason

    def lag_of(self, replay: int | None) -> float:
        """Seconds since the primary had WAL the replica has not replayed (0: it has it all)."""
        if replay is None:
            return math.inf
        for t, lsn in self._wal:
            if lsn > replay:
                return time.monotonic() - t
        return 0.0

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


class HistoryReads:
    """Routes the history reads: to the replica while it is usable, else (and on any failure
    there) to the primary. Without a read URL every read goes to the primary, uncounted."""

    def __init__(self, primary: Any, url: str | None, max_lag: float = 5.0, pool_size: int = 4,
                 prepare_threshold: int | None = 5,
                 count: Callable[..., None] | None = None) -> None:
        self.primary = primary
        self.count = count
        self.replica: ReplicaPool | None = None
        self.watch: LagWatch | None = None
        if url:
            self.replica = ReplicaPool(url, min_size=1, max_size=pool_size, timeout=2.0,
                                       name="switchboard-read", prepare_threshold=prepare_threshold,
                                       session=REPLICA_SESSION)
            self.watch = LagWatch(primary, url, max_lag, interval=min(1.0, max(0.1, max_lag / 4)))

    @property
    def lag(self) -> float:
        return self.watch.lag if self.watch is not None else math.nan

    def usable(self) -> bool:
        return self.watch is not None and self.watch.usable()

    async def open(self) -> None:
        if self.replica is not None and self.watch is not None:
            await self.replica.open()
            self.watch.start()

    async def close(self) -> None:
        if self.replica is not None and self.watch is not None:
            await self.watch.stop()
            await self.replica.close()

    # -- routing -----------------------------------------------------------------------------
    def _inc(self, name: str, **labels: str) -> None:
        if self.count is not None and self.replica is not None:
            self.count(name, 1.0, **labels)

    def served(self, read: str, where: str) -> None:
        self._inc("switchboard_history_reads_total", read=read, served=where)

    def fallback(self, reason: str) -> None:
        self._inc("switchboard_read_fallbacks_total", reason=reason)

    def pick(self) -> ReplicaPool | None:
        """The replica if it is usable now; else None (and the fallback counted)."""
        if self.replica is None or self.watch is None:
            return None
        if self.watch.reason is not None:
            self.fallback(self.watch.reason)
            return None
        return self.replica

    def failed(self, exc: Exception) -> None:
        """A read on the replica failed: count it; a lost connection also skips the replica
        until the next sample (a conflict with recovery, 40001, does not)."""
        self.fallback("error")
        LOG.info("read replica: a read failed (%s); read again on the primary", str(exc).strip()[:200])
        if isinstance(exc, psycopg.OperationalError) and self.watch is not None and \
                (exc.sqlstate is None or exc.sqlstate[:2] in ("08", "57")):
            self.watch.failed()

    async def read(self, read: str, op: Callable[[Any], Awaitable[T]],
                   missing: Callable[[T], bool] | None = None) -> T:
        """``op(replica)`` when the replica is usable, else (or when it failed there, or when
        ``missing`` says the replica lacks the answer) ``op(primary)``."""
        rep = self.pick()
        if rep is not None:
            try:
                out = await op(rep)
            except (psycopg.Error, OSError) as exc:
                if isinstance(exc, psycopg.Error) and (exc.sqlstate or "")[:2] in ("22", "P0"):
                    raise           # bad input: the primary would refuse it the same way
                self.failed(exc)
            else:
                if missing is None or not missing(out):
                    self.served(read, "replica")
                    return out
                self.fallback("not_found")
        out = await op(self.primary)
        self.served(read, "primary")
        return out

    # -- the reads ---------------------------------------------------------------------------
    async def list_runs(self, **filters: Any) -> list[Row]:
        return await self.read("runs", lambda d: d.list_runs(**filters))

    async def get_run(self, run_id: int) -> Row | None:
        """A run the replica does not have yet (created moments ago) is read on the primary."""
        return await self.read("run", lambda d: d.get_run(run_id), missing=lambda r: r is None)

    async def task_runs(self, task_id: Any, limit: int) -> list[Row]:
        return await self.read("task_runs", lambda d: d.task_runs(task_id, limit))

    async def feed_versions(self, sql: str, params: dict[str, Any]) -> tuple[Row | None, str]:
        """The run feed's version scan, and where it ran ("replica" or "primary")."""
        where = ["primary"]

        async def op(d: PoolBase) -> Row | None:
            row = await d.fetchone(sql, params)
            where[0] = "replica" if d is self.replica else "primary"
            return row
        return await self.read("runfeed", op), where[0]

    async def replay_source(self, after_tick: int, through: int, min_ticks: int) -> tuple[ReplicaPool, int] | None:
        """For a resume from tick ``after_tick`` up to ``through``: the replica and the newest tick
        it has replayed, when it is usable and holds at least ``min_ticks`` of that range (a short
        resume stays on the primary). The replica's events through that tick are complete: a tick
        is taken after every event it covers committed, and a standby replays in commit order."""
        if through - after_tick < min_ticks:
            return None
        rep = self.pick()
        tick = after_tick
        if rep is not None:
            try:
                tick = int((await rep.event_window())["last_tick"])
            except (psycopg.Error, OSError) as exc:
                self.failed(exc)
                rep = None
            else:
                if tick - after_tick < min_ticks:
                    self.fallback("lagging")
                    rep = None
        if rep is None:
            self.served("resume", "primary")
            return None
        return rep, min(tick, through)
