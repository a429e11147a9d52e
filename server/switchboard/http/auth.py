"""POST /auth/login, POST /auth/logout, POST /ws/ticket, GET /me."""

from __future__ import annotations

from datetime import datetime, timezone

import falcon

from ..auth import AuthState, verify_password
from ..config import Config
from ..db import Database
from ..ratelimit import RateLimiter, client_ip, too_many
from .common import authenticate, check_fields, field_str, read_json

USERNAME_MAX = 64


class Login:
    def __init__(self, db: Database, auth: AuthState, limiter: RateLimiter, config: Config) -> None:
        self.db = db
        self.auth = auth
        self.limiter = limiter
        self.cfg = config

    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        cfg = self.cfg
        ip = client_ip(req, cfg.trusted_proxies)
        d_ip = await self.limiter.check("login-ip", ip, cfg.login_ip_rate, cfg.login_ip_burst)
        if not d_ip.allowed:
            raise too_many(d_ip)
        body = await read_json(req, cfg.max_body_bytes)
        check_fields(body, {"username", "password"})
        username = field_str(body, "username", max_len=USERNAME_MAX)
        password = field_str(body, "password", max_len=1024)
        row = await self.db.login_lookup(username)  # type: ignore[arg-type]
        ok = await verify_password(row["password_hash"] if row else None, password)  # type: ignore[arg-type]
        if ok and row and not row["disabled"]:
            token, ttl = self.auth.issue(row["user_id"], username, row["role"])  # type: ignore[arg-type]
            resp.set_headers(d_ip.headers())
            resp.media = {"access_token": token, "token_type": "bearer", "expires_in": ttl,
                          "user_id": str(row["user_id"]), "role": row["role"]}
            return
        # Failures only count against the username: a correct password always logs in,
        # so nobody can lock a user out by guessing; the per-IP bucket bounds guessing.
        d_user = await self.limiter.check("login-user", username.lower(),  # type: ignore[union-attr]
                                          cfg.login_user_rate, cfg.login_user_burst)
        if not d_user.allowed:
            raise too_many(d_user)
        raise falcon.HTTPUnauthorized(title="Unauthorized", description="wrong username or password",
                                      headers=d_ip.headers())


class Logout:
    def __init__(self, db: Database, auth: AuthState) -> None:
        self.db = db
        self.auth = auth

    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        await self.db.revoke_token(p.jti, p.user_id, datetime.fromtimestamp(p.exp, tz=timezone.utc))
        self.auth.apply_revoke(p.jti)
        resp.status = falcon.HTTP_204


class Ticket:
    def __init__(self, db: Database, auth: AuthState, ticket_ttl: int) -> None:
        self.db = db
        self.auth = auth
        self.ttl = ticket_ttl

    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        ticket = await self.db.issue_ticket(p.user_id, self.ttl)
        resp.status = falcon.HTTP_201
        resp.media = {"ticket": ticket, "expires_in": self.ttl}


class Me:
    def __init__(self, auth: AuthState, replica_id: str) -> None:
        self.auth = auth
        self.replica_id = replica_id

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        resp.media = {"user_id": str(p.user_id), "username": p.username, "role": p.role,
                      "replica": self.replica_id}
