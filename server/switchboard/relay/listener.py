"""The LISTEN connection: connect, LISTEN, hear every notification, prove liveness.

``NotifyListener`` owns two autocommit connections per session -- the LISTEN
connection and the reader connection the relay reads with -- and reconnects
both with jittered backoff when either fails. It knows nothing of events: each
notification goes to ``dispatch(channel, payload)`` (parse, bound, never act);
``on_session(reader)`` runs first thing after every (re)connect and returns the
task that works on the reader connection for the session (the relay's read
loop); ``on_idle()`` after every liveness check that found the line quiet.
``on_listen_connection(job)`` runs a statement on the LISTEN connection (the
relay LISTENs on the live path's channel, which it learns only with the key):
at once during ``on_session``, between two waits while hearing.

Hearing: the LISTEN socket stays registered with the event loop for the whole
session and each readable event drains libpq's queue (consume_input,
notifies: C calls), as asyncpg's listener does. psycopg's ``notifies()``
generator instead registers and unregisters the socket and arms a timeout for
every batch: with one or two notifications per batch that machinery was a
large share of a replica's CPU under figure 5's load (py-spy; docs/explanation/benchmark-journal.md,
"The live path, fifth session"). When nothing was
heard for ``check_interval`` seconds a ``SELECT 1`` proves the connection alive
(bounded without cancelling: see ``bounded_wait``), so a half-open TCP
connection is noticed (plus TCP keepalives).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..db import conninfo_with_keepalives
from ..metrics import Metrics

LOG = logging.getLogger("switchboard.relay")

Dispatch = Callable[[str, str], None]
OnSession = Callable[[psycopg.AsyncConnection[Any]], Awaitable["asyncio.Task[None]"]]
Job = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


async def bounded_wait(coro: Any, timeout: float, what: str) -> Any:
    """Await ``coro`` for at most ``timeout`` s WITHOUT cancelling it on timeout.

    asyncio.wait_for() would cancel the query, and psycopg answers a cancellation by
    sending a cancel request and waiting for it (5 s), then for the query to stop (5 s
    more): over a dead link a 1 s liveness check took 11 s. Here the caller gets a
    TimeoutError at once and closes the connection, which ends the query."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise TimeoutError(f"{what}: no answer within {timeout:.1f} s")
    return task.result()


async def abandon(task: asyncio.Task[Any], conn: psycopg.AsyncConnection[Any] | None,
                  grace: float = 2.0) -> None:
    """Stop ``task``, which may be inside a query on ``conn``, without a network wait.

    Cancelling a task in the middle of a query makes psycopg send a cancel request
    and wait for the query to end (up to 5 s + 5 s over a dead link). Closing the
    connection first (libpq's finish: local and immediate) leaves psycopg nothing
    to cancel, so the task ends at once; ``grace`` bounds the wait regardless."""
    if conn is not None:
        await conn.close()
    task.cancel()
    await asyncio.wait({task}, timeout=grace)


class NotifyListener:
    def __init__(self, url: str, channels: Sequence[str], check_interval: float, metrics: Metrics, *,
                 dispatch: Dispatch, on_session: OnSession, on_idle: Callable[[], None],
                 names: tuple[str, str] = ("switchboard-listen", "switchboard-relay-read"),
                 reconnect_metric: str = "switchboard_listen_reconnects_total") -> None:
        """``names``: the application_name of the LISTEN and the reader connection (what
        pg_stat_activity shows); ``reconnect_metric`` counts the sessions."""
        self.url = url
        self.names = names
        self.reconnect_metric = reconnect_metric
        self.channels = tuple(channels)
        self.check_interval = check_interval
        self.metrics = metrics
        self.dispatch = dispatch
        self.on_session = on_session
        self.on_idle = on_idle
        self.connected = False
        self.last_error: str | None = "not connected yet"
        self.down_since: float | None = time.monotonic()
        self.reader: psycopg.AsyncConnection[Any] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._hearing: int | None = None    # the LISTEN socket's fd while the loop watches it
        self._stop = asyncio.Event()
        self._in_hear = False                # hear() owns the LISTEN connection
        self._jobs: list[tuple[Job, asyncio.Future[None]]] = []
        self._job_signal: asyncio.Future[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, hear, reconnect with backoff: until stop()."""
        delay = 0.2
        while not self._stop.is_set():
            try:
                await self._session()
                delay = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost, server down, liveness timeout
                if self.connected or self.last_error is None:
                    LOG.warning("LISTEN connection lost: %s", str(exc).strip() or type(exc).__name__)
                self.last_error = f"LISTEN connection down: {str(exc).strip() or type(exc).__name__}"
            finally:
                self._mark_down()
                await self._close_connections()
            if self._stop.is_set():
                break
            try:
                await asyncio.wait_for(self._stop.wait(), delay * (0.5 + random.random()))
            except asyncio.TimeoutError:
                pass
            # Capped at 2 s (x0.5-1.5 jitter): after a PostgreSQL failover the relay is what
            # keeps the replica unready, and a 5 s cap left replicas 503 for up to ~7 s after
            # the new primary took writes (tests/pgha).
            delay = min(delay * 2, 2.0)

    async def stop(self) -> None:
        self._stop.set()
        if self._hearing is not None:
            # Unregister the LISTEN socket before its connection closes: once closed, its
            # fd number may be reused by a new socket while the loop still watches it.
            asyncio.get_running_loop().remove_reader(self._hearing)
            self._hearing = None
        for conn in (self._conn, self.reader):
            if conn is not None:
                try:
                    await conn.close()
                except Exception:
                    pass

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _mark_down(self) -> None:
        if self.connected or self.down_since is None:
            self.down_since = time.monotonic()
        self.connected = False

    async def _close_connections(self) -> None:
        for attr in ("_conn", "reader"):
            conn = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None:
                try:
                    await asyncio.wait_for(conn.close(), 2)
                except Exception:
                    pass

    async def _connect(self, name: str) -> psycopg.AsyncConnection[Any]:
        return await asyncio.wait_for(
            psycopg.AsyncConnection.connect(self.url, autocommit=True, application_name=name,
                                            row_factory=dict_row, **conninfo_with_keepalives()),
            timeout=10)

    async def _session(self) -> None:
        self._in_hear = False
        conn = self._conn = await self._connect(self.names[0])
        self.reader = await self._connect(self.names[1])
        for ch in self.channels:
            await bounded_wait(conn.execute(f"LISTEN {ch}"), max(self.check_interval, 1.0), "LISTEN")
        self.metrics.inc(self.reconnect_metric)
        worker = await self.on_session(self.reader)
        try:
            self.connected = True
            self.down_since = None
            self.last_error = None
            LOG.info("LISTEN connection up (%s)", ", ".join(self.channels))
            await self.hear(conn, worker)
        finally:
            # Down from this moment (readiness 503, the deaf-close clock starts), not after
            # the clean-up below: it may wait on a dead network.
            self._mark_down()
            await abandon(worker, self.reader)

    async def on_listen_connection(self, job: Job) -> None:
        """Run ``job(conn)`` on this session's LISTEN connection and wait for it. During
        ``on_session`` (before hearing starts) it runs at once; while hearing, the hear
        loop runs it between two waits, with the socket handed back to psycopg as for a
        liveness check (what arrives meanwhile is dispatched in order). Bounded like a
        liveness check; a failure ends the session (raised here too, or the waiting
        task is cancelled with the session)."""
        conn = self._conn
        if conn is None:
            raise RuntimeError("the LISTEN connection is down")
        if not self._in_hear:
            await bounded_wait(job(conn), max(self.check_interval, 1.0), "LISTEN statement")
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._jobs.append((job, done))
        signal = self._job_signal
        if signal is not None and not signal.done():
            signal.set_result(None)
        await done

    # -- hearing -------------------------------------------------------------------------------
    async def hear(self, conn: psycopg.AsyncConnection[Any], worker: asyncio.Task[None]) -> None:
        """Dispatch every notification as it arrives; when none came for ``check_interval``,
        prove the connection alive. Returns only by raising (the connection or the worker
        failed), or when the listener stops. During a liveness check psycopg owns the
        socket and hands what arrives meanwhile to the notify handler."""
        loop = asyncio.get_running_loop()
        pgconn = conn.pgconn
        enc = conn.info.encoding
        fd = pgconn.socket
        failed: asyncio.Future[None] = loop.create_future()
        heard = 0
        dispatch = self.dispatch

        def readable() -> None:
            nonlocal heard
            try:
                pgconn.consume_input()
                while (n := pgconn.notifies()) is not None:
                    heard += 1
                    dispatch(n.relname.decode(enc), n.extra.decode(enc))
            except Exception as exc:   # the connection broke (or a dispatch bug): reconnect
                loop.remove_reader(fd)
                self._hearing = None
                if not failed.done():
                    failed.set_exception(exc)

        def during_check(n: psycopg.Notify) -> None:
            nonlocal heard
            heard += 1
            dispatch(n.channel, n.payload)

        self._in_hear = True     # from here on, statements on conn go through _serve
        try:
            # Heard while LISTEN ran and the relay caught up, dispatched only now: after
            # on_session's barrier (nothing of it goes live before the catch-up read).
            async for n in conn.notifies(timeout=0):
                heard += 1
                dispatch(n.channel, n.payload)
            conn.add_notify_handler(during_check)
            self._watch(fd, readable)
            readable()      # anything libpq holds already: epoll only reports new bytes
            await self._serve(conn, fd, readable, worker, failed, lambda: heard)
        finally:
            self._end_hearing(fd, failed)

    async def _serve(self, conn: psycopg.AsyncConnection[Any], fd: int, readable: Callable[[], None],
                     worker: asyncio.Task[None], failed: asyncio.Future[None], heard: Callable[[], int]) -> None:
        """Wait for the worker or the connection to fail, a statement to run on the
        connection (on_listen_connection), or ``check_interval`` of quiet (a liveness check)."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            before = heard()
            signal = self._job_signal = loop.create_future()
            if self._jobs:
                signal.set_result(None)
            await asyncio.wait({worker, failed, signal}, timeout=self.check_interval,
                               return_when=asyncio.FIRST_COMPLETED)
            self._raise_if_done(failed, worker)
            if self._jobs:
                await self._run_jobs(conn, fd, readable)
            elif heard() == before:
                await self._prove_alive(conn, fd, readable)

    def _end_hearing(self, fd: int, failed: asyncio.Future[None]) -> None:
        self._in_hear = False
        self._job_signal = None
        for _, done in self._jobs:
            done.cancel()      # the session ended: the task waiting for it ends with it
        self._jobs.clear()
        if self._hearing == fd:
            asyncio.get_running_loop().remove_reader(fd)
            self._hearing = None
        if not failed.done():
            failed.cancel()
        elif not failed.cancelled():
            failed.exception()     # retrieved: raised above, or superseded by another error

    def _watch(self, fd: int, readable: Callable[[], None]) -> None:
        asyncio.get_running_loop().add_reader(fd, readable)
        self._hearing = fd

    @staticmethod
    def _raise_if_done(failed: asyncio.Future[None], worker: asyncio.Task[None]) -> None:
        if failed.done():
            failed.result()
        if worker.done():
            worker.result()  # the worker's connection failed: reconnect both
            raise RuntimeError("relay reader stopped")

    async def _run_jobs(self, conn: psycopg.AsyncConnection[Any], fd: int,
                        readable: Callable[[], None]) -> None:
        """The statements asked for with on_listen_connection, in order, with the socket
        handed to psycopg meanwhile (as in _prove_alive)."""
        asyncio.get_running_loop().remove_reader(fd)
        self._hearing = None
        while self._jobs:
            job, done = self._jobs.pop(0)
            if done.done():
                continue
            try:
                await bounded_wait(job(conn), max(self.check_interval, 1.0), "LISTEN statement")
            except BaseException:
                done.cancel()
                raise
            done.set_result(None)
        self._watch(fd, readable)
        readable()

    async def _prove_alive(self, conn: psycopg.AsyncConnection[Any], fd: int,
                           readable: Callable[[], None]) -> None:
        """Nothing heard for a while: prove the connection alive. Bounded without cancelling
        the query (see bounded_wait): a dead connection is noticed within check_interval +
        max(check_interval, 1 s)."""
        asyncio.get_running_loop().remove_reader(fd)
        self._hearing = None
        await bounded_wait(conn.execute("SELECT 1"), max(self.check_interval, 1.0), "liveness check")
        self._watch(fd, readable)
        readable()
        self.on_idle()
