"""The two answers uvicorn gives before the app sees a request, as problem+json.

uvicorn answers some requests itself, in its HTTP protocol classes:

* 400 when the parser refuses the bytes (h11 or httptools: a malformed request
  line, a header over SWITCHBOARD_MAX_HEADER_BYTES still arriving, header bytes
  httptools refuses such as ``Authorization: Bearer \\x7f``);
* 503 when SWITCHBOARD_LIMIT_CONCURRENCY connections or tasks are in use.

Both were ``text/plain`` ("Invalid HTTP request received.", "Service
Unavailable"), outside the API's error contract (errors.py: every error is an
RFC 9457 document). uvicorn has no setting for either body, so ``install()``
replaces the two hooks on both protocol implementations: ``send_400_response``
(a method of each protocol class) and ``service_unavailable`` (the ASGI app each
protocol module imported by name). Status codes, ``connection: close`` and when
uvicorn decides to answer are unchanged. tests/test_server_limits.py fails if a
uvicorn upgrade moves either hook (the bodies would be text/plain again).
"""

from __future__ import annotations

import json
from typing import Any

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


def install() -> None:
    """Idempotent; call before uvicorn serves (cli serve, the gunicorn worker)."""
    from uvicorn.protocols.http import h11_impl

    # A module global each protocol module imported by name (not re-exported: setattr).
    setattr(h11_impl, "service_unavailable", service_unavailable)
    h11_impl.H11Protocol.send_400_response = _h11_send_400  # type: ignore[method-assign]
    try:
        from uvicorn.protocols.http import httptools_impl
    except ImportError:  # httptools not installed: h11 is the only parser
        return
    setattr(httptools_impl, "service_unavailable", service_unavailable)
    httptools_impl.HttpToolsProtocol.send_400_response = _httptools_send_400  # type: ignore[method-assign]
