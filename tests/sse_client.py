"""A small Server-Sent Events reader for tests: GET /sse in a thread, events in a queue."""

from __future__ import annotations

import json
import queue
import threading
from typing import Any

import httpx


class SSE:
    """One GET /sse stream. ``recv`` returns the next frame (the JSON of a ``data:``
    event, with its SSE ``id`` as ``_sse_id`` and a named event's name as ``_sse_event``)."""

    def __init__(self, base: str, ticket: str, query: str = "", headers: dict[str, str] | None = None,
                 expect_status: int = 200) -> None:
        self.client = httpx.Client(timeout=httpx.Timeout(120, connect=10))
        self._cm = self.client.stream("GET", f"{base}/sse?ticket={ticket}{query}", headers=headers or {})
        self.resp = self._cm.__enter__()
        self.status = self.resp.status_code
        self.q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.comments = 0
        self.ended = threading.Event()
        if self.status != 200:
            self.resp.read()
            self.body = self.resp.json()
            self._cm.__exit__(None, None, None)
            self.client.close()
            return
        threading.Thread(target=self._read, daemon=True).start()
        first = self.recv(timeout=15)
        assert first.get("_sse_event") == "connection", first
        self.connection, self.secret = first["connection"], first["secret"]
        self.hello = self.recv(timeout=15)
        assert self.hello["event"] == "hello", self.hello

    def _read(self) -> None:
        name, eid, data = None, None, []
        try:
            for line in self.resp.iter_lines():
                if line == "":
                    if data:
                        f = json.loads("\n".join(data))
                        if name:
                            f["_sse_event"] = name
                        if eid is not None:
                            f["_sse_id"] = eid
                        self.q.put(f)
                    name, eid, data = None, None, []
                elif line.startswith(":"):
                    self.comments += 1
                elif line.startswith("data: "):
                    data.append(line[6:])
                elif line.startswith("id: "):
                    eid = line[4:]
                elif line.startswith("event: "):
                    name = line[7:]
        except Exception:
            pass
        finally:
            self.ended.set()
            self.q.put(None)

    def recv(self, timeout: float = 15) -> dict[str, Any]:
        f = self.q.get(timeout=timeout)
        if f is None:
            self.q.put(None)
            raise EOFError("the stream ended")
        return f

    def recv_until(self, pred: Any, timeout: float = 15) -> dict[str, Any]:
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no matching frame")
            try:
                f = self.recv(timeout=left)
            except queue.Empty:
                raise TimeoutError("no matching frame") from None
            if pred(f):
                return f

    def drain(self, quiet: float = 0.5) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.recv(timeout=quiet))
            except (queue.Empty, EOFError):
                return out

    def act(self, token: str | None, body: dict[str, Any], secret: str | None = None,
            connection: str | None = None) -> httpx.Response:
        """POST an action on this stream (its own secret unless told otherwise)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        payload = dict(body, secret=self.secret if secret is None else secret)
        return self.client.post(f"{self.resp.url.scheme}://{self.resp.url.netloc.decode()}/sse/"
                                f"{connection or self.connection}/actions", json=payload, headers=headers, timeout=30)

    def close(self) -> None:
        try:
            self._cm.__exit__(None, None, None)
        finally:
            self.client.close()
