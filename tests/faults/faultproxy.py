"""A fault-injecting TCP proxy for tests (the way Toxiproxy works), in one thread.

The kernel of this machine has no ``netem`` qdisc, so delay, loss, stalls and
half-open connections between a replica and PostgreSQL are made here, in user
space, and can be changed while traffic flows::

    px = FaultProxy(("127.0.0.1", pg_port), listen=("10.201.3.1", 0)).start()
    px.set(latency_ms=200, jitter_ms=50, loss=0.05)   # both directions
    px.stall()          # hold every byte (both ways) until resume()
    px.resume()
    px.reset_all()      # RST every open connection, now
    px.half_open()      # drop the upstream side silently; the client sees silence
    px.set(blackhole=True)   # swallow bytes (open and new connections)
    px.set(refuse=True)      # new connections are reset at once
    px.clear()          # no faults
    px.stop()

What each fault means on the wire
- latency/jitter: each chunk is delivered ``latency +- jitter`` ms after it was
  read, in order (a later chunk never overtakes an earlier one, as in TCP).
- loss: a TCP stream never loses bytes; a lost segment shows up as a
  retransmission delay and head-of-line blocking. So with probability
  ``loss`` a chunk is held for an extra retransmission timeout (``rto_ms``,
  default 300 ms +- 50 %), and everything behind it waits too. Dropping bytes
  from the stream instead would corrupt the protocol, which real loss never does.
- stall: bytes are held (not read further by the peer) until ``resume()``; then
  they are delivered, as after a network outage that TCP survived.
- blackhole: bytes are read and discarded; the connection stays open. New
  connections are accepted and never connected upstream.
- half_open: the upstream side of every open connection is aborted (the
  server sees a reset); the client side stays open and hears nothing, like a
  peer that vanished without a FIN reaching the client.
- reset_all / refuse: RST (SO_LINGER 0) for open / new connections.

Toxics are read per chunk, so a change applies to open connections at once.
Counters (``stats()``) let a test assert that traffic really went through.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any

CHUNK = 65536


@dataclass
class Toxics:
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0           # probability that a chunk is "retransmitted" after rto_ms
    rto_ms: float = 300.0
    bandwidth: int = 0          # bytes per second, 0 = unlimited
    blackhole: bool = False
    refuse: bool = False


@dataclass
class _Conn:
    cid: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    half_open: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)


def _rst(w: asyncio.StreamWriter | None) -> None:
    """Abort with a TCP RST rather than a FIN."""
    if w is None:
        return
    sock = w.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    w.transport.abort()


class FaultProxy:
    """One listening address forwarding to one upstream, with faults injected in between."""

    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0),
                 name: str = "proxy", seed: int | None = None) -> None:
        self.upstream = upstream
        self.listen = listen
        self.name = name
        self.up = Toxics()      # client -> upstream
        self.down = Toxics()    # upstream -> client
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: dict[int, _Conn] = {}
        self._next = 0
        self._flowing: asyncio.Event | None = None      # cleared while stalled
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = 0
        self.counters = {"connections": 0, "refused": 0, "bytes_up": 0, "bytes_down": 0,
                         "delayed_chunks": 0, "lost_chunks": 0, "discarded_bytes": 0, "resets": 0}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._run, name=f"faultproxy-{self.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self.name}: proxy did not start")
        if self._error is not None:
            raise RuntimeError(f"{self.name}: cannot listen on {self.listen}: {self._error}")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._stop = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1],
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        self._server.close()
        for c in list(self._conns.values()):
            self._drop(c, rst=True)
        # the aborted transports end every pipe; cancel only what is still stuck after that
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if rest:
            _, pending = await asyncio.wait(rest, timeout=2)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen[0], self.port)

    # -- control (thread-safe) ------------------------------------------------------------------
    def set(self, direction: str = "both", **toxics: Any) -> None:
        """Change toxics for "up" (client -> upstream), "down" or "both"; others keep their values."""
        names = {f.name for f in fields(Toxics)}
        bad = set(toxics) - names
        if bad:
            raise ValueError(f"unknown toxic(s) {sorted(bad)}; known: {sorted(names)}")
        if direction in ("up", "both"):
            self.up = replace(self.up, **toxics)
        if direction in ("down", "both"):
            self.down = replace(self.down, **toxics)
        if direction not in ("up", "down", "both"):
            raise ValueError(f"direction must be up, down or both, not {direction!r}")

    def clear(self) -> None:
        """No faults (and flowing again if stalled)."""
        self.up, self.down = Toxics(), Toxics()
        self.resume()

    def stall(self) -> None:
        self._call(lambda: self._flowing.clear())  # type: ignore[union-attr]

    def resume(self) -> None:
        self._call(lambda: self._flowing.set())  # type: ignore[union-attr]

    def reset_all(self) -> int:
        """RST every open connection (both sides). Returns how many."""
        return self._call(self._reset_all)

    def half_open(self) -> int:
        """Abort the upstream side of every open connection; keep the client side silent."""
        return self._call(self._half_open)

    def stats(self) -> dict[str, int]:
        out = dict(self.counters)
        out["open"] = len(self._conns)
        return out

    def _call(self, fn: Any) -> Any:
        assert self._loop is not None, "proxy not started"
        fut = asyncio.run_coroutine_threadsafe(self._invoke(fn), self._loop)
        return fut.result(10)

    @staticmethod
    async def _invoke(fn: Any) -> Any:
        return fn()

    # -- the data path ---------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters["connections"] += 1
        if self.up.refuse or self.down.refuse:
            self.counters["refused"] += 1
            _rst(writer)
            return
        self._next += 1
        c = _Conn(self._next, writer)
        self._conns[c.cid] = c
        try:
            if self.up.blackhole or self.down.blackhole:
                c.half_open = True          # nothing upstream; swallow what the client sends
                await self._swallow(reader)
                return
            try:
                ur, uw = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 10)
            except (OSError, asyncio.TimeoutError):
                _rst(writer)
                return
            c.upstream = uw
            t1 = asyncio.create_task(self._pipe(c, reader, uw, "up"))
            t2 = asyncio.create_task(self._pipe(c, ur, writer, "down"))
            c.tasks = [t1, t2]
            done, _ = await asyncio.wait(c.tasks, return_when=asyncio.FIRST_COMPLETED)
            clean = all(not t.cancelled() and t.exception() is None and t.result() == "eof" for t in done)
            if c.half_open or clean:
                # a clean EOF one way: let the other direction finish; half-open: the
                # client side stays open until the client gives up
                await asyncio.gather(*c.tasks, return_exceptions=True)
            elif not c.half_open:
                self._drop(c, rst=True)     # one side was reset: so is the other
        finally:
            self._drop(c, rst=False)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            self.counters["discarded_bytes"] += len(data)

    async def _pipe(self, c: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str) -> str:
        """Read chunks, stamp each with its delivery time, deliver them in order."""
        q: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                item = await q.get()
                if item is None:
                    return
                due, data = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()  # type: ignore[union-attr]
                tox = self.up if direction == "up" else self.down
                if tox.blackhole or c.half_open:
                    self.counters["discarded_bytes"] += len(data)
                    continue
                if tox.bandwidth > 0:
                    await asyncio.sleep(len(data) / tox.bandwidth)
                writer.write(data)
                await writer.drain()
                self.counters["bytes_" + direction] += len(data)

        sender = asyncio.create_task(deliver())
        last_due = 0.0
        try:
            while True:
                read = asyncio.create_task(reader.read(CHUNK))
                done, _ = await asyncio.wait({read, sender}, return_when=asyncio.FIRST_COMPLETED)
                if sender in done:          # the writer side failed: stop reading
                    read.cancel()
                    sender.result()
                    return "error"
                data = read.result()
                if not data:
                    if c.half_open:
                        return "eof"
                    await q.put(None)
                    await sender
                    if not c.half_open:
                        try:
                            writer.write_eof()
                        except (OSError, RuntimeError):
                            pass
                    return "eof"
                tox = self.up if direction == "up" else self.down
                delay = tox.latency_ms
                if tox.jitter_ms:
                    delay += self._rng.uniform(-tox.jitter_ms, tox.jitter_ms)
                if tox.loss and self._rng.random() < tox.loss:
                    delay += tox.rto_ms * self._rng.uniform(0.5, 1.5)
                    self.counters["lost_chunks"] += 1
                if delay > 0:
                    self.counters["delayed_chunks"] += 1
                due = max(loop.time() + max(delay, 0) / 1000.0, last_due)
                last_due = due
                await q.put((due, data))
        except (ConnectionError, OSError):
            return "error"
        finally:
            if not sender.done():
                sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    def _drop(self, c: _Conn, rst: bool) -> None:
        self._conns.pop(c.cid, None)
        for t in c.tasks:
            t.cancel()
        for w in (c.client, c.upstream):
            if w is None:
                continue
            if rst:
                _rst(w)
            else:
                try:
                    w.close()
                except (OSError, RuntimeError):
                    pass

    def _reset_all(self) -> int:
        n = 0
        for c in list(self._conns.values()):
            n += 1
            self.counters["resets"] += 1
            self._drop(c, rst=True)
        return n

    def _half_open(self) -> int:
        n = 0
        for c in list(self._conns.values()):
            if c.upstream is not None and not c.half_open:
                c.half_open = True
                _rst(c.upstream)
                n += 1
        return n


def wait_port(host: str, port: int, timeout: float = 10) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
