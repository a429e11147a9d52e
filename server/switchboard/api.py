"""Publish, enqueue and stream from your own Python code, in your own transaction.

Every call runs one statement on the connection you pass and commits nothing: the
event, the job or the stream exists iff *your* transaction commits, and the
wake-ups (NOTIFY) go out at that COMMIT. On a connection in autocommit mode each
call is its own transaction, as any statement would be. ::

    from switchboard import api

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders ...")
        api.notify_user(conn, user_id, "order.saved", {"order": 42})
        api.enqueue(conn, "invoice.send", {"order": 42})
    # both happened, or (an exception above: rolled back) neither did

    async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
        await api.notify_user_async(aconn, user_id, "order.saved", {"order": 42})

The target may be a psycopg ``Connection`` / ``AsyncConnection``, a cursor of one,
or a ``Transaction`` block you are inside. From an ORM, pass the driver's connection,
inside the ORM's transaction (examples/orm, docs/how-to/orm.md; tests/test_orm_examples.py):

- Django 4.2+ (psycopg 3 installed): ``django.db.connection.connection`` inside
  ``transaction.atomic()``. It is None until Django connects (atomic() does; outside
  one, call ``connection.ensure_connection()`` first). Django's cursors bind
  client-side (``psycopg.ClientCursor``); the calls work with them.
- SQLAlchemy 2 on ``postgresql+psycopg://``: ``session.connection().connection.
  driver_connection``; with an ``AsyncSession``, ``(await (await session.connection())
  .get_raw_connection()).driver_connection`` for the ``*_async`` twins.

The rules (labels, sizes, SQLSTATEs and HINTs) are the SQL functions' own
(docs/reference/sql.md): a refusal is the ``psycopg.Error`` they raise, with
``.sqlstate`` and ``.diag.message_hint``, and leaves your transaction aborted as any
failed statement does. Arguments Python can check without the database (a user id
that is not a UUID, a payload that is not JSON) raise ``TypeError`` / ``ValueError``
before anything is sent. The role needs EXECUTE on the functions it calls.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Union
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row

from .jobargs import ArgsError, dump_args

SyncTarget = Union["psycopg.Connection[Any]", "psycopg.Cursor[Any]", psycopg.Transaction]
AsyncTarget = Union["psycopg.AsyncConnection[Any]", "psycopg.AsyncCursor[Any]", psycopg.AsyncTransaction]

__all__ = [
    "notify_user", "notify_room", "enqueue", "stream_open", "stream_append", "stream_close",
    "notify_user_async", "notify_room_async", "enqueue_async", "stream_open_async", "stream_append_async",
    "stream_close_async",
]

# One statement each: nothing else runs in the caller's transaction.
_NOTIFY_USER = "SELECT switchboard.notify_user(%s, %s, %s::jsonb)"
_NOTIFY_ROOM = "SELECT switchboard.notify_room(%s, %s, %s::jsonb)"
_ENQUEUE = "SELECT id FROM switchboard.enqueue(%s, %s::jsonb, coalesce(%s, now()), %s, %s, %s, %s)"
_STREAM_OPEN = "SELECT switchboard.stream_open(%s, %s, %s::jsonb, %s, %s, %s)"
_STREAM_APPEND = "SELECT switchboard.stream_append(%s, %s::text[])"
_STREAM_CLOSE = "SELECT switchboard.stream_close(%s, %s, %s::jsonb)"


def _uuid(value: UUID | str, name: str) -> UUID:
    if isinstance(value, UUID):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a UUID or its string, not {type(value).__name__}")
    try:
        return UUID(value)
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a UUID") from None


def _json(value: Any, name: str) -> str:
    """Serialised here (once), so a value JSON cannot carry fails before the statement is sent."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"{name} must be JSON-serialisable: {exc}") from None


def _interval(seconds: float | timedelta, name: str) -> timedelta:
    if isinstance(seconds, timedelta):
        return seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be seconds (a number) or a timedelta, not {type(seconds).__name__}")
    return timedelta(seconds=seconds)


def _chunks(chunks: Sequence[str]) -> list[str]:
    if isinstance(chunks, str) or not all(isinstance(c, str) for c in chunks):
        raise TypeError("chunks must be a sequence of str (a single chunk: [text])")
    return list(chunks)


def _cursor(target: SyncTarget) -> psycopg.Cursor[Any]:
    if isinstance(target, psycopg.Transaction):
        target = target.connection
    if isinstance(target, psycopg.Cursor):
        target = target.connection
    if isinstance(target, psycopg.Connection):
        return target.cursor(row_factory=tuple_row)
    raise TypeError("expected a psycopg Connection, Cursor or Transaction "
                    f"(an async one goes to the *_async twin), got {type(target).__name__}")


def _acursor(target: AsyncTarget) -> psycopg.AsyncCursor[Any]:
    if isinstance(target, psycopg.AsyncTransaction):
        target = target.connection
    if isinstance(target, psycopg.AsyncCursor):
        target = target.connection
    if isinstance(target, psycopg.AsyncConnection):
        return target.cursor(row_factory=tuple_row)
    raise TypeError("expected a psycopg AsyncConnection, AsyncCursor or AsyncTransaction "
                    f"(a sync one goes to the twin without _async), got {type(target).__name__}")


def _one(target: SyncTarget, sql: str, params: tuple[Any, ...]) -> Any:
    with _cursor(target) as cur:
        row = cur.execute(sql, params).fetchone()
    return None if row is None else row[0]


async def _aone(target: AsyncTarget, sql: str, params: tuple[Any, ...]) -> Any:
    async with _acursor(target) as cur:
        await cur.execute(sql, params)
        row = await cur.fetchone()
    return None if row is None else row[0]


# -- the arguments of each call, checked once for both twins ----------------------------------
def _notify_user_args(user_id: UUID | str, event: str, payload: Any) -> tuple[Any, ...]:
    return (_uuid(user_id, "user_id"), event, _json({} if payload is None else payload, "payload"))


def _notify_room_args(room: str, event: str, payload: Any) -> tuple[Any, ...]:
    return (room, event, _json({} if payload is None else payload, "payload"))


def _enqueue_args(handler: str, args: Any, args_type: Any, run_at: datetime | None, queueing_lock: str | None,
                  max_attempts: int | None, priority: int | None, queue: str | None) -> tuple[Any, ...]:
    if args is not None and not isinstance(args, dict) and not dataclasses.is_dataclass(args):
        raise TypeError(f"args must be a dict (a JSON object) or a dataclass instance, not {type(args).__name__}")
    try:
        data = dump_args(args, args_type)   # checks a dataclass's fields, or a dict against args_type
    except ArgsError as exc:
        exc.handler = handler
        raise
    return (handler, _json(data, "args"), run_at, queueing_lock, max_attempts, priority, queue)


def _stream_open_args(user_id: UUID | str, kind: str, meta: dict[str, Any] | None, room: str | None,
                      lease: float | timedelta, lifetime: float | timedelta) -> tuple[Any, ...]:
    return (_uuid(user_id, "user_id"), kind, _json(meta or {}, "meta"), room, _interval(lease, "lease"),
            _interval(lifetime, "lifetime"))


def _stream_close_args(stream_id: UUID | str, status: str, final: Any) -> tuple[Any, ...]:
    return (_uuid(stream_id, "stream_id"), status, None if final is None else _json(final, "final"))


# -- sync --------------------------------------------------------------------------------------
def notify_user(target: SyncTarget, user_id: UUID | str, event: str, payload: Any = None) -> int:
    """Publish ``event`` to every socket of ``user_id`` iff your transaction commits. The event id."""
    return int(_one(target, _NOTIFY_USER, _notify_user_args(user_id, event, payload)))


def notify_room(target: SyncTarget, room: str, event: str, payload: Any = None) -> int:
    """Publish ``event`` to every member of ``room`` iff your transaction commits. The event id."""
    return int(_one(target, _NOTIFY_ROOM, _notify_room_args(room, event, payload)))


def enqueue(target: SyncTarget, handler: str, args: Any = None, *, args_type: Any = None,
            run_at: datetime | None = None, queueing_lock: str | None = None, max_attempts: int | None = None,
            priority: int | None = None, queue: str | None = None) -> int | None:
    """Queue a run of ``handler`` iff your transaction commits (workers wake at COMMIT). The
    run id; None when ``queueing_lock`` is held by a queued or running job (nothing queued).

    ``args``: a dict, or an instance of the handler's args dataclass (its fields are checked
    here; ``args_type`` checks a dict against a dataclass or TypedDict): a wrong field raises
    ``jobargs.ArgsError`` naming it, before anything is sent. ``max_attempts``,
    ``priority`` (-100..100, higher first) and ``queue``: None takes the handler's
    registered options (switchboard.handler_options), else 3, 0 and ``default``."""
    rid = _one(target, _ENQUEUE, _enqueue_args(handler, args, args_type, run_at, queueing_lock, max_attempts,
                                               priority, queue))
    return None if rid is None else int(rid)


def stream_open(target: SyncTarget, user_id: UUID | str, kind: str, *, meta: dict[str, Any] | None = None,
                room: str | None = None, lease: float | timedelta = 30.0,
                lifetime: float | timedelta = 3600.0) -> UUID:
    """Open a stream owned by ``user_id`` (visible once your transaction commits). Its id:
    append with :func:`stream_append` within ``lease`` seconds of each other, end with
    :func:`stream_close`."""
    sid = _one(target, _STREAM_OPEN, _stream_open_args(user_id, kind, meta, room, lease, lifetime))
    return sid if isinstance(sid, UUID) else UUID(str(sid))


def stream_append(target: SyncTarget, stream_id: UUID | str, chunks: Sequence[str]) -> int:
    """Append ``chunks`` (in order) to an open stream; its last sequence number."""
    return int(_one(target, _STREAM_APPEND, (_uuid(stream_id, "stream_id"), _chunks(chunks))))


def stream_close(target: SyncTarget, stream_id: UUID | str, status: str = "done", final: Any = None) -> int:
    """End a stream (``done`` or ``error``) with an optional ``final`` JSON value: the id of
    the one durable ``stream.end`` event readers receive."""
    return int(_one(target, _STREAM_CLOSE, _stream_close_args(stream_id, status, final)))


# -- async twins -------------------------------------------------------------------------------
async def notify_user_async(target: AsyncTarget, user_id: UUID | str, event: str, payload: Any = None) -> int:
    """:func:`notify_user` on an ``AsyncConnection``."""
    return int(await _aone(target, _NOTIFY_USER, _notify_user_args(user_id, event, payload)))


async def notify_room_async(target: AsyncTarget, room: str, event: str, payload: Any = None) -> int:
    """:func:`notify_room` on an ``AsyncConnection``."""
    return int(await _aone(target, _NOTIFY_ROOM, _notify_room_args(room, event, payload)))


async def enqueue_async(target: AsyncTarget, handler: str, args: Any = None, *, args_type: Any = None,
                        run_at: datetime | None = None, queueing_lock: str | None = None,
                        max_attempts: int | None = None, priority: int | None = None,
                        queue: str | None = None) -> int | None:
    """:func:`enqueue` on an ``AsyncConnection``."""
    rid = await _aone(target, _ENQUEUE, _enqueue_args(handler, args, args_type, run_at, queueing_lock,
                                                      max_attempts, priority, queue))
    return None if rid is None else int(rid)


async def stream_open_async(target: AsyncTarget, user_id: UUID | str, kind: str, *,
                            meta: dict[str, Any] | None = None, room: str | None = None,
                            lease: float | timedelta = 30.0, lifetime: float | timedelta = 3600.0) -> UUID:
    """:func:`stream_open` on an ``AsyncConnection``."""
    sid = await _aone(target, _STREAM_OPEN, _stream_open_args(user_id, kind, meta, room, lease, lifetime))
    return sid if isinstance(sid, UUID) else UUID(str(sid))


async def stream_append_async(target: AsyncTarget, stream_id: UUID | str, chunks: Sequence[str]) -> int:
    """:func:`stream_append` on an ``AsyncConnection``."""
    return int(await _aone(target, _STREAM_APPEND, (_uuid(stream_id, "stream_id"), _chunks(chunks))))


async def stream_close_async(target: AsyncTarget, stream_id: UUID | str, status: str = "done",
                             final: Any = None) -> int:
    """:func:`stream_close` on an ``AsyncConnection``."""
    return int(await _aone(target, _STREAM_CLOSE, _stream_close_args(stream_id, status, final)))
