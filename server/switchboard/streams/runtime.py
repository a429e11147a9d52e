"""StreamsRuntime: one replica's producer and hub, and the LISTEN connection that
wakes them (channels switchboard_stream and switchboard_stream_stop: the relay's
``NotifyListener``, a second one: chunks are the highest-rate traffic there is and
must never delay an event's read)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from ..config import Config
from ..metrics import Metrics
from ..relay.listener import NotifyListener
from .hub import StreamHub
from .writer import Producer

CHANNEL = "switchboard_stream"
STOP_CHANNEL = "switchboard_stream_stop"
READ_SQL = "SELECT * FROM switchboard.stream_read_many(%s, %s, %s)"


class StreamsRuntime:
    """The producer and the hub of one replica, and the connection that wakes them."""

    def __init__(self, db: Any, config: Config, metrics: Metrics) -> None:
        self.producer = Producer(db, window=config.stream_flush_seconds)
        self.hub = StreamHub(db.stream_read_many,
                             on_error=lambda what: metrics.inc("switchboard_stream_errors_total", what=what),
                             on_behind=lambda: metrics.inc("switchboard_stream_catch_ups_total"))
        self.listener = NotifyListener(config.listen_database_url or config.database_url, (CHANNEL, STOP_CHANNEL),
                                       config.listen_check_interval, metrics, dispatch=self._dispatch,
                                       on_session=self._on_session, on_idle=lambda: None,
                                       names=("switchboard-stream-listen", "switchboard-stream-read"),
                                       reconnect_metric="switchboard_stream_listen_reconnects_total")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.producer.start()
        self._task = asyncio.get_running_loop().create_task(self.listener.run(), name="streams-listen")

    async def stop(self) -> None:
        await self.listener.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.producer.stop()

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == STOP_CHANNEL:
            self.producer.hint_stop(payload)
        self.hub.hint(payload)

    async def _on_session(self, reader: psycopg.AsyncConnection[Any]) -> asyncio.Task[None]:
        self.hub.reconnected()
        self.producer.check_all()

        async def read_on(ids: Any, afters: Any, max_rows: int) -> list[tuple[Any, ...]]:
            cur = reader.cursor(row_factory=psycopg.rows.tuple_row)
            await cur.execute(READ_SQL, (list(ids), list(afters), max_rows))
            return await cur.fetchall()

        return asyncio.get_running_loop().create_task(self.hub.run(read_on), name="streams-read")
