"""The data layer: the request pool and every SQL statement the server sends.

Python never builds SQL from input: every statement is a constant with bound
parameters. Most methods call one switchboard.* function; a few read the tables
and views the application role may SELECT (tasks, task_runs, users), with the
column lists of ``columns``. Keeping them here keeps the SQL reviewable in one place.

(Not ``switchboard.db``: that name is the link to the repository's SQL directory;
the module switchboard/db.py re-exports this package's names.)

- ``pool``: connections, keepalives, the idle check, timeouts, the prepared-statement retry
- ``columns``: the column lists rows.Run / Task / Event hold
- one module per area: ``auth_queries``, ``users``, ``tasks``, ``scheduling``,
  ``operate``, ``events``, ``relay_reads``, ``rooms``, ``replicas``
- ``sql_jobs``: the sql task's executor, on connections of its own
- ``history``: the history reads, on a streaming replica while it keeps up (SWITCHBOARD_READ_DATABASE_URL)
- ``database``: Database, every area mixed into the pool
"""

from __future__ import annotations

from .columns import (EVENT_COLUMNS, HANDLER_COLUMNS, RUN_COLUMNS, RUN_DETAIL_COLUMNS, RUN_VIEW_COLUMNS,
                      TASK_COLUMNS)
from .database import Database
from .pool import PREPARED_STATEMENT_SQLSTATES, UNCHECKED, CheckIfIdle, Row, conninfo_with_keepalives
from .sql_jobs import SqlJobTimeout

__all__ = [
    "EVENT_COLUMNS", "HANDLER_COLUMNS", "PREPARED_STATEMENT_SQLSTATES", "RUN_COLUMNS", "RUN_DETAIL_COLUMNS",
    "RUN_VIEW_COLUMNS", "TASK_COLUMNS", "UNCHECKED", "CheckIfIdle", "Database", "Row", "SqlJobTimeout",
    "conninfo_with_keepalives",
]
