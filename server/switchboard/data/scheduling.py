"""The scheduler's statements: claim, finish, heartbeat and release runs, enqueue,
maintenance. claim/finish are the job hot path: tuple rows (PoolBase._tuples)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from psycopg.types.json import Jsonb

from ..rows import RUN_FIELDS, Run
from .columns import RUN_COLUMNS
from .pool import UNCHECKED, PoolBase, Row

_CLAIM_DUE_TASKS = f"SELECT {RUN_COLUMNS} FROM switchboard.claim_due_tasks(%s, %s, %s)"
_FINISH_AND_CLAIM = (f"SELECT {RUN_COLUMNS} FROM switchboard.finish_and_claim(%s, %s::bigint[], %s::jsonb[], %s, %s)")
_CLAIM_QUEUES = f"SELECT {RUN_COLUMNS} FROM switchboard.claim_due_tasks(%s, %s, %s::text[], %s::integer[])"
_FINISH_AND_CLAIM_QUEUES = (f"SELECT {RUN_COLUMNS} FROM switchboard.finish_and_claim(%s, %s::bigint[], %s::jsonb[], %s, "
                            "%s::text[], %s::integer[])")
_STATUS = RUN_FIELDS.index("status")   # RUN_COLUMNS is RUN_FIELDS in order (tests/unit/test_rows.py)


class SchedulerQueries(PoolBase):
    """Runs as the scheduler and the handlers move them."""

    async def claim_due_tasks(self, worker: str, lease: float, max_runs: int) -> list[Run]:
        # RUN_COLUMNS is Run's fields in order (tests/unit/test_rows.py), so a tuple row is Run(*row)
        rows = await self._tuples(_CLAIM_DUE_TASKS, (worker, timedelta(seconds=lease), max_runs))
        return [Run(*r) for r in rows]

    async def claim_queues(self, worker: str, lease: float, slots: dict[str, int]) -> list[Run]:
        """At most ``slots[q]`` runs of each queue q (the four-argument claim_due_tasks)."""
        rows = await self._tuples(_CLAIM_QUEUES, (worker, timedelta(seconds=lease), list(slots), list(slots.values())))
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
        return self._finished_and_claimed(rows)

    async def finish_and_claim_queues(self, worker: str, run_ids: list[int], results: list[Any], lease: float,
                                      slots: dict[str, int]) -> tuple[set[int], list[Run]]:
        """finish_and_claim with at most ``slots[q]`` runs claimed from each queue q."""
        res = None if all(r is None for r in results) else [None if r is None else Jsonb(r) for r in results]
        rows = await self._tuples(_FINISH_AND_CLAIM_QUEUES, (worker, run_ids, res, timedelta(seconds=lease),
                                                             list(slots), list(slots.values())))
        return self._finished_and_claimed(rows)

    @staticmethod
    def _finished_and_claimed(rows: list[tuple[Any, ...]]) -> tuple[set[int], list[Run]]:
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

    async def finish_run(self, run_id: int, worker: str, ok: bool, result: Any, error: str | None,
                         retry: bool = True) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.finish_run(%s, %s, %s, %s, %s, %s)",
                                 (run_id, worker, ok, None if result is None else Jsonb(result), error, retry)))

    async def set_handler_options(self, options: dict[str, dict[str, Any]], set_by: str) -> None:
        """Store every handler's registration options (set_handler_options, one transaction)."""
        async with self.connection() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.executemany("SELECT switchboard.set_handler_options(%s, %s, %s)",
                                  [(name, Jsonb(o), set_by) for name, o in options.items()])

    async def release_run(self, run_id: int, worker: str) -> bool:
        return cast("bool", await self.scalar("SELECT switchboard.release_run(%s, %s)", (run_id, worker)))

    async def enqueue(self, handler: str, args: dict[str, Any], run_at: Any = None, queueing_lock: str | None = None,
                      max_attempts: int | None = None, priority: int | None = None,
                      queue: str | None = None) -> Row | None:
        """max_attempts, priority, queue: None takes the handler's option (handler_options)."""
        return await self.fetchone(
            f"SELECT {RUN_COLUMNS} FROM switchboard.enqueue(%s, %s, coalesce(%s, now()), %s, %s, %s, %s)",
            (handler, Jsonb(args), run_at, queueing_lock, max_attempts, priority, queue))

    async def active_run_by_lock(self, queueing_lock: str) -> Row | None:
        """The queued or running job that holds ``queueing_lock`` (what a refused enqueue met)."""
        return await self.fetchone(
            f"SELECT {RUN_COLUMNS} FROM switchboard.task_runs WHERE queueing_lock = %s "
            "AND status IN ('queued', 'running') LIMIT 1", (queueing_lock,))

    async def maintenance(self, keep_events: int, replica_stale: float, max_rows: int) -> Row:
        return cast("Row", await self.scalar(
            "SELECT switchboard.maintenance(max_rows => %s, keep_events => %s, replica_stale => %s)",
            (max_rows, timedelta(seconds=keep_events), timedelta(seconds=replica_stale))))

    async def lost_runs(self, worker: str, run_ids: list[int]) -> list[Row]:
        return await self.fetchall("SELECT run_id, status FROM switchboard.lost_runs(%s, %s::bigint[])",
                                   (worker, run_ids))
