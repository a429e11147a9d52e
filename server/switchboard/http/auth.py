"""POST /auth/login, POST /auth/logout, POST /ws/ticket, GET /me."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from datetime import datetime, timezone

import falcon

from ..auth import AuthState, verify_password
from ..config import Config
from ..db import Database
from ..ratelimit import RateLimiter, client_ip, ip_key, too_many
from .common import authenticate, check_fields, field_str, read_json

USERNAME_MAX = 64
DEVICE_COOKIE = "sb_device_"  # + a hash of the username: one cookie per user a browser logged in as
DEVICE_TTL = 30 * 86400


class DeviceCookies:
    """OWASP's device cookie: proof that this client logged in as that user before.

    ``<base64url(json {"u": username, "n": nonce, "exp": ts})>.<hmac-sha256>``,
    keyed with a key derived from the JWT secret (same on every replica)."""

    def __init__(self, secret: str) -> None:
        self.key = hashlib.sha256(b"switchboard-device-cookie:" + secret.encode()).digest()

    @staticmethod
    def name(username: str) -> str:
        return DEVICE_COOKIE + hashlib.sha256(username.lower().encode()).hexdigest()[:16]

    def _sign(self, body: str) -> str:
        return base64.urlsafe_b64encode(hmac.new(self.key, body.encode(), hashlib.sha256).digest()).decode().rstrip("=")

    def issue(self, username: str) -> str:
        body = base64.urlsafe_b64encode(json.dumps(
            {"u": username.lower(), "n": secrets.token_hex(8), "exp": int(time.time()) + DEVICE_TTL},
            separators=(",", ":")).encode()).decode().rstrip("=")
        return f"{body}.{self._sign(body)}"

    def nonce_for(self, cookie: str | None, username: str) -> str | None:
        """The cookie's nonce if it is genuine, unexpired and for this username."""
        if not cookie or len(cookie) > 512 or "." not in cookie:
            return None
        body, _, sig = cookie.partition(".")
        if not hmac.compare_digest(sig, self._sign(body)):
            return None
        try:
            d = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            if d["u"] != username.lower() or int(d["exp"]) < time.time():
                return None
            return str(d["n"])
        except (ValueError, KeyError, TypeError):
            return None


class Login:
    def __init__(self, db: Database, auth: AuthState, limiter: RateLimiter, config: Config) -> None:
        self.db = db
        self.auth = auth
        self.limiter = limiter
        self.cfg = config
        self.devices = DeviceCookies(config.jwt_secret)

    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Throttle, then verify.

        1. Every attempt costs a token of the client's IP bucket (IPv6: its /64).
        2. Every attempt costs a token of the username's bucket *before* the
           password is verified, so guesses spread over many IPs are slowed too
           and a right guess made while the bucket is empty is refused unseen.
           Exempt (OWASP device cookie): a client holding a device cookie from an
           earlier successful login as that user; it pays into its own device
           bucket instead, so an attacker emptying the username bucket cannot lock
           the real user out of the devices it already uses. Trade-off: during
           such an attack, logging in from a *new* device waits for the bucket.
        """
        cfg = self.cfg
        ip = client_ip(req, cfg.trusted_proxies)
        d_ip = await self.limiter.check("login-ip", ip_key(ip), cfg.login_ip_rate, cfg.login_ip_burst)
        if not d_ip.allowed:
            raise too_many(d_ip)
        body = await read_json(req, cfg.max_body_bytes)
        check_fields(body, {"username", "password"})
        username = field_str(body, "username", max_len=USERNAME_MAX)
        password = field_str(body, "password", max_len=1024)
        assert username is not None and password is not None
        nonce = self.devices.nonce_for(req.cookies.get(self.devices.name(username)), username)
        if nonce is not None:
            d_user = await self.limiter.check("login-device", nonce, cfg.login_user_rate, cfg.login_user_burst)
        else:
            d_user = await self.limiter.check("login-user", username.lower(),
                                              cfg.login_user_rate, cfg.login_user_burst)
        if not d_user.allowed:
            raise too_many(d_user)
        row = await self.db.login_lookup(username)
        ok = await verify_password(row["password_hash"] if row else None, password)
        if ok and row and not row["disabled"]:
            token, ttl = self.auth.issue(row["user_id"], username, row["role"], row["token_epoch"])
            resp.set_headers(d_ip.headers())
            resp.set_cookie(self.devices.name(username), self.devices.issue(username), max_age=DEVICE_TTL,
                            path="/auth/login", secure=req.scheme == "https", http_only=True,
                            same_site="Strict")
            resp.media = {"access_token": token, "token_type": "bearer", "expires_in": ttl,
                          "user_id": str(row["user_id"]), "role": row["role"]}
            return
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
