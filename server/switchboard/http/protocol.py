"""What uvicorn does before the app sees a request: its two answers as problem+json,
and a header read timeout it does not have.

uvicorn answers some requests itself, in its HTTP protocol classes:

* 400 when the parser refuses the bytes (h11 or httptools: a malformed request
  line, a header over SWITCHBOARD_MAX_HEADER_BYTES still arriving, header bytes
  httptools refuses such as ``Authorization: Bearer \\x7f``);
* 503 when SWITCHBOARD_LIMIT_CONCURRENCY connections or tasks are in use.

Both were ``text/plain`` ("Invalid HTTP request received.", "Service
Unavailable"), outside the API's error contract (errors.py: every error is an
RFC 9457 document). uvicorn has no setting for either body, so the two hooks
are replaced: ``send_400_response`` (overridden by ``H11Protocol`` below;
patched on httptools' class by ``install()``) and ``service_unavailable`` (the
ASGI app each protocol module imported by name, replaced by ``install()``). Status codes, ``connection: close`` and when
uvicorn decides to answer are unchanged. tests/test_server_limits.py fails if a
uvicorn upgrade moves either hook (the bodies would be text/plain again).

uvicorn also has no header read timeout: a client that sends a request line and
then one header byte a minute holds a connection slot for ever, and
SWITCHBOARD_LIMIT_CONCURRENCY of them take the replica out of service (its
keep-alive timer is cancelled by any byte). ``H11Protocol`` (h11, the default)
arms a timer when a connection opens and when a response completes, cancels it
when a complete request head was parsed (or the connection became a WebSocket),
and when it fires answers 408 problem+json and closes -- silently if the client
sent nothing at all (a browser's pre-opened connection). The body timeout is the
app's (http/common.read_json, SWITCHBOARD_BODY_TIMEOUT).
"""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http import h11_impl

from ..errors import PROBLEM_CONTENT_TYPE, problem_type


def _body(status: int, title: str, detail: str, slug: str) -> bytes:
    return json.dumps({"type": problem_type(slug), "title": title, "status": status, "detail": detail,
                       "description": detail}).encode()


BAD_REQUEST = _body(400, "Bad Request", "The request could not be parsed as HTTP/1.1 (malformed request line "
                    "or header bytes, or headers over the size limit).", "bad-request")
UNAVAILABLE = _body(503, "Service Unavailable", "This replica is at its connection limit "
                    "(SWITCHBOARD_LIMIT_CONCURRENCY); retry, another replica may have room.", "unavailable")
_HEADERS = [(b"content-type", PROBLEM_CONTENT_TYPE.encode()), (b"content-length", str(len(UNAVAILABLE)).encode()),
            (b"connection", b"close"), (b"retry-after", b"1")]


async def service_unavailable(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": UNAVAILABLE, "more_body": False})


def _h11_send_400(self: Any, msg: str) -> None:
    import h11

    event = h11.Response(status_code=400, reason=b"Bad Request", headers=[
        (b"content-type", PROBLEM_CONTENT_TYPE.encode()), (b"content-length", str(len(BAD_REQUEST)).encode()),
        (b"connection", b"close")])
    self.transport.write(self.conn.send(event))
    self.transport.write(self.conn.send(h11.Data(data=BAD_REQUEST)))
    self.transport.write(self.conn.send(h11.EndOfMessage()))
    self.transport.close()


def _httptools_send_400(self: Any, msg: str) -> None:
    content = [b"HTTP/1.1 400 Bad Request\r\n"]
    for name, value in self.server_state.default_headers:
        content.extend([name, b": ", value, b"\r\n"])
    content.extend([b"content-type: " + PROBLEM_CONTENT_TYPE.encode() + b"\r\n",
                    b"content-length: " + str(len(BAD_REQUEST)).encode() + b"\r\n",
                    b"connection: close\r\n", b"\r\n", BAD_REQUEST])
    self.transport.write(b"".join(content))
    self.transport.close()


TIMEOUT = _body(408, "Request Timeout", "The request line and headers did not arrive in time "
                "(SWITCHBOARD_HEADER_TIMEOUT).", "request-timeout")


class H11Protocol(h11_impl.H11Protocol):
    """uvicorn's h11 protocol with a header read timeout (see the module docstring)."""

    header_timeout = 10.0     # install() sets it from SWITCHBOARD_HEADER_TIMEOUT
    send_400_response = _h11_send_400   # problem+json instead of uvicorn's text/plain
    _header_timer: Any = None
    _partial = False          # bytes of a request head arrived since the timer was armed

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._partial = False
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is not None and data:
            self._partial = True
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.transport.get_protocol() is not self or self._in_request():
            self._cancel_header_timer()   # a complete head: the app (and body timeout) take over

    def on_response_complete(self) -> None:
        self._arm_header_timer()          # the next request on this connection; a pipelined
        super().on_response_complete()   # one is parsed inside and cancels it again

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self or self._in_request():
            return
        if self._partial:
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: " + PROBLEM_CONTENT_TYPE.encode()
                                 + b"\r\ncontent-length: " + str(len(TIMEOUT)).encode()
                                 + b"\r\nconnection: close\r\n\r\n" + TIMEOUT)
        self.transport.close()


def install(header_timeout: float = 10.0) -> type[H11Protocol]:
    """Idempotent; call before uvicorn serves (cli serve, the gunicorn worker). Returns
    the h11 protocol class to pass as uvicorn's ``http`` when it serves with h11."""
    H11Protocol.header_timeout = header_timeout
    # A module global each protocol module imported by name (not re-exported: setattr).
    setattr(h11_impl, "service_unavailable", service_unavailable)
    try:
        from uvicorn.protocols.http import httptools_impl
    except ImportError:  # httptools not installed: h11 is the only parser
        return H11Protocol
    setattr(httptools_impl, "service_unavailable", service_unavailable)
    # httptools has no subclass of ours (uvicorn picks its class by name): patch its hook.
    httptools_impl.HttpToolsProtocol.send_400_response = _httptools_send_400  # type: ignore[method-assign]
    return H11Protocol


def uvicorn_io(uvloop: bool, header_timeout: float) -> dict[str, Any]:
    """uvicorn's ``loop`` and ``http`` for `serve` and the gunicorn worker alike:
    config.server_io's choice, with h11 as H11Protocol (hooks installed)."""
    from ..config import server_io

    h11 = install(header_timeout)
    io = server_io(uvloop)
    return {"loop": io["loop"], "http": h11 if io["http"] == "h11" else io["http"]}

