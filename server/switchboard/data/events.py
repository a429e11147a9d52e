"""Events on the request pool: publishing (notify_user, notify_room, a client's
typing event) and the reads a resume replays."""

from __future__ import annotations

from typing import Any, cast
from uuid import UUID

from psycopg.types.json import Jsonb

from ..bounded import BadInput, stored_json
from ..rows import UNREADABLE, Event
from .columns import EVENT_COLUMNS
from .pool import PoolBase, Row


class EventQueries(PoolBase):
    """Publish events; page through them for a resume."""

    async def notify_user(self, user_id: UUID, event: str, payload: Any) -> int:
        return cast("int", await self.scalar("SELECT switchboard.notify_user(%s, %s, %s)", (user_id, event, Jsonb(payload))))

    async def notify_room(self, room: str, event: str, payload: Any) -> int:
        return cast("int", await self.scalar("SELECT switchboard.notify_room(%s, %s, %s)", (room, event, Jsonb(payload))))

    async def publish_client_event(self, sender: UUID, room: str, event: str, payload: Any) -> None:
        await self.fetchone("SELECT switchboard.publish_client_event(%s, %s, %s, %s)",
                            (sender, room, event, Jsonb(payload)))

    async def events_since_v2(self, user_id: UUID, after: tuple[int, int], rooms: list[str],
                              through_tick: int | None, limit: int) -> list[Event]:
        """A page of the events a resume replays. Payloads are read as text and parsed
        here: one no Python reader can parse (nested too deep: a row stored before V0020
        or written by hand) comes back as rows.UNREADABLE, which the resume skips, instead
        of failing the page, and with it every resume of that user, for good."""
        rows = await self.fetchall(
            f"SELECT {EVENT_COLUMNS.replace('payload', 'payload::text AS payload')} "
            "FROM switchboard.events_since_v2(%s, %s, %s, %s, %s, %s)",
            (user_id, after[0], after[1], rooms, through_tick, limit))
        for r in rows:
            try:
                r["payload"] = stored_json(r["payload"])
            except BadInput:
                r["payload"] = UNREADABLE
        return [Event.from_row(r) for r in rows]

    async def event_window(self) -> Row:
        row = await self.fetchone("SELECT first_tick, last_tick, reaped_through, publishers_notify FROM switchboard.event_window()")
        assert row is not None
        return row

    async def event_batch(self, event_id: int) -> int | None:
        tick = await self.scalar("SELECT switchboard.event_batch(%s)", (event_id,))
        return None if tick is None else int(tick)
