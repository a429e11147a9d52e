"""CORS on a real replica (SWITCHBOARD_ALLOWED_ORIGINS), over real HTTP and WebSocket.

What a browser on another origin needs: preflights answered and cached, the
rate-limit headers readable, credentials (the refresh cookie) only on the
session endpoints, and everything refused for an origin not on the list.
"""

from __future__ import annotations

import httpx
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from harness import auth, make_user

APP = "http://app.example:5173"
EVIL = "https://evil.example"
PW = "pw-" + "s" * 12


def exposed(r: httpx.Response) -> set[str]:
    return {h.strip().lower() for h in r.headers.get("access-control-expose-headers", "").split(",") if h.strip()}


def preflight(base: str, path: str, origin: str, headers: str = "content-type") -> httpx.Response:
    return httpx.options(base + path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": headers})


def test_cors_for_an_allowed_origin(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "ola")
    s = server_factory(env={"SWITCHBOARD_ALLOWED_ORIGINS": f"{APP}, https://other.example",
                            "SWITCHBOARD_LOGIN_IP_BURST": "4", "SWITCHBOARD_LOGIN_IP_RATE": "0.001"})
    b = s.base
    # Preflights: answered from the route's methods, cached, credentials only where the cookie goes.
    r = preflight(b, "/auth/refresh", APP)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == APP
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert int(r.headers["access-control-max-age"]) >= 600
    r = preflight(b, "/tasks", APP, "authorization, content-type")
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in r.headers

    # Log in from the app's origin: cookie + credentials allowed; rate-limit headers readable.
    login = httpx.post(b + "/auth/login", json={"username": "ola", "password": PW}, headers={"Origin": APP})
    assert login.status_code == 200
    assert login.headers["access-control-allow-origin"] == APP
    assert login.headers["access-control-allow-credentials"] == "true"
    assert {"ratelimit", "ratelimit-policy", "retry-after"} <= exposed(login)
    assert "origin" in login.headers["vary"].lower()
    token = login.json()["access_token"]
    # A bearer call: CORS headers, no credentials.
    me = httpx.get(b + "/me", headers={**auth(token), "Origin": APP})
    assert me.status_code == 200 and me.headers["access-control-allow-origin"] == APP
    assert "access-control-allow-credentials" not in me.headers
    # Refresh with the cookie, from the app.
    r = httpx.post(b + "/auth/refresh", cookies=login.cookies, headers={"Origin": APP})
    assert r.status_code == 200 and r.headers["access-control-allow-credentials"] == "true"
    cookie = r.cookies
    # Errors carry CORS headers too, so the app can read the problem (and Retry-After on 429).
    last = None
    for _ in range(6):
        last = httpx.post(b + "/auth/login", json={"username": "ola", "password": "nope-nope"},
                          headers={"Origin": APP})
        if last.status_code == 429:
            break
    assert last is not None and last.status_code == 429
    assert last.headers["access-control-allow-origin"] == APP and "retry-after" in exposed(last)

    # An origin not on the list: no CORS headers (the browser refuses), and the cookie
    # endpoints refuse it outright, so a sibling origin cannot drive a refresh.
    assert "access-control-allow-origin" not in httpx.get(b + "/me", headers={**auth(token), "Origin": EVIL}).headers
    assert "access-control-allow-origin" not in preflight(b, "/auth/refresh", EVIL).headers
    r = httpx.post(b + "/auth/refresh", cookies=cookie, headers={"Origin": EVIL})
    assert r.status_code == 403 and r.json()["type"].endswith("/origin-not-allowed")
    assert "access-control-allow-origin" not in r.headers
    assert httpx.post(b + "/auth/logout", cookies=cookie, headers={"Origin": EVIL}).status_code == 403
    # ... and that refusal used nothing up: the cookie still refreshes.
    assert httpx.post(b + "/auth/refresh", cookies=cookie, headers={"Origin": APP}).status_code == 200

    # WebSocket: allowed origins and our own origin get in; others are refused at the handshake.
    for origin in (APP, f"http://127.0.0.1:{s.port}"):
        ws = connect(f"{s.ws_base}/ws?ticket={s.ticket(token)}", origin=origin, open_timeout=10)  # type: ignore[arg-type]
        ws.close()
    try:
        connect(f"{s.ws_base}/ws?ticket={s.ticket(token)}", origin=EVIL, open_timeout=10)  # type: ignore[arg-type]
        raise AssertionError("a foreign origin opened a socket")
    except InvalidStatus as exc:
        assert exc.response.status_code == 403


def test_cors_is_off_without_allowed_origins(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "pat")
    s = server_factory()
    login = httpx.post(s.base + "/auth/login", json={"username": "pat", "password": PW}, headers={"Origin": APP})
    assert login.status_code == 200  # non-CORS clients are unaffected ...
    assert "access-control-allow-origin" not in login.headers  # ... but a browser elsewhere cannot read it
    assert "access-control-allow-origin" not in preflight(s.base, "/auth/login", APP).headers
    # the cookie endpoints accept only our own origin then
    r = httpx.post(s.base + "/auth/refresh", cookies=login.cookies, headers={"Origin": APP})
    assert r.status_code == 403
    r = httpx.post(s.base + "/auth/refresh", cookies=login.cookies, headers={"Origin": f"http://127.0.0.1:{s.port}"})
    assert r.status_code == 200


def test_wildcard_never_opens_the_cookie_endpoints(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """``*`` (the `switchboard dev` default) is for bearer routes and /ws: a page on any
    other origin still cannot log the user out or refresh with the cookie."""
    make_user(db, "wes")
    s = server_factory(env={"SWITCHBOARD_ALLOWED_ORIGINS": "*"})
    login = httpx.post(s.base + "/auth/login", json={"username": "wes", "password": PW})
    assert login.status_code == 200
    token = login.json()["access_token"]
    for path in ("/auth/logout", "/auth/refresh"):
        r = httpx.post(s.base + path, cookies=login.cookies, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403 and r.json()["type"].endswith("/origin-not-allowed"), (path, r.text)
    # Bearer routes and /ws stay open to any origin under '*' (no ambient credential there).
    me = httpx.get(s.base + "/me", headers={**auth(token), "Origin": "http://evil.example"})
    assert me.status_code == 200 and me.headers["access-control-allow-origin"] == "*"
    connect(f"{s.ws_base}/ws?ticket={s.ticket(token)}", origin="http://evil.example",  # type: ignore[arg-type]
            open_timeout=10).close()
    # The session survived every refused call.
    r = httpx.post(s.base + "/auth/refresh", cookies=login.cookies, headers={"Origin": f"http://127.0.0.1:{s.port}"})
    assert r.status_code == 200, r.text


def test_own_origin_is_scheme_host_and_port_exactly(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "oli")
    s = server_factory()
    login = httpx.post(s.base + "/auth/login", json={"username": "oli", "password": PW})
    jar = login.cookies
    for wrong in (f"https://127.0.0.1:{s.port}",       # same host and port, other scheme (we are plain HTTP)
                  f"http://127.0.0.1:{s.port + 1}",     # other port
                  f"http://127.0.0.1:{s.port}.evil.example", "null",
                  f"http://127.0.0.1:{s.port}/path"):
        r = httpx.post(s.base + "/auth/refresh", cookies=jar, headers={"Origin": wrong})
        assert r.status_code == 403, (wrong, r.status_code)
        try:
            connect(f"{s.ws_base}/ws?ticket={s.ticket(login.json()['access_token'])}", origin=wrong,  # type: ignore[arg-type]
                    open_timeout=10)
            raise AssertionError(f"{wrong} opened a socket")
        except InvalidStatus as exc:
            assert exc.response.status_code == 403
    # Our own origin, as a browser serialises it (case and default port normalised).
    r = httpx.post(s.base + "/auth/refresh", cookies=jar, headers={"Origin": f"HTTP://127.0.0.1:{s.port}"})
    assert r.status_code == 200, r.text
