"""Rows as types: what the data layer hands the components, built once from a row.

procrastinate's ``Job.from_row`` is the model: a frozen dataclass per table the
server reads, with exactly the columns the data layer selects (db.RUN_COLUMNS
for runs, db.TASK_COLUMNS for tasks, db.EVENT_COLUMNS for events;
tests/unit/test_rows.py keeps each pair equal), so a typo is an AttributeError
at the first access and mypy sees every field's type. ``as_dict()`` gives the
row back in column order, which is what the JSON answers show.

The relay's own read (relay_read_v2: ephemeral events, sender, ts) stays a dict
row: it is the delivery hot path and is built straight into frames.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Self
from uuid import UUID


class _Row:
    """from_row / as_dict, written once for every row type below. ``FIELDS`` is each
    type's column names in order, set right after its dataclass is made."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """From a row holding every column the data layer selects (KeyError names a missing one)."""
        return cls(**{name: row[name] for name in cls.FIELDS})

    def as_dict(self) -> dict[str, Any]:
        """The row again, in column order (for JSON answers)."""
        return {name: getattr(self, name) for name in self.FIELDS}


def _names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True, slots=True)
class Run(_Row):
    """One row of switchboard.task_runs: a job, or one execution of a task."""

    id: int
    task_id: UUID | None
    handler: str
    args: dict[str, Any]
    status: str
    trigger: str | None
    attempt: int
    max_attempts: int
    queueing_lock: str | None
    run_at: datetime | None          # NULL when the stored value cannot be held (db._ts)
    scheduled_for: datetime | None
    worker: str | None               # the replica_id holding the lease
    lease_expires_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    result: Any
    error: str | None
    retry_of: int | None
    created_at: datetime | None
    queue: str                       # its named queue ('default' unless the handler's options say)
    priority: int                    # within the queue, higher is claimed first

    # Transitional, for the 0.2.0 merge: code written on other branches against dict rows
    # (run["id"], run.get("attempt")) keeps working on a Run. New code uses attributes;
    # remove these two once nothing subscripts a Run (mypy flags no such use today).
    def __getitem__(self, name: str) -> Any:
        if name not in RUN_FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in RUN_FIELDS else default


RUN_FIELDS = Run.FIELDS = _names(Run)


@dataclass(frozen=True, slots=True)
class Task(_Row):
    """One row of switchboard.tasks: a scheduled (or trigger-only) job template."""

    id: UUID
    name: str
    schedule: str | None             # NULL: runs only when triggered
    timezone: str
    handler: str
    args: dict[str, Any]
    is_active: bool
    max_attempts: int
    next_run_at: datetime | None     # NULL when unscheduled, parked or unholdable (db._ts)
    skipped_ticks: int
    last_error: str | None           # why the next fire time could not be computed
    last_error_at: datetime | None
    created_by: str
    created_at: datetime
    updated_at: datetime


TASK_FIELDS = Task.FIELDS = _names(Task)


# A stored payload no reader here can parse (bounded.stored_json): its event is skipped.
UNREADABLE: Any = object()


@dataclass(frozen=True, slots=True)
class Event(_Row):
    """A stored event as a reader replays it (events_since_v2): at (tick, id) in delivery order."""

    tick: int
    id: int
    room: str | None                 # NULL: addressed to the user
    event: str
    payload: Any
    created_at: datetime

    @property
    def position(self) -> tuple[int, int]:
        """(tick, id): where this event stands in delivery order (cursor.py)."""
        return (int(self.tick), int(self.id))


EVENT_FIELDS = Event.FIELDS = _names(Event)
