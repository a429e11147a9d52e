"""The column lists the data layer selects: rows.Run, rows.Task and rows.Event hold
exactly these (tests/unit/test_rows.py), so Python never builds SQL from input."""

from __future__ import annotations


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
    "error, retry_of, created_at, queue, priority"
)
# switchboard.runs (the view), as a listing shows it and as one run is shown.
RUN_VIEW_COLUMNS = (
    "id, task_id, task_name, handler, status, trigger, attempt, max_attempts, worker, created_at, "
    f"{_ts('run_at')}, started_at, finished_at, duration_ms, error, retry_of"
)
RUN_DETAIL_COLUMNS = (
    f"{RUN_VIEW_COLUMNS}, lease_expires_at, {_ts('scheduled_for')}, queueing_lock, args, result, "
    # not in the runs view: the function files (the view among them) load at older migration
    # targets too, where task_runs has no such columns (V0030)
    "(SELECT t.queue FROM switchboard.task_runs t WHERE t.id = runs.id) AS queue, "
    "(SELECT t.priority FROM switchboard.task_runs t WHERE t.id = runs.id) AS priority"
)
HANDLER_COLUMNS = "handler AS name, paused, paused_at, served, live_replicas AS replicas, versions, " \
                  "active_tasks, pending_runs"
TASK_COLUMNS = (
    f"id, name, schedule, timezone, handler, args, is_active, max_attempts, {_ts('next_run_at')}, "
    "skipped_ticks, last_error, last_error_at, created_by, created_at, updated_at"
)
# events_since_v2's columns, as rows.Event holds them
EVENT_COLUMNS = "tick, id, room, event, payload, created_at"
