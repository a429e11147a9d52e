"""Request accounting, response headers and log hygiene.

AccessLog counts requests by route template, method and status for /metrics
(every label from a closed set: a made-up method is counted as ``other``, an
unknown path as ``unmatched``), counts refused inputs
(switchboard_bad_input_total), sets the security headers, and writes an
access log without query strings, every outside value escaped.

install_log_hygiene() puts one filter on the server's log handlers: it scrubs
``ticket=<value>`` (uvicorn logs WebSocket handshakes with their query string;
a ticket must never reach a log) and escapes control characters in every
argument of a record, so a ``%0a`` in a URL, a header or a frame cannot
write a second, forged log line. ``SWITCHBOARD_LOG_FORMAT=json`` switches the
same handlers to one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any

import falcon

from .. import bounded
from ..metrics import Metrics

ACCESS = logging.getLogger("switchboard.access")
LOG = logging.getLogger("switchboard.input")

# The methods a label may name; anything else a client sends is "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Responses that carry or decide credentials: never stored by a browser or a proxy.
NO_STORE_ROUTES = frozenset({"/ws/ticket", "/me"})
# Responses that set no Content-Security-Policy of their own: JSON is never a document
# to render or frame; an HTML page without its own (the demo page sets a stricter
# one, with its script's hash) still may not be framed or load from elsewhere.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
HTML_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "gunicorn.error", "gunicorn.access", "")


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


class _LogHygiene(logging.Filter):
    """Redacts ticket=<value> and escapes control characters in a record's arguments
    (and in its message when it has none: then the message may be built from input)."""

    _ticket = re.compile(r"(ticket=)[^&\s\"']+")

    def _clean(self, v: str) -> str:
        if "ticket=" in v:
            v = self._ticket.sub(r"\1[redacted]", v)
        return bounded.escape(v, 4000)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            if "ticket=" in record.msg:
                record.msg = self._ticket.sub(r"\1[redacted]", record.msg)
            if not record.args:
                record.msg = bounded.escape(record.msg, 8000)
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(self._clean(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self._clean(a) if isinstance(a, str) else a for k, a in record.args.items()}
        return True


# The old name stays importable for code that still calls it.
_RedactTickets = _LogHygiene


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message (+ exc, run_id)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run_id = getattr(record, "run_id", None)
        if run_id is not None:
            out["run_id"] = run_id
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def log_format() -> str:
    """SWITCHBOARD_LOG_FORMAT: ``text`` (default) or ``json``."""
    return "json" if os.environ.get("SWITCHBOARD_LOG_FORMAT", "text").strip().lower() == "json" else "text"


def install_log_hygiene() -> None:
    f = _LogHygiene()
    fmt = JsonFormatter() if log_format() == "json" else None
    for name in LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(x, _LogHygiene) for x in lg.filters):
            lg.addFilter(f)
        for h in lg.handlers:
            if not any(isinstance(x, _LogHygiene) for x in h.filters):
                h.addFilter(f)
            if fmt is not None:
                h.setFormatter(fmt)


install_log_redaction = install_log_hygiene


class AccessLog:
    def __init__(self, metrics: Metrics, max_body: int, body_timeout: float = 30.0) -> None:
        self.metrics = metrics
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.rejections = bounded.Rejections(
            lambda source, reason: metrics.inc("switchboard_bad_input_total", source=source, reason=reason), LOG)

    async def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.t0 = time.perf_counter()
        req.context.body_timeout = self.body_timeout   # read_json's deadline (http/common.py)
        if req.content_length is not None and req.content_length > self.max_body:
            req.context.bad_input = ("too_large", f"Content-Length {req.content_length}")
            raise falcon.HTTPContentTooLarge(
                title="Content Too Large",
                description=f"request bodies are limited to {self.max_body} bytes")

    async def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                               req_succeeded: bool) -> None:
        route = req.uri_template or "unmatched"
        method = method_label(req.method)
        status = str(resp.status)[:3] if resp.status else "200"
        seconds = time.perf_counter() - getattr(req.context, "t0", time.perf_counter())
        self.metrics.inc("switchboard_http_requests_total", route=route, method=method, status=status)
        self.metrics.observe("switchboard_http_request_duration_seconds", seconds, route=route, method=method)
        bad = getattr(req.context, "bad_input", None)
        if bad is not None:
            self.rejections.record("http", bad[0], f"{method} {route}: {bad[1]}")
        for k, v in SECURITY_HEADERS.items():
            resp.set_header(k, v)
        if resp.get_header("Content-Security-Policy") is None:
            html = (resp.content_type or "").startswith("text/html")
            resp.set_header("Content-Security-Policy", HTML_CSP if html else API_CSP)
        if route.startswith("/auth/") or route in NO_STORE_ROUTES:
            resp.set_header("Cache-Control", "no-store")
        if ACCESS.isEnabledFor(logging.INFO):
            ACCESS.info("%s %s %s %.1fms", bounded.escape(req.method, 16), bounded.escape(req.path, 500),
                        status, seconds * 1000)
