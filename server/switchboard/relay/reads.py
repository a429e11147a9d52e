"""The relay's event reads, on its own reader connection.

relay_read_v3 (V0021) returns the retained window (event_window()'s first_tick
and reaped_through) as its first row, in the SAME snapshot as the rows after
the position. So a relay whose position fell below the window -- events after
it were reaped before it read them -- knows it from the read itself, whatever
path brought it there (a stall, a long catch-up, a paused process), and never
skips reaped events silently (stream.py sends resume_gap).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg import sql

from ..cursor import Position

Row = dict[str, Any]

_PAGE = ("SELECT kind, tick, id, kind = 'ephemeral' AS ephemeral, user_id, room, event, sender, "
         "payload::text AS payload, ts "
         "FROM switchboard.relay_read_v3({}::bigint, {}::bigint, {}::bigint[], {}::integer)")


class Page(NamedTuple):
    tick: int               # event_tick()'s answer: the tick now covering what committed
    #                         (-1: another replica is ticking), 0 if no tick was asked for
    first_tick: int         # the retained window, in the page's snapshot (event_window())
    reaped_through: int
    rows: list[Row]


class Reads(Protocol):
    async def tick_read(self, conn: Any, after: Position, eph: list[int], max_rows: int) -> Page: ...

    async def read(self, conn: Any, after: Position, eph: list[int], max_rows: int) -> Page: ...


def _query(after: Position, eph: list[int], max_rows: int) -> sql.Composed:
    # The relay's own integers (its position, bounded hint ids) as literals: tick_read
    # sends them in a simple-query string, which takes no parameters.
    return sql.SQL(_PAGE).format(sql.Literal(int(after[0])), sql.Literal(int(after[1])),
                                 sql.Literal([int(i) for i in eph]), sql.Literal(int(max_rows)))


def _page(tick: int, rows: list[Row]) -> Page:
    window = rows[0]        # relay_read_v3's first row, always
    return Page(tick, int(window["tick"]), int(window["id"]), rows[1:])


class SqlReads:
    """The reads as PostgreSQL answers them (relay_read_v3, V0021)."""

    async def tick_read(self, conn: psycopg.AsyncConnection[Any], after: Position, eph: list[int],
                        max_rows: int) -> Page:
        """event_tick() in a transaction of its own, then the page after it, in ONE round
        trip (one simple-query string: BEGIN; tick; COMMIT; read). The tick commits before
        the read starts, so the read sees it, and the ticker row is not held while reading."""
        q = sql.SQL("BEGIN; SELECT switchboard.event_tick() AS tick; COMMIT; ") + _query(after, eph, max_rows)
        cur = await conn.execute(q)
        sets: list[list[Row]] = []
        while True:
            if cur.description is not None:
                sets.append(await cur.fetchall())
            if not cur.nextset():
                break
        return _page(int(sets[0][0]["tick"]), sets[1])

    async def read(self, conn: psycopg.AsyncConnection[Any], after: Position, eph: list[int],
                   max_rows: int) -> Page:
        cur = await conn.execute(_query(after, eph, max_rows))
        return _page(0, await cur.fetchall())
