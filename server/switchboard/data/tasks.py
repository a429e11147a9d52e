"""Scheduled tasks: the HTTP API's and the CLI's reads and writes of switchboard.tasks,
and the runs a task starts by hand."""

from __future__ import annotations

from typing import Any, cast
from uuid import UUID

from psycopg.types.json import Jsonb

from ..rows import Task
from .columns import RUN_COLUMNS, TASK_COLUMNS
from .pool import PoolBase, Row


class TaskQueries(PoolBase):
    """Tasks: list, read, create, update, delete, run now."""

    async def list_tasks(self) -> list[Task]:
        rows = await self.fetchall(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks ORDER BY name")
        return [Task.from_row(r) for r in rows]

    async def get_task(self, task_id: UUID) -> Task | None:
        row = await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks WHERE id = %s", (task_id,))
        return None if row is None else Task.from_row(row)

    async def find_task(self, name: str) -> Task | None:
        row = await self.fetchone(f"SELECT {TASK_COLUMNS} FROM switchboard.tasks WHERE name = %s", (name,))
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
