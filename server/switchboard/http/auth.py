"""POST /auth/login, POST /auth/logout, POST /ws/ticket, GET /me."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import math
import secrets
import time
from datetime import datetime, timezone
from typing import Any

import falcon
import falcon.asgi

from ..auth import AuthState, verify_password
from ..domain_errors import AuthError
from ..config import Config
from ..db import Database
from ..bounded import fold_username
from ..errors import Problem
from ..metrics import Metrics
from ..ratelimit import Decision, RateLimiter, client_ip, ip_key, too_many
from .common import authenticate, check_fields, field_str, reached_over_tls, read_json
from .cors import origin_allowed, own_origin

USERNAME_MAX = 64
DEVICE_COOKIE = "sb_device_"  # + a hash of the username: one cookie per user a browser logged in as
DEVICE_TTL = 30 * 86400
# The refresh cookie, never readable by scripts (HttpOnly). Whenever it is Secure it is
# __Host-sb_refresh: the prefix makes the browser refuse it unless it is Secure, Path=/ and
# has no Domain, so no other host (a sibling subdomain) can plant or shadow it. On plain
# HTTP (development) a __Host- cookie cannot exist: there it is sb_refresh, Path=/auth,
# the name and path of the 0.2 release.
REFRESH_COOKIE = "sb_refresh"
REFRESH_PATH = "/auth"
SECURE_REFRESH_COOKIE = "__Host-sb_refresh"
_EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)


class RefreshCookie:
    """Sets, reads and clears the refresh cookie with the attributes of this deployment."""

    def __init__(self, config: Config) -> None:
        self.cfg = config

    def secure(self, req: falcon.asgi.Request) -> bool:
        # SameSite=None is only honoured with Secure, so it forces it.
        return reached_over_tls(req, self.cfg.trusted_proxies) or self.cfg.session_cookie_samesite == "None"

    def _name_path(self, req: falcon.asgi.Request) -> tuple[str, str]:
        return (SECURE_REFRESH_COOKIE, "/") if self.secure(req) else (REFRESH_COOKIE, REFRESH_PATH)

    def set(self, req: falcon.asgi.Request, resp: falcon.Response, token: str, expires_at: datetime) -> None:
        max_age = max(1, int(expires_at.timestamp() - time.time()))
        name, path = self._name_path(req)
        resp.set_cookie(name, token, max_age=max_age, path=path, secure=self.secure(req),
                        http_only=True, same_site=self.cfg.session_cookie_samesite)
        self._clear_legacy(req, resp)

    def clear(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        # Expires in 1970 (falcon drops max_age=0 as falsy): the browser deletes it.
        name, path = self._name_path(req)
        resp.set_cookie(name, "", expires=_EPOCH, path=path, secure=self.secure(req), http_only=True,
                        same_site=self.cfg.session_cookie_samesite)
        self._clear_legacy(req, resp)

    def _clear_legacy(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        """Over TLS, an sb_refresh (Path=/auth) a 0.2 replica set is never read: delete it."""
        if self.secure(req) and req.get_cookie_values(REFRESH_COOKIE):
            resp.set_cookie(REFRESH_COOKIE, "", expires=_EPOCH, path=REFRESH_PATH, secure=True, http_only=True,
                            same_site=self.cfg.session_cookie_samesite)

    def get(self, req: falcon.asgi.Request, resp: falcon.Response) -> str | None:
        """The one refresh token the request carries under this deployment's cookie name.

        Two or more values are refused before anything is looked up: a browser sends
        every cookie whose domain and path match, so a second one was planted
        (e.g. a Domain cookie from a sibling subdomain, sent first) and the server
        cannot tell which is the user's. Taking either could refresh the user into
        somebody else's session (fixation). The cookie is cleared."""
        name, _ = self._name_path(req)
        values = req.get_cookie_values(name) or []
        if len(values) > 1:
            self.clear(req, resp)
            raise Problem(400, "ambiguous-session-cookie",
                          f"the request carries {len(values)} {name} cookies; it must carry one. "
                          "The cookie is cleared: log in again (and remove cookies another site set for this domain)")
        return values[0] if values else None


class ClientFingerprint:
    """Which client spent a refresh token: HMAC-SHA256 of the client's network (ratelimit.ip_key:
    the address, an IPv6 client's /64) and its User-Agent, keyed with a key derived from the
    JWT secret (the same on every replica; the stored value reveals neither).

    A replay of a spent token within the grace is forgiven only from the same
    fingerprint. Both parts are what a browser sends unchanged between a lost response
    and its retry; a thief elsewhere has another address. Trade-offs: a thief behind the
    same NAT (or /64) sending the same User-Agent passes -- within the grace, before the
    user's next refresh, and only with a token already stolen; a user whose address
    changes between the lost response and the retry (a phone moving from Wi-Fi to
    mobile) is logged out, as every replay was before."""

    def __init__(self, secret: str, trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> None:
        self.key = hashlib.sha256(b"switchboard-refresh-client:" + secret.encode()).digest()
        self.trusted = trusted

    def of(self, req: falcon.asgi.Request) -> bytes:
        ua = (req.get_header("User-Agent") or "")[:1024]
        msg = ip_key(client_ip(req, self.trusted)).encode() + b"\n" + ua.encode("utf-8", "replace")
        return hmac.new(self.key, msg, hashlib.sha256).digest()


def check_origin(req: falcon.asgi.Request, config: Config) -> None:
    """The cookie endpoints refuse a browser Origin that is neither ours nor allowed
    (OWASP "verify origin"): SameSite keeps other *sites* out, this keeps other
    origins of the same site (a sibling subdomain) from driving a refresh. ``*`` in
    SWITCHBOARD_ALLOWED_ORIGINS does not count here: only the server's own origin and
    the origins listed by name."""
    if not origin_allowed(req.get_header("Origin"), own_origin(req, config.trusted_proxies), config.allowed_origins,
                          credentialed=True):
        raise Problem(403, "origin-not-allowed", "this Origin may not use the session cookie; "
                      "see SWITCHBOARD_ALLOWED_ORIGINS")


def token_body(token: str, ttl: int, user_id: object, role: str) -> dict[str, Any]:
    return {"access_token": token, "token_type": "bearer", "expires_in": ttl, "user_id": str(user_id), "role": role}


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
        self.cookie = RefreshCookie(config)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
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
            session = await self.db.start_session_v2(row["user_id"], cfg.session_ttl, cfg.session_max_lifetime)
            token, ttl = self.auth.issue(row["user_id"], username, row["role"], row["token_epoch"],
                                         session_id=session["session_id"],
                                         not_after=session["expires_at"].timestamp())
            resp.set_headers(d_ip.headers())
            # Secure when the client reached us over TLS, also through a trusted TLS proxy.
            resp.set_cookie(self.devices.name(identity), self.devices.issue(identity, row["password_hash"]),
                            max_age=DEVICE_TTL, path="/auth/login",
                            secure=reached_over_tls(req, cfg.trusted_proxies), http_only=True,
                            same_site="Strict")
            self.cookie.set(req, resp, session["refresh_token"], session["expires_at"])
            resp.cache_control = ["no-store"]
            resp.media = token_body(token, ttl, row["user_id"], row["role"])
            return
        raise falcon.HTTPUnauthorized(title="Unauthorized", description="wrong username or password",
                                      headers=d_ip.headers())


class Refresh:
    """POST /auth/refresh: the refresh cookie buys a new access token and the next cookie.

    1. Every request costs a token of the client's IP bucket (SWITCHBOARD_REFRESH_IP_*),
       before any session is looked at.
    2. The presented refresh token is used up (refresh_session_v2: rotating, single
       use); a rotation also costs a token of the session's own bucket
       (SWITCHBOARD_REFRESH_SESSION_*), charged inside the database only once the token
       is known to be the session's, so nobody spends another session's budget.
    3. Presenting a used one again ends the whole session (reuse detection), except
       from the same client (ClientFingerprint) within SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS
       while its successor is unused: a lost response or two tabs at once. That client
       gets the same successor again."""

    def __init__(self, db: Database, auth: AuthState, limiter: RateLimiter, metrics: Metrics,
                 config: Config) -> None:
        self.db = db
        self.auth = auth
        self.limiter = limiter
        self.metrics = metrics
        self.cfg = config
        self.cookie = RefreshCookie(config)
        self.fingerprint = ClientFingerprint(config.jwt_secret, config.trusted_proxies)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        cfg = self.cfg
        check_origin(req, cfg)
        d_ip = await self.limiter.check("refresh-ip", ip_key(client_ip(req, cfg.trusted_proxies)),
                                        cfg.refresh_ip_rate, cfg.refresh_ip_burst)
        if not d_ip.allowed:
            raise too_many(d_ip)
        raw = self.cookie.get(req, resp)
        if not raw:
            raise Problem(401, "no-session", "no refresh cookie: log in with POST /auth/login")
        r = await self.db.refresh_session_v2(raw, cfg.session_ttl, cfg.session_refresh_grace, self.fingerprint.of(req),
                                             cfg.refresh_session_rate, cfg.refresh_session_burst)
        outcome = r["outcome"]
        self.metrics.inc("switchboard_session_refreshes_total", outcome=outcome)
        if outcome in ("rotated", "resent"):
            token, ttl = self.auth.issue(r["user_id"], r["username"], r["role"], r["token_epoch"],
                                         session_id=r["session_id"], not_after=r["expires_at"].timestamp())
            self.cookie.set(req, resp, r["new_refresh_token"], r["expires_at"])
            resp.set_headers(d_ip.headers())
            resp.cache_control = ["no-store"]
            resp.media = token_body(token, ttl, r["user_id"], r["role"])
            return
        if outcome == "limited":
            self.metrics.inc("switchboard_ratelimit_denied_total", policy="refresh-session")
            burst, rate = cfg.refresh_session_burst, cfg.refresh_session_rate
            raise too_many(Decision(False, 0, r["retry_after_ms"], r["retry_after_ms"], "refresh-session", burst,
                                    max(1, math.ceil(burst / rate))))
        if outcome == "concurrent":
            # A token a 0.2 replica spent a moment ago (no client fingerprint to compare):
            # the browser holds the newer cookie by now.
            raise Problem(409, "refresh-in-progress",
                          "this refresh token was just used by a concurrent refresh; retry with the newer cookie",
                          headers={"Retry-After": "1"})
        self.cookie.clear(req, resp)
        if outcome == "reused":
            self.auth.apply_session_end(r["session_id"])
            raise Problem(401, "refresh-token-reused",
                          "this refresh token was already used: the session is revoked; log in again")
        if r["session_id"] is not None:
            self.auth.apply_session_end(r["session_id"])
        raise Problem(401, "session-ended", "the session has ended or expired; log in again")


class Logout:
    """POST /auth/logout: ends the session on every replica (its sockets close with
    1008 "session ended", its refresh token and tickets stop working), revokes the
    bearer token, clears the cookie. Either credential is enough: the bearer token,
    or the refresh cookie alone (a tab whose access token has expired)."""

    def __init__(self, db: Database, auth: AuthState, config: Config) -> None:
        self.db = db
        self.auth = auth
        self.cfg = config
        self.cookie = RefreshCookie(config)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        check_origin(req, self.cfg)
        raw = self.cookie.get(req, resp)  # two cookies: 400 before anything ends
        try:
            p = authenticate(self.auth, req)
        except AuthError:
            if not raw:
                raise
            p = None
        if p is not None:
            await self.db.revoke_token(p.jti, p.user_id, datetime.fromtimestamp(p.exp, tz=timezone.utc))
            self.auth.apply_revoke(p.jti)
            if p.session_id is not None:
                await self.db.end_session(p.session_id, "logout")
                self.auth.apply_session_end(p.session_id)
        if raw:
            sid = await self.db.end_session_by_refresh(raw)
            if sid is not None:
                self.auth.apply_session_end(sid)
        self.cookie.clear(req, resp)
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

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        if self.limiter is not None and self.cfg is not None:
            d = await self.limiter.check("ws-ticket", str(p.user_id), self.cfg.ws_ticket_rate,
                                         self.cfg.ws_ticket_burst)
            if not d.allowed:
                raise too_many(d)
        # Bound to the token's session: once it ends, the ticket opens nothing.
        ticket = await self.db.issue_ticket_v2(p.user_id, p.session_id, self.ttl)
        resp.status = falcon.HTTP_201
        resp.media = {"ticket": ticket, "expires_in": self.ttl}


class Me:
    def __init__(self, auth: AuthState, replica_id: str) -> None:
        self.auth = auth
        self.replica_id = replica_id

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.Response) -> None:
        p = authenticate(self.auth, req)
        resp.media = {"user_id": str(p.user_id), "username": p.username, "role": p.role,
                      "replica": self.replica_id, "session_id": str(p.session_id) if p.session_id else None}
