"""Issue 32: login sessions bounded and hardened, on real replicas over real HTTP.

Each attack below was reproduced against the 0.2 design before it was closed:

1. a refresh flood: /auth/refresh had no limit, every rotation left a row until
   its session was reaped, and a session that kept refreshing never expired;
2. session fixation through a second cookie: the server took the first
   sb_refresh the browser sent, and a sibling subdomain can plant one that is
   sent first;
3. a lost refresh response logged the user out: the browser retried with the
   old cookie after the 10 s race window, which read as reuse.

What is asserted is what the product guarantees (a count, a status, a state),
never how fast; waits are generous for a loaded 2-core box.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import jwt
import psycopg
import pytest

from harness import JWT_SECRET, Server, make_user
from test_sessions import (PROBLEMS, SECURE_COOKIE, Login, close_of, me, refresh_cookie, refused, set_cookie,
                           ws_for)

KEEP = 8  # refresh_tokens rows kept per session (V0027)
BROWSER = {"User-Agent": "Mozilla/5.0 (test browser A)"}


def post(server: Server, cookie: str, headers: dict | None = None, path: str = "/auth/refresh") -> httpx.Response:
    """One request with exactly this Cookie header (a browser's, not a cookie jar's)."""
    return httpx.post(server.base + path, headers={**BROWSER, **(headers or {}), "Cookie": cookie}, timeout=60)


def sid_of(token: str) -> str:
    return str(jwt.decode(token, JWT_SECRET, algorithms=["HS256"])["sid"])


def token_rows(db: str, sid: str) -> list[tuple]:
    """(generation, used) of every refresh token the session holds."""
    with psycopg.connect(db) as c:
        return c.execute("SELECT generation, used_at IS NOT NULL FROM switchboard.refresh_tokens"
                         " WHERE session_id = %s ORDER BY generation", (sid,)).fetchall()


def is_unused(db: str, token: str) -> bool:
    with psycopg.connect(db) as c:
        row = c.execute("SELECT used_at IS NULL FROM switchboard.refresh_tokens WHERE hash = sha256(decode(%s, 'hex'))",
                        (token,)).fetchone()
        return bool(row and row[0])


def ended(db: str, sid: str) -> str | None:
    """The session's end_reason, or None while it lives."""
    with psycopg.connect(db) as c:
        return c.execute("SELECT end_reason FROM switchboard.sessions WHERE id = %s", (sid,)).fetchone()[0]


def problem(r: httpx.Response) -> str:
    assert r.headers["content-type"] == "application/problem+json", r.text
    return str(r.json()["type"]).removeprefix(PROBLEMS)


def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


# -- 1. bounded: rows, lifetime, rate --------------------------------------------------------
def test_a_refresh_flood_is_limited_and_leaves_at_most_eight_rows(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "flo")
    s = server_factory()  # the default limits
    t = Login(s, "flo", headers=BROWSER)
    sid = sid_of(t.token)
    first = t.cookie
    statuses: list[int] = []
    first_429: httpx.Response | None = None
    for _ in range(300):
        r = t.refresh(s)  # follows the rotation; a refused one keeps its cookie
        statuses.append(r.status_code)
        if r.status_code == 429 and first_429 is None:
            first_429 = r
        assert r.status_code in (200, 429), r.text
    assert first_429 is not None, "300 refreshes in a row were never limited"
    assert problem(first_429) == "rate-limited"
    assert int(first_429.headers["retry-after"]) >= 1
    assert '"refresh-session"' in first_429.headers["ratelimit-policy"]  # the session's bucket ran out first
    assert statuses.index(429) >= 10  # a burst of a few tabs' refreshes passes
    rows = token_rows(db, sid)
    assert len(rows) <= KEEP and [used for _, used in rows].count(False) == 1, rows
    # The login's token is older than 8 rotations: unknown now -- 401, but nothing is revoked.
    time.sleep(2)  # the flood also emptied this address's bucket (5 a second come back)
    r = post(s, f"sb_refresh={first}")
    assert r.status_code == 401 and problem(r) == "session-ended", r.text
    assert ended(db, sid) is None and me(s, t.token) == 200


def test_a_normal_cadence_and_many_tabs_are_never_refused(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "nia")
    s = server_factory()  # the default limits
    t = Login(s, "nia", headers=BROWSER)
    # Ten tabs restored at once, each refreshing with the same cookie.
    with ThreadPoolExecutor(10) as ex:
        rs = list(ex.map(lambda _: post(s, f"sb_refresh={t.cookie}"), range(10)))
    assert [r.status_code for r in rs] == [200] * 10, [r.text for r in rs if r.status_code != 200]
    assert len({refresh_cookie(r) for r in rs}) == 1
    t.cookie = refresh_cookie(rs[0])
    # Then a day's worth of a tab's refreshes (one an hour; here back to back).
    for _ in range(15):
        r = t.refresh(s)
        assert r.status_code == 200, r.text


def test_the_ip_limit_refuses_before_any_session_is_touched(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "ian")
    s = server_factory(env={"SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1/32", "SWITCHBOARD_REFRESH_IP_BURST": "5",
                            "SWITCHBOARD_REFRESH_IP_RATE": "0.01"})
    spray = {"X-Forwarded-For": "198.51.100.20"}
    t = Login(s, "ian", headers={**BROWSER, **spray})
    for i in range(5):  # someone on that network guessing tokens
        r = post(s, f"sb_refresh={i:064x}", spray)
        assert r.status_code == 401, r.text
    r = post(s, f"sb_refresh={t.cookie}", spray)
    assert r.status_code == 429 and problem(r) == "rate-limited", r.text
    assert int(r.headers["retry-after"]) >= 1 and '"refresh-ip"' in r.headers["ratelimit-policy"]
    assert is_unused(db, t.cookie)  # refused before the token was looked at
    # The same session from another network is not held up.
    r = post(s, f"sb_refresh={t.cookie}", {"X-Forwarded-For": "198.51.100.77"})
    assert r.status_code == 200, r.text


def test_refreshing_never_extends_a_session_past_its_max_lifetime(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "max")
    ttl, max_lifetime = 6, 12
    s = server_factory(env={"SWITCHBOARD_SESSION_TTL": str(ttl), "SWITCHBOARD_SESSION_MAX_LIFETIME": str(max_lifetime)})
    t0 = time.time()
    t = Login(s, "max", headers=BROWSER)
    t1 = time.time()  # the session started between t0 and t1
    sid = sid_of(t.token)
    assert int(set_cookie(t.response)["max-age"]) <= ttl
    deadline = t1 + max_lifetime + 30
    while True:
        time.sleep(1)  # well inside the idle lifetime every time
        r = t.refresh(s)
        if r.status_code != 200:
            break
        left = t1 + max_lifetime - time.time()  # at least what is left of the absolute lifetime
        assert int(set_cookie(r)["max-age"]) <= left + 2  # the cookie never outlives the session
        assert r.json()["expires_in"] <= left + 2  # nor does the access token
        assert time.time() < deadline, "the session outlived its max lifetime by 30 s"
    assert r.status_code == 401 and problem(r) == "session-ended", r.text
    assert time.time() - t0 >= max_lifetime - 1
    assert ended(db, sid) == "expired"
    with psycopg.connect(db) as c:
        assert c.execute("SELECT max_expires_at - created_at FROM switchboard.sessions WHERE id = %s",
                         (sid,)).fetchone()[0].total_seconds() == max_lifetime


# -- 2. one cookie, and over TLS the __Host- one -----------------------------------------------
def test_two_refresh_cookies_are_refused_and_neither_session_moves(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "bob")
    make_user(db, "mallory")
    s = server_factory()  # plain HTTP: the development name sb_refresh
    bob, mal = Login(s, "bob", headers=BROWSER), Login(s, "mallory", headers=BROWSER)
    # Mallory planted her cookie (a Domain cookie from a sibling subdomain, sent first).
    both = f"sb_refresh={mal.cookie}; sb_refresh={bob.cookie}"
    for path in ("/auth/refresh", "/auth/logout"):
        r = post(s, both, path=path)
        assert r.status_code == 400 and problem(r) == "ambiguous-session-cookie", (path, r.text)
        assert "1970" in set_cookie(r)["expires"]  # cleared
    assert is_unused(db, bob.cookie) and is_unused(db, mal.cookie)
    assert ended(db, sid_of(bob.token)) is None and ended(db, sid_of(mal.token)) is None
    assert bob.refresh(s).status_code == 200 and mal.refresh(s).status_code == 200


def test_over_tls_the_cookie_is_host_prefixed_and_a_planted_one_is_ignored(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "bea")
    make_user(db, "mel")
    s = server_factory(env={"SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1/32"})
    tls = {**BROWSER, "X-Forwarded-Proto": "https"}
    bea, mel = Login(s, "bea", headers=tls), Login(s, "mel", headers=tls)
    c = set_cookie(bea.response, SECURE_COOKIE)
    assert c["path"] == "/" and "secure" in c and "domain" not in c and "httponly" in c and c["samesite"] == "Strict"
    # A sibling subdomain can plant sb_refresh (sent first) but never a __Host- cookie.
    r = post(s, f"sb_refresh={mel.cookie}; {SECURE_COOKIE}={bea.cookie}", tls)
    assert r.status_code == 200, r.text
    assert sid_of(r.json()["access_token"]) == sid_of(bea.token)
    assert is_unused(db, mel.cookie)
    legacy = set_cookie(r, "sb_refresh")  # ... and the stray legacy cookie is deleted
    assert "1970" in legacy["expires"] and legacy["path"] == "/auth"
    # Two __Host- values cannot come from the browser's own jar: refused.
    r2 = post(s, f"{SECURE_COOKIE}={mel.cookie}; {SECURE_COOKIE}={refresh_cookie(r, SECURE_COOKIE)}", tls)
    assert r2.status_code == 400 and problem(r2) == "ambiguous-session-cookie"
    # A 0.2 replica's cookie alone is not read over TLS: that user logs in once more.
    r3 = post(s, f"sb_refresh={mel.cookie}", tls)
    assert r3.status_code == 401 and problem(r3) == "no-session"
    assert is_unused(db, mel.cookie)


# -- 3. a lost response, replays, concurrency ----------------------------------------------------
def test_a_lost_refresh_response_retried_after_ten_seconds_keeps_the_session(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "lou")
    s1, s2 = pair()  # the default grace: 60 s
    t = Login(s1, "lou", headers=BROWSER)
    sid = sid_of(t.token)
    ws = ws_for(s1, t.token)
    old = t.cookie
    r1 = post(s1, f"sb_refresh={old}")  # its response never reaches the browser
    assert r1.status_code == 200
    successor = refresh_cookie(r1)
    time.sleep(11)  # past the 0.2 release's 10 s race window
    r2 = post(s2, f"sb_refresh={old}")  # the browser retries with the cookie it still has
    assert r2.status_code == 200, r2.text
    assert refresh_cookie(r2) == successor  # the same successor, not a second one
    assert sid_of(r2.json()["access_token"]) == sid and ended(db, sid) is None
    r3 = post(s1, f"sb_refresh={successor}")  # and it works
    assert r3.status_code == 200 and refresh_cookie(r3) not in (old, successor)
    assert me(s2, r3.json()["access_token"]) == 200
    assert close_of(ws, 1.0) is None


@pytest.mark.parametrize("other", [{"User-Agent": "curl/8.5.0"}, {"X-Forwarded-For": "192.0.2.66"}],
                         ids=["other-user-agent", "other-network"])
def test_a_replay_from_another_client_within_the_grace_revokes_the_session(  # type: ignore[no-untyped-def]
        pair, db: str, other: dict) -> None:
    make_user(db, "rex")
    s1, s2 = pair({"SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1/32"})
    home = {**BROWSER, "X-Forwarded-For": "198.51.100.5"}
    t = Login(s1, "rex", headers=home)
    sid = sid_of(t.token)
    ws1, ws2 = ws_for(s1, t.token), ws_for(s2, t.token)
    unused_ticket = s1.ticket(t.token)
    stolen = t.cookie
    assert t.refresh(s1).status_code == 200  # the user refreshes
    r = post(s2, f"sb_refresh={stolen}", {**home, **other})  # the thief, seconds later
    assert r.status_code == 401 and problem(r) == "refresh-token-reused", r.text
    assert ended(db, sid) == "reuse"
    assert close_of(ws1) == (1008, "session revoked") and close_of(ws2) == (1008, "session revoked")
    assert wait_for(lambda: me(s1, t.token) == 401 and me(s2, t.token) == 401)
    assert refused(s2, unused_ticket)
    r = t.refresh(s1)
    assert r.status_code == 401 and problem(r) == "session-ended"


def test_a_replay_after_the_successor_was_used_revokes_the_session(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "sue")
    s1, s2 = pair()
    t = Login(s1, "sue", headers=BROWSER)
    sid = sid_of(t.token)
    ws = ws_for(s2, t.token)
    old = t.cookie
    assert t.refresh(s1).status_code == 200
    assert t.refresh(s2).status_code == 200  # the successor was used
    r = post(s1, f"sb_refresh={old}")  # same client, well within the grace
    assert r.status_code == 401 and problem(r) == "refresh-token-reused", r.text
    assert ended(db, sid) == "reuse"
    assert close_of(ws) == (1008, "session revoked")


def test_two_concurrent_refreshes_from_one_client_both_get_the_same_successor(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "tab")
    s1, s2 = pair()
    t = Login(s1, "tab", headers=BROWSER)
    gate = threading.Barrier(2)

    def tab(server: Server) -> httpx.Response:
        gate.wait()
        return post(server, f"sb_refresh={t.cookie}")

    with ThreadPoolExecutor(2) as ex:
        a, b = ex.map(tab, (s1, s2))
    assert (a.status_code, b.status_code) == (200, 200), (a.text, b.text)
    assert refresh_cookie(a) == refresh_cookie(b)
    assert ended(db, sid_of(t.token)) is None
    assert post(s2, f"sb_refresh={refresh_cookie(a)}").status_code == 200


def test_many_simultaneous_refreshes_of_one_token_hand_out_exactly_one_successor(pair, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "ray")
    s1, s2 = pair()
    t = Login(s1, "ray", headers=BROWSER)
    sid = sid_of(t.token)
    n = 20
    gate = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        gate.wait()
        return post((s1, s2)[i % 2], f"sb_refresh={t.cookie}")

    with ThreadPoolExecutor(n) as ex:
        rs = list(ex.map(one, range(n)))
    assert [r.status_code for r in rs] == [200] * n, [r.text for r in rs if r.status_code != 200]
    assert len({refresh_cookie(r) for r in rs}) == 1
    assert token_rows(db, sid) == [(0, True), (1, False)]  # one successor, live; nothing else


def test_racing_connections_never_make_two_live_successors(db: str, app_url: str) -> None:
    """The database alone, as an isolation spec: many connections refresh one token at
    the same instant, from one client and then from many."""
    make_user(db, "sql")
    with psycopg.connect(db, autocommit=True) as c:
        uid = c.execute("SELECT id FROM switchboard.users WHERE username = 'sql'").fetchone()[0]

    def race(fingerprints: list[bytes]) -> tuple[str, list[tuple[str, str | None]]]:
        with psycopg.connect(db, autocommit=True) as c:
            sid, token = c.execute("SELECT session_id, refresh_token FROM switchboard.start_session_v2(%s, '1 day', "
                                   "'2 days')", (uid,)).fetchone()
        gate = threading.Barrier(len(fingerprints))

        def one(fp: bytes) -> tuple[str, str | None]:
            with psycopg.connect(app_url, autocommit=True) as c:
                gate.wait()
                return c.execute("SELECT outcome, new_refresh_token FROM switchboard.refresh_session_v2("
                                 "%s, '1 day', '60 seconds', %s)", (token, fp)).fetchone()

        with ThreadPoolExecutor(len(fingerprints)) as ex:
            return str(sid), list(ex.map(one, fingerprints))

    same = bytes(32)
    sid, out = race([same] * 16)
    assert sorted(o for o, _ in out) == ["resent"] * 15 + ["rotated"]
    assert len({tok for _, tok in out}) == 1
    assert token_rows(db, sid) == [(0, True), (1, False)]
    # Many clients at once: one rotates, the first replay from another client ends the session.
    sid, out = race([bytes([i]) * 32 for i in range(16)])
    outcomes = [o for o, _ in out]
    assert outcomes.count("rotated") == 1 and set(outcomes) <= {"rotated", "reused", "ended"}, outcomes
    assert "reused" in outcomes and ended(db, sid) == "reuse"
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM switchboard.refresh_tokens WHERE session_id = %s AND used_at IS NULL",
                         (sid,)).fetchone()[0] == 1


# -- a rolling update from 0.2 --------------------------------------------------------------------
def test_a_token_spent_by_a_previous_release_replica_is_answered_409_not_revoked(  # type: ignore[no-untyped-def]
        server_factory, db: str, app_url: str) -> None:
    make_user(db, "old")
    s = server_factory()
    t = Login(s, "old", headers=BROWSER)
    with psycopg.connect(app_url, autocommit=True) as c:  # what a 0.2 replica calls
        outcome, successor = c.execute("SELECT outcome, new_refresh_token FROM switchboard.refresh_session("
                                       "%s, '14 days', '10 seconds')", (t.cookie,)).fetchone()
    assert outcome == "rotated"
    r = post(s, f"sb_refresh={t.cookie}")  # no fingerprint to compare: 0.2's answer
    assert r.status_code == 409 and problem(r) == "refresh-in-progress" and r.headers["retry-after"] == "1"
    assert ended(db, sid_of(t.token)) is None
    assert post(s, f"sb_refresh={successor}").status_code == 200


@pytest.fixture
def pair(server_factory) -> Callable[..., tuple[Server, Server]]:  # type: ignore[no-untyped-def]
    def start(env: dict | None = None) -> tuple[Server, Server]:
        return server_factory(env=env), server_factory(env=env)
    return start


# -- V0027 on a database with 0.2 sessions --------------------------------------------------------
def test_v0027_bounds_the_families_and_lifetimes_of_existing_sessions(empty_db: str) -> None:
    """Sessions made before V0027: a long-refreshed family is cut to its newest 8 rows
    (the live token kept, generations numbered), and every session gets created_at +
    30 days as its absolute expiry -- one older than that has expired."""
    import shutil
    import subprocess

    from harness import ROOT, hash_pw

    exe = shutil.which("pgmigrate")
    assert exe, "pgmigrate (yandex-pgmigrate) is not installed"
    up = subprocess.run([exe, "-d", "db", "-c", empty_db, "-t", "24", "migrate"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    with psycopg.connect(empty_db, autocommit=True) as c:  # rows as 0.2.0 left them
        uid = c.execute("SELECT switchboard.create_user('old', %s)", (hash_pw("pw-" + "s" * 12),)).fetchone()[0]
        long_sid, new_sid = (c.execute(
            "INSERT INTO switchboard.sessions (user_id, created_at, expires_at) VALUES (%s, now() - %s::interval,"
            " now() + interval '14 days') RETURNING id", (uid, age)).fetchone()[0] for age in ("40 days", "1 day"))
        tokens = {}
        for sid, n in ((long_sid, 20), (new_sid, 3)):
            for i in range(n):
                raw = f"{i:02x}{str(sid).replace('-', '')}".ljust(64, "0")[:64]
                c.execute("INSERT INTO switchboard.refresh_tokens (hash, session_id, issued_at, used_at)"
                          " VALUES (sha256(decode(%s, 'hex')), %s, now() - %s * interval '1 minute',"
                          " CASE WHEN %s THEN NULL ELSE now() END)", (raw, sid, n - i, i == n - 1))
                tokens[(sid, i)] = raw
    up = subprocess.run([exe, "-d", "db", "-c", empty_db, "migrate"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    assert token_rows(empty_db, str(long_sid)) == [(g, g < 7) for g in range(8)]
    assert token_rows(empty_db, str(new_sid)) == [(0, True), (1, True), (2, False)]
    with psycopg.connect(empty_db, autocommit=True) as c:
        assert c.execute("SELECT bool_and(max_expires_at = created_at + interval '30 days'"
                         " AND expires_at <= max_expires_at) FROM switchboard.sessions").fetchone()[0]

        def refresh(token: str) -> str:
            return str(c.execute("SELECT outcome FROM switchboard.refresh_session_v2(%s, '14 days')",
                                 (token,)).fetchone()[0])

        assert refresh(tokens[(new_sid, 2)]) == "rotated"  # the live token of a young session still works
        assert refresh(tokens[(long_sid, 19)]) == "ended"  # 40 days old: past its absolute expiry
        assert refresh(tokens[(long_sid, 3)]) == "unknown"  # pruned
