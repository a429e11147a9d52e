"""Request accounting and log hygiene.

AccessLog counts requests by route and status for /metrics and writes an
access log without query strings. install_log_redaction() scrubs
``ticket=<value>`` from server log records (uvicorn logs WebSocket handshakes
with their query string; a ticket must never reach a log).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import falcon

from ..metrics import Metrics

ACCESS = logging.getLogger("switchboard.access")


class _RedactTickets(logging.Filter):
    """Rewrites ticket=<value> in the record's message and arguments."""

    _pattern = re.compile(r"(ticket=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "ticket=" in record.msg:
            record.msg = self._pattern.sub(r"\1[redacted]", record.msg)
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(self._pattern.sub(r"\1[redacted]", a) if isinstance(a, str) and "ticket=" in a
                                else a for a in record.args)
        return True


def install_log_redaction() -> None:
    f = _RedactTickets()
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "gunicorn.error", "gunicorn.access", ""):
        lg = logging.getLogger(name)
        if not any(isinstance(x, _RedactTickets) for x in lg.filters):
            lg.addFilter(f)
        for h in lg.handlers:
            if not any(isinstance(x, _RedactTickets) for x in h.filters):
                h.addFilter(f)


class AccessLog:
    def __init__(self, metrics: Metrics, max_body: int) -> None:
        self.metrics = metrics
        self.max_body = max_body

    async def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.t0 = time.perf_counter()
        if req.content_length is not None and req.content_length > self.max_body:
            raise falcon.HTTPContentTooLarge(
                title="Content Too Large",
                description=f"request bodies are limited to {self.max_body} bytes")

    async def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                               req_succeeded: bool) -> None:
        route = req.uri_template or "unmatched"
        status = str(resp.status)[:3] if resp.status else "200"
        seconds = time.perf_counter() - getattr(req.context, "t0", time.perf_counter())
        self.metrics.inc("switchboard_http_requests_total", route=route, method=req.method, status=status)
        self.metrics.observe("switchboard_http_request_duration_seconds", seconds, route=route,
                             method=req.method)
        if ACCESS.isEnabledFor(logging.INFO):
            ACCESS.info("%s %s %s %.1fms", req.method, req.path, status, seconds * 1000)
