"""The data layer's names where the rest of the server imports them from.

The code is the package switchboard.data (this module's name is taken by the
server/switchboard/db link to the SQL files, so the package could not be
switchboard.db): the pool, one query module per area, the sql-job executor.
"""

from __future__ import annotations

from .data import (EVENT_COLUMNS, HANDLER_COLUMNS, PREPARED_STATEMENT_SQLSTATES, RUN_COLUMNS, RUN_DETAIL_COLUMNS,
                   RUN_VIEW_COLUMNS, TASK_COLUMNS, UNCHECKED, CheckIfIdle, Database, Row, SqlJobTimeout,
                   conninfo_with_keepalives)

__all__ = [
    "EVENT_COLUMNS", "HANDLER_COLUMNS", "PREPARED_STATEMENT_SQLSTATES", "RUN_COLUMNS", "RUN_DETAIL_COLUMNS",
    "RUN_VIEW_COLUMNS", "TASK_COLUMNS", "UNCHECKED", "CheckIfIdle", "Database", "Row", "SqlJobTimeout",
    "conninfo_with_keepalives",
]
