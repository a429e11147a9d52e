"""Login sessions (issue 19): rotating refresh cookies with reuse detection, and
sockets that belong to their session, on two real replicas.

Every rule that ends a session -- logout, refresh-token reuse (family
revocation), expiry, a password change, a role change, disable_user -- must
close the session's sockets with 1008 on BOTH replicas (the deadline is
generous: what is asserted is the close and its reason, not its speed), and a
ticket minted under the ended session must be refused at the handshake.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from http.cookies import SimpleCookie

import httpx
import jwt
import psycopg
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from harness import JWT_SECRET, WS, Server, auth, make_user

PW = "pw-" + "s" * 12
DEADLINE = 10.0  # a close must arrive within this (a loaded 2-core box)
PROBLEMS = "https://switchboard.dev/problems/"
SECURE_COOKIE = "__Host-sb_refresh"  # the refresh cookie whenever it is Secure


class Login:
    """One browser tab's view: the access token and the refresh cookie (``headers`` are
    sent with every request, as a browser sends its User-Agent)."""

    def __init__(self, server: Server, username: str, password: str = PW, headers: dict | None = None) -> None:
        self.headers = dict(headers or {})
        r = httpx.post(server.base + "/auth/login", json={"username": username, "password": password},
                       headers=self.headers, timeout=30)
        assert r.status_code == 200, r.text
        self.response = r
        self.body = r.json()
        self.token = self.body["access_token"]
        self.name = cookie_name(r)
        self.cookie = refresh_cookie(r, self.name)

    def refresh(self, server: Server) -> httpx.Response:
        r = httpx.post(server.base + "/auth/refresh", headers={**self.headers, "Cookie": f"{self.name}={self.cookie}"},
                       timeout=30)
        if r.status_code == 200:
            self.token = r.json()["access_token"]
            self.cookie = refresh_cookie(r, self.name)
        return r


def set_cookie(r: httpx.Response, name: str = "sb_refresh") -> dict[str, str]:
    """The Set-Cookie attributes of one cookie (lower-cased names; flags map to '')."""
    for raw in r.headers.get_list("set-cookie"):
        if raw.startswith(name + "="):
            parts = [p.strip() for p in raw.split(";")]
            attrs = {"value": parts[0].split("=", 1)[1]}
            for p in parts[1:]:
                k, _, v = p.partition("=")
                attrs[k.lower()] = v
            return attrs
    raise AssertionError(f"no Set-Cookie for {name}: {r.headers.get_list('set-cookie')}")


def cookie_name(r: httpx.Response) -> str:
    """The refresh cookie's name in a response: __Host-sb_refresh when Secure, sb_refresh on plain HTTP."""
    names = [n for n in (SECURE_COOKIE, "sb_refresh")
             if any(raw.startswith(n + "=") and not raw.startswith(n + "=;") for raw in r.headers.get_list("set-cookie"))]
    assert len(names) == 1, r.headers.get_list("set-cookie")
    return names[0]


def refresh_cookie(r: httpx.Response, name: str = "sb_refresh") -> str:
    c: SimpleCookie = SimpleCookie()
    for raw in r.headers.get_list("set-cookie"):
        if raw.startswith(name + "="):
            c.load(raw)
    return c[name].value


def ws_for(server: Server, token: str) -> WS:
    return WS(connect(f"{server.ws_base}/ws?ticket={server.ticket(token)}", open_timeout=10))


def close_of(ws: WS, timeout: float = DEADLINE) -> tuple[int, str] | None:
    """Read until the server closes; (code, reason), or None if still open at timeout."""
    deadline = time.time() + timeout
    try:
        while (left := deadline - time.time()) > 0:
            ws.conn.recv(timeout=left)
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd is not None else (-1, "")
    return None


def refused(server: Server, ticket: str) -> bool:
    try:
        connect(f"{server.ws_base}/ws?ticket={ticket}", open_timeout=10).close()
    except InvalidStatus as exc:
        return exc.response.status_code == 403
    return False


def wait_for(pred: Callable[[], bool], timeout: float = DEADLINE) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def me(server: Server, token: str) -> int:
    return httpx.get(server.base + "/me", headers=auth(token), timeout=30).status_code


@pytest.fixture
def pair(server_factory) -> Callable[..., tuple[Server, Server]]:  # type: ignore[no-untyped-def]
    def start(env: dict | None = None) -> tuple[Server, Server]:
        return server_factory(env=env), server_factory(env=env)
    return start


# -- login, refresh, rotation ---------------------------------------------------------------
def test_login_returns_the_contract_body_and_a_locked_down_cookie(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "ana")
    s1, s2 = pair()
    t = Login(s1, "ana")
    assert set(t.body) == {"access_token", "token_type", "expires_in", "user_id", "role"}
    assert (t.body["token_type"], t.body["user_id"], t.body["role"]) == ("bearer", uid, "member")
    assert t.response.headers["cache-control"] == "no-store"
    c = set_cookie(t.response)
    assert c["path"] == "/auth" and "httponly" in c and c["samesite"] == "Strict"
    assert "secure" not in c  # plain HTTP, no trusted proxy
    assert int(c["max-age"]) > 13 * 86400  # SWITCHBOARD_SESSION_TTL default: 14 days
    claims = jwt.decode(t.token, JWT_SECRET, algorithms=["HS256"])
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT user_id, ended_at FROM switchboard.sessions WHERE id = %s",
                           (claims["sid"],)).fetchone()
        assert row == (uuid.UUID(uid), None)
        # only a hash of the refresh token is stored
        stored = conn.execute("SELECT count(*) FROM switchboard.refresh_tokens WHERE hash = sha256(decode(%s, 'hex'))",
                              (t.cookie,)).fetchone()[0]
        assert stored == 1
        assert conn.execute("SELECT count(*) FROM switchboard.refresh_tokens WHERE encode(hash, 'hex') = %s",
                            (t.cookie,)).fetchone()[0] == 0
    body = httpx.get(s2.base + "/me", headers=auth(t.token)).json()
    assert body["session_id"] == claims["sid"]


def test_refresh_rotates_on_any_replica_and_reuse_revokes_the_family(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "bo")
    s1, s2 = pair({"SWITCHBOARD_SESSION_REFRESH_RACE_SECONDS": "0"})
    t = Login(s1, "bo")
    sid = jwt.decode(t.token, JWT_SECRET, algorithms=["HS256"])["sid"]
    first = t.cookie
    cookies = [first]
    for server in (s2, s1, s2):
        r = t.refresh(server)
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"access_token", "token_type", "expires_in", "user_id", "role"}
        assert t.cookie not in cookies  # rotated: a new token every time
        cookies.append(t.cookie)
        assert jwt.decode(t.token, JWT_SECRET, algorithms=["HS256"])["sid"] == sid  # same session
        assert me(s1, t.token) == 200 and me(s2, t.token) == 200
    ws1, ws2 = ws_for(s1, t.token), ws_for(s2, t.token)
    unused_ticket = s1.ticket(t.token)

    # The first cookie comes back (stolen and replayed): the whole family is revoked.
    r = httpx.post(s2.base + "/auth/refresh", headers={"Cookie": f"sb_refresh={first}"})
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == PROBLEMS + "refresh-token-reused"
    assert "1970" in set_cookie(r)["expires"]  # cleared
    # ... so the newest cookie is dead too, as are the session's tokens and sockets, everywhere.
    r = t.refresh(s1)
    assert r.status_code == 401 and r.json()["type"] == PROBLEMS + "session-ended"
    assert close_of(ws1) == (1008, "session revoked")
    assert close_of(ws2) == (1008, "session revoked")
    assert wait_for(lambda: me(s1, t.token) == 401 and me(s2, t.token) == 401)
    assert refused(s2, unused_ticket)
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT end_reason FROM switchboard.sessions WHERE id = %s",
                            (sid,)).fetchone()[0] == "reuse"
    # A fresh login is a new, independent session.
    t2 = Login(s2, "bo")
    assert t2.refresh(s1).status_code == 200


def test_two_tabs_refreshing_one_after_the_other_do_not_log_the_user_out(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "cy")
    s1, s2 = pair()  # default grace: 60 s
    t = Login(s1, "cy")
    old = t.cookie
    assert t.refresh(s1).status_code == 200
    # The other tab sent the same (now used) cookie a moment later: it gets the same
    # successor (it is the same browser), nothing is revoked.
    r = httpx.post(s2.base + "/auth/refresh", headers={"Cookie": f"sb_refresh={old}"})
    assert r.status_code == 200 and refresh_cookie(r) == t.cookie
    assert t.refresh(s2).status_code == 200  # the successor still works
    assert me(s1, t.token) == 200


def test_refresh_without_or_with_a_bad_cookie_is_401(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    s1, _ = pair()
    r = httpx.post(s1.base + "/auth/refresh")
    assert r.status_code == 401 and r.json()["type"] == PROBLEMS + "no-session"
    for bad in ("x", "0" * 64, "'; DROP TABLE x; --", "z" * 5000):
        r = httpx.post(s1.base + "/auth/refresh", headers={"Cookie": f"sb_refresh={bad}"})
        assert r.status_code == 401 and r.json()["type"] == PROBLEMS + "session-ended", (bad, r.text)


# -- logout ---------------------------------------------------------------------------------
def test_logout_closes_the_sessions_sockets_on_both_replicas_and_refuses_its_tickets(  # type: ignore[no-untyped-def]
        pair, db: str) -> None:
    make_user(db, "di")
    s1, s2 = pair()
    t = Login(s1, "di")
    other = Login(s2, "di")  # a second session of the same user (another browser)
    ws1, ws2 = ws_for(s1, t.token), ws_for(s2, t.token)
    ws_other = ws_for(s1, other.token)
    early_ticket = s2.ticket(t.token)

    r = httpx.post(s2.base + "/auth/logout", headers={**auth(t.token), "Cookie": f"sb_refresh={t.cookie}"})
    assert r.status_code == 204
    c = set_cookie(r)
    assert c["value"] in ("", '""') and "1970" in c["expires"] and c["path"] == "/auth"
    assert close_of(ws1) == (1008, "session ended")
    assert close_of(ws2) == (1008, "session ended")
    assert refused(s1, early_ticket)
    assert me(s1, t.token) == 401 and me(s2, t.token) == 401
    assert t.refresh(s1).status_code == 401
    # Only that session ended: the other browser's socket and tokens live on.
    assert close_of(ws_other, 1.5) is None
    assert me(s1, other.token) == 200 and other.refresh(s1).status_code == 200


def test_logout_with_the_cookie_alone_ends_the_session(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "ed")
    s1, s2 = pair()
    t = Login(s1, "ed")
    ws2 = ws_for(s2, t.token)
    # an expired/garbled access token plus a good cookie: the cookie is enough
    r = httpx.post(s1.base + "/auth/logout", headers={"Authorization": "Bearer nope",
                                                      "Cookie": f"sb_refresh={t.cookie}"})
    assert r.status_code == 204
    assert close_of(ws2) == (1008, "session ended")
    assert wait_for(lambda: me(s2, t.token) == 401)
    # neither credential: 401 problem
    r = httpx.post(s1.base + "/auth/logout")
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"


# -- expiry ---------------------------------------------------------------------------------
def test_an_expired_session_closes_its_sockets_unless_refreshed_elsewhere(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "fay")
    ttl = 15
    s1, s2 = pair({"SWITCHBOARD_SESSION_TTL": str(ttl)})
    t0 = time.time()
    t = Login(s1, "fay")
    assert t.body["expires_in"] <= ttl  # an access token never outlives its session
    assert int(set_cookie(t.response)["max-age"]) <= ttl
    ws1 = ws_for(s1, t.token)
    lazy = Login(s1, "fay")  # a second session nobody refreshes
    ws_lazy = ws_for(s2, lazy.token)
    time.sleep(6)
    # Refreshed on s2: the session now lives until ~t0 + 6 + ttl; s1 must re-read it, not
    # close its socket at the expiry it was accepted with (~t0 + ttl).
    assert t.refresh(s2).status_code == 200
    t_refreshed = time.time()
    assert close_of(ws_lazy, ttl + DEADLINE) == (1008, "session ended")
    assert time.time() - t0 >= ttl - 1  # not before its expiry
    left = t_refreshed + ttl - time.time()
    if left > 1:  # (a badly delayed box may already be past it: then only the close is checked)
        assert close_of(ws1, left - 0.5) is None
    assert close_of(ws1, ttl + DEADLINE) == (1008, "session ended")
    assert t.refresh(s1).status_code == 401


# -- changes to the user --------------------------------------------------------------------
@pytest.mark.parametrize("change, reason", [
    ("SELECT switchboard.set_user_password_hash(%s, password_hash) FROM switchboard.users WHERE id = %s",
     "session revoked"),
    ("SELECT switchboard.set_user_role(%s, 'admin') WHERE %s::uuid IS NOT NULL", "session revoked"),
    ("SELECT switchboard.disable_user(%s) WHERE %s::uuid IS NOT NULL", "user disabled"),
], ids=["password", "role", "disable"])
def test_user_changes_end_every_session_and_close_its_sockets(  # type: ignore[no-untyped-def]
        pair, db: str, change: str, reason: str) -> None:
    uid = make_user(db, "gus")
    s1, s2 = pair()
    t = Login(s1, "gus")
    ws1, ws2 = ws_for(s1, t.token), ws_for(s2, t.token)
    early_ticket = s1.ticket(t.token)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(change, (uid, uid))
    assert close_of(ws1) == (1008, reason)
    assert close_of(ws2) == (1008, reason)
    assert refused(s2, early_ticket)
    r = t.refresh(s2)
    assert r.status_code == 401 and r.json()["type"] == PROBLEMS + "session-ended"
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM switchboard.sessions WHERE user_id = %s AND ended_at IS NULL",
                         (uid,)).fetchone()[0] == 0


# -- tokens from before sessions ------------------------------------------------------------
def test_a_token_without_a_session_id_stays_valid_until_it_expires(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "hal")
    s1, _ = pair()
    now = int(time.time())
    old = jwt.encode({"sub": uid, "name": "hal", "role": "member", "iat": now, "exp": now + 600,
                      "jti": "legacy-" + "0" * 20, "gen": 0}, JWT_SECRET, algorithm="HS256")
    body = httpx.get(s1.base + "/me", headers=auth(old)).json()
    assert body["session_id"] is None and body["user_id"] == uid
    ws = ws_for(s1, old)
    assert ws.hello["payload"]["user_id"] == uid
    assert httpx.post(s1.base + "/auth/logout", headers=auth(old)).status_code == 204
    assert me(s1, old) == 401
    # a user-level change still closes its socket
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.disable_user(%s)", (uid,))
    assert close_of(ws) == (1008, "user disabled")


# -- the cookie's Secure flag ---------------------------------------------------------------
def test_secure_cookie_behind_a_trusted_tls_proxy_only(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "ivy")
    tls = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    trusting = server_factory(env={"SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1/32"})
    t = Login(trusting, "ivy", headers=tls)
    c = set_cookie(t.response, SECURE_COOKIE)
    assert "secure" in c and c["path"] == "/" and "domain" not in c and "httponly" in c
    r = httpx.post(trusting.base + "/auth/refresh", headers={**tls, "Cookie": f"{SECURE_COOKIE}={t.cookie}"})
    assert r.status_code == 200 and "secure" in set_cookie(r, SECURE_COOKIE)
    # the proxy says plain http: no Secure, the development name and path
    c = set_cookie(Login(trusting, "ivy", headers={"X-Forwarded-Proto": "http"}).response)
    assert "secure" not in c and c["path"] == "/auth"
    # nobody is trusted: the header is ignored
    plain = server_factory()
    assert "secure" not in set_cookie(Login(plain, "ivy", headers=tls).response)
    # SameSite=None forces Secure (browsers drop it otherwise), and so the __Host- name
    cross = server_factory(env={"SWITCHBOARD_SESSION_COOKIE_SAMESITE": "None"})
    c = set_cookie(Login(cross, "ivy").response, SECURE_COOKIE)
    assert c["samesite"] == "None" and "secure" in c and c["path"] == "/"


# -- the announcement is a hint -------------------------------------------------------------
def test_a_forged_session_announcement_closes_nothing(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "jo")
    s1, s2 = pair()
    t = Login(s1, "jo")
    sid = jwt.decode(t.token, JWT_SECRET, algorithms=["HS256"])["sid"]
    ws1, ws2 = ws_for(s1, t.token), ws_for(s2, t.token)
    with psycopg.connect(db, autocommit=True) as c:
        for payload in ({"kind": "session", "session_id": sid},
                        {"kind": "session", "session_id": sid, "end_reason": "logout"},
                        {"kind": "session", "session_id": str(uuid.uuid4())},
                        {"kind": "session", "session_id": "not-a-uuid"}):
            c.execute("SELECT pg_notify('switchboard_control', %s)", (json.dumps(payload),))
    # each replica re-read the session (session_states) and found it live
    assert close_of(ws1, 1.5) is None and close_of(ws2, 0.1) is None
    assert me(s1, t.token) == 200 and me(s2, t.token) == 200
    # the real thing still works afterwards
    assert httpx.post(s1.base + "/auth/logout", headers=auth(t.token)).status_code == 204
    assert close_of(ws1) == (1008, "session ended") and close_of(ws2) == (1008, "session ended")


def test_a_logout_missed_while_deaf_closes_the_socket_after_the_reconnect(  # type: ignore[no-untyped-def]
        server_factory, db: str) -> None:
    """The announcement is lost while the replica's LISTEN connection is down; the
    relay's reconnect re-reads the sessions of its sockets (SessionWatch.on_connect)."""
    from harness import APP_LOGIN

    make_user(db, "kit")
    s = server_factory()
    t = Login(s, "kit")
    ws = ws_for(s, t.token)
    dbname = db.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(db, autocommit=True) as c:
        try:
            # Keep the relay from reconnecting, then cut its LISTEN connection.
            c.execute(f"ALTER ROLE {APP_LOGIN} CONNECTION LIMIT 0")
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                      "AND application_name IN ('switchboard-listen', 'switchboard-relay-read')", (dbname,))
            assert wait_for(lambda: httpx.get(s.base + "/healthz/ready").status_code == 503)
            # The logout, as SQL (end_session): its announcement reaches nobody on this replica.
            c.execute("SELECT switchboard.end_session(%s)",
                      (jwt.decode(t.token, JWT_SECRET, algorithms=["HS256"])["sid"],))
            assert close_of(ws, 1.5) is None  # deaf: it cannot know yet
        finally:
            c.execute(f"ALTER ROLE {APP_LOGIN} CONNECTION LIMIT -1")
    assert close_of(ws, 20) == (1008, "session ended")
    assert me(s, t.token) == 401  # the reloaded snapshot refuses the session's tokens too
