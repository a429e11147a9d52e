"""/console: the operators' page, and the two small reads only it needs.

The page (static/console.html) is one self-contained file, served to anyone:
it holds no data. Everything it shows or does goes through the admin HTTP API
with the admin's bearer token (GET /status, /handlers, /runs, /tasks, POST
/runs/{id}/retry|cancel, /handlers/{name}/pause|resume, /tasks/{id}/trigger,
PATCH /tasks/{id}) plus the two admin reads here:

- GET /console/cron-next?schedule=&timezone=&count=5 -- the next fire times of
  a schedule as the scheduler computes them (switchboard.cron_next, chained),
  for the live preview while a task's schedule is edited. A schedule or zone
  SQL refuses is a 422 naming it (SQLSTATE 22023, errors.py).
- GET /console/live -- live replicas with their open sockets and the users
  online on each (switchboard.replicas, switchboard.presence), and the rooms
  with their member and online-member counts.
"""

from __future__ import annotations

from typing import Any

from pathlib import Path

import falcon

from ..auth import AuthState
from ..db import Database
from .common import jsonable_row, require_admin, unprocessable

STATIC = Path(__file__).resolve().parent.parent / "static"
MAX_PREVIEW = 20
MAX_ROOMS = 500

CRON_NEXT_SQL = """
WITH RECURSIVE fires(i, at) AS (
    SELECT 1, switchboard.cron_next(%(schedule)s, now(), %(tz)s)
    UNION ALL
    SELECT i + 1, switchboard.cron_next(%(schedule)s, at, %(tz)s)
      FROM fires
     WHERE i < %(count)s AND at IS NOT NULL AND isfinite(at)
)
SELECT at FROM fires WHERE at IS NOT NULL AND isfinite(at) ORDER BY i
"""

LIVE_REPLICAS_SQL = """
SELECT r.id, r.version, r.started_at, r.heartbeat_at, r.sockets,
       (SELECT count(DISTINCT p.user_id) FROM switchboard.presence p WHERE p.replica_id = r.id) AS users_online,
       coalesce((SELECT array_agg(DISTINCT p.username ORDER BY p.username)
                   FROM (SELECT username FROM switchboard.presence p
                          WHERE p.replica_id = r.id AND p.username IS NOT NULL
                          ORDER BY username LIMIT 50) p), '{}') AS users
  FROM switchboard.replicas r
 ORDER BY r.id
"""

LIVE_ROOMS_SQL = """
SELECT r.name,
       (SELECT count(*) FROM switchboard.room_members m WHERE m.room = r.name) AS members,
       (SELECT count(DISTINCT m.user_id) FROM switchboard.room_members m
          JOIN switchboard.presence p ON p.user_id = m.user_id
         WHERE m.room = r.name) AS online
  FROM switchboard.rooms r
 ORDER BY r.name
 LIMIT %s
"""


class Page:
    def __init__(self) -> None:
        self.html = (STATIC / "console.html").read_text()  # read once, not per request

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.text = self.html
        # The page loads nothing from elsewhere and is never framed.
        resp.set_header("Content-Security-Policy",
                        "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                        "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                        "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'")
        resp.set_header("X-Frame-Options", "DENY")
        resp.set_header("Cache-Control", "no-cache")


class CronNext:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        schedule = req.get_param("schedule") or ""
        tz = req.get_param("timezone") or "UTC"
        count = req.get_param_as_int("count", min_value=1, max_value=MAX_PREVIEW, default=5)
        if not schedule.strip():
            raise unprocessable("'schedule' is required")
        if len(schedule) > 200 or len(tz) > 100 or "\x00" in schedule + tz:
            raise unprocessable("'schedule' (200) or 'timezone' (100) too long, or holds NUL")
        rows = await self.db.fetchall(CRON_NEXT_SQL, {"schedule": schedule, "tz": tz, "count": count})
        resp.media = {"schedule": schedule, "timezone": tz,
                      "next": [r["at"].isoformat() for r in rows]}


class Live:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        require_admin(self.auth, req)
        replicas = await self.db.fetchall(LIVE_REPLICAS_SQL)
        rooms = await self.db.fetchall(LIVE_ROOMS_SQL, (MAX_ROOMS,))
        resp.media = {"replicas": [jsonable_row(r) for r in replicas],
                      "rooms": [jsonable_row(r) for r in rooms]}


def add_routes(app: falcon.asgi.App[Any, Any], db: Database, auth: AuthState) -> None:
    """The console's routes, in one place so app.py's route table changes by one line."""
    app.add_route("/console", Page())
    app.add_route("/console/cron-next", CronNext(db, auth))
    app.add_route("/console/live", Live(db, auth))
