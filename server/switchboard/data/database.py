"""Database: the request pool (pool.PoolBase) with every area's queries mixed in,
and the sql-job executor (sql_jobs) beside it."""

from __future__ import annotations

from collections.abc import Callable

from .auth_queries import AuthQueries
from .events import EventQueries
from .history import HistoryReads
from .operate import OperateQueries
from .pool import Row
from .relay_reads import RelayReads
from .replicas import ReplicaQueries
from .rooms import RoomQueries
from .scheduling import SchedulerQueries
from .sql_jobs import SqlJobExecutor
from .streams import StreamQueries
from .tasks import TaskQueries
from .users import UserQueries


class Database(AuthQueries, UserQueries, TaskQueries, SchedulerQueries, OperateQueries, EventQueries,
               RoomQueries, ReplicaQueries, RelayReads, StreamQueries):
    """The request pool and every statement the server sends, one mixin per area.
    ``prepare_threshold`` is psycopg's (None: never prepare), see
    config.prepare_threshold(). ``job_url`` (default: ``url``) is where sql tasks'
    statements run, each on a connection of its own (sql_jobs.SqlJobExecutor).
    ``read_url`` (SWITCHBOARD_READ_DATABASE_URL): a streaming replica for the history
    reads (``history``, history.HistoryReads); ``count`` is metrics.inc, for its counters."""

    def __init__(self, url: str, min_size: int = 2, max_size: int = 10, timeout: float = 10.0,
                 name: str = "switchboard", prepare_threshold: int | None = 5,
                 job_url: str | None = None, read_url: str | None = None, read_max_lag: float = 5.0,
                 read_pool_size: int = 4, count: Callable[..., None] | None = None) -> None:
        super().__init__(url, min_size=min_size, max_size=max_size, timeout=timeout, name=name,
                         prepare_threshold=prepare_threshold)
        self.job_url = job_url or url
        self.sql_jobs = SqlJobExecutor(self.job_url, self)
        self.history = HistoryReads(self, read_url, read_max_lag, read_pool_size, prepare_threshold, count)

    async def open(self) -> None:
        await super().open()
        await self.history.open()

    async def close(self) -> None:
        await self.history.close()
        await super().close()

    async def run_job_sql(self, statement: str, timeout_s: float, run_id: int | None = None,
                          grace_s: float = 5.0) -> Row:
        """Run an admin-created task's statement as the restricted job role, bounded by
        ``timeout_s`` (0: none) plus ``grace_s``; see SqlJobExecutor.run."""
        return await self.sql_jobs.run(statement, timeout_s, run_id, grace_s)
