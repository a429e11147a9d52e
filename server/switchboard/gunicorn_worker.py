"""Gunicorn worker: uvicorn's, with proxy headers off and no access log.

uvicorn and gunicorn trust X-Forwarded-For from loopback by default; the
client IP for rate limiting is decided by SWITCHBOARD_TRUSTED_PROXIES alone,
so the server's own proxy-header handling is disabled. The access log is
ours (it never records the ticket in /ws?ticket=…). permessage-deflate follows
SWITCHBOARD_WS_COMPRESSION (off by default), the event loop and HTTP parser
SWITCHBOARD_UVLOOP (asyncio + h11 by default), and the connection limits follow
config.server_limits(), as with uvicorn alone.
"""

from uvicorn_worker import UvicornWorker

from .config import header_timeout, server_limits, uvloop_enabled, ws_compression_enabled
from .http import protocol


class Worker(UvicornWorker):  # type: ignore[misc]  # uvicorn-worker ships no types (no py.typed)
    CONFIG_KWARGS = {
        # asyncio + h11 unless SWITCHBOARD_UVLOOP=on; uvicorn's own 400/503 answers as
        # problem+json and h11 with a header read timeout (http/protocol.py)
        **protocol.uvicorn_io(uvloop_enabled(), header_timeout()),
        "lifespan": "on",
        "proxy_headers": False,
        "forwarded_allow_ips": "",
        "access_log": False,
        "ws_max_size": 2 * 1024 * 1024,
        "ws_per_message_deflate": ws_compression_enabled(),
        **server_limits(),   # keep-alive timeout, connection cap, header size (config.server_limits)
    }
