"""Passwords, access tokens and the per-replica view of revocations.

Passwords: argon2id (argon2-cffi), verified in a thread so hashing never
blocks the event loop. Tokens: HS256 JWTs, algorithm pinned on decode, with
exp, iat, jti, sub, role, gen (the user's token epoch when it was issued) and
sid (the login session it was minted under; absent in tokens issued before
sessions existed, which stay valid until they expire -- at most
SWITCHBOARD_JWT_TTL). A token never outlives its session's current expiry,
and an ended session's tokens are refused (ended_sessions, fed like revoked).
Revocation (logout), role changes and disabled users come from the database:
announced on switchboard_control at COMMIT, *read back* by the relay
(user_states, revoked_among: an announcement is a hint anybody could forge)
and applied here within milliseconds; after the LISTEN connection reconnects
(it may have missed announcements) the whole view is reloaded from
auth_snapshot(). A role change, a password change and disabling a user bump
the user's token epoch, which revokes every token issued before. Postgres
stays the source of truth; this is a cache of it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import argon2
import jwt

from .domain_errors import AuthError

ALGORITHM = "HS256"
VERIFIED_CACHE_SIZE = 4096
_hasher = argon2.PasswordHasher()
# A hash of a random password, verified against when the user is unknown so
# unknown and known users take the same time.
_DUMMY_HASH = _hasher.hash(secrets.token_hex(16))


def hash_password(password: str) -> str:
    return _hasher.hash(password)


async def verify_password(stored_hash: str | None, password: str) -> bool:
    def _verify() -> bool:
        try:
            return _hasher.verify(stored_hash or _DUMMY_HASH, password) and stored_hash is not None
        except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
            return False
    return await asyncio.to_thread(_verify)


@dataclass
class Principal:
    user_id: uuid.UUID
    username: str
    role: str
    jti: str
    exp: int
    session_id: uuid.UUID | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class AuthState:
    """Revoked token ids and the latest known role/disabled per user."""

    def __init__(self, secret: str, ttl: int) -> None:
        self.secret = secret
        self.ttl = ttl
        self.revoked: dict[str, float] = {}
        # session id -> until when to remember it ended (its tokens expire before that)
        self.ended_sessions: dict[uuid.UUID, float] = {}
        # user id -> (role, disabled, token epoch), for users changed within a token lifetime
        self.users: dict[uuid.UUID, tuple[str, bool, int]] = {}
        # Verified tokens -> (claims, user id). A client sends the same bearer token on
        # every request and the HS256 check is deterministic, so it is done once per
        # token, not per request (PyJWT's decode was a large share of a GET /tasks:
        # BENCHMARKS.md, 'Changes made to Switchboard from these measurements').
        # Expiry, revocation and the user's role/disabled flag are still checked every time.
        self._verified: OrderedDict[str, tuple[dict[str, Any], uuid.UUID]] = OrderedDict()

    def issue(self, user_id: uuid.UUID, username: str, role: str, epoch: int = 0,
              session_id: uuid.UUID | None = None, not_after: float | None = None) -> tuple[str, int]:
        """A token and its lifetime in seconds: ttl, or less if ``not_after`` (the
        session's expiry) comes first."""
        now = int(time.time())
        ttl = self.ttl if not_after is None else max(1, min(self.ttl, int(not_after) - now))
        claims = {"sub": str(user_id), "name": username, "role": role, "iat": now,
                  "exp": now + ttl, "jti": secrets.token_hex(16), "gen": int(epoch)}
        if session_id is not None:
            claims["sid"] = str(session_id)
        return jwt.encode(claims, self.secret, algorithm=ALGORITHM), ttl

    def authenticate(self, header: str | None) -> Principal:
        if not header:
            raise AuthError("A bearer token is required.", challenge="Bearer")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("Use 'Authorization: Bearer <token>'.", challenge="Bearer")
        token = token.strip()
        try:
            hit = self._verified.get(token)
            if hit is not None:
                claims, user_id = hit
                if int(claims["exp"]) <= time.time():
                    del self._verified[token]
                    raise jwt.ExpiredSignatureError("Signature has expired")
            else:
                claims = jwt.decode(token, self.secret, algorithms=[ALGORITHM],
                                    options={"require": ["exp", "iat", "sub", "jti"]})
                user_id = uuid.UUID(claims["sub"])
                self._verified[token] = (claims, user_id)
                if len(self._verified) > VERIFIED_CACHE_SIZE:
                    self._verified.popitem(last=False)
        except jwt.ExpiredSignatureError:
            raise AuthError("The token has expired.") from None
        except (jwt.InvalidTokenError, ValueError, KeyError, TypeError):
            raise AuthError("The token is invalid.") from None
        jti = str(claims["jti"])
        if jti in self.revoked:
            raise AuthError("The token was revoked.")
        try:
            sid = _session_claim(claims)
        except ValueError:
            raise AuthError("The token is invalid.") from None
        gen = claims.get("gen", 0)
        refused = self.verdict(user_id, None, gen if isinstance(gen, int) else -1, sid)
        if refused is not None:
            raise AuthError(_TOKEN_REFUSALS[refused])
        known = self.users.get(user_id)
        role = known[0] if known is not None else str(claims.get("role", "member"))
        return Principal(user_id, str(claims.get("name", "")), role, jti, int(claims["exp"]), sid)

    def verdict(self, user_id: uuid.UUID, role: str | None, epoch: int,
                session_id: uuid.UUID | None) -> str | None:
        """The one access rule, for a token (HTTP) and for an open socket alike: None if
        what was granted at ``epoch`` (with ``role``, under ``session_id``) still stands,
        else the close reason: "user disabled", "session revoked" (the user's token epoch
        moved on: a password or role change; or the role differs from the one granted),
        "session ended". ``role`` None: the role is not part of the grant (a token takes
        the current role)."""
        known = self.users.get(user_id)
        if known is not None:
            if known[1]:
                return "user disabled"
            if epoch < known[2] or (role is not None and role != known[0]):
                return "session revoked"
        if session_id is not None and session_id in self.ended_sessions:
            return "session ended"
        return None

    # -- fed by the relay's control channel ------------------------------------
    def apply_revoke(self, jti: str, exp: float | None = None) -> None:
        self.revoked[jti] = exp or time.time() + self.ttl

    def apply_session_end(self, session_id: uuid.UUID) -> None:
        """Read from the database (session_states / auth_snapshot), never from a payload."""
        self.ended_sessions[session_id] = time.time() + self.ttl

    def apply_user(self, user_id: uuid.UUID, role: str, disabled: bool, epoch: int = 0) -> None:
        """State read from the database (user_states / auth_snapshot), never from a payload."""
        self.users[user_id] = (role, disabled, epoch)

    def is_disabled(self, user_id: uuid.UUID) -> bool:
        known = self.users.get(user_id)
        return known is not None and known[1]

    def load_snapshot(self, rows: list[dict[str, Any]]) -> None:
        revoked: dict[str, float] = {}
        users: dict[uuid.UUID, tuple[str, bool, int]] = {}
        ended: dict[uuid.UUID, float] = {}
        for r in rows:
            if r["kind"] == "revoke":
                revoked[r["id"]] = time.time() + self.ttl
            elif r["kind"] == "session":
                ended[uuid.UUID(r["id"])] = time.time() + self.ttl
            else:
                users[r["user_id"]] = (r["role"], bool(r["disabled"]), int(r.get("token_epoch") or 0))
        self.revoked = revoked
        self.users = users
        self.ended_sessions = ended

    def prune(self) -> None:
        now = time.time()
        self.revoked = {k: v for k, v in self.revoked.items() if v > now}
        self.ended_sessions = {k: v for k, v in self.ended_sessions.items() if v > now}


_TOKEN_REFUSALS = {
    "user disabled": "The user is disabled.",
    "session revoked": "The token was revoked (the user's role or password changed); log in again.",
    "session ended": "The session has ended; log in again.",
}


def _session_claim(claims: dict[str, Any]) -> uuid.UUID | None:
    raw = claims.get("sid")
    if raw is None:
        return None
    return uuid.UUID(str(raw))  # a malformed sid in a signed token: ValueError -> invalid
