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
from ..bounded import fold_username
from ..ratelimit import RateLimiter, client_ip, ip_key, request_is_https, too_many
from .common import authenticate, check_fields, field_str, read_json

USERNAME_MAX = 64
DEVICE_COOKIE = "sb_device_"  # + a hash of the username: one cookie per user a browser logged in as
DEVICE_TTL = 30 * 86400


class DeviceCookies:
    """OWASP's device cookie: proof that this client logged in as that user before.

    ``<base64url(json {"u": identity, "n": nonce, "exp": ts, "p": pw})>.<hmac-sha256>``,
    keyed with a key derived from the JWT secret (same on every replica).
    ``u`` is the folded username (bounded.fold_username: 'Alice' and 'ALICE' are
    one identity, one cookie); ``p`` is an HMAC of the user's password hash, so
    a password change invalidates every device cookie issued before it."""

    def __init__(self, secret: str) -> None:
        self.key = hashlib.sha256(b"switchboard-device-cookie:" + secret.encode()).digest()

    @staticmethod
    def name(identity: str) -> str:
        return DEVICE_COOKIE + hashlib.sha256(identity.encode()).hexdigest()[:16]

    def _sign(self, body: str) -> str:
        return base64.urlsafe_b64encode(hmac.new(self.key, body.encode(), hashlib.sha256).digest()).decode().rstrip("=")

    def _password_tag(self, password_hash: str) -> str:
        return hmac.new(self.key, b"pw:" + password_hash.encode(), hashlib.sha256).hexdigest()[:32]

    def issue(self, identity: str, password_hash: str) -> str:
        body = base64.urlsafe_b64encode(json.dumps(
            {"u": identity, "n": secrets.token_hex(8), "exp": int(time.time()) + DEVICE_TTL,
             "p": self._password_tag(password_hash)},
            separators=(",", ":")).encode()).decode().rstrip("=")
        return f"{body}.{self._sign(body)}"

    def nonce_for(self, cookie: str | None, identity: str, password_hash: str | None) -> str | None:
        """The cookie's nonce if it is genuine, unexpired, for this identity and
        issued under the user's current password."""
        if not cookie or len(cookie) > 512 or "." not in cookie or password_hash is None:
            return None
        body, _, sig = cookie.partition(".")
        if not hmac.compare_digest(sig, self._sign(body)):
            return None
        try:
            d = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            if d["u"] != identity or int(d["exp"]) < time.time():
                return None
            if not hmac.compare_digest(str(d.get("p", "")), self._password_tag(password_hash)):
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
        # One identity per name (fold_username, the same rule as the database's unique
        # index): 'Alice' and 'ALICE' share the throttle bucket and the device cookie.
        identity = fold_username(username)
        # Read before the user bucket is paid: the device cookie is bound to the current
        # password hash. The answer stays the same whatever the lookup found.
        row = await self.db.login_lookup(username)
        stored_hash = row["password_hash"] if row else None
        nonce = self.devices.nonce_for(req.cookies.get(self.devices.name(identity)), identity, stored_hash)
        if nonce is not None:
            d_user = await self.limiter.check("login-device", nonce, cfg.login_user_rate, cfg.login_user_burst)
        else:
            d_user = await self.limiter.check("login-user", identity, cfg.login_user_rate, cfg.login_user_burst)
        if not d_user.allowed:
            raise too_many(d_user)
        ok = await verify_password(stored_hash, password)
        if ok and row and not row["disabled"]:
            token, ttl = self.auth.issue(row["user_id"], username, row["role"], row["token_epoch"])
            resp.set_headers(d_ip.headers())
            # Secure when the client reached us over TLS, also through a trusted TLS proxy.
            resp.set_cookie(self.devices.name(identity), self.devices.issue(identity, row["password_hash"]),
                            max_age=DEVICE_TTL, path="/auth/login",
                            secure=request_is_https(req, cfg.trusted_proxies), http_only=True,
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
    """POST /ws/ticket, limited per user (SWITCHBOARD_WS_TICKET_RATE/_BURST): every
    WebSocket handshake consumes one single-use ticket, so this also bounds how
    fast one user can open sockets (and make replicas check tickets and rooms)."""

    def __init__(self, db: Database, auth: AuthState, ticket_ttl: int, limiter: RateLimiter | None = None,
                 config: Config | None = None) -> None:
        self.db = db
        self.auth = auth
        self.ttl = ticket_ttl
        self.limiter = limiter
        self.cfg = config

    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        if self.limiter is not None and self.cfg is not None:
            d = await self.limiter.check("ws-ticket", str(p.user_id), self.cfg.ws_ticket_rate,
                                         self.cfg.ws_ticket_burst)
            if not d.allowed:
                raise too_many(d)
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
