"""A stand-in for the load balancer in front of the replicas, for browser tests.

Layer 4, like a Kubernetes Service: each accepted TCP connection goes to the
next backend in round-robin order, skipping backends that refuse the
connection (a stopped or draining replica has closed its listening socket),
and bytes are piped both ways untouched. So the browser sees one origin; the
Host and Origin headers pass through unchanged (the server's default
WebSocket origin check -- Origin must match Host -- holds); HTTP keep-alive
connections stay on the backend they were opened to, and a WebSocket lives
on exactly one replica, as behind a real balancer.

``hold()`` parks new connections (accepted, not yet forwarded) until
``release()``: the "balancer has not noticed yet" window, which lets a test
publish events while the browser is provably disconnected, without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter


class RoundRobinProxy:
    def __init__(self, backends: list[tuple[str, int]], host: str = "127.0.0.1") -> None:
        self.backends = list(backends)
        self.host = host
        self.port = 0
        self.routed: Counter[tuple[str, int]] = Counter()   # connections forwarded per backend
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._gate: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- control (from the test thread) ---------------------------------------------------
    def start(self) -> "RoundRobinProxy":
        self._thread = threading.Thread(target=self._run, name="lb-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error:
            raise RuntimeError(f"proxy did not start: {self._error!r}")
        return self

    def hold(self) -> None:
        self._call(lambda: self._gate.clear())  # type: ignore[union-attr]

    def release(self) -> None:
        self._call(lambda: self._gate.set())  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def _call(self, fn) -> None:  # type: ignore[no-untyped-def]
        assert self._loop is not None
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()
        self._loop.call_soon_threadsafe(run)
        if not done.wait(5):
            raise RuntimeError("proxy loop is not responding")

    # -- the loop thread ---------------------------------------------------------------------
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _start(self) -> None:
        self._gate = asyncio.Event()
        self._gate.set()
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()

    async def _connect_backend(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        n = len(self.backends)
        for _ in range(n):
            backend = self.backends[self._next % n]
            self._next += 1
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(*backend), 2)
            except (OSError, asyncio.TimeoutError):
                continue   # dead or draining: try the next one
            self.routed[backend] += 1
            return r, w
        return None

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self._writers.add(c_writer)
        try:
            await self._gate.wait()  # type: ignore[union-attr]
            up = await self._connect_backend()
            if up is None:
                return
            b_reader, b_writer = up
            self._writers.add(b_writer)
            try:
                await asyncio.gather(self._pipe(c_reader, b_writer), self._pipe(b_reader, c_writer))
            finally:
                self._writers.discard(b_writer)
                b_writer.close()
        finally:
            self._writers.discard(c_writer)
            c_writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # one side is done: end the whole connection (both directions)
            writer.close()
