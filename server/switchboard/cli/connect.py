"""The admin chores' database access.

Every one goes through the server's own data layer (switchboard.db.Database), so the
CLI sends exactly the SQL the HTTP API sends, reads timestamps the same way (a task
parked at 'infinity' lists as "never" instead of crashing the command), and there is
one place to review it. One connection, opened per command.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .common import _die, _require_env

if TYPE_CHECKING:   # imported where used: `switchboard --help` stays quick
    from ..db import Database


def _run_db(op: Any, url: str | None = None) -> int:
    """Run ``await op(db)`` against DATABASE_URL; SQL errors become one line and exit 1."""
    import asyncio

    import psycopg
    import psycopg_pool

    from ..db import Database

    url = url or _require_env("DATABASE_URL")

    async def main() -> int:
        # The pool retries quietly and then only says it timed out; one plain connect first
        # fails fast and says why.
        try:
            await (await psycopg.AsyncConnection.connect(url, connect_timeout=5)).close()
        except psycopg.Error as exc:
            _die(f"cannot connect to the database: {str(exc).strip()}", 1)
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        db = Database(url, min_size=1, max_size=1, timeout=10.0, name="switchboard-cli", prepare_threshold=None)
        try:
            await db.pool.open(wait=True, timeout=10.0)
        except psycopg_pool.PoolTimeout:
            _die("cannot connect to the database: timed out", 1)
        try:
            return int(await op(db) or 0)
        except psycopg.Error as exc:
            _sql_error(exc)
            return 1
        finally:
            await db.close()

    return asyncio.run(main())


def _sql_error(exc: Exception) -> None:
    import psycopg

    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        hint = f" (hint: {exc.diag.message_hint})" if exc.diag.message_hint else ""
        _die(f"{exc.diag.message_primary}{hint}", 1)
    _die(str(exc), 1)


def _ensure_user(url: str, username: str, role: str, password: str) -> None:
    from ..auth import hash_password

    async def op(db: Database) -> None:
        uid = await db.find_user_id(username)
        if uid is None:
            await db.create_user(username, hash_password(password), role)
        else:
            await db.set_user_password_hash(uid, hash_password(password))
            await db.set_user_role(uid, role)

    _run_db(op, url)


async def _user_id(db: Any, name: str) -> Any:
    uid = await db.find_user_id(name)
    if uid is None:
        _die(f"no user named {name!r}", 1)
    return uid

