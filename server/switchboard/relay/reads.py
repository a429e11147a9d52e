"""The relay's event reads, on its own reader connection.

Every page comes with the retained window (event_window()) seen in the SAME
snapshot as its rows (one statement: STABLE functions share the calling query's
snapshot). So a relay whose position fell below the window -- events after it
were reaped before it read them -- knows it from the page itself, whatever path
brought it there (a stall, a long catch-up, a paused process), and never skips
reaped events silently (stream.py sends resume_gap).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg import sql

from ..cursor import Position

Row = dict[str, Any]

# LIMIT 1: event_window() returns one row, but the planner assumes 1,000 for any set-
# returning function; joined with relay_read_v2's 1,000 that made a plan of 1,000,000
# rows, past jit_above_cost, and every read paid ~12 ms of JIT compilation (figure 5's
# p50 went from 8 to 25 ms, PostgreSQL CPU per event 4x). With it the plan costs ~80.
_PAGE = (
    "SELECT w.first_tick AS w_first, w.reaped_through AS w_reaped, r.tick, r.id, r.ephemeral, r.user_id, "
    "r.room, r.event, r.sender, r.payload::text AS payload, r.ts "
    "FROM (SELECT first_tick, reaped_through FROM switchboard.event_window() LIMIT 1) w "
    "LEFT JOIN LATERAL switchboard.relay_read_v2({}::bigint, {}::bigint, {}::bigint[], {}::integer) "
    "WITH ORDINALITY r ON true ORDER BY r.ordinality")


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
    first = int(rows[0]["w_first"]) if rows else 0
    reaped = int(rows[0]["w_reaped"]) if rows else 0
    return Page(tick, first, reaped, [r for r in rows if r["id"] is not None])


class SqlReads:
    """The reads as PostgreSQL answers them (relay_read_v2 + event_window, V0009/V0020)."""

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
