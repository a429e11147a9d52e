"""The per-replica cache of verified bearer tokens never outlives what it caches.

AuthState verifies a token's HS256 signature once and remembers the claims;
expiry, revocation and a disabled user must still be enforced on every request.
"""

from __future__ import annotations

import time
import uuid

import jwt
import pytest

from switchboard.auth import ALGORITHM, AuthState
from switchboard.domain_errors import AuthError

SECRET = "s" * 40


def _token(exp_in: float, jti: str = "j1", sub: uuid.UUID | None = None) -> str:
    now = int(time.time())
    return jwt.encode({"sub": str(sub or uuid.uuid4()), "name": "u", "role": "member", "iat": now,
                       "exp": now + exp_in, "jti": jti}, SECRET, algorithm=ALGORITHM)


def _status(auth: AuthState, token: str) -> str:
    try:
        auth.authenticate(f"Bearer {token}")
        return "ok"
    except AuthError as e:
        return e.description


def test_a_cached_token_still_expires() -> None:
    auth = AuthState(SECRET, 3600)
    tok = _token(2)
    assert _status(auth, tok) == "ok"
    assert _status(auth, tok) == "ok"  # from the cache
    time.sleep(2.1)
    assert _status(auth, tok) == "The token has expired."
    assert _status(auth, tok) == "The token has expired."


def test_revocation_and_disable_apply_to_a_cached_token() -> None:
    auth = AuthState(SECRET, 3600)
    uid = uuid.uuid4()
    tok = _token(600, jti="revoke-me", sub=uid)
    assert _status(auth, tok) == "ok"
    auth.apply_revoke("revoke-me")
    assert _status(auth, tok) == "The token was revoked."
    tok2 = _token(600, jti="other", sub=uid)
    assert _status(auth, tok2) == "ok"
    auth.apply_user(uid, "member", True)
    assert _status(auth, tok2) == "The user is disabled."


def test_a_forged_token_is_never_cached_as_valid() -> None:
    auth = AuthState(SECRET, 3600)
    good = _token(600)
    forged = good[:-2] + ("AA" if good[-2:] != "AA" else "BB")
    assert _status(auth, forged) == "The token is invalid."
    assert _status(auth, forged) == "The token is invalid."
    assert _status(AuthState("x" * 40, 3600), good) == "The token is invalid."


@pytest.mark.parametrize("n", [5000])
def test_the_cache_is_bounded(n: int) -> None:
    from switchboard import auth as auth_mod

    a = AuthState(SECRET, 3600)
    for i in range(n):
        assert _status(a, _token(600, jti=f"j{i}")) == "ok"
    assert len(a._verified) <= auth_mod.VERIFIED_CACHE_SIZE
