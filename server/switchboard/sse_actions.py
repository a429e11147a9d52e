"""POST /sse/{connection}/actions: what a WebSocket client sends as a frame, for an SSE
client (sse.py).

The body is one client frame, exactly as on the WebSocket (``{"action": "join", "room":
"r"}``, ``{"action": "publish", "event": "typing", ...}``, ``{"action": "ping"}``...),
plus ``"secret"``: the secret of the stream's ``connection`` event. The caller must
present the bearer token of the stream's user AND that secret: nobody acts on another
user's stream, nor on one of their own without having read its first event.

The action runs through the WebSocket's own code (ws_actions.Actions), under the same
limits: the body at most SWITCHBOARD_WS_MAX_FRAME_BYTES, the same per-connection frame
rate bucket (3 x burst refusals close the stream 1008). Its answers (joined, left,
pong, resumed, ...) arrive on the stream as on a socket; an error frame is the HTTP
answer instead, a problem document whose ``error`` member is the WebSocket error
frame's payload (``{"code", "message", ...}``):

    400 bad_json / bad_frame / bad_room / bad_event / bad_feed / bad_resume / unknown_action
    403 forbidden / forbidden_event, and a wrong secret or another user's connection
    404 unknown_call, and a connection that is not open on this replica
    409 refused (the database refused it)      429 rate_limited      503 unavailable
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import falcon
import falcon.asgi
import psycopg

from . import bounded
from .auth import AuthState
from .errors import DEFAULT_SLUGS, Problem
from .http.common import authenticate
from .sse import SseConnection, SseStreams
from .ws import WebSocketResource
from .ws_actions import captured_errors

LOG = logging.getLogger("switchboard.sse")
SECRET_MAX = 64
_STATUS = {"forbidden": 403, "forbidden_event": 403, "unknown_call": 404, "refused": 409,
           "rate_limited": 429, "unavailable": 503, "not_connected": 404}


def refusal(err: dict[str, Any], headers: dict[str, str] | None = None) -> Problem:
    """The WebSocket error payload ``err`` as an HTTP problem carrying it as ``error``."""
    status = _STATUS.get(str(err.get("code")), 400)
    return Problem(status, DEFAULT_SLUGS.get(status, f"http-{status}"), str(err.get("message", "")),
                   error=err, headers=headers)


class SseActions:
    def __init__(self, ws: WebSocketResource, streams: SseStreams, auth: AuthState) -> None:
        self.ws = ws
        self.streams = streams
        self.auth = auth

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, connection: str) -> None:
        p = authenticate(self.auth, req)
        conn = self.streams.open.get(connection) if len(connection) <= 64 else None
        if conn is None or conn.client.closing is not None:
            raise refusal({"code": "not_connected", "message": "no open SSE stream with that connection id "
                           "on this replica (it closed, or it is on another replica)"})
        msg = await self._read(req)
        secret = msg.pop("secret", None)
        if not isinstance(secret, str) or len(secret) > SECRET_MAX \
                or not hmac.compare_digest(secret.encode(), conn.secret.encode()) or conn.client.user_id != p.user_id:
            raise refusal({"code": "forbidden", "message": "the connection's secret and its user's token are both "
                           "required (the secret is in the stream's first event)"})
        self._rate(conn)
        with captured_errors() as errors:
            try:
                await self.ws.actions.handle(conn.client, msg)
            except psycopg.Error as exc:
                errors.append({"payload": {"code": "refused",
                                           "message": exc.diag.message_primary or "refused by the database"}})
            except Exception as exc:  # pool timeout, database down
                LOG.warning("action from user %s failed: %s", conn.client.user_id, exc)
                errors.append({"payload": {"code": "unavailable", "message": "temporarily unavailable; retry"}})
        if errors:
            raise refusal(errors[0]["payload"], {"Retry-After": "1"} if errors[0]["payload"].get("code")
                          == "unavailable" else None)
        resp.media = {"ok": True}

    async def _read(self, req: falcon.asgi.Request) -> dict[str, Any]:
        """The body: one JSON object within the frame bound (413 / 400 with the WS codes)."""
        limit = self.ws.cfg.ws_max_frame_bytes + SECRET_MAX + 16
        if req.content_length is not None and req.content_length > limit:
            raise Problem(413, "content-too-large", f"an action is at most {limit} bytes",
                          error={"code": "too_large", "message": "frame too large"})
        raw = await req.stream.read(limit + 1)
        if len(raw) > limit:
            raise Problem(413, "content-too-large", f"an action is at most {limit} bytes",
                          error={"code": "too_large", "message": "frame too large"})
        try:
            msg = bounded.loads(raw, max_bytes=limit)
        except bounded.BadInput as exc:
            self.ws.rejections.record("sse", exc.reason, str(exc))
            raise refusal({"code": "bad_json", "message": f"frames must be JSON objects ({exc.reason})"}) from None
        if not isinstance(msg, dict):
            raise refusal({"code": "bad_frame", "message": "frames must be JSON objects"})
        return msg

    def _rate(self, conn: SseConnection) -> None:
        if conn.bucket.take():
            return
        conn.strikes += 1
        if conn.strikes >= 3 * self.ws.cfg.ws_frame_burst:
            self.ws.relay.close_client(conn.client, 1008, "frame rate exceeded")
        raise refusal({"code": "rate_limited", "message": "too many frames; slow down"}, {"Retry-After": "1"})
